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
from tests import policy_judge
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


ROLLBACK = {"TimeToFirstTokenP90", "TimePerOutputTokenP90", "Invocation5XXErrorRate", "InvocationModelErrorRate",
            "AcceptanceRate"}
NOTIFY_ONLY = {"ModelLatencyP99", "VllmTimeToFirstTokenP90", "VllmInterTokenLatencyP90", "VllmAcceptanceRate"}


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
    PEagleEndpoint(stack, "Serving", serving=serving, image=image, instance_type="ml.g6e.12xlarge", instance_count=4,
                   deployment=DeploymentPolicy.rolling(instances=1, bake=Duration.minutes(8), rollback_percent=100))
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
        PEagleEndpoint(stack, "Serving", serving=serving, image=image, instance_type="ml.g6e.12xlarge",
                       instance_count=4, deployment=policy())
    assert caught.value.field_name == field and allowed in str(caught.value)


def test_alarm_added_later_joins_the_rollback_list(endpoint, stack):
    from aws_cdk import aws_cloudwatch as cloudwatch

    extra = cloudwatch.Alarm(stack, "Extra", metric=endpoint.metric_tpot(), threshold=100, evaluation_periods=1)
    endpoint.endpoint.add_rollback_alarm(extra)
    _, cfn = one(Template.from_stack(stack), "AWS::SageMaker::Endpoint")
    names = cfn["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    assert names[-1] == {"AlarmName": {"Ref": stack.get_logical_id(extra.node.default_child)}}
    assert len(names) == len(ROLLBACK) + 1
    for i in range(10 - len(names)):
        endpoint.endpoint.add_rollback_alarm(cloudwatch.Alarm(stack, f"More{i}", metric=endpoint.metric_tpot(),
                                                              threshold=100, evaluation_periods=1))
    with pytest.raises(ConfigError, match=r"^rollback_alarms: .*at most 10"):
        endpoint.endpoint.add_rollback_alarm(extra)


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


def test_every_alarm_is_named_for_the_endpoint_and_notifies_the_encrypted_tls_only_topic(template):
    topic_id, topic = one(template, "AWS::SNS::Topic")
    assert "KmsMasterKeyId" in topic["Properties"]
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert {a["Properties"]["AlarmName"] for a in alarms.values()} == {f"Test-Serving-{n}" for n in ROLLBACK | NOTIFY_ONLY}
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}]
        assert alarm["Properties"]["OKActions"] == [{"Ref": topic_id}]
    by_name = {a["Properties"]["AlarmName"].removeprefix("Test-Serving-"): a["Properties"] for a in alarms.values()}
    ttft = by_name["TimeToFirstTokenP90"]
    assert (ttft["MetricName"], ttft["ExtendedStatistic"], ttft["Threshold"]) == ("TimeToFirstToken", "p90", 2000)
    assert ttft["Namespace"] == "PEagle/Serving/Test-Serving" and ttft["EvaluateLowSampleCountPercentile"] == "ignore"
    assert by_name["ModelLatencyP99"]["Threshold"] == 60_000_000  # microseconds: SageMaker's 60 s answer limit
    # Error rates are percentages of the requests, and never judged on a handful of them.
    rate = by_name["Invocation5XXErrorRate"]
    (expression,) = [m["Expression"] for m in rate["Metrics"] if "Expression" in m]
    assert expression == "IF(requests >= 10, 100 * errors / requests, 0)"
    assert rate["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and rate["Threshold"] == 5
    acceptance = by_name["AcceptanceRate"]
    assert acceptance["ComparisonOperator"] == "LessThanThreshold" and acceptance["Threshold"] == 0.1
    (expression,) = [m["Expression"] for m in acceptance["Metrics"] if "Expression" in m]
    assert expression == "IF(drafted >= 50, accepted / drafted, 1)"  # 10 requests' worth of K=5 drafts


def test_promql_alarms_read_vllms_metrics_for_this_endpoint(template):
    alarms = {a["Properties"]["AlarmName"]: a["Properties"] for a in resources(template, "AWS::CloudWatch::Alarm").values()}
    ttft = alarms["Test-Serving-VllmTimeToFirstTokenP90"]["EvaluationCriteria"]["PromQLCriteria"]["Query"]
    assert ttft == ('histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                    '{"aws.sagemaker.endpoint.name"="Test-Serving"}[300s]))) > 2')
    acceptance = alarms["Test-Serving-VllmAcceptanceRate"]["EvaluationCriteria"]["PromQLCriteria"]["Query"]
    assert "vllm:spec_decode_num_accepted_tokens_total" in acceptance and acceptance.endswith(" < 0.1")


def _place(template) -> "policy_judge.Place":
    topic_id = next(iter(resources(template, "AWS::SNS::Topic")))
    key_id = next(iter(resources(template, "AWS::KMS::Key")))
    return policy_judge.Place(account="333333333333", region="eu-west-1", physical={
        topic_id: "arn:aws:sns:eu-west-1:333333333333:alarms", f"{key_id}.Arn": "arn:aws:kms:eu-west-1:333333333333:key/k"})


def _publish(alarm_arn: str, *, account: str = "333333333333", tls: bool = True) -> policy_judge.Request:
    return policy_judge.Request(service="cloudwatch.amazonaws.com", action="sns:Publish",
                                resource="arn:aws:sns:eu-west-1:333333333333:alarms",
                                context={"aws:SourceArn": alarm_arn, "aws:SourceAccount": account,
                                         "aws:SecureTransport": str(tls).lower()})


def test_cloudwatch_may_publish_for_this_endpoints_alarms_and_for_no_one_else(template):
    _, topic_policy = one(template, "AWS::SNS::TopicPolicy")
    document, place = topic_policy["Properties"]["PolicyDocument"], _place(template)
    names = [a["Properties"]["AlarmName"] for a in resources(template, "AWS::CloudWatch::Alarm").values()]
    for name in names:
        assert policy_judge.allowed(document, _publish(f"arn:aws:cloudwatch:eu-west-1:333333333333:alarm:{name}"), place), name
    # The confused deputy: another account's alarm, another endpoint's alarm, or plain HTTP.
    ours = f"arn:aws:cloudwatch:eu-west-1:333333333333:alarm:{names[0]}"
    assert not policy_judge.allowed(document, _publish(ours.replace("333333333333", "444444444444"),
                                                       account="444444444444"), place)
    assert not policy_judge.allowed(document, _publish("arn:aws:cloudwatch:eu-west-1:333333333333:alarm:other-x"), place)
    assert not policy_judge.allowed(document, _publish(ours, tls=False), place)


def test_cloudwatch_may_use_the_topic_key_on_the_same_conditions_only(template):
    _, key = one(template, "AWS::KMS::Key")
    document, place = key["Properties"]["KeyPolicy"], _place(template)
    alarm = "arn:aws:cloudwatch:eu-west-1:333333333333:alarm:Test-Serving-TimeToFirstTokenP90"

    def kms(action: str, source_arn: str, account: str = "333333333333") -> policy_judge.Request:
        return policy_judge.Request(service="cloudwatch.amazonaws.com", action=action,
                                    resource="arn:aws:kms:eu-west-1:333333333333:key/k",
                                    context={"aws:SourceArn": source_arn, "aws:SourceAccount": account})

    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
        assert policy_judge.allowed(document, kms(action, alarm), place), action
        assert not policy_judge.allowed(document, kms(action, alarm, account="444444444444"), place)
        assert not policy_judge.allowed(document, kms(action, alarm.replace("Test-Serving-", "other-")), place)
    assert not policy_judge.allowed(document, kms("kms:Encrypt", alarm), place)


def test_subscribers_become_subscriptions_and_existing_topics_alarm_actions(stack, serving, image):
    from peagle_constructs import AlarmSubscriber

    existing = "arn:aws:sns:eu-west-1:333333333333:chatbot-alerts"
    PEagleEndpoint(stack, "Serving", serving=serving, image=image, instance_type="ml.g6e.xlarge", alarm_subscribers=[
        AlarmSubscriber.email("oncall@example.com"), AlarmSubscriber.https("https://hooks.example.com/sns"),
        AlarmSubscriber.topic(existing)])
    template = Template.from_stack(stack)
    topic_id, _ = one(template, "AWS::SNS::Topic")
    subscriptions = {(s["Properties"]["Protocol"], s["Properties"]["Endpoint"]): s["Properties"]["TopicArn"]
                     for s in resources(template, "AWS::SNS::Subscription").values()}
    assert subscriptions == {("email", "oncall@example.com"): {"Ref": topic_id},
                             ("https", "https://hooks.example.com/sns"): {"Ref": topic_id}}
    for alarm in resources(template, "AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}, existing]


@pytest.mark.parametrize(("make", "field"), [
    (lambda s: s.email("not-an-address"), "alarm_subscribers.email"),
    (lambda s: s.https("http://plain.example.com"), "alarm_subscribers.https"),
    (lambda s: s.topic("arn:aws:sqs:eu-west-1:333333333333:q"), "alarm_subscribers.topic"),
])
def test_bad_subscribers_name_the_field(make, field):
    from peagle_constructs import AlarmSubscriber

    with pytest.raises(ConfigError) as caught:
        make(AlarmSubscriber)
    assert caught.value.field_name == field and "allowed" in str(caught.value)


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
    ({"detailed_observability": __import__("peagle_constructs").DetailedObservability(
        publish_frequency=Duration.seconds(45))}, "detailed_observability.publish_frequency"),
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
        if field.key is None:  # a count of lines: each selected line adds 1, no field to read
            assert metric_value(field) == "1"
        else:
            assert metric_value(field) == f"$.{field.key}" and field.key in line
