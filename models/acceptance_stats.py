"""Acceptance figures from vLLM's spec-decode counters read per prompt: pooled over prompts, and bootstrapped over
them (paired between two heads run on the same prompts). The benchmark's acceptance part (bench/acceptance.py)
and the drafter gate of the training loop (ops) both judge a head by these.

A prompt's row: ``{"drafts": d, "accepted": [a_1, ..., a_k], "output_tokens": n}`` with ``a_i`` the tokens
accepted at draft position i, so ``a_i / d`` is the share of drafts with at least i tokens accepted and
``AL(k) = 1 + sum_{i <= k} a_i / d``. Figures sum the counts before dividing; intervals are 90%.
"""

from __future__ import annotations

import random

RESAMPLES = 2000


def counts(result: dict, k: int) -> dict:
    """One prompt's counters: drafts and tokens accepted at positions 1..k (zeros where vLLM reported none)."""
    accepted = list(result["accepted_per_position"])[:k]
    return {"drafts": int(result["drafts"]), "accepted": [int(a) for a in accepted + [0] * (k - len(accepted))],
            "output_tokens": sum(len(t) for t in result["token_ids"])}


def pooled(rows: list[dict], k: int) -> dict:
    """Acceptance of ``rows`` pooled: AL at every k' <= k, the share of drafts reaching each position, and the
    conditional acceptance at each position (None past a position no draft reached)."""
    drafts = sum(r["drafts"] for r in rows)
    at = [sum(r["accepted"][i] for r in rows) for i in range(k)]
    if not drafts:
        return {"drafts": 0, "acceptance_length": {}, "at_least": [], "conditional": []}
    reach = [a / drafts for a in at]
    conditional = [(at[i] / (at[i - 1] if i else drafts)) if (at[i - 1] if i else drafts) else None
                   for i in range(k)]
    return {"drafts": drafts, "acceptance_length": {j: round(1 + sum(reach[:j]), 4) for j in range(1, k + 1)},
            "at_least": [round(x, 4) for x in reach], "conditional": [None if c is None else round(c, 4)
                                                                      for c in conditional]}


def acceptance_length(rows: list[dict], k: int) -> float | None:
    drafts = sum(r["drafts"] for r in rows)
    return 1 + sum(sum(r["accepted"][i] for r in rows) for i in range(k)) / drafts if drafts else None


def interval(values: list[float]) -> list[float]:
    ordered = sorted(values)
    return [round(ordered[int(0.05 * len(ordered))], 4), round(ordered[int(0.95 * len(ordered)) - 1], 4)]


def bootstrap_al(rows: list[dict], k: int, *, resamples: int = RESAMPLES, seed: int = 0) -> list[float]:
    """90% interval of AL(k), prompts resampled."""
    rng = random.Random(seed)
    values = [acceptance_length(rng.choices(rows, k=len(rows)), k) for _ in range(resamples)]
    return interval([v for v in values if v is not None])


def paired_ratio(a: list[dict], b: list[dict], k: int, *, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """AL(k) of head ``a`` over head ``b`` on the same prompts (rows in the same order), with a paired 90%
    interval: each resample draws prompt indexes once and takes both heads' rows at them."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired rows: got {len(a)} and {len(b)}; allowed: the same prompts, at least one")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = rng.choices(range(len(a)), k=len(a))
        mine, theirs = acceptance_length([a[i] for i in picks], k), acceptance_length([b[i] for i in picks], k)
        if mine and theirs:
            ratios.append(mine / theirs)
    value = acceptance_length(a, k) / acceptance_length(b, k)
    return {"value": round(value, 4), "interval": interval(ratios)}


def summary(rows: list[dict], k: int) -> dict:
    out = pooled(rows, k)
    out["acceptance_length_90ci"] = {j: bootstrap_al(rows, j) for j in range(1, k + 1)}
    out["prompts"] = len(rows)
    out["output_tokens"] = sum(r["output_tokens"] for r in rows)
    return out
