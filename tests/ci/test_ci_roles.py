"""Each stage account's delivery side (stacks/ci_roles.py, stacks/deploy_permissions.py), judged for what it allows.

- The deploy roles: the trust of each, judged by our policy judge (tests/policy_judge.py) for the token the
  reviewed workflow on main presents and for the tokens an attacker can get (another branch, workflow,
  environment, repository, a pull request, GitHub's default subject, another audience).
- The CloudFormation execution policies: every permission CloudFormation's own resource handlers list for every
  resource of every stage's template (the registry schemas cfn-lint ships: a judge nobody here wrote) is allowed
  on that resource; what would escalate (a role without the boundary, another role, an administrator policy,
  the boundary itself) is refused.
- The workload boundary: every statement of every role the stages create lies within it.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from peagle_constructs import ServingConfigError
from stacks.ci_roles import (
    CDK_BOOTSTRAP_ROLES, DEPLOY_WORKFLOW, OIDC_CLAIM_PREFIX, SUBJECT_CLAIM_KEYS, build_ci_app, deploy_subject,
    role_name,
)
from stacks.deploy_permissions import BOUNDARY_NAME, EXECUTION_POLICY_NAMES, SCALING_SERVICE, iam_path
from stacks.environments import ENVIRONMENTS
from tests.policy_judge import Place, Request, allowed, joined
from tests.training_config import with_dev_training

REPO = "acme/peagle"
REGION = "us-east-1"
ACCOUNTS = {"Dev": "111122223333", "Staging": "222233334444", "Prod": "333344445555"}
CONTEXT = {**{f"account.{name}": account for name, account in ACCOUNTS.items()}, "region": REGION,
           "imageUri": f"{ACCOUNTS['Dev']}.dkr.ecr.{REGION}.amazonaws.com/peagle:1"}
PROVIDER = "arn:aws:iam::{account}:oidc-provider/token.actions.githubusercontent.com"
# The stages as committed, and with Dev training its drafter in the cloud (what a stage adds when it trains).
VARIANTS = {"as-committed": ENVIRONMENTS, "dev-trains": with_dev_training(ENVIRONMENTS)}
IAM_LIMIT = 6144  # characters in a managed policy, whitespace not counted


@lru_cache(maxsize=None)
def _ci_templates(variant: str) -> dict[str, dict]:
    stacks = build_ci_app(App(context=CONTEXT), REPO, VARIANTS[variant])
    assert sorted(stacks) == sorted(f"PEagleCiRoles-{name}" for name in ACCOUNTS)
    return {name: Template.from_stack(stacks[f"PEagleCiRoles-{name}"]).to_json() for name in ACCOUNTS}


@lru_cache(maxsize=None)
def _stage_templates(variant: str) -> dict[str, dict]:
    from stacks.application import OFFLINE, build_app

    context = {**OFFLINE, **CONTEXT, "trainingImageUri": CONTEXT["imageUri"].replace("peagle:1", "peagle-trainer:1")}
    stages = build_app(App(context=context), VARIANTS[variant], nag=False)
    return {name: Template.from_stack(stage.stack).to_json() for name, stage in stages.items()}


@pytest.fixture(scope="module")
def ci_templates() -> dict[str, dict]:
    """Each stage's delivery stack, with the stages in their own accounts (by stage name)."""
    return _ci_templates("as-committed")


@pytest.fixture(scope="module")
def stage_templates() -> dict[str, dict]:
    """The serving stages as they deploy into those accounts (offline: no pins needed, nothing else differs)."""
    return _stage_templates("as-committed")


def _of(template: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def _place(stage: str) -> Place:
    return Place(account=ACCOUNTS[stage], region=REGION)


def _role(template: dict, env) -> dict:  # noqa: ANN001
    (role,) = [r for r in _of(template, "AWS::IAM::Role").values() if r["Properties"]["RoleName"] == role_name(env)]
    return role


# --- the deploy roles' trust -------------------------------------------------------------------------------------

def _token(env, **claims) -> Request:  # noqa: ANN001
    """The AssumeRoleWithWebIdentity call a GitHub job makes, with the claims AWS matches (aud and sub)."""
    context = {f"{OIDC_CLAIM_PREFIX}:aud": claims.pop("aud", "sts.amazonaws.com"),
               f"{OIDC_CLAIM_PREFIX}:sub": claims.pop("sub")}
    assert not claims
    return Request(service="", action="sts:AssumeRoleWithWebIdentity", resource="*", context=context,
                   federated=PROVIDER.format(account=ACCOUNTS[env.name]))


def _subject(*, repo=REPO, environment, ref="refs/heads/main", workflow=DEPLOY_WORKFLOW,  # noqa: ANN001
             workflow_ref="refs/heads/main") -> str:
    return (f"repo:{repo}:environment:{environment}:ref:{ref}"
            f":job_workflow_ref:{repo}/{workflow}@{workflow_ref}")


ATTACKS = {
    "a push to another branch": dict(ref="refs/heads/attack"),
    "the deploy workflow as it is on another branch": dict(workflow_ref="refs/heads/attack"),
    "a workflow of the attacker's, on main": dict(workflow=".github/workflows/attack.yml"),
    "the promotion workflow itself (not its deploy job)": dict(workflow=".github/workflows/promote.yml"),
    "a fork of the repository": dict(repo="mallory/peagle"),
    "a pull request's merge ref": dict(ref="refs/pull/7/merge"),
}


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: e.name)
def test_a_deploy_role_trusts_the_reviewed_workflow_on_main_in_its_environment_and_nothing_else(ci_templates, env):
    template = ci_templates[env.name]
    trust = _role(template, env)["Properties"]["AssumeRolePolicyDocument"]
    place = Place(account=ACCOUNTS[env.name], region=REGION,
                  physical={lid: PROVIDER.format(account=ACCOUNTS[env.name])
                            for lid in _of(template, "AWS::IAM::OIDCProvider")})
    mine = env.name.lower()
    right = _subject(environment=mine)
    assert right == deploy_subject(REPO, env)
    assert allowed(trust, _token(env, sub=right), place)
    refused = {name: _subject(environment=mine, **changes) for name, changes in ATTACKS.items()}
    others = [e.name.lower() for e in ENVIRONMENTS if e is not env]
    refused |= {f"the {other} environment": _subject(environment=other) for other in others}
    # GitHub's default subject names the environment only: what the roles trusted before, from any branch.
    refused["GitHub's default subject for the environment"] = f"repo:{REPO}:environment:{mine}"
    refused["a push to main outside any environment"] = f"repo:{REPO}:ref:refs/heads/main"
    refused["a pull request"] = f"repo:{REPO}:pull_request"
    let_in = [name for name, sub in refused.items() if allowed(trust, _token(env, sub=sub), place)]
    assert let_in == []
    assert not allowed(trust, _token(env, sub=right, aud="https://github.com/acme"), place)


def test_the_subject_is_the_template_github_renders_for_the_claims_we_set():
    """GitHub renders a customised subject as ``key:value`` per included claim, ``context`` as its bare value."""
    claims = {"repo": REPO, "context": "environment:prod", "ref": "refs/heads/main",
              "job_workflow_ref": f"{REPO}/{DEPLOY_WORKFLOW}@refs/heads/main"}
    rendered = ":".join(claims[k] if k == "context" else f"{k}:{claims[k]}" for k in SUBJECT_CLAIM_KEYS)
    assert rendered == deploy_subject(REPO, ENVIRONMENTS[2])


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: e.name)
def test_a_role_may_only_use_its_accounts_bootstrap_roles_and_smoke_test_its_own_endpoint(ci_templates, env):
    template = ci_templates[env.name]
    (policy,) = _of(template, "AWS::IAM::Policy").values()
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(statements) == {"CdkBootstrapRoles", "SmokeInvoke", "SmokeLogs", "SmokeAlarms", "SmokeStack",
                               "SmokeDescribe"}
    text = json.dumps(statements)
    assert '"*"' not in text and "iam:PassRole" not in text  # no wildcard action or resource
    roles = json.dumps(statements["CdkBootstrapRoles"]["Resource"])
    assert all(f"cdk-hnb659fds-{kind}-role-{ACCOUNTS[env.name]}-{REGION}" in roles for kind in CDK_BOOTSTRAP_ROLES)
    assert statements["SmokeInvoke"]["Action"] == "sagemaker:InvokeEndpoint"
    group = (f"/aws/sagemaker/InferenceComponents/{env.component_name}" if env.component_name
             else f"/aws/sagemaker/Endpoints/{env.endpoint_name}")
    assert f"{group}:*" in json.dumps(statements["SmokeLogs"]["Resource"])
    # Read only, on the stage's own stack; every call the smoke test makes is judged in
    # tests/deploy/test_smoke_permissions.py.
    assert all(a.split(":")[1].startswith(("Describe", "GetTemplate")) for s in ("SmokeStack", "SmokeDescribe")
               for a in statements[s]["Action"])
    assert f"stack/{env.name}-PEagle/*" in json.dumps(statements["SmokeStack"]["Resource"])
    assert f"alarm:{env.endpoint_name}-*" in json.dumps(statements["SmokeAlarms"]["Resource"])
    # Another account's bootstrap roles are not this role's to assume.
    other = next(a for n, a in ACCOUNTS.items() if n != env.name)
    identity = policy["Properties"]["PolicyDocument"]
    assert not allowed(identity, Request(service="", action="sts:AssumeRole", resource=(
        f"arn:aws:iam::{other}:role/cdk-hnb659fds-deploy-role-{other}-{REGION}")), _place(env.name), identity=True)


def test_stages_that_share_an_account_share_one_delivery_stack():
    from dataclasses import replace

    dev, staging, prod = ENVIRONMENTS
    shared = (replace(dev, shared_account_reason="a trial account"),
              replace(staging, shared_account_reason="a trial account"), prod)
    context = {**CONTEXT, "account.Staging": ACCOUNTS["Dev"]}
    stacks = build_ci_app(App(context=context), REPO, shared)
    assert sorted(stacks) == ["PEagleCiRoles-Dev-Staging", "PEagleCiRoles-Prod"]
    template = Template.from_stack(stacks["PEagleCiRoles-Dev-Staging"]).to_json()
    assert len(_of(template, "AWS::IAM::OIDCProvider")) == 1
    assert {r["Properties"]["RoleName"] for r in _of(template, "AWS::IAM::Role").values()} == {
        "peagle-deploy-dev", "peagle-deploy-staging"}
    # Without the acknowledgement the same accounts are refused, naming the field.
    with pytest.raises(ServingConfigError) as caught:
        build_ci_app(App(context=context), REPO)
    assert caught.value.field_name == "Dev.account" and "Staging" in str(caught.value)


def test_the_repository_is_checked_at_synth():
    with pytest.raises(ServingConfigError) as caught:
        build_ci_app(App(context=CONTEXT), "not a repo")
    assert caught.value.field_name == "githubRepository" and "<owner>/<repo>" in str(caught.value)


def test_the_stack_says_how_to_bootstrap_its_account(ci_templates):
    place = _place("Prod")
    template = ci_templates["Prod"]
    policies = {lid: f"arn:aws:iam::{ACCOUNTS['Prod']}:policy/{r['Properties']['ManagedPolicyName']}"
                for lid, r in _of(template, "AWS::IAM::ManagedPolicy").items()}
    command = Place(account=place.account, region=REGION, physical=policies).resolve(
        template["Outputs"]["BootstrapCommand"]["Value"])
    assert command == (f"npx cdk bootstrap aws://{ACCOUNTS['Prod']}/{REGION} --cloudformation-execution-policies "
                       + ",".join(f"arn:aws:iam::{ACCOUNTS['Prod']}:policy/{n}" for n in EXECUTION_POLICY_NAMES))


# --- the CloudFormation execution policies ----------------------------------------------------------------------

# Handler permissions we do not grant, each with why the handler never calls it for our templates.
NOT_CALLED = {
    "lambda": "ScalableTarget: only for Lambda's provisioned-concurrency dimension; ours scale SageMaker",
    "s3:REST.PUT.OBJECT": "LogGroup: not an IAM action (an S3 log event name in the schema)",
    "logs:CreateLogDelivery": "LogGroup: only for vended log delivery, which our log groups do not configure",
    "logs:PutResourcePolicy": "LogGroup: only with ResourcePolicyDocument, which our log groups do not set",
    "logs:DeleteResourcePolicy": "LogGroup: only with ResourcePolicyDocument, which our log groups do not set",
    "iam:AttachGroupPolicy": "ManagedPolicy: ours attach to roles only",
    "iam:AttachUserPolicy": "ManagedPolicy: ours attach to roles only",
    "iam:DetachGroupPolicy": "ManagedPolicy: ours attach to roles only",
    "iam:DetachUserPolicy": "ManagedPolicy: ours attach to roles only",
    "iam:DeleteRolePermissionsBoundary": "Role: only when a boundary is removed, which the policy denies on purpose",
    "iam:GetRole": "SNS Topic/Subscription: only for delivery-status logging roles, which we do not set",
}
SNS_ROLE_ONLY = {"iam:GetRole", "iam:PassRole"}  # SNS handlers: delivery-status logging roles only
# The same, for one resource type only.
NOT_CALLED_BY = {
    "AWS::Logs::LogGroup": {"firehose:TagDeliveryStream": "only for log delivery to Firehose"},
    "AWS::StepFunctions::StateMachine": {
        p: "only for a definition read from S3 or encryption with a customer key, which the drafter training's "
           "state machine has neither of" for p in ("kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKey",
                                                    "s3:GetObject", "s3:GetObjectVersion")},
    "AWS::S3::Bucket": {
        **{p: "a bucket feature the capture bucket never sets (its handler calls it only when the property is "
              "given)" for p in (
            "s3:CreateBucketMetadataTableConfiguration", "s3:DeleteBucketAnalyticsConfiguration",
            "s3:DeleteBucketCors", "s3:DeleteBucketEncryption", "s3:DeleteBucketMetadataTableConfiguration",
            "s3:DeleteBucketMetricsConfiguration", "s3:DeleteBucketReplication", "s3:DeleteBucketWebsite",
            "s3:PutAccelerateConfiguration", "s3:PutAnalyticsConfiguration", "s3:PutBucketAbac", "s3:PutBucketAcl",
            "s3:PutBucketCORS", "s3:PutBucketLogging", "s3:PutBucketObjectLockConfiguration",
            "s3:PutBucketReplication", "s3:PutBucketWebsite", "s3:PutIntelligentTieringConfiguration",
            "s3:PutInventoryConfiguration", "s3:PutMetricsConfiguration", "s3:PutObjectAcl",
            "s3:PutObjectLockConfiguration", "s3:PutReplicationConfiguration",
            "s3:UpdateBucketMetadataAnnotationTableConfiguration",
            "s3:UpdateBucketMetadataInventoryTableConfiguration", "s3:UpdateBucketMetadataJournalTableConfiguration")},
        "s3tables": "only for a bucket's metadata tables, which the capture bucket has none of",
        "s3:DeleteObject": "CloudFormation deletes an empty bucket only; it never deletes its objects",
    },
}


@lru_cache(maxsize=None)
def _handler_permissions(kind: str) -> tuple[str, ...]:
    import cfnlint

    schemas = os.path.join(os.path.dirname(cfnlint.__file__), "data", "schemas")
    with open(os.path.join(schemas, "providers", f"{REGION}.json")) as f:
        digest = json.load(f)[kind]
    with open(os.path.join(schemas, "resources", f"{digest}.json")) as f:
        handlers = json.load(f)["handlers"]
    return tuple(sorted({p for h in ("create", "read", "update", "delete") for p in handlers.get(h, {}).get(
        "permissions", [])}))


def _not_called(kind: str, permission: str) -> bool:
    if kind.startswith("AWS::SNS::") and permission in SNS_ROLE_ONLY:
        return True
    own = NOT_CALLED_BY.get(kind, {})
    if permission in own or permission.split(":")[0] in own:
        return True
    return permission in NOT_CALLED or permission.split(":")[0] in NOT_CALLED


# Resource types whose Ref is their ARN (the others' Ref is their name or id).
REF_IS_ARN = {"AWS::IAM::ManagedPolicy", "AWS::SNS::Topic", "AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig",
              "AWS::SageMaker::Endpoint", "AWS::SageMaker::InferenceComponent", "AWS::StepFunctions::StateMachine"}


class _Attributes(dict):
    """Physical names and ARNs by ``LogicalId`` and ``LogicalId.Arn``; any other attribute is the name."""

    def __missing__(self, key: str) -> str:
        return self[key.split(".", 1)[0]]


class _Names:
    """Physical names as CloudFormation makes them for a stage's resources, and each resource's ARN."""

    def __init__(self, stage: str, template: dict):
        self.stage, self.template, self.account = stage, template, ACCOUNTS[stage]
        self.stack = f"{stage}-PEagle"
        self.physical = _Attributes()
        for lid, r in template["Resources"].items():
            self.physical[lid] = self.name(lid, r)
        for lid, r in template["Resources"].items():
            self.physical[f"{lid}.Arn"] = self.arn(lid)
            if r["Type"] in REF_IS_ARN:
                self.physical[lid] = self.arn(lid)
        self.place = Place(account=self.account, region=REGION, physical=self.physical)

    def name(self, lid: str, resource: dict) -> str:
        props, kind = resource.get("Properties", {}), resource["Type"]
        given = {"AWS::Logs::LogGroup": "LogGroupName", "AWS::CloudWatch::Alarm": "AlarmName",
                 "AWS::SageMaker::Endpoint": "EndpointName",
                 "AWS::SageMaker::InferenceComponent": "InferenceComponentName",
                 "AWS::StepFunctions::StateMachine": "StateMachineName", "AWS::SSM::Parameter": "Name",
                 "AWS::Events::Rule": "Name"}.get(kind)
        if given and given in props:
            return props[given]
        if kind == "AWS::KMS::Key":
            return "1234abcd-12ab-34cd-56ef-1234567890ab"
        if kind == "AWS::S3::Bucket":  # the name the stack gives, its account and region filled in
            return Place(account=self.account, region=REGION).resolve(props["BucketName"])
        if kind.startswith("AWS::SageMaker::"):
            return f"{lid.lower()}-a1b2c3d4e5f6"
        return f"{self.stack}-{lid[:40]}-A1B2C3D4E5F6"  # stack - logical id - random, as CloudFormation names

    def arn(self, lid: str) -> str:
        r = self.template["Resources"][lid]
        kind, props = r["Type"], r.get("Properties", {})
        name = self.name(lid, r)
        a, p = self.account, "arn:aws"
        return {
            "AWS::IAM::Role": f"{p}:iam::{a}:role{props.get('Path', '/')}{name}",
            "AWS::IAM::ManagedPolicy": f"{p}:iam::{a}:policy{props.get('Path', '/')}{name}",
            "AWS::KMS::Key": f"{p}:kms:{REGION}:{a}:key/{name}",
            "AWS::Logs::LogGroup": f"{p}:logs:{REGION}:{a}:log-group:{name}:*",
            "AWS::SNS::Topic": f"{p}:sns:{REGION}:{a}:{name}",
            "AWS::CloudWatch::Alarm": f"{p}:cloudwatch:{REGION}:{a}:alarm:{name}",
            "AWS::CloudWatch::Dashboard": f"{p}:cloudwatch::{a}:dashboard/{name}",
            "AWS::SageMaker::Model": f"{p}:sagemaker:{REGION}:{a}:model/{name}",
            "AWS::SageMaker::EndpointConfig": f"{p}:sagemaker:{REGION}:{a}:endpoint-config/{name}",
            "AWS::SageMaker::Endpoint": f"{p}:sagemaker:{REGION}:{a}:endpoint/{name}",
            "AWS::SageMaker::InferenceComponent": f"{p}:sagemaker:{REGION}:{a}:inference-component/{name}",
            "AWS::S3::Bucket": f"{p}:s3:::{name}",
            "AWS::KinesisFirehose::DeliveryStream": f"{p}:firehose:{REGION}:{a}:deliverystream/{name}",
            "AWS::StepFunctions::StateMachine": f"{p}:states:{REGION}:{a}:stateMachine:{name}",
            "AWS::SSM::Parameter": f"{p}:ssm:{REGION}:{a}:parameter{name}",
            "AWS::Events::Rule": f"{p}:events:{REGION}:{a}:rule/{name}",
        }.get(kind, f"{p}:application-autoscaling:{REGION}:{a}:scalable-target/{lid.lower()}")

    def requests(self, lid: str, permission: str) -> list[Request]:
        """What the handler of resource ``lid`` asks IAM for ``permission``: the resource it acts on, with the
        request's condition keys."""
        r = self.template["Resources"][lid]
        kind, props = r["Type"], self.place.resolve(r.get("Properties", {}))
        mine, request = self.arn(lid), lambda resource, **context: Request(
            service="", action=permission, resource=resource, context=context)
        if kind == "AWS::KinesisFirehose::DeliveryStream" and permission.startswith(("iam:", "kms:")):
            if permission.startswith("iam:"):
                role = props["ExtendedS3DestinationConfiguration"]["RoleARN"]
                return [request(role, **({"iam:PassedToService": "firehose.amazonaws.com"}
                                         if permission == "iam:PassRole" else {}))]
            key = props["DeliveryStreamEncryptionConfigurationInput"]["KeyARN"]
            via = {} if permission == "kms:DescribeKey" else {"kms:ViaService": f"firehose.{REGION}.amazonaws.com"}
            return [request(key, **via)]
        if kind == "AWS::Logs::SubscriptionFilter":
            if permission == "iam:PassRole":
                return [request(props["RoleArn"], **{"iam:PassedToService": "logs.amazonaws.com"})]
            return [request(self.place.resolve({"Fn::GetAtt": [props_ref(r), "Arn"]}))]
        if kind == "AWS::S3::BucketPolicy":
            return [request(f"arn:aws:s3:::{props['Bucket']}")]
        if kind == "AWS::StepFunctions::StateMachine" and permission == "iam:PassRole":
            return [request(props["RoleArn"], **{"iam:PassedToService": "states.amazonaws.com"})]
        if kind == "AWS::Events::Rule" and permission == "iam:PassRole":
            return [request(target["RoleArn"], **{"iam:PassedToService": "events.amazonaws.com"})
                    for target in props["Targets"]]
        if permission == "iam:PassRole":
            role = props.get("ExecutionRoleArn") or props.get("RoleARN")
            if role is None:
                return []  # an endpoint config of one model passes no role of its own
            service = "application-autoscaling.amazonaws.com" if "RoleARN" in props else "sagemaker.amazonaws.com"
            return [request(role, **{"iam:PassedToService": service})]
        if permission == "iam:CreateServiceLinkedRole":
            return [request(props["RoleARN"], **{"iam:AWSServiceName": SCALING_SERVICE})]
        if permission == "kms:DescribeKey" and kind == "AWS::SageMaker::EndpointConfig":
            key = props.get("KmsKeyId")
            return [request(key)] if key else []
        if permission.startswith("cloudwatch:") and kind.startswith("AWS::ApplicationAutoScaling::"):
            name = "*" if permission == "cloudwatch:GetMetricData" else (
                f"arn:aws:cloudwatch:{REGION}:{self.account}:alarm:TargetTracking-{lid}-AlarmHigh-abc")
            return [request(name)]
        if kind == "AWS::IAM::Role" and permission in ("iam:AttachRolePolicy", "iam:DetachRolePolicy"):
            # The role handler attaches the role's own ManagedPolicyArns; ours attach from the policy's side.
            return [request(mine, **{"iam:PermissionsBoundary": props.get("PermissionsBoundary", ""),
                                     "iam:PolicyARN": arn}) for arn in props.get("ManagedPolicyArns", [])]
        if kind == "AWS::IAM::Role" and permission.startswith("iam:"):
            return [request(mine, **{"iam:PermissionsBoundary": props.get("PermissionsBoundary", "")})]
        if kind == "AWS::IAM::ManagedPolicy" and permission in ("iam:AttachRolePolicy", "iam:DetachRolePolicy"):
            roles = [self.arn(next(l for l, v in self.physical.items() if v == role)) for role in props["Roles"]]
            boundaries = {self.arn(l): self.place.resolve(self.template["Resources"][l]["Properties"].get(
                "PermissionsBoundary", "")) for l in _of(self.template, "AWS::IAM::Role")}
            return [request(role, **{"iam:PermissionsBoundary": boundaries[role], "iam:PolicyARN": mine})
                    for role in roles]
        if kind == "AWS::Logs::MetricFilter":
            return [request(self.place.resolve({"Fn::GetAtt": [props_ref(r), "Arn"]}))]
        if kind in ("AWS::SNS::Subscription", "AWS::SNS::TopicPolicy"):
            topics = props.get("TopicArn") or props.get("Topics")
            return [request(t) for t in (topics if isinstance(topics, list) else [topics])]
        if permission == "ssm:GetParameters":
            return [request(f"arn:aws:ssm:{REGION}:{self.account}:parameter/cdk-bootstrap/hnb659fds/version")]
        return [request(mine)]


def props_ref(resource: dict) -> str:
    """The logical id of the log group a metric filter names (by Ref)."""
    return resource["Properties"]["LogGroupName"]["Ref"]


def _execution_policy(ci_template: dict, stage: str) -> dict:
    docs = [r["Properties"]["PolicyDocument"] for r in _of(ci_template, "AWS::IAM::ManagedPolicy").values()
            if r["Properties"]["ManagedPolicyName"] in EXECUTION_POLICY_NAMES]
    assert len(docs) == len(EXECUTION_POLICY_NAMES)
    return _place(stage).resolve(joined(*docs))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("stage", list(ACCOUNTS))
def test_cloudformation_may_do_everything_its_handlers_need_for_the_stages_resources(variant, stage):
    ci_templates, stage_templates = _ci_templates(variant), _stage_templates(variant)
    names = _Names(stage, stage_templates[stage])
    policy = _execution_policy(ci_templates[stage], stage)
    refused, judged = [], 0
    for lid, resource in stage_templates[stage]["Resources"].items():
        for permission in _handler_permissions(resource["Type"]):
            if _not_called(resource["Type"], permission):
                continue
            for request in names.requests(lid, permission):
                judged += 1
                if not allowed(policy, request, names.place, identity=True):
                    refused.append(f"{resource['Type']} {lid}: {permission} on {request.resource}")
    assert refused == []
    assert judged > 150  # every resource of the stage, each of its handlers' permissions (195-239 today)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("stage", list(ACCOUNTS))
def test_cloudformation_cannot_escalate_or_reach_another_stage(variant, stage):
    ci_templates, stage_templates = _ci_templates(variant), _stage_templates(variant)
    names = _Names(stage, stage_templates[stage])
    policy = _execution_policy(ci_templates[stage], stage)
    a = ACCOUNTS[stage]
    boundary = f"arn:aws:iam::{a}:policy/{BOUNDARY_NAME}"
    ours = f"arn:aws:iam::{a}:role{iam_path(next(e for e in ENVIRONMENTS if e.name == stage))}x"
    admin = "arn:aws:iam::aws:policy/AdministratorAccess"
    other = next(e for e in ENVIRONMENTS if e.name != stage)

    def may(action: str, resource: str, **context: str) -> bool:
        return allowed(policy, Request(service="", action=action, resource=resource, context=context), names.place,
                       identity=True)

    assert may("iam:CreateRole", ours, **{"iam:PermissionsBoundary": boundary})  # the control: this much is allowed
    attempts = {
        "a role without the boundary": may("iam:CreateRole", ours),
        "a role with another boundary": may("iam:CreateRole", ours, **{"iam:PermissionsBoundary": admin}),
        "a role outside the stage's path": may("iam:CreateRole", f"arn:aws:iam::{a}:role/admin",
                                               **{"iam:PermissionsBoundary": boundary}),
        "administrator attached": may("iam:AttachRolePolicy", ours, **{"iam:PermissionsBoundary": boundary,
                                                                        "iam:PolicyARN": admin}),
        "the boundary removed": may("iam:DeleteRolePermissionsBoundary", ours),
        "the boundary rewritten": may("iam:CreatePolicyVersion", boundary),
        "the execution policy rewritten": any(may("iam:CreatePolicyVersion", f"arn:aws:iam::{a}:policy/{n}")
                                              for n in EXECUTION_POLICY_NAMES),
        "the deploy role's trust changed": may("iam:UpdateAssumeRolePolicy", f"arn:aws:iam::{a}:role/peagle-deploy-x"),
        "a role passed to another service": may("iam:PassRole", ours, **{"iam:PassedToService": "ec2.amazonaws.com"}),
        "a user": may("iam:CreateUser", f"arn:aws:iam::{a}:user/mallory"),
        "another stage's endpoint": may("sagemaker:UpdateEndpoint",
                                        f"arn:aws:sagemaker:{REGION}:{a}:endpoint/{other.endpoint_name}"),
        "the weights": may("s3:PutObject", "arn:aws:s3:::peagle-weights-prod/bundles/x"),
        "a role assumed": may("sts:AssumeRole", f"arn:aws:iam::{a}:role/admin"),
        "another stage's training": may("states:UpdateStateMachine", f"arn:aws:states:{REGION}:{a}:stateMachine:"
                                                                      f"peagle-{other.name.lower()}-drafter-training"),
        "another stage's candidate": may("ssm:PutParameter", f"arn:aws:ssm:{REGION}:{a}:parameter/peagle/"
                                                              f"{other.name.lower()}/drafter-candidate"),
        "a state machine of anyone's": may("states:CreateStateMachine", f"arn:aws:states:{REGION}:{a}:stateMachine:x"),
        "a role passed to Lambda": may("iam:PassRole", ours, **{"iam:PassedToService": "lambda.amazonaws.com"}),
    }
    assert [name for name, ok in attempts.items() if ok] == []


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_managed_policy_fits_iam_even_with_every_stage_in_one_account(variant):
    from dataclasses import replace

    shared = tuple(replace(env, shared_account_reason="one account for everything") for env in VARIANTS[variant])
    (stack,) = build_ci_app(App(context={"account": ACCOUNTS["Dev"], "region": REGION}), REPO, shared).values()
    place = _place("Dev")
    for policy in _of(Template.from_stack(stack).to_json(), "AWS::IAM::ManagedPolicy").values():
        text = json.dumps(place.resolve(policy["Properties"]["PolicyDocument"]), separators=(",", ":"))
        assert len(text) <= IAM_LIMIT, policy["Properties"]["ManagedPolicyName"]


# --- the workload boundary -------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("stage", list(ACCOUNTS))
def test_every_role_a_stage_creates_carries_the_boundary_and_stays_within_it(variant, stage):
    ci_templates, stage_templates = _ci_templates(variant), _stage_templates(variant)
    names = _Names(stage, stage_templates[stage])
    template = stage_templates[stage]
    (boundary,) = [names.place.resolve(r["Properties"]["PolicyDocument"])
                   for r in _of(ci_templates[stage], "AWS::IAM::ManagedPolicy").values()
                   if r["Properties"]["ManagedPolicyName"] == BOUNDARY_NAME]
    env = next(e for e in VARIANTS[variant] if e.name == stage)
    for lid, role in _of(template, "AWS::IAM::Role").items():
        props = names.place.resolve(role["Properties"])
        assert props["PermissionsBoundary"] == f"arn:aws:iam::{ACCOUNTS[stage]}:policy/{BOUNDARY_NAME}", lid
        assert props["Path"] == iam_path(env), lid
    outside = []
    for lid, policy in _of(template, "AWS::IAM::ManagedPolicy").items():
        for statement in names.place.resolve(policy["Properties"]["PolicyDocument"])["Statement"]:
            # A request the statement allows carries what its own StringEquals and Bool conditions require.
            context = {key: _listed(value)[0] for operator in ("StringEquals", "Bool")
                       for key, value in statement.get("Condition", {}).get(operator, {}).items()}
            for action in _listed(statement["Action"]):
                for resource in _listed(statement["Resource"]):
                    # A resource pattern lies within the boundary when the boundary allows it as written.
                    if not allowed(boundary, Request(service="", action=action, resource=resource, context=context),
                                   names.place, identity=True):
                        outside.append(f"{lid}: {action} on {resource}")
    assert outside == []
    for action, resource in (("s3:PutObject", "arn:aws:s3:::peagle-weights-prod/x"), ("iam:CreateRole", "*"),
                             ("sts:AssumeRole", "*"), ("s3:GetObject", "arn:aws:s3:::another-bucket/x"),
                             ("sagemaker:CreateEndpoint", "*"), ("kms:Decrypt", "*"),
                             ("sagemaker:CreateTrainingJob", f"arn:aws:sagemaker:{REGION}:{ACCOUNTS[stage]}:"
                                                             "training-job/mine"),
                             ("states:StartExecution", "*"), ("ssm:PutParameter", "*"),
                             ("s3:GetObject", "arn:aws:s3:::peagle-weights-prod/other/x")):
        assert not allowed(boundary, Request(service="", action=action, resource=resource), names.place,
                           identity=True), action


def _listed(value):  # noqa: ANN001, ANN202
    return value if isinstance(value, list) else [value]


def test_a_promoted_build_names_its_release_and_commit():
    """Version and revision are stack outputs; the version is in the model's environment too, the revision
    not (it would replace the model on every commit)."""
    from stacks.application import OFFLINE, build_app
    from stacks.release import VERSION
    from stacks.serving_stack import VERSION_VAR

    app = App(context={**OFFLINE, "gitRevision": "0123abcd"})
    stage = build_app(app, [ENVIRONMENTS[0]], nag=False)["Dev"]
    template = Template.from_stack(stage.stack).to_json()
    assert template["Outputs"]["Version"]["Value"] == VERSION
    assert template["Outputs"]["GitRevision"]["Value"] == "0123abcd"
    (model,) = _of(template, "AWS::SageMaker::Model").values()
    environment = model["Properties"]["PrimaryContainer"]["Environment"]
    assert environment[VERSION_VAR] == VERSION and "0123abcd" not in json.dumps(model)


def test_cfn_lint_finds_no_error_in_the_delivery_stacks(ci_templates, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    for name, template in ci_templates.items():
        path = tmp_path / f"{name}.template.json"
        path.write_text(json.dumps(template))
        proc = subprocess.run([str(cfn_lint), "--format", "parseable", str(path)], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode & ~(2 | 4 | 8) == 0, f"cfn-lint crashed ({proc.returncode}): {proc.stderr[-2000:]}"
        assert not proc.returncode & 2, f"cfn-lint errors in {name}:\n{proc.stdout}"
