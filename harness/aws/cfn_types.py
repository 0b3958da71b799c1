"""CloudFormation resource types that moto's CloudFormation skips, backed by moto's own service backends.

moto 5.2.5 knows these services (Application Auto Scaling, CloudWatch alarms, CloudWatch Logs metric and
subscription filters, Firehose) but has no CloudFormation model for them: a stack holding them reports CREATE_COMPLETE while the
resources never exist. Each class below turns the template's properties into the same backend call the
service API would make, so `describe_*` sees what the stack created and stack deletion removes it.
SageMaker inference components, which moto lacks altogether, are backed by our own store
(inference_components.py), which also answers the service API for them.

Why the classes look the way they do (see NOTES.md):
- moto finds types through ``CloudFormationModel.__subclasses__()``: only DIRECT subclasses count, so
  what the models share lives in a plain mixin (``_ExtensionType``), not in a common CloudFormationModel base.
- moto's model metaclass files every class under ``cls.__module__.split(".")[1]``: the module must have a
  dotted name (a package module), never ``__main__`` or a top-level script.
- ``delete(account_id, region_name)`` on the instance is what moto's stack deletion calls first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from moto.applicationautoscaling.models import applicationautoscaling_backends
from moto.cloudwatch.models import Dimension, Metric, MetricDataQuery, MetricStat, cloudwatch_backends
from moto.core.common_models import CloudFormationModel
from moto.logs.models import logs_backends
from moto.sns.models import sns_backends

from harness.aws.inference_components import inference_component_backends, name_from_arn


def _props(cloudformation_json: dict[str, Any]) -> dict[str, Any]:
    return cloudformation_json.get("Properties") or {}


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


class _ExtensionType:
    """What every model below shares: its type and name property, the GetAtt it answers, update by replacement.

    Deliberately NOT a CloudFormationModel: moto maps only DIRECT subclasses of CloudFormationModel, so a
    shared base deriving from it would hide every model behind it. Each model names this mixin first (so its
    methods win over CloudFormationModel's abstract ones) and CloudFormationModel itself as its second base.
    """

    CFN_TYPE: ClassVar[str]
    NAME_PROPERTY: ClassVar[str]  # "" for a type with no name property
    # Fn::GetAtt attribute -> the Python attribute holding its value; only these are valid in a template.
    GETATT: ClassVar[Mapping[str, str]]
    # The Python attribute holding what CloudFormation returns for Ref; a model whose Ref is composed of
    # several values overrides physical_resource_id instead.
    REF: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Fail at import, naming the class, rather than as a type moto silently skips or a half-parsed stack.
        super().__init_subclass__(**kwargs)
        if CloudFormationModel not in cls.__bases__:
            raise TypeError(f"{cls.__name__}: name CloudFormationModel as a direct base, or moto never maps it")
        missing = [n for n in ("CFN_TYPE", "NAME_PROPERTY", "GETATT") if not hasattr(cls, n)]
        if not hasattr(cls, "REF") and cls.physical_resource_id is _ExtensionType.physical_resource_id:
            missing.append("REF (or a physical_resource_id of its own)")
        if missing:
            raise TypeError(f"{cls.__name__}: missing {', '.join(missing)}")

    @property
    def physical_resource_id(self) -> str:
        return getattr(self, self.REF)

    @classmethod
    def cloudformation_type(cls) -> str:
        return cls.CFN_TYPE

    @classmethod
    def cloudformation_name_type(cls) -> str:
        return cls.NAME_PROPERTY

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in cls.GETATT

    def get_cfn_attribute(self, attribute_name: str) -> str:
        from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

        if attribute_name in self.GETATT:
            return getattr(self, self.GETATT[attribute_name])
        raise UnformattedGetAttTemplateException()

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        pass  # unless a model says otherwise, moto deletes through the instance (its delete), which knows its ids

    @classmethod
    def update_from_cloudformation_json(
        cls, original_resource: Any, new_resource_name: str, cloudformation_json: dict[str, Any],
        account_id: str, region_name: str,
    ) -> Self:
        # An update is a replacement: remove the old resource, then create it from the new template.
        original_resource.delete(account_id, region_name)
        return cls.create_from_cloudformation_json(  # type: ignore[attr-defined]
            new_resource_name, cloudformation_json, account_id, region_name)


class ScalableTarget(_ExtensionType, CloudFormationModel):
    """AWS::ApplicationAutoScaling::ScalableTarget -> RegisterScalableTarget."""

    CFN_TYPE = "AWS::ApplicationAutoScaling::ScalableTarget"
    NAME_PROPERTY = ""  # no name property: the target is keyed by namespace, resource id and dimension
    GETATT = {"Id": "physical_resource_id"}

    def __init__(self, *, account_id: str, region_name: str, namespace: str, resource_id: str, dimension: str) -> None:
        self.account_id = account_id
        self.region_name = region_name
        self.namespace = namespace
        self.resource_id = resource_id
        self.dimension = dimension

    @property
    def physical_resource_id(self) -> str:
        # What CloudFormation returns for Ref: "resource-id|scalable-dimension|service-namespace".
        return f"{self.resource_id}|{self.dimension}|{self.namespace}"

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "ScalableTarget":
        props = _props(cloudformation_json)
        backend = applicationautoscaling_backends[account_id][region_name]
        suspended = props.get("SuspendedState") or {}
        backend.register_scalable_target(
            namespace=props["ServiceNamespace"],
            r_id=props["ResourceId"],
            dimension=props["ScalableDimension"],
            min_capacity=_int_or_none(props.get("MinCapacity")),
            max_capacity=_int_or_none(props.get("MaxCapacity")),
            role_arn=props.get("RoleARN", ""),
            suspended_state=suspended,
        )
        return cls(
            account_id=account_id, region_name=region_name, namespace=props["ServiceNamespace"],
            resource_id=props["ResourceId"], dimension=props["ScalableDimension"],
        )

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        resource_id, dimension, namespace = resource_name.split("|")
        cls(account_id=account_id, region_name=region_name, namespace=namespace, resource_id=resource_id,
            dimension=dimension).delete(account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        backend = applicationautoscaling_backends[account_id][region_name]
        if backend._scalable_target_exists(self.resource_id, self.dimension):
            backend.deregister_scalable_target(self.namespace, self.resource_id, self.dimension)


class ScalingPolicy(_ExtensionType, CloudFormationModel):
    """AWS::ApplicationAutoScaling::ScalingPolicy -> PutScalingPolicy (target tracking or step)."""

    CFN_TYPE = "AWS::ApplicationAutoScaling::ScalingPolicy"
    NAME_PROPERTY = "PolicyName"
    GETATT = {"Arn": "arn"}
    REF = "arn"  # Ref of a scaling policy is its ARN

    def __init__(self, *, policy_name: str, namespace: str, resource_id: str, dimension: str, arn: str) -> None:
        self.policy_name = policy_name
        self.namespace = namespace
        self.resource_id = resource_id
        self.dimension = dimension
        self.arn = arn

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "ScalingPolicy":
        props = _props(cloudformation_json)
        if props.get("ScalingTargetId"):
            # Either the target's Ref ("resource|dimension|namespace") or the three properties spelled out.
            resource_id, dimension, namespace = str(props["ScalingTargetId"]).split("|")
        else:
            resource_id, dimension, namespace = props["ResourceId"], props["ScalableDimension"], props["ServiceNamespace"]
        policy_type = props.get("PolicyType")
        body = props.get("TargetTrackingScalingPolicyConfiguration") or props.get("StepScalingPolicyConfiguration") or {}
        backend = applicationautoscaling_backends[account_id][region_name]
        if not backend._scalable_target_exists(resource_id, dimension):
            # The real service refuses a policy on an unregistered target; so do we (it catches a
            # missing DependsOn or a wrong ScalingTargetId in the template).
            raise ValueError(f"ScalingPolicy {resource_name}: no scalable target {resource_id} / {dimension}")
        policy = backend.put_scaling_policy(
            policy_name=resource_name, service_namespace=namespace, resource_id=resource_id,
            scalable_dimension=dimension, policy_body=body, policy_type=policy_type,
        )
        return cls(policy_name=resource_name, namespace=namespace, resource_id=resource_id, dimension=dimension,
                   arn=policy.policy_arn)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        backend = applicationautoscaling_backends[account_id][region_name]
        for policy in list(backend.policies.values()):
            if policy.policy_arn == resource_name:
                backend.delete_scaling_policy(policy.policy_name, policy.service_namespace, policy.resource_id,
                                              policy.scalable_dimension)

    def delete(self, account_id: str, region_name: str) -> None:
        backend = applicationautoscaling_backends[account_id][region_name]
        try:
            backend.delete_scaling_policy(self.policy_name, self.namespace, self.resource_id, self.dimension)
        except Exception:  # already gone (e.g. the target was deregistered first): nothing left to remove
            pass


def _metric_queries(metrics: list[dict[str, Any]] | None) -> list[MetricDataQuery] | None:
    if not metrics:
        return None
    queries = []
    for m in metrics:
        stat = m.get("MetricStat")
        metric_stat = None
        if stat:
            metric = stat.get("Metric") or {}
            metric_stat = MetricStat(
                metric=Metric(
                    metric_name=metric.get("MetricName"), namespace=metric.get("Namespace"),
                    dimensions=[Dimension(d["Name"], d["Value"]) for d in metric.get("Dimensions") or []],
                ),
                period=stat.get("Period"), stat=stat.get("Stat"), unit=stat.get("Unit"),
            )
        queries.append(MetricDataQuery(
            query_id=m.get("Id"), label=m.get("Label"), period=m.get("Period"),
            return_data=m.get("ReturnData"), expression=m.get("Expression"), metric_stat=metric_stat,
        ))
    return queries


class MetricAlarm(_ExtensionType, CloudFormationModel):
    """AWS::CloudWatch::Alarm -> PutMetricAlarm (single metric or metric math; PromQL recorded, see below)."""

    CFN_TYPE = "AWS::CloudWatch::Alarm"
    NAME_PROPERTY = "AlarmName"
    GETATT = {"Arn": "arn"}
    REF = "name"  # Ref of an alarm is its name

    def __init__(self, *, name: str, arn: str) -> None:
        self.name = name
        self.arn = arn

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "MetricAlarm":
        p = _props(cloudformation_json)
        promql = (p.get("EvaluationCriteria") or {}).get("PromQLCriteria")
        if promql is not None:
            # moto has no model of a PromQL alarm (EvaluationCriteria, EvaluationInterval): record it as an alarm
            # with its name, description and actions, so describe_alarms finds it; the query rides on the object.
            alarm = cloudwatch_backends[account_id][region_name].put_metric_alarm(
                name=resource_name, namespace=None, metric_name=None, comparison_operator="GreaterThanThreshold",
                evaluation_periods=1, period=_int_or_none(p.get("EvaluationInterval")), threshold=None,
                statistic=None, description=p.get("AlarmDescription", ""), dimensions=[],
                alarm_actions=p.get("AlarmActions") or [], ok_actions=p.get("OKActions") or [],
                actions_enabled=str(p.get("ActionsEnabled", True)).lower() != "false", tags=p.get("Tags"))
            alarm.promql_criteria = promql
            return cls(name=resource_name, arn=alarm.alarm_arn)
        alarm = cloudwatch_backends[account_id][region_name].put_metric_alarm(
            name=resource_name,
            namespace=p.get("Namespace"),
            metric_name=p.get("MetricName"),
            comparison_operator=p["ComparisonOperator"],
            evaluation_periods=int(p["EvaluationPeriods"]),
            period=_int_or_none(p.get("Period")),
            threshold=float(p["Threshold"]) if p.get("Threshold") is not None else None,
            statistic=p.get("Statistic"),
            description=p.get("AlarmDescription", ""),
            dimensions=p.get("Dimensions") or [],
            alarm_actions=p.get("AlarmActions") or [],
            metric_data_queries=_metric_queries(p.get("Metrics")),
            datapoints_to_alarm=_int_or_none(p.get("DatapointsToAlarm")),
            extended_statistic=p.get("ExtendedStatistic"),
            ok_actions=p.get("OKActions") or [],
            insufficient_data_actions=p.get("InsufficientDataActions") or [],
            unit=p.get("Unit"),
            actions_enabled=str(p.get("ActionsEnabled", True)).lower() != "false",
            treat_missing_data=p.get("TreatMissingData"),
            evaluate_low_sample_count_percentile=p.get("EvaluateLowSampleCountPercentile"),
            threshold_metric_id=p.get("ThresholdMetricId"),
            tags=p.get("Tags"),
        )
        return cls(name=resource_name, arn=alarm.alarm_arn)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        cloudwatch_backends[account_id][region_name].delete_alarms([resource_name])

    def delete(self, account_id: str, region_name: str) -> None:
        cloudwatch_backends[account_id][region_name].delete_alarms([self.name])


# CloudFormation spells the transformation keys in PascalCase; the Logs API (and moto's store) in camelCase.
_TRANSFORMATION_KEYS = {
    "MetricName": "metricName", "MetricNamespace": "metricNamespace", "MetricValue": "metricValue",
    "DefaultValue": "defaultValue", "Unit": "unit", "Dimensions": "dimensions",
}


class _OnLogGroup:
    """A filter of one log group: its name and its group's (a mixin, for the reason _ExtensionType is one)."""

    def __init__(self, *, name: str, log_group_name: str) -> None:
        self.name = name
        self.log_group_name = log_group_name


class LogMetricFilter(_OnLogGroup, _ExtensionType, CloudFormationModel):
    """AWS::Logs::MetricFilter -> PutMetricFilter on an existing log group."""

    CFN_TYPE = "AWS::Logs::MetricFilter"
    NAME_PROPERTY = "FilterName"
    GETATT: ClassVar[Mapping[str, str]] = {}  # a metric filter has no GetAtt attributes
    REF = "name"  # Ref of a metric filter is its name

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "LogMetricFilter":
        p = _props(cloudformation_json)
        backend = logs_backends[account_id][region_name]
        group = p["LogGroupName"]
        if group not in backend.groups:
            # The real service answers ResourceNotFoundException: a filter needs its group first.
            raise ValueError(f"MetricFilter {resource_name}: log group {group!r} does not exist")
        transformations = []
        for t in p.get("MetricTransformations") or []:
            item = {_TRANSFORMATION_KEYS.get(k, k): v for k, v in t.items()}
            if "dimensions" in item and isinstance(item["dimensions"], list):
                item["dimensions"] = {d["Key"]: d["Value"] for d in item["dimensions"]}
            transformations.append(item)
        backend.put_metric_filter(resource_name, p.get("FilterPattern", ""), group, transformations)
        return cls(name=resource_name, log_group_name=group)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        group = _props(cloudformation_json).get("LogGroupName")
        logs_backends[account_id][region_name].delete_metric_filter(resource_name, group)

    def delete(self, account_id: str, region_name: str) -> None:
        logs_backends[account_id][region_name].delete_metric_filter(self.name, self.log_group_name)


class LogSubscriptionFilter(_OnLogGroup, _ExtensionType, CloudFormationModel):
    """AWS::Logs::SubscriptionFilter -> PutSubscriptionFilter on an existing log group (moto then sends the
    group's new events to the destination, gzipped as CloudWatch Logs does; it does not apply a JSON pattern)."""

    CFN_TYPE = "AWS::Logs::SubscriptionFilter"
    NAME_PROPERTY = "FilterName"
    GETATT: ClassVar[Mapping[str, str]] = {}
    REF = "name"

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "LogSubscriptionFilter":
        p = _props(cloudformation_json)
        group = p["LogGroupName"]
        # ResourceNotFound for an unknown group, as the service answers; the destination must exist too.
        logs_backends[account_id][region_name].put_subscription_filter(
            group, resource_name, p.get("FilterPattern", ""), p["DestinationArn"], p.get("RoleArn", ""))
        return cls(name=resource_name, log_group_name=group)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        cls(name=resource_name, log_group_name=_props(cloudformation_json)["LogGroupName"]).delete(
            account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        group = logs_backends[account_id][region_name].groups.get(self.log_group_name)
        if group is not None:  # the group may be gone already
            group.subscription_filters.pop(self.name, None)


class DeliveryStream(_ExtensionType, CloudFormationModel):
    """AWS::KinesisFirehose::DeliveryStream (an S3 destination) -> CreateDeliveryStream on moto's Firehose, which
    writes what it is sent to the bucket as it arrives: no buffering, and none of the stream's processors run."""

    CFN_TYPE = "AWS::KinesisFirehose::DeliveryStream"
    NAME_PROPERTY = "DeliveryStreamName"
    GETATT = {"Arn": "arn"}
    REF = "name"

    def __init__(self, *, name: str, arn: str) -> None:
        self.name, self.arn = name, arn

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "DeliveryStream":
        from moto.firehose.models import firehose_backends

        p = _props(cloudformation_json)
        name = p.get("DeliveryStreamName") or resource_name
        arn = firehose_backends[account_id][region_name].create_delivery_stream(
            region_name, name, p.get("DeliveryStreamType", "DirectPut"), {},
            p.get("DeliveryStreamEncryptionConfigurationInput") or {}, {},
            p["ExtendedS3DestinationConfiguration"], {}, {}, {}, {}, {}, {}, p.get("Tags") or [])
        return cls(name=name, arn=arn)

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.firehose.models import firehose_backends

        backend = firehose_backends[account_id][region_name]
        if self.name in backend.delivery_streams:
            backend.delete_delivery_stream(self.name)


class TopicPolicy(_ExtensionType, CloudFormationModel):
    """AWS::SNS::TopicPolicy -> SetTopicAttributes(Policy) on each topic; deletion restores the default."""

    CFN_TYPE = "AWS::SNS::TopicPolicy"
    NAME_PROPERTY = ""
    GETATT = {"Id": "name"}
    REF = "name"

    def __init__(self, *, name: str, topic_arns: list[str], region_name: str) -> None:
        self.name = name
        self.topic_arns = topic_arns
        self.region_name = region_name

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "TopicPolicy":
        import json

        p = _props(cloudformation_json)
        document = p["PolicyDocument"]
        topics = list(p.get("Topics") or [])
        backend = sns_backends[account_id][region_name]
        for arn in topics:
            backend.get_topic(arn).policy = json.dumps(document)  # raises NotFound for an unknown topic
        return cls(name=resource_name, topic_arns=topics, region_name=region_name)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        topics = list(_props(cloudformation_json).get("Topics") or [])
        cls(name=resource_name, topic_arns=topics, region_name=region_name).delete(account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        backend = sns_backends[account_id][region_name]
        for arn in self.topic_arns:
            topic = backend.topics.get(arn)
            if topic is not None:  # the topic may be gone already
                topic._policy_json = topic._create_default_topic_policy(region_name, account_id, topic.name)


class TopicSubscription(_ExtensionType, CloudFormationModel):
    """AWS::SNS::Subscription -> Subscribe; deletion unsubscribes. (moto subscribes only the Subscription list
    inside an AWS::SNS::Topic; a subscription resource of its own is skipped, reporting CREATE_COMPLETE.)"""

    CFN_TYPE = "AWS::SNS::Subscription"
    NAME_PROPERTY = ""
    GETATT = {"Arn": "arn"}
    REF = "arn"

    def __init__(self, *, arn: str) -> None:
        self.arn = arn

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "TopicSubscription":
        p = _props(cloudformation_json)
        backend = sns_backends[account_id][region_name]
        subscription = backend.subscribe(p["TopicArn"], p["Endpoint"], p["Protocol"])  # NotFound for an unknown topic
        return cls(arn=subscription.arn)

    def delete(self, account_id: str, region_name: str) -> None:
        backend = sns_backends[account_id][region_name]
        if self.arn in backend.subscriptions:
            backend.unsubscribe(self.arn)


class InferenceComponent(_ExtensionType, CloudFormationModel):
    """AWS::SageMaker::InferenceComponent -> CreateInferenceComponent on our store (moto has none).

    The store refuses what the service refuses (unknown endpoint, variant or model, a variant serving a
    model): the stack fails with that message. Ref is the ARN, the type's primary identifier.
    """

    CFN_TYPE = "AWS::SageMaker::InferenceComponent"
    NAME_PROPERTY = "InferenceComponentName"
    GETATT = {"InferenceComponentArn": "arn", "InferenceComponentName": "name", "InferenceComponentStatus": "status",
              "EndpointArn": "endpoint_arn", "CreationTime": "creation_time", "LastModifiedTime": "last_modified_time",
              "FailureReason": "failure_reason"}
    REF = "arn"

    def __init__(self, *, name: str, arn: str, endpoint_arn: str, status: str, creation_time: str,
                 last_modified_time: str) -> None:
        self.name = name
        self.arn = arn
        self.endpoint_arn = endpoint_arn
        self.status = status
        self.creation_time = creation_time
        self.last_modified_time = last_modified_time
        self.failure_reason = ""  # only a failed component has one, and a failed one fails the stack here

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> "InferenceComponent":
        p = _props(cloudformation_json)
        if not p.get("EndpointName"):
            raise ValueError(f"InferenceComponent {resource_name}: EndpointName is required")
        component = inference_component_backends[account_id][region_name].create(
            name=resource_name, endpoint_name=p["EndpointName"], variant_name=p.get("VariantName"),
            specification=p.get("Specification"), specifications=p.get("Specifications"),
            runtime_config=p.get("RuntimeConfig"), deployment_config=p.get("DeploymentConfig"), tags=p.get("Tags"))
        return cls(name=component.name, arn=component.arn, endpoint_arn=component.endpoint_arn, status=component.status,
                   creation_time=component.creation_time.isoformat(),
                   last_modified_time=component.last_modified_time.isoformat())

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        store = inference_component_backends[account_id][region_name]
        if name_from_arn(resource_name) in store.components:  # resource_name is the physical id: the ARN
            store.delete(name_from_arn(resource_name))

    def delete(self, account_id: str, region_name: str) -> None:
        store = inference_component_backends[account_id][region_name]
        if self.name in store.components:
            store.delete(self.name)


EXTENSION_TYPES: tuple[type[CloudFormationModel], ...] = (
    ScalableTarget, ScalingPolicy, MetricAlarm, LogMetricFilter, TopicPolicy, TopicSubscription, InferenceComponent)
