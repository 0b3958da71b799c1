"""The rehearsal's scenarios: pull requests and a merge, as a team meets them, each judged on what act
itself produced (job and step results, the steps' output, the job summaries), on the calls the GitHub API
stand-in recorded, and on what the embedded AWS holds afterwards.

1. ``pull_request_change_k``: a pull request that changes Prod's K. The stack-diff check passes and posts one
   comment whose per-stage table is in the job summary too; a second push updates that same comment.
2. ``pull_request_rename_endpoint``: a pull request that renames the Prod endpoint (a replacement: downtime).
   The check fails; once the pull request carries ``stack-diff-acknowledged``, re-running the same event
   (whose payload still has no label) passes, because the label is read as it is now.
3. ``merge_promotes``: a merge to main. Promote synthesizes once; Dev, Staging and Prod are deployed from
   that assembly (its stamped revision is what each deployed stack reports), each smoke-tested through
   boto3's sagemaker-runtime client, one after the other.
4. ``failed_dev_smoke_stops_staging``: the same merge with Dev's endpoint not answering: Dev's smoke test
   fails, Staging and Prod never start and are never deployed.
5. ``old_setuptools_fails_synth`` (negative control): the commit before this rehearsal existed built the
   image's wheels with the environment's own setuptools; on a fresh runner's venv the synth step fails
   (``invalid command 'bdist_wheel'``), as it did on GitHub.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.rehearsal.engine import REPOSITORY, TOKEN, JobResult, RunResult, Scratch

ACK_LABEL = "stack-diff-acknowledged"
PR_JOB = "diff"  # stack-diff.yml's job id
ENVIRONMENTS_PY = Path("stacks") / "environments.py"


@dataclass
class Outcome:
    scenario: str
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(ok for _, ok, _ in self.checks)

    def failed(self) -> list[str]:
        return [f"{name}: {detail}" for name, ok, detail in self.checks if not ok]

    def report(self) -> str:
        lines = [f"{'PASS' if self.ok else 'FAIL'} {self.scenario}"]
        lines += [f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}" for name, ok, detail in self.checks]
        lines += [f"  act log: {run.log}" for run in self.runs]
        return "\n".join(lines)


def _edit(path: Path, old: str, new: str) -> Callable[[Path], None]:
    def edit(work: Path) -> None:
        target = work / path
        text = target.read_text()
        if old not in text:
            raise AssertionError(f"the scenario's edit no longer applies: {old!r} is not in {path}")
        target.write_text(text.replace(old, new, 1))
    return edit


def _prod_k(old: int, new: int) -> Callable[[Path], None]:
    return _edit(ENVIRONMENTS_PY, f'**_bundle("prod"), num_speculative_tokens={old}',
                 f'**_bundle("prod"), num_speculative_tokens={new}')


def pull_request_payload(scratch: Scratch, *, number: int, action: str, head: str, branch: str,
                         labels: list[str] | None = None) -> dict:
    return {"action": action, "number": number, "repository": {"full_name": REPOSITORY},
            "pull_request": {"number": number, "labels": [{"name": name} for name in labels or []],
                             "head": {"sha": head, "ref": branch}, "base": {"sha": scratch.main, "ref": "main"}}}


def _check_pull_request(scratch: Scratch, api, out: Outcome, payload: dict, *, label: str, echo) -> JobResult | None:
    """One run of the stack-diff workflow for ``payload``, kept in ``out``; returns its job."""
    head = payload["pull_request"]["head"]["sha"]
    run = scratch.run("pull_request", payload, sha=head, label=label, env={"GITHUB_API_URL": api.url}, echo=echo)
    out.runs.append(run)
    return run.job(PR_JOB)


def _result(job: JobResult | None) -> str:
    return f"{job.result}" if job else "the job never ran"


def _posted(api, number: int) -> list[dict]:
    return api.state.comments_on(number)


def _writes(api) -> list[str]:
    return [f"{c.method} {c.path}" for c in api.state.calls if c.method in ("POST", "PATCH")]


def pull_request_change_k(scratch: Scratch, api, *, echo=None) -> Outcome:
    out = Outcome("a pull request that changes K: the check passes, one comment, updated in place")
    number, branch = 11, "change-prod-k"
    first = scratch.commit(parent=scratch.main, branch=branch, message="Prod drafts 5 tokens", edit=_prod_k(7, 5))
    job = _check_pull_request(scratch, api, out, pull_request_payload(
        scratch, number=number, action="opened", head=first, branch=branch), label="pr-change-k", echo=echo)
    out.check("the stack-diff job passes", job is not None and job.result == "success", _result(job))
    comments = _posted(api, number)
    out.check("one comment is posted", len(comments) == 1 and _writes(api).count(
        f"POST /repos/{REPOSITORY}/issues/{number}/comments") == 1, f"writes: {_writes(api)}")
    body = comments[0]["body"] if comments else ""
    out.check("the comment says what changes in Prod", "`Prod/PEagle` | ✅ | 0 | 3 | 0 | 2 |" in body
              and '"num_speculative_tokens":5' in body, body[:300])
    summary = job.summary if job else ""
    out.check("the job summary holds the per-stage table",
              "### Per stage" in summary and all(f"`{stage}/PEagle`" in summary for stage in ("Dev", "Staging", "Prod")),
              f"{len(summary)} characters")
    first_id = comments[0]["id"] if comments else None
    second = scratch.commit(parent=first, branch=branch, message="Prod drafts 6 tokens", edit=_prod_k(5, 6))
    job = _check_pull_request(scratch, api, out, pull_request_payload(
        scratch, number=number, action="synchronize", head=second, branch=branch), label="pr-change-k-again",
        echo=echo)
    out.check("the second push's check passes", job is not None and job.result == "success", _result(job))
    comments = _posted(api, number)
    patched = f"PATCH /repos/{REPOSITORY}/issues/comments/{first_id}"
    out.check("the second push updates the same comment", len(comments) == 1 and patched in _writes(api)
              and '"num_speculative_tokens":6' in comments[0]["body"] and second[:12] in comments[0]["body"],
              f"writes: {_writes(api)}")
    return out


def _rename_prod(work: Path) -> None:
    _edit(ENVIRONMENTS_PY, 'return f"peagle-{self.name.lower()}"',
          'return "peagle-production" if self.name == "Prod" else f"peagle-{self.name.lower()}"')(work)


def pull_request_rename_endpoint(scratch: Scratch, api, *, echo=None) -> Outcome:
    out = Outcome("a pull request that renames the Prod endpoint: fails, passes once acknowledged")
    number, branch = 12, "rename-prod-endpoint"
    head = scratch.commit(parent=scratch.main, branch=branch, message="Prod endpoint renamed", edit=_rename_prod)
    payload = pull_request_payload(scratch, number=number, action="opened", head=head, branch=branch)
    job = _check_pull_request(scratch, api, out, payload, label="pr-rename", echo=echo)
    out.check("the stack-diff job fails", job is not None and job.result == "failure", _result(job))
    out.check("it fails at the decision, after the diff and the comment",
              job is not None and job.step("Diff every stage") == "success"
              and job.step("Comment, summarise, decide") == "failure", str(job.steps if job else None))
    comments = _posted(api, number)
    body = comments[0]["body"] if comments else ""
    out.check("the comment names the endpoint's replacement first", "### ⚠️ Destructive changes" in body
              and "Prod/PEagle" in body.split("### Per stage")[0] and "❌" in body, body[:300])
    api.set_labels(number, [ACK_LABEL])
    # GitHub's "re-run" sends the original payload again: no label in it. The label is read from the API.
    job = _check_pull_request(scratch, api, out, payload, label="pr-rename-rerun-labelled", echo=echo)
    out.check("with the label, the re-run passes", job is not None and job.result == "success", _result(job))
    out.check("the labels were read from the API",
              any(c.method == "GET" and c.path.endswith(f"/issues/{number}/labels") for c in api.state.calls))
    out.check("still one comment on the pull request", len(_posted(api, number)) == 1, f"writes: {_writes(api)}")
    return out


PROMOTE_JOBS = ("synth", "dev", "staging", "prod")


def _promote(scratch: Scratch, account, *, label: str, echo=None) -> RunResult:
    payload = {"ref": "refs/heads/main", "before": "0" * 40, "after": scratch.main,
               "repository": {"full_name": REPOSITORY}}
    return scratch.run("push", payload, sha=scratch.main, label=label, env=account.job_environment(),
                       path_prefix=account.path_prefix(),
                       variables={"AWS_ACCOUNT_ID": account.account, "AWS_REGION": account.region,
                                  "DEPLOY_ROLE_ARN": f"arn:aws:iam::{account.account}:role/peagle-deploy"},
                       echo=echo)


def merge_promotes(scratch: Scratch, account, *, echo=None) -> Outcome:
    out = Outcome("a merge to main: one synth, Dev then Staging then Prod, each deployed and smoke-tested")
    run = _promote(scratch, account, label="promote", echo=echo)
    out.runs.append(run)
    for name in PROMOTE_JOBS:
        job = run.job(name)
        out.check(f"{name} succeeds", job is not None and job.result == "success", run.describe())
    order = [key.split("/")[0] for key in run.jobs]
    out.check("the jobs ran in order", order == list(PROMOTE_JOBS), str(order))
    synthesized = [name for name in PROMOTE_JOBS[1:] if "cdk synth" in (run.job(name).text if run.job(name) else "")]
    out.check("only the synth job synthesizes", not synthesized, str(synthesized))
    stacks = account.stacks()
    out.check("every stage is deployed", {f"{s}-PEagle": "CREATE_COMPLETE" for s in ("Dev", "Staging", "Prod")}
              .items() <= stacks.items(), str(stacks))
    # The deployed templates' GitRevision output (moto reports no outputs for a stack made by a change set).
    revisions = {}
    cfn = account.client("cloudformation")
    for stage in ("Dev", "Staging", "Prod"):
        name = f"{stage}-PEagle"
        body = cfn.get_template(StackName=name)["TemplateBody"] if name in stacks else {}
        body = json.loads(body) if isinstance(body, str) else body
        revisions[stage] = body.get("Outputs", {}).get("GitRevision", {}).get("Value")
    out.check("each stage runs the assembly synthesized from the merged commit",
              set(revisions.values()) == {scratch.main}, str(revisions))
    for name in PROMOTE_JOBS[1:]:
        job = run.job(name)
        out.check(f"{name}'s smoke test passes through boto3", job is not None and "smoke test passed" in job.text
                  and job.step("Smoke test") == "success", job.step("Smoke test") if job else "not run")
        said = next((line.strip() for line in (job.text if job else "").splitlines()
                     if "the container runs the serving config deployed" in line), "no such check in its log")
        out.check(f"{name}'s container runs its stage's deployed serving config", said.startswith("ok"), said)
    out.check("each stage's request lines reached its log group", len(account.shipped) == 3
              and min(account.shipped.values()) >= 3, str(account.shipped))
    return out


def failed_dev_smoke_stops_staging(scratch: Scratch, account, *, echo=None) -> Outcome:
    out = Outcome("a merge whose Dev smoke test fails: Staging and Prod never start")
    run = _promote(scratch, account, label="promote-dev-down", echo=echo)
    out.runs.append(run)
    synth, dev = run.job("synth"), run.job("dev")
    out.check("synth succeeds", synth is not None and synth.result == "success", run.describe())
    out.check("Dev is deployed, then its smoke test fails", dev is not None and dev.result == "failure"
              and dev.step("Deploy the synthesized assembly") == "success" and dev.step("Smoke test") == "failure",
              str(dev.steps if dev else None))
    out.check("Staging and Prod never start", run.job("staging") is None and run.job("prod") is None, run.describe())
    stacks = account.stacks()
    out.check("only Dev is in the account", set(stacks) == {"Dev-PEagle"}, str(stacks))
    return out


def _old_wheel_build(work: Path) -> None:
    _edit(Path("stacks") / "release.py", '"--no-deps", "-q",', '"--no-deps", "--no-build-isolation", "-q",')(work)


def old_setuptools_fails_synth(scratch: Scratch, *, echo=None) -> Outcome:
    out = Outcome("negative control: a build that uses the runner's own setuptools fails at the synth step")
    head = scratch.commit(parent=scratch.main, branch="old-wheel-build", message="wheels without isolation",
                          edit=_old_wheel_build)
    payload = {"ref": "refs/heads/main", "before": scratch.main, "after": head, "repository": {"full_name": REPOSITORY}}
    run = scratch.run("push", payload, sha=head, label="negative-control", job="synth",
                      variables={"AWS_ACCOUNT_ID": "123456789012", "AWS_REGION": "us-east-1"}, echo=echo)
    out.runs.append(run)
    job = run.job("synth")
    out.check("the synth job fails", job is not None and job.result == "failure", run.describe())
    out.check("at the synth step, after a clean set-up", job is not None
              and job.step("Install the CDK side") == "success" and job.step("Synthesize every stage") == "failure",
              str(job.steps if job else None))
    out.check("because the runner's setuptools cannot build a wheel", job is not None
              and "invalid command 'bdist_wheel'" in job.text, job.text[-300:] if job else "")
    return out


