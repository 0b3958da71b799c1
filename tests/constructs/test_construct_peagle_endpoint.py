"""PEagleEndpoint, the composite: its name, storage key, grants, metrics, nag packs and props checks."""

from __future__ import annotations

import pytest
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from peagle_constructs import (
    AutoscalingOptions, ConfigError, DeploymentPolicy, DetailedObservability, FleetProps, ModelProps, PEagleEndpoint,
)
from peagle_constructs.security import NAG_PACKS
from tests.constructs.construct_helpers import as_text, one


def test_endpoint_logical_id_is_stable(template):
    # Pinned: a new logical id replaces the endpoint (downtime). Change only on purpose.
    logical_id, _ = one(template, "AWS::SageMaker::Endpoint")
    assert logical_id == "ServingEndpoint6026893D"


def test_endpoint_name_is_derived_from_stack_and_id(endpoint, template):
    assert endpoint.endpoint_name == "Test-Serving"
    template.has_resource_properties("AWS::SageMaker::Endpoint", {"EndpointName": "Test-Serving",
                                                                    "RetainAllVariantProperties": True})
    template.has_resource_properties("AWS::Logs::LogGroup", {"LogGroupName": "/aws/sagemaker/Endpoints/Test-Serving"})


def test_kms_key_on_ebs_only_and_key_rotation(stack, serving, image):
    PEagleEndpoint(stack, "Ebs", model=ModelProps(serving=serving), image=image, fleet=FleetProps(instance_type="ml.p3.2xlarge"))
    template = Template.from_stack(stack)
    _, config = one(template, "AWS::SageMaker::EndpointConfig")
    key_id, key = one(template, "AWS::KMS::Key")
    assert config["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert key["Properties"]["EnableKeyRotation"] is True


def test_grant_invoke_is_scoped_to_the_endpoint(stack, endpoint):
    caller = iam.Role(stack, "Caller", assumed_by=iam.AccountRootPrincipal())
    endpoint.grant_invoke(caller)
    policies = Template.from_stack(stack).find_resources("AWS::IAM::Policy")
    (statement,) = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]
    assert statement["Action"] == ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"]
    assert as_text(statement["Resource"]).endswith(':endpoint/test-serving"]]}')


def test_metrics_of_the_endpoint_and_of_its_request_lines(endpoint):
    # SageMaker's metrics are the endpoint's own, at the period its alarms judge them.
    assert endpoint.metric_model_latency().metric_name == "ModelLatency"
    assert endpoint.metric_invocation_5xx_errors().metric_name == "Invocation5XXErrors"
    assert endpoint.metric_invocations().period.to_seconds() == endpoint.monitoring.alarm_thresholds.period.to_seconds()
    assert endpoint.metric_invocations().dimensions == {"EndpointName": "Test-Serving", "VariantName": "AllTraffic"}
    # The request-line and utilisation metrics are its monitoring's.
    assert endpoint.monitoring.metric_ttft().metric_name == "TimeToFirstToken"
    assert endpoint.monitoring.metric_concurrent_requests().namespace == "AWS/SageMaker"
    assert endpoint.monitoring.metric_gpu_utilization().namespace == "/aws/sagemaker/Endpoints"
    assert "accepted" in endpoint.monitoring.metric_acceptance_length().expression


@pytest.mark.parametrize("instance_type", ["ml.g6e.xlarge", "ml.p3.2xlarge"])
def test_the_composite_alone_passes_every_nag_pack(stack, serving, image, instance_type):
    PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                   fleet=FleetProps(instance_type=instance_type))
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
    ({"scaling": AutoscalingOptions(min_capacity=0)}, "scaling.min_capacity"),
    ({"deployment": DeploymentPolicy.linear(percent=5)}, "deployment.percent"),
    ({"fleet": FleetProps(instance_type="ml.g6e.xlarge", detailed_observability=DetailedObservability(
        publish_frequency=Duration.seconds(45)))}, "detailed_observability.publish_frequency"),
    ({"model": "serving"}, "model"),
    ({"fleet": "ml.g6e.xlarge"}, "fleet"),
])
def test_composite_props_are_checked(stack, serving, image, kwargs, field):
    props = {"model": ModelProps(serving=serving), "fleet": FleetProps(instance_type="ml.g6e.xlarge"), **kwargs}
    with pytest.raises(ConfigError) as caught:
        PEagleEndpoint(stack, "Serving", image=image, **props)
    assert caught.value.field_name == field and "allowed" in str(caught.value)


