"""DrafterTraining: the training job the state machine starts is a request SageMaker's own API model accepts, its
inputs are fixed by the stack (not by whoever starts an execution), and who may read, write and pass what is
judged, not only listed."""

from __future__ import annotations

import json
import re

import pytest

from peagle_contract.training_job import CHANNELS, TrainingJobConfig, parse_hyperparameters

from tests.constructs.construct_helpers import one, resources
from tests.policy_judge import Place, Request, allowed

ACCOUNT, REGION = "333333333333", "eu-west-1"
PIN = "ab" * 32
PREFIX = "s3://peagle-weights-dev/bundles/gpt-oss-20b-p-eagle/"
BUNDLE = f"{PREFIX}{PIN}/"
JOB = TrainingJobConfig(stage="dev", target_name="gpt-oss-20b", k=7, margin=1.05, max_tokens=128, bundle_sha256=PIN)


def _training(stack, image, **changes):  # noqa: ANN001, ANN202
    from aws_cdk import RemovalPolicy
    from aws_cdk import aws_kms as kms
    from aws_cdk import aws_logs as logs

    from peagle_constructs import CaptureDelivery, DrafterTraining

    key = kms.Key(stack, "Key", enable_key_rotation=True)
    group = logs.LogGroup(stack, "Group", encryption_key=key, removal_policy=RemovalPolicy.DESTROY)
    capture = CaptureDelivery(stack, "Capture", log_group=group, key=key, stage="dev")
    props = dict(image=image, stage="dev", key=key, capture=capture,
                 bundle=BUNDLE, bundle_sha256=PIN, target_name="gpt-oss-20b", k=7)
    return DrafterTraining(stack, "DrafterTraining", **{**props, **changes})


def _template(stack) -> dict:  # noqa: ANN001
    from aws_cdk.assertions import Template

    return Template.from_stack(stack).to_json()


def _physical(value, template: dict):  # noqa: ANN001, ANN202
    """A template value with every reference replaced by what it is in ``ACCOUNT``/``REGION``."""
    if isinstance(value, dict):
        if "Ref" in value:
            ref = value["Ref"]
            return {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT,
                    "AWS::URLSuffix": "amazonaws.com"}.get(ref, ref.lower())
        if "Fn::GetAtt" in value:
            lid, _ = value["Fn::GetAtt"]
            kind = template["Resources"][lid]["Type"]
            return {"AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{lid}",
                    "AWS::KMS::Key": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{lid}",
                    "AWS::S3::Bucket": f"arn:aws:s3:::{lid.lower()}"}.get(kind, lid)
        if "Fn::Join" in value:
            sep, parts = value["Fn::Join"]
            return sep.join(str(_physical(p, template)) for p in parts)
        return {k: _physical(v, template) for k, v in value.items()}
    if isinstance(value, list):
        return [_physical(v, template) for v in value]
    return value


def _definition(template: dict) -> dict:
    (_, machine) = one_of(template, "AWS::StepFunctions::StateMachine")
    return json.loads(_physical(machine["Properties"]["DefinitionString"], template))


def one_of(template: dict, kind: str) -> tuple[str, dict]:
    (found,) = [(lid, r) for lid, r in template["Resources"].items() if r["Type"] == kind]
    return found


def _place(template: dict) -> Place:
    physical = {}
    for lid, r in template["Resources"].items():
        physical[lid] = r["Properties"]["Name"] if r["Type"] == "AWS::SSM::Parameter" else lid.lower()
        physical[f"{lid}.Arn"] = _physical({"Fn::GetAtt": [lid, "Arn"]}, template)
    return Place(account=ACCOUNT, region=REGION, physical=physical)


def _policy(template: dict, name: str) -> dict:
    (policy,) = [r["Properties"]["PolicyDocument"] for lid, r in template["Resources"].items()
                 if r["Type"] == "AWS::IAM::ManagedPolicy" and lid.startswith(f"DrafterTraining{name}")]
    return policy


def _concrete(request: dict) -> dict:
    """The request as SageMaker receives it: each ``.$`` field evaluated to a value of the kind it yields."""
    out = {}
    for key, value in request.items():
        if key.endswith(".$"):
            key = key[:-2]
            value = "peagle-dev-drafter-6f1c2d3e-0000-4000-8000-000000000000" if key == "TrainingJobName" else \
                f"s3://b/checkpoints/dev/peagle-dev-drafter-x/"
        out[key] = _concrete(value) if isinstance(value, dict) else value
    return out


def test_the_job_is_a_request_sagemakers_own_api_model_accepts(stack, image):
    import botocore.session
    from botocore.validate import ParamValidator

    _training(stack, image)
    train = _definition(_template(stack))["States"]["Train"]
    assert train["Resource"] == "arn:aws:states:::sagemaker:createTrainingJob.sync"  # waits for the job's end
    model = botocore.session.get_session().get_service_model("sagemaker")
    request = _concrete(train["Parameters"])
    report = ParamValidator().validate(request, model.operation_model("CreateTrainingJob").input_shape)
    assert not report.has_errors(), report.generate_report()
    instance_types = model.shape_for("TrainingInstanceType").enum
    assert request["ResourceConfig"]["InstanceType"] in instance_types
    # Negative control: the validator does refuse what SageMaker would.
    broken = {**request, "EnableNetworkIsolation": "yes", "ResourceConfig": {**request["ResourceConfig"],
                                                                            "InstanceCount": 0}}
    assert ParamValidator().validate(broken, model.operation_model("CreateTrainingJob").input_shape).has_errors()


def test_the_job_runs_isolated_encrypted_on_the_contracts_channels(stack, image):
    _training(stack, image)
    template = _template(stack)
    request = _definition(template)["States"]["Train"]["Parameters"]
    assert request["EnableNetworkIsolation"] is True and request["EnableInterContainerTrafficEncryption"] is True
    assert tuple(c["ChannelName"] for c in request["InputDataConfig"]) == CHANNELS
    uris = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]]
    assert uris[0].endswith("/capture/dev/") and uris[1] == BUNDLE
    assert parse_hyperparameters(json.dumps(request["HyperParameters"])) == JOB  # what the trainer reads back
    key = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{one(_template_obj(stack), 'AWS::KMS::Key')[0]}"
    assert request["OutputDataConfig"] == {"S3OutputPath": request["OutputDataConfig"]["S3OutputPath"],
                                           "KmsKeyId": key, "CompressionType": "NONE"}
    assert "VolumeKmsKeyId" not in request["ResourceConfig"]  # g7e: local NVMe, encrypted by the hardware


def _template_obj(stack):  # noqa: ANN001, ANN202
    from aws_cdk.assertions import Template

    return Template.from_stack(stack)


def test_a_family_with_ebs_storage_gets_the_stages_key_on_its_volume(stack, image):
    from peagle_constructs import DrafterTrainingProps

    _training(stack, image, props=DrafterTrainingProps(instance_type="ml.p3.2xlarge"))
    template = _template(stack)
    request = _definition(template)["States"]["Train"]["Parameters"]
    assert request["ResourceConfig"]["VolumeKmsKeyId"].startswith(f"arn:aws:kms:{REGION}:{ACCOUNT}:key/")
    grants = [s for s in _policy(template, "JobPolicy")["Statement"] if s["Action"] == "kms:CreateGrant"]
    assert [g["Condition"] for g in grants] == [{"Bool": {"kms:GrantIsForAWSResource": "true"}}]


def test_whoever_starts_an_execution_chooses_when_never_what(stack, image):
    """The attack: start an execution whose input names another capture, bundle, job name or report. Every path
    a state reads is one an earlier state wrote, and the first state reads nothing."""
    _training(stack, image)
    states = _definition(_template(stack))["States"]
    written = {"Name": "run", "Train": "trained", "ReadReport": "gate", "Figures": "candidate"}
    assert {n: s["ResultPath"] for n, s in states.items() if n in written} == {n: f"$.{r}" for n, r in written.items()}
    text = json.dumps({n: {k: v for k, v in s.items() if k not in ("ResultSelector", "ResultPath")}
                       for n, s in states.items()})
    roots = set(re.findall(r"\$\.([A-Za-z_]+)", text))
    assert roots == {"run", "gate", "candidate"}, roots
    assert "$." not in json.dumps(states["Name"]["Parameters"]).replace("States.UUID()", "")
    order = ["Name", "Train", "ReadReport", "Gate"]
    assert [states[n].get("Next") for n in order[:-1]] == order[1:]


def test_the_job_reads_only_its_capture_and_pinned_bundle_and_writes_only_its_candidates(stack, image):
    _training(stack, image)
    template = _template(stack)
    place, policy = _place(template), _policy(template, "JobPolicy")
    (capture_id,) = [lid for lid in resources(_template_obj(stack), "AWS::S3::Bucket") if lid.startswith("Capture")]
    ours_id = capture_id  # the candidates go beside the records
    mine = {"s3:ResourceAccount": ACCOUNT}

    def may(action: str, resource: str, context=mine) -> bool:  # noqa: ANN001
        return allowed(policy, Request(service="", action=action, resource=resource, context=context), place,
                       identity=True)

    assert may("s3:GetObject", f"arn:aws:s3:::{capture_id.lower()}/capture/dev/2026/12/07/a.jsonl")
    assert may("s3:GetObject", f"arn:aws:s3:::peagle-weights-dev/bundles/gpt-oss-20b-p-eagle/{PIN}/target/x")
    assert may("s3:PutObject", f"arn:aws:s3:::{ours_id.lower()}/candidates/dev/j/output/model/gate.json")
    for action, resource in (
            ("s3:GetObject", f"arn:aws:s3:::{capture_id.lower()}/capture/prod/a.jsonl"),  # another stage's traffic
            ("s3:GetObject", f"arn:aws:s3:::peagle-weights-dev/bundles/gpt-oss-20b-p-eagle/{'cd' * 32}/target/x"),
            ("s3:PutObject", f"arn:aws:s3:::{capture_id.lower()}/capture/dev/forged.jsonl"),  # its own training data
            ("s3:PutObject", f"arn:aws:s3:::peagle-weights-dev/bundles/gpt-oss-20b-p-eagle/{PIN}/drafter/x"),
            ("s3:DeleteObject", f"arn:aws:s3:::{ours_id.lower()}/candidates/dev/j/output/model/gate.json")):
        assert not may(action, resource), (action, resource)
    # A same-named bucket in another account is not read from.
    assert not may("s3:GetObject", f"arn:aws:s3:::{capture_id.lower()}/capture/dev/a.jsonl",
                   {"s3:ResourceAccount": "444444444444"})


def test_no_principal_but_the_jobs_role_may_write_a_candidate_and_it_no_record(stack, image):
    """The attacks: put a forged gate report (or head) where the state machine reads it; or, as the job (whose
    container reads hostile records), write records the next run trains on."""
    training = _training(stack, image)
    template = _template(stack)
    place = _place(template)
    lid = lambda construct: stack.resolve(construct.node.default_child.logical_id)  # noqa: E731
    role = f"arn:aws:iam::{ACCOUNT}:role/{lid(training.role)}"
    stream = f"arn:aws:iam::{ACCOUNT}:role/{lid(training.bucket.node.scope.role)}"
    (policy,) = [r["Properties"]["PolicyDocument"] for r in template["Resources"].values()
                 if r["Type"] == "AWS::S3::BucketPolicy"]
    everything = {"Statement": [*policy["Statement"], {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "s3:*",
                                                       "Resource": "*"}]}
    bucket = one_of_bucket(template)
    report = f"arn:aws:s3:::{bucket}/candidates/dev/peagle-dev-drafter-x/output/model/gate.json"
    record = f"arn:aws:s3:::{bucket}/capture/dev/2026/12/07/forged.jsonl"

    def may_put(principal: str, key: str = report, document=everything) -> bool:  # noqa: ANN001
        return allowed(document, Request(service="", action="s3:PutObject", resource=key, context={
            "aws:PrincipalArn": principal, "aws:SecureTransport": "true"}), place)

    assert may_put(role) and may_put(stream, record)
    for intruder in (f"arn:aws:iam::{ACCOUNT}:role/Admin", f"arn:aws:iam::{ACCOUNT}:root",
                     role.replace(ACCOUNT, "444444444444")):
        assert not may_put(intruder), intruder
    assert not may_put(role, record)  # the job writes no training data, whatever its own policy said
    assert not may_put(role, f"arn:aws:s3:::{bucket}/delivery-errors/dev/x")
    opened = {"Statement": [s for s in everything["Statement"] if s.get("Sid") != "OnlyTheStreamWritesTheCapture"]}
    assert may_put(role, record, opened)  # negative control: that statement is what refuses it


def one_of_bucket(template: dict) -> str:
    (lid,) = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::S3::Bucket"]
    return lid.lower()


def test_the_state_machine_passes_the_jobs_role_to_sagemaker_only_and_starts_only_its_own_jobs(stack, image):
    training = _training(stack, image)
    template = _template(stack)
    place, policy = _place(template), _policy(template, "StateMachinePolicy")
    role = f"arn:aws:iam::{ACCOUNT}:role/{stack.resolve(training.role.node.default_child.logical_id)}"
    jobs = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/"

    def may(action: str, resource: str, **context: str) -> bool:
        return allowed(policy, Request(service="", action=action, resource=resource, context=context), place,
                       identity=True)

    assert may("iam:PassRole", role, **{"iam:PassedToService": "sagemaker.amazonaws.com"})
    assert not may("iam:PassRole", role, **{"iam:PassedToService": "ec2.amazonaws.com"})
    assert not may("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/Admin",
                   **{"iam:PassedToService": "sagemaker.amazonaws.com"})
    assert may("sagemaker:CreateTrainingJob", f"{jobs}peagle-dev-drafter-1234")
    assert not may("sagemaker:CreateTrainingJob", f"{jobs}peagle-prod-drafter-1234")
    assert not may("sagemaker:CreateEndpoint", f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/x")
    bucket = one_of_bucket(template)
    assert may("s3:GetObject", f"arn:aws:s3:::{bucket}/candidates/dev/peagle-dev-drafter-1/output/model/gate.json")
    assert not may("s3:GetObject", f"arn:aws:s3:::{bucket}/candidates/dev/peagle-dev-drafter-1/output/model/"
                                   "drafter/model.safetensors")
    (_, parameter) = one_of(template, "AWS::SSM::Parameter")
    arn = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/peagle/dev/drafter-candidate"
    assert parameter["Properties"]["Name"] == "/peagle/dev/drafter-candidate" and may("ssm:PutParameter", arn)
    assert not may("ssm:PutParameter", arn.replace("/dev/", "/prod/"))


def test_it_passes_every_pack_with_only_its_named_acknowledgements(stack, image):
    from peagle_constructs import NAG_PACKS
    from peagle_constructs.security import acknowledged_findings

    training = _training(stack, image)
    for pack in NAG_PACKS:
        report = pack().validate_scope(stack)
        assert report.success, (pack.__name__, [v.rule_name for v in report.violations])
    for construct in (training.policy, training.state_machine_policy):
        found = acknowledged_findings(construct)
        assert found and all(len(reason) > 60 for reason in found.values()), construct.node.path


@pytest.mark.parametrize(("changes", "field"), [
    ({"stage": "Dev"}, "stage"), ({"stage": "a" * 19}, "stage"),
    ({"bundle_sha256": "CD" * 32}, "bundle_sha256"), ({"bundle": "peagle-weights-dev/bundles/"}, "bundle"),
    ({"bundle": f"{PREFIX}{'cd' * 32}/"}, "bundle"), ({"bundle": PREFIX}, "bundle"),
    ({"k": 0}, "k"), ({"target_name": "../x"}, "target_name"),
    ({"props": {"instance_type": "ml.m5.xlarge"}}, "instance_type"),
    ({"props": {"volume_size_gb": 0}}, "volume_size_gb"),
    ({"props": {"max_runtime": "8h"}}, "max_runtime"),
    ({"props": {"margin": 0.9}}, "margin"), ({"props": {"cpu_seconds": float("nan")}}, "cpu_seconds"),
    ({"capture": "s3://bucket/capture/dev/"}, "capture"),
])
def test_bad_props_are_refused_by_name(stack, image, changes, field):
    from peagle_constructs import ConfigError, DrafterTrainingProps

    if "props" in changes:
        changes = {"props": DrafterTrainingProps(**changes["props"])}
    with pytest.raises(ConfigError) as caught:
        _training(stack, image, **changes)
    assert str(caught.value).startswith(f"{field}:") and "allowed" in str(caught.value)


def test_a_runtime_past_sagemakers_limit_is_refused(stack, image):
    from aws_cdk import Duration

    from peagle_constructs import ConfigError, DrafterTrainingProps

    with pytest.raises(ConfigError, match=r"max_runtime: .*2505600.*allowed"):
        _training(stack, image, props=DrafterTrainingProps(max_runtime=Duration.days(29)))


def test_a_schedule_starts_it_with_a_role_that_may_start_only_this_state_machine(stack, image):
    from aws_cdk import Duration
    from aws_cdk import aws_events as events

    from peagle_constructs import DrafterTrainingProps

    training = _training(stack, image, props=DrafterTrainingProps(schedule=events.Schedule.rate(Duration.days(7))))
    template = _template(stack)
    (_, rule) = one_of(template, "AWS::Events::Rule")
    assert rule["Properties"]["ScheduleExpression"] == "rate(7 days)"
    (target,) = rule["Properties"]["Targets"]
    machine = stack.resolve(training.state_machine.node.default_child.logical_id)
    assert target["Arn"] == {"Ref": machine} and "Input" not in target  # the input is ignored anyway
    from peagle_constructs import NAG_PACKS

    for pack in NAG_PACKS:
        report = pack().validate_scope(stack)
        assert report.success, (pack.__name__, [v.rule_name for v in report.violations])
