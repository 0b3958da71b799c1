"""The rehearsal's own parts that need no act run (the scenarios themselves run in `make rehearse`): the token a
run gets is exactly what its workflow declares, the GitHub API stand-in refuses what that token may not do and
serves a finished run's artifact as GitHub keeps it, the download-artifact stand-in fetches it through the API
with a token (and refuses without one that may), and a rehearsal can start from the uncommitted work tree
without touching this repository."""

from __future__ import annotations

import io
import json
import os
import subprocess
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from harness.rehearsal import engine
from harness.rehearsal.github_api import GitHubApi

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"


def test_a_runs_token_has_what_its_workflow_declares_and_no_more():
    assert engine.declared_permissions(WORKFLOWS / "stack-diff.yml") == {"contents": "read"}
    assert engine.declared_permissions(WORKFLOWS / "stack-diff-judge.yml") == {
        "contents": "read", "actions": "read", "pull-requests": "write", "statuses": "write"}
    assert engine.declared_permissions(WORKFLOWS / "promote.yml") == {"contents": "read", "id-token": "write"}


def _call(api: GitHubApi, token: str, method: str, path: str, body: dict | None = None):
    request = urllib.request.Request(api.url + path, method=method, headers={"Authorization": f"Bearer {token}"},
                                     data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status, answer.read()


def test_the_api_stand_in_refuses_what_a_token_may_not_do():
    repo = "o/r"
    with GitHubApi(repository=repo, token="owner") as api:
        api.open_pull_request(1, head_sha="a" * 40, head_ref="b")
        read_only = api.issue_token(engine.declared_permissions(WORKFLOWS / "stack-diff.yml"), "pr")
        for method, path, body in (("POST", f"/repos/{repo}/issues/1/labels", {"labels": ["x"]}),
                                   ("POST", f"/repos/{repo}/issues/1/comments", {"body": "x"}),
                                   ("POST", f"/repos/{repo}/statuses/{'a' * 40}", {"state": "success"}),
                                   ("GET", f"/repos/{repo}/pulls/1", None),
                                   ("GET", f"/repos/{repo}/actions/runs/1/artifacts", None)):
            with pytest.raises(urllib.error.HTTPError) as caught:
                _call(api, read_only, method, path, body)
            assert caught.value.code == 403, (method, path)
        with pytest.raises(urllib.error.HTTPError, match="401"):
            _call(api, "made-up", "GET", f"/repos/{repo}/pulls/1")
        judge = api.issue_token(engine.declared_permissions(WORKFLOWS / "stack-diff-judge.yml"), "judge")
        assert _call(api, judge, "POST", f"/repos/{repo}/statuses/{'a' * 40}", {"state": "success"})[0] == 201
        assert api.state.labels == {} and [s["token"] for s in api.state.statuses] == ["judge"]
        assert [(c.token, c.status) for c in api.state.calls][:2] == [("pr", 403), ("pr", 403)]


def _action_script(name: str) -> str:
    import yaml

    (step,) = yaml.safe_load((engine.ACTIONS_DIR / name / "action.yml").read_text())["runs"]["steps"]
    return step["run"]


def test_download_artifact_fetches_another_runs_zip_through_the_api(tmp_path):
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("index.json", "{}")
    with GitHubApi(repository="o/r", token="owner") as api:
        api.add_artifact(42, "stack-templates", zipped.getvalue())
        env = {"PATH": os.environ["PATH"], "GITHUB_API_URL": api.url, "NAME": "stack-templates", "RUN": "42",
               "REPOSITORY": "o/r", "SKIP": "true", "TO": str(tmp_path / "kept"),
               "TOKEN": api.issue_token({"actions": "read"}, "judge")}
        proc = subprocess.run(["bash", "-c", _action_script("download-artifact")], env=env, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tmp_path / "kept" / "stack-templates.zip").read_bytes() == zipped.getvalue()  # not extracted
        env.update(TOKEN=api.issue_token({"contents": "read"}, "pr"), TO=str(tmp_path / "refused"))
        proc = subprocess.run(["bash", "-c", _action_script("download-artifact")], env=env, capture_output=True,
                              text=True)
        assert proc.returncode != 0 and "answered 403" in proc.stderr


def test_a_run_keeps_its_artifact_zipped_as_github_does(tmp_path):
    (tmp_path / "stack-templates").mkdir()
    (tmp_path / "stack-templates" / "index.json").write_text("{}")
    run = engine.RunResult(returncode=0, jobs={}, log=tmp_path / "log", artifacts=tmp_path, run_id=7001)
    assert zipfile.ZipFile(io.BytesIO(run.zipped_artifact("stack-templates"))).namelist() == ["index.json"]
    with pytest.raises(engine.RehearsalError, match="no artifact named cloud-assembly"):
        run.zipped_artifact("cloud-assembly")


def test_annotations_are_part_of_a_jobs_output():
    line = json.dumps({"job": "w/j", "jobID": "j", "command": "error", "arg": "refused: member 'x'"})
    assert engine.parse_log([line])["j"].text == "::error::refused: member 'x'\n"


def test_the_work_tree_seeds_the_origin_and_this_repository_is_only_read(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=source, check=True)
    (source / ".gitignore").write_text("ignored/\n")
    (source / "kept.txt").write_text("committed\n")
    (source / "gone.txt").write_text("committed\n")
    subprocess.run(["git", "add", "-A"], cwd=source, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "base"], cwd=source, check=True)
    (source / "kept.txt").write_text("edited, not committed\n")
    (source / "new.txt").write_text("untracked\n")
    (source / "gone.txt").unlink()
    (source / "ignored").mkdir()
    (source / "ignored" / "secret.txt").write_text("never\n")
    status_before = subprocess.run(["git", "status", "--porcelain"], cwd=source, capture_output=True, text=True).stdout
    head_before = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True).stdout
    scratch = engine.Scratch(tmp_path / "scratch", source=source, work_tree=True)
    files = subprocess.run(["git", "ls-tree", "-r", "--name-only", scratch.main], cwd=scratch.origin,
                           capture_output=True, text=True).stdout.split()
    assert sorted(files) == [".gitignore", "kept.txt", "new.txt"]
    shown = subprocess.run(["git", "show", f"{scratch.main}:kept.txt"], cwd=scratch.origin, capture_output=True,
                           text=True).stdout
    assert shown == "edited, not committed\n"
    assert subprocess.run(["git", "status", "--porcelain"], cwd=source, capture_output=True, text=True).stdout == status_before
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True).stdout == head_before
