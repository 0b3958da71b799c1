"""The typed props an endpoint is built from, shared by the constructs and by an app's own configuration.

:class:`FleetProps` is what runs the model (instances, storage, startup timeouts, observability, how long
logs live); :class:`ModelProps` is what is served and how it is watched (the serving config, its preset,
the alarm thresholds and who they tell). ``PEagleEndpoint(model=..., fleet=...)``, ``PEagleComponentEndpoint
(fleet=...)`` with ``add_component(model=...)`` and an environment of ``stacks/`` all take these same
objects, so a value keeps one name from an environment's definition to the template.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_logs as logs

from peagle_contract.serving import ServingConfig

from peagle_constructs.alarm_thresholds import AlarmThresholds
from peagle_constructs.errors import ConfigError
from peagle_constructs.instance_types import InstanceType
from peagle_constructs.native_metrics import DetailedObservability
from peagle_constructs.notifications import AlarmSubscriber
from peagle_constructs.presets import ModelPreset
from peagle_constructs.validation import check_choice, check_duration, check_int, check_type

TIMEOUT_MIN_S, TIMEOUT_MAX_S = 60, 3600
# A 20B-120B model needs minutes to copy from S3 and minutes more to load and warm up; SageMaker's
# 4-minute startup default would fail the first deploy.
DEFAULT_STARTUP_TIMEOUT = Duration.minutes(30)
INFERENCE_AMI_VERSIONS = (
    "al2-ami-sagemaker-inference-gpu-2",
    "al2-ami-sagemaker-inference-gpu-2-1",
    "al2-ami-sagemaker-inference-gpu-3-1",
    "al2023-ami-sagemaker-inference-gpu-4-1",
)
# Recent vLLM wheels are built on CUDA 12.8+; the newest GPU AMI carries a driver that runs them.
DEFAULT_INFERENCE_AMI_VERSION = "al2023-ami-sagemaker-inference-gpu-4-1"
MAX_INSTANCE_POOLS = 5  # ProductionVariant.InstancePools: the primary and up to four fallbacks
PROVISION_TIMEOUT_MIN_S, PROVISION_TIMEOUT_MAX_S = 300, 3600  # VariantInstanceProvisionTimeoutInSeconds


@dataclass(frozen=True, kw_only=True)
class DrafterTrainingProps:
    """How a stage trains its next drafter in the cloud (peagle_constructs.DrafterTraining): one SageMaker training
    job of ``instance_type`` (a GPU training type) for at most ``max_runtime``, with ``volume_size_gb`` of storage;
    the gate's ``margin`` (the AL ratio its interval's lower bound must reach), ``max_tokens`` per held-out answer,
    ``cpu_seconds`` the recipe's training budget (None: the benchmark recipe's), and ``schedule`` (None: started
    by hand)."""

    # The trainer computes in fp32 and on the instance's CPUs (models/trainer has no GPU path), and its gate runs vLLM
    # in fp32: a 21B-parameter target such as gpt-oss-20b is about 78 GiB so, which a g6e's 48 GB GPU and the
    # 64 GiB host of ml.g6e.2xlarge cannot hold; ml.g7e.4xlarge has a 96 GB GPU and 128 GiB of host memory.
    instance_type: str = "ml.g7e.4xlarge"
    max_runtime: Duration = Duration.hours(8)
    volume_size_gb: int = 200
    margin: float = 1.05
    max_tokens: int = 128
    cpu_seconds: float | None = None
    schedule: events.Schedule | None = None

    def validate(self) -> None:
        InstanceType.of(self.instance_type)
        check_duration(self.max_runtime, "max_runtime", 3600, 28 * 86400)  # SageMaker's MaxRuntimeInSeconds
        check_int(self.volume_size_gb, "volume_size_gb", 1, 16384)
        if self.schedule is not None:
            check_type(self.schedule, "schedule", events.Schedule, "an aws_events.Schedule or None")


@dataclass(frozen=True, kw_only=True)
class InstancePool:
    """An instance type the fleet falls back to when the ones before it have no capacity.

    ``tensor_parallel_size`` None: the serving config's; another value (a type with more, or fewer, GPUs per
    instance) gets this pool a model of its own with that tensor parallelism (the pool's ModelNameOverride).
    """

    instance_type: str
    tensor_parallel_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class FleetProps:
    """The instances that serve, and what each endpoint config and log group of them says.

    ``instance_count`` is the fleet at creation (autoscaling owns it afterwards). ``encrypt_volume`` None: a
    KMS key on EBS-backed families, none on local-NVMe ones (SageMaker refuses a key there; the instance
    hardware encrypts). ``volume_size_gb`` is for EBS-backed families only.
    """

    instance_type: str
    instance_count: int = 1
    # Tried in order when the instance types before them have no capacity (SageMaker's InstancePools); each is
    # checked at synth like ``instance_type``. ``provision_timeout``: how long SageMaker tries them all.
    fallback_instances: tuple[InstancePool, ...] = ()
    provision_timeout: Duration | None = None
    encrypt_volume: bool | None = None
    volume_size_gb: int | None = None
    container_startup_health_check_timeout: Duration = DEFAULT_STARTUP_TIMEOUT
    model_data_download_timeout: Duration = DEFAULT_STARTUP_TIMEOUT
    inference_ami_version: str = DEFAULT_INFERENCE_AMI_VERSION
    detailed_observability: DetailedObservability = DetailedObservability()
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_YEAR
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN

    @property
    def instance(self) -> InstanceType:
        return InstanceType.of(self.instance_type)

    @property
    def instance_types(self) -> tuple[str, ...]:
        """Every instance type the fleet may run on, in the order SageMaker tries them."""
        return (self.instance_type, *(pool.instance_type for pool in self.fallback_instances))

    @property
    def local_nvme(self) -> bool:
        """Whether any instance type of the fleet has local NVMe storage (no KMS key, no volume size there)."""
        return any(InstanceType.of(name).local_nvme for name in self.instance_types)

    @property
    def volume_encrypted(self) -> bool:
        return not self.local_nvme if self.encrypt_volume is None else self.encrypt_volume

    def validate(self) -> None:
        self.instance  # a malformed or unknown type is named first
        check_int(self.instance_count, "instance_count", 1, 100)
        self.startup_seconds()
        check_choice(self.inference_ami_version, "inference_ami_version", INFERENCE_AMI_VERSIONS)
        check_type(self.detailed_observability, "detailed_observability", DetailedObservability,
                   "a DetailedObservability")
        self._check_fallbacks()
        if self.volume_size_gb is not None:
            if self.local_nvme:
                raise ConfigError("volume_size_gb", f"not allowed on {', '.join(self.instance_types)}: local NVMe "
                                  "storage has a fixed size; allowed: None")
            check_int(self.volume_size_gb, "volume_size_gb", 1, 512)

    def _check_fallbacks(self) -> None:
        pools = self.fallback_instances
        if not isinstance(pools, tuple) or not all(isinstance(p, InstancePool) for p in pools):
            raise ConfigError("fallback_instances", f"got {pools!r}; allowed: a tuple of InstancePool(...)")
        if len(pools) > MAX_INSTANCE_POOLS - 1:
            raise ConfigError("fallback_instances", f"got {len(pools)}; allowed: at most {MAX_INSTANCE_POOLS - 1} "
                              f"(SageMaker's {MAX_INSTANCE_POOLS} instance pools, the primary included)")
        seen = {self.instance_type}
        for index, pool in enumerate(pools):
            field_name = f"fallback_instances[{index}]"
            instance = InstanceType.of(pool.instance_type, field_name=f"{field_name}.instance_type")
            if pool.instance_type in seen:
                raise ConfigError(f"{field_name}.instance_type", f"got {pool.instance_type!r}, already in the ladder; "
                                  "allowed: an instance type not tried before it")
            seen.add(pool.instance_type)
            if pool.tensor_parallel_size is not None:
                check_int(pool.tensor_parallel_size, f"{field_name}.tensor_parallel_size", 1, instance.gpu_count,
                          allowed=f"1..{instance.gpu_count} (the GPUs of one {pool.instance_type}), or None")
        if self.provision_timeout is not None:
            if not pools:
                raise ConfigError("provision_timeout", "only with fallback_instances (it bounds the time SageMaker "
                                  "tries the ladder); allowed: None")
            check_duration(self.provision_timeout, "provision_timeout", PROVISION_TIMEOUT_MIN_S,
                           PROVISION_TIMEOUT_MAX_S)

    def startup_seconds(self) -> tuple[int, int]:
        """The container startup and model download timeouts in whole seconds (SageMaker's 60..3600 s)."""
        return (check_duration(self.container_startup_health_check_timeout, "container_startup_health_check_timeout",
                               TIMEOUT_MIN_S, TIMEOUT_MAX_S),
                check_duration(self.model_data_download_timeout, "model_data_download_timeout",
                               TIMEOUT_MIN_S, TIMEOUT_MAX_S))


@dataclass(frozen=True, kw_only=True)
class ModelProps:
    """What is served and how it is watched.

    ``preset`` (peagle_constructs.presets): the model family this serves; synth then refuses a K above the
    head's trained K, an instance the preset does not list and a config whose memory does not fit.
    ``environment``: container variables beside the serving config's own (never ``SM_VLLM_*``: vLLM flags
    belong in ``ServingConfig.extra_args``). ``network_isolation`` on: the weights come from S3 prefixes.
    ``weights_account``: the account that owns the weights bucket (as ``aws_s3.BucketAttributes.account`` names
    it), when not the stack's own: the model may read its prefix only in a bucket that account owns.
    """

    serving: ServingConfig
    preset: ModelPreset | None = None
    alarm_thresholds: AlarmThresholds = AlarmThresholds()
    alarm_subscribers: tuple[AlarmSubscriber, ...] = ()
    network_isolation: bool = True
    environment: Mapping[str, str] = field(default_factory=dict)
    weights_account: str | None = None

    def check_on(self, instance_type: str, where: str = "preset") -> None:
        """The preset's checks of this serving config on ``instance_type`` (none without a preset)."""
        check_type(self.serving, "serving", ServingConfig, "a peagle_contract ServingConfig")
        if self.preset is not None:
            self.preset.check(self.serving, instance_type=instance_type, where=where)

    def on_pool(self, pool: InstancePool) -> "ModelProps":
        """These props as a fallback pool serves them: with the pool's tensor parallelism where it has one."""
        if pool.tensor_parallel_size is None or pool.tensor_parallel_size == self.serving.tensor_parallel_size:
            return self
        return replace(self, serving=replace(self.serving, tensor_parallel_size=pool.tensor_parallel_size))

    def check_on_fleet(self, fleet: FleetProps, where: str = "preset") -> None:
        """The preset's checks on the fleet's instance type and on every fallback pool, each with its own
        tensor parallelism."""
        self.check_on(fleet.instance_type, where=where)
        for index, pool in enumerate(fleet.fallback_instances):
            self.on_pool(pool).check_on(pool.instance_type, where=f"{where}.fallback_instances[{index}]")
