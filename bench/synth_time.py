#!/usr/bin/env python3
"""Synth benchmark: median wall time of `make synth`'s command (all stages, pinned CLI) over several runs.

Each run starts from an empty output directory, as `make synth` does (it removes cdk.out first), and
includes the CLI, the Python app, jsii start-up, asset staging, the four nag packs and template writing.
Goal: under 15 s median on the 2-core CI machine. Usage: `make bench-synth` or
`.venv/bin/python -m bench.synth_time --runs 5`. Results go to stdout and bench/results/synth_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ops import cdk
from stacks.environments import ENVIRONMENTS

REPO = Path(__file__).resolve().parent.parent

GOAL_S = 15.0
STAGES = tuple(env.name for env in ENVIRONMENTS)


def synth_once(outdir: Path) -> float:
    shutil.rmtree(outdir, ignore_errors=True)
    start = time.perf_counter()
    proc = cdk.synth(outdir, context={"offline": "true"}, label=None, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"cdk synth failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    missing = [s for s in STAGES if not list((outdir / f"assembly-{s}").glob("*.template.json"))]
    if missing:
        sys.exit(f"cdk synth wrote no template for {missing}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.synth_time", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured first runs (jsii cache, disk cache)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="synth-bench-") as tmp:
        outdir = Path(tmp) / "cdk.out"
        for _ in range(args.warmup):
            synth_once(outdir)
        times = [synth_once(outdir) for _ in range(args.runs)]
    median = statistics.median(times)
    result = {"runs_s": [round(t, 2) for t in times], "median_s": round(median, 2), "min_s": round(min(times), 2),
              "max_s": round(max(times), 2), "goal_s": GOAL_S, "met": median < GOAL_S,
              "cpus": os.cpu_count(), "stages": list(STAGES)}
    print(json.dumps(result, indent=2))
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "synth_time.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
