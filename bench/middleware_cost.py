"""What the request middleware costs: TPOT and tokens/s through it and without it, side by side.

    make bench-middleware        # or: .venv/bin/python bench/middleware_cost.py [--rounds 8] [--max-tokens 96]

Two servers with the same engine settings, started together: our entrypoint (vLLM's OpenAI server with
the middleware) and the same command line less ``--middleware``. Both serve the tiny pair with P-EAGLE
(K=4, fp32, eager) on this CPU. Both servers run on CPU 0 (their engine's OpenMP threads bound there) and
the client on CPU 1: on 2 cores a client, two engines and their thread pools on the same cores made rounds
of one server differ 3-6x. Rounds alternate between them (A B, B A, ...) at concurrency 1 and 16, so the
machine's drift falls on both alike; every request streams ``max_tokens`` tokens (``ignore_eos``) through
/invocations, measured at the client (harness.client). Per config: median time per output token over the
requests, tokens/s over each round's wall time (median of rounds), the ratio with / without, and the median
of the per-round ratios (each round's pair measured back to back).
Goal: the middleware adds at most 2% to TPOT. Writes bench/results/middleware_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.client import stream_invocation  # noqa: E402 - the repository's own packages, after the path is set
from harness.runtime import LocalRuntime  # noqa: E402

SERVER_CPU = "0"
PROMPTS = ("Once upon a time", "def add(a, b):", "The quick brown fox", "Paris is the capital of",
           "Numbers: 1 2 3 4", "Speculative decoding drafts")


def load(base: str, *, concurrency: int, requests: int, max_tokens: int) -> dict:
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    def one(i: int):
        return stream_invocation(base, {**body, "prompt": PROMPTS[i % len(PROMPTS)]})

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - started
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) * 1000 for r in results if r.output_tokens > 1]
    assert all(r.output_tokens == max_tokens for r in results), [r.output_tokens for r in results]
    return {"tpot_ms": tpots, "tokens_per_s": sum(r.output_tokens for r in results) / wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds per server and concurrency (alternating)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "middleware_cost.json")
    args = parser.parse_args(argv)
    from models.tiny import build

    pair = build()
    logs = Path(tempfile.mkdtemp(prefix="middleware-bench-"))
    servers = {name: LocalRuntime(target=pair.target, drafter=pair.drafter, k=4, log_dir=logs, name=name,
                                  middleware=(name == "with"), max_model_len=512, max_num_seqs=16,
                                  extra_env={"VLLM_CPU_OMP_THREADS_BIND": SERVER_CPU})
               for name in ("with", "without")}
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {int(SERVER_CPU)})  # the servers inherit CPU 0 ...
    for server in servers.values():
        server.start()
    os.sched_setaffinity(0, set(cpus) - {int(SERVER_CPU)} or set(cpus))  # ... and the client keeps the rest
    try:
        for server in servers.values():
            server.wait_ready(900)
        for server in servers.values():  # first requests pay one-time costs: out of the figures
            load(server.base, concurrency=2, requests=2, max_tokens=8)
        measured: dict[str, dict[str, list]] = {}
        for concurrency, requests in ((1, 6), (16, 16)):
            for round_no in range(args.rounds):
                for name in (("with", "without") if round_no % 2 == 0 else ("without", "with")):
                    r = load(servers[name].base, concurrency=concurrency, requests=requests,
                             max_tokens=args.max_tokens)
                    slot = measured.setdefault(f"c{concurrency}", {}).setdefault(name, [])
                    slot.append(r)
                    print(f"c={concurrency:<2} round {round_no + 1}/{args.rounds} {name:<7} "
                          f"TPOT median {statistics.median(r['tpot_ms']):6.2f} ms  {r['tokens_per_s']:7.1f} tok/s",
                          flush=True)
        lines = len(servers["with"].request_lines())
    finally:
        for server in servers.values():
            server.stop()
    summary = {}
    for key, by_name in measured.items():
        row = {}
        for name, rounds in by_name.items():
            row[name] = {"tpot_ms_median": round(statistics.median([t for r in rounds for t in r["tpot_ms"]]), 3),
                         "tokens_per_s_median": round(statistics.median(r["tokens_per_s"] for r in rounds), 2)}
        row["tpot_ratio_with_over_without"] = round(row["with"]["tpot_ms_median"] / row["without"]["tpot_ms_median"], 4)
        row["tpot_ratio_median_of_rounds"] = round(statistics.median(
            statistics.median(w["tpot_ms"]) / statistics.median(wo["tpot_ms"])
            for w, wo in zip(by_name["with"], by_name["without"])), 4)
        row["tokens_per_s_ratio_with_over_without"] = round(
            row["with"]["tokens_per_s_median"] / row["without"]["tokens_per_s_median"], 4)
        summary[key] = row
    report = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
              "date": time.strftime("%Y-%m-%d"), "command": "make bench-middleware",
              "settings": {"pair": "tiny (models.tiny)", "k": 4, "max_tokens": args.max_tokens, "rounds": args.rounds,
                           "dtype": "float32", "enforce_eager": True,
                           "cpus": f"servers on CPU {SERVER_CPU}, the client on the others"},
              "request_lines_logged_with_middleware": lines, "summary": summary,
              "goal": "TPOT ratio with/without <= 1.02"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
