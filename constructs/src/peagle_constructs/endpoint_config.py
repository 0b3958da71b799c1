"""The SageMaker EndpointConfig: one GPU production variant with LLM-sized timeouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from peagle_constructs import security
from peagle_constructs.deployment import retain_when_replaced
from peagle_constructs.errors import ConfigError
from peagle_constructs.instance_types import InstanceType
from peagle_constructs.model import PEagleModel
from peagle_constructs.props import FleetProps
from peagle_constructs.sagemaker_names import DEFAULT_VARIANT_NAME
from peagle_constructs.validation import check_choice, check_duration, check_int, check_order, check_type

ROUTING_STRATEGIES = ("LEAST_OUTSTANDING_REQUESTS", "RANDOM")
SCALE_IN_STRATEGIES = ("IDLE_RELEASE", "CONSOLIDATION")  # ManagedInstanceScalingScaleInPolicy.Strategy


@dataclass(frozen=True, kw_only=True)
class ScaleIn:
    """How a fleet of inference components gives instances back (ManagedInstanceScaling.ScaleInPolicy).

    :meth:`idle_release`: an instance that holds no copy is released. :meth:`consolidation`: copies are moved
    onto fewer instances so that more are released, ``max_step`` instances at a time, no sooner than
    ``cooldown`` after the endpoint's last operation (SageMaker's default: 20 minutes).
    """

    strategy: str
    cooldown: Duration | None = None
    max_step: int | None = None

    @classmethod
    def idle_release(cls) -> "ScaleIn":
        return cls(strategy="IDLE_RELEASE")

    @classmethod
    def consolidation(cls, *, cooldown: Duration | None = None, max_step: int | None = None) -> "ScaleIn":
        return cls(strategy="CONSOLIDATION", cooldown=cooldown, max_step=max_step)

    def render(self) -> sagemaker.CfnEndpointConfig.ScaleInPolicyProperty:
        check_choice(self.strategy, "instance_scaling.scale_in.strategy", SCALE_IN_STRATEGIES)
        if self.strategy == "IDLE_RELEASE" and (self.cooldown is not None or self.max_step is not None):
            raise ConfigError("instance_scaling.scale_in", "cooldown and max_step are consolidation's; allowed: "
                              "ScaleIn.idle_release() alone")
        minutes = None
        if self.cooldown is not None:
            minutes = check_duration(self.cooldown, "instance_scaling.scale_in.cooldown", 5 * 60, 1440 * 60) // 60
        if self.max_step is not None:
            check_int(self.max_step, "instance_scaling.scale_in.max_step", 1, 100)
        return sagemaker.CfnEndpointConfig.ScaleInPolicyProperty(
            strategy=self.strategy, cooldown_in_minutes=minutes, maximum_step_size=self.max_step)


@dataclass(frozen=True, kw_only=True)
class InstanceScaling:
    """SageMaker's managed instance scaling of a fleet that hosts inference components: the fleet grows when a
    component's copies need room and shrinks when instances hold none. ``min_instances`` 0 lets an idle fleet
    go to no instances at all (then it costs nothing, and the first request waits for an instance to start).
    ``scale_in``: how it gives instances back (None: SageMaker's default, which the API does not name)."""

    min_instances: int = 1
    max_instances: int = 2
    scale_in: ScaleIn | None = None

    def validate(self, *, initial_instances: int) -> None:
        check_int(self.min_instances, "instance_scaling.min_instances", 0, 100)
        check_int(self.max_instances, "instance_scaling.max_instances", 1, 100)
        check_order(self.min_instances, self.max_instances, "instance_scaling.min_instances",
                    "instance_scaling.max_instances")
        if not max(1, self.min_instances) <= initial_instances <= self.max_instances:
            raise ConfigError("instance_count", f"got {initial_instances}; allowed: "
                              f"{max(1, self.min_instances)}..{self.max_instances} (instance_scaling's bounds, at least 1)")
        if self.scale_in is not None:
            check_type(self.scale_in, "instance_scaling.scale_in", ScaleIn,
                       "ScaleIn.idle_release() or ScaleIn.consolidation(...)")
            self.scale_in.render()

    def render(self) -> sagemaker.CfnEndpointConfig.ManagedInstanceScalingProperty:
        return sagemaker.CfnEndpointConfig.ManagedInstanceScalingProperty(
            status="ENABLED", min_instance_count=self.min_instances, max_instance_count=self.max_instances,
            scale_in_policy=self.scale_in.render() if self.scale_in is not None else None)


class PEagleEndpointConfig(Construct):
    """One production variant on ``fleet``; no physical name (replaced on change).

    Build it with :meth:`for_model` (one model on the fleet) or :meth:`for_components` (a fleet for inference
    components, :mod:`peagle_constructs.components`: the variant names no model, scales its instances itself
    and the config carries the role SageMaker hosts the components with). The startup timeouts stay on the
    variant (AWS's scale-to-zero example sets them there) and each component repeats them.

    ``fleet.detailed_observability`` is set explicitly on every config (SageMaker then publishes vLLM's own
    /metrics to CloudWatch; see :mod:`peagle_constructs.native_metrics`). ``encryption_key`` encrypts the ML
    storage volume; SageMaker refuses a key on instance families with local NVMe storage (hardware-encrypted),
    so passing one there is an error and leaving it out is acknowledged in :mod:`peagle_constructs.security`.
    """

    @classmethod
    def for_model(cls, scope: Construct, id: str, *, model: PEagleModel, fleet: FleetProps,
                  variant_name: str = DEFAULT_VARIANT_NAME, routing_strategy: str = "LEAST_OUTSTANDING_REQUESTS",
                  encryption_key: kms.IKey | None = None,
                  pool_models: Mapping[int, PEagleModel] | None = None) -> "PEagleEndpointConfig":
        """``pool_models``: by index in ``fleet.fallback_instances``, the model a pool serves instead of
        ``model`` (one with that pool's tensor parallelism)."""
        return cls(scope, id, fleet=fleet, model=model, variant_name=variant_name, routing_strategy=routing_strategy,
                   encryption_key=encryption_key, pool_models=pool_models)

    @classmethod
    def for_components(cls, scope: Construct, id: str, *, fleet: FleetProps, instance_scaling: InstanceScaling,
                       execution_role: iam.IRole, variant_name: str = DEFAULT_VARIANT_NAME,
                       routing_strategy: str = "LEAST_OUTSTANDING_REQUESTS",
                       encryption_key: kms.IKey | None = None) -> "PEagleEndpointConfig":
        return cls(scope, id, fleet=fleet, instance_scaling=instance_scaling, execution_role=execution_role,
                   variant_name=variant_name, routing_strategy=routing_strategy, encryption_key=encryption_key)

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        fleet: FleetProps,
        model: PEagleModel | None = None,
        variant_name: str = DEFAULT_VARIANT_NAME,
        routing_strategy: str = "LEAST_OUTSTANDING_REQUESTS",
        encryption_key: kms.IKey | None = None,
        instance_scaling: InstanceScaling | None = None,
        execution_role: iam.IRole | None = None,
        pool_models: Mapping[int, PEagleModel] | None = None,
    ) -> None:
        super().__init__(scope, id)
        one_model = model is not None and instance_scaling is None and execution_role is None
        components = model is None and instance_scaling is not None and execution_role is not None
        if not (one_model or components):
            raise ConfigError("model", "give a model (PEagleEndpointConfig.for_model), or instance_scaling and "
                              "execution_role without a model (PEagleEndpointConfig.for_components)")
        check_type(fleet, "fleet", FleetProps, "a FleetProps")
        fleet.validate()
        self.fleet = fleet
        self.instance_type = fleet.instance
        self.instance_count = fleet.instance_count
        if instance_scaling is not None:
            instance_scaling.validate(initial_instances=fleet.instance_count)
        self.instance_scaling = instance_scaling
        self.pool_models = dict(pool_models or {})
        self._check(model, variant_name, routing_strategy, encryption_key)
        self.variant_name = variant_name
        self.encryption_key = encryption_key
        self.detailed_observability = fleet.detailed_observability
        self.cfn_endpoint_config = sagemaker.CfnEndpointConfig(
            self, "Resource",
            production_variants=[self._variant(model, routing_strategy)],
            kms_key_id=encryption_key.key_arn if encryption_key is not None else None,
            metrics_config=fleet.detailed_observability.render(),
            execution_role_arn=execution_role.role_arn if execution_role is not None else None,
        )
        self.endpoint_config_name: str = self.cfn_endpoint_config.attr_endpoint_config_name
        retain_when_replaced(self.cfn_endpoint_config)
        if fleet.local_nvme:
            security.acknowledge_nvme_endpoint_config(self.cfn_endpoint_config,
                                                      instance_type=", ".join(fleet.instance_types))

    def _check(self, model: PEagleModel | None, variant_name: object, routing_strategy: str,
               encryption_key: kms.IKey | None) -> None:
        fleet = self.fleet
        tp = model.serving.tensor_parallel_size if model is not None else 1
        for index, name in enumerate(fleet.instance_types):
            gpus = InstanceType.of(name).gpu_count
            pool_tp = self.pool_models[index - 1].serving.tensor_parallel_size if index - 1 in self.pool_models else tp
            if pool_tp > gpus:
                raise ConfigError("serving.tensor_parallel_size", f"got {pool_tp} but {name} has {gpus} GPU(s); "
                                  "allowed: at most that many (or a fallback pool's own tensor_parallel_size)")
        if self.pool_models and model is None:
            raise ConfigError("pool_models", "only for a fleet that serves one model; allowed: None")
        unknown = sorted(set(self.pool_models) - set(range(len(fleet.fallback_instances))))
        if unknown:
            raise ConfigError("pool_models", f"got indexes {unknown}; allowed: indexes of fleet.fallback_instances")
        check_choice(routing_strategy, "routing_strategy", ROUTING_STRATEGIES)
        if not isinstance(variant_name, str) or not variant_name.replace("-", "").isalnum() or len(variant_name) > 63:
            raise ConfigError("variant_name", f"got {variant_name!r}; allowed: 1-63 letters, digits and hyphens")
        if fleet.local_nvme and encryption_key is not None:
            nvme = [n for n in fleet.instance_types if InstanceType.of(n).local_nvme]
            raise ConfigError(
                "encryption_key",
                f"not allowed on {', '.join(nvme)}: local NVMe storage, encrypted by the instance hardware, and "
                "CreateEndpointConfig fails with a KMS key; allowed: None",
            )

    def _variant(self, model: PEagleModel | None,
                 routing_strategy: str) -> sagemaker.CfnEndpointConfig.ProductionVariantProperty:
        fleet = self.fleet
        startup, download = fleet.startup_seconds()
        pools = None
        if fleet.fallback_instances:
            # The ladder replaces InstanceType: the primary is the pool of priority 1.
            pools = [sagemaker.CfnEndpointConfig.InstancePoolProperty(instance_type=fleet.instance_type, priority=1)]
            pools += [sagemaker.CfnEndpointConfig.InstancePoolProperty(
                instance_type=pool.instance_type, priority=index + 2,
                model_name_override=self.pool_models[index].model_name if index in self.pool_models else None)
                for index, pool in enumerate(fleet.fallback_instances)]
        timeout = fleet.provision_timeout
        return sagemaker.CfnEndpointConfig.ProductionVariantProperty(
            variant_name=self.variant_name,
            model_name=model.model_name if model is not None else None,
            instance_type=None if pools else fleet.instance_type,
            instance_pools=pools,
            variant_instance_provision_timeout_in_seconds=int(timeout.to_seconds()) if timeout is not None else None,
            initial_instance_count=fleet.instance_count,
            initial_variant_weight=1,
            container_startup_health_check_timeout_in_seconds=startup,
            model_data_download_timeout_in_seconds=download,
            inference_ami_version=fleet.inference_ami_version,
            routing_config=sagemaker.CfnEndpointConfig.RoutingConfigProperty(routing_strategy=routing_strategy),
            volume_size_in_gb=fleet.volume_size_gb,
            managed_instance_scaling=self.instance_scaling.render() if self.instance_scaling is not None else None,
        )
