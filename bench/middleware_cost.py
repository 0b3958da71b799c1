"""What the request middleware costs: TPOT and tokens/s through it and without it, side by side.

    make bench-middleware [LAYOUT=split]   # or: .venv/bin/python bench/middleware_cost.py [--layout split]

Two servers with the same engine settings, started together: our entrypoint (vLLM's OpenAI server with
the middleware) and the same command line less ``--middleware``. Both serve the tiny pair with P-EAGLE
(K=4, fp32, eager) on this CPU. The engines' OpenMP threads are bound to CPU 0 and the client runs on CPU 1
(on 2 cores a client, two engines and their thread pools on the same cores made rounds of one server differ
3-6x). The API servers, where the middleware runs, share CPU 0 with the engines (``shared``, the default:
every microsecond the middleware spends is taken from the engine, the worst case) or CPU 1 with the client
(``split``: as on a GPU instance, where the API server has cores of its own and the engine is on the GPU). Rounds rotate the arms' order (A B C, B C A, ...) at concurrency 1 and 16, so the
machine's drift falls on both alike; every request streams ``max_tokens`` tokens (``ignore_eos``) through
/invocations, measured at the client (harness.client). Per config: median time per output token over the
requests, tokens/s over each round's wall time (median of rounds), the ratio with / without, and the median
of the per-round ratios (each round's arms measured back to back), and the CPU time the API server process
spent per output token (where the middleware runs; the engine core is a process of its own). A third arm
sends the "without" server what the middleware adds to a stream's request (usage in every event): the part
of the cost that is vLLM's.
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
LAYOUTS = ("shared", "split")
PROMPTS = ("Once upon a time", "def add(a, b):", "The quick brown fox", "Paris is the capital of",
           "Numbers: 1 2 3 4", "Speculative decoding drafts")


# What each arm sends, and to which server. The third arm is vLLM alone doing what the middleware asks of it
# (usage in every event): it tells how much of the cost is vLLM's work rather than the middleware's own.
ARMS = {"with": ("with", {}),
        "without": ("without", {}),
        "vllm_usage_only": ("without", {"stream_options": {"include_usage": True, "continuous_usage_stats": True}})}


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far: the API server's own work, the engine core being
    a process of its own."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(base: str, *, concurrency: int, requests: int, max_tokens: int, extra: dict | None = None) -> dict:
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **(extra or {})}

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
    parser.add_argument("--layout", choices=LAYOUTS, default="shared",
                        help="shared: API servers on the engines' CPU (their work taken from the engine); split: "
                             "API servers on the client's CPU, as a GPU instance gives the API server its own cores")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/middleware_cost.json (shared) or middleware_cost_split.json")
    args = parser.parse_args(argv)
    out = args.out or REPO / "bench" / "results" / (
        "middleware_cost.json" if args.layout == "shared" else f"middleware_cost_{args.layout}.json")
    from models.tiny import build

    pair = build()
    logs = Path(tempfile.mkdtemp(prefix="middleware-bench-"))
    servers = {name: LocalRuntime(target=pair.target, drafter=pair.drafter, k=4, log_dir=logs, name=name,
                                  middleware=(name == "with"), max_model_len=512, max_num_seqs=16,
                                  extra_env={"VLLM_CPU_OMP_THREADS_BIND": SERVER_CPU})
               for name in ("with", "without")}
    cpus = sorted(os.sched_getaffinity(0))
    client_cpus = set(cpus) - {int(SERVER_CPU)} or set(cpus)
    # The servers inherit this process's CPUs; the engines' OpenMP threads bind to CPU 0 either way.
    os.sched_setaffinity(0, {int(SERVER_CPU)} if args.layout == "shared" else client_cpus)
    for server in servers.values():
        server.start()
    os.sched_setaffinity(0, client_cpus)  # the client keeps the other CPUs
    try:
        for server in servers.values():
            server.wait_ready(900)
        for server in servers.values():  # first requests pay one-time costs: out of the figures
            load(server.base, concurrency=2, requests=2, max_tokens=8)
        measured: dict[str, dict[str, list]] = {}
        for concurrency, requests in ((1, 6), (16, 16)):
            for round_no in range(args.rounds):
                names = list(ARMS)
                for name in names[round_no % len(names):] + names[:round_no % len(names)]:  # each arm leads in turn
                    server, extra = ARMS[name]
                    pid = servers[server].proc.pid
                    cpu_before = cpu_seconds(pid)
                    r = load(servers[server].base, concurrency=concurrency, requests=requests,
                             max_tokens=args.max_tokens, extra=extra)
                    r["api_cpu_us_per_token"] = (cpu_seconds(pid) - cpu_before) * 1e6 / (requests * args.max_tokens)
                    slot = measured.setdefault(f"c{concurrency}", {}).setdefault(name, [])
                    slot.append(r)
                    print(f"c={concurrency:<2} round {round_no + 1}/{args.rounds} {name:<15} "
                          f"TPOT median {statistics.median(r['tpot_ms']):6.2f} ms  {r['tokens_per_s']:7.1f} tok/s  "
                          f"API server CPU {r['api_cpu_us_per_token']:6.1f} us/token",
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
                         "tokens_per_s_median": round(statistics.median(r["tokens_per_s"] for r in rounds), 2),
                         "api_server_cpu_us_per_token_median": round(
                             statistics.median(r["api_cpu_us_per_token"] for r in rounds), 1)}
        for arm in ("with", "vllm_usage_only"):
            row[f"tpot_ratio_{arm}_over_without"] = round(
                row[arm]["tpot_ms_median"] / row["without"]["tpot_ms_median"], 4)
            row[f"tpot_ratio_{arm}_median_of_rounds"] = round(statistics.median(
                statistics.median(a["tpot_ms"]) / statistics.median(wo["tpot_ms"])
                for a, wo in zip(by_name[arm], by_name["without"])), 4)
        row["tokens_per_s_ratio_with_over_without"] = round(
            row["with"]["tokens_per_s_median"] / row["without"]["tokens_per_s_median"], 4)
        summary[key] = row
    report = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
              "date": time.strftime("%Y-%m-%d"),
              "command": "make bench-middleware" + ("" if args.layout == "shared" else f" LAYOUT={args.layout}"),
              "settings": {"pair": "tiny (models.tiny)", "k": 4, "max_tokens": args.max_tokens, "rounds": args.rounds,
                           "dtype": "float32", "enforce_eager": True,
                           "layout": args.layout,
                           "cpus": (f"servers and engines on CPU {SERVER_CPU}, the client on the others"
                                    if args.layout == "shared" else
                                    f"engines on CPU {SERVER_CPU}; API servers and the client on the others")},
              "request_lines_logged_with_middleware": lines, "summary": summary,
              "goal": "TPOT ratio with/without <= 1.02"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
