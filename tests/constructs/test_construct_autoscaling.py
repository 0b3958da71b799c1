"""Instance-count autoscaling of an endpoint: target tracking, its metric, off."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from peagle_constructs import EndpointAutoscaling, FleetProps, ModelProps, PEagleEndpoint, ScalingMetric
from tests.constructs.construct_helpers import as_text, one


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
    PEagleEndpoint(stack, "Fixed", model=ModelProps(serving=serving), image=image,
                   fleet=FleetProps(instance_type="ml.g6e.xlarge"), scaling=None)
    Template.from_stack(stack).resource_count_is("AWS::ApplicationAutoScaling::ScalableTarget", 0)
