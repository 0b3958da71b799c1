"""Publishing a built model folder into the content-addressed cache (.cache/models/) safely."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def publish(root: Path, write: Callable[[Path], object], *, prefix: str, replace: bool = False) -> None:
    """Run ``write`` into a fresh folder beside ``root``, then rename it to ``root``.

    The rename is atomic, so a reader never sees half a model; when another builder published ``root``
    first, its copy is kept (``replace`` removes an existing ``root`` first: a forced rebuild).
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=root.parent))
    try:
        write(tmp)
        if replace and root.exists():
            shutil.rmtree(root)
        try:
            os.rename(tmp, root)
        except OSError:  # another builder finished first: keep its copy
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
