"""Loading a module of bench/ (scripts, not a package) the way the scripts import each other."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the scripts import their siblings by bare name
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as a plain import would: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
