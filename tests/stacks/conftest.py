from __future__ import annotations

import json
from pathlib import Path

import pytest

@pytest.fixture(scope="session")
def templates(synthesized_app) -> dict[str, dict]:  # noqa: ANN001
    """Each stage's one template, read from the synthesized cloud assembly."""
    out = {}
    for name, stage in synthesized_app.stages.items():
        path = Path(synthesized_app.outdir) / f"assembly-{name}" / stage.stack.template_file
        out[name] = json.loads(path.read_text())
    return out


@pytest.fixture(scope="session")
def template_paths(synthesized_app) -> dict[str, Path]:  # noqa: ANN001
    return {name: Path(synthesized_app.outdir) / f"assembly-{name}" / stage.stack.template_file
            for name, stage in synthesized_app.stages.items()}
