"""Pull-request stack diffs: what a change does to each deployed stack, and whether it is safe to roll out.

    python -m review.stack_diff --base origin/main [--output diff.md]
    python -m review.stack_diff --base HEAD --head-templates DIR [--json reviews.json]

Synthesizes BASE in a temporary ``git worktree`` and the working tree, then for every stack of every
stage renders Markdown fit for a pull-request comment: a verdict, the serving-relevant findings, and the
CDK CLI's own ``cdk diff --template`` output (offline, no credentials). Exit code 1 when a change would
take an endpoint down or make CloudFormation fail half-way; 0 otherwise; 2 on a usage or synth error.

With ``--head-templates`` the head is not synthesized here: its templates are read from a folder that
review.head_artifact checked and wrote (the pull request's own synth, carried as data to the judge, which
must never run the pull request's code). Only the base is synthesized, from this checkout's code.

This module is the command and the review of each stack; the parts are review.verdicts (what a template
change means: the verdict rules), review.synthesis (both sides' assemblies and the CLI's diffs) and
review.diff_markdown (the Markdown).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ops import cdk
from review import bundle_change
from review.bundle_change import Manifests, none
from review.head_artifact import manifests_in
from review.diff_markdown import render_markdown
from review.synthesis import DiffError, Side, cli_diff, read_head, security_diff, synth_base, synth_head
from review.verdicts import ENDPOINT, FAIL, Finding, StackReview, classify


def review(repo: Path, base: Side, head: Side, *, manifests: tuple[Manifests, Manifests] = (none, none)
           ) -> list[StackReview]:
    """Each stack's findings; ``manifests`` read the committed bundle manifests of the base and the head."""
    base_stacks = {s.display_name: s for s in cdk.list_stacks(base.assembly)}
    head_stacks = {s.display_name: s for s in cdk.list_stacks(head.assembly)}
    reviews = []
    for name in list(head_stacks) + [n for n in base_stacks if n not in head_stacks]:
        b, h = base_stacks.get(name), head_stacks.get(name)
        r = StackReview(display_name=name, stack_name=(h or b).stack_name, new_stack=b is None, removed_stack=h is None,
                        template_sha256=h.template_sha256() if h else "")
        r.findings = classify(b.template() if b else None, h.template() if h else None)
        r.findings += bundle_change.findings(b.template() if b else None, h.template() if h else None,
                                             base=manifests[0], head=manifests[1])
        if h is not None:
            r.cli_diff = cli_diff(repo, head.assembly, b.template_path if b else None, name)
            if r.findings:
                r.security_diff = security_diff(repo, head.assembly, b.template_path if b else None, name)
        elif any(f.type == ENDPOINT for f in r.findings):
            r.findings.append(Finding(FAIL, name, "stack", "removed",
                                      "the whole stack, endpoint included, would be deleted when it is destroyed",
                                      "Remove a stage's stack only on purpose, with `cdk destroy` on that stage."))
        reviews.append(r)
    return reviews


def run(*, repo: Path, base_ref: str, cache_dir: Path | None, context: dict[str, str],
        keep_head: Path | None = None, head_templates: Path | None = None) -> tuple[str, list[StackReview]]:
    if not (repo / "app.py").exists():
        raise DiffError(f"{repo} has no app.py to synthesize")
    context = {"offline": "true", **context}  # template against template: no account is ever asked
    base = synth_base(repo, base_ref, cache_dir=cache_dir, context=context)
    with tempfile.TemporaryDirectory(prefix="stack-diff-head-") as tmp:
        head_dir = keep_head or Path(tmp)
        if head_templates is not None:
            head = read_head(head_templates, head_dir / "assembly", base=base)
        else:
            head = synth_head(repo, head_dir, context=context)
        # The base's manifests as blobs of its commit; the head's from the working tree it synthesized, or (a judge)
        # from the pull request's artifact, each member there checked to hash to its name.
        manifests = (bundle_change.at_commit(repo, base_ref),
                     manifests_in(head_templates) if head_templates is not None else bundle_change.committed(repo))
        reviews = review(repo, base, head, manifests=manifests)
    return render_markdown(reviews, base_label=base.label, head_label=head.label), reviews


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m review.stack_diff", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git ref to compare against (branch, tag, commit)")
    parser.add_argument("--base-label", help="what the comment calls the base (default: --base)")
    parser.add_argument("--head-templates", type=Path, default=None,
                        help="take the head's templates from this folder (review.head_artifact unpack wrote it) "
                             "instead of synthesizing the working tree")
    parser.add_argument("--repo", type=Path, default=cdk.REPO_ROOT, help="repository root (default: this one)")
    parser.add_argument("--output", type=Path, default=None, help="also write the Markdown to this file")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the reviews as JSON (what review.pr_comment renders for a pull request)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="keep base assemblies here by commit (default: <repo>/.cache/stack_diff; 'none' disables)")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="context for both synths, e.g. imageUri=... to leave the image asset out of the diff")
    args = parser.parse_args(argv)
    context = {}
    for item in args.context:
        if "=" not in item:
            print(f"error: --context: got {item!r}; allowed: KEY=VALUE", file=sys.stderr)
            return 2
        key, value = item.split("=", 1)
        context[key] = value
    cache_dir = None if str(args.cache_dir) == "none" else (args.cache_dir or args.repo / ".cache" / "stack_diff")
    started = time.monotonic()
    try:
        markdown, reviews = run(repo=args.repo.resolve(), base_ref=args.base, cache_dir=cache_dir, context=context,
                                head_templates=args.head_templates)
    except (DiffError, cdk.CdkError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(markdown)
    if args.output:
        args.output.write_text(markdown)
    if args.json:
        args.json.write_text(json.dumps({"base": args.base_label or args.base, "reviews": [r.to_json() for r in reviews]},
                                        indent=1))
    failed = [r.display_name for r in reviews if r.verdict == FAIL]
    print(f"==> {len(reviews)} stack(s) reviewed in {time.monotonic() - started:.1f} s; "
          f"{'FAIL: ' + ', '.join(failed) if failed else 'all pass'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
