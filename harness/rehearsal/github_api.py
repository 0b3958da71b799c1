"""A stand-in for the part of GitHub's REST API the workflows call, on loopback, reached the way a real
runner reaches GitHub: through ``GITHUB_API_URL``.

It answers what the stack-diff gate asks (review/judge.py, review/pr_comment.py, the download-artifact
stand-in), in GitHub's shapes (REST API 2022-11-28):
- ``GET  /repos/{o}/{r}/issues/{n}/comments`` (paged), ``POST`` there (create),
  ``PATCH /repos/{o}/{r}/issues/comments/{id}`` (update in place);
- ``GET  /repos/{o}/{r}/issues/{n}/labels`` (as they are now), ``POST`` there (add labels);
- ``GET  /repos/{o}/{r}/pulls/{n}`` and ``GET /repos/{o}/{r}/pulls?state=open&head=owner:branch``;
- ``POST /repos/{o}/{r}/statuses/{sha}`` (a commit status);
- ``GET  /repos/{o}/{r}/actions/runs/{id}/artifacts`` and ``GET /repos/{o}/{r}/actions/artifacts/{id}/zip``
  (a finished run's artifacts: the zip as GitHub keeps it; GitHub redirects to storage, this answers it).

Tokens carry permissions, as a job's GITHUB_TOKEN does: ``issue_token`` gives one the permissions a job
declares (the rehearsal reads them from the committed workflow), and each call is allowed or answered 403
("Resource not accessible by integration") by the permission GitHub's documentation lists for it: reading
comments, labels and pull requests needs pull-requests (or issues) read, writing them write; a status
needs statuses write; artifacts need actions read. The repository is modelled as private (no read without
a permission). Every call is recorded with its answer and the token's name, so a scenario can show what a
job tried and what it was refused. A request without a known token is a 401, an unknown path a 404.
What it cannot prove: GitHub's exact permission table in every corner, its rate limits, and the wording of
its error bodies.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from harness.ports import free_port

_REPO = r"^/repos/(?P<repo>[^/]+/[^/]+)"
_ROUTES = [
    ("issue", re.compile(_REPO + r"/issues/(?P<number>\d+)/(?P<what>comments|labels)$")),
    ("comment", re.compile(_REPO + r"/issues/comments/(?P<id>\d+)$")),
    ("pull", re.compile(_REPO + r"/pulls/(?P<number>\d+)$")),
    ("pulls", re.compile(_REPO + r"/pulls$")),
    ("status", re.compile(_REPO + r"/statuses/(?P<sha>[0-9a-f]{40})$")),
    ("run-artifacts", re.compile(_REPO + r"/actions/runs/(?P<run>\d+)/artifacts$")),
    ("artifact-zip", re.compile(_REPO + r"/actions/artifacts/(?P<id>\d+)/zip$")),
]
ALL = {"contents": "write", "pull-requests": "write", "issues": "write", "statuses": "write", "actions": "write"}
_LEVEL = {"none": 0, "read": 1, "write": 2}
FORBIDDEN = {"message": "Resource not accessible by integration", "status": "403"}


@dataclass
class Call:
    method: str
    path: str
    body: dict | None
    status: int = 0  # the answer's HTTP status
    token: str = ""  # the name the token was issued under ("" for an unknown one)


@dataclass
class GitHubState:
    repository: str
    tokens: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)  # token -> (name, permissions)
    labels: dict[int, list[str]] = field(default_factory=dict)  # pull request -> label names
    comments: dict[int, dict] = field(default_factory=dict)  # comment id -> {"number", "body"}
    pulls: dict[int, dict] = field(default_factory=dict)  # number -> {"head_sha", "head_ref", "head_repo", "state"}
    statuses: list[dict] = field(default_factory=list)  # {"sha", "state", "context", "description", "token", ...}
    artifacts: dict[int, dict] = field(default_factory=dict)  # artifact id -> {"run", "name", "zip"}
    calls: list[Call] = field(default_factory=list)

    def comments_on(self, number: int) -> list[dict]:
        return [{"id": cid, **c} for cid, c in sorted(self.comments.items()) if c["number"] == number]

    def status_of(self, sha: str, context: str) -> dict | None:
        """The latest status of ``context`` on ``sha`` (GitHub shows the latest one)."""
        return next((s for s in reversed(self.statuses) if s["sha"] == sha and s["context"] == context), None)


def _allowed(permissions: dict[str, str], kind: str, method: str) -> bool:
    def at_least(scope: str, level: str) -> bool:
        return _LEVEL[permissions.get(scope, "none")] >= _LEVEL[level]

    level = "read" if method == "GET" else "write"
    if kind in ("issue", "comment", "pull", "pulls"):
        return at_least("pull-requests", level) or at_least("issues", level)
    if kind == "status":
        return at_least("statuses", "write")
    if kind in ("run-artifacts", "artifact-zip"):
        return at_least("actions", "read")
    return False


class GitHubApi:
    """``with GitHubApi(repository=..., token=...) as api:`` serves ``api.url`` until the block ends. ``token``
    holds every permission (a test's own); jobs get theirs from ``issue_token``."""

    def __init__(self, *, repository: str, token: str):
        self.state = GitHubState(repository=repository)
        self.state.tokens[token] = ("owner", dict(ALL))
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- what a scenario sets up ------------------------------------------------------------------

    def issue_token(self, permissions: dict[str, str], name: str) -> str:
        """A new token with ``permissions`` (``{"contents": "read", ...}``), recorded under ``name``."""
        unknown = {k: v for k, v in permissions.items() if v not in _LEVEL}
        if unknown:
            raise ValueError(f"permissions: allowed: read, write or none; found: {unknown}")
        token = f"ghs_{secrets.token_hex(12)}"
        with self._lock:
            self.state.tokens[token] = (name, dict(permissions))
        return token

    def set_labels(self, number: int, labels: list[str]) -> None:
        with self._lock:
            self.state.labels[number] = list(labels)

    def open_pull_request(self, number: int, *, head_sha: str, head_ref: str, head_repo: str | None = None) -> None:
        """A pull request (or a push to it: its head moves)."""
        with self._lock:
            self.state.pulls[number] = {"head_sha": head_sha, "head_ref": head_ref,
                                        "head_repo": head_repo or self.state.repository, "state": "open"}

    def add_artifact(self, run_id: int, name: str, zipped: bytes) -> int:
        with self._lock:
            artifact_id = 5000 + len(self.state.artifacts) + 1
            self.state.artifacts[artifact_id] = {"run": run_id, "name": name, "zip": zipped}
            return artifact_id

    def __enter__(self) -> "GitHubApi":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- answers ----------------------------------------------------------------------------------

    def _comment_json(self, cid: int) -> dict:
        c = self.state.comments[cid]
        repo = self.state.repository
        return {"id": cid, "body": c["body"], "html_url": f"https://github.com/{repo}/pull/{c['number']}#issuecomment-{cid}",
                "url": f"{self.url}/repos/{repo}/issues/comments/{cid}", "user": {"login": "github-actions[bot]"}}

    def _pull_json(self, number: int) -> dict:
        pull = self.state.pulls[number]
        return {"number": number, "state": pull["state"], "labels": [{"name": n} for n in self.state.labels.get(number, [])],
                "head": {"sha": pull["head_sha"], "ref": pull["head_ref"], "repo": {"full_name": pull["head_repo"]}},
                "base": {"ref": "main", "repo": {"full_name": self.state.repository}}}

    def _artifact_json(self, artifact_id: int) -> dict:
        a = self.state.artifacts[artifact_id]
        return {"id": artifact_id, "name": a["name"], "size_in_bytes": len(a["zip"]), "expired": False,
                "archive_download_url": f"{self.url}/repos/{self.state.repository}/actions/artifacts/{artifact_id}/zip",
                "workflow_run": {"id": a["run"]}}

    def _handle(self, method: str, path: str, query: dict, body: dict | None, auth: str) -> tuple[int, object]:
        state = self.state
        token = auth.removeprefix("Bearer ").removeprefix("token ")
        name, permissions = state.tokens.get(token, ("", {}))
        call = Call(method, path, body, token=name)
        state.calls.append(call)
        status, answer = self._answer(method, path, query, body, known=bool(name), permissions=permissions)
        call.status = status
        if status == 201 and method == "POST" and "/statuses/" in path:
            state.statuses[-1]["token"] = name
        return status, answer

    def _answer(self, method: str, path: str, query: dict, body: dict | None, *, known: bool,
                permissions: dict[str, str]) -> tuple[int, object]:
        state = self.state
        if not known:
            return 401, {"message": "Bad credentials", "status": "401"}
        kind, match = next(((k, m) for k, pattern in _ROUTES if (m := pattern.match(path))), (None, None))
        if match is None or match["repo"] != state.repository:
            return 404, {"message": "Not Found", "status": "404"}
        if not _allowed(permissions, kind, method):
            return 403, FORBIDDEN
        per_page = min(int(query.get("per_page", ["30"])[0]), 100)
        page = max(int(query.get("page", ["1"])[0]), 1)

        def paged(items: list) -> list:
            return items[(page - 1) * per_page:page * per_page]

        if kind == "issue":
            number = int(match["number"])
            if match["what"] == "labels":
                if method == "GET":
                    return 200, paged([{"name": n} for n in state.labels.get(number, [])])
                if method == "POST":
                    added = (body or {}).get("labels")
                    if not isinstance(added, list):
                        return 422, {"message": "Validation Failed: labels is required", "status": "422"}
                    state.labels.setdefault(number, []).extend(n for n in added if n not in state.labels[number])
                    return 200, [{"name": n} for n in state.labels[number]]
            else:
                if method == "GET":
                    mine = sorted(c for c, v in state.comments.items() if v["number"] == number)
                    return 200, [self._comment_json(c) for c in paged(mine)]
                if method == "POST":
                    if not body or not isinstance(body.get("body"), str):
                        return 422, {"message": "Validation Failed: body is required", "status": "422"}
                    cid = 1000 + len(state.comments) + 1
                    state.comments[cid] = {"number": number, "body": body["body"]}
                    return 201, self._comment_json(cid)
        if kind == "comment" and method == "PATCH":
            cid = int(match["id"])
            if cid not in state.comments:
                return 404, {"message": "Not Found", "status": "404"}
            if not body or not isinstance(body.get("body"), str):
                return 422, {"message": "Validation Failed: body is required", "status": "422"}
            state.comments[cid]["body"] = body["body"]
            return 200, self._comment_json(cid)
        if kind == "pull" and method == "GET":
            number = int(match["number"])
            return (200, self._pull_json(number)) if number in state.pulls else (404, {"message": "Not Found"})
        if kind == "pulls" and method == "GET":
            wanted_state = query.get("state", ["open"])[0]
            head = query.get("head", [""])[0]
            found = [n for n, p in sorted(state.pulls.items())
                     if (wanted_state == "all" or p["state"] == wanted_state)
                     and (not head or head == f"{p['head_repo'].split('/')[0]}:{p['head_ref']}")]
            return 200, [self._pull_json(n) for n in paged(found)]
        if kind == "status" and method == "POST":
            body = body or {}
            if body.get("state") not in ("error", "failure", "pending", "success"):
                return 422, {"message": "Validation Failed: state is not included in the list", "status": "422"}
            if len(str(body.get("description", ""))) > 140:
                return 422, {"message": "Validation Failed: description is too long (maximum is 140 characters)"}
            state.statuses.append({"sha": match["sha"], "state": body["state"],
                                   "context": body.get("context", "default"),
                                   "description": body.get("description", ""), "target_url": body.get("target_url")})
            return 201, {"id": len(state.statuses), **state.statuses[-1]}
        if kind == "run-artifacts" and method == "GET":
            run, name = int(match["run"]), query.get("name", [None])[0]
            found = [a for a, v in sorted(state.artifacts.items()) if v["run"] == run and name in (None, v["name"])]
            return 200, {"total_count": len(found), "artifacts": [self._artifact_json(a) for a in paged(found)]}
        if kind == "artifact-zip" and method == "GET":
            artifact_id = int(match["id"])
            if artifact_id not in state.artifacts:
                return 404, {"message": "Not Found", "status": "404"}
            return 200, state.artifacts[artifact_id]["zip"]
        return 404, {"message": "Not Found", "status": "404"}

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    status, answer = 400, {"message": "Problems parsing JSON", "status": "400"}
                else:
                    with api._lock:
                        status, answer = api._handle(self.command, parts.path, parse_qs(parts.query), body,
                                                     self.headers.get("Authorization", ""))
                binary = isinstance(answer, bytes)
                data = answer if binary else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/zip" if binary else "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

            def log_message(self, *args) -> None:  # the calls are recorded; no stderr noise
                pass

        return Handler
