"""A weights bundle as SageMaker copies it to /opt/ml/model, built here the way the stager builds one."""

from __future__ import annotations

import shutil
from pathlib import Path

from ops.stage_weights import Source, manifest_of, plan
from peagle_contract.bundle import MANIFEST_NAME, describe, digest, render


def mount_bundle(root: Path, target: Path, drafter: Path, *, sources: bool = False) -> str:
    """``target/``, ``drafter/`` and the manifest the stager would write for them, in ``root``; returns the pin.
    ``sources``: name where the models came from (each folder's path) as the stager does, else no sources."""
    target_source, drafter_source = Source(target, str(target), None), Source(drafter, str(drafter), None)
    files = plan(target_source, drafter_source)
    for rel, path in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, root / rel)
    manifest = manifest_of(target_source, drafter_source, files)[1] if sources else render(describe(files), {})
    (root / MANIFEST_NAME).write_bytes(manifest)
    return digest(manifest)
