"""The three environments: one Stage each, one stack `PEagle` each, and the defaults each stage serves with."""

from __future__ import annotations

import json

import pytest

from peagle_constructs import ServingConfigError
from stacks.application import OFFLINE, OFFLINE_ACCOUNT, OFFLINE_REGION
from stacks.environments import ENVIRONMENTS, PROD, STAGING
from tests.stacks.template_helpers import STAGES, only


def test_every_environment_is_a_stage_with_one_peagle_stack(synthesized_app):
    assert tuple(synthesized_app.stages) == STAGES == tuple(e.name for e in ENVIRONMENTS)
    for name, stage in synthesized_app.stages.items():
        stacks = [s for s in stage.node.children if hasattr(s, "template_file")]
        assert [s.node.path for s in stacks] == [f"{name}/PEagle"]
        nested = synthesized_app.assembly.get_nested_assembly(f"assembly-{name}")
        assert [s.hierarchical_id for s in nested.stacks] == [f"{name}/PEagle"]


IMAGE = {"imageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"}


@pytest.mark.parametrize(("context", "environ", "expected"), [
    ({}, {"CDK_DEFAULT_ACCOUNT": "555555555555", "CDK_DEFAULT_REGION": "eu-west-1"}, ("555555555555", "eu-west-1")),
    ({"account": "444444444444", "region": "eu-central-1"}, {"CDK_DEFAULT_ACCOUNT": "555555555555"},
     ("444444444444", "eu-central-1")),
    ({"account.Dev": "333333333333", "account": "444444444444", "region.Dev": "eu-north-1", "region": "eu-central-1"},
     {"CDK_DEFAULT_ACCOUNT": "555555555555"}, ("333333333333", "eu-north-1")),
    (OFFLINE, {}, (OFFLINE_ACCOUNT, OFFLINE_REGION)),
])
def test_account_and_region_from_the_stage_context_then_the_app_then_the_cli_then_an_explicit_offline_placeholder(
        monkeypatch, context, environ, expected):
    """One stage here: the rules that keep several apart are tests/stacks/test_stacks_isolation.py's."""
    from aws_cdk import App

    from stacks.application import build_app
    from stacks.environments import DEV

    for var in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    stages = build_app(App(context={**IMAGE, **context}), [DEV], nag=False)
    assert {(stage.account, stage.region) for stage in stages.values()} == {expected}
    # The environment's own account wins over all of them.
    from dataclasses import replace

    own = build_app(App(context={**IMAGE, **context}), [replace(DEV, account="666666666666")], nag=False)
    assert own["Dev"].account == "666666666666"


def test_synth_without_an_account_says_so_unless_offline(monkeypatch, tmp_path):
    """No silent made-up account in a template meant for a deploy; the placeholder only when asked for."""
    from aws_cdk import App
    from aws_cdk.cx_api import SynthesisMessageLevel

    from stacks.application import build_app

    for var in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ServingConfigError) as caught:
        build_app(App(context=IMAGE), nag=False)
    assert caught.value.field_name == "Dev.account" and "-c offline=true" in str(caught.value)
    app = App(context={**IMAGE, **OFFLINE}, outdir=str(tmp_path))
    build_app(app, nag=False)
    assembly = app.synth().get_nested_assembly("assembly-Dev")
    warnings = [m for stack in assembly.stacks for m in stack.messages if m.level == SynthesisMessageLevel.WARNING]
    assert any("placeholder account 111111111111" in str(m.entry.data) for m in warnings), warnings


@pytest.mark.parametrize("name", STAGES)
def test_endpoint_name_is_deterministic_per_stage(templates, name):
    _, endpoint = only(templates[name], "AWS::SageMaker::Endpoint")
    assert endpoint["Properties"]["EndpointName"] == f"peagle-{name.lower()}"
    groups = {g["Properties"]["LogGroupName"] for g in templates[name]["Resources"].values()
              if g["Type"] == "AWS::Logs::LogGroup"}
    component = next(env for env in ENVIRONMENTS if env.name == name).component_name
    assert groups == {f"/aws/sagemaker/Endpoints/peagle-{name.lower()}"} | (
        {f"/aws/sagemaker/InferenceComponents/{component}"} if component else set())


def test_endpoint_logical_id_is_pinned(templates):
    # Changing this id replaces every endpoint (downtime): update it only on purpose.
    for name in STAGES:
        logical_id, _ = only(templates[name], "AWS::SageMaker::Endpoint")
        assert logical_id == "ServingEndpoint6026893D"


def test_dev_serves_gpt_oss_20b_with_p_eagle_k7_on_one_gpu(templates):
    _, model = only(templates["Dev"], "AWS::SageMaker::Model")
    env = model["Properties"]["PrimaryContainer"]["Environment"]
    spec = json.loads(env["SM_VLLM_SPECULATIVE_CONFIG"])
    assert spec == {"method": "eagle3", "model": "/opt/ml/model/drafter", "num_speculative_tokens": 7,
                    "parallel_drafting": True}
    assert env["SM_VLLM_MODEL"] == "/opt/ml/model/target"
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert model["Properties"]["EnableNetworkIsolation"] is True
    source = model["Properties"]["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]
    assert source == {"S3Uri": "s3://peagle-weights-dev/bundles/gpt-oss-20b-p-eagle/", "S3DataType": "S3Prefix",
                      "CompressionType": "None"}
    _, config = only(templates["Dev"], "AWS::SageMaker::EndpointConfig")
    variant = config["Properties"]["ProductionVariants"][0]
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.g6e.xlarge", 1)


def test_weights_are_per_environment_prefixes(templates):
    uris = {name: only(templates[name], "AWS::SageMaker::Model")[1]["Properties"]["PrimaryContainer"]
            ["ModelDataSource"]["S3DataSource"]["S3Uri"] for name in STAGES}
    assert len(set(uris.values())) == 3
    assert all(uri.startswith(f"s3://peagle-weights-{name.lower()}/") for name, uri in uris.items())


def test_fleets_grow_and_prod_deploys_by_canary(templates):
    counts = {}
    for name in STAGES:
        _, config = only(templates[name], "AWS::SageMaker::EndpointConfig")
        counts[name] = config["Properties"]["ProductionVariants"][0]["InitialInstanceCount"]
    assert counts["Dev"] < counts["Staging"] < counts["Prod"]
    _, prod = only(templates["Prod"], "AWS::SageMaker::Endpoint")
    routing = prod["Properties"]["DeploymentConfig"]["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]
    assert routing["Type"] == "CANARY"
    assert routing["CanarySize"] == {"Type": "INSTANCE_COUNT", "Value": 1}
    assert routing["WaitIntervalInSeconds"] == PROD.hosting.deployment.bake.to_seconds() > 0
    _, staging = only(templates["Staging"], "AWS::SageMaker::Endpoint")
    assert staging["Properties"]["DeploymentConfig"]["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["Type"] \
        == STAGING.hosting.deployment.mode == "LINEAR"


@pytest.mark.parametrize("name", STAGES)
def test_rollback_alarms_are_the_stacks_metric_alarms_on_healthy_fleet_signals(templates, name):
    alarms = {logical_id: alarm["Properties"] for logical_id, alarm in templates[name]["Resources"].items()
              if alarm["Type"] == "AWS::CloudWatch::Alarm"}
    # What rolls out: the inference component where the stage serves one, else the endpoint.
    env = next(env for env in ENVIRONMENTS if env.name == name)
    _, rolled = only(templates[name], "AWS::SageMaker::InferenceComponent" if env.hosts_components else "AWS::SageMaker::Endpoint")
    rollback = {a["AlarmName"]["Ref"] for a in rolled["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]}
    assert rollback <= set(alarms) and len(rollback) <= 10
    names = {alarms[i]["AlarmName"].removeprefix(f"{env.component_name or env.endpoint_name}-") for i in rollback}
    assert names == {"TimePerOutputTokenP90", "Invocation5XXErrorRate"}  # signals no client can move at will
    # Whole-request latency and the PromQL alarms notify only.
    assert not any("PromQLCriteria" in str(alarms[i].get("EvaluationCriteria")) for i in rollback)
    assert "ModelLatencyP99" not in names


def test_default_image_is_the_runtime_dockerfile_asset_tagged_with_the_release(synthesized_app):
    from stacks.release import VERSION

    manifest = json.loads((synthesized_app.outdir / "assembly-Dev" /
                           f"{synthesized_app.stages['Dev'].stack.artifact_id}.assets.json").read_text())
    images = list(manifest["dockerImages"].values())
    assert len(images) == 1
    source = images[0]["source"]
    assert source["dockerFile"] == "Dockerfile"
    staged = synthesized_app.outdir / "assembly-Dev" / source["directory"]  # relative to its manifest
    # The context is the Dockerfile and the two wheels it installs: no sources, venv, tests or node_modules.
    assert sorted(p.name for p in staged.iterdir()) == ["Dockerfile", "wheels"]
    assert sorted(p.name.split("-")[0] for p in (staged / "wheels").iterdir()) == ["peagle_contract", "peagle_runtime"]
    tags = {d["imageTag"] for d in images[0]["destinations"].values()}
    assert len(tags) == 1 and tags.pop().startswith(f"{VERSION}-")


def test_image_uri_context_switches_every_stage(synthesized_assembly):
    from tests.conftest import LOCAL_IMAGE_URI

    for name in STAGES:
        assembly_dir = synthesized_assembly / f"assembly-{name}"
        template = json.loads(next(assembly_dir.glob("*.template.json")).read_text())
        _, model = only(template, "AWS::SageMaker::Model")
        assert model["Properties"]["PrimaryContainer"]["Image"] == LOCAL_IMAGE_URI
        assets = json.loads(next(assembly_dir.glob("*.assets.json")).read_text())
        assert not assets.get("dockerImages")
        # The model's policy (a fleet of inference components has one of its own, which pulls nothing).
        pulls = [s for policy in template["Resources"].values() if policy["Type"] == "AWS::IAM::ManagedPolicy"
                 for s in policy["Properties"]["PolicyDocument"]["Statement"] if "ecr:BatchGetImage" in s["Action"]]
        assert len(pulls) == 1, pulls
        assert json.dumps(pulls[0]["Resource"]).endswith(':ecr:us-east-1:123456789012:repository/peagle-runtime"]]}')


def test_a_pinned_weights_manifest_reaches_the_model_and_replaces_it(tmp_path):
    """The pin is in the model's environment: the image refuses another bundle, and a new pin is a new model."""
    from dataclasses import replace

    from aws_cdk import App
    from aws_cdk.assertions import Template
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR

    from stacks.application import OFFLINE, build_app
    from stacks.environments import DEV, bundle

    def model(digest):
        env = replace(DEV, model=replace(DEV.model, serving=replace(DEV.model.serving, **bundle("dev", digest))))
        stage = build_app(App(context=OFFLINE), [env], nag=False)["Dev"]
        (stack,) = [c for c in stage.node.children if hasattr(c, "template_options")]
        models = Template.from_stack(stack).find_resources("AWS::SageMaker::Model")
        (model,) = models.values()
        return model["Properties"]["PrimaryContainer"]

    pinned = model("ab" * 32)
    assert pinned["Environment"][MANIFEST_DIGEST_VAR] == "ab" * 32
    # The pin names the bytes SageMaker copies: the model's data source is that bundle's folder, nothing beside it.
    assert pinned["ModelDataSource"]["S3DataSource"]["S3Uri"].endswith(f"/gpt-oss-20b-p-eagle/{'ab' * 32}/")
    assert MANIFEST_DIGEST_VAR not in model(None)["Environment"]


def test_dev_says_what_scale_to_zero_bills_and_releases_idle_instances(templates):
    outputs = templates["Dev"]["Outputs"]
    when_idle = outputs["WhenIdle"]["Value"]
    assert "created with one copy" in when_idle and "15 min after its last request" in when_idle
    assert "billed" in when_idle and "10-15 minutes" in when_idle
    _, config = only(templates["Dev"], "AWS::SageMaker::EndpointConfig")
    scaling = config["Properties"]["ProductionVariants"][0]["ManagedInstanceScaling"]
    assert scaling["MinInstanceCount"] == 0 and scaling["ScaleInPolicy"] == {"Strategy": "IDLE_RELEASE"}
    _, component = only(templates["Dev"], "AWS::SageMaker::InferenceComponent")
    assert component["Properties"]["RuntimeConfig"]["CopyCount"] == 1
    assert all("WhenIdle" not in templates[name].get("Outputs", {}) for name in ("Staging", "Prod"))


def test_dev_records_its_own_traffic_to_its_own_bucket_and_every_other_stage_records_nothing(templates):
    """Off unless an environment asks (Prod included): Dev asks, with a sampling rate; its image gets Dev's own
    capture setting and its records a bucket named for Dev's account, which the stack prints."""
    from peagle_contract.capture import CAPTURE_VAR, parse_capture

    from stacks.environments import DEV

    for name, template in templates.items():
        (model,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::Model"]
        environment = model["Properties"]["PrimaryContainer"]["Environment"]
        buckets = [r for r in template["Resources"].values() if r["Type"] == "AWS::S3::Bucket"]
        if name != "Dev":
            assert CAPTURE_VAR not in environment and buckets == [] and "CaptureUri" not in template["Outputs"], name
            continue
        assert parse_capture(environment) == DEV.model.serving.capture
        assert DEV.model.serving.capture.stage == "dev" and 0 < DEV.model.serving.capture.sample_rate <= 0.1
        (bucket,) = buckets
        assert bucket["Properties"]["BucketName"].startswith("peagle-dev-capture-")
        assert "capture/dev/" in json.dumps(template["Outputs"]["CaptureUri"])
