"""The environments, as typed, frozen configs. Changing serving behaviour per stage happens here only.

All three serve the GPT-OSS-20B preset (peagle_constructs.presets: its P-EAGLE head, the flags its card
recommends) at K=7, so the model that passes Dev and Staging is the one Prod gets; each overrides only the
fields it must. Weights come from one S3 bundle per environment (``target/`` and ``drafter/`` in it, staged by
`make stage-weights` under ``<prefix><digest>/`` and pinned in ``PINNED_BUNDLES``): CloudFormation gives a
SageMaker model one ModelDataSource. Each stage names its own account (``account``, or ``-c account.<Stage>``):
stacks.isolation refuses a real-account synth that puts two stages in one account unless they say why.

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

from peagle_contract.bundle import bundle_uri

from peagle_constructs import (
    AlarmSubscriber, AlarmThresholds, AutoscalingOptions, CaptureConfig, ComputeRequirements, ConfigError, CopyScaling,
    DeploymentPolicy, DrafterTrainingProps, FleetProps, InstancePool, InstanceScaling, ModelProps, ScaleIn,
    check_endpoint_name, check_floor_above_zero,
)
from peagle_constructs.presets import GPT_OSS_20B

_ACCOUNT = re.compile(r"^\d{12}$")
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


# Each stage's weights: the bundle prefix given to `make stage-weights`, and the SHA-256 it printed. A pinned stage
# serves <prefix><digest>/ (content-addressed, never overwritten) and its container refuses any other bytes;
# Staging and Prod must be pinned for a real account (stacks.isolation). Paste your digests here.
BUNDLE_PREFIXES = {name: f"s3://peagle-weights-{name}/bundles/gpt-oss-20b-p-eagle/" for name in ("dev", "staging", "prod")}
PINNED_BUNDLES: dict[str, str | None] = {"dev": None, "staging": None, "prod": None}


def bundle(environment: str, pin: str | None) -> dict[str, str | None]:
    """The serving-config fields of ``environment``'s weights: the bundle ``pin`` names, or (None) the unpinned
    prefix, which a real-account synth of Staging or Prod refuses."""
    prefix = BUNDLE_PREFIXES[environment]
    root = bundle_uri(prefix, pin) if pin else prefix
    return {"target_model": f"{root}target/", "drafter_model": f"{root}drafter/", "bundle_manifest_sha256": pin}


def _bundle(environment: str) -> dict[str, str | None]:
    return bundle(environment, PINNED_BUNDLES[environment])


@dataclass(frozen=True, kw_only=True)
class SingleModelHosting:
    """Serve the model on an endpoint of its own: instance-count autoscaling, a blue/green or rolling update."""

    scaling: AutoscalingOptions
    deployment: DeploymentPolicy


@dataclass(frozen=True, kw_only=True)
class ComponentHosting:
    """Serve the model as an inference component: the fleet scales its instances (to zero where
    ``allow_scale_to_zero``) and the component its copies; an update rolls out copy by copy."""

    instance_scaling: InstanceScaling = InstanceScaling()
    scaling: CopyScaling = CopyScaling()
    copy_count: int = 1
    compute: ComputeRequirements = ComputeRequirements()
    deployment: DeploymentPolicy = DeploymentPolicy.rolling(copies=1, bake=Duration.minutes(10))
    allow_scale_to_zero: bool = False


@dataclass(frozen=True, kw_only=True)
class EnvironmentConfig:
    """One deployable environment: a name (its Stage id), where it runs, and the construct library's own
    props for what it serves (``model``), on what (``fleet``) and how it is hosted (``hosting``)."""

    name: str
    model: ModelProps
    fleet: FleetProps
    hosting: SingleModelHosting | ComponentHosting
    # A production environment must tell someone when an alarm changes state.
    require_subscribers: bool = False
    # The KMS key the weights in S3 are encrypted with (its ARN), when not S3's own: the role may decrypt with it.
    weights_key_arn: str | None = None
    account: str | None = None  # None: -c account.<name>, then -c account, then CDK_DEFAULT_ACCOUNT (stacks.isolation)
    region: str | None = None
    # One account per stage: a real-account synth refuses a stage that shares its account with another unless
    # this says why (printed at every synth).
    shared_account_reason: str | None = None
    # A real-account synth refuses this stage without a pinned weights bundle (bundle_manifest_sha256).
    require_pinned_weights: bool = False
    # Train the stage's next drafter in the cloud on its own captured traffic (peagle_constructs.DrafterTraining):
    # it needs capture on and a pinned weights bundle, since the job starts from the weights the pin names only.
    training: DrafterTrainingProps | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not set(self.name) <= _NAME_CHARS or not self.name[0].isalpha():
            raise ConfigError("environment.name", f"got {self.name!r}; allowed: letters and digits, starting with a letter")
        check_endpoint_name(self.endpoint_name, "environment.name")
        for field_name, kind in (("model", ModelProps), ("fleet", FleetProps)):
            if not isinstance(getattr(self, field_name), kind):
                raise ConfigError(f"{self.name}.{field_name}", f"got {getattr(self, field_name)!r}; allowed: a "
                                  f"{kind.__name__}")
        if self.require_subscribers and not self.model.alarm_subscribers:
            raise ConfigError(f"{self.name}.model.alarm_subscribers",
                              "empty, and this environment requires someone to tell; allowed: at least one "
                              "AlarmSubscriber.email(...), .https(...) or .topic(<SNS topic ARN>)")
        self.fleet.validate()
        self.model.check_on_fleet(self.fleet, where=self.name)
        self._check_hosting()
        if self.account is not None and not (isinstance(self.account, str) and _ACCOUNT.match(self.account)):
            raise ConfigError(f"{self.name}.account", f"got {str(self.account)[:40]!r}; allowed: a 12-digit AWS account "
                              "id, or None to take it from the context")
        if self.shared_account_reason is not None and not (isinstance(self.shared_account_reason, str)
                                                           and self.shared_account_reason.strip()):
            raise ConfigError(f"{self.name}.shared_account_reason", f"got {str(self.shared_account_reason)[:40]!r}; "
                              "allowed: None (an account of its own) or a sentence saying why the account is shared")
        self._check_capture()
        self._check_training()
        if self.weights_key_arn is not None and not _KMS_KEY_ARN.match(str(self.weights_key_arn)):
            raise ConfigError(f"{self.name}.weights_key_arn", f"got {self.weights_key_arn!r}; allowed: a KMS key ARN "
                              "'arn:aws:kms:<region>:<account>:key/<key id>'")

    def _check_capture(self) -> None:
        """Records name the stage and target they came from, and the drafter's trainer refuses others: so a
        config that names another stage (a Dev copied from Prod's) would pass its traffic off as that stage's."""
        capture = self.model.serving.capture
        if capture is None:
            return
        if len(self.endpoint_name) > MAX_CAPTURE_ENDPOINT_NAME:
            raise ConfigError(f"{self.name}.name", f"got {self.name[:40]!r} ({len(self.name)} characters); allowed: "
                              f"at most {MAX_CAPTURE_ENDPOINT_NAME - len('peagle-')} with capture on (the stage's "
                              "capture bucket is named peagle-<stage>-capture-<account>-<region>, 63 at most)")
        if capture.stage != self.name.lower():
            raise ConfigError(f"{self.name}.model.serving.capture.stage",
                              f"got {capture.stage[:40]!r}; allowed: {self.name.lower()!r}, this environment's own")
        preset = self.model.preset
        if preset is not None and capture.target != preset.served_model_name:
            raise ConfigError(f"{self.name}.model.serving.capture.target",
                              f"got {capture.target[:40]!r}; allowed: {preset.served_model_name!r}, the target the "
                              f"{preset.name} preset serves")

    def _check_training(self) -> None:
        training, serving, where = self.training, self.model.serving, f"{self.name}.training"
        if training is None:
            return
        if not isinstance(training, DrafterTrainingProps):
            raise ConfigError(where, f"got {type(training).__name__}; allowed: DrafterTrainingProps(...) or None")
        if serving.capture is None:
            raise ConfigError(where, "set, but model.serving.capture is None; allowed: training with capture on (the "
                                     "job trains on the stage's own records), or training=None")
        if serving.bundle_manifest_sha256 is None:
            raise ConfigError(where, "set, but the stage's weights are not pinned; allowed: training once "
                                     f"PINNED_BUNDLES[{self.name.lower()!r}] names a bundle (the job starts from the "
                                     "bytes the pin names, and checks them)")
        try:
            training.validate()
        except ConfigError as exc:
            raise ConfigError(f"{where}.{exc.field_name}", str(exc).split(": ", 1)[1]) from None

    def _check_hosting(self) -> None:
        hosting = self.hosting
        if isinstance(hosting, SingleModelHosting):
            for field_name, kind, allowed in (("scaling", AutoscalingOptions, "AutoscalingOptions(...)"),
                                              ("deployment", DeploymentPolicy, "a DeploymentPolicy")):
                if not isinstance(getattr(hosting, field_name), kind):
                    raise ConfigError(f"{self.name}.hosting.{field_name}", f"got {getattr(hosting, field_name)!r}; "
                                      f"allowed: {allowed}")
            return
        if not isinstance(hosting, ComponentHosting):
            raise ConfigError(f"{self.name}.hosting", f"got {hosting!r}; allowed: SingleModelHosting(scaling=..., "
                              "deployment=...) or ComponentHosting(...)")
        if not hosting.allow_scale_to_zero:
            check_floor_above_zero(hosting.instance_scaling.min_instances,
                                   f"{self.name}.hosting.instance_scaling.min_instances")
            check_floor_above_zero(hosting.scaling.min_copies, f"{self.name}.hosting.scaling.min_copies")

    @property
    def hosts_components(self) -> bool:
        return isinstance(self.hosting, ComponentHosting)

    @property
    def endpoint_name(self) -> str:
        # Stable across deploys: the log group, alarms and clients are keyed by it.
        return f"peagle-{self.name.lower()}"

    def capture_bucket_name(self, account: str, region: str) -> str:
        """The stage's capture bucket, named by the stacks so the execution policy can name it: bucket names are
        global, so its account and region are in it (a bucket of that name in another account receives nothing:
        the delivery role writes only to its own account's buckets)."""
        return _capture_bucket_name(self.endpoint_name, account, region)

    @property
    def component_name(self) -> str | None:
        """The inference component clients name in each request (``InferenceComponentName``); None: a
        single-model endpoint."""
        if not self.hosts_components:
            return None
        model = re.sub(r"[^a-z0-9]+", "-", (self.model.serving.served_model_name or "model").lower()).strip("-")
        return f"{self.endpoint_name}-{model}"[:63].rstrip("-")


def _capture_bucket_name(endpoint_name: str, account: str, region: str) -> str:
    return f"{endpoint_name}-capture-{account}-{region}"


# The longest endpoint name whose capture bucket still fits S3's 63 characters, with a 12-digit account and the
# longest region name: derived from the name itself, so the two cannot drift apart.
MAX_CAPTURE_ENDPOINT_NAME = 63 - len(_capture_bucket_name("", "0" * 12, "ap-southeast-2"))


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
    model=ModelProps(
        preset=GPT_OSS_20B,
        # Dev records 5% of what it serves (the team's own traffic) for `make train-drafter`: the records reach
        # S3 under capture/dev/ (peagle_constructs.capture_delivery). Staging and Prod record nothing.
        serving=GPT_OSS_20B.serving(**_bundle("dev"), num_speculative_tokens=7, max_model_len=8192, max_num_seqs=32,
                                    capture=CaptureConfig(sample_rate=0.05, stage="dev",
                                                          target=GPT_OSS_20B.served_model_name)),
    ),
    fleet=FleetProps(instance_type="ml.g6e.xlarge", instance_count=1, log_retention=logs.RetentionDays.ONE_YEAR,
                     removal_policy=RemovalPolicy.DESTROY),
    hosting=ComponentHosting(
        # An instance that holds no copy is released at once: an idle Dev bills no GPU.
        instance_scaling=InstanceScaling(min_instances=0, max_instances=2, scale_in=ScaleIn.idle_release()),
        scaling=CopyScaling(min_copies=0, max_copies=2),
        deployment=DeploymentPolicy.rolling(copies=1, bake=Duration.minutes(5)),
        allow_scale_to_zero=True,
    ),
    tags={"environment": "dev"},
)

STAGING = EnvironmentConfig(
    name="Staging",
    model=ModelProps(
        preset=GPT_OSS_20B,
        serving=GPT_OSS_20B.serving(**_bundle("staging"), num_speculative_tokens=7, max_model_len=16384,
                                    max_num_seqs=64),
        alarm_subscribers=(AlarmSubscriber.email("peagle-team@example.com"),),
    ),
    fleet=FleetProps(instance_type="ml.g6e.2xlarge", instance_count=2),
    hosting=SingleModelHosting(scaling=AutoscalingOptions(min_capacity=2, max_capacity=4),
                               deployment=DeploymentPolicy.linear(percent=50, bake=Duration.minutes(10))),
    require_pinned_weights=True,
    tags={"environment": "staging"},
)

PROD = EnvironmentConfig(
    name="Prod",
    model=ModelProps(
        preset=GPT_OSS_20B,
        serving=GPT_OSS_20B.serving(**_bundle("prod"), num_speculative_tokens=7, max_model_len=16384, max_num_seqs=64),
        alarm_thresholds=AlarmThresholds(ttft_p90_ms=1500.0),
        # This organisation's on-call address and pager webhook: replace with yours.
        alarm_subscribers=(AlarmSubscriber.email("peagle-oncall@example.com"),
                           AlarmSubscriber.https("https://events.pagerduty.example.com/integration/peagle-prod/enqueue")),
    ),
    # When g6e has no capacity, the same model on the next GPU that holds it; each costs more than the one before
    # it (an L40S with more host CPU and memory, an RTX PRO 6000, an H100), so Prod pays more only when it must.
    fleet=FleetProps(instance_type="ml.g6e.2xlarge", instance_count=4,
                     fallback_instances=(InstancePool(instance_type="ml.g6e.4xlarge"),
                                         InstancePool(instance_type="ml.g7e.2xlarge"),
                                         InstancePool(instance_type="ml.p5.4xlarge")),
                     provision_timeout=Duration.minutes(30)),
    hosting=SingleModelHosting(scaling=AutoscalingOptions(min_capacity=4, max_capacity=12),
                               deployment=DeploymentPolicy.canary(instances=1, bake=Duration.minutes(15))),
    require_subscribers=True,
    require_pinned_weights=True,
    tags={"environment": "prod"},
)

ENVIRONMENTS: tuple[EnvironmentConfig, ...] = (DEV, STAGING, PROD)
