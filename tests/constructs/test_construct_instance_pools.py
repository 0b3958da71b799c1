"""A capacity fallback ladder: the instance types a fleet falls back to, each checked like the primary."""

from __future__ import annotations

import pytest
from aws_cdk import Duration
from aws_cdk.assertions import Template

from peagle_constructs import (
    ConfigError, FleetProps, InstancePool, ModelProps, PEagleComponentEndpoint, PEagleEndpoint,
)
from peagle_constructs.presets import GPT_OSS_20B
from tests.constructs.construct_helpers import one, resources

LADDER = (InstancePool(instance_type="ml.g6e.4xlarge"), InstancePool(instance_type="ml.p5.4xlarge"))


def _variant(stack) -> dict:
    _, config = one(Template.from_stack(stack), "AWS::SageMaker::EndpointConfig")
    (variant,) = config["Properties"]["ProductionVariants"]
    return variant


def test_the_ladder_replaces_the_instance_type_with_pools_in_priority_order(stack, serving, image):
    PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image, fleet=FleetProps(
        instance_type="ml.g6e.2xlarge", fallback_instances=LADDER, provision_timeout=Duration.minutes(20)))
    variant = _variant(stack)
    assert "InstanceType" not in variant
    assert variant["InstancePools"] == [{"InstanceType": "ml.g6e.2xlarge", "Priority": 1},
                                        {"InstanceType": "ml.g6e.4xlarge", "Priority": 2},
                                        {"InstanceType": "ml.p5.4xlarge", "Priority": 3}]
    assert variant["VariantInstanceProvisionTimeoutInSeconds"] == 1200


def test_a_fleet_without_a_ladder_names_its_one_instance_type(stack, serving, image):
    PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                   fleet=FleetProps(instance_type="ml.g6e.2xlarge"))
    variant = _variant(stack)
    assert variant["InstanceType"] == "ml.g6e.2xlarge"
    assert "InstancePools" not in variant and "VariantInstanceProvisionTimeoutInSeconds" not in variant


def test_a_pool_with_its_own_tensor_parallelism_serves_a_model_of_its_own(stack, serving, image):
    from dataclasses import replace

    two_gpus = replace(serving, tensor_parallel_size=2)
    endpoint = PEagleEndpoint(stack, "Serving", model=ModelProps(serving=two_gpus), image=image, fleet=FleetProps(
        instance_type="ml.g6e.12xlarge",
        fallback_instances=(InstancePool(instance_type="ml.g7e.2xlarge", tensor_parallel_size=1),
                            InstancePool(instance_type="ml.g6e.24xlarge"))))
    template = Template.from_stack(stack)
    models = {model_id: model["Properties"]["PrimaryContainer"]["Environment"]["SM_VLLM_TENSOR_PARALLEL_SIZE"]
              for model_id, model in resources(template, "AWS::SageMaker::Model").items()}
    assert sorted(models.values()) == ["1", "2"]
    (override_id,) = [model_id for model_id, tp in models.items() if tp == "1"]
    pools = _variant(stack)["InstancePools"]
    assert pools[1] == {"InstanceType": "ml.g7e.2xlarge", "Priority": 2,
                        "ModelNameOverride": {"Fn::GetAtt": [override_id, "ModelName"]}}
    assert "ModelNameOverride" not in pools[2]  # the same tensor parallelism: the variant's own model
    assert endpoint.pool_models[0].serving.tensor_parallel_size == 1


@pytest.mark.parametrize(("fleet", "field", "allowed"), [
    (FleetProps(instance_type="ml.g6e.2xlarge", fallback_instances=tuple(
        InstancePool(instance_type=f"ml.g6e.{size}") for size in ("4xlarge", "8xlarge", "12xlarge", "16xlarge",
                                                                  "24xlarge"))),
     "fallback_instances", "at most 4"),
    (FleetProps(instance_type="ml.g6e.2xlarge", fallback_instances=(InstancePool(instance_type="ml.g6e.2xlarge"),)),
     "fallback_instances[0].instance_type", "already in the ladder"),
    (FleetProps(instance_type="ml.g6e.2xlarge", fallback_instances=(InstancePool(instance_type="ml.c5.xlarge"),)),
     "fallback_instances[0].instance_type", "not a known GPU family"),
    (FleetProps(instance_type="ml.g6e.2xlarge", fallback_instances=("ml.g6e.4xlarge",)),
     "fallback_instances", "a tuple of InstancePool"),
    (FleetProps(instance_type="ml.g6e.2xlarge", provision_timeout=Duration.minutes(10)),
     "provision_timeout", "only with fallback_instances"),
    (FleetProps(instance_type="ml.g6e.2xlarge", fallback_instances=LADDER, provision_timeout=Duration.minutes(2)),
     "provision_timeout", "300..3600"),
    (FleetProps(instance_type="ml.g6e.2xlarge", fallback_instances=(
        InstancePool(instance_type="ml.g6e.4xlarge", tensor_parallel_size=2),)),
     "fallback_instances[0].tensor_parallel_size", "1..1"),
    (FleetProps(instance_type="ml.p5.4xlarge", fallback_instances=(InstancePool(instance_type="ml.g6e.4xlarge"),),
                encrypt_volume=True), "encryption_key", "ml.g6e.4xlarge"),
])
def test_a_bad_ladder_fails_at_synth_naming_the_pool(stack, serving, image, fleet, field, allowed):
    with pytest.raises(ConfigError) as caught:
        PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image, fleet=fleet)
    assert caught.value.field_name == field and allowed in str(caught.value), str(caught.value)


def test_every_pool_must_hold_the_serving_tensor_parallelism(stack, serving, image):
    from dataclasses import replace

    with pytest.raises(ConfigError, match=r"^serving.tensor_parallel_size: got 2 but ml.g6e.4xlarge has 1 GPU"):
        PEagleEndpoint(stack, "Serving", model=ModelProps(serving=replace(serving, tensor_parallel_size=2)),
                       image=image, fleet=FleetProps(instance_type="ml.g6e.12xlarge", fallback_instances=(
                           InstancePool(instance_type="ml.g6e.4xlarge"),)))


def test_the_preset_judges_every_pool(stack, image):
    serving = GPT_OSS_20B.serving(target_model="s3://peagle-weights/b/target/",
                                  drafter_model="s3://peagle-weights/b/drafter/", max_model_len=8192)
    with pytest.raises(ConfigError) as caught:
        PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving, preset=GPT_OSS_20B), image=image,
                       fleet=FleetProps(instance_type="ml.g6e.2xlarge", fallback_instances=(
                           InstancePool(instance_type="ml.g7e.2xlarge"), InstancePool(instance_type="ml.g5.2xlarge"))))
    assert caught.value.field_name == "preset.fallback_instances[1].instance_type", str(caught.value)
    assert "allowed for GPT-OSS-20B" in str(caught.value)


def test_a_fleet_of_inference_components_refuses_a_ladder(stack):
    with pytest.raises(ConfigError, match=r"^fallback_instances: not supported on a fleet of inference components"):
        PEagleComponentEndpoint(stack, "Fleet", fleet=FleetProps(instance_type="ml.g6e.xlarge",
                                                                 fallback_instances=LADDER))
