"""Autoscaling: an endpoint variant's instance count, or an inference component's copy count (to zero and back)."""

from __future__ import annotations

from enum import Enum

from aws_cdk import Aws, Duration
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from constructs import Construct

from peagle_constructs.errors import ConfigError
from peagle_constructs.validation import check_duration, check_int, check_order, check_positive, check_type
from peagle_constructs.sagemaker_names import INVOCATION_METRICS_NAMESPACE

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
        check_type(metric, "scaling.metric", ScalingMetric, f"one of {[m.name for m in ScalingMetric]}")
        self.min_capacity, self.max_capacity, self.metric = min_capacity, max_capacity, metric
        self.scalable_target, self.policy = _target_tracking(
            self, field="scaling", resource_id=f"endpoint/{endpoint_name}/variant/{variant_name}",
            dimension="sagemaker:variant:DesiredInstanceCount", low=(min_capacity, 1), high=max_capacity,
            metric=metric.value, target_value=target_value, cooldowns=(scale_in_cooldown, scale_out_cooldown))


def check_floor_above_zero(value: object, field_name: str) -> None:
    """For a fleet or component that must answer its first request at once: no minimum of zero."""
    if value == 0:
        raise ConfigError(field_name, "got 0, and this environment keeps a floor above zero (a cold start of a "
                          "large model takes many minutes); allowed: 1 or more")


def _check_cooldown(value: object, name: str) -> None:
    check_duration(value, name, 0, 3600)


def _target_tracking(scope: Construct, *, field: str, resource_id: str, dimension: str, low: tuple[int, int],
                     high: int, metric: appscaling.PredefinedMetric, target_value: float,
                     cooldowns: tuple[Duration, Duration], bounds: tuple[str, str] = ("min_capacity", "max_capacity"),
                     ) -> tuple[appscaling.ScalableTarget, appscaling.TargetTrackingScalingPolicy]:
    """The scalable target and its target-tracking policy; ``low`` is (min capacity, the least it may be),
    ``bounds`` the names the caller gave the two capacities (for the errors)."""
    min_capacity, floor = low
    low_name, high_name = bounds
    check_int(min_capacity, f"{field}.{low_name}", floor, 100)
    check_int(high, f"{field}.{high_name}", 1, 100)
    check_order(min_capacity, high, f"{field}.{low_name}", f"{field}.{high_name}")
    check_positive(target_value, f"{field}.target_value")
    _check_cooldown(cooldowns[0], f"{field}.scale_in_cooldown")
    _check_cooldown(cooldowns[1], f"{field}.scale_out_cooldown")
    role = iam.Role.from_role_arn(
        scope, "ServiceLinkedRole",
        _SERVICE_LINKED_ROLE.format(partition=Aws.PARTITION, account=Aws.ACCOUNT_ID), mutable=False,
    )
    target = appscaling.ScalableTarget(
        scope, "Target", service_namespace=appscaling.ServiceNamespace.SAGEMAKER, resource_id=resource_id,
        scalable_dimension=dimension, min_capacity=min_capacity, max_capacity=high, role=role,
    )
    policy = target.scale_to_track_metric(
        "TargetTracking", target_value=float(target_value), predefined_metric=metric,
        scale_in_cooldown=cooldowns[0], scale_out_cooldown=cooldowns[1],
    )
    return target, policy


class ComponentAutoscaling(Construct):
    """Scale an inference component's copies between ``min_copies`` and ``max_copies``, from zero too.

    Target tracking follows concurrent requests per copy (high resolution). It cannot scale out from zero
    copies - with no copy there is no per-copy metric - so a step policy adds a copy when
    ``NoCapacityInvocationFailures`` counts one failed request in a minute: the alarm is ``>= 1``, since a
    ``> 1`` alarm never fires for the single request a sleeping Dev endpoint gets. The step policy's
    ``wake_up_cooldown`` (default 10 minutes, about how long an LLM copy takes to start) keeps one burst of
    failures from adding a copy a minute while the first one is still loading.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        component_name: str,
        min_copies: int = 1,
        max_copies: int = 2,
        allow_zero: bool = True,
        target_concurrent_requests_per_copy: float = 16.0,
        scale_in_cooldown: Duration = Duration.minutes(15),
        scale_out_cooldown: Duration = Duration.minutes(2),
        wake_up_cooldown: Duration = Duration.minutes(10),
    ) -> None:
        super().__init__(scope, id)
        if not allow_zero:
            check_floor_above_zero(min_copies, "scaling.min_copies")
        _check_cooldown(wake_up_cooldown, "scaling.wake_up_cooldown")
        self.min_copies, self.max_copies = min_copies, max_copies
        self.scalable_target, self.policy = _target_tracking(
            self, field="scaling", resource_id=f"inference-component/{component_name}",
            dimension="sagemaker:inference-component:DesiredCopyCount", low=(min_copies, 0), high=max_copies,
            metric=appscaling.PredefinedMetric.SAGEMAKER_INFERENCE_COMPONENT_CONCURRENT_REQUESTS_PER_COPY_HIGH_RESOLUTION,
            target_value=target_concurrent_requests_per_copy, cooldowns=(scale_in_cooldown, scale_out_cooldown),
            bounds=("min_copies", "max_copies"))
        self.wake_up_policy: appscaling.StepScalingAction | None = None
        self.wake_up_alarm: cloudwatch.Alarm | None = None
        if min_copies == 0:
            self.wake_up_policy = appscaling.StepScalingAction(
                self, "WakeUp", scaling_target=self.scalable_target,
                adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY, cooldown=wake_up_cooldown,
                metric_aggregation_type=appscaling.MetricAggregationType.MAXIMUM,
            )
            self.wake_up_policy.add_adjustment(adjustment=1, lower_bound=0)
            self.wake_up_alarm = cloudwatch.Alarm(
                self, "NoCapacity", alarm_name=f"{component_name}-NoCapacityWakeUp",
                metric=cloudwatch.Metric(
                    namespace=INVOCATION_METRICS_NAMESPACE, metric_name="NoCapacityInvocationFailures",
                    dimensions_map={"InferenceComponentName": component_name}, statistic="Sum",
                    period=Duration.minutes(1)),
                threshold=1, comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                evaluation_periods=1, datapoints_to_alarm=1, treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description=f"{component_name}: a request found no copy to serve it; adds a copy (scale out "
                                  "from zero, which target tracking cannot do).",
            )
            self.wake_up_alarm.add_alarm_action(cloudwatch_actions.ApplicationScalingAction(self.wake_up_policy))
