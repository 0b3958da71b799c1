"""The weights bundle's manifest: what the stager writes last, what an environment pins, what the image checks.

A bundle is one S3 prefix holding ``target/`` and ``drafter/`` (SageMaker copies it to /opt/ml/model). The
stager uploads every file first and :data:`MANIFEST_NAME` last, so a bundle without a manifest is incomplete
by definition. The manifest lists each file's path, size and SHA-256 and where the models came from; its own
SHA-256 (:func:`digest`) names the bundle's content. An environment may pin that digest: the constructs
render it as :data:`MANIFEST_DIGEST_VAR` in the model's environment (so a weights change is a model change in
a stack diff), and the image's entrypoint refuses to start on a bundle whose manifest does not match.
Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
MANIFEST_DIGEST_VAR = "PEAGLE_BUNDLE_MANIFEST_SHA256"
TARGET_DIR, DRAFTER_DIR = "target", "drafter"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BundleError(ValueError):
    pass


@dataclass(frozen=True)
class BundleFile:
    path: str  # relative to the bundle, e.g. "target/config.json"
    size: int
    sha256: str


def check_digest(value: object, where: str) -> str:
    if not isinstance(value, str) or not _SHA256.match(value):
        raise BundleError(f"{where}: got {value!r}; allowed: a SHA-256 digest, 64 lowercase hex characters "
                          "(the one `stage-weights` prints)")
    return value


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def render(files: Sequence[BundleFile], sources: Mapping[str, Mapping[str, str | None]]) -> bytes:
    """The manifest's bytes: canonical JSON (sorted keys, sorted files), so equal content gives an equal digest."""
    body = {"version": MANIFEST_VERSION,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in sorted(files, key=lambda f: f.path)],
            "sources": {k: dict(v) for k, v in sorted(sources.items())}}
    return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()


def digest(manifest: bytes) -> str:
    return hashlib.sha256(manifest).hexdigest()


def check_bundle(root: Path, expected: str, *, where: str = MANIFEST_DIGEST_VAR) -> None:
    """Raise :class:`BundleError` unless ``root`` holds a manifest whose digest is ``expected``."""
    check_digest(expected, where)
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"{where}: pins manifest {expected[:12]}..., but {path} does not exist "
                          "(an incomplete bundle: the stager writes its manifest last)")
    found = digest(path.read_bytes())
    if found != expected:
        raise BundleError(f"{where}: pins manifest {expected[:12]}..., but {path} has {found[:12]}...; "
                          "allowed: the bundle the environment was deployed for (restage it or update the pin)")
