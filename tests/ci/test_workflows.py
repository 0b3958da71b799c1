"""The GitHub workflows, judged by tools nobody here wrote: GitHub's workflow schema (check-jsonschema's
vendored copy) and zizmor's security audit (offline). Then what the workflows must do, read from the YAML:
the pull request's own job only synthesizes, with a read-only token; the judge (workflow_run, the base's
code) takes the templates as data before installing anything and decides by a commit status; the promotion
runs on main only and deploys one synthesized assembly through Dev, Staging and Prod in order, each behind
its environment, in the account the assembly names, with OIDC credentials. The refusal steps' own scripts
are run here with bash, on the right ref and on wrong ones."""

from __future__ import annotations

import os
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
    assert {p.name for p in WORKFLOWS} == {"stack-diff.yml", "stack-diff-judge.yml", "promote.yml", "deploy-stage.yml"}


def test_every_workflow_is_valid_against_githubs_schema():
    proc = _schema(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_finds_nothing(tmp_path):
    proc = _zizmor(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Only the acknowledgements of .github/zizmor.yml are ignored (three `./` reusable-workflow calls, the
    # judge's workflow_run trigger).
    assert "4 ignored" in proc.stdout + proc.stderr


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
    writes_allowed = {"stack-diff.yml": set(), "stack-diff-judge.yml": {"pull-requests", "statuses"},
                      "promote.yml": {"id-token"}, "deploy-stage.yml": {"id-token"}}[path.name]
    for name, job in workflow["jobs"].items():
        writes = {k for k, v in (job.get("permissions") or {}).items() if v == "write"}
        assert writes <= writes_allowed, (name, writes)


def _on(workflow: dict) -> dict:
    return workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as true


def test_the_pull_requests_own_job_only_synthesizes_with_a_read_only_token():
    """It runs the pull request's code: no token that may write, no OIDC, no secret, and no decision."""
    workflow = _load("stack-diff.yml")
    on = _on(workflow)
    assert set(on) == {"pull_request"}  # never pull_request_target: a fork's code never gets a write token
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read"}
    text = (REPO / ".github" / "workflows" / "stack-diff.yml").read_text()
    assert "github.token" not in text and "secrets." not in text and "GITHUB_TOKEN" not in text
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "cdk synth" in runs and "-c offline=true" in runs and "review.head_artifact pack" in runs
    assert "review.pr_comment" not in runs and "review.stack_diff" not in runs  # the judge decides
    uploads = [step for step in job["steps"] if "upload-artifact" in step.get("uses", "")]
    assert [u["with"]["name"] for u in uploads] == ["stack-templates"]
    assert not any("configure-aws-credentials" in step.get("uses", "") for step in job["steps"])


def _names_before(steps: list[dict], predicate) -> list[str]:
    """The names (or uses) of the steps before the first one matching ``predicate``."""
    out = []
    for step in steps:
        if predicate(step):
            return out
        out.append(step.get("name") or step.get("uses", ""))
    raise AssertionError("no such step")


def test_the_judge_runs_the_base_and_reads_the_pull_request_as_data():
    from review import judge

    workflow, pull_request = _load("stack-diff-judge.yml"), _load("stack-diff.yml")
    on = _on(workflow)
    assert set(on) == {"workflow_run"}
    assert on["workflow_run"] == {"workflows": [pull_request["name"]], "types": ["completed"]}
    assert pull_request["name"] == judge.WORKFLOW
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read", "actions": "read", "pull-requests": "write",
                                  "statuses": "write"}
    steps = job["steps"]
    (checkout,) = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    assert set(checkout["with"]) == {"persist-credentials"}  # no ref, no repository: the default branch's code
    (download,) = [s for s in steps if "download-artifact" in s.get("uses", "")]
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert download["with"]["skip-decompress"] is True and download["with"]["name"] == "stack-templates"
    # The zip is checked with the system's Python before anything is installed or any node tool runs.
    unpack = next(s for s in steps if "review.head_artifact unpack" in s.get("run", ""))
    assert unpack["run"].lstrip().startswith("python3 -m review.head_artifact unpack")
    before_unpack = _names_before(steps, lambda s: s is unpack)
    assert not any("make" in name or "setup-node" in name for name in before_unpack), before_unpack
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "review.stack_diff --base HEAD" in runs and "--head-templates" in runs
    assert "--acknowledge-label stack-diff-acknowledged --set-status" in runs
    assert "python3 -m review.judge resolve" in runs and "--state error" in runs
    # The commit and the pull request come from the resolve step (event + API), never from the artifact.
    decide = next(s for s in steps if "review.pr_comment" in s.get("run", ""))
    assert decide["env"]["HEAD_SHA"] == "${{ steps.pr.outputs.head-sha }}"
    assert decide["env"]["PR_NUMBER"] == "${{ steps.pr.outputs.number }}"
    assert not any("configure-aws-credentials" in s.get("uses", "") for s in steps)


def test_the_promotion_deploys_one_assembly_through_the_stages_in_order():
    promote, stage = _load("promote.yml"), _load("deploy-stage.yml")
    jobs = promote["jobs"]
    synth_runs = "\n".join(step.get("run", "") for step in jobs["synth"]["steps"])
    assert "cdk synth" in synth_runs and "gitRevision" in synth_runs
    synth_env = next(step["env"] for step in jobs["synth"]["steps"] if "cdk synth" in step.get("run", ""))
    for name in ("Dev", "Staging", "Prod"):  # each stage's own account, from the repository's variables
        assert f'-c account.{name}="${name.upper()}_ACCOUNT"' in synth_runs
        assert synth_env[f"{name.upper()}_ACCOUNT"] == f"${{{{ vars.{name.upper()}_ACCOUNT_ID }}}}"
    assert '-c region="$REGION"' in synth_runs and synth_env["REGION"] == "${{ vars.AWS_REGION }}"
    assert "ops.promotion digests" in synth_runs and "GITHUB_STEP_SUMMARY" in synth_runs
    assert jobs["synth"]["needs"] == "main-only"
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
    assert "ops.smoke" in runs and "--target aws" in runs
    creds = [step for step in deploy["steps"] if "configure-aws-credentials" in step.get("uses", "")]
    # The role and region of the account the assembly names for this stage (ops.promotion target).
    assert creds and creds[0]["with"] == {"role-to-assume": "${{ steps.target.outputs.role-arn }}",
                                          "aws-region": "${{ steps.target.outputs.region }}"}
    (target,) = [step for step in deploy["steps"] if step.get("id") == "target"]
    assert "ops.promotion target --assembly cdk.out" in target["run"]
    assert not any("aws-access-key-id" in step.get("with", {}) for step in deploy["steps"])  # OIDC only
    download = [step for step in deploy["steps"] if "download-artifact" in step.get("uses", "")]
    assert download and download[0]["with"]["name"] == "cloud-assembly"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_turns_the_cdk_clis_telemetry_off(path):
    assert yaml.safe_load(path.read_text()).get("env", {}).get("CDK_DISABLE_CLI_TELEMETRY") == "true"


def test_no_workflow_reads_a_role_or_account_from_a_variable():
    """A deploy's account and role come from the assembly; the old single-account variables are gone."""
    for path in WORKFLOWS:
        text = path.read_text()
        assert "DEPLOY_ROLE_ARN" not in text and "AWS_ACCOUNT_ID" not in text, path.name


def _bash(script: str, **env: str) -> subprocess.CompletedProcess:
    clean = {"PATH": os.environ["PATH"], **env}
    return subprocess.run(["bash", "-e", "-c", script], env=clean, capture_output=True, text=True)


REPOSITORY = "example-org/peagle-serving"
PROMOTE_ON_MAIN = f"{REPOSITORY}/.github/workflows/promote.yml@refs/heads/main"


def test_promote_refuses_a_run_that_is_not_on_main_before_anything_else():
    jobs = _load("promote.yml")["jobs"]
    first = list(jobs)[0]
    assert first == "main-only" and jobs[first]["permissions"] == {} and "needs" not in jobs[first]

    def depends_on_guard(name: str) -> bool:
        needs = jobs[name].get("needs")
        needs = [needs] if isinstance(needs, str) else (needs or [])
        return "main-only" in needs or any(depends_on_guard(n) for n in needs)

    assert all(depends_on_guard(name) for name in jobs if name != "main-only")
    (step,) = jobs["main-only"]["steps"]
    on_main = _bash(step["run"], GITHUB_REF="refs/heads/main", GITHUB_SHA="a" * 40, EVENT="workflow_dispatch")
    assert on_main.returncode == 0, on_main.stdout + on_main.stderr
    for ref in ("refs/heads/feature", "refs/heads/main-hotfix", "refs/tags/v1", "refs/pull/3/merge"):
        refused = _bash(step["run"], GITHUB_REF=ref, GITHUB_SHA="a" * 40, EVENT="workflow_dispatch")
        assert refused.returncode == 1 and f"on {ref}; allowed: refs/heads/main" in refused.stdout, refused.stdout


def test_a_stage_deploy_refuses_any_caller_but_promote_on_main_before_credentials():
    (deploy,) = _load("deploy-stage.yml")["jobs"].values()
    guard = deploy["steps"][0]
    assert guard["name"].startswith("Refuse") and "uses" not in guard
    assert not any("configure-aws-credentials" in step.get("uses", "") or "checkout" in step.get("uses", "")
                   for step in deploy["steps"][:1])
    ok = _bash(guard["run"], GITHUB_REF="refs/heads/main", GITHUB_REPOSITORY=REPOSITORY,
               GITHUB_WORKFLOW_REF=PROMOTE_ON_MAIN)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = {
        "another branch": {"GITHUB_REF": "refs/heads/feature",
                           "GITHUB_WORKFLOW_REF": f"{REPOSITORY}/.github/workflows/promote.yml@refs/heads/feature"},
        "another workflow on main": {"GITHUB_REF": "refs/heads/main",
                                     "GITHUB_WORKFLOW_REF": f"{REPOSITORY}/.github/workflows/other.yml@refs/heads/main"},
        "another repository's promote": {"GITHUB_REF": "refs/heads/main",
                                         "GITHUB_WORKFLOW_REF": "fork/peagle-serving/.github/workflows/promote.yml@refs/heads/main"},
        "main's name on another ref": {"GITHUB_REF": "refs/heads/feature", "GITHUB_WORKFLOW_REF": PROMOTE_ON_MAIN},
        "no caller": {"GITHUB_REF": "refs/heads/main", "GITHUB_WORKFLOW_REF": ""},
    }
    for case, env in wrong.items():
        refused = _bash(guard["run"], GITHUB_REPOSITORY=REPOSITORY, **env)
        assert refused.returncode == 1 and "allowed: ref refs/heads/main, caller " in refused.stdout, (case, refused.stdout)
