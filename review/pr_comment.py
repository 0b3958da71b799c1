"""The pull-request comment for a stack diff: rendered from review.stack_diff's JSON, posted (or updated in
place) on the pull request, written to the job summary, and the check's pass/fail decided.

    python -m review.pr_comment --reviews stack-diff.json [--summary "$GITHUB_STEP_SUMMARY"] [--post]
        [--acknowledged | --acknowledge-label NAME] [--artifact-url URL] [--output comment.md]

What a reader sees, in order: the verdict; destructive changes first (an endpoint or inference component
replaced or removed - a renamed endpoint is a removal plus an addition, a replacement - and any other
resource replaced or removed: "may be replaced"); per stage the counts of added / updated / removed /
replaced resources; the IAM and security-group broadening (`cdk diff --security-only`); then the details,
folded. Changes that are only a new asset hash are listed on one line, not in the tables. GitHub refuses a
comment over 65,536 characters: the details are folded, then each stage's part is cut with a link to the
full diff (the job's artifact).

Exit status: 1 when a change would take an endpoint down (or SageMaker would refuse it) and nobody
acknowledged it, else 0. ``--acknowledged`` says so outright (a workflow input); ``--acknowledge-label NAME``
looks the pull request's labels up as they are now, through the REST API: the event's own copy of them is
what the pull request had when the run was triggered, so re-running a failed check after adding the label
would otherwise fail again. The event's labels (``GITHUB_EVENT_PATH``) are used only when the API refuses.
Posting and the label look-up need GITHUB_TOKEN, GITHUB_REPOSITORY and PR_NUMBER (``GITHUB_API_URL`` when
it is not api.github.com); a token that may not comment (a fork's pull request) only warns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from review.stack_diff import ENDPOINT, FAIL, INFERENCE_COMPONENT, StackReview

MARKER = "<!-- peagle-stack-diff -->"
GITHUB_LIMIT = 65_536
_ICON = {"pass": "✅", "fail": "❌"}
_DESTRUCTIVE = ("replaced", "removed")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def destructive(reviews: list[StackReview]) -> list[str]:
    """Lines for every replacement or removal, the ones that take serving down first."""
    serving, others = [], []
    for r in reviews:
        for f in r.findings:
            # Every failing finding (an update SageMaker refuses is as bad as a replacement), and every
            # replacement or removal that is not an expected Model / EndpointConfig one.
            if f.verdict != FAIL and (f.change not in _DESTRUCTIVE or f.asset_only or f.type == "stack"):
                continue
            line = f"- `{r.display_name}`: `{f.logical_id}` ({f.type}) {f.change}: {_cell(f.why)}"
            if f.verdict == FAIL or f.type in (ENDPOINT, INFERENCE_COMPONENT):
                serving.append("- ❌" + line[1:] if f.verdict == FAIL else line)
            elif f.verdict != "pass":  # expected replacements (Model, EndpointConfig) are not warnings
                others.append(line + " (may be replaced: a new physical resource)")
    return serving + others


def _stage_details(r: StackReview, *, with_cli: bool) -> str:
    shown = [f for f in r.findings if not f.asset_only]
    assets = [f for f in r.findings if f.asset_only]
    out = []
    if shown:
        out += ["| | resource | type | change | why |", "|---|---|---|---|---|"]
        out += [f"| {_ICON.get(f.verdict, 'ℹ️')} | `{f.logical_id}` | {f.type} | {_cell(f.change)} | {_cell(f.why)} |"
                for f in shown]
        out.append("")
    if assets:
        out += ["Only a new asset hash: " + ", ".join(f"`{f.logical_id}`" for f in assets) + ".", ""]
    for f in r.findings:
        if f.verdict == FAIL and f.advice:
            out += [f"**How to roll out `{f.logical_id}` safely:** {f.advice}", ""]
    if with_cli and r.cli_diff:
        out += ["```diff", r.cli_diff, "```", ""]
    elif r.cli_diff:
        out += ["`cdk diff` output: in the full diff (job artifact).", ""]
    return "\n".join(out)


def render(reviews: list[StackReview], *, base: str, head: str, artifact_url: str | None = None,
           limit: int = GITHUB_LIMIT) -> str:
    """The comment's Markdown, at most ``limit`` characters."""
    for with_cli, cut in ((True, None), (False, None), (False, limit)):
        text = _render(reviews, base=base, head=head, artifact_url=artifact_url, with_cli=with_cli,
                       cut=cut and max(2000, (limit - 6000) // max(len(reviews), 1)))
        if len(text) <= limit:
            return text
    return text[:limit - 200] + f"\n\n… cut at GitHub's limit; the full diff: {artifact_url or 'the job artifact'}\n"


def _render(reviews: list[StackReview], *, base: str, head: str, artifact_url: str | None, with_cli: bool,
            cut: int | None) -> str:
    failed = [r for r in reviews if r.verdict == FAIL]
    changed = [r for r in reviews if r.findings]
    out = [MARKER,
           f"## {'❌' if failed else '✅'} Stack diff: "
           + (f"{len(failed)} of {len(reviews)} stage(s) need a different rollout" if failed
              else f"{len(changed)} of {len(reviews)} stage(s) change, all can roll out as they are"),
           "", f"Base `{base}` → `{head}` (templates synthesized offline, compared resource by resource).", ""]
    warnings = destructive(reviews)
    if warnings:
        out += ["### ⚠️ Destructive changes", "", *warnings, ""]
    out += ["### Per stage", "", "| stage | verdict | added | updated | removed | replaced |", "|---|---|---|---|---|---|"]
    for r in reviews:
        c = r.counts()
        status = " (new)" if r.new_stack else " (removed)" if r.removed_stack else ""
        out.append(f"| `{r.display_name}`{status} | {_ICON[r.verdict]} | {c['added']} | {c['updated']} | "
                   f"{c['removed']} | {c['replaced']} |")
    out += ["", "### IAM and security-group broadening", ""]
    broadening = [r for r in reviews if r.security_diff]
    if not broadening:
        out += ["None: no IAM statement, policy or security-group change.", ""]
    for r in broadening:
        out += [f"<details><summary><code>{r.display_name}</code>: IAM / security-group changes</summary>", "",
                "```", r.security_diff, "```", "", "</details>", ""]
    out += ["### Details", ""]
    for r in changed:
        body = _stage_details(r, with_cli=with_cli)
        if cut is not None and len(body) > cut:
            body = body[:cut] + f"\n\n… cut here; the full diff: {artifact_url or 'the job artifact'}\n"
        out += [f"<details><summary><code>{r.display_name}</code>: {sum(r.counts().values())} resource change(s)"
                "</summary>", "", body, "</details>", ""]
    if not changed:
        out += ["No resource changes.", ""]
    if artifact_url:
        out += [f"Full diff: {artifact_url}", ""]
    return "\n".join(out).rstrip() + "\n"


def should_fail(reviews: list[StackReview], *, acknowledged: bool) -> bool:
    return any(r.verdict == FAIL for r in reviews) and not acknowledged


# --------------------------------------------------------------------------------------------------
# GitHub (the one part not tested here)
# --------------------------------------------------------------------------------------------------


def _api(method: str, url: str, token: str, body: dict | None = None):
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def post(comment: str, *, repository: str, pull_request: int, token: str,
         api: str = "https://api.github.com") -> str:
    """Update this check's comment in place, or create it; return its URL."""
    base = f"{api}/repos/{repository}/issues"
    page = 1
    while True:
        comments = _api("GET", f"{base}/{pull_request}/comments?per_page=100&page={page}", token)
        mine = next((c for c in comments if (c.get("body") or "").startswith(MARKER)), None)
        if mine or len(comments) < 100:
            break
        page += 1
    if mine:
        return _api("PATCH", f"{base}/comments/{mine['id']}", token, {"body": comment})["html_url"]
    return _api("POST", f"{base}/{pull_request}/comments", token, {"body": comment})["html_url"]


def current_labels(*, repository: str, pull_request: int, token: str, api: str = "https://api.github.com"
                   ) -> list[str]:
    """The pull request's labels now (its issue's labels: GitHub keeps a pull request's labels there)."""
    names: list[str] = []
    page = 1
    while True:
        labels = _api("GET", f"{api}/repos/{repository}/issues/{pull_request}/labels?per_page=100&page={page}", token)
        names += [label["name"] for label in labels]
        if len(labels) < 100:
            return names
        page += 1


def _event_labels() -> list[str]:
    path = os.environ.get("GITHUB_EVENT_PATH")
    if not path or not Path(path).is_file():
        return []
    event = json.loads(Path(path).read_text())
    return [label["name"] for label in (event.get("pull_request") or {}).get("labels", [])]


def _acknowledged_by_label(label: str) -> bool:
    try:
        labels = current_labels(repository=os.environ["GITHUB_REPOSITORY"], pull_request=int(os.environ["PR_NUMBER"]),
                                token=os.environ["GITHUB_TOKEN"],
                                api=os.environ.get("GITHUB_API_URL", "https://api.github.com"))
    except urllib.error.HTTPError as exc:
        if exc.code not in (403, 404):
            raise
        labels = _event_labels()
        print(f"::warning::could not read the pull request's labels ({exc.code}): the event's labels are used")
    return label in labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m review.pr_comment", description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=Path, required=True, help="review.stack_diff --json output")
    parser.add_argument("--head", default=os.environ.get("GITHUB_SHA", "HEAD")[:12])
    parser.add_argument("--summary", type=Path, help="append the Markdown here (GitHub's $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--output", type=Path, help="also write the Markdown here")
    parser.add_argument("--post", action="store_true", help="post or update the pull request's comment")
    acknowledgement = parser.add_mutually_exclusive_group()
    acknowledgement.add_argument("--acknowledged", action="store_true", help="a destructive change is intended")
    acknowledgement.add_argument("--acknowledge-label", metavar="NAME",
                                 help="a destructive change is intended when the pull request carries this label now")
    parser.add_argument("--artifact-url", help="where the full diff is (the job's artifact)")
    args = parser.parse_args(argv)
    data = json.loads(args.reviews.read_text())
    reviews = [StackReview.from_json(r) for r in data["reviews"]]
    comment = render(reviews, base=data.get("base", "base"), head=args.head, artifact_url=args.artifact_url)
    if args.output:
        args.output.write_text(comment)
    if args.summary:
        with args.summary.open("a") as f:
            f.write(comment)
    if args.post:
        try:
            url = post(comment, repository=os.environ["GITHUB_REPOSITORY"], pull_request=int(os.environ["PR_NUMBER"]),
                       token=os.environ["GITHUB_TOKEN"], api=os.environ.get("GITHUB_API_URL", "https://api.github.com"))
            print(f"comment: {url}")
        except urllib.error.HTTPError as exc:
            if exc.code not in (403, 404):
                raise
            print(f"::warning::could not comment on the pull request ({exc.code}; a fork's token may not): "
                  "the diff is in the job summary")
    acknowledged = args.acknowledged
    if args.acknowledge_label and any(r.verdict == FAIL for r in reviews):
        acknowledged = _acknowledged_by_label(args.acknowledge_label)
    fail = should_fail(reviews, acknowledged=acknowledged)
    if any(r.verdict == FAIL for r in reviews):
        print("a destructive change " + ("was acknowledged" if acknowledged else
                                         "needs a different rollout (or the acknowledgement label)"))
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
