"""Rollbacks that can happen: SageMaker's guardrails read the rollback alarms as the execution role, and the model
and endpoint config an endpoint may still serve after a rolled-back update outlive CloudFormation's cleanup.

Before this, no role of ours could call ``cloudwatch:DescribeAlarms`` (SageMaker's deployment-guardrails guide says
the execution role must), so an alarm firing during a bake might never roll anything back; and a replaced Model or
EndpointConfig was deleted by CloudFormation even while a rolled-back endpoint still ran on it.
"""

from __future__ import annotations

import fnmatch

import pytest
from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk.assertions import Template

from peagle_constructs import (
    CopyScaling, DeploymentPolicy, FleetProps, InstanceScaling, ModelProps, PEagleComponentEndpoint,
)
from tests import policy_judge

ACCOUNT, REGION = "333333333333", "eu-west-1"  # the construct tests' stack


def _reads(template: dict, role_logical_id: str) -> list[dict]:
    """Every statement of the managed policies attached to ``role_logical_id``."""
    return [s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::ManagedPolicy"
            and {"Ref": role_logical_id} in r["Properties"].get("Roles", [])
            for s in r["Properties"]["PolicyDocument"]["Statement"]]


def _arn(logical_id: str) -> str:
    return f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{logical_id}"


def _judge(template: dict, role: str, alarms: dict[str, str]) -> dict[str, bool]:
    """Whether ``role`` may DescribeAlarms on each alarm (by logical id), judged by our policy judge."""
    physical = {f"{lid}.Arn": _arn(lid) for lid, r in template["Resources"].items()
                if r["Type"] == "AWS::CloudWatch::Alarm"}
    place = policy_judge.Place(account=ACCOUNT, region=REGION, physical=physical)
    # The statements that could grant the read (any other statement's resources are not this judge's to resolve).
    policy = {"Statement": [s for s in _reads(template, role) if any(
        fnmatch.fnmatchcase("cloudwatch:describealarms", a.lower()) for a in _listed(s["Action"]))]}
    return {name: policy_judge.allowed(policy, policy_judge.Request(service="", action="cloudwatch:DescribeAlarms",
                                                                     resource=_arn(lid)), place, identity=True)
            for name, lid in alarms.items()}


def _listed(value):  # noqa: ANN001, ANN202
    return value if isinstance(value, list) else [value]


def _alarm_ids(stack, alarms) -> dict[str, str]:  # noqa: ANN001
    return {a.node.id: stack.get_logical_id(a.node.default_child) for a in alarms}


def test_the_endpoints_execution_role_may_read_exactly_its_rollback_alarms(stack, endpoint, template):
    t = template.to_json()
    (model,) = [r for r in t["Resources"].values() if r["Type"] == "AWS::SageMaker::Model"]
    role = model["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
    rollback = _alarm_ids(stack, endpoint.monitoring.rollback_alarms)
    others = _alarm_ids(stack, [a for a in endpoint.alarms.values() if a not in endpoint.monitoring.rollback_alarms])
    assert rollback and others
    assert _judge(t, role, rollback) == {name: True for name in rollback}
    assert _judge(t, role, others) == {name: False for name in others}  # paging alarms are none of its business


def test_an_alarm_added_later_is_readable_too(stack, endpoint):
    extra = cloudwatch.Alarm(stack, "Extra", metric=endpoint.monitoring.metric_tpot(), threshold=100,
                             evaluation_periods=1)
    endpoint.endpoint.add_rollback_alarm(extra)
    t = Template.from_stack(stack).to_json()
    (model,) = [r for r in t["Resources"].values() if r["Type"] == "AWS::SageMaker::Model"]
    role = model["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
    assert _judge(t, role, {"Extra": stack.get_logical_id(extra.node.default_child)}) == {"Extra": True}


def test_a_components_rollout_is_judged_as_the_fleets_role_which_may_read_its_alarms(stack, serving, image):
    fleet = PEagleComponentEndpoint(stack, "Fleet", endpoint_name="fleet", fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                                    instance_scaling=InstanceScaling(min_instances=0, max_instances=2))
    component = fleet.add_component("Chat", model=ModelProps(serving=serving), image=image,
                                    scaling=CopyScaling(min_copies=0),
                                    deployment=DeploymentPolicy.rolling(copies=1, bake=Duration.minutes(5)))
    t = Template.from_stack(stack).to_json()
    (config,) = [r for r in t["Resources"].values() if r["Type"] == "AWS::SageMaker::EndpointConfig"]
    role = config["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
    rollback = _alarm_ids(stack, component.rollback_alarms)
    (ic,) = [r for r in t["Resources"].values() if r["Type"] == "AWS::SageMaker::InferenceComponent"]
    named = ic["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    assert [a["AlarmName"]["Ref"] for a in named] == list(rollback.values())
    assert _judge(t, role, rollback) == {name: True for name in rollback}


@pytest.mark.parametrize("kind", ["AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig"])
def test_a_replaced_model_or_endpoint_config_is_retained_and_a_deleted_stack_still_deletes_it(template, kind):
    for resource in template.find_resources(kind).values():
        assert resource["UpdateReplacePolicy"] == "Retain"
        assert resource["DeletionPolicy"] == "Delete"


def test_the_endpoint_itself_is_not_retained(template):
    (endpoint,) = template.find_resources("AWS::SageMaker::Endpoint").values()
    assert "UpdateReplacePolicy" not in endpoint
