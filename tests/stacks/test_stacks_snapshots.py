"""One snapshot per stage: a reviewable record of every template change (asset hashes masked)."""

from __future__ import annotations

import json
import re

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.stacks.template_helpers import STAGES

_ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


def masked(template: dict) -> dict:
    # Asset hashes follow the runtime's source files; the snapshot is about the infrastructure.
    return json.loads(_ASSET_HASH.sub("<asset-hash>", json.dumps(template)))


@pytest.fixture
def snapshot_json(snapshot):  # noqa: ANN001
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("name", STAGES)
def test_stage_template_snapshot(templates, snapshot_json, name):
    template = masked(templates[name])
    assert "<asset-hash>" in json.dumps(template) and not _ASSET_HASH.search(json.dumps(template))
    assert template == snapshot_json
