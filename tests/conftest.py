"""Shared by several test folders: quiet jsii/CDK settings, offline hub, ONE synthesis of the app per session.

Starting jsii (a Node process) and building the three stages costs seconds; every CDK test in a session
shares the same process, and the stage tests share one synthesized app.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.cdk import QUIET_CDK_ENV

for _name, _value in QUIET_CDK_ENV.items():
    os.environ.setdefault(_name, _value)
# Every model here is a local folder: transformers and vLLM must never ask a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The image the embedded-AWS deploys use (no Docker there): same value as tests/deploy.
LOCAL_IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/peagle-runtime:test"


@dataclass
class SynthesizedApp:
    app: object  # aws_cdk.App
    stages: dict  # name -> stacks.stage.PEagleStage
    outdir: Path
    assembly: object  # aws_cdk.cx_api.CloudAssembly


def _synthesize(outdir: Path, context: dict | None = None) -> SynthesizedApp:
    from aws_cdk import App

    from stacks.application import build_app, builtin_cloudformation_validation

    from stacks.application import OFFLINE

    app = App(outdir=str(outdir), context={**OFFLINE, **(context or {})},
              builtin_cloud_formation_validation=builtin_cloudformation_validation())
    stages = build_app(app)  # nag packs on: synth raises if any finding is left open
    assembly = app.synth()
    return SynthesizedApp(app=app, stages=stages, outdir=outdir, assembly=assembly)


@pytest.fixture(scope="session")
def synthesized_app(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedApp:
    """The app exactly as `make synth` builds it (image from the runtime/ Dockerfile asset)."""
    return _synthesize(tmp_path_factory.mktemp("cdk-out"))


@pytest.fixture(scope="session")
def synthesized_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cloud assembly of all stages with `-c imageUri=LOCAL_IMAGE_URI`, for deploys to an embedded AWS."""
    return _synthesize(tmp_path_factory.mktemp("cdk-out-image-uri"), {"imageUri": LOCAL_IMAGE_URI}).outdir


@pytest.fixture(scope="session")
def untrained():
    """The random pair: an untrained target + P-EAGLE drafter (models.random_pair): built in seconds, cached by content."""
    from models.random_pair import build

    return build()
