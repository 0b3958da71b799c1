"""Every Python file of the repository names only what it defines or imports (pyflakes' undefined-name check).

A module's name that is used but never defined fails only when that line runs: a benchmark lost a helper that
way in a tidy-up (bench/synthetic_sweep.py's ``_base``) and nothing ran the path before hours of training had
gone into the run that would have reached it."""

from __future__ import annotations

from pathlib import Path

from pyflakes import api, messages
from pyflakes.reporter import Reporter

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".venv", ".venv-checkov", "node_modules", "cdk.out", ".git", "build", "dist"}


class _Collect(Reporter):
    def __init__(self):
        self.found: list[str] = []

    def flake(self, message):
        if isinstance(message, (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)):
            self.found.append(str(message).replace(str(ROOT) + "/", ""))

    def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802 - pyflakes' interface
        self.found.append(f"{Path(filename).relative_to(ROOT)}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg):  # noqa: N802
        self.found.append(f"{Path(filename).relative_to(ROOT)}: {msg}")


def _sources():
    for path in sorted(ROOT.rglob("*.py")):
        if not SKIP.intersection(path.relative_to(ROOT).parts):
            yield path


def test_no_python_file_uses_a_name_it_never_defines():
    reporter = _Collect()
    checked = 0
    for path in _sources():
        api.checkPath(str(path), reporter)
        checked += 1
    assert checked > 100  # the walk found the tree
    assert reporter.found == []


def test_the_check_finds_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return _base(1)\n")
    reporter = _Collect()
    api.checkPath(str(bad), reporter)
    assert len(reporter.found) == 1 and "undefined name '_base'" in reporter.found[0]
