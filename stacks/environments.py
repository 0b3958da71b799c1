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
    AlarmSubscriber, AlarmThresholds, AutoscalingOptions, ConfigError, DeploymentPolicy, DetailedObservability,
    ServingConfig,
)
from peagle_constructs.endpoint import check_endpoint_name
from peagle_constructs.presets import GPT_OSS_20B, ModelPreset

_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _bundle(environment: str) -> dict[str, str]:
    prefix = f"s3://peagle-weights-{environment}/bundles/gpt-oss-20b-p-eagle"
    return {"target_model": f"{prefix}/target/", "drafter_model": f"{prefix}/drafter/"}


@dataclass(frozen=True, kw_only=True)
class EnvironmentConfig:
    """One deployable environment: its Stage id, where it runs, and what it serves on what fleet."""

    name: str
    serving: ServingConfig
    instance_type: str
    # The model family served (trained K, instances, memory); None: a model without a preset, unchecked.
    preset: ModelPreset | None = None
    instance_count: int
    autoscaling: AutoscalingOptions
    deployment: DeploymentPolicy
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
        if self.weights_key_arn is not None and not _KMS_KEY_ARN.match(str(self.weights_key_arn)):
            raise ConfigError(f"{self.name}.weights_key_arn", f"got {self.weights_key_arn!r}; allowed: a KMS key ARN "
                              "'arn:aws:kms:<region>:<account>:key/<key id>'")

    @property
    def endpoint_name(self) -> str:
        # Stable across deploys: the log group, alarms and clients are keyed by it.
        return f"peagle-{self.name.lower()}"


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


DEV = EnvironmentConfig(
    name="Dev",
    preset=GPT_OSS_20B,
    serving=GPT_OSS_20B.serving(**_bundle("dev"), num_speculative_tokens=7, max_model_len=8192, max_num_seqs=32),
    instance_type="ml.g6e.xlarge",
    instance_count=1,
    autoscaling=AutoscalingOptions(min_capacity=1, max_capacity=2),
    deployment=DeploymentPolicy.all_at_once(bake=Duration.minutes(5)),
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
