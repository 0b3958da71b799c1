"""The stack-diff gate's judge: which pull request a finished ``stack diff`` run was for, and the commit status
that branch protection requires on that pull request's head.

    python3 -m review.judge resolve                          (the workflow_run event at GITHUB_EVENT_PATH)
    python3 -m review.judge status --sha SHA --state error --description TEXT

The judge (.github/workflows/stack-diff-judge.yml) runs the base branch's code with a write token, so it
takes nothing from the pull request's run but its templates, as data (review.head_artifact). Which commit
and which pull request come from the event GitHub sent - the run's id, head commit, head repository and
branch, what triggered it and how it ended - and from GitHub's API as it is now:
- a run for a pull request from this repository lists that pull request in ``pull_requests``; a run for a
  fork's pull request lists none, so the pull request is looked up by its head (``owner:branch``);
- either way the judge goes on only for an open pull request whose head is still the run's head commit:
  a pull request pushed again since is judged by the newer run, and a status is only ever set on the
  commit whose templates were judged.

``resolve`` writes step outputs (``judge``, ``number``, ``head-sha``) to GITHUB_OUTPUT and sets the status: pending while
judging, failure when the pull request's own synth failed; nothing for a cancelled run (a newer push
cancelled it). ``status`` is the workflow's last word when a step failed (``error``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from review.github import GitHub

CONTEXT = "peagle/stack-diff"  # the status branch protection requires (docs/workflows.md)
WORKFLOW = "stack diff"  # the pull-request workflow's name (stack-diff.yml), as workflow_run names it
_SHA = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
# How a run can end without judging being due: cancelled by a newer push, or never run.
_NOT_JUDGED = frozenset({"cancelled", "skipped", "stale", "neutral"})
STATES = ("error", "failure", "pending", "success")
DESCRIPTION_LIMIT = 140  # GitHub's limit on a status description


class JudgeError(ValueError):
    pass


@dataclass(frozen=True)
class PullRequestRun:
    """The finished pull-request run, as the workflow_run event describes it."""

    id: int
    head_sha: str
    head_repository: str
    head_branch: str
    event: str
    conclusion: str
    listed: tuple[int, ...]  # the pull requests the event lists (none for a fork's)


def _field(data: dict, path: str):
    value = data
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise JudgeError(f"workflow_run event: {path}: allowed: present; found: missing")
        value = value[key]
    return value


def run_from_event(event: dict, *, repository: str) -> PullRequestRun:
    """The run the event reports, checked: it belongs to ``repository`` and names a commit."""
    run = _field(event, "workflow_run")
    owner = _field(run, "repository.full_name")
    if owner != repository:
        raise JudgeError(f"workflow_run.repository.full_name: allowed: {repository}; found: {str(owner)[:80]}")
    head_sha = _field(run, "head_sha")
    if not isinstance(head_sha, str) or not _SHA.match(head_sha):
        raise JudgeError(f"workflow_run.head_sha: allowed: a commit SHA; found: {str(head_sha)[:80]!r}")
    head_repository = (run.get("head_repository") or {}).get("full_name") or repository
    if not _REPOSITORY.match(str(head_repository)):
        raise JudgeError(f"workflow_run.head_repository.full_name: allowed: owner/name; found: {head_repository!r}")
    listed = tuple(int(pr["number"]) for pr in run.get("pull_requests") or [] if isinstance(pr.get("number"), int))
    return PullRequestRun(id=int(_field(run, "id")), head_sha=head_sha, head_repository=str(head_repository),
                          head_branch=str(run.get("head_branch") or ""), event=str(run.get("event") or ""),
                          conclusion=str(run.get("conclusion") or ""), listed=listed)


def _is_head(pull: dict, run: PullRequestRun) -> bool:
    head = pull.get("head") or {}
    return (pull.get("state") == "open" and head.get("sha") == run.head_sha
            and ((head.get("repo") or {}).get("full_name") or run.head_repository) == run.head_repository)


def find_pull_request(github: GitHub, run: PullRequestRun) -> int | None:
    """The open pull request whose head is the run's head commit now, or None."""
    if run.listed:
        candidates = [github.call("GET", f"pulls/{number}") for number in run.listed]
    else:  # a fork's pull request: the event lists none; GitHub finds it by its head, owner:branch
        owner = run.head_repository.split("/", 1)[0]
        candidates = list(github.pages("pulls", state="open", head=f"{owner}:{run.head_branch}"))
    found = sorted(int(pull["number"]) for pull in candidates if _is_head(pull, run))
    return found[0] if found else None


def run_url() -> str:
    return (f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{os.environ.get('GITHUB_REPOSITORY', '')}"
            f"/actions/runs/{os.environ.get('GITHUB_RUN_ID', '')}")


def set_status(github: GitHub, sha: str, *, state: str, description: str, target_url: str | None = None,
               context: str = CONTEXT) -> None:
    if state not in STATES:
        raise JudgeError(f"status state: allowed: {', '.join(STATES)}; found: {state!r}")
    if not _SHA.match(sha):
        raise JudgeError(f"status sha: allowed: a commit SHA; found: {sha[:80]!r}")
    body = {"state": state, "context": context, "description": description[:DESCRIPTION_LIMIT]}
    if target_url:
        body["target_url"] = target_url
    github.call("POST", f"statuses/{sha}", body)
    print(f"status {context} = {state} on {sha[:12]}: {body['description']}")


def resolve(github: GitHub, event: dict) -> dict[str, str]:
    """Step outputs: judge (true/false), number, head-sha; sets the status that fits the run's end."""
    run = run_from_event(event, repository=github.repository)
    skip = {"judge": "false", "number": "", "head-sha": run.head_sha}
    if run.event != "pull_request":
        print(f"::notice::the run was triggered by {run.event!r}, not a pull request: nothing to judge")
        return skip
    if run.conclusion in _NOT_JUDGED:
        print(f"::notice::the pull request's run ended {run.conclusion}: a newer run judges its pull request")
        return skip
    number = find_pull_request(github, run)
    if number is None:
        print(f"::notice::no open pull request has head {run.head_sha[:12]} now (pushed again, closed or merged): "
              "the newer run judges it")
        return skip
    if run.conclusion != "success":
        set_status(github, run.head_sha, state="failure", target_url=run_url(),
                   description=f"the pull request's synth ended {run.conclusion}: no templates to judge")
        return {**skip, "number": str(number)}
    set_status(github, run.head_sha, state="pending", target_url=run_url(),
               description="judging the pull request's templates against the base's own synth")
    return {"judge": "true", "number": str(number), "head-sha": run.head_sha}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m review.judge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("resolve", help="the pull request and commit of the workflow_run event (step outputs)")
    status = sub.add_parser("status", help="set the gate's status on a commit")
    status.add_argument("--sha", required=True)
    status.add_argument("--state", required=True, choices=STATES)
    status.add_argument("--description", required=True)
    args = parser.parse_args(argv)
    github = GitHub.from_environment()
    if args.command == "status":
        set_status(github, args.sha, state=args.state, description=args.description, target_url=run_url())
        return 0
    try:
        outputs = resolve(github, json.loads(Path(os.environ["GITHUB_EVENT_PATH"]).read_text()))
    except JudgeError as error:
        print(f"::error::{error}")
        return 1
    lines = "".join(f"{key}={value}\n" for key, value in outputs.items())
    print(lines, end="")
    if os.environ.get("GITHUB_OUTPUT"):  # the step's outputs; notices above stay in the log
        with open(os.environ["GITHUB_OUTPUT"], "a") as out:
            out.write(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
