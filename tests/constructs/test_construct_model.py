"""PEagleModel: no physical name, isolation on, the contract's environment, a least-privilege role."""

from __future__ import annotations

import json

import pytest
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Template

from peagle_constructs import ConfigError, ContainerImage, PEagleModel, ServingConfig
from tests.constructs.conftest import BUNDLE, IMAGE_URI
from tests.constructs.construct_helpers import as_text, one, statements


def test_model_defaults(stack, serving, image):
    PEagleModel(stack, "Model", serving=serving, image=image)
    template = Template.from_stack(stack)
    _, model = one(template, "AWS::SageMaker::Model")
    props = model["Properties"]
    assert "ModelName" not in props  # CloudFormation replaces models: a fixed name would clash
    assert props["EnableNetworkIsolation"] is True
    container = props["PrimaryContainer"]
    assert container["Image"] == IMAGE_URI
    assert container["ModelDataSource"]["S3DataSource"] == {
        "S3Uri": f"{BUNDLE}/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    env = container["Environment"]
    assert env == serving.to_environment(target_dir="/opt/ml/model/target", drafter_dir="/opt/ml/model/drafter")
    assert json.loads(env["SM_VLLM_SPECULATIVE_CONFIG"])["model"] == "/opt/ml/model/drafter"
    assert model["DependsOn"] and "ExecutionPolicy" in model["DependsOn"][0]


def test_execution_role_is_least_privilege(stack, serving, image):
    log_group = logs.LogGroup(stack, "Logs", log_group_name="/aws/sagemaker/Endpoints/x")
    PEagleModel(stack, "Model", serving=serving, image=image, log_group=log_group)
    template = Template.from_stack(stack)
    _, role = one(template, "AWS::IAM::Role")
    assert "ManagedPolicyArns" not in role["Properties"]  # never AmazonSageMakerFullAccess
    assert "Policies" not in role["Properties"]  # no inline policy (HIPAA/NIST/PCI IAMNoInlinePolicy)
    assert as_text(role["Properties"]["AssumeRolePolicyDocument"]).count("sagemaker.amazonaws.com") == 1
    template.resource_count_is("AWS::IAM::Policy", 0)
    _, policy = one(template, "AWS::IAM::ManagedPolicy")
    by_action = {as_text(s["Action"]): s for s in statements(policy)}
    assert as_text(by_action['"s3:GetObject"']["Resource"]).endswith(':s3:::models-bucket/bundles/llama-p-eagle/*"]]}')
    owner = {"StringEquals": {"s3:ResourceAccount": "333333333333"}}  # the stack's own account by default
    assert by_action['"s3:GetObject"']["Condition"] == owner
    assert by_action['"s3:ListBucket"']["Condition"] == {"StringLike": {"s3:prefix": ["bundles/llama-p-eagle/*"]},
                                                         **owner}
    pull = by_action[as_text(["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"])]
    assert as_text(pull["Resource"]).endswith(':ecr:us-west-2:222222222222:repository/team/peagle"]]}')
    logs_statement = by_action[as_text(["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                                        "logs:DescribeLogStreams"])]
    log_group_id, _ = one(template, "AWS::Logs::LogGroup")
    assert logs_statement["Resource"] == {"Fn::GetAtt": [log_group_id, "Arn"]}  # that group only
    assert by_action['"cloudwatch:PutMetricData"']["Condition"]["StringEquals"] == {
        "cloudwatch:namespace": "/aws/sagemaker/Endpoints"}
    every_action = {a for s in statements(policy) for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not any(a.endswith("*") for a in every_action), every_action
    wildcard_resources = [s["Action"] for s in statements(policy) if s["Resource"] == "*"]
    assert sorted(wildcard_resources) == ["cloudwatch:PutMetricData", "ecr:GetAuthorizationToken"]


def test_asset_image_pulls_from_the_asset_repository_only(stack, serving, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    PEagleModel(stack, "Model", serving=serving, image=ContainerImage.from_asset(str(tmp_path)))
    template = Template.from_stack(stack)
    _, policy = one(template, "AWS::IAM::ManagedPolicy")
    pull = [s for s in statements(policy) if "ecr:BatchGetImage" in s["Action"]]
    assert len(pull) == 1
    assert "container-assets-333333333333-eu-west-1" in as_text(pull[0]["Resource"])
    _, model = one(template, "AWS::SageMaker::Model")
    assert "container-assets-333333333333-eu-west-1" in as_text(model["Properties"]["PrimaryContainer"]["Image"])


def test_hugging_face_ids_need_isolation_off(stack, image):
    hub = ServingConfig(target_model="openai/gpt-oss-20b", drafter_model="amazon/GPT-OSS-20B-P-EAGLE")
    with pytest.raises(ConfigError, match=r"^serving.target_model: .*network_isolation=False"):
        PEagleModel(stack, "Isolated", serving=hub, image=image)
    PEagleModel(stack, "Open", serving=hub, image=image, network_isolation=False)
    _, model = one(Template.from_stack(stack), "AWS::SageMaker::Model")
    container = model["Properties"]["PrimaryContainer"]
    assert "ModelDataSource" not in container and model["Properties"]["EnableNetworkIsolation"] is False
    assert container["Environment"]["SM_VLLM_MODEL"] == "openai/gpt-oss-20b"


def test_drafter_inside_the_target_prefix(stack, image):
    nested = ServingConfig(target_model="s3://b-1/m/", drafter_model="s3://b-1/m/drafter/")
    model = PEagleModel(stack, "Model", serving=nested, image=image)
    assert (model.layout.target_dir, model.layout.drafter_dir) == ("/opt/ml/model", "/opt/ml/model/drafter")
    assert model.layout.source.uri == "s3://b-1/m/"


@pytest.mark.parametrize(("target", "drafter", "message"), [
    ("s3://b-1/a/", "s3://b-2/a/drafter/", "same bucket"),
    ("s3://b-1/target/", "s3://b-1/drafter/", "share no prefix"),
    ("s3://b-1/m/", "s3://b-1/m/", "its own folder"),
])
def test_weight_layouts_that_cannot_be_one_model_data_source(stack, image, target, drafter, message):
    with pytest.raises(ConfigError, match=f"^drafter_model: .*{message}"):
        PEagleModel(stack, "Model", serving=ServingConfig(target_model=target, drafter_model=drafter), image=image)


@pytest.mark.parametrize(("target", "drafter", "field"), [
    # Two bundles in one bucket share bundles/: SageMaker would copy every bundle there, and the role read it.
    ("s3://b-1/bundles/a/target/", "s3://b-1/bundles/b/drafter/", "target_model"),
    ("s3://b-1/bundles/m/target/", "s3://b-1/bundles/m/heads/k7/drafter/", "drafter_model"),
])
def test_a_shared_prefix_more_than_one_folder_up_is_refused(stack, image, target, drafter, field):
    with pytest.raises(ConfigError, match=rf"^{field}: .*folders below the prefix it shares"):
        PEagleModel(stack, "Model", serving=ServingConfig(target_model=target, drafter_model=drafter), image=image)


def test_the_merged_environment_keeps_to_sagemakers_limits(stack, serving, image):
    with pytest.raises(ConfigError, match=r"^environment\['EXTRA'\]: is 1025 characters; allowed: at most 1024"):
        PEagleModel(stack, "Model", serving=serving, image=image, environment={"EXTRA": "x" * 1025})


def test_vllm_flags_only_through_the_serving_config(stack, serving, image):
    with pytest.raises(ConfigError, match=r"^environment\['SM_VLLM_MAX_MODEL_LEN'\]: .*extra_args"):
        PEagleModel(stack, "Model", serving=serving, image=image, environment={"SM_VLLM_MAX_MODEL_LEN": "1"})


@pytest.mark.parametrize("uri", [
    "docker.io/vllm/vllm-openai:v0.32.0",
    "222222222222.dkr.ecr.us-west-2.amazonaws.com/peagle",  # no tag or digest
    "22222.dkr.ecr.us-west-2.amazonaws.com/peagle:v1",
])
def test_image_uri_must_be_ecr(uri):
    with pytest.raises(ConfigError, match=r"^image: .*ECR"):
        ContainerImage.from_uri(uri)


PIN = "9f" * 32


def _s3_reads(stack) -> dict[str, dict]:
    _, policy = one(Template.from_stack(stack), "AWS::IAM::ManagedPolicy")
    return {s["Action"]: s for s in statements(policy) if s["Action"] in ("s3:GetObject", "s3:ListBucket")}


def test_a_pinned_bundle_is_all_the_model_may_read_and_only_from_the_owners_bucket(stack, image):
    """Content addressing makes the pinned prefix .../<digest>/: SageMaker copies it, the role reads only it, and
    only from a bucket the weights account owns (bucket names are global: the same name elsewhere is refused)."""
    pinned = ServingConfig(target_model=f"s3://models-bucket/bundles/llama/{PIN}/target/",
                           drafter_model=f"s3://models-bucket/bundles/llama/{PIN}/drafter/", bundle_manifest_sha256=PIN)
    model = PEagleModel(stack, "Model", serving=pinned, image=image, weights_account="444444444444")
    assert model.layout.source.uri == f"s3://models-bucket/bundles/llama/{PIN}/"
    reads = _s3_reads(stack)
    assert as_text(reads["s3:GetObject"]["Resource"]).endswith(f':s3:::models-bucket/bundles/llama/{PIN}/*"]]}}')
    assert reads["s3:GetObject"]["Condition"] == {"StringEquals": {"s3:ResourceAccount": "444444444444"}}
    assert reads["s3:ListBucket"]["Condition"] == {"StringLike": {"s3:prefix": [f"bundles/llama/{PIN}/*"]},
                                                   "StringEquals": {"s3:ResourceAccount": "444444444444"}}


def test_an_environment_agnostic_stack_conditions_on_its_deploy_time_account(image, serving):
    from aws_cdk import App, Stack

    stack = Stack(App(), "Agnostic")
    PEagleModel(stack, "Model", serving=serving, image=image)
    assert _s3_reads(stack)["s3:GetObject"]["Condition"] == {"StringEquals": {"s3:ResourceAccount": {"Ref": "AWS::AccountId"}}}


def test_the_weights_account_reaches_the_model_through_model_props(stack, serving, image):
    from peagle_constructs import FleetProps, ModelProps, PEagleEndpoint

    PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving, weights_account="555555555555"), image=image,
                   fleet=FleetProps(instance_type="ml.g6e.12xlarge", instance_count=1))
    assert _s3_reads(stack)["s3:GetObject"]["Condition"] == {"StringEquals": {"s3:ResourceAccount": "555555555555"}}


@pytest.mark.parametrize("account", ["12345", "1234567890123", "abcdefghijkl", ""])
def test_a_weights_account_that_is_not_an_account_id_is_refused(stack, serving, image, account):
    with pytest.raises(ConfigError, match=r"^weights_account: got .*; allowed: the 12-digit id"):
        PEagleModel(stack, "Model", serving=serving, image=image, weights_account=account)
