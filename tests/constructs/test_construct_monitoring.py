"""EndpointMonitoring: the log group, request-line metric filters, alarms, who they tell, the dashboard."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from peagle_contract.request_log import METRIC_FIELDS, filter_pattern, metric_value
from peagle_constructs import AlarmThresholds, ConfigError, FleetProps, ModelProps, PEagleEndpoint
from tests import policy_judge
from tests.constructs.construct_helpers import NOTIFY_ONLY, ROLLBACK, as_text, one, resources


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
    PEagleEndpoint(stack, "Serving", image=image, fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                   model=ModelProps(serving=serving, alarm_subscribers=(
                       AlarmSubscriber.email("oncall@example.com"), AlarmSubscriber.https("https://hooks.example.com/sns"),
                       AlarmSubscriber.topic(existing))))
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


def test_alarm_thresholds_are_checked_where_they_are_given(stack, serving, image):
    with pytest.raises(ConfigError, match=r"^alarm_thresholds.ttft_p90_ms: got 0; allowed: a positive number"):
        PEagleEndpoint(stack, "Serving", image=image, fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                       model=ModelProps(serving=serving, alarm_thresholds=AlarmThresholds(ttft_p90_ms=0)))


def test_monitoring_alone_is_built_from_the_endpoints_props(stack, serving):
    """Usable without the composite, for an endpoint deployed some other way: the props say everything."""
    from aws_cdk import aws_logs as logs

    from peagle_constructs import DetailedObservability, EndpointMonitoring

    monitoring = EndpointMonitoring(
        stack, "Monitoring", endpoint_name="team-llm",
        model=ModelProps(serving=serving, alarm_thresholds=AlarmThresholds(ttft_p90_ms=1500)),
        fleet=FleetProps(instance_type="ml.g6e.xlarge", log_retention=logs.RetentionDays.ONE_MONTH,
                         detailed_observability=DetailedObservability(enabled=False)))
    template = Template.from_stack(stack)
    _, group = one(template, "AWS::Logs::LogGroup")
    assert group["Properties"]["LogGroupName"] == "/aws/sagemaker/Endpoints/team-llm"
    assert group["Properties"]["RetentionInDays"] == 30
    alarms = {a["Properties"]["AlarmName"]: a["Properties"] for a in resources(template, "AWS::CloudWatch::Alarm").values()}
    # Detailed observability off: no PromQL alarm reads what would not be published.
    assert set(alarms) == {f"team-llm-{n}" for n in ROLLBACK | NOTIFY_ONLY if not n.startswith("Vllm")}
    assert alarms["team-llm-TimeToFirstTokenP90"]["Threshold"] == 1500
    assert {a.node.id for a in monitoring.rollback_alarms} == ROLLBACK
    assert "1 + 5 * accepted / drafted" in monitoring.metric_acceptance_length().expression  # K from the serving config


@pytest.mark.parametrize(("props", "field"), [
    ({"model": "serving"}, "model"),
    ({"model": ModelProps(serving="not a config")}, "model.serving"),
    ({"fleet": "ml.g6e.xlarge"}, "fleet"),
])
def test_monitoring_props_name_the_field(stack, serving, props, field):
    from peagle_constructs import EndpointMonitoring

    given = {"model": ModelProps(serving=serving), "fleet": FleetProps(instance_type="ml.g6e.xlarge"), **props}
    with pytest.raises(ConfigError) as caught:
        EndpointMonitoring(stack, "Monitoring", endpoint_name="team-llm", **given)
    assert caught.value.field_name == field and "allowed" in str(caught.value)
