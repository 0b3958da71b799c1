"""Deployment policies as the endpoint renders them: blue/green steps, rolling batches, rollback alarms."""

from __future__ import annotations

import pytest
from aws_cdk import Duration
from aws_cdk.assertions import Template

from peagle_constructs import ConfigError, DeploymentPolicy, FleetProps, ModelProps, PEagleEndpoint
from tests.constructs.construct_helpers import NOTIFY_ONLY, ROLLBACK, one


def test_blue_green_canary_with_bake_and_rollback_on_signals_a_healthy_fleet_never_trips(endpoint, stack, template):
    _, cfn = one(template, "AWS::SageMaker::Endpoint")
    policy = cfn["Properties"]["DeploymentConfig"]["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"] == {
        "Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}, "WaitIntervalInSeconds": 720}
    assert 600 <= policy["MaximumExecutionTimeoutInSeconds"] <= 28800
    rollback = cfn["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    expected = [{"AlarmName": {"Ref": stack.get_logical_id(a.node.default_child)}} for a in endpoint.monitoring.rollback_alarms]
    assert rollback == expected
    assert set(endpoint.alarms) == ROLLBACK | NOTIFY_ONLY
    assert {k for k, a in endpoint.alarms.items() if a in endpoint.monitoring.rollback_alarms} == ROLLBACK
    assert "ServingMonitoringLogGroup" in cfn["DependsOn"][0]  # our log group exists before SageMaker writes


def test_rolling_update_renders_sagemakers_policy_with_the_same_rollback_alarms(stack, serving, image):
    PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                   fleet=FleetProps(instance_type="ml.g6e.12xlarge", instance_count=4), deployment=DeploymentPolicy.rolling(instances=1, bake=Duration.minutes(8), rollback_percent=100))
    _, cfn = one(Template.from_stack(stack), "AWS::SageMaker::Endpoint")
    config = cfn["Properties"]["DeploymentConfig"]
    assert "BlueGreenUpdatePolicy" not in config
    rolling = config["RollingUpdatePolicy"]
    assert rolling["MaximumBatchSize"] == {"Type": "INSTANCE_COUNT", "Value": 1}
    assert rolling["RollbackMaximumBatchSize"] == {"Type": "CAPACITY_PERCENT", "Value": 100}
    assert rolling["WaitIntervalInSeconds"] == 480
    # Four batches of one: a new instance starts and bakes per batch, all inside SageMaker's 8-hour cap.
    assert 4 * (1800 + 480) <= rolling["MaximumExecutionTimeoutInSeconds"] <= 28800
    assert len(config["AutoRollbackConfiguration"]["Alarms"]) == len(ROLLBACK)


@pytest.mark.parametrize(("policy", "field", "allowed"), [
    (lambda: DeploymentPolicy.rolling(percent=4), "deployment.percent", "5..50"),
    (lambda: DeploymentPolicy.rolling(percent=60), "deployment.percent", "5..50"),
    (lambda: DeploymentPolicy.rolling(instances=3), "deployment.instances", "1..2"),
    (lambda: DeploymentPolicy.rolling(percent=25, rollback_instances=5), "deployment.rollback.instances", "1..4"),
    (lambda: DeploymentPolicy.rolling(percent=25, bake=Duration.hours(2)), "deployment.bake", "0..3600"),
])
def test_rolling_update_ranges(stack, serving, image, policy, field, allowed):
    with pytest.raises(ConfigError) as caught:
        PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                       fleet=FleetProps(instance_type="ml.g6e.12xlarge", instance_count=4), deployment=policy())
    assert caught.value.field_name == field and allowed in str(caught.value)


def test_alarm_added_later_joins_the_rollback_list(endpoint, stack):
    from aws_cdk import aws_cloudwatch as cloudwatch

    extra = cloudwatch.Alarm(stack, "Extra", metric=endpoint.monitoring.metric_tpot(), threshold=100, evaluation_periods=1)
    endpoint.endpoint.add_rollback_alarm(extra)
    _, cfn = one(Template.from_stack(stack), "AWS::SageMaker::Endpoint")
    names = cfn["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    assert names[-1] == {"AlarmName": {"Ref": stack.get_logical_id(extra.node.default_child)}}
    assert len(names) == len(ROLLBACK) + 1
    for i in range(10 - len(names)):
        endpoint.endpoint.add_rollback_alarm(cloudwatch.Alarm(stack, f"More{i}", metric=endpoint.monitoring.metric_tpot(),
                                                              threshold=100, evaluation_periods=1))
    with pytest.raises(ConfigError, match=r"^rollback_alarms: .*at most 10"):
        endpoint.endpoint.add_rollback_alarm(extra)
