"""The stack diff as Markdown: per stack its verdict, the findings table, how to roll a failing change out
safely, and the CLI's diff (what ``python -m review.stack_diff`` prints and ``--output`` writes)."""

from __future__ import annotations

from review.verdicts import (ENDPOINT, ENDPOINT_CONFIG, FAIL, INFERENCE_COMPONENT, INFO, MODEL, PASS,
                             SCALABLE_TARGET, StackReview)

_ICON = {PASS: "✅", FAIL: "❌", INFO: "ℹ️"}
# Always listed in the findings table; other changed resources are summarised in one line.
SERVING_TYPES = frozenset({MODEL, ENDPOINT_CONFIG, ENDPOINT, INFERENCE_COMPONENT, SCALABLE_TARGET,
                           "AWS::ApplicationAutoScaling::ScalingPolicy"})


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(reviews: list[StackReview], *, base_label: str, head_label: str) -> str:
    failed = [r for r in reviews if r.verdict == FAIL]
    out = [
        "# Stack diff",
        "",
        f"Base {base_label} → {head_label}. "
        + (f"**{len(failed)} of {len(reviews)} stack(s) need a different rollout.**" if failed
           else f"All {len(reviews)} stack(s) can roll out as they are."),
        "",
    ]
    for r in reviews:
        status = "new stack" if r.new_stack else "removed stack" if r.removed_stack else ""
        out.append(f"## {_ICON[r.verdict]} `{r.display_name}` ({r.stack_name}){' — ' + status if status else ''}")
        out.append("")
        shown = [f for f in r.findings if f.verdict in (PASS, FAIL) or f.type in SERVING_TYPES]
        other = [f for f in r.findings if f not in shown]
        if not r.findings:
            out += ["No changes.", ""]
        if shown:
            out += ["| | resource | type | change | why |", "|---|---|---|---|---|"]
            for f in shown:
                out.append(f"| {_ICON[f.verdict]} | `{f.logical_id}` | {f.type} | {_cell(f.change)} | {_cell(f.why)} |")
            out.append("")
        if other:
            summary = ", ".join(f"`{f.logical_id}` ({f.change})" for f in other[:12])
            more = f" and {len(other) - 12} more" if len(other) > 12 else ""
            out += [f"Other changes: {summary}{more}.", ""]
        for f in r.findings:
            if f.verdict == FAIL and f.advice:
                out += [f"**How to roll out `{f.logical_id}` ({_cell(f.change)}) safely:**", "", f.advice, ""]
        if r.cli_diff and r.findings:
            out += ["<details><summary>cdk diff</summary>", "", "```diff", r.cli_diff, "```", "", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"
