"""Stages kept apart at synth (stacks/isolation.py): one account per stage, pinned weights for Staging and Prod.

Each refusal is an attack that passed before: three stages synthesized into the credentials' one account (a Dev
deploy role then reaches Prod), and Staging or Prod unpinned (any new instance loads whatever is under the prefix).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from aws_cdk import App

from peagle_constructs import ServingConfigError
from stacks.application import OFFLINE, build_app
from stacks.environments import DEV, PROD, STAGING, bundle

IMAGE = {"imageUri": "111122223333.dkr.ecr.us-east-1.amazonaws.com/peagle:1"}
ACCOUNTS = {"account.Dev": "111122223333", "account.Staging": "222233334444", "account.Prod": "333344445555",
            "region": "us-east-1"}
DIGEST = "ab" * 32


def pinned(env, digest=DIGEST):  # noqa: ANN001, ANN201
    serving = replace(env.model.serving, **bundle(env.name.lower(), digest))
    return replace(env, model=replace(env.model, serving=serving))


def real(context: dict, environments, monkeypatch):  # noqa: ANN001, ANN201
    for var in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    return build_app(App(context={**IMAGE, **context}), environments, nag=False)


PINNED = (DEV, pinned(STAGING), pinned(PROD))


def test_each_stage_in_its_own_account_from_the_stage_context(monkeypatch):
    stages = real(ACCOUNTS, PINNED, monkeypatch)
    assert {name: stage.account for name, stage in stages.items()} == {
        "Dev": "111122223333", "Staging": "222233334444", "Prod": "333344445555"}


def test_the_credentials_one_account_for_every_stage_is_refused(monkeypatch):
    """What `make deploy TARGET=aws` and the promotion did before: every stage in the CLI's account."""
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "555566667777")
    monkeypatch.setenv("CDK_DEFAULT_REGION", "us-east-1")
    with pytest.raises(ServingConfigError) as caught:
        build_app(App(context=IMAGE), PINNED, nag=False)
    message = str(caught.value)
    assert caught.value.field_name == "Dev.account"
    assert "555566667777 (from CDK_DEFAULT_ACCOUNT) is also the account of Staging, Prod" in message
    assert "shared_account_reason" in message and "-c account.Dev=" in message


def test_prod_in_stagings_account_is_refused_naming_the_stage(monkeypatch):
    context = {**ACCOUNTS, "account.Prod": ACCOUNTS["account.Staging"]}
    with pytest.raises(ServingConfigError) as caught:
        real(context, PINNED, monkeypatch)
    assert caught.value.field_name == "Staging.account" and "also the account of Prod" in str(caught.value)


def test_a_shared_account_passes_when_each_stage_sharing_it_says_why_and_the_reason_is_printed(monkeypatch, capsys):
    reason = "a sandbox account for the first week"
    context = {**ACCOUNTS, "account.Staging": ACCOUNTS["account.Dev"]}
    envs = (replace(DEV, shared_account_reason=reason), replace(pinned(STAGING), shared_account_reason=reason),
            pinned(PROD))
    stages = real(context, envs, monkeypatch)
    assert stages["Dev"].account == stages["Staging"].account != stages["Prod"].account
    printed = capsys.readouterr().err
    assert f"peagle: Dev shares account 111122223333 with Staging: {reason}" in printed
    assert f"peagle: Staging shares account 111122223333 with Dev: {reason}" in printed
    # One side's reason is not enough: Dev's deploy role would still reach Staging.
    with pytest.raises(ServingConfigError) as caught:
        real(context, (DEV, envs[1], envs[2]), monkeypatch)
    assert caught.value.field_name == "Dev.account"


@pytest.mark.parametrize("stage", ["Staging", "Prod"])
def test_staging_and_prod_without_a_pin_are_refused_for_a_real_account(monkeypatch, stage):
    envs = tuple(env if env.name == stage else pinned(env) for env in (DEV, STAGING, PROD))
    with pytest.raises(ServingConfigError) as caught:
        real(ACCOUNTS, envs, monkeypatch)
    assert caught.value.field_name == f"{stage}.model.serving.bundle_manifest_sha256"
    assert "make stage-weights" in str(caught.value)
    # Dev may serve unpinned weights, and a synth for review needs no pin (its templates reach no account).
    assert real(ACCOUNTS, (DEV, pinned(STAGING), pinned(PROD)), monkeypatch)
    assert build_app(App(context={**IMAGE, **OFFLINE}), envs, nag=False)


def test_the_committed_stages_are_unpinned_so_a_real_synth_of_them_says_what_to_pin(monkeypatch):
    with pytest.raises(ServingConfigError) as caught:
        real(ACCOUNTS, (DEV, STAGING, PROD), monkeypatch)
    assert caught.value.field_name == "Staging.model.serving.bundle_manifest_sha256"


def test_a_pinned_stage_serves_the_bundle_named_by_its_digest():
    env = pinned(PROD)
    assert env.model.serving.target_model == f"s3://peagle-weights-prod/bundles/gpt-oss-20b-p-eagle/{DIGEST}/target/"
    assert env.model.serving.drafter_model.endswith(f"/{DIGEST}/drafter/")
    assert env.model.serving.bundle_manifest_sha256 == DIGEST


@pytest.mark.parametrize(("context", "field", "found"), [
    ({**ACCOUNTS, "account.Prod": "12345"}, "Prod.account", "'12345' (from -c account.Prod)"),
    ({**ACCOUNTS, "account.Dev": "arn:aws:iam::1"}, "Dev.account", "(from -c account.Dev)"),
])
def test_an_account_that_is_not_12_digits_is_refused_naming_where_it_came_from(monkeypatch, context, field, found):
    with pytest.raises(ServingConfigError) as caught:
        real(context, PINNED, monkeypatch)
    assert caught.value.field_name == field and found in str(caught.value) and "12-digit" in str(caught.value)


@pytest.mark.parametrize(("changes", "field"), [
    (dict(account="1234"), "Dev.account"),
    (dict(account=123456789012), "Dev.account"),
    (dict(shared_account_reason="  "), "Dev.shared_account_reason"),
])
def test_bad_isolation_fields_are_refused_in_the_config(changes, field):
    with pytest.raises(ServingConfigError) as caught:
        replace(DEV, **changes)
    assert caught.value.field_name == field
