"""This repository's release: the one version number of its distributions and the serving image, and the
wheels of those distributions.

Each distribution's pyproject.toml reads its version from a VERSION link to the repository's VERSION file,
so the three wheels, the image tag and the CHANGELOG's newest entry share one number.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = REPO_ROOT / "VERSION"
VERSION = VERSION_FILE.read_text().strip()
# CDK tags the image asset with its content hash; the prefix puts the release in front of it
# (<version>-<hash>), so an image in ECR says which release it belongs to.
IMAGE_TAG_PREFIX = f"{VERSION}-"

# The distributions this repository ships, in dependency order.
DISTRIBUTIONS = (REPO_ROOT / "contract", REPO_ROOT / "constructs", REPO_ROOT / "runtime")
# 1980-01-01, the earliest time a zip entry can carry: wheel bytes then depend on the sources only.
_SOURCE_DATE_EPOCH = "315532800"
NOT_SOURCES = ("build", "dist", "*.egg-info", "__pycache__", "*.pyc")


class WheelBuildError(RuntimeError):
    pass


def build_wheels(projects: Sequence[Path], out_dir: Path) -> list[Path]:
    """Build each project's wheel into ``out_dir``; return their paths. Writes nothing into the projects.

    Each project is copied first (links followed, so its VERSION link becomes the version itself), then
    built by pip in an isolated build environment holding the backend its pyproject.toml pins exactly: a
    fresh virtual environment's old setuptools (65.5 on Python 3.11, no ``bdist_wheel``) is never used, and
    the same sources give the same bytes on every machine.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="peagle-wheels-") as tmp:
        copies = []
        for project in projects:
            copy = Path(tmp) / "src" / project.name
            shutil.copytree(project, copy, ignore=shutil.ignore_patterns(*NOT_SOURCES))
            copies.append(str(copy))
        built = Path(tmp) / "wheels"
        env = {**os.environ, "SOURCE_DATE_EPOCH": _SOURCE_DATE_EPOCH, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
             "-w", str(built), *copies],
            env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise WheelBuildError(f"building wheels of {[p.name for p in projects]} failed:\n{proc.stderr[-3000:]}")
        return [Path(shutil.move(str(wheel), str(out_dir / wheel.name))) for wheel in sorted(built.glob("*.whl"))]


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else REPO_ROOT / "dist")
    for wheel in build_wheels(DISTRIBUTIONS, out):
        print(wheel)
