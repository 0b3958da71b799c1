"""The content-addressed model cache, and publishing a built model folder into it safely.

The cache lives outside the work tree (``$PEAGLE_MODEL_CACHE``, else ``$XDG_CACHE_HOME/peagle/models``,
else ``~/.cache/peagle/models``): every clone on a machine reuses what another clone built, and a folder's
name is the hash of the recipe that made it, so an edit to a builder never reads a stale model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable


def _cache_dir() -> Path:
    explicit = os.environ.get("PEAGLE_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "peagle" / "models"


CACHE_DIR = _cache_dir()


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


def recipe_key(name: str, recipe: object, sources: Iterable[Path]) -> str:
    """``<name>-<hash>`` of a builder's recipe (JSON-able) and the source files that turn it into weights."""
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode())
    for source in sorted(set(sources)):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return f"{name}-{h.hexdigest()[:16]}"
