"""vLLM's speculative-decoding counters, from a server's /metrics or an in-process engine, as one type.

Acceptance length AL = 1 + accepted / drafts: the tokens each target step yields (one draft of K tokens
per step). Counters only grow, so a figure for a stretch of work is the difference of two readings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

_PREFIX = "vllm:spec_decode_num_"
_SCALARS = {"drafts": "drafts", "draft_tokens": "draft_tokens", "accepted_tokens": "accepted"}
_PER_POSITION = "accepted_tokens_per_pos"


@dataclass(frozen=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: tuple[float, ...] = ()  # accepted tokens at draft position 0, 1, ...

    def __sub__(self, earlier: "SpecCounters") -> "SpecCounters":
        width = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        mine = self.accepted_per_position + (0.0,) * (width - len(self.accepted_per_position))
        theirs = earlier.accepted_per_position + (0.0,) * (width - len(earlier.accepted_per_position))
        return SpecCounters(drafts=self.drafts - earlier.drafts, draft_tokens=self.draft_tokens - earlier.draft_tokens,
                            accepted=self.accepted - earlier.accepted,
                            accepted_per_position=tuple(a - b for a, b in zip(mine, theirs)))

    @property
    def acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted per drafted token."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    def per_position_rates(self) -> list[float]:
        """How often the draft token at each position was accepted, per draft."""
        return [a / self.drafts for a in self.accepted_per_position] if self.drafts else []


def _field(metric_name: str) -> str | None:
    name = metric_name.removesuffix("_total")
    if not name.startswith(_PREFIX):
        return None
    return name[len(_PREFIX):]


def from_prometheus(text: str) -> SpecCounters:
    """Sum the counters over their label sets in a Prometheus text exposition (a server's /metrics)."""
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        key = _field(name)
        if key in _SCALARS:
            totals[_SCALARS[key]] += float(value)
        elif key == _PER_POSITION:
            position = int(labels.split('position="', 1)[1].split('"', 1)[0])
            per_pos[position] = per_pos.get(position, 0.0) + float(value)
    ordered = tuple(per_pos[i] for i in sorted(per_pos))
    return SpecCounters(accepted_per_position=ordered, **totals)


def from_engine(metrics: Iterable[object]) -> SpecCounters:
    """The same counters from an in-process engine's ``vllm.LLM.get_metrics()``."""
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
    per_pos: tuple[float, ...] = ()
    for metric in metrics:
        key = _field(getattr(metric, "name", ""))
        if key in _SCALARS:
            totals[_SCALARS[key]] += float(metric.value)
        elif key == _PER_POSITION:
            per_pos = tuple(float(v) for v in metric.values)
    return SpecCounters(accepted_per_position=per_pos, **totals)


def scrape(base: str) -> SpecCounters:
    import httpx

    return from_prometheus(httpx.get(base.rstrip("/") + "/metrics", timeout=30).text)
