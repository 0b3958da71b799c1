"""Build the whole app (all stages, nag packs) - shared by app.py, the tests and the benchmark."""

from __future__ import annotations

import os
from typing import Iterable

from aws_cdk import Annotations, App

from peagle_constructs import ContainerImage, add_nag_packs

from stacks.environments import ENVIRONMENTS, EnvironmentConfig, check_unique_names
from stacks.image_context import TRAINING, image_context
from stacks.isolation import (  # the OFFLINE_* names are re-exported: callers import them from here
    OFFLINE_ACCOUNT, OFFLINE_CONTEXT, OFFLINE_REGION, check_pinned_weights, check_separate_accounts, offline, place,
)
from stacks.stage import PEagleStage

# A synth for review (CI, stack diffs, the embedded AWS) asks for placeholders with `-c offline=true`; a template
# meant for an account never carries a made-up one silently (stacks.isolation).
OFFLINE = {OFFLINE_CONTEXT: "true"}  # the context a synth for review passes


def serving_image(app: App) -> ContainerImage:
    """The image every stage runs: `-c imageUri=<ecr uri>`, or runtime/Dockerfile built as an asset from
    the small context stacks.image_context writes (the Dockerfile and the two wheels it installs)."""
    uri = app.node.try_get_context("imageUri")
    if uri:
        return ContainerImage.from_uri(str(uri))
    return ContainerImage.from_asset(str(image_context()), file="Dockerfile")


def training_image(app: App) -> ContainerImage:
    """The drafter's training image: `-c trainingImageUri=<ecr uri>`, or models/Dockerfile built as an asset
    from its own small context (the trainer's and the contract's wheels)."""
    uri = app.node.try_get_context("trainingImageUri")
    if uri:
        return ContainerImage.from_uri(str(uri))
    return ContainerImage.from_asset(str(image_context(spec=TRAINING)), file="Dockerfile")


def builtin_cloudformation_validation() -> bool:
    """Off unless CDK_VALIDATION=true: it doubles the synth time and cfn-lint covers it in the tests."""
    return os.environ.get("CDK_VALIDATION", "false").lower() == "true"


def build_app(app: App, environments: Iterable[EnvironmentConfig] = ENVIRONMENTS, *,
              nag: bool = True) -> dict[str, PEagleStage]:
    environments = tuple(environments)
    check_unique_names(environments)
    image = serving_image(app)
    # Built only when a stage trains in the cloud: otherwise no stage has a second image to publish.
    trainer = training_image(app) if any(config.training is not None for config in environments) else None
    placements = [place(app, config) for config in environments]
    if not offline(app):  # a real account: the stages kept apart, each serving pinned weights where it must
        check_separate_accounts(placements)
        check_pinned_weights(environments)
    stages = {}
    for placement in placements:
        config, account = placement.config, placement.account
        stage = PEagleStage(app, config=config, image=image, account=account, region=placement.region,
                            training_image=trainer if config.training is not None else None)
        if offline(app):
            Annotations.of(stage.stack).add_warning_v2(
                "peagle:offline-account", f"synthesized offline for review (the placeholder account {OFFLINE_ACCOUNT} "
                "unless one was given): these templates are for review, not for a deploy to a real account - the stage "
                "isolation and weight-pin checks of stacks.isolation did not run")
        if nag:
            # Plugins run per Stage on that Stage's own stacks: registered on the App they would see none.
            add_nag_packs(stage)
        stages[config.name] = stage
    return stages
