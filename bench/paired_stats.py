"""Statistics the paired benchmarks share."""

from __future__ import annotations

import random
import statistics


def median_interval(values: list[float], *, resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 90% bootstrap interval for the median of ``values``: how far the median of this many rounds can be
    trusted, given how much they scatter."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.05 * resamples)], medians[int(0.95 * resamples) - 1]
