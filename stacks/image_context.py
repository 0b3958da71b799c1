"""The serving image's build context: runtime/Dockerfile and the two wheels it installs, nothing else.

The image installs exactly the wheels that the packaging test installs into a fresh virtual environment
(peagle-contract and peagle-runtime), so what is proven here is what ships. A small explicit context also
keeps the asset hash to what the image holds: edits to stacks, tests or docs never make a new image.

The context is built once per change of its sources into ``.cache/image-context/<digest>/`` (about 4 s)
and reused by every later synth. Wheels are built reproducibly - from a copy of the sources, in an
isolated build environment with the exact setuptools each pyproject.toml pins, with a fixed
SOURCE_DATE_EPOCH - so the same sources give the same bytes and the same asset hash on every machine,
whatever the environment running the synth has installed.

``python -m stacks.image_context`` prints the folder (for a `docker build` by hand).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from stacks.release import NOT_SOURCES, REPO_ROOT, build_wheels

DOCKERFILE = REPO_ROOT / "runtime" / "Dockerfile"
# The distributions the image installs; vLLM itself is the image's base.
IMAGE_DISTRIBUTIONS = (REPO_ROOT / "contract", REPO_ROOT / "runtime")
CACHE_DIR = REPO_ROOT / ".cache" / "image-context"
WHEELS = "wheels"  # the folder of the context that runtime/Dockerfile copies


def sources_digest(projects: Sequence[Path] = IMAGE_DISTRIBUTIONS) -> str:
    """A digest of every source file of ``projects``, the Dockerfile and this builder."""
    h = hashlib.sha256()
    files = [DOCKERFILE, Path(__file__)]
    for project in projects:
        files += sorted(p for p in project.rglob("*") if p.is_file() and not _excluded(p.relative_to(project)))
    for path in files:
        h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _excluded(rel: Path) -> bool:
    return any(Path(part).match(pattern) for part in rel.parts for pattern in NOT_SOURCES)


def image_context(cache_dir: Path = CACHE_DIR) -> Path:
    """The build context folder for the current sources: ``Dockerfile`` and ``wheels/*.whl``."""
    root = cache_dir / sources_digest()
    if (root / "Dockerfile").is_file():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="building-", dir=cache_dir))
    try:
        build_wheels(IMAGE_DISTRIBUTIONS, tmp / WHEELS)
        shutil.copy(DOCKERFILE, tmp / "Dockerfile")  # last: its presence marks the folder complete
        try:
            os.rename(tmp, root)
        except OSError:  # another synth published the same digest first: its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


if __name__ == "__main__":
    print(image_context())
    sys.exit(0)
