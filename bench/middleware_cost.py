"""What the request middleware costs: TPOT and tokens/s through it and without it, side by side.

    make bench-middleware [LAYOUT=shared|split]   # or: .venv/bin/python -m bench.middleware_cost [--layout ...]

Two servers with the same engine settings, started together: our entrypoint (vLLM's OpenAI server with
the middleware) and the same command line less ``--middleware``. Both serve the random pair with P-EAGLE
(K=4, fp32, eager) on this CPU; every request streams ``max_tokens`` tokens (``ignore_eos``) through
/invocations, measured at the client (harness.client), at concurrency 1 and 16. Per config: median time per
output token over the requests, tokens/s over each round's wall time (median of rounds), the ratio with /
without, the median of the per-round ratios with its quartiles and a 90% bootstrap interval, and the CPU time
the API server process spent per output token (where the middleware runs; the engine core is a process of
its own).

Layouts (2 CPUs):
- ``paired`` (the default): both servers at the same time, each with its engine, its API server and its
  client on a CPU of its own; the CPUs swap every round so neither arm keeps the better one. Every
  microsecond the middleware spends is taken from its engine (the worst case), and each round is a with /
  without pair measured at the same moment of the machine's drift. Taking turns on one CPU instead, an arm's
  rounds ranged 0.8-1.2x of each other on this machine, more than the 2% to be resolved.
- ``shared`` and ``split`` take turns, rotating the arms' order every round (A B C, B C A, ...): the engines'
  OpenMP threads on CPU 0, the client on CPU 1, and the API servers on CPU 0 (``shared``) or on CPU 1
  (``split``, as a GPU instance gives the API server cores of its own). A third arm sends the "without"
  server what the middleware adds to a stream's request (usage in every event): the part of the cost that
  is vLLM's. (On 2 cores, a client, two engines and their thread pools on the same cores made rounds of one
  server differ 3-6x, hence the binding.)
Goal: the middleware adds at most 2% to TPOT. Writes bench/results/middleware_cost.json (paired) or
middleware_cost_<layout>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.paired_stats import median_interval
from harness.client import stream_invocation
from harness.runtime import LocalRuntime, local_serving

REPO = Path(__file__).resolve().parent.parent

SERVER_CPU = "0"
LAYOUTS = ("shared", "split", "paired")
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


def pin_process_tree(pid: int, cpu: int) -> None:
    """Every thread of the server's processes (API server, engine core and their thread pools) onto ``cpu``:
    a thread's CPU set is its own, so each is set (the engine's OpenMP binding included)."""
    import psutil

    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            threads = proc.threads()
        except psutil.NoSuchProcess:
            continue  # a process that ended meanwhile
        for thread in threads:
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread.id, {cpu})


def _pinned_worker(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})


def paired_rounds(servers: dict, *, rounds: int, max_tokens: int, schedule: tuple) -> dict[str, dict[str, list]]:
    """Both servers loaded at once, each on its own CPU with a client process pinned there; CPUs swap every
    round, so neither arm keeps the better core."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    cpus = sorted(os.sched_getaffinity(0))[:2]
    fork = multiprocessing.get_context("fork")
    clients = {cpu: ProcessPoolExecutor(1, mp_context=fork, initializer=_pinned_worker, initargs=(cpu,))
               for cpu in cpus}
    measured: dict[str, dict[str, list]] = {}
    try:
        for concurrency, requests in schedule:
            for round_no in range(rounds):
                order = ("with", "without") if round_no % 2 == 0 else ("without", "with")
                placed = dict(zip(order, cpus))
                for name, cpu in placed.items():
                    pin_process_tree(servers[name].proc.pid, cpu)
                cpu_before = {name: cpu_seconds(servers[name].proc.pid) for name in placed}
                futures = {name: clients[cpu].submit(load, servers[name].base, concurrency=concurrency,
                                                     requests=requests, max_tokens=max_tokens)
                           for name, cpu in placed.items()}
                for name, future in futures.items():
                    r = future.result()
                    r["api_cpu_us_per_token"] = ((cpu_seconds(servers[name].proc.pid) - cpu_before[name]) * 1e6
                                                 / (requests * max_tokens))
                    measured.setdefault(f"c{concurrency}", {}).setdefault(name, []).append(r)
                    print(f"c={concurrency:<2} round {round_no + 1}/{rounds} {name:<8} on CPU {placed[name]} "
                          f"TPOT median {statistics.median(r['tpot_ms']):6.2f} ms  {r['tokens_per_s']:7.1f} tok/s  "
                          f"API server CPU {r['api_cpu_us_per_token']:6.1f} us/token", flush=True)
    finally:
        for pool in clients.values():
            pool.shutdown()
    return measured


def sequential_rounds(servers: dict, *, rounds: int, max_tokens: int, schedule: tuple) -> dict[str, dict[str, list]]:
    """The arms one after another from this process's CPUs, their order rotated every round (A B C, B C A, ...)."""
    measured: dict[str, dict[str, list]] = {}
    for concurrency, requests in schedule:
        for round_no in range(rounds):
            names = list(ARMS)
            for name in names[round_no % len(names):] + names[:round_no % len(names)]:  # each arm leads in turn
                server, extra = ARMS[name]
                pid = servers[server].proc.pid
                cpu_before = cpu_seconds(pid)
                r = load(servers[server].base, concurrency=concurrency, requests=requests,
                         max_tokens=max_tokens, extra=extra)
                r["api_cpu_us_per_token"] = (cpu_seconds(pid) - cpu_before) * 1e6 / (requests * max_tokens)
                measured.setdefault(f"c{concurrency}", {}).setdefault(name, []).append(r)
                print(f"c={concurrency:<2} round {round_no + 1}/{rounds} {name:<15} "
                      f"TPOT median {statistics.median(r['tpot_ms']):6.2f} ms  {r['tokens_per_s']:7.1f} tok/s  "
                      f"API server CPU {r['api_cpu_us_per_token']:6.1f} us/token", flush=True)
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.middleware_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per server and concurrency (default 8; paired: 64)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--layout", choices=LAYOUTS, default="paired",
                        help="shared: API servers on the engines' CPU (their work taken from the engine); split: "
                             "API servers on the client's CPU, as a GPU instance gives the API server its own cores; "
                             "paired: both servers at once, one CPU each, swapped every round")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/middleware_cost.json (paired) or middleware_cost_<layout>.json")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (64 if args.layout == "paired" else 8)
    out = args.out or REPO / "bench" / "results" / (
        "middleware_cost.json" if args.layout == "paired" else f"middleware_cost_{args.layout}.json")
    from models.random_pair import build

    pair = build()
    logs = Path(tempfile.mkdtemp(prefix="middleware-bench-"))
    cpus = sorted(os.sched_getaffinity(0))
    paired = args.layout == "paired"
    if paired and len(cpus) < 2:
        parser.error(f"--layout paired needs two CPUs; this process may use {cpus}")
    # paired: each engine's OpenMP threads start on a CPU of their own (and are moved every round).
    engine_cpus = dict(zip(("with", "without"), cpus)) if paired else dict.fromkeys(("with", "without"), SERVER_CPU)
    servers = {name: LocalRuntime(target=pair.target, drafter=pair.drafter, log_dir=logs, name=name,
                                  serving=local_serving(num_speculative_tokens=4, max_model_len=512, max_num_seqs=16),
                                  middleware=(name == "with"),
                                  extra_env={"VLLM_CPU_OMP_THREADS_BIND": str(engine_cpus[name])})
               for name in ("with", "without")}
    client_cpus = set(cpus) - {int(SERVER_CPU)} or set(cpus)
    # The servers inherit this process's CPUs; the engines' OpenMP threads bind as set above either way.
    os.sched_setaffinity(0, {int(SERVER_CPU)} if args.layout == "shared" else set(cpus) if paired else client_cpus)
    for server in servers.values():
        server.start()
    if not paired:
        os.sched_setaffinity(0, client_cpus)  # the client keeps the other CPUs
    schedule = ((1, 6), (16, 16))  # (concurrency, requests per round)
    try:
        for server in servers.values():
            server.wait_ready(900)
        for server in servers.values():  # first requests pay one-time costs: out of the figures
            load(server.base, concurrency=2, requests=2, max_tokens=8)
        run = paired_rounds if paired else sequential_rounds
        measured = run(servers, rounds=args.rounds, max_tokens=args.max_tokens, schedule=schedule)
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
            if arm not in by_name:
                continue
            row[f"tpot_ratio_{arm}_over_without"] = round(
                row[arm]["tpot_ms_median"] / row["without"]["tpot_ms_median"], 4)
            per_round = [statistics.median(a["tpot_ms"]) / statistics.median(wo["tpot_ms"])
                         for a, wo in zip(by_name[arm], by_name["without"])]
            row[f"tpot_ratio_{arm}_median_of_rounds"] = round(statistics.median(per_round), 4)
            quartiles = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
            row[f"tpot_ratio_{arm}_rounds_quartiles"] = [round(q, 4) for q in (quartiles[0], quartiles[2])]
            row[f"tpot_ratio_{arm}_median_of_rounds_90ci"] = [round(q, 4) for q in median_interval(per_round)]
        row["tokens_per_s_ratio_with_over_without"] = round(
            row["with"]["tokens_per_s_median"] / row["without"]["tokens_per_s_median"], 4)
        summary[key] = row
    report = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
              "date": time.strftime("%Y-%m-%d"),
              "command": "make bench-middleware" + ("" if args.layout == "paired" else f" LAYOUT={args.layout}"),
              "settings": {"pair": "random (models.random_pair)", "k": 4, "max_tokens": args.max_tokens, "rounds": args.rounds,
                           "dtype": "float32", "enforce_eager": True,
                           "layout": args.layout,
                           "cpus": {"shared": f"servers and engines on CPU {SERVER_CPU}, the client on the others",
                                    "split": f"engines on CPU {SERVER_CPU}; API servers and the client on the others",
                                    "paired": "both servers at once, each with its client on a CPU of its own, "
                                              "swapped every round"}[args.layout]},
              "request_lines_logged_with_middleware": lines, "summary": summary,
              "goal": "TPOT ratio with/without <= 1.02"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
