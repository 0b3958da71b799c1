from __future__ import annotations

import pytest

from peagle_contract.serving import ServingConfig

IMAGE_URI = "222222222222.dkr.ecr.us-west-2.amazonaws.com/team/peagle:v1"
BUNDLE = "s3://models-bucket/bundles/llama-p-eagle"


@pytest.fixture
def serving() -> ServingConfig:
    return ServingConfig(target_model=f"{BUNDLE}/target/", drafter_model=f"{BUNDLE}/drafter/", num_speculative_tokens=5)


@pytest.fixture
def stack():
    """A fresh stack in a known account and region (the construct tests each build their own)."""
    from aws_cdk import App, Environment, Stack

    return Stack(App(), "Test", env=Environment(account="333333333333", region="eu-west-1"))


@pytest.fixture
def image():
    from peagle_constructs import ContainerImage

    return ContainerImage.from_uri(IMAGE_URI)


@pytest.fixture
def endpoint(stack, serving, image):
    """A PEagleEndpoint of four instances deployed by canary: what the composite's tests read."""
    from aws_cdk import Duration

    from peagle_constructs import DeploymentPolicy, FleetProps, ModelProps, PEagleEndpoint

    return PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                          fleet=FleetProps(instance_type="ml.g6e.12xlarge", instance_count=4),
                          deployment=DeploymentPolicy.canary(percent=25, bake=Duration.minutes(12)))


@pytest.fixture
def template(stack, endpoint):
    from aws_cdk.assertions import Template

    return Template.from_stack(stack)
