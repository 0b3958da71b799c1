"""The images' build contexts: each Dockerfile and the two wheels it installs, nothing else.

The serving image is runtime/Dockerfile with peagle-contract and peagle-runtime; the drafter's training image
(built only for a stage that trains in the cloud) is models/Dockerfile with peagle-contract and peagle-trainer.

The serving image installs exactly the wheels that the packaging test installs into a fresh virtual environment
(peagle-contract and peagle-runtime), so what is proven here is what ships; the trainer's wheel needs torch and
vLLM to import, so only its contents and its command are checked (tests/models/test_training_image.py). A small
explicit context also keeps the asset hash to what the image holds: edits to stacks, tests or docs never make a
new image, and an edit to the trainer never makes a new serving image.

A context is built once per change of its sources into ``.cache/image-context/<image>-<digest>/`` (about 4 s)
and reused by every later synth. Wheels are built reproducibly - from a copy of the sources, in an
isolated build environment with the exact setuptools each pyproject.toml pins, with a fixed
SOURCE_DATE_EPOCH - so the same sources give the same bytes and the same asset hash on every machine,
whatever the environment running the synth has installed.

``python -m stacks.image_context [serving|training]`` prints the folder (for a `docker build` by hand).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from stacks.release import NOT_SOURCES, REPO_ROOT, build_wheels

WHEELS = "wheels"  # the folder of a context that its Dockerfile copies


@dataclass(frozen=True)
class ImageSpec:
    """One image this repository builds: its Dockerfile and the distributions whose wheels it installs."""

    name: str
    dockerfile: Path
    distributions: tuple[Path, ...]


# The serving image; vLLM itself is its base.
SERVING = ImageSpec("serving", REPO_ROOT / "runtime" / "Dockerfile", (REPO_ROOT / "contract", REPO_ROOT / "runtime"))
# The drafter's training image (SageMaker training jobs): the same base, the trainer instead of the runtime. Its own
# context, so an edit to the trainer never makes a new serving image (a new image is a new model: a redeploy).
TRAINING = ImageSpec("training", REPO_ROOT / "models" / "Dockerfile", (REPO_ROOT / "contract", REPO_ROOT / "models"))
IMAGES = {spec.name: spec for spec in (SERVING, TRAINING)}
DOCKERFILE, IMAGE_DISTRIBUTIONS = SERVING.dockerfile, SERVING.distributions
CACHE_DIR = REPO_ROOT / ".cache" / "image-context"


def sources_digest(projects: Sequence[Path] = IMAGE_DISTRIBUTIONS, dockerfile: Path = DOCKERFILE) -> str:
    """A digest of every source file of ``projects``, the Dockerfile and this builder."""
    h = hashlib.sha256()
    files = [dockerfile, Path(__file__)]
    for project in projects:
        files += sorted(p for p in project.rglob("*") if p.is_file() and not _excluded(p.relative_to(project)))
    for path in files:
        h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _excluded(rel: Path) -> bool:
    return any(Path(part).match(pattern) for part in rel.parts for pattern in NOT_SOURCES)


def image_context(cache_dir: Path = CACHE_DIR, spec: ImageSpec = SERVING) -> Path:
    """The build context folder of ``spec`` for the current sources: ``Dockerfile`` and ``wheels/*.whl``."""
    root = cache_dir / f"{spec.name}-{sources_digest(spec.distributions, spec.dockerfile)}"
    if (root / "Dockerfile").is_file():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="building-", dir=cache_dir))
    try:
        build_wheels(spec.distributions, tmp / WHEELS)
        shutil.copy(spec.dockerfile, tmp / "Dockerfile")  # last: its presence marks the folder complete
        try:
            os.rename(tmp, root)
        except OSError:  # another synth published the same digest first: its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


if __name__ == "__main__":
    print(image_context(spec=IMAGES[sys.argv[1] if len(sys.argv) > 1 else SERVING.name]))
    sys.exit(0)
