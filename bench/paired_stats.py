"""Statistics the paired benchmarks share."""

from __future__ import annotations

import random
import statistics


def median_interval(values: list[float], *, resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 90% bootstrap interval for the median of ``values``: how far the median of this many rounds can be
    trusted, given how much they scatter."""
    return quantile_interval(values, 0.5, resamples=resamples, seed=seed)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank: a value that was measured)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def quantile_interval(values: list[float], q: float, *, resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 90% bootstrap interval for the ``q`` quantile of ``values`` (0.5: the median)."""
    rng = random.Random(seed)
    pick = statistics.median if q == 0.5 else (lambda sample: quantile(sample, q))
    estimates = sorted(pick(rng.choices(values, k=len(values))) for _ in range(resamples))
    return estimates[int(0.05 * resamples)], estimates[int(0.95 * resamples) - 1]
