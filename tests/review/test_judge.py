"""The judge's trusted inputs (review/judge.py) and its decision (review/pr_comment.py --set-status), against
the GitHub API stand-in of the rehearsal (harness/rehearsal/github_api.py) on loopback, which answers with
GitHub's shapes and refuses what a token's permissions do not allow.

The pull request and the commit come from the workflow_run event and the API: a run for this repository's
pull request lists it; a fork's lists none and is found by its head; either way only an open pull request
whose head is still the run's commit is judged, and a status is only set on that commit. Our own stand-in
judges the calls: GitHub's permission table is reproduced, not consulted."""

from __future__ import annotations

import json
import urllib.error

import pytest

from harness.rehearsal.github_api import GitHubApi
from review import judge, pr_comment
from review.github import GitHub
from review.verdicts import FAIL, PASS, Finding, StackReview

REPO = "example-org/peagle-serving"
HEAD, OTHER = "a" * 40, "b" * 40
JUDGE = {"contents": "read", "actions": "read", "pull-requests": "write", "statuses": "write"}


@pytest.fixture
def api():
    with GitHubApi(repository=REPO, token="owner") as api:
        yield api


def _github(api, permissions=JUDGE) -> GitHub:
    return GitHub(repository=REPO, token=api.issue_token(permissions, "judge"), api=api.url)


def _event(*, head=HEAD, listed=(7,), head_repo=REPO, branch="feature", conclusion="success", event="pull_request",
           repository=REPO) -> dict:
    return {"workflow_run": {"id": 99, "head_sha": head, "head_branch": branch, "event": event,
                             "conclusion": conclusion, "head_repository": {"full_name": head_repo},
                             "repository": {"full_name": repository},
                             "pull_requests": [{"number": n, "head": {"sha": head}} for n in listed]}}


def test_a_pull_request_of_this_repository_is_judged_on_its_head(api):
    api.open_pull_request(7, head_sha=HEAD, head_ref="feature")
    outputs = judge.resolve(_github(api), _event())
    assert outputs == {"judge": "true", "number": "7", "head-sha": HEAD}
    assert api.state.status_of(HEAD, judge.CONTEXT)["state"] == "pending"
    assert ("GET", f"/repos/{REPO}/pulls/7") in [(c.method, c.path) for c in api.state.calls]


def test_a_forks_pull_request_is_found_by_its_head(api):
    api.open_pull_request(3, head_sha=OTHER, head_ref="feature")  # this repository's branch of the same name
    api.open_pull_request(8, head_sha=HEAD, head_ref="feature", head_repo="contributor/peagle-serving")
    outputs = judge.resolve(_github(api), _event(listed=(), head_repo="contributor/peagle-serving"))
    assert outputs["judge"] == "true" and outputs["number"] == "8"
    (lookup,) = [c for c in api.state.calls if c.path == f"/repos/{REPO}/pulls"]
    assert lookup.status == 200


@pytest.mark.parametrize("case", ["pushed again", "another fork's branch", "closed"])
def test_a_pull_request_that_moved_on_is_not_judged_and_gets_no_status(api, case):
    if case == "pushed again":
        api.open_pull_request(7, head_sha=OTHER, head_ref="feature")
        event = _event()
    elif case == "another fork's branch":
        api.open_pull_request(8, head_sha=HEAD, head_ref="feature", head_repo="someone-else/peagle-serving")
        event = _event(listed=(), head_repo="contributor/peagle-serving")
    else:
        api.open_pull_request(7, head_sha=HEAD, head_ref="feature")
        api.state.pulls[7]["state"] = "closed"
        event = _event()
    assert judge.resolve(_github(api), event)["judge"] == "false"
    assert api.state.statuses == []


def test_a_failed_synth_fails_the_status_and_a_cancelled_one_is_left_to_the_newer_run(api):
    api.open_pull_request(7, head_sha=HEAD, head_ref="feature")
    assert judge.resolve(_github(api), _event(conclusion="failure"))["judge"] == "false"
    status = api.state.status_of(HEAD, judge.CONTEXT)
    assert status["state"] == "failure" and "synth ended failure" in status["description"]
    api.state.statuses.clear()
    assert judge.resolve(_github(api), _event(conclusion="cancelled"))["judge"] == "false"
    assert judge.resolve(_github(api), _event(event="push"))["judge"] == "false"
    assert api.state.statuses == []


@pytest.mark.parametrize("change, fragment", [
    ({"repository": "someone/else"}, "workflow_run.repository.full_name: allowed: example-org/peagle-serving"),
    ({"head": "not-a-sha"}, "workflow_run.head_sha: allowed: a commit SHA"),
    ({"head_repo": "../../x"}, "head_repository.full_name: allowed: owner/name"),
])
def test_an_event_that_does_not_name_a_run_of_this_repository_is_refused(api, change, fragment):
    with pytest.raises(judge.JudgeError, match=fragment.replace(".", r"\.")):
        judge.resolve(_github(api), _event(**change))


def test_a_token_without_the_permissions_is_refused_by_the_api(api):
    api.open_pull_request(7, head_sha=HEAD, head_ref="feature")
    read_only = _github(api, {"contents": "read"})
    with pytest.raises(urllib.error.HTTPError, match="403"):
        judge.resolve(read_only, _event())
    no_statuses = _github(api, {"contents": "read", "pull-requests": "write"})
    with pytest.raises(urllib.error.HTTPError, match="403"):
        judge.set_status(no_statuses, HEAD, state="success", description="x")
    assert api.state.statuses == [] and [c.status for c in api.state.calls] == [403, 403]


def test_a_status_is_one_of_githubs_states_with_a_short_description(api):
    github = _github(api)
    judge.set_status(github, HEAD, state="error", description="x" * 500)
    assert len(api.state.status_of(HEAD, judge.CONTEXT)["description"]) == judge.DESCRIPTION_LIMIT
    with pytest.raises(judge.JudgeError, match="allowed: error, failure, pending, success; found: 'approved'"):
        judge.set_status(github, HEAD, state="approved", description="x")


def _reviews(tmp_path, verdict: str):
    finding = Finding(verdict, "Endpoint", "AWS::SageMaker::Endpoint", "replaced" if verdict == FAIL else "updated",
                      "EndpointName changed")
    review = StackReview(display_name="Prod/PEagle", stack_name="Prod-PEagle", findings=[finding],
                         template_sha256="f" * 64)
    path = tmp_path / f"{verdict}.json"
    path.write_text(json.dumps({"base": "main @ 123", "reviews": [review.to_json()]}))
    return path


def test_the_decision_is_the_status_on_the_head_and_the_label_is_read_as_it_is_now(api, tmp_path, monkeypatch):
    api.open_pull_request(7, head_sha=HEAD, head_ref="feature")
    monkeypatch.setenv("GITHUB_API_URL", api.url)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    monkeypatch.setenv("GITHUB_TOKEN", api.issue_token(JUDGE, "judge"))
    monkeypatch.setenv("PR_NUMBER", "7")
    args = ["--reviews", str(_reviews(tmp_path, FAIL)), "--head", HEAD, "--post", "--set-status",
            "--acknowledge-label", "stack-diff-acknowledged"]
    assert pr_comment.main(args) == 0  # decided: the status says so, not the exit code
    status = api.state.status_of(HEAD, judge.CONTEXT)
    assert status["state"] == "failure" and "stack-diff-acknowledged" in status["description"]
    comment = api.state.comments_on(7)[0]["body"]
    assert "### Templates reviewed (SHA-256)" in comment and f"`{'f' * 64}`" in comment
    assert status["target_url"].endswith("#issuecomment-1001")
    api.set_labels(7, ["stack-diff-acknowledged"])
    assert pr_comment.main(args) == 0
    status = api.state.status_of(HEAD, judge.CONTEXT)
    assert status["state"] == "success" and "acknowledged by the label" in status["description"]
    assert len(api.state.comments_on(7)) == 1
    ok = ["--reviews", str(_reviews(tmp_path, PASS)), "--head", OTHER, "--set-status"]
    assert pr_comment.main(ok) == 0 and api.state.status_of(OTHER, judge.CONTEXT)["state"] == "success"
    # Without the labels permission the look-up is an error, never "not labelled" nor "labelled".
    monkeypatch.setenv("GITHUB_TOKEN", api.issue_token({"statuses": "write"}, "no-labels"))
    with pytest.raises(urllib.error.HTTPError, match="403"):
        pr_comment.main(["--reviews", str(_reviews(tmp_path, FAIL)), "--head", HEAD, "--set-status",
                         "--acknowledge-label", "stack-diff-acknowledged"])


def test_the_command_writes_step_outputs_and_keeps_notices_out_of_them(api, tmp_path, monkeypatch, capsys):
    api.open_pull_request(7, head_sha=OTHER, head_ref="feature")  # moved on: a notice, judge=false
    event, outputs = tmp_path / "event.json", tmp_path / "outputs"
    event.write_text(json.dumps(_event()))
    for name, value in (("GITHUB_API_URL", api.url), ("GITHUB_REPOSITORY", REPO), ("GITHUB_EVENT_PATH", str(event)),
                        ("GITHUB_TOKEN", api.issue_token(JUDGE, "judge")), ("GITHUB_OUTPUT", str(outputs))):
        monkeypatch.setenv(name, value)
    assert judge.main(["resolve"]) == 0
    assert outputs.read_text() == f"judge=false\nnumber=\nhead-sha={HEAD}\n"
    assert "::notice::no open pull request has head" in capsys.readouterr().out
