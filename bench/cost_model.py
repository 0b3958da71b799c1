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
  :func:`errors` says by how much each one misses;
* a run with natural stops sends closed batches whose requests finish at different steps, so a batch of 8
  spends its last steps as a batch of fewer: :meth:`CostModel.workload_ratio` charges every step at the
  number of requests still running (step time linear in the batch between the measured concurrencies, an
  interpolation), given the output lengths, which greedy speculative decoding leaves unchanged;
* :func:`choose_schedule` turns the same figures into K by load for vLLM's ``num_speculative_tokens_per_batch_size``.

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


    def step_at(self, method: str, k: int, batch: float) -> float:
        """Step time (ms) with ``batch`` sequences in the step: the measured concurrencies' step times, linear in
        the batch between them (held flat outside them). Between two measured concurrencies this is an
        interpolation, not a measurement."""
        if method == "plain":
            points = sorted(self.plain_step_ms.items())
        else:
            points = sorted((c, line.at(k)) for (m, c), line in self.lines.items() if m == method)
        if not points:
            raise KeyError(f"no step times for {method!r}")
        if batch <= points[0][0]:
            return points[0][1]
        for (c0, y0), (c1, y1) in zip(points, points[1:]):
            if batch <= c1:
                return y0 + (y1 - y0) * (batch - c0) / (c1 - c0)
        return points[-1][1]

    def batch_ms(self, method: str, k: int, al: float, lengths: Sequence[int]) -> float:
        """Predicted time for one closed batch whose requests write ``lengths`` tokens: request j takes
        ``lengths[j] / AL`` steps, and each step costs the step time at the number of requests still running
        (so a batch whose short answers finish early is charged as the smaller batch it becomes)."""
        steps = sorted(length / al for length in lengths)
        total, previous = 0.0, 0.0
        for i, s in enumerate(steps):
            total += (s - previous) * self.step_at(method, k, len(steps) - i)
            previous = s
        return total

    def workload_ratio(self, a: tuple[str, int, float], b: tuple[str, int, float],
                       batches: Sequence[Sequence[int]]) -> float:
        """Tokens/s of (method, K, AL) ``a`` over ``b`` on the same closed batches (the same tokens, since
        greedy speculative output equals plain decoding's): b's predicted time over a's."""
        time_a = sum(self.batch_ms(*a, batch) for batch in batches)
        time_b = sum(self.batch_ms(*b, batch) for batch in batches)
        return time_b / time_a


def choose_schedule(model: CostModel, method: str, reach: Sequence[float], *, trained_k: int,
                    max_batch: int) -> dict:
    """K by load for ``method`` from the model: the K that is fastest for one request (AL from ``reach``, the
    share of drafts with at least i tokens accepted), kept on for every batch size at which the model predicts
    drafting beats plain decoding (from 1 up, contiguously) and off (0) above. vLLM 0.32's parallel drafting
    runs only the full K or none (peagle_contract.serving.check_k_schedule), so K is not tuned per batch."""
    al = [1 + sum(reach[:k]) for k in range(trained_k + 1)]

    def speedup(k: int, batch: int) -> float:
        return al[k] * model.step_at("plain", 0, batch) / model.step_at(method, k, batch)

    best_k = max(range(1, trained_k + 1), key=lambda k: speedup(k, 1))
    predicted = {batch: round(speedup(best_k, batch), 4) for batch in range(1, max_batch + 1)}
    on = 0
    while on < max_batch and predicted[on + 1] > 1.0:
        on += 1
    if on == max_batch:
        schedule = None  # drafting pays at every load: a fixed K
    elif on == 0:
        schedule = [[1, max_batch, 0]]
    else:
        schedule = [[1, on, best_k], [on + 1, max_batch, 0]]
    return {"k": best_k, "drafting_up_to_batch": on, "schedule": schedule,
            "predicted_speedup_vs_plain_by_batch": predicted,
            "how": "AL at each K from the measured acceptance; step times from the synthetic sweep at the "
                   "measured concurrencies, linear in the batch size between them"}


def errors(model: CostModel, measured: Iterable[Mapping]) -> list[dict]:
    """For each measured end-to-end ratio ``{"a": (method, K, AL), "b": (...), "concurrency": c, "ratio": r}``:
    the model's prediction and its relative error. With ``"batches"`` (the output lengths of each closed batch
    the run sent) the prediction follows each batch as its requests finish (:meth:`CostModel.workload_ratio`);
    without, every step is taken at the full concurrency (:meth:`CostModel.ratio`)."""
    out = []
    for m in measured:
        if m.get("batches"):
            predicted = model.workload_ratio(tuple(m["a"]), tuple(m["b"]), m["batches"])
        else:
            predicted = model.ratio(tuple(m["a"]), tuple(m["b"]), int(m["concurrency"]))
        out.append({**m, "predicted": round(predicted, 4),
                    "relative_error": round(abs(predicted - m["ratio"]) / m["ratio"], 4)})
    return out
