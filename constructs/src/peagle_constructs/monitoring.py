"""EndpointMonitoring: one endpoint's (or inference component's) log group, metrics, alarms, topic and dashboard.

It is built from the same props the endpoint is (:class:`~peagle_constructs.props.ModelProps`: K, the alarm
thresholds and who they tell; :class:`~peagle_constructs.props.FleetProps`: log retention, removal policy,
detailed observability) and puts together the modules that each hold one job: the log group
(:mod:`~peagle_constructs.log_groups`), the request-line metric filters (:mod:`~peagle_constructs.request_log_filters`),
the metrics (:mod:`~peagle_constructs.serving_metrics`), the alarms (:mod:`~peagle_constructs.alarms`, rollback
or page per :mod:`~peagle_constructs.rollback_signals`), the topic (:mod:`~peagle_constructs.notifications`) and
the dashboard (:mod:`~peagle_constructs.dashboard`); with capture on in the serving config, the records' way to
S3 (:mod:`~peagle_constructs.capture_delivery`).

Two metric paths. Ours works everywhere: metric filters generated from :mod:`peagle_contract.request_log`
(the schema the runtime writes). AWS's native one: SageMaker's detailed observability publishes vLLM's own
metrics, read by PromQL alarms (:mod:`peagle_constructs.native_metrics`).
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_kms as kms
from constructs import Construct

from peagle_contract import request_log
from peagle_contract.serving import ServingConfig

from peagle_constructs.alarms import metric_alarms, promql_alarms
from peagle_constructs.capture_delivery import CaptureDelivery
from peagle_constructs.dashboard import serving_dashboard
from peagle_constructs.log_groups import encrypted_log_group
from peagle_constructs.native_metrics import VllmMetricNames
from peagle_constructs.notifications import AlarmTopic
from peagle_constructs.props import FleetProps, ModelProps
from peagle_constructs.request_log_filters import metric_filters
from peagle_constructs.rollback_signals import ROLLBACK_SIGNALS
from peagle_constructs.sagemaker_names import DEFAULT_VARIANT_NAME, container_log_group
from peagle_constructs.security import limit_grants_to_aws_services
from peagle_constructs.serving_metrics import ServingMetrics
from peagle_constructs.validation import check_type


class EndpointMonitoring(ServingMetrics, Construct):
    """Observability for one endpoint variant - or, with ``component_name``, one inference component on it.

    ``model`` is what is served (its ``serving`` config's K, ``alarm_thresholds``, ``alarm_subscribers``) and
    ``fleet`` what serves it (``log_retention``, ``removal_policy``, ``detailed_observability``): the props the
    endpoint is built from, so a value keeps one name. Usable alone, for an endpoint deployed some other way::

        EndpointMonitoring(self, "Monitoring", endpoint_name="team-llm", model=ModelProps(serving=serving),
                           fleet=FleetProps(instance_type="ml.g6e.xlarge"))

    Creates the log group SageMaker writes container output to (``/aws/sagemaker/Endpoints/<name>``, for a
    component ``/aws/sagemaker/InferenceComponents/<component>``) with retention and KMS (``encryption_key``, or
    a key of its own), so its lifetime and encryption are ours rather than the service's defaults. Every alarm
    is named ``<endpoint or component name>-<what>`` and notifies the subscribers through :class:`AlarmTopic`.
    With detailed observability on, PromQL alarms on vLLM's metrics are added (they select the endpoint's
    series by its label, a component's by its own too; ``vllm_metrics`` names the series). ``namespace``: where
    the request lines' metrics go (default ``PEagle/Serving/<name>``).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint_name: str,
        model: ModelProps,
        fleet: FleetProps,
        variant_name: str = DEFAULT_VARIANT_NAME,
        component_name: str | None = None,
        encryption_key: kms.IKey | None = None,
        namespace: str | None = None,
        vllm_metrics: VllmMetricNames = VllmMetricNames(),
    ) -> None:
        super().__init__(scope, id)
        check_type(model, "model", ModelProps, "a ModelProps")
        # The contract checked K when the ServingConfig was made; this only makes sure it was one.
        check_type(model.serving, "model.serving", ServingConfig, "a peagle_contract ServingConfig")
        check_type(fleet, "fleet", FleetProps, "a FleetProps")
        model.alarm_thresholds.validate()
        self.endpoint_name, self.variant_name = endpoint_name, variant_name
        self.component_name = component_name
        # What is watched: its name keys the log group, the alarms and the request-line namespace.
        watched = component_name or endpoint_name
        what = f"inference component {component_name}" if component_name else f"SageMaker endpoint {endpoint_name}"
        self.num_speculative_tokens = model.serving.num_speculative_tokens
        self.alarm_thresholds = model.alarm_thresholds
        self.namespace = namespace or f"{request_log.DEFAULT_NAMESPACE}/{watched}"
        self.alarm_name_prefix = f"{watched}-"
        self.key = encryption_key or limit_grants_to_aws_services(kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=fleet.removal_policy,
            description=f"Encrypts the logs and alarm topic of {what}",
        ))

        self.log_group = encrypted_log_group(
            self, "LogGroup", container_log_group(endpoint_name, component_name), key=self.key,
            retention=fleet.log_retention, removal_policy=fleet.removal_policy)
        self.metric_filters = metric_filters(self, log_group=self.log_group, namespace=self.namespace)
        # With capture on, its records go on to S3 for training, under the same key and for as long as the logs.
        # The bucket outlives the stack whatever the fleet's removal policy: deleting a stack must not delete the
        # records (and CloudFormation cannot delete a bucket that holds any); they expire by the bucket's rule.
        capture = model.serving.capture
        days = self.log_group.node.default_child.retention_in_days
        self.capture = CaptureDelivery(
            self, "Capture", log_group=self.log_group, key=self.key, stage=capture.stage,
            expiration=Duration.days(days) if days else None, removal_policy=RemovalPolicy.RETAIN,
        ) if capture is not None else None
        self.notifications = AlarmTopic(self, "AlarmTopic", key=self.key, alarm_name_prefix=self.alarm_name_prefix,
                                        subscribers=model.alarm_subscribers, display_name=f"Alarms of {what}")
        self.topic = self.notifications.topic
        self.alarms: dict[str, cloudwatch.IAlarm] = dict(metric_alarms(
            self, metrics=self, thresholds=self.alarm_thresholds, alarm_name_prefix=self.alarm_name_prefix))
        if fleet.detailed_observability.enabled:  # PromQL reads what detailed observability publishes
            self.alarms.update(promql_alarms(
                self, vllm_metrics, thresholds=self.alarm_thresholds, alarm_name_prefix=self.alarm_name_prefix,
                endpoint_name=endpoint_name, component_name=component_name))
        for alarm in self.alarms.values():
            for target in self.notifications.targets:
                action = cloudwatch_actions.SnsAction(target)
                alarm.add_alarm_action(action)
                alarm.add_ok_action(action)
        self.dashboard = serving_dashboard(self, metrics=self, rollback_alarms=self.rollback_alarms,
                                           notification_alarms=self.notification_alarms)

    @property
    def rollback_alarms(self) -> tuple[cloudwatch.IAlarm, ...]:
        """The alarms a deployment rolls back on (metric alarms on signals a healthy fleet never trips)."""
        return tuple(alarm for id, alarm in self.alarms.items() if id in ROLLBACK_SIGNALS)

    @property
    def notification_alarms(self) -> tuple[cloudwatch.IAlarm, ...]:
        return tuple(alarm for id, alarm in self.alarms.items() if id not in ROLLBACK_SIGNALS)
