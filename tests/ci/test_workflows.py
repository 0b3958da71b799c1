"""The GitHub workflows, judged by tools nobody here wrote: GitHub's workflow schema (check-jsonschema's
vendored copy) and zizmor's security audit (offline). Then what the workflows must do, read from the YAML:
the pull-request job comments with the repository's own script, the promotion deploys one synthesized
assembly through Dev, Staging and Prod in order, each behind its environment, with OIDC credentials."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def _load(name: str) -> dict:
    return yaml.safe_load((REPO / ".github" / "workflows" / name).read_text())


def _schema(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                           *map(str, paths)], capture_output=True, text=True)


def _zizmor(*paths: Path) -> subprocess.CompletedProcess:
    # Offline: the audits that need GitHub's API are skipped. Every severity counts, informational included.
    return subprocess.run([str(BIN / "zizmor"), "--offline", "--color", "never", "--min-severity", "informational",
                           *map(str, paths)],
                          capture_output=True, text=True)


def test_the_workflows_exist():
    assert {p.name for p in WORKFLOWS} == {"stack-diff.yml", "promote.yml", "deploy-stage.yml"}


def test_every_workflow_is_valid_against_githubs_schema():
    proc = _schema(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_finds_nothing(tmp_path):
    proc = _zizmor(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Only the acknowledgements of .github/zizmor.yml are ignored (three `./` reusable-workflow calls).
    assert "3 ignored" in proc.stdout + proc.stderr


BAD_WORKFLOW = """
name: bad
on: pull_request_target
jobs:
  x:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.event.pull_request.head.sha }}
      - run: echo "${{ github.event.pull_request.title }}"
"""


def test_the_judges_can_fail(tmp_path):
    """Negative controls: a workflow with template injection and an unpinned action fails zizmor; a workflow
    with a misspelt key fails the schema."""
    bad = tmp_path / "bad.yml"
    bad.write_text(BAD_WORKFLOW)
    proc = _zizmor(bad)
    assert proc.returncode != 0 and "template-injection" in proc.stdout + proc.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\non: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    stepz: []\n")
    assert _schema(broken).returncode != 0


def _steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_and_no_job_holds_more_than_it_needs(path):
    workflow = yaml.safe_load(path.read_text())
    assert workflow["permissions"] == {}  # nothing by default; each job says what it needs
    for step in _steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
            if step["uses"].startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    for name, job in workflow["jobs"].items():
        writes = {k for k, v in (job.get("permissions") or {}).items() if v == "write"}
        assert writes <= {"pull-requests", "id-token"}, (name, writes)


def test_the_pull_request_job_diffs_offline_and_comments_with_the_repositorys_script():
    workflow = _load("stack-diff.yml")
    on = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as true
    assert "pull_request" in on and "pull_request_target" not in on  # a fork's code never gets a write token
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "review.stack_diff" in runs and "--json" in runs and "review.pr_comment" in runs
    assert "--post" in runs and "GITHUB_STEP_SUMMARY" in runs
    assert "--acknowledge-label stack-diff-acknowledged" in runs  # read through the API, as labelled now
    assert not any("configure-aws-credentials" in step.get("uses", "") for step in job["steps"])


def test_the_promotion_deploys_one_assembly_through_the_stages_in_order():
    promote, stage = _load("promote.yml"), _load("deploy-stage.yml")
    jobs = promote["jobs"]
    synth_runs = "\n".join(step.get("run", "") for step in jobs["synth"]["steps"])
    assert "cdk synth" in synth_runs and "gitRevision" in synth_runs
    assert any(step.get("with", {}).get("name") == "cloud-assembly" for step in jobs["synth"]["steps"])
    order = [("dev", "synth", "Dev"), ("staging", "dev", "Staging"), ("prod", "staging", "Prod")]
    for job, after, name in order:
        assert jobs[job]["needs"] == after and jobs[job]["with"] == {"stage": name, "environment": job}
        assert jobs[job]["uses"] == "./.github/workflows/deploy-stage.yml"
        assert jobs[job]["permissions"]["id-token"] == "write"
    (deploy,) = stage["jobs"].values()
    assert deploy["environment"] == "${{ inputs.environment }}"  # the environment's reviewers gate it
    runs = "\n".join(step.get("run", "") for step in deploy["steps"])
    assert "cdk deploy --app cdk.out" in runs and "cdk synth" not in runs  # the same build, not a new one
    assert "harness.smoke" in runs and "--target aws" in runs
    creds = [step for step in deploy["steps"] if "configure-aws-credentials" in step.get("uses", "")]
    assert creds and creds[0]["with"]["role-to-assume"] == "${{ vars.DEPLOY_ROLE_ARN }}"
    assert not any("aws-access-key-id" in step.get("with", {}) for step in deploy["steps"])  # OIDC only
    download = [step for step in deploy["steps"] if "download-artifact" in step.get("uses", "")]
    assert download and download[0]["with"]["name"] == "cloud-assembly"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_turns_the_cdk_clis_telemetry_off(path):
    assert yaml.safe_load(path.read_text()).get("env", {}).get("CDK_DISABLE_CLI_TELEMETRY") == "true"
