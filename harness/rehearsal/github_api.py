"""A stand-in for the part of GitHub's REST API the workflows call, on loopback, reached the way a real
runner reaches GitHub: through ``GITHUB_API_URL``.

It answers what review/pr_comment.py asks, in GitHub's shapes (REST API 2022-11-28):
- ``GET  /repos/{owner}/{repo}/issues/{number}/comments`` (paged: ``per_page``, ``page``);
- ``POST /repos/{owner}/{repo}/issues/{number}/comments`` (create);
- ``PATCH /repos/{owner}/{repo}/issues/comments/{id}`` (update in place);
- ``GET  /repos/{owner}/{repo}/issues/{number}/labels`` (the pull request's labels as they are now).
Every call is recorded (method, path, body); a request without the job's token is a 401, an unknown path a
404, as GitHub answers them. What it cannot prove: GitHub's permission model (which token may comment), its
rate limits, and the exact wording of its error bodies.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from harness.ports import free_port

_ISSUE = re.compile(r"^/repos/(?P<repo>[^/]+/[^/]+)/issues/(?P<number>\d+)/(?P<what>comments|labels)$")
_COMMENT = re.compile(r"^/repos/(?P<repo>[^/]+/[^/]+)/issues/comments/(?P<id>\d+)$")


@dataclass
class Call:
    method: str
    path: str
    body: dict | None


@dataclass
class GitHubState:
    repository: str
    token: str
    labels: dict[int, list[str]] = field(default_factory=dict)  # pull request -> label names
    comments: dict[int, dict] = field(default_factory=dict)  # comment id -> {"number", "body", ...}
    calls: list[Call] = field(default_factory=list)

    def comments_on(self, number: int) -> list[dict]:
        return [{"id": cid, **c} for cid, c in sorted(self.comments.items()) if c["number"] == number]


class GitHubApi:
    """``with GitHubApi(repository=..., token=...) as api:`` serves ``api.url`` until the block ends."""

    def __init__(self, *, repository: str, token: str):
        self.state = GitHubState(repository=repository, token=token)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def set_labels(self, number: int, labels: list[str]) -> None:
        with self._lock:
            self.state.labels[number] = list(labels)

    def __enter__(self) -> "GitHubApi":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _comment_json(self, cid: int) -> dict:
        c = self.state.comments[cid]
        repo = self.state.repository
        return {"id": cid, "body": c["body"], "html_url": f"https://github.com/{repo}/pull/{c['number']}#issuecomment-{cid}",
                "url": f"{self.url}/repos/{repo}/issues/comments/{cid}", "user": {"login": "github-actions[bot]"}}

    def _handle(self, method: str, path: str, query: dict, body: dict | None, auth: str) -> tuple[int, object]:
        state = self.state
        with self._lock:
            state.calls.append(Call(method, path, body))
            if auth != f"Bearer {state.token}":
                return 401, {"message": "Bad credentials", "status": "401"}
            issue, comment = _ISSUE.match(path), _COMMENT.match(path)
            if (issue and issue["repo"] != state.repository) or (comment and comment["repo"] != state.repository):
                return 404, {"message": "Not Found", "status": "404"}
            if issue and issue["what"] == "labels" and method == "GET":
                number = int(issue["number"])
                return 200, [{"name": name} for name in state.labels.get(number, [])]
            if issue and issue["what"] == "comments":
                number = int(issue["number"])
                if method == "GET":
                    per_page = min(int(query.get("per_page", ["30"])[0]), 100)
                    page = max(int(query.get("page", ["1"])[0]), 1)
                    mine = sorted(c for c, v in state.comments.items() if v["number"] == number)
                    return 200, [self._comment_json(c) for c in mine[(page - 1) * per_page:page * per_page]]
                if method == "POST":
                    if not body or not isinstance(body.get("body"), str):
                        return 422, {"message": "Validation Failed: body is required", "status": "422"}
                    cid = 1000 + len(state.comments) + 1
                    state.comments[cid] = {"number": number, "body": body["body"]}
                    return 201, self._comment_json(cid)
            if comment and method == "PATCH":
                cid = int(comment["id"])
                if cid not in state.comments:
                    return 404, {"message": "Not Found", "status": "404"}
                if not body or not isinstance(body.get("body"), str):
                    return 422, {"message": "Validation Failed: body is required", "status": "422"}
                state.comments[cid]["body"] = body["body"]
                return 200, self._comment_json(cid)
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
                    status, answer = api._handle(self.command, parts.path, parse_qs(parts.query), body,
                                                 self.headers.get("Authorization", ""))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

            def log_message(self, *args) -> None:  # the calls are recorded; no stderr noise
                pass

        return Handler
