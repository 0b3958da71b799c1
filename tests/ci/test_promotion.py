"""What the promotion reads from the assembly it deploys (ops.promotion): where each stage deploys - its
account and region from the manifest, and the deploy role there as stacks/ci_roles.py names it - and each
template's digest as deployed and as reviewed. The last is judged on the real app: synthesized for review and
synthesized for three accounts with a revision, the "as reviewed" digest of each real template equals the
SHA-256 of the review synth's template, and differs when the app renders another template for an account."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ops import cdk
from ops import promotion

ACCOUNTS = {"Dev": "210000000001", "Staging": "210000000002", "Prod": "210000000003"}


def _assembly(root: Path, environments: dict[str, list[str]]) -> Path:
    """A cloud assembly whose stage ``name`` holds one stack per environment string given."""
    root.mkdir()
    top = {}
    for stage, envs in environments.items():
        folder = root / f"assembly-{stage}"
        folder.mkdir()
        artifacts = {}
        for i, env in enumerate(envs):
            (folder / f"{stage}{i}.template.json").write_text('{"Resources": {}}')
            artifacts[f"{stage}{i}"] = {"type": "aws:cloudformation:stack", "environment": env,
                                        "displayName": f"{stage}/Stack{i}",
                                        "properties": {"templateFile": f"{stage}{i}.template.json"}}
        (folder / "manifest.json").write_text(json.dumps({"version": "55.0.0", "artifacts": artifacts}))
        top[f"assembly-{stage}"] = {"type": "cdk:cloud-assembly",
                                    "properties": {"directoryName": f"assembly-{stage}", "displayName": stage}}
    (root / "manifest.json").write_text(json.dumps({"version": "55.0.0", "artifacts": top}))
    return root


def test_a_stage_deploys_where_its_assembly_says_as_the_role_ci_roles_names(tmp_path):
    from stacks.ci_roles import role_name
    from stacks.environments import STAGING

    assembly = _assembly(tmp_path / "a", {"Dev": ["aws://210000000001/eu-west-1"],
                                          "Staging": ["aws://210000000002/eu-west-1", "aws://210000000002/eu-west-1"]})
    found = promotion.target(assembly, "Staging")
    assert (found.account, found.region) == ("210000000002", "eu-west-1")
    assert found.role_arn == f"arn:aws:iam::210000000002:role/{role_name(STAGING)}"
    assert found.role_arn.endswith(":role/peagle-deploy-staging")
    assert found.outputs() == ("account=210000000002\nregion=eu-west-1\n"
                               "role-arn=arn:aws:iam::210000000002:role/peagle-deploy-staging\n")


@pytest.mark.parametrize("envs, fragment", [
    (["aws://unknown-account/eu-west-1"], "allowed: aws://<12 digits>/<region>; found: Staging/Stack0 (aws://unknown"),
    (["aws://210000000002/unknown-region"], "found: Staging/Stack0 (aws://210000000002/unknown)"),
    (["aws://2100000000/eu-west-1"], "found: Staging/Stack0 (aws://2100000000/eu-west-1)"),
    (["aws://210000000002/eu-west-1", "aws://210000000009/eu-west-1"],
     "allowed: one account and region for all its stacks; found: 210000000002/eu-west-1, 210000000009/eu-west-1"),
])
def test_a_stage_without_one_concrete_place_is_refused(tmp_path, envs, fragment):
    assembly = _assembly(tmp_path / "a", {"Staging": envs})
    with pytest.raises(cdk.CdkError) as caught:
        promotion.target(assembly, "Staging")
    assert fragment in str(caught.value) and "stage Staging" in str(caught.value)


def test_an_unknown_stage_is_refused_by_the_command(tmp_path, capsys):
    assembly = _assembly(tmp_path / "a", {"Staging": ["aws://210000000002/eu-west-1"]})
    assert promotion.main(["target", "--assembly", str(assembly), "--stage", "Qa"]) == 1
    assert "no stage 'Qa'" in capsys.readouterr().out
    # A stage in the assembly that stacks/environments.py does not know has no deploy role.
    other = _assembly(tmp_path / "b", {"Qa": ["aws://210000000002/eu-west-1"]})
    with pytest.raises(cdk.CdkError, match=r"--stage: allowed: Dev, Staging, Prod; found: 'Qa'"):
        promotion.target(other, "Qa")


def test_review_form_puts_the_placeholders_back_byte_for_byte():
    real = b'{"A": "arn:aws:iam::210000000002:role/x", "R": "eu-west-1", "GitRevision": "' + b"ab" * 20 + b'"}'
    reviewed = promotion.review_form(real, account="210000000002", region="eu-west-1", revision="ab" * 20,
                                     review_account="111111111111", review_region="us-east-1")
    assert reviewed == b'{"A": "arn:aws:iam::111111111111:role/x", "R": "us-east-1", "GitRevision": "unset"}'


def _synth(outdir: Path, context: dict, environments) -> Path:
    from aws_cdk import App

    from stacks.application import build_app

    app = App(outdir=str(outdir), context=context)
    build_app(app, environments, nag=False)
    app.synth()
    return outdir


@pytest.mark.slow
def test_as_reviewed_equals_the_review_synth_and_catches_an_app_that_renders_another_template(tmp_path):
    from stacks.application import OFFLINE
    from stacks.environments import ENVIRONMENTS

    # Pins are another part's business: these copies need none, so both synths take the same weights paths.
    environments = [dataclasses.replace(env, require_pinned_weights=False) for env in ENVIRONMENTS]
    reviewed = _synth(tmp_path / "review", dict(OFFLINE), environments)
    revision = "c0ffee" * 6 + "c0ff"
    deployed_context = {**{f"account.{stage}": account for stage, account in ACCOUNTS.items()},
                        "region": "eu-west-1", "gitRevision": revision}
    deployed = _synth(tmp_path / "deployed", deployed_context, environments)
    review_digests = {s.display_name: s.template_sha256() for s in cdk.list_stacks(reviewed)}
    rows = {r.display_name: r for r in promotion.digests(deployed, revision=revision)}
    assert sorted(rows) == sorted(review_digests) == ["Dev/PEagle", "Prod/PEagle", "Staging/PEagle"]
    for name, row in rows.items():
        assert row.account == ACCOUNTS[name.split("/")[0]] and row.region == "eu-west-1"
        assert row.deployed != review_digests[name]  # the placement and the revision are in the bytes
        assert row.as_reviewed == review_digests[name], name
    markdown = promotion.digests_markdown(list(rows.values()), revision=revision)
    assert all(f"`{r.deployed}` | `{r.as_reviewed}` |" in markdown for r in rows.values())
    # An app that renders Prod otherwise for an account than for review: its "as reviewed" no longer matches.
    from stacks.environments import PROD

    def other_k(env):
        if env.name != PROD.name:
            return env
        serving = dataclasses.replace(env.model.serving, num_speculative_tokens=3)
        return dataclasses.replace(env, model=dataclasses.replace(env.model, serving=serving))

    tampered = _synth(tmp_path / "tampered", deployed_context, [other_k(env) for env in environments])
    rows = {r.display_name: r for r in promotion.digests(tampered, revision=revision)}
    assert rows["Prod/PEagle"].as_reviewed != review_digests["Prod/PEagle"]
    assert rows["Dev/PEagle"].as_reviewed == review_digests["Dev/PEagle"]
