"""GitHub's REST API (2022-11-28) over the standard library: what the stack-diff gate calls.

The gate runs where installing anything first would mean running code it has not yet judged, so this has
no dependency: ``urllib`` and ``json``. A job reaches GitHub through ``GITHUB_API_URL`` (a runner sets it;
``make rehearse`` points it at its stand-in) with the job's ``GITHUB_TOKEN``. Errors are raised as
``urllib.error.HTTPError``: a call GitHub refused is never taken for an empty answer.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

DEFAULT_API = "https://api.github.com"
PER_PAGE = 100


@dataclass(frozen=True)
class GitHub:
    repository: str  # owner/name
    token: str
    api: str = DEFAULT_API

    @classmethod
    def from_environment(cls) -> "GitHub":
        """The job's repository, token and API, from the variables a runner (or the step's ``env:``) sets."""
        missing = [name for name in ("GITHUB_REPOSITORY", "GITHUB_TOKEN") if not os.environ.get(name)]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not set; allowed: the job's repository (owner/name) and its "
                               "token, given to the step as env (GITHUB_TOKEN: ${{ github.token }})")
        return cls(repository=os.environ["GITHUB_REPOSITORY"], token=os.environ["GITHUB_TOKEN"],
                   api=os.environ.get("GITHUB_API_URL") or DEFAULT_API)

    def url(self, path: str, **query: Any) -> str:
        """``path`` below the repository (``issues/5/labels``), with ``query`` encoded."""
        text = f"{self.api}/repos/{self.repository}/{path.lstrip('/')}"
        return text + ("?" + urllib.parse.urlencode(query) if query else "")

    def call(self, method: str, path: str, body: dict | None = None, **query: Any) -> Any:
        request = urllib.request.Request(self.url(path, **query), method=method,
                                         data=json.dumps(body).encode() if body is not None else None, headers={
                                             "Authorization": f"Bearer {self.token}",
                                             "Accept": "application/vnd.github+json",
                                             "X-GitHub-Api-Version": "2022-11-28",
                                             "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def pages(self, path: str, **query: Any) -> Iterator[dict]:
        """Every item of a listed resource, page by page (a page shorter than ``per_page`` is the last)."""
        page = 1
        while True:
            items = self.call("GET", path, per_page=PER_PAGE, page=page, **query)
            yield from items
            if len(items) < PER_PAGE:
                return
            page += 1
