"""Each module of the stacks imports on its own, first, in a fresh interpreter: an import cycle that a test run's
order happens to hide (one module imported earlier by another test) fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import stacks

MODULES = sorted(f"stacks.{p.stem}" for p in Path(stacks.__file__).parent.glob("*.py") if p.stem != "__init__")


def test_every_module_is_listed():
    assert {"stacks.deploy_permissions", "stacks.environments", "stacks.ci_roles", "stacks.serving_stack"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports_first_and_alone(module):
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300,
                          cwd=Path(stacks.__file__).parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
