"""The SageMaker EndpointConfig: one GPU production variant with LLM-sized timeouts."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from peagle_constructs import security
from peagle_constructs.errors import ConfigError, check_int_range
from peagle_constructs.instance_types import InstanceType
from peagle_constructs.model import PEagleModel
from peagle_constructs.native_metrics import DetailedObservability

TIMEOUT_MIN_S, TIMEOUT_MAX_S = 60, 3600
# A 20B-120B model needs minutes to copy from S3 and minutes more to load and warm up; SageMaker's
# 4-minute startup default would fail the first deploy.
DEFAULT_STARTUP_HEALTH_CHECK_TIMEOUT = Duration.minutes(30)
DEFAULT_MODEL_DATA_DOWNLOAD_TIMEOUT = Duration.minutes(30)
INFERENCE_AMI_VERSIONS = (
    "al2-ami-sagemaker-inference-gpu-2",
    "al2-ami-sagemaker-inference-gpu-2-1",
    "al2-ami-sagemaker-inference-gpu-3-1",
    "al2023-ami-sagemaker-inference-gpu-4-1",
)
# Recent vLLM wheels are built on CUDA 12.8+; the newest GPU AMI carries a driver that runs them.
DEFAULT_INFERENCE_AMI_VERSION = "al2023-ami-sagemaker-inference-gpu-4-1"
ROUTING_STRATEGIES = ("LEAST_OUTSTANDING_REQUESTS", "RANDOM")
DEFAULT_VARIANT_NAME = "AllTraffic"


def check_timeout(value: Duration, field_name: str) -> int:
    """A startup timeout in whole seconds, within SageMaker's 60..3600 s."""
    if not isinstance(value, Duration):
        raise ConfigError(field_name, f"got {value!r}; allowed: an aws_cdk.Duration of {TIMEOUT_MIN_S}..{TIMEOUT_MAX_S} s")
    seconds = value.to_seconds()
    if not TIMEOUT_MIN_S <= seconds <= TIMEOUT_MAX_S:
        raise ConfigError(field_name, f"got {seconds} s; allowed: {TIMEOUT_MIN_S}..{TIMEOUT_MAX_S} s")
    return int(seconds)


@dataclass(frozen=True, kw_only=True)
class InstanceScaling:
    """SageMaker's managed instance scaling of a fleet that hosts inference components: the fleet grows when a
    component's copies need room and shrinks when instances hold none. ``min_instances`` 0 lets an idle fleet
    go to no instances at all (then it costs nothing, and the first request waits for an instance to start)."""

    min_instances: int = 1
    max_instances: int = 2

    def validate(self, *, initial_instances: int) -> None:
        check_int_range(self.min_instances, "instance_scaling.min_instances", 0, 100)
        check_int_range(self.max_instances, "instance_scaling.max_instances", 1, 100)
        if self.min_instances > self.max_instances:
            raise ConfigError("instance_scaling.min_instances", f"got {self.min_instances} > max_instances "
                              f"{self.max_instances}; allowed: min_instances <= max_instances")
        if not max(1, self.min_instances) <= initial_instances <= self.max_instances:
            raise ConfigError("instance_count", f"got {initial_instances}; allowed: "
                              f"{max(1, self.min_instances)}..{self.max_instances} (instance_scaling's bounds, at least 1)")

    def render(self) -> sagemaker.CfnEndpointConfig.ManagedInstanceScalingProperty:
        return sagemaker.CfnEndpointConfig.ManagedInstanceScalingProperty(
            status="ENABLED", min_instance_count=self.min_instances, max_instance_count=self.max_instances)


class PEagleEndpointConfig(Construct):
    """One production variant of ``model`` on ``instance_type``; no physical name (replaced on change).

    Without ``model``, the variant is a fleet for inference components (:mod:`peagle_constructs.components`):
    it names no model, scales its instances itself (``instance_scaling``), and the config carries
    ``execution_role``, the role SageMaker hosts the components with. The startup timeouts stay on the
    variant (AWS's scale-to-zero example sets them there) and each component repeats them.

    ``detailed_observability`` is set explicitly on every config (SageMaker then publishes vLLM's own
    /metrics to CloudWatch; see :mod:`peagle_constructs.native_metrics`). ``encryption_key`` encrypts the ML
    storage volume; SageMaker refuses a key on instance families with local
    NVMe storage (hardware-encrypted), so passing one there is an error and leaving it out is acknowledged
    in :mod:`peagle_constructs.security`. ``volume_size_gb`` is likewise for EBS-backed families only.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        model: PEagleModel | None,
        instance_type: str,
        instance_count: int = 1,
        variant_name: str = DEFAULT_VARIANT_NAME,
        container_startup_health_check_timeout: Duration = DEFAULT_STARTUP_HEALTH_CHECK_TIMEOUT,
        model_data_download_timeout: Duration = DEFAULT_MODEL_DATA_DOWNLOAD_TIMEOUT,
        inference_ami_version: str = DEFAULT_INFERENCE_AMI_VERSION,
        routing_strategy: str = "LEAST_OUTSTANDING_REQUESTS",
        encryption_key: kms.IKey | None = None,
        volume_size_gb: int | None = None,
        detailed_observability: DetailedObservability = DetailedObservability(),
        instance_scaling: InstanceScaling | None = None,
        execution_role: iam.IRole | None = None,
    ) -> None:
        super().__init__(scope, id)
        fleet_for_components = instance_scaling is not None and execution_role is not None
        if (model is not None and (instance_scaling is not None or execution_role is not None)
                or model is None and not fleet_for_components):
            raise ConfigError("model", "give a model (one model on the fleet), or instance_scaling and execution_role "
                              "without a model (a fleet for inference components)")
        if not isinstance(detailed_observability, DetailedObservability):
            raise ConfigError("detailed_observability",
                              f"got {detailed_observability!r}; allowed: a DetailedObservability")
        self.instance_type = InstanceType.of(instance_type)
        self.instance_count = check_int_range(instance_count, "instance_count", 1, 100)
        if instance_scaling is not None:
            instance_scaling.validate(initial_instances=instance_count)
        self.instance_scaling = instance_scaling
        tp = model.serving.tensor_parallel_size if model is not None else 1
        if tp > self.instance_type.gpu_count:
            raise ConfigError(
                "serving.tensor_parallel_size",
                f"got {tp} but {instance_type} has {self.instance_type.gpu_count} GPU(s); allowed: at most that many",
            )
        startup = check_timeout(container_startup_health_check_timeout, "container_startup_health_check_timeout")
        download = check_timeout(model_data_download_timeout, "model_data_download_timeout")
        if inference_ami_version not in INFERENCE_AMI_VERSIONS:
            raise ConfigError("inference_ami_version", f"got {inference_ami_version!r}; allowed: one of {INFERENCE_AMI_VERSIONS}")
        if routing_strategy not in ROUTING_STRATEGIES:
            raise ConfigError("routing_strategy", f"got {routing_strategy!r}; allowed: one of {ROUTING_STRATEGIES}")
        if not isinstance(variant_name, str) or not variant_name.replace("-", "").isalnum() or len(variant_name) > 63:
            raise ConfigError("variant_name", f"got {variant_name!r}; allowed: 1-63 letters, digits and hyphens")
        nvme = self.instance_type.local_nvme
        if nvme and encryption_key is not None:
            raise ConfigError(
                "encryption_key",
                f"not allowed on {instance_type}: the {self.instance_type.family} family has local NVMe storage, "
                "encrypted by the instance hardware, and CreateEndpointConfig fails with a KMS key; allowed: None",
            )
        if volume_size_gb is not None:
            if nvme:
                raise ConfigError(
                    "volume_size_gb",
                    f"not allowed on {instance_type}: local NVMe storage has a fixed size; allowed: None",
                )
            check_int_range(volume_size_gb, "volume_size_gb", 1, 512)

        self.variant_name = variant_name
        self.encryption_key = encryption_key
        single_model = model is not None
        variant = sagemaker.CfnEndpointConfig.ProductionVariantProperty(
            variant_name=variant_name,
            model_name=model.model_name if single_model else None,
            instance_type=instance_type,
            initial_instance_count=instance_count,
            initial_variant_weight=1,
            container_startup_health_check_timeout_in_seconds=startup,
            model_data_download_timeout_in_seconds=download,
            inference_ami_version=inference_ami_version,
            routing_config=sagemaker.CfnEndpointConfig.RoutingConfigProperty(routing_strategy=routing_strategy),
            volume_size_in_gb=volume_size_gb,
            managed_instance_scaling=instance_scaling.render() if instance_scaling is not None else None,
        )
        self.detailed_observability = detailed_observability
        self.cfn_endpoint_config = sagemaker.CfnEndpointConfig(
            self, "Resource",
            production_variants=[variant],
            kms_key_id=encryption_key.key_arn if encryption_key is not None else None,
            metrics_config=detailed_observability.render(),
            execution_role_arn=execution_role.role_arn if execution_role is not None else None,
        )
        self.endpoint_config_name: str = self.cfn_endpoint_config.attr_endpoint_config_name
        if nvme:
            security.acknowledge_nvme_endpoint_config(self.cfn_endpoint_config, instance_type=instance_type)
