"""Build the whole app (all stages, nag packs) - shared by app.py, the tests and the benchmark."""

from __future__ import annotations

import os
from typing import Iterable

from aws_cdk import Annotations, App

from peagle_constructs import ConfigError, ContainerImage, add_nag_packs

from stacks.environments import ENVIRONMENTS, EnvironmentConfig, check_unique_names
from stacks.image_context import image_context
from stacks.stage import PEagleStage

# Placeholders for a synth that is never deployed (CI, stack diffs, the embedded AWS), and only when asked for
# with `-c offline=true`: a template meant for an account must never carry a made-up one silently.
OFFLINE_CONTEXT = "offline"
OFFLINE = {OFFLINE_CONTEXT: "true"}  # the context a synth for review passes
OFFLINE_ACCOUNT = "111111111111"
OFFLINE_REGION = "us-east-1"


def serving_image(app: App) -> ContainerImage:
    """The image every stage runs: `-c imageUri=<ecr uri>`, or runtime/Dockerfile built as an asset from
    the small context stacks.image_context writes (the Dockerfile and the two wheels it installs)."""
    uri = app.node.try_get_context("imageUri")
    if uri:
        return ContainerImage.from_uri(str(uri))
    return ContainerImage.from_asset(str(image_context()), file="Dockerfile")


def builtin_cloudformation_validation() -> bool:
    """Off unless CDK_VALIDATION=true: it doubles the synth time and cfn-lint covers it in the tests."""
    return os.environ.get("CDK_VALIDATION", "false").lower() == "true"


def offline(app: App) -> bool:
    return str(app.node.try_get_context(OFFLINE_CONTEXT) or "false").lower() == "true"


def _account_region(app: App, config: EnvironmentConfig) -> tuple[str, str]:
    """The environment's own account and region, else -c account/region, else the CLI's CDK_DEFAULT_*."""
    account = config.account or app.node.try_get_context("account") or os.environ.get("CDK_DEFAULT_ACCOUNT")
    region = config.region or app.node.try_get_context("region") or os.environ.get("CDK_DEFAULT_REGION")
    if offline(app):
        return str(account or OFFLINE_ACCOUNT), str(region or OFFLINE_REGION)
    for name, value, source in (("account", account, "CDK_DEFAULT_ACCOUNT"), ("region", region, "CDK_DEFAULT_REGION")):
        if not value:
            raise ConfigError(
                f"{config.name}.{name}",
                f"not set; allowed: the environment's {name} in stacks/environments.py, -c {name}=..., or {source} "
                f"(the CDK CLI sets it from your AWS credentials); for a synth that is never deployed (CI, diffs) "
                f"pass -c {OFFLINE_CONTEXT}=true to use the placeholder {OFFLINE_ACCOUNT}/{OFFLINE_REGION}",
            )
    return str(account), str(region)


def build_app(app: App, environments: Iterable[EnvironmentConfig] = ENVIRONMENTS, *,
              nag: bool = True) -> dict[str, PEagleStage]:
    environments = tuple(environments)
    check_unique_names(environments)
    image = serving_image(app)
    stages = {}
    for config in environments:
        account, region = _account_region(app, config)
        stage = PEagleStage(app, config=config, image=image, account=account, region=region)
        if account == OFFLINE_ACCOUNT:
            Annotations.of(stage.stack).add_warning_v2(
                "peagle:offline-account", f"synthesized offline with the placeholder account {OFFLINE_ACCOUNT}: "
                "these templates are for review, not for a deploy to a real account")
        if nag:
            # Plugins run per Stage on that Stage's own stacks: registered on the App they would see none.
            add_nag_packs(stage)
        stages[config.name] = stage
    return stages
