"""Rollback alarms a client cannot trip at will, and the break-glass deploy that has none.

A client that can move a rollback signal can roll back any deploy: time to first token (prompt length, bursts),
the model error rate (it counts 4xx), the acceptance rate (temperature, random prompts) page only. What rolls
back is the 5xx rate and time per output token on the engine's clock. A hotfix during an incident deploys with no
rollback only through the ``peagle:break-glass`` context, which the resource says and the stack diff fails on."""

from __future__ import annotations

import pytest
from aws_cdk import App, Duration, Environment, Stack
from aws_cdk.assertions import Template

from peagle_constructs import ConfigError, DeploymentPolicy, FleetProps, ModelProps, PEagleEndpoint
from peagle_constructs.rollback_signals import PAGE_ONLY_SIGNALS, ROLLBACK_SIGNALS
from review.stack_diff import FAIL, classify

CLIENT_MOVABLE = {"TimeToFirstTokenP90", "InvocationModelErrorRate", "AcceptanceRate"}


def _endpoint_template(serving, image, context: dict | None = None) -> dict:
    stack = Stack(App(context=context or {}), "Test", env=Environment(account="333333333333", region="eu-west-1"))
    PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                   fleet=FleetProps(instance_type="ml.g6e.12xlarge", instance_count=4),
                   deployment=DeploymentPolicy.canary(percent=25, bake=Duration.minutes(12)))
    return Template.from_stack(stack).to_json()


def resources(template: dict, type_name: str) -> dict[str, dict]:
    return {lid: r for lid, r in template["Resources"].items() if r["Type"] == type_name}


def one(template: dict, type_name: str) -> tuple[str, dict]:
    (found,) = resources(template, type_name).items()
    return found


def _rollback_names(template: dict) -> set[str]:
    _, endpoint = one(template, "AWS::SageMaker::Endpoint")
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    config = endpoint["Properties"]["DeploymentConfig"].get("AutoRollbackConfiguration") or {"Alarms": []}
    return {alarms[a["AlarmName"]["Ref"]]["Properties"]["AlarmName"].removeprefix("Test-Serving-")
            for a in config["Alarms"]}


def test_no_client_movable_signal_rolls_a_deploy_back(serving, image):
    rolled = _rollback_names(_endpoint_template(serving, image))
    assert rolled == set(ROLLBACK_SIGNALS) == {"Invocation5XXErrorRate", "TimePerOutputTokenP90"}
    assert not rolled & CLIENT_MOVABLE
    assert CLIENT_MOVABLE <= set(PAGE_ONLY_SIGNALS) and not set(PAGE_ONLY_SIGNALS) & set(ROLLBACK_SIGNALS)


def test_every_metric_alarm_is_either_a_rollback_signal_or_a_page_with_its_reason(serving, image):
    template = _endpoint_template(serving, image)
    metric_alarms = {a["Properties"]["AlarmName"].removeprefix("Test-Serving-")
                     for a in resources(template, "AWS::CloudWatch::Alarm").values()
                     if "EvaluationCriteria" not in a["Properties"]}  # the PromQL alarms page, by construction
    assert metric_alarms == set(ROLLBACK_SIGNALS) | set(PAGE_ONLY_SIGNALS)
    assert all(why.strip() for why in [*ROLLBACK_SIGNALS.values(), *PAGE_ONLY_SIGNALS.values()])


REASON = "INC-1234: hotfix for the tokenizer crash"


def test_break_glass_deploys_without_rollback_says_why_and_the_stack_diff_fails_it(serving, image):
    armed = _endpoint_template(serving, image)
    hotfix = _endpoint_template(serving, image, {"peagle:break-glass": REASON})
    assert _rollback_names(armed) and not _rollback_names(hotfix)
    _, endpoint = one(hotfix, "AWS::SageMaker::Endpoint")
    assert {"Key": "peagle:break-glass", "Value": REASON} in endpoint["Properties"]["Tags"]
    assert len(resources(hotfix, "AWS::CloudWatch::Alarm")) == len(resources(armed, "AWS::CloudWatch::Alarm"))

    flagged = [f for f in classify(armed, hotfix) if "BREAK-GLASS" in f.change]
    assert [(f.verdict, f.type) for f in flagged] == [(FAIL, "AWS::SageMaker::Endpoint")]
    assert REASON in flagged[0].why
    assert not [f for f in classify(armed, armed) if "BREAK-GLASS" in f.change]
    assert not [f for f in classify(hotfix, armed) if "BREAK-GLASS" in f.change]  # re-armed: nothing to flag


@pytest.mark.parametrize("reason", ["hotfix", "INC-1: fix; rm -rf", 42])
def test_break_glass_needs_a_reason_a_reviewer_can_read(serving, image, reason):
    with pytest.raises(ConfigError, match=r"^peagle:break-glass: "):
        _endpoint_template(serving, image, {"peagle:break-glass": reason})
