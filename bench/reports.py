"""Where a benchmark's JSON report goes: bench/figures/ when published (the figures the README quotes),
bench/results/ otherwise (a run to look at, not committed)."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def write_report(name: str, report: dict, *, publish: bool) -> Path:
    out = BENCH / ("figures" if publish else "results") / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return out
