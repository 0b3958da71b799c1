"""The environments, as typed, frozen configs. Changing serving behaviour per stage happens here only.

All three serve the GPT-OSS-20B preset (peagle_constructs.presets: its P-EAGLE head, the flags its card
recommends) at K=7, so the model that passes Dev and Staging is the one Prod gets; each overrides only the
fields it must. Weights come from one S3 bundle prefix per environment (``target/`` and ``drafter/`` below
it, staged by `make stage-weights`): CloudFormation gives a SageMaker model one ModelDataSource.

Dev runs on ml.g6e.xlarge: one NVIDIA L40S with 48 GB. GPT-OSS-20B ships its MoE weights in MXFP4, about
14 GiB on the GPU; the P-EAGLE head (4 layers) adds about 3.4 GiB; the fp8 KV cache for 32 x 8K tokens
about 3 GiB (half its layers keep a 128-token window): the preset's arithmetic checks it at synth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_logs as logs

from peagle_constructs import (
    AlarmSubscriber, AlarmThresholds, AutoscalingOptions, ComputeRequirements, ConfigError, CopyScaling,
    DeploymentPolicy, DetailedObservability, InstanceScaling, ServingConfig,
)
from peagle_constructs.autoscaling import check_floor_above_zero
from peagle_constructs.endpoint import check_endpoint_name
from peagle_constructs.presets import GPT_OSS_20B, ModelPreset

_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _bundle(environment: str) -> dict[str, str]:
    prefix = f"s3://peagle-weights-{environment}/bundles/gpt-oss-20b-p-eagle"
    return {"target_model": f"{prefix}/target/", "drafter_model": f"{prefix}/drafter/"}


@dataclass(frozen=True, kw_only=True)
class ComponentHosting:
    """Serve the model as an inference component: the fleet scales its instances (to zero where allowed) and
    the component its copies; an update rolls out copy by copy (``deployment``, a rolling policy)."""

    instance_scaling: InstanceScaling = InstanceScaling()
    copy_scaling: CopyScaling = CopyScaling()
    copy_count: int = 1
    compute: ComputeRequirements = ComputeRequirements()
    deployment: DeploymentPolicy = DeploymentPolicy.rolling(copies=1, bake=Duration.minutes(10))


@dataclass(frozen=True, kw_only=True)
class EnvironmentConfig:
    """One deployable environment: its Stage id, where it runs, and what it serves on what fleet.

    The model is served by a single-model endpoint (``autoscaling`` and ``deployment`` are the variant's), or,
    with ``components``, as an inference component on a fleet that scales itself (then those two are None).
    ``allow_scale_to_zero``: whether the fleet and the copies may go to zero when idle.
    """

    name: str
    serving: ServingConfig
    instance_type: str
    # The model family served (trained K, instances, memory); None: a model without a preset, unchecked.
    preset: ModelPreset | None = None
    instance_count: int
    autoscaling: AutoscalingOptions | None = None
    deployment: DeploymentPolicy | None = None
    components: ComponentHosting | None = None
    allow_scale_to_zero: bool = False
    alarms: AlarmThresholds = AlarmThresholds()
    # Who is told when an alarm changes state. A production environment must tell someone.
    alarm_subscribers: tuple[AlarmSubscriber, ...] = ()
    require_subscribers: bool = False
    detailed_observability: DetailedObservability = DetailedObservability()
    network_isolation: bool = True
    # The KMS key the weights in S3 are encrypted with (its ARN), when not S3's own: the role may decrypt with it.
    weights_key_arn: str | None = None
    encrypt_volume: bool | None = None  # None: a KMS key on EBS-backed families, none on local-NVMe ones
    container_startup_health_check_timeout: Duration = Duration.minutes(30)
    model_data_download_timeout: Duration = Duration.minutes(30)
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_YEAR
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    account: str | None = None  # None: from context / CDK_DEFAULT_ACCOUNT
    region: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not set(self.name) <= _NAME_CHARS or not self.name[0].isalpha():
            raise ConfigError("environment.name", f"got {self.name!r}; allowed: letters and digits, starting with a letter")
        check_endpoint_name(self.endpoint_name, "environment.name")
        if self.require_subscribers and not self.alarm_subscribers:
            raise ConfigError(f"{self.name}.alarm_subscribers",
                              "empty, and this environment requires someone to tell; allowed: at least one "
                              "AlarmSubscriber.email(...), .https(...) or .topic(<SNS topic ARN>)")
        if self.preset is not None:
            self.preset.check(self.serving, instance_type=self.instance_type, where=self.name)
        self._check_hosting()
        if self.weights_key_arn is not None and not _KMS_KEY_ARN.match(str(self.weights_key_arn)):
            raise ConfigError(f"{self.name}.weights_key_arn", f"got {self.weights_key_arn!r}; allowed: a KMS key ARN "
                              "'arn:aws:kms:<region>:<account>:key/<key id>'")

    def _check_hosting(self) -> None:
        if self.components is None:
            for field_name in ("autoscaling", "deployment"):
                if getattr(self, field_name) is None:
                    raise ConfigError(f"{self.name}.{field_name}", "missing for a single-model endpoint; allowed: "
                                      f"{'AutoscalingOptions(...)' if field_name == 'autoscaling' else 'a DeploymentPolicy'}"
                                      ", or components=ComponentHosting(...) to serve an inference component")
            return
        if not isinstance(self.components, ComponentHosting):
            raise ConfigError(f"{self.name}.components", f"got {self.components!r}; allowed: a ComponentHosting")
        for field_name, instead in (("autoscaling", "copy_scaling"), ("deployment", "deployment")):
            if getattr(self, field_name) is not None:
                raise ConfigError(f"{self.name}.{field_name}", "not used with components (the fleet and the copies "
                                  f"scale and roll out themselves); allowed: None, and components.{instead}")
        if not self.allow_scale_to_zero:
            check_floor_above_zero(self.components.instance_scaling.min_instances,
                                   f"{self.name}.components.instance_scaling.min_instances")
            check_floor_above_zero(self.components.copy_scaling.min_copies,
                                   f"{self.name}.components.copy_scaling.min_copies")

    @property
    def endpoint_name(self) -> str:
        # Stable across deploys: the log group, alarms and clients are keyed by it.
        return f"peagle-{self.name.lower()}"

    @property
    def component_name(self) -> str | None:
        """The inference component clients name in each request (``InferenceComponentName``); None: a
        single-model endpoint."""
        if self.components is None:
            return None
        model = re.sub(r"[^a-z0-9]+", "-", (self.serving.served_model_name or "model").lower()).strip("-")
        return f"{self.endpoint_name}-{model}"[:63].rstrip("-")


def check_unique_names(environments: Iterable[EnvironmentConfig]) -> None:
    seen: dict[str, int] = {}
    for index, env in enumerate(environments):
        key = env.name.lower()  # Dev and dev would share an endpoint name
        if key in seen:
            raise ConfigError(
                f"environments[{index}].name",
                f"got {env.name!r}, already used by environments[{seen[key]}]; allowed: a name not used by another "
                "environment (case-insensitive: it names the Stage and the endpoint)",
            )
        seen[key] = index


# Dev is idle most of the day: an inference component on a fleet that goes to no instance when unused. The
# first request after a quiet spell fails fast and wakes it; serving resumes once a copy has loaded.
DEV = EnvironmentConfig(
    name="Dev",
    preset=GPT_OSS_20B,
    serving=GPT_OSS_20B.serving(**_bundle("dev"), num_speculative_tokens=7, max_model_len=8192, max_num_seqs=32),
    instance_type="ml.g6e.xlarge",
    instance_count=1,
    components=ComponentHosting(
        instance_scaling=InstanceScaling(min_instances=0, max_instances=2),
        copy_scaling=CopyScaling(min_copies=0, max_copies=2),
        deployment=DeploymentPolicy.rolling(copies=1, bake=Duration.minutes(5)),
    ),
    allow_scale_to_zero=True,
    log_retention=logs.RetentionDays.ONE_YEAR,
    removal_policy=RemovalPolicy.DESTROY,
    tags={"environment": "dev"},
)

STAGING = EnvironmentConfig(
    name="Staging",
    preset=GPT_OSS_20B,
    serving=GPT_OSS_20B.serving(**_bundle("staging"), num_speculative_tokens=7, max_model_len=16384, max_num_seqs=64),
    instance_type="ml.g6e.2xlarge",
    instance_count=2,
    autoscaling=AutoscalingOptions(min_capacity=2, max_capacity=4),
    deployment=DeploymentPolicy.linear(percent=50, bake=Duration.minutes(10)),
    alarm_subscribers=(AlarmSubscriber.email("peagle-team@example.com"),),
    tags={"environment": "staging"},
)

PROD = EnvironmentConfig(
    name="Prod",
    preset=GPT_OSS_20B,
    serving=GPT_OSS_20B.serving(**_bundle("prod"), num_speculative_tokens=7, max_model_len=16384, max_num_seqs=64),
    instance_type="ml.g6e.2xlarge",
    instance_count=4,
    autoscaling=AutoscalingOptions(min_capacity=4, max_capacity=12),
    deployment=DeploymentPolicy.canary(instances=1, bake=Duration.minutes(15)),
    alarms=AlarmThresholds(ttft_p90_ms=1500.0),
    # This organisation's on-call address and pager webhook: replace with yours.
    alarm_subscribers=(AlarmSubscriber.email("peagle-oncall@example.com"),
                       AlarmSubscriber.https("https://events.pagerduty.example.com/integration/peagle-prod/enqueue")),
    require_subscribers=True,
    tags={"environment": "prod"},
)

ENVIRONMENTS: tuple[EnvironmentConfig, ...] = (DEV, STAGING, PROD)
