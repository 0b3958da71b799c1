"""The drafter gate: a candidate head replaces the one in service only when it accepts more, on the same held-out
requests, by a stated margin that its bootstrap interval clears.

Both heads are measured the way vLLM serves them (per request, its spec-decode counters: drafts and tokens
accepted per position, rows as :mod:`models.acceptance_stats` reads them) at the stage's K. The gate compares AL at
that K: ``after / before`` with a paired 90% interval (the same requests resampled for both). It passes when the
interval's lower bound is at least ``margin``; a ratio above the margin whose interval reaches below it is refused.
So a head that only looks better on a lucky handful of requests stages nothing.

:func:`measure` runs both heads on vLLM (models.trainer.serving_check: one engine after the other, each request
alone, so concurrency 1) and also reports tokens per second, candidate over in service, with a paired interval.
The two engines run one after the other, not interleaved, so that ratio carries the machine's drift between them;
it is reported, not gated on. Both heads must give the same greedy tokens (speculative decoding does not change
them): a head whose output differs is refused whatever it accepts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from models.acceptance_stats import RESAMPLES, acceptance_length, bootstrap_al, interval, paired_ratio, pooled

PASSED, REFUSED = "passed", "refused"


@dataclass(frozen=True)
class GateResult:
    k: int
    margin: float
    requests: int
    al_before: dict  # {"value", "interval"}
    al_after: dict
    al_ratio: dict
    conditional_before: list  # per-position conditional acceptance, pooled
    conditional_after: list
    # Set by measure(): tokens/s candidate over in service at concurrency 1 ({"value", "interval"}), and whether
    # both heads gave the same greedy tokens on every request.
    tokens_per_s_ratio: dict | None = None
    outputs_identical: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gate(self) -> str:
        return PASSED if self.outputs_identical and self.al_ratio["interval"][0] >= self.margin else REFUSED

    def summary(self) -> str:
        """One line a person reads: both figures, the ratio and why it passed or not."""
        b, a, r = self.al_before, self.al_after, self.al_ratio
        if not self.outputs_identical:
            verdict = "refused: its greedy output differs from the head in service's"
        elif self.gate == PASSED:
            verdict = f"passed: its lower bound is at least the margin {self.margin:g}"
        else:
            verdict = f"refused: the lower bound {r['interval'][0]:.3f} is below the margin {self.margin:g}"
        return (f"gate at K={self.k} on {self.requests} held-out requests: AL {b['value']:.3f} "
                f"[{b['interval'][0]:.3f}, {b['interval'][1]:.3f}] in service, {a['value']:.3f} "
                f"[{a['interval'][0]:.3f}, {a['interval'][1]:.3f}] candidate; ratio {r['value']:.3f} "
                f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]: {verdict}")

    def report(self) -> dict:
        return {"gate": self.gate, "k": self.k, "margin": self.margin, "requests_held_out": self.requests,
                "al_before": self.al_before, "al_after": self.al_after, "al_ratio": self.al_ratio,
                "conditional_before": self.conditional_before, "conditional_after": self.conditional_after,
                "tokens_per_s_ratio_c1": self.tokens_per_s_ratio, "outputs_identical": self.outputs_identical,
                "notes": list(self.notes)}


def judge(in_service: list[dict], candidate: list[dict], *, k: int, margin: float) -> GateResult:
    """The gate on rows of the same held-out requests, in the same order, for the head in service and the
    candidate. ValueError naming what is wrong when the rows cannot be compared."""
    if not (isinstance(margin, (int, float)) and margin >= 1.0):
        raise ValueError(f"margin: got {margin!r}; allowed: a number >= 1 (the AL ratio the candidate must clear)")
    if len(in_service) != len(candidate) or not candidate:
        raise ValueError(f"rows: got {len(in_service)} in service and {len(candidate)} candidate; allowed: the same "
                         "held-out requests for both, at least one")
    for name, rows in (("in service", in_service), ("candidate", candidate)):
        if acceptance_length(rows, k) is None:
            raise ValueError(f"{name}: no drafts in {len(rows)} requests; allowed: rows of a head that drafted")
    ratio = paired_ratio(candidate, in_service, k)

    def al(rows: list[dict]) -> dict:
        return {"value": round(acceptance_length(rows, k), 4), "interval": bootstrap_al(rows, k)}

    return GateResult(k=k, margin=float(margin), requests=len(candidate), al_before=al(in_service),
                      al_after=al(candidate), al_ratio=ratio,
                      conditional_before=pooled(in_service, k)["conditional"],
                      conditional_after=pooled(candidate, k)["conditional"])


def rows_of(result: dict, k: int) -> list[dict]:
    """A serving check's per-request counters as acceptance rows at ``k`` (positions vLLM did not report: 0)."""
    return [{"drafts": r["drafts"], "accepted": (list(r["accepted"]) + [0] * k)[:k], "output_tokens": r["output_tokens"],
             "seconds": r["seconds"]} for r in result["per_prompt"]]


def rate_ratio(a: list[dict], b: list[dict], *, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Tokens per second of ``a`` over ``b`` on the same requests (sums of tokens over sums of seconds), with a
    paired 90% interval."""
    def rate(rows: list[dict]) -> float:
        return sum(r["output_tokens"] for r in rows) / max(sum(r["seconds"] for r in rows), 1e-9)

    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = rng.choices(range(len(a)), k=len(a))
        ratios.append(rate([a[i] for i in picks]) / rate([b[i] for i in picks]))
    return {"value": round(rate(a) / rate(b), 4), "interval": interval(ratios)}


def measure(target: Path, *, in_service: Path, candidate: Path, prompts: Sequence[list[int]], k: int, margin: float,
            max_tokens: int, log=print) -> GateResult:
    """Both P-EAGLE heads served by vLLM at K=``k`` on the held-out ``prompts`` (token ids), then :func:`judge`."""
    from models.pair import drafter_config
    from models.trainer import serving_check

    configs = [{"name": name, "speculative_config": drafter_config(folder, k, parallel=True)}
               for name, folder in (("in-service", in_service), ("candidate", candidate))]
    before, after = serving_check.measure(target, configs, prompts, max_tokens=max_tokens, log=log)
    rows_before, rows_after = rows_of(before, k), rows_of(after, k)
    result = judge(rows_before, rows_after, k=k, margin=margin)
    same = before["token_ids"] == after["token_ids"]
    return replace(result, tokens_per_s_ratio=rate_ratio(rows_after, rows_before), outputs_identical=same,
                   notes=("tokens/s: the two engines ran one after the other on this machine, not interleaved",))
