"""The pull-request comment for a stack diff: rendered from review.stack_diff's JSON, posted (or updated in
place) on the pull request, written to the job summary, and the check's pass/fail decided.

    python -m review.pr_comment --reviews stack-diff.json [--summary "$GITHUB_STEP_SUMMARY"] [--post]
        [--acknowledged | --acknowledge-label NAME] [--artifact-url URL] [--output comment.md] [--set-status]

What a reader sees, in order: the verdict; destructive changes first (an endpoint or inference component
replaced or removed - a renamed endpoint is a removal plus an addition, a replacement - and any other
resource replaced or removed: "may be replaced"); per stage the counts of added / updated / removed /
replaced resources; the IAM and security-group broadening (`cdk diff --security-only`); then the details,
folded. Changes that are only a new asset hash are listed on one line, not in the tables. GitHub refuses a
comment over 65,536 characters: the details are folded, then each stage's part is cut with a link to the
full diff (the job's artifact).

The comment ends with the SHA-256 of each head template (the bytes that were reviewed): the promotion's
summary records the same digest of what it deploys (harness.promotion), so a reviewer can match them.

The decision: a change that would take an endpoint down (or that SageMaker would refuse) fails unless it is
acknowledged. ``--acknowledged`` says so outright (a workflow input); ``--acknowledge-label NAME`` looks the
pull request's labels up as they are now, through the REST API (never from an event: a re-run after adding
the label must see it; a refused look-up is an error, not "no label"). With ``--set-status`` the decision is
the commit status review.judge.CONTEXT on ``--head`` (success or failure; exit 0 once it is set: the status,
not this job, is what branch protection reads); without it, the exit status (1 = fails).
Posting, the label look-up and the status need GITHUB_TOKEN, GITHUB_REPOSITORY and PR_NUMBER
(``GITHUB_API_URL`` when it is not api.github.com); a token that may not comment only warns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
from pathlib import Path

from review import judge
from review.github import GitHub
from review.verdicts import ENDPOINT, FAIL, INFERENCE_COMPONENT, StackReview

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
    out += _digests(reviews)
    return "\n".join(out).rstrip() + "\n"


def _digests(reviews: list[StackReview]) -> list[str]:
    """The head templates' SHA-256: what the promotion's summary lists as "as reviewed" for its templates."""
    rows = [r for r in reviews if r.template_sha256]
    if not rows:
        return []
    return ["### Templates reviewed (SHA-256)", "", "| stack | SHA-256 |", "|---|---|",
            *[f"| `{r.display_name}` | `{r.template_sha256}` |" for r in rows], ""]


def should_fail(reviews: list[StackReview], *, acknowledged: bool) -> bool:
    return any(r.verdict == FAIL for r in reviews) and not acknowledged


# --------------------------------------------------------------------------------------------------
# GitHub
# --------------------------------------------------------------------------------------------------


def post(comment: str, *, github: GitHub, pull_request: int) -> str:
    """Update this check's comment in place, or create it; return its URL."""
    mine = next((c for c in github.pages(f"issues/{pull_request}/comments")
                 if (c.get("body") or "").startswith(MARKER)), None)
    if mine:
        return github.call("PATCH", f"issues/comments/{mine['id']}", {"body": comment})["html_url"]
    return github.call("POST", f"issues/{pull_request}/comments", {"body": comment})["html_url"]


def current_labels(*, github: GitHub, pull_request: int) -> list[str]:
    """The pull request's labels now (its issue's labels: GitHub keeps a pull request's labels there)."""
    return [label["name"] for label in github.pages(f"issues/{pull_request}/labels")]


def _status_description(reviews: list[StackReview], *, fail: bool, acknowledged: bool, label: str | None) -> str:
    failed = sum(r.verdict == FAIL for r in reviews)
    changed = sum(bool(r.findings) for r in reviews)
    if fail:
        how = f"add the label {label} to accept it" if label else "acknowledge it to accept it"
        return f"{failed} stage(s) need a different rollout (an endpoint down or an update refused): {how}"
    if failed and acknowledged:
        return f"{failed} stage(s) need a different rollout: acknowledged" + (f" by the label {label}" if label else "")
    return f"{changed} of {len(reviews)} stage(s) change; all can roll out as they are"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m review.pr_comment", description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=Path, required=True, help="review.stack_diff --json output")
    parser.add_argument("--head", default=os.environ.get("GITHUB_SHA", "HEAD"),
                        help="the head commit (its SHA: the status is set on it; the comment shows 12 characters)")
    parser.add_argument("--summary", type=Path, help="append the Markdown here (GitHub's $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--output", type=Path, help="also write the Markdown here")
    parser.add_argument("--post", action="store_true", help="post or update the pull request's comment")
    acknowledgement = parser.add_mutually_exclusive_group()
    acknowledgement.add_argument("--acknowledged", action="store_true", help="a destructive change is intended")
    acknowledgement.add_argument("--acknowledge-label", metavar="NAME",
                                 help="a destructive change is intended when the pull request carries this label now")
    parser.add_argument("--artifact-url", help="where the full diff is (the job's artifact)")
    parser.add_argument("--set-status", action="store_true",
                        help=f"decide by setting the commit status {judge.CONTEXT} on --head (exit 0 once set)")
    args = parser.parse_args(argv)
    data = json.loads(args.reviews.read_text())
    reviews = [StackReview.from_json(r) for r in data["reviews"]]
    comment = render(reviews, base=data.get("base", "base"), head=args.head[:12], artifact_url=args.artifact_url)
    github = GitHub.from_environment() if (args.post or args.set_status or args.acknowledge_label) else None
    if args.output:
        args.output.write_text(comment)
    if args.summary:
        with args.summary.open("a") as f:
            f.write(comment)
    url = None
    if args.post:
        try:
            url = post(comment, github=github, pull_request=int(os.environ["PR_NUMBER"]))
            print(f"comment: {url}")
        except urllib.error.HTTPError as exc:
            if exc.code not in (403, 404):
                raise
            print(f"::warning::could not comment on the pull request ({exc.code}; a fork's token may not): "
                  "the diff is in the job summary")
    acknowledged = args.acknowledged
    if args.acknowledge_label and any(r.verdict == FAIL for r in reviews):
        acknowledged = args.acknowledge_label in current_labels(github=github, pull_request=int(os.environ["PR_NUMBER"]))
    fail = should_fail(reviews, acknowledged=acknowledged)
    if any(r.verdict == FAIL for r in reviews):
        print("a destructive change " + ("was acknowledged" if acknowledged else
                                         "needs a different rollout (or the acknowledgement label)"))
    if args.set_status:
        judge.set_status(github, args.head, state="failure" if fail else "success", target_url=url or judge.run_url(),
                         description=_status_description(reviews, fail=fail, acknowledged=acknowledged,
                                                         label=args.acknowledge_label))
        return 0
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
