"""PEagleEndpoint (the composite) and the endpoint, autoscaling and monitoring pieces it wires together."""

from __future__ import annotations

import json

import pytest
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template

from peagle_contract.request_log import METRIC_FIELDS, filter_pattern, metric_value
from peagle_constructs import (
    AutoscalingOptions, ConfigError, DeploymentPolicy, EndpointAutoscaling, PEagleEndpoint, ScalingMetric,
)
from peagle_constructs.security import NAG_PACKS
from tests.constructs.construct_helpers import as_text, one, resources


@pytest.fixture
def endpoint(stack, serving, image) -> PEagleEndpoint:
    return PEagleEndpoint(stack, "Serving", serving=serving, image=image, instance_type="ml.g6e.12xlarge",
                          instance_count=4, deployment=DeploymentPolicy.canary(percent=25, bake=Duration.minutes(12)))


@pytest.fixture
def template(stack, endpoint) -> Template:
    return Template.from_stack(stack)


def test_endpoint_logical_id_is_stable(template):
    # Pinned: a new logical id replaces the endpoint (downtime). Change only on purpose.
    logical_id, _ = one(template, "AWS::SageMaker::Endpoint")
    assert logical_id == "ServingEndpoint6026893D"


def test_endpoint_name_is_derived_from_stack_and_id(endpoint, template):
    assert endpoint.endpoint_name == "Test-Serving"
    template.has_resource_properties("AWS::SageMaker::Endpoint", {"EndpointName": "Test-Serving",
                                                                    "RetainAllVariantProperties": True})
    template.has_resource_properties("AWS::Logs::LogGroup", {"LogGroupName": "/aws/sagemaker/Endpoints/Test-Serving"})


def test_blue_green_canary_with_bake_and_rollback_from_the_monitoring_alarms(endpoint, stack, template):
    _, cfn = one(template, "AWS::SageMaker::Endpoint")
    policy = cfn["Properties"]["DeploymentConfig"]["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"] == {
        "Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}, "WaitIntervalInSeconds": 720}
    assert 600 <= policy["MaximumExecutionTimeoutInSeconds"] <= 28800
    rollback = cfn["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    expected = [{"AlarmName": {"Ref": stack.get_logical_id(a.node.default_child)}} for a in endpoint.alarms.values()]
    assert rollback == expected and len(expected) == 4
    assert set(endpoint.alarms) == {"TimeToFirstTokenP90", "ModelLatencyP99", "Invocation5XXErrors",
                                    "InvocationModelErrors"}
    assert "ServingMonitoringLogGroup" in cfn["DependsOn"][0]  # our log group exists before SageMaker writes


def test_alarm_added_later_joins_the_rollback_list(endpoint, stack):
    from aws_cdk import aws_cloudwatch as cloudwatch

    extra = cloudwatch.Alarm(stack, "Extra", metric=endpoint.metric_tpot(), threshold=100, evaluation_periods=1)
    endpoint.endpoint.add_rollback_alarm(extra)
    _, cfn = one(Template.from_stack(stack), "AWS::SageMaker::Endpoint")
    names = cfn["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    assert names[-1] == {"AlarmName": {"Ref": stack.get_logical_id(extra.node.default_child)}} and len(names) == 5


def test_kms_key_on_ebs_only_and_key_rotation(stack, serving, image):
    PEagleEndpoint(stack, "Ebs", serving=serving, image=image, instance_type="ml.p3.2xlarge")
    template = Template.from_stack(stack)
    _, config = one(template, "AWS::SageMaker::EndpointConfig")
    key_id, key = one(template, "AWS::KMS::Key")
    assert config["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert key["Properties"]["EnableKeyRotation"] is True


def test_autoscaling_tracks_concurrency_with_long_scale_in(template, endpoint):
    _, target = one(template, "AWS::ApplicationAutoScaling::ScalableTarget")
    props = target["Properties"]
    assert props["ResourceId"] == "endpoint/Test-Serving/variant/AllTraffic"
    assert props["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    assert (props["MinCapacity"], props["MaxCapacity"]) == (4, 8)
    assert "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint" in as_text(props["RoleARN"])
    template.resource_count_is("AWS::IAM::Role", 1)  # only the model's: scaling uses the service-linked role
    _, policy = one(template, "AWS::ApplicationAutoScaling::ScalingPolicy")
    tracking = policy["Properties"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == \
        "SageMakerVariantConcurrentRequestsPerModelHighResolution"
    assert tracking["ScaleInCooldown"] >= 600 > tracking["ScaleOutCooldown"]
    assert "ServingEndpoint" in as_text(target.get("DependsOn"))


def test_invocations_per_instance_is_an_option(stack):
    EndpointAutoscaling(stack, "Scaling", endpoint_name="e", variant_name="AllTraffic", min_capacity=1,
                        max_capacity=3, metric=ScalingMetric.INVOCATIONS_PER_INSTANCE, target_value=30)
    Template.from_stack(stack).has_resource_properties("AWS::ApplicationAutoScaling::ScalingPolicy", {
        "TargetTrackingScalingPolicyConfiguration": Match.object_like({
            "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
            "TargetValue": 30})})


def test_autoscaling_can_be_turned_off(stack, serving, image):
    PEagleEndpoint(stack, "Fixed", serving=serving, image=image, instance_type="ml.g6e.xlarge", autoscaling=None)
    Template.from_stack(stack).resource_count_is("AWS::ApplicationAutoScaling::ScalableTarget", 0)


def test_metric_filters_are_generated_from_the_request_log_schema(template):
    filters = resources(template, "AWS::Logs::MetricFilter")
    assert len(filters) == len(METRIC_FIELDS)
    by_name = {f["Properties"]["MetricTransformations"][0]["MetricName"]: f["Properties"] for f in filters.values()}
    for field in METRIC_FIELDS:
        props = by_name[field.metric_name]
        assert props["FilterPattern"] == filter_pattern(field)
        transform = props["MetricTransformations"][0]
        assert transform["MetricValue"] == metric_value(field)
        assert transform["MetricNamespace"] == "PEagle/Serving/Test-Serving"
        assert transform["Unit"] == field.unit


def test_log_group_encrypted_with_retention_and_key_policy_for_logs(template):
    log_group_id, log_group = one(template, "AWS::Logs::LogGroup")
    key_id, key = one(template, "AWS::KMS::Key")
    assert log_group["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert log_group["Properties"]["RetentionInDays"] >= 365
    key_policy = as_text(key["Properties"]["KeyPolicy"])
    assert "kms:EncryptionContext:aws:logs:arn" in key_policy and "cloudwatch.amazonaws.com" in key_policy


def test_alarms_notify_an_encrypted_tls_only_topic(template):
    topic_id, topic = one(template, "AWS::SNS::Topic")
    assert "KmsMasterKeyId" in topic["Properties"]
    _, topic_policy = one(template, "AWS::SNS::TopicPolicy")
    deny = [s for s in topic_policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert len(alarms) == 4
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}]
        assert alarm["Properties"]["TreatMissingData"] == "notBreaching"
    by_metric = {a["Properties"]["MetricName"]: a["Properties"] for a in alarms.values()}
    assert by_metric["TimeToFirstToken"]["ExtendedStatistic"] == "p90"
    assert by_metric["TimeToFirstToken"]["Namespace"] == "PEagle/Serving/Test-Serving"
    assert by_metric["ModelLatency"]["ExtendedStatistic"] == "p99"
    assert by_metric["ModelLatency"]["Threshold"] == 120_000_000  # microseconds
    assert {"Invocation5XXErrors", "InvocationModelErrors"} <= set(by_metric)


def test_dashboard_shows_serving_and_acceptance(template, endpoint):
    _, dashboard = one(template, "AWS::CloudWatch::Dashboard")
    body = as_text(dashboard["Properties"]["DashboardBody"])
    for needle in ("TimeToFirstToken", "TimePerOutputToken", "p50", "p90", "p99", "Invocations",
                   "Invocation5XXErrors", "ConcurrentRequestsPerModel", "GPUUtilization", "GPUMemoryUtilization",
                   "/aws/sagemaker/Endpoints", "1 + 5 * accepted / drafted", "accepted / drafted"):
        assert needle in body, needle


def test_grant_invoke_is_scoped_to_the_endpoint(stack, endpoint):
    caller = iam.Role(stack, "Caller", assumed_by=iam.AccountRootPrincipal())
    endpoint.grant_invoke(caller)
    policies = Template.from_stack(stack).find_resources("AWS::IAM::Policy")
    (statement,) = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]
    assert statement["Action"] == ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"]
    assert as_text(statement["Resource"]).endswith(':endpoint/test-serving"]]}')


def test_metric_helpers(endpoint):
    assert endpoint.metric_ttft().metric_name == "TimeToFirstToken"
    assert endpoint.metric_model_latency().metric_name == "ModelLatency"
    assert endpoint.metric_invocation_5xx_errors().metric_name == "Invocation5XXErrors"
    assert endpoint.metric_concurrent_requests().namespace == "AWS/SageMaker"
    assert endpoint.metric_gpu_utilization().namespace == "/aws/sagemaker/Endpoints"
    assert "accepted" in endpoint.metric_acceptance_length().expression


@pytest.mark.parametrize("instance_type", ["ml.g6e.xlarge", "ml.p3.2xlarge"])
def test_the_composite_alone_passes_every_nag_pack(stack, serving, image, instance_type):
    PEagleEndpoint(stack, "Serving", serving=serving, image=image, instance_type=instance_type)
    for pack in NAG_PACKS:
        report = pack().validate_scope(stack)
        assert report.success, (instance_type, pack.__name__, [v.rule_name for v in report.violations])


def test_model_without_log_group_is_still_nag_clean(stack, serving, image):
    from peagle_constructs import PEagleModel

    PEagleModel(stack, "Model", serving=serving, image=image)
    for pack in NAG_PACKS:
        report = pack().validate_scope(stack)
        assert report.success, (pack.__name__, [v.rule_name for v in report.violations])


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"endpoint_name": "has_underscore"}, "endpoint_name"),
    ({"autoscaling": AutoscalingOptions(min_capacity=0)}, "autoscaling.min_capacity"),
    ({"deployment": DeploymentPolicy.linear(percent=5)}, "deployment.percent"),
    ({"monitoring": __import__("peagle_constructs").AlarmThresholds(ttft_p90_ms=0)}, "monitoring.ttft_p90_ms"),
])
def test_composite_props_are_checked(stack, serving, image, kwargs, field):
    with pytest.raises(ConfigError) as caught:
        PEagleEndpoint(stack, "Serving", serving=serving, image=image, instance_type="ml.g6e.xlarge", **kwargs)
    assert caught.value.field_name == field and "allowed" in str(caught.value)


def test_request_log_line_matches_its_filter_fields():
    """A real line from the schema's formatter carries every field a filter selects."""
    from peagle_contract.request_log import format_line

    line = json.loads(format_line({"request_id": "r1", "route": "/invocations", "stream": True, "status": 200,
                                   "ttft_ms": 12.5, "tpot_ms": 3.2, "e2e_ms": 80.0, "prompt_tokens": 9,
                                   "output_tokens": 20, "drafted_tokens": 35, "accepted_tokens": 14}))
    for field in METRIC_FIELDS:
        assert metric_value(field) == f"$.{field.key}" and field.key in line
