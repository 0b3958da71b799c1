"""The promotion's AWS side (stacks/ci_roles.py) and what makes a promoted build identifiable."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from peagle_constructs import ServingConfigError
from stacks.ci_roles import CDK_BOOTSTRAP_ROLES, CiRolesStack, role_name
from stacks.environments import ENVIRONMENTS


@pytest.fixture(scope="module")
def template() -> dict:
    return Template.from_stack(CiRolesStack(App(), repository="acme/peagle")).to_json()


def _of(template: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def test_one_role_per_environment_trusting_only_that_environments_jobs_of_this_repository(template):
    roles = _of(template, "AWS::IAM::Role")
    by_name = {r["Properties"]["RoleName"]: r for r in roles.values()}
    assert set(by_name) == {role_name(env) for env in ENVIRONMENTS}
    (provider_id,) = _of(template, "AWS::IAM::OIDCProvider")
    for env in ENVIRONMENTS:
        (statement,) = by_name[role_name(env)]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
        assert statement["Principal"] == {"Federated": {"Ref": provider_id}}
        assert statement["Condition"] == {"StringEquals": {
            "token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
            "token.actions.githubusercontent.com:sub": f"repo:acme/peagle:environment:{env.name.lower()}"}}
    (provider,) = _of(template, "AWS::IAM::OIDCProvider").values()
    assert provider["Properties"]["Url"] == "https://token.actions.githubusercontent.com"


def test_a_role_may_only_use_the_cdk_bootstrap_roles_and_smoke_test_its_own_endpoint(template):
    for policy in _of(template, "AWS::IAM::Policy").values():
        statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
        assert set(statements) == {"CdkBootstrapRoles", "SmokeInvoke", "SmokeLogs", "SmokeAlarms", "SmokeStack",
                                   "SmokeDescribe"}
        text = json.dumps(statements)
        assert '"*"' not in text and "iam:PassRole" not in text  # no wildcard action or resource
        roles = json.dumps(statements["CdkBootstrapRoles"]["Resource"])
        assert all(f"cdk-hnb659fds-{kind}-role-" in roles for kind in CDK_BOOTSTRAP_ROLES)
        assert statements["SmokeInvoke"]["Action"] == "sagemaker:InvokeEndpoint"
        endpoint = json.dumps(statements["SmokeInvoke"]["Resource"])
        env = next(e for e in ENVIRONMENTS if e.endpoint_name in endpoint)
        group = (f"/aws/sagemaker/InferenceComponents/{env.component_name}" if env.component_name
                 else f"/aws/sagemaker/Endpoints/{env.endpoint_name}")
        assert f"{group}:*" in json.dumps(statements["SmokeLogs"]["Resource"])
        # Read only, on the stage's own stack; every call the smoke test makes is judged in
        # tests/deploy/test_smoke_permissions.py.
        assert all(a.split(":")[1].startswith(("Describe", "GetTemplate")) for s in ("SmokeStack", "SmokeDescribe")
                   for a in statements[s]["Action"])
        assert f"stack/{env.name}-PEagle/*" in json.dumps(statements["SmokeStack"]["Resource"])
        assert f"alarm:{env.endpoint_name}-*" in json.dumps(statements["SmokeAlarms"]["Resource"])


def test_the_repository_is_checked_at_synth():
    with pytest.raises(ServingConfigError) as caught:
        CiRolesStack(App(), repository="not a repo")
    assert caught.value.field_name == "githubRepository" and "<owner>/<repo>" in str(caught.value)


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
