"""Target-tracking autoscaling of an endpoint variant's instance count."""

from __future__ import annotations

from enum import Enum

from aws_cdk import Aws, Duration
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_iam as iam
from constructs import Construct

from peagle_constructs.errors import ConfigError, check_int_range

# The service-linked role Application Auto Scaling uses for SageMaker (created by the service on first
# use): no role of our own, so no second wildcard policy to review.
_SERVICE_LINKED_ROLE = ("arn:{partition}:iam::{account}:role/aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
                        "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint")


class ScalingMetric(Enum):
    """What the target tracks.

    CONCURRENT_REQUESTS counts in-flight requests per model copy at 10-second resolution, and a streaming
    request stays counted until its last token: the load signal for LLMs. INVOCATIONS_PER_INSTANCE counts
    request starts per minute, blind to how long each generation runs.
    """

    CONCURRENT_REQUESTS = appscaling.PredefinedMetric.SAGEMAKER_VARIANT_CONCURRENT_REQUESTS_PER_MODEL_HIGH_RESOLUTION
    INVOCATIONS_PER_INSTANCE = appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE


class EndpointAutoscaling(Construct):
    """Scale ``variant_name`` of ``endpoint_name`` between ``min_capacity`` and ``max_capacity`` instances.

    Scale-in waits ``scale_in_cooldown`` (default 15 minutes): a new GPU instance takes many minutes to load an
    LLM, so giving one back on a short lull costs that start again at the next burst.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint_name: str,
        variant_name: str,
        min_capacity: int = 1,
        max_capacity: int = 2,
        metric: ScalingMetric = ScalingMetric.CONCURRENT_REQUESTS,
        target_value: float = 16.0,
        scale_in_cooldown: Duration = Duration.minutes(15),
        scale_out_cooldown: Duration = Duration.minutes(2),
    ) -> None:
        super().__init__(scope, id)
        check_int_range(min_capacity, "autoscaling.min_capacity", 1, 100)
        check_int_range(max_capacity, "autoscaling.max_capacity", 1, 100)
        if min_capacity > max_capacity:
            raise ConfigError("autoscaling.min_capacity",
                              f"got {min_capacity} > max_capacity {max_capacity}; allowed: min_capacity <= max_capacity")
        if not isinstance(metric, ScalingMetric):
            raise ConfigError("autoscaling.metric", f"got {metric!r}; allowed: one of {[m.name for m in ScalingMetric]}")
        if isinstance(target_value, bool) or not isinstance(target_value, (int, float)) or target_value <= 0:
            raise ConfigError("autoscaling.target_value", f"got {target_value!r}; allowed: a positive number")
        for name, value in (("autoscaling.scale_in_cooldown", scale_in_cooldown),
                            ("autoscaling.scale_out_cooldown", scale_out_cooldown)):
            if not isinstance(value, Duration) or not 0 <= value.to_seconds() <= 3600:
                raise ConfigError(name, f"got {value!r}; allowed: a Duration of 0..3600 s")

        self.min_capacity, self.max_capacity, self.metric = min_capacity, max_capacity, metric
        role = iam.Role.from_role_arn(
            self, "ServiceLinkedRole",
            _SERVICE_LINKED_ROLE.format(partition=Aws.PARTITION, account=Aws.ACCOUNT_ID), mutable=False,
        )
        self.scalable_target = appscaling.ScalableTarget(
            self, "Target",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=f"endpoint/{endpoint_name}/variant/{variant_name}",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount",
            min_capacity=min_capacity,
            max_capacity=max_capacity,
            role=role,
        )
        self.policy = self.scalable_target.scale_to_track_metric(
            "TargetTracking",
            target_value=float(target_value),
            predefined_metric=metric.value,
            scale_in_cooldown=scale_in_cooldown,
            scale_out_cooldown=scale_out_cooldown,
        )
