"""The composite most users take: model + endpoint config + endpoint + autoscaling + monitoring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from peagle_contract.serving import ServingConfig

from peagle_constructs.autoscaling import EndpointAutoscaling, ScalingMetric
from peagle_constructs.deployment import DeploymentPolicy
from peagle_constructs.endpoint import PEagleInferenceEndpoint, endpoint_name_for
from peagle_constructs.endpoint_config import (
    DEFAULT_INFERENCE_AMI_VERSION, DEFAULT_MODEL_DATA_DOWNLOAD_TIMEOUT, DEFAULT_STARTUP_HEALTH_CHECK_TIMEOUT,
    DEFAULT_VARIANT_NAME, PEagleEndpointConfig,
)
from peagle_constructs.errors import ConfigError
from peagle_constructs.image import ContainerImage
from peagle_constructs.instance_types import InstanceType
from peagle_constructs.model import PEagleModel
from peagle_constructs.monitoring import AlarmThresholds, EndpointMonitoring
from peagle_constructs.native_metrics import DetailedObservability
from peagle_constructs.notifications import AlarmSubscriber
from peagle_constructs.presets import ModelPreset
from peagle_constructs.security import limit_grants_to_aws_services


@dataclass(frozen=True, kw_only=True)
class AutoscalingOptions:
    """Instance-count autoscaling; ``min_capacity`` / ``max_capacity`` default to the fleet and twice it."""

    min_capacity: int | None = None
    max_capacity: int | None = None
    metric: ScalingMetric = ScalingMetric.CONCURRENT_REQUESTS
    target_value: float = 16.0
    scale_in_cooldown: Duration = Duration.minutes(15)
    scale_out_cooldown: Duration = Duration.minutes(2)


class PEagleEndpoint(Construct):
    """A P-EAGLE vLLM endpoint on SageMaker with the defaults LLM serving needs.

    - network isolation on (weights from S3 prefixes), least-privilege execution role;
    - LLM-sized startup/download timeouts, least-outstanding-requests routing;
    - one KMS key (rotation on) for the volume (EBS-backed families only), log group and alarm topic;
    - deployments (blue/green, or rolling) rolled back by the TTFT, TPOT, error-rate and acceptance alarms;
    - alarm notifications to ``alarm_subscribers`` (email, HTTPS, existing topics);
    - SageMaker's detailed observability on, with PromQL alarms on vLLM's own metrics;
    - target tracking on concurrent requests, long scale-in cooldown;
    - a dashboard with TTFT/TPOT percentiles, acceptance length, traffic, errors and GPU use.

    ``instance_count`` is the fleet at creation: the endpoint keeps the count autoscaling sets across updates
    (RetainAllVariantProperties), so to resize a running endpoint change the autoscaling bounds.

    ``preset`` (peagle_constructs.presets): the model family this serves; synth then refuses a K above the
    head's trained K, an instance the preset does not list and a config whose memory does not fit.

    The endpoint gets a deterministic name (``endpoint_name``, or ``<stack name>-<id>``) because its log
    group ``/aws/sagemaker/Endpoints/<name>`` must exist, encrypted, before SageMaker writes to it.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        serving: ServingConfig,
        image: ContainerImage,
        instance_type: str,
        instance_count: int = 1,
        network_isolation: bool = True,
        endpoint_name: str | None = None,
        autoscaling: AutoscalingOptions | None = AutoscalingOptions(),
        deployment: DeploymentPolicy | None = None,
        monitoring: AlarmThresholds = AlarmThresholds(),
        alarm_subscribers: Sequence[AlarmSubscriber] = (),
        detailed_observability: DetailedObservability = DetailedObservability(),
        encrypt_volume: bool | None = None,
        volume_size_gb: int | None = None,
        container_startup_health_check_timeout: Duration = DEFAULT_STARTUP_HEALTH_CHECK_TIMEOUT,
        model_data_download_timeout: Duration = DEFAULT_MODEL_DATA_DOWNLOAD_TIMEOUT,
        inference_ami_version: str = DEFAULT_INFERENCE_AMI_VERSION,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_YEAR,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        weights_key: kms.IKey | None = None,
        environment: Mapping[str, str] | None = None,
        preset: ModelPreset | None = None,
    ) -> None:
        super().__init__(scope, id)
        parsed = InstanceType.of(instance_type)
        if preset is not None:  # the head's trained K, the instances it fits, the memory arithmetic
            preset.check(serving, instance_type=instance_type)
        if encrypt_volume is None:
            encrypt_volume = not parsed.local_nvme
        self.endpoint_name = endpoint_name_for(self, id, endpoint_name)
        self.variant_name = DEFAULT_VARIANT_NAME
        scaling = self._scaling_bounds(autoscaling, instance_count)

        self.key = limit_grants_to_aws_services(kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=removal_policy,
            description=f"P-EAGLE endpoint {self.endpoint_name}: storage volume, logs and alarm topic",
        ))
        self.monitoring = EndpointMonitoring(
            self, "Monitoring",
            endpoint_name=self.endpoint_name, variant_name=self.variant_name,
            num_speculative_tokens=serving.num_speculative_tokens, encryption_key=self.key,
            log_retention=log_retention, removal_policy=removal_policy, thresholds=monitoring,
            subscribers=alarm_subscribers, native_alarms=detailed_observability.enabled,
        )
        self.model = PEagleModel(
            self, "Model", serving=serving, image=image, network_isolation=network_isolation,
            log_group=self.monitoring.log_group, weights_key=weights_key, environment=environment,
        )
        self.endpoint_config = PEagleEndpointConfig(
            self, "EndpointConfig", model=self.model, instance_type=instance_type, instance_count=instance_count,
            variant_name=self.variant_name,
            container_startup_health_check_timeout=container_startup_health_check_timeout,
            model_data_download_timeout=model_data_download_timeout, inference_ami_version=inference_ami_version,
            encryption_key=self.key if encrypt_volume else None, volume_size_gb=volume_size_gb,
            detailed_observability=detailed_observability,
        )
        self.endpoint = PEagleInferenceEndpoint(
            self, "Endpoint", endpoint_config=self.endpoint_config, endpoint_name=self.endpoint_name,
            deployment=deployment, rollback_alarms=self.monitoring.rollback_alarms,
        )
        # SageMaker creates the log group itself if it writes first; ours must already be there.
        self.endpoint.cfn_endpoint.node.add_dependency(self.monitoring.log_group)

        self.autoscaling: EndpointAutoscaling | None = None
        if scaling is not None:
            self.autoscaling = EndpointAutoscaling(
                self, "Autoscaling", endpoint_name=self.endpoint_name, variant_name=self.variant_name, **scaling,
            )
            self.autoscaling.scalable_target.node.add_dependency(self.endpoint.cfn_endpoint)

    # -- construction helpers -----------------------------------------------------------------------
    @staticmethod
    def _scaling_bounds(options: AutoscalingOptions | None, instance_count: int) -> dict | None:
        if options is None:
            return None
        low = options.min_capacity if options.min_capacity is not None else instance_count
        high = options.max_capacity if options.max_capacity is not None else max(low, 2 * instance_count)
        if isinstance(low, int) and isinstance(high, int) and low <= high and not low <= instance_count <= high:
            raise ConfigError("instance_count", f"got {instance_count}; allowed: within autoscaling "
                              f"min_capacity..max_capacity ({low}..{high})")
        return dict(min_capacity=low, max_capacity=high, metric=options.metric, target_value=options.target_value,
                    scale_in_cooldown=options.scale_in_cooldown, scale_out_cooldown=options.scale_out_cooldown)

    # -- attributes ---------------------------------------------------------------------------------
    @property
    def cfn_model(self):  # noqa: ANN201
        return self.model.cfn_model

    @property
    def cfn_endpoint_config(self):  # noqa: ANN201
        return self.endpoint_config.cfn_endpoint_config

    @property
    def cfn_endpoint(self):  # noqa: ANN201
        return self.endpoint.cfn_endpoint

    @property
    def role(self) -> iam.IRole:
        return self.model.role

    @property
    def log_group(self) -> logs.LogGroup:
        return self.monitoring.log_group

    @property
    def alarms(self) -> Mapping[str, cloudwatch.IAlarm]:
        return self.monitoring.alarms

    @property
    def dashboard(self) -> cloudwatch.Dashboard:
        return self.monitoring.dashboard

    @property
    def topic(self):  # noqa: ANN201
        return self.monitoring.topic

    @property
    def endpoint_arn(self) -> str:
        return self.endpoint.endpoint_arn

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` call InvokeEndpoint and InvokeEndpointWithResponseStream on this endpoint only."""
        return self.endpoint.grant_invoke(grantee)

    # -- metrics ------------------------------------------------------------------------------------
    def metric_ttft(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_ttft(**kwargs)

    def metric_tpot(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_tpot(**kwargs)

    def metric_end_to_end_latency(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_end_to_end_latency(**kwargs)

    def metric_acceptance_length(self, **kwargs) -> cloudwatch.MathExpression:  # noqa: ANN003
        return self.monitoring.metric_acceptance_length(**kwargs)

    def metric_acceptance_rate(self, **kwargs) -> cloudwatch.MathExpression:  # noqa: ANN003
        return self.monitoring.metric_acceptance_rate(**kwargs)

    def metric_model_latency(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_model_latency(**kwargs)

    def metric_invocations(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_invocations(**kwargs)

    def metric_invocation_5xx_errors(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_invocation_5xx_errors(**kwargs)

    def metric_invocation_model_errors(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_invocation_model_errors(**kwargs)

    def metric_concurrent_requests(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_concurrent_requests(**kwargs)

    def metric_gpu_utilization(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_gpu_utilization(**kwargs)

    def metric_gpu_memory_utilization(self, **kwargs) -> cloudwatch.Metric:  # noqa: ANN003
        return self.monitoring.metric_gpu_memory_utilization(**kwargs)
