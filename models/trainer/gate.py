"""The drafter gate: a candidate head replaces the one in service only when it accepts more, on the same held-out
requests, by a stated margin that its bootstrap interval clears.

Both heads are measured the way vLLM serves them (per request, its spec-decode counters: drafts and tokens
accepted per position, rows as :mod:`models.acceptance_stats` reads them) at the stage's K. The gate compares AL at
that K: ``after / before`` with a paired 90% interval (the same requests resampled for both). It passes when the
interval's lower bound is at least ``margin``; a ratio above the margin whose interval reaches below it is refused.
So a head that only looks better on a lucky handful of requests stages nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.acceptance_stats import acceptance_length, bootstrap_al, paired_ratio, pooled

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

    @property
    def gate(self) -> str:
        return PASSED if self.al_ratio["interval"][0] >= self.margin else REFUSED

    def summary(self) -> str:
        """One line a person reads: both figures, the ratio and why it passed or not."""
        b, a, r = self.al_before, self.al_after, self.al_ratio
        verdict = (f"passed: its lower bound is at least the margin {self.margin:g}" if self.gate == PASSED else
                   f"refused: the lower bound {r['interval'][0]:.3f} is below the margin {self.margin:g}")
        return (f"gate at K={self.k} on {self.requests} held-out requests: AL {b['value']:.3f} "
                f"[{b['interval'][0]:.3f}, {b['interval'][1]:.3f}] in service, {a['value']:.3f} "
                f"[{a['interval'][0]:.3f}, {a['interval'][1]:.3f}] candidate; ratio {r['value']:.3f} "
                f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]: {verdict}")

    def report(self) -> dict:
        return {"gate": self.gate, "k": self.k, "margin": self.margin, "requests_held_out": self.requests,
                "al_before": self.al_before, "al_after": self.al_after, "al_ratio": self.al_ratio,
                "conditional_before": self.conditional_before, "conditional_after": self.conditional_after}


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
