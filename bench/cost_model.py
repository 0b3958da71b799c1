"""A step-time model of speculative decoding that must predict what it did not see.

Every benchmark configuration reports its tokens/s and its target forwards per output token, so each gives its
own step time (``1000 / (tokens/s x forwards per token)`` ms) and the tokens a step yields (``1 / forwards per
token``). The model:

* **step time** per method and concurrency is a line in K, ``ms_at_k0 + ms_per_position x K``, fitted by least
  squares to the synthetic-acceptance sweep (bench/synthetic_sweep.py), where acceptance is set by vLLM and
  drafting is all that differs between the methods; plain decoding's step time is its own measurement;
* **tokens per step** is the sequences a step serves (plain decoding's tokens per step) times the acceptance
  length, ``AL(K) = 1 + sum over i <= K of the product of the conditional acceptances of positions 1..i``,
  from the acceptance measured for the trained heads;
* so a configuration's tokens/s is ``sequences x AL(K) / step time`` and a ratio of two configurations is the
  ratio of those. Checked against the end-to-end run (bench/real_spec.py), every ratio within 3% is the goal;
  :func:`errors` says by how much each one misses.

Standard library only: it reads the benchmarks' JSON and needs no engine.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class StepLine:
    ms_at_k0: float
    ms_per_position: float

    def at(self, k: int) -> float:
        return self.ms_at_k0 + self.ms_per_position * k


def fit_line(points: Sequence[tuple[float, float]]) -> StepLine | None:
    """Least squares through (K, ms); None with fewer than two distinct K."""
    xs = [p[0] for p in points]
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(p[1] for p in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return StepLine(ms_at_k0=my - b * mx, ms_per_position=b)


def step_ms(summary: Mapping) -> float:
    """A configuration's measured time per decoding step (every sequence of the batch advances once)."""
    return 1000.0 / (summary["tokens_per_s"] * summary["target_forwards_per_output_token"])


def tokens_per_step(summary: Mapping) -> float:
    return 1.0 / summary["target_forwards_per_output_token"]


def fit_steps(summaries: Iterable[Mapping]) -> dict[tuple[str, int], StepLine]:
    """(method, concurrency) -> its step-time line, from every speculative configuration given."""
    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for s in summaries:
        if s["method"] != "plain":
            points.setdefault((s["method"], int(s["concurrency"])), []).append((s["k"], step_ms(s)))
    return {key: line for key, pts in points.items() if (line := fit_line(pts)) is not None}


def acceptance_length(conditional: Sequence[float], k: int) -> float:
    """AL at K from per-position conditional acceptance (position i accepted given 1..i-1 were)."""
    if k > len(conditional):
        raise ValueError(f"K={k}: acceptance measured for {len(conditional)} positions only")
    total, run = 1.0, 1.0
    for p in conditional[:k]:
        run *= p
        total += run
    return total


@dataclass(frozen=True)
class CostModel:
    lines: Mapping[tuple[str, int], StepLine]
    plain_step_ms: Mapping[int, float]  # concurrency -> plain decoding's step time
    sequences: Mapping[int, float]  # concurrency -> sequences a step serves (plain decoding's tokens per step)

    @classmethod
    def from_sweep(cls, summaries: Iterable[Mapping]) -> "CostModel":
        summaries = list(summaries)
        plains = [s for s in summaries if s["method"] == "plain"]
        return cls(lines=fit_steps(summaries),
                   plain_step_ms={int(s["concurrency"]): step_ms(s) for s in plains},
                   sequences={int(s["concurrency"]): tokens_per_step(s) for s in plains})

    def tokens_per_s(self, method: str, k: int, concurrency: int, al: float) -> float:
        if method == "plain":
            return 1000.0 * self.sequences[concurrency] / self.plain_step_ms[concurrency]
        line = self.lines[(method, concurrency)]
        return 1000.0 * self.sequences[concurrency] * al / line.at(k)

    def ratio(self, a: tuple[str, int, float], b: tuple[str, int, float], concurrency: int) -> float:
        """(method, K, AL) a over b at one concurrency."""
        return self.tokens_per_s(a[0], a[1], concurrency, a[2]) / self.tokens_per_s(b[0], b[1], concurrency, b[2])


def errors(model: CostModel, measured: Iterable[Mapping]) -> list[dict]:
    """For each measured end-to-end ratio ``{"a": (method, K, AL), "b": (...), "concurrency": c, "ratio": r}``:
    the model's prediction and its relative error."""
    out = []
    for m in measured:
        predicted = model.ratio(tuple(m["a"]), tuple(m["b"]), int(m["concurrency"]))
        out.append({**m, "predicted": round(predicted, 4),
                    "relative_error": round(abs(predicted - m["ratio"]) / m["ratio"], 4)})
    return out
