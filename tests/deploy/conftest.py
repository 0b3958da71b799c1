"""The deploy tests' fixtures: the synthesized app's stacks per stage, and the in-process moto environment
the extension tests share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import harness.aws as local_aws
from ops import cdk
from stacks.environments import ENVIRONMENTS

MOTO_REGION = "us-east-1"


@pytest.fixture
def moto_region(monkeypatch: pytest.MonkeyPatch) -> str:
    """Fake credentials only, the default region set, our extension loaded into moto; returns the region.

    Every ``AWS_*`` variable of the caller is dropped first, so no real credential or endpoint can reach
    boto3 inside ``mock_aws()``.
    """
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", MOTO_REGION)
    local_aws.register()
    return MOTO_REGION


@pytest.fixture(scope="session")
def stage_stacks(synthesized_assembly: Path) -> dict[str, list[cdk.StackArtifact]]:
    return {env.name: cdk.stage_stacks(synthesized_assembly, env.name) for env in ENVIRONMENTS}
