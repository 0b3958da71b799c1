"""The post-deploy check that an endpoint serves what its stack deployed, both ways, on the embedded AWS.

A failed SageMaker update rolls back and leaves the endpoint InService on its old configuration; here that
state is made by hand in moto (an endpoint moved back to an earlier endpoint config, a component back to an
earlier model), since moto never fails an update by itself.
"""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends

from ops import live_config
from harness.aws.inference_components import inference_component_backends

pytestmark = [pytest.mark.usefixtures("moto_region"), pytest.mark.filterwarnings("ignore:Tried to parse AWS.CDK.Metadata")]


def _deploy(session: boto3.Session, stack) -> None:  # noqa: ANN001 - ops.cdk.StackArtifact
    session.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String")
    cfn = session.client("cloudformation")
    cfn.create_stack(StackName=stack.stack_name, TemplateBody=stack.template_path.read_text(),
                     Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"])
    assert cfn.describe_stacks(StackName=stack.stack_name)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"


def test_an_endpoint_that_rolled_back_is_caught_naming_both_configs(stage_stacks, moto_region):
    (stack,) = stage_stacks["Staging"]
    with mock_aws():
        session = boto3.Session(region_name=moto_region)
        _deploy(session, stack)
        assert live_config.mismatches(session, stack.stack_name) == []  # as deployed: nothing to say

        sm = session.client("sagemaker")
        deployed = sm.describe_endpoint(EndpointName="peagle-staging")["EndpointConfigName"]
        variants = sm.describe_endpoint_config(EndpointConfigName=deployed)["ProductionVariants"]
        sm.create_endpoint_config(EndpointConfigName="peagle-staging-previous", ProductionVariants=[
            {k: v for k, v in variant.items() if k in ("VariantName", "ModelName", "InstanceType",
                                                       "InitialInstanceCount")} for variant in variants])
        # What SageMaker leaves after a failed update: InService, on the configuration it had before.
        sagemaker_backends[DEFAULT_ACCOUNT_ID][moto_region].endpoints["peagle-staging"].endpoint_config_name = \
            "peagle-staging-previous"
        (problem,) = live_config.mismatches(session, stack.stack_name)
        assert "endpoint peagle-staging (InService) serves endpoint config 'peagle-staging-previous'" in problem
        assert f"the stack deployed {deployed!r}" in problem


def test_a_component_on_another_model_is_caught(stage_stacks, moto_region):
    (stack,) = stage_stacks["Dev"]
    with mock_aws():
        session = boto3.Session(region_name=moto_region)
        _deploy(session, stack)
        assert live_config.mismatches(session, stack.stack_name) == []

        record = inference_component_backends[DEFAULT_ACCOUNT_ID][moto_region].components["peagle-dev-gpt-oss-20b"]
        deployed = record.specification["ModelName"]
        record.specification = {**record.specification, "ModelName": "gpt-oss-previous",
                                "ComputeResourceRequirements": {
                                    **record.specification["ComputeResourceRequirements"], "MinMemoryRequiredInMb": 1024}}
        problems = live_config.mismatches(session, stack.stack_name)
        assert len(problems) == 2, problems
        assert f"serves model 'gpt-oss-previous', but the stack deployed {deployed!r}" in problems[0]
        assert "ComputeResourceRequirements" in problems[1] and "'MinMemoryRequiredInMb': 1024" in problems[1]


def _model_environment(stack) -> dict[str, str]:  # noqa: ANN001 - ops.cdk.StackArtifact
    (model,) = [r for r in stack.template()["Resources"].values() if r["Type"] == "AWS::SageMaker::Model"]
    return model["Properties"]["PrimaryContainer"]["Environment"]


@pytest.mark.parametrize(("stage", "endpoint", "component"), [
    ("Staging", "peagle-staging", None), ("Dev", "peagle-dev", "peagle-dev-gpt-oss-20b")])
def test_the_container_statement_is_judged_against_the_model_the_endpoint_serves(stage_stacks, moto_region,
                                                                                   stage, endpoint, component):
    """The deployed model's environment is found through SageMaker's Describe calls (endpoint -> endpoint config ->
    variant's model, or the component's model); a statement that matches it passes, another is named."""
    from peagle_contract.served_config import ServedConfig, expected_from_environment
    from peagle_contract.serving import DRAFTER_MODEL_DIR

    (stack,) = stage_stacks[stage]
    with mock_aws():
        session = boto3.Session(region_name=moto_region)
        _deploy(session, stack)
        environment = live_config.deployed_environment(session.client("sagemaker"), endpoint, component)
    assert environment == _model_environment(stack)
    as_deployed = expected_from_environment(environment).render()
    assert live_config.served_mismatches(as_deployed, environment) == (expected_from_environment(environment), [])
    elsewhere = ServedConfig(k=4, drafter=DRAFTER_MODEL_DIR, method="eagle3", parallel_drafting=True,
                             vllm="0.32.0+cpu").render()
    _, problems = live_config.served_mismatches(elsewhere, environment)
    assert problems == ["k: the container runs 4, the stack deployed 7"]
    _, problems = live_config.served_mismatches(None, environment)
    assert len(problems) == 1 and "absent" in problems[0]
