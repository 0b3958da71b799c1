"""Where each stage lands, and the rules that keep stages apart: one account per stage, pinned weights.

A stage's account and region come from its config (``EnvironmentConfig.account`` / ``region``), else the
stage's own context (``-c account.Prod=...``, ``-c region.Prod=...``), else the app's (``-c account=...``,
``-c region=...``), else the CDK CLI's ``CDK_DEFAULT_*`` (the credentials' account). A synth for review
(``-c offline=true``) takes a placeholder and none of the rules below: its templates never reach an account.

For a real account:
- **One account per stage.** A stage that shares its account with another is refused unless its config says
  why (``shared_account_reason``): the stage's deploy role and CloudFormation execution role reach everything
  in their account, so a Dev deploy in Prod's account is a Prod deploy. The reason is printed at every synth.
- **Pinned weights.** A stage that requires it (``require_pinned_weights``: Staging and Prod) is refused
  without ``bundle_manifest_sha256``: SageMaker loads whatever is under the weights prefix when it starts an
  instance (scale-out, replacement, a fallback pool), so an unpinned stage serves weights no diff has shown.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Iterable, Sequence

from aws_cdk import App

from peagle_constructs import ConfigError

from stacks.environments import EnvironmentConfig

OFFLINE_CONTEXT = "offline"
OFFLINE_ACCOUNT = "111111111111"
OFFLINE_REGION = "us-east-1"
ACCOUNT, REGION = "account", "region"
_ACCOUNT_ID = re.compile(r"^\d{12}$")


@dataclass(frozen=True)
class Placement:
    """Where one stage deploys, and where that came from (named in every message about it)."""

    config: EnvironmentConfig
    account: str
    region: str
    source: str  # e.g. "-c account.Prod", "stacks/environments.py", "CDK_DEFAULT_ACCOUNT"


def offline(app: App) -> bool:
    return str(app.node.try_get_context(OFFLINE_CONTEXT) or "false").lower() == "true"


def stage_context_key(key: str, stage: str) -> str:
    """The context key that sets ``key`` (account or region) for one stage: ``account.Prod``."""
    return f"{key}.{stage}"


def _resolve(app: App, config: EnvironmentConfig, key: str, cli_var: str) -> tuple[str | None, str]:
    own = getattr(config, key)
    if own:
        return str(own), f"stacks/environments.py ({config.name}.{key})"
    for context_key in (stage_context_key(key, config.name), key):
        value = app.node.try_get_context(context_key)
        if value:
            return str(value), f"-c {context_key}"
    value = os.environ.get(cli_var)
    return (value, cli_var) if value else (None, "")


def place(app: App, config: EnvironmentConfig) -> Placement:
    """The stage's account and region, or ConfigError naming how to set them (no made-up account unless
    the synth is for review only)."""
    account, source = _resolve(app, config, ACCOUNT, "CDK_DEFAULT_ACCOUNT")
    region, _ = _resolve(app, config, REGION, "CDK_DEFAULT_REGION")
    if offline(app):
        return Placement(config, account or OFFLINE_ACCOUNT, region or OFFLINE_REGION, source or "placeholder")
    for key, value, cli_var in ((ACCOUNT, account, "CDK_DEFAULT_ACCOUNT"), (REGION, region, "CDK_DEFAULT_REGION")):
        if not value:
            raise ConfigError(
                f"{config.name}.{key}",
                f"not set; allowed: the environment's {key} in stacks/environments.py, "
                f"-c {stage_context_key(key, config.name)}=..., -c {key}=... or {cli_var} (the CDK CLI sets it from "
                f"your AWS credentials); for a synth that is never deployed (CI, diffs) pass -c {OFFLINE_CONTEXT}=true "
                f"to use the placeholder {OFFLINE_ACCOUNT}/{OFFLINE_REGION}")
    if not _ACCOUNT_ID.match(str(account)):
        raise ConfigError(f"{config.name}.account", f"got {str(account)[:20]!r} (from {source}); allowed: a 12-digit "
                                                   "AWS account id")
    return Placement(config, str(account), str(region), source)


def check_separate_accounts(placements: Sequence[Placement], *, log=None) -> list[str]:
    """ConfigError for the first stage that shares its account without saying why; returns (and prints) the
    reasons of those that do."""
    log = log or (lambda line: print(line, file=sys.stderr))
    by_account: dict[str, list[Placement]] = {}
    for p in placements:
        by_account.setdefault(p.account, []).append(p)
    acknowledged = []
    for account, group in by_account.items():
        if len(group) < 2:
            continue
        for p in group:
            others = ", ".join(o.config.name for o in group if o is not p)
            reason = p.config.shared_account_reason
            if not reason:
                raise ConfigError(
                    f"{p.config.name}.account",
                    f"{account} (from {p.source}) is also the account of {others}; allowed: an account of the stage's "
                    f"own (-c {stage_context_key(ACCOUNT, p.config.name)}=<12 digits>, or account= in "
                    f"stacks/environments.py), or shared_account_reason='<why>' on {p.config.name}: whatever deploys "
                    f"one stage of an account can change every stage in it")
            line = f"peagle: {p.config.name} shares account {account} with {others}: {reason}"
            log(line)
            acknowledged.append(line)
    return acknowledged


def check_pinned_weights(configs: Iterable[EnvironmentConfig]) -> None:
    """ConfigError for a stage that must serve pinned weights and has no pin."""
    for config in configs:
        if config.require_pinned_weights and config.model.serving.bundle_manifest_sha256 is None:
            raise ConfigError(
                f"{config.name}.model.serving.bundle_manifest_sha256",
                "not set, and this stage requires pinned weights for a real account; allowed: the 64-hex SHA-256 "
                "that `make stage-weights` printed for the bundle (the container then serves that bundle and no "
                "other); without it any instance SageMaker starts later loads whatever is under the prefix then")
