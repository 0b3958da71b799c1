"""PEagleEndpoint, the composite most users take: one model on a fleet of its own, with all it needs.

Model + endpoint config + endpoint + autoscaling + monitoring, with the defaults LLM serving needs. Its pieces
are usable alone: :mod:`~peagle_constructs.model`, :mod:`~peagle_constructs.endpoint_config`, the bare endpoint
(:mod:`~peagle_constructs.inference_endpoint`), :mod:`~peagle_constructs.autoscaling` and
:mod:`~peagle_constructs.monitoring`. Models that share a fleet as inference components:
:mod:`peagle_constructs.components`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from peagle_constructs.autoscaling import EndpointAutoscaling, ScalingMetric
from peagle_constructs.deployment import DeploymentPolicy
from peagle_constructs.endpoint_base import EndpointBase
from peagle_constructs.endpoint_config import PEagleEndpointConfig
from peagle_constructs.endpoint_names import endpoint_name_for
from peagle_constructs.errors import ConfigError
from peagle_constructs.image import ContainerImage
from peagle_constructs.inference_endpoint import PEagleInferenceEndpoint
from peagle_constructs.model import PEagleModel
from peagle_constructs.monitoring import EndpointMonitoring
from peagle_constructs.props import FleetProps, ModelProps
from peagle_constructs.sagemaker_names import DEFAULT_VARIANT_NAME
from peagle_constructs.security import limit_grants_to_aws_services
from peagle_constructs.validation import check_type


@dataclass(frozen=True, kw_only=True)
class AutoscalingOptions:
    """Instance-count autoscaling; ``min_capacity`` / ``max_capacity`` default to the fleet and twice it."""

    min_capacity: int | None = None
    max_capacity: int | None = None
    metric: ScalingMetric = ScalingMetric.CONCURRENT_REQUESTS
    target_value: float = 16.0
    scale_in_cooldown: Duration = Duration.minutes(15)
    scale_out_cooldown: Duration = Duration.minutes(2)


class PEagleEndpoint(EndpointBase):
    """A P-EAGLE vLLM endpoint on SageMaker with the defaults LLM serving needs.

    - network isolation on (weights from S3 prefixes), least-privilege execution role;
    - LLM-sized startup/download timeouts, least-outstanding-requests routing;
    - one KMS key (rotation on) for the volume (EBS-backed families only), log group and alarm topic;
    - deployments (blue/green, or rolling) rolled back by the 5xx-rate and engine-clock TPOT alarms, the signals no
      client moves at will; TTFT, model errors and acceptance page (peagle_constructs.rollback_signals);
    - alarm notifications to ``model.alarm_subscribers`` (email, HTTPS, existing topics);
    - SageMaker's detailed observability on, with PromQL alarms on vLLM's own metrics;
    - target tracking on concurrent requests, long scale-in cooldown (``scaling``; None: a fixed fleet);
    - a dashboard with TTFT/TPOT percentiles, acceptance length, traffic, errors and GPU use.

    ``model`` is what is served and how it is watched, ``fleet`` what serves it (:mod:`peagle_constructs.props`).
    ``fleet.instance_count`` is the fleet at creation: the endpoint keeps the count autoscaling sets across
    updates (RetainAllVariantProperties), so to resize a running endpoint change the autoscaling bounds.
    The request-line metrics, alarms and dashboard are ``endpoint.monitoring``'s.

    The endpoint gets a deterministic name (``endpoint_name``, or ``<stack name>-<id>``) because its log
    group ``/aws/sagemaker/Endpoints/<name>`` must exist, encrypted, before SageMaker writes to it.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        model: ModelProps,
        image: ContainerImage,
        fleet: FleetProps,
        endpoint_name: str | None = None,
        scaling: AutoscalingOptions | None = AutoscalingOptions(),
        deployment: DeploymentPolicy | None = None,
        weights_key: kms.IKey | None = None,
    ) -> None:
        check_type(model, "model", ModelProps, "a ModelProps")
        check_type(fleet, "fleet", FleetProps, "a FleetProps")
        fleet.validate()
        model.check_on_fleet(fleet)
        super().__init__(scope, id, endpoint_name=endpoint_name_for(scope, id, endpoint_name),
                         variant_name=DEFAULT_VARIANT_NAME)
        bounds = self._scaling_bounds(scaling, fleet.instance_count)

        self.key = limit_grants_to_aws_services(kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=fleet.removal_policy,
            description=f"P-EAGLE endpoint {self.endpoint_name}: storage volume, logs and alarm topic",
        ))
        self.monitoring = EndpointMonitoring(self, "Monitoring", endpoint_name=self.endpoint_name, model=model,
                                             fleet=fleet, variant_name=self.variant_name, encryption_key=self.key)
        self.model = PEagleModel(
            self, "Model", serving=model.serving, image=image, network_isolation=model.network_isolation,
            log_group=self.monitoring.log_group, weights_key=weights_key, environment=model.environment,
            weights_account=model.weights_account,
        )
        # A fallback pool with its own tensor parallelism serves a model of its own (the pool's model override).
        self.pool_models = {
            index: PEagleModel(
                self, f"Model{pool.instance_type.replace('.', ' ').title().replace(' ', '')}",
                serving=served.serving, image=image, network_isolation=model.network_isolation,
                log_group=self.monitoring.log_group, weights_key=weights_key, environment=model.environment,
                weights_account=model.weights_account)
            for index, pool in enumerate(fleet.fallback_instances) if (served := model.on_pool(pool)) is not model
        }
        self.endpoint_config = PEagleEndpointConfig.for_model(
            self, "EndpointConfig", model=self.model, fleet=fleet, variant_name=self.variant_name,
            encryption_key=self.key if fleet.volume_encrypted else None, pool_models=self.pool_models,
        )
        self.endpoint = PEagleInferenceEndpoint(
            self, "Endpoint", endpoint_config=self.endpoint_config, endpoint_name=self.endpoint_name,
            deployment=deployment, rollback_alarms=self.monitoring.rollback_alarms,
        )
        for served in (self.model, *self.pool_models.values()):
            self.endpoint.grant_rollback_reads(served.policy)
        # SageMaker creates the log group itself if it writes first; ours must already be there.
        self.endpoint.cfn_endpoint.node.add_dependency(self.monitoring.log_group)

        self.autoscaling: EndpointAutoscaling | None = None
        if bounds is not None:
            self.autoscaling = EndpointAutoscaling(
                self, "Autoscaling", endpoint_name=self.endpoint_name, variant_name=self.variant_name, **bounds,
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
    def cfn_model(self) -> sagemaker.CfnModel:
        return self.model.cfn_model

    @property
    def cfn_endpoint_config(self) -> sagemaker.CfnEndpointConfig:
        return self.endpoint_config.cfn_endpoint_config

    @property
    def cfn_endpoint(self) -> sagemaker.CfnEndpoint:
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

    def _metric_defaults(self) -> dict:
        # SageMaker's metrics of this endpoint at the period its alarms judge them (the request-line metrics,
        # TTFT, TPOT and acceptance, are its monitoring's: ``endpoint.monitoring.metric_ttft()``).
        return {"period": self.monitoring.alarm_thresholds.period}
