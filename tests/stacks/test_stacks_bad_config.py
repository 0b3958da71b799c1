"""Bad configuration fails at synth, with a message that names the field and what is allowed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aws_cdk import App, Duration

from peagle_constructs import (
    AlarmThresholds, AutoscalingOptions, CaptureConfig, ComputeRequirements, CopyScaling, DeploymentPolicy, DetailedObservability,
    InstancePool, InstanceScaling, ServingConfigError,
)
from stacks.application import OFFLINE, build_app
from stacks.environments import DEV, PROD, STAGING, ComponentHosting


def serving(**changes):
    return lambda: model(serving=replace(DEV.model.serving, **changes))()


def model(env=DEV, **changes):
    return lambda: [replace(env, model=replace(env.model, **changes))]


def fleet(env=DEV, **changes):
    return lambda: [replace(env, fleet=replace(env.fleet, **changes))]


def hosting(env=DEV, **changes):
    return lambda: [replace(env, hosting=replace(env.hosting, **changes))]


def dev(**changes):
    return lambda: [replace(DEV, **changes)]


# (case, environments to build, field named first in the message, text naming what is allowed)
CASES = [
    ("k-too-large", serving(num_speculative_tokens=33), "num_speculative_tokens", "1..32"),
    ("k-zero", serving(num_speculative_tokens=0), "num_speculative_tokens", "1..32"),
    ("parallel-drafting-off", serving(parallel_drafting=False), "parallel_drafting", "must be true"),
    ("min-above-max", hosting(STAGING, scaling=AutoscalingOptions(min_capacity=3, max_capacity=2)),
     "scaling.min_capacity", "min_capacity <= max_capacity"),
    ("startup-timeout-short", fleet(container_startup_health_check_timeout=Duration.seconds(30)),
     "container_startup_health_check_timeout", "60..3600"),
    ("download-timeout-long", fleet(model_data_download_timeout=Duration.hours(2)),
     "model_data_download_timeout", "60..3600"),
    ("canary-larger-than-fleet", hosting(PROD, deployment=DeploymentPolicy.canary(instances=4)),
     "deployment.instances", "1..2"),
    ("canary-on-single-instance", lambda: [replace(
        STAGING, fleet=replace(STAGING.fleet, instance_count=1), hosting=replace(
            STAGING.hosting, deployment=DeploymentPolicy.canary(instances=1),
            scaling=AutoscalingOptions(min_capacity=1, max_capacity=4)))],
     "deployment.instances", "all_at_once"),
    ("linear-percent-too-large", hosting(STAGING, deployment=DeploymentPolicy.linear(percent=80)),
     "deployment.percent", "10..50"),
    ("kms-on-nvme-instance", fleet(encrypt_volume=True), "encryption_key", "allowed: None"),
    ("hf-id-with-network-isolation", serving(target_model="openai/gpt-oss-20b"),
     "serving.target_model", "network_isolation=False"),
    ("missing-target-weights", serving(target_model=""), "target_model", "s3://bucket/prefix/"),
    ("missing-drafter-weights", serving(drafter_model=""), "drafter_model", "s3://bucket/prefix/"),
    ("drafter-in-other-bucket", serving(drafter_model="s3://elsewhere/drafter/"), "drafter_model", "same bucket"),
    ("malformed-instance-type", fleet(instance_type="g6e.xlarge"), "instance_type", "ml.<family>.<size>"),
    ("unknown-instance-family", fleet(instance_type="ml.c5.xlarge"), "instance_type", "g6e"),
    ("tensor-parallel-above-gpus", serving(tensor_parallel_size=2), "Dev.tensor_parallel_size", "uses 1"),
    ("tensor-parallel-above-gpus-without-preset", model(preset=None, serving=replace(
        DEV.model.serving, tensor_parallel_size=2)), "serving.tensor_parallel_size", "at most"),
    ("tensor-parallel-above-gpus-single-model", model(STAGING, preset=None, serving=replace(
        STAGING.model.serving, tensor_parallel_size=2)), "serving.tensor_parallel_size", "at most"),
    # The preset's checks: the head's trained K, the instances it fits, the memory arithmetic.
    ("k-above-the-heads-trained-k", serving(num_speculative_tokens=11), "Dev.num_speculative_tokens",
     "trained for K up to 10; allowed: 1..10"),
    ("instance-the-preset-does-not-fit", fleet(instance_type="ml.g5.xlarge"), "Dev.instance_type",
     "allowed for GPT-OSS-20B"),
    ("kv-cache-does-not-fit", serving(max_num_seqs=512), "Dev.max_num_seqs", "does not fit ml.g6e.xlarge"),
    ("context-beyond-the-model", serving(max_model_len=262144), "Dev.max_model_len", "at most 131072"),
    ("fleet-outside-scaling-range", fleet(STAGING, instance_count=5), "instance_count", "min_capacity..max_capacity"),
    # Inference components (Dev): the fleet, the copies, the reservation, the floors.
    ("fleet-outside-instance-scaling", fleet(instance_count=3), "instance_count", "instance_scaling's bounds"),
    ("instance-min-above-max", hosting(instance_scaling=InstanceScaling(min_instances=3, max_instances=2)),
     "instance_scaling.min_instances", "min_instances <= max_instances"),
    ("copies-above-the-fleets-accelerators", hosting(scaling=CopyScaling(min_copies=0, max_copies=3)),
     "scaling.max_copies", "at most 2"),
    ("initial-copies-above-the-fleet", hosting(copy_count=3), "copy_count", "1..2"),
    ("created-with-no-copy", hosting(copy_count=0), "copy_count", "starts with a copy"),
    ("copy-min-above-max", hosting(scaling=CopyScaling(min_copies=2, max_copies=1)),
     "scaling.min_copies", "min_copies <= max_copies"),
    ("reservation-the-instance-cannot-hold", hosting(compute=ComputeRequirements(memory_mib=64 * 1024)),
     "compute.memory_mib", "128..32768"),
    ("more-cores-than-the-instance", hosting(compute=ComputeRequirements(cpu_cores=6)),
     "compute.cpu_cores", "0.25..4"),
    ("blue-green-for-a-component", hosting(deployment=DeploymentPolicy.canary(percent=10)),
     "deployment.mode", "rolling"),
    ("hosting-of-another-type", dev(hosting=AutoscalingOptions()), "Dev.hosting", "SingleModelHosting"),
    ("zero-floor-where-forbidden", hosting(allow_scale_to_zero=False),
     "Dev.hosting.instance_scaling.min_instances", "floor above zero"),
    ("zero-copies-where-forbidden", lambda: [replace(STAGING, hosting=ComponentHosting(
        instance_scaling=InstanceScaling(min_instances=1, max_instances=4), scaling=CopyScaling(min_copies=0)))],
     "Staging.hosting.scaling.min_copies", "floor above zero"),
    ("single-model-without-autoscaling", hosting(STAGING, scaling=None), "Staging.hosting.scaling",
     "AutoscalingOptions"),
    ("single-model-without-deployment", hosting(STAGING, deployment=None), "Staging.hosting.deployment",
     "a DeploymentPolicy"),
    ("model-props-of-another-type", dev(model=DEV.model.serving), "Dev.model", "a ModelProps"),
    ("duplicate-environment-name", lambda: [DEV, STAGING, replace(PROD, name="Dev")],
     "environments[2].name", "not used by another environment"),
    ("environment-name-case-clash", lambda: [DEV, replace(STAGING, name="dev")],
     "environments[1].name", "case-insensitive"),
    ("bad-environment-name", lambda: [replace(DEV, name="dev env")], "environment.name", "letters and digits"),
    ("prod-with-nobody-to-tell", model(PROD, alarm_subscribers=()), "Prod.model.alarm_subscribers",
     "at least one AlarmSubscriber"),
    ("long-extra-arg", serving(extra_args={"chat_template": "{{ x }}" * 200}), "extra_args['chat_template']",
     "at most 1024"),
    ("two-bundles-share-a-prefix", serving(drafter_model="s3://peagle-weights-dev/bundles/other/drafter/"),
     "target_model", "one folder below it"),
    ("bad-weights-key", dev(weights_key_arn="alias/weights"), "Dev.weights_key_arn", "a KMS key ARN"),
    # With capture on the stage's bucket is named for it, its account and region: 63 characters at most.
    ("capturing-stage-name-too-long-for-its-bucket", lambda: [replace(DEV, name="DevelopmentSandboxNumberOne")],
     "DevelopmentSandboxNumberOne.name", "at most 20 with capture on"),
    # A capture that names another stage would pass Dev's traffic off as Prod's to the drafter's trainer.
    ("capture-of-another-stage", serving(capture=CaptureConfig(sample_rate=0.1, stage="prod", target="gpt-oss-20b")),
     "Dev.model.serving.capture.stage", "'dev', this environment's own"),
    ("capture-of-another-target", serving(capture=CaptureConfig(sample_rate=0.1, stage="dev", target="qwen3-8b")),
     "Dev.model.serving.capture.target", "'gpt-oss-20b', the target the GPT-OSS-20B preset serves"),
    ("rolling-batch-too-large", hosting(PROD, deployment=DeploymentPolicy.rolling(percent=75)),
     "deployment.percent", "5..50"),
    ("publish-frequency", fleet(detailed_observability=DetailedObservability(publish_frequency=Duration.seconds(15))),
     "detailed_observability.publish_frequency", "10, 30, 60"),
    # Prod's capacity ladder: every pool is judged like the primary.
    ("ladder-pool-the-preset-does-not-fit", fleet(PROD, fallback_instances=(InstancePool(instance_type="ml.g5.2xlarge"),)),
     "Prod.fallback_instances[0].instance_type", "allowed for GPT-OSS-20B"),
    ("ladder-pool-twice", fleet(PROD, fallback_instances=(InstancePool(instance_type="ml.g7e.2xlarge"),
                                                          InstancePool(instance_type="ml.g7e.2xlarge"))),
     "fallback_instances[1].instance_type", "already in the ladder"),
    ("ladder-timeout-too-long", fleet(PROD, provision_timeout=Duration.hours(2)), "provision_timeout", "300..3600"),
    ("tpot-threshold-zero", model(alarm_thresholds=AlarmThresholds(tpot_p90_ms=0)), "alarm_thresholds.tpot_p90_ms", "positive"),
]


@pytest.mark.parametrize(("make_environments", "field", "allowed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_configuration_fails_at_synth(make_environments, field, allowed):
    with pytest.raises(ServingConfigError) as caught:
        build_app(App(context=OFFLINE), make_environments(), nag=False)
    message = str(caught.value)
    assert caught.value.field_name == field, message
    assert message.startswith(f"{field}: "), message
    assert allowed in message, message


def test_the_good_configuration_builds():
    """The control for the table: the unchanged environments build without error."""
    stages = build_app(App(context=OFFLINE), [DEV, STAGING, PROD], nag=False)
    assert sorted(stages) == ["Dev", "Prod", "Staging"]
