"""`make loadtest`: a concurrency sweep through the real boto3 sagemaker-runtime client.

    make loadtest                               # local: the runtime behind the front door on loopback
    make loadtest TARGET=aws ENV=dev            # a deployed endpoint

At each concurrency (1, 4, 16, 64 by default) ``concurrency`` clients stream requests back to back until
``--requests`` have finished or ``--seconds`` have passed (whichever comes first; requests already sent
finish). Reported per level: TTFT and TPOT percentiles (p50, p90, p99), output tokens/s over the level's
wall time, errors, and goodput - the share of requests that succeeded with TTFT under the target (default:
the environment's TTFT p90 alarm threshold). A table on stdout, JSON and PNG in bench/results/.
Local targets listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from ops.sagemaker_client import invoke_stream, runtime_client

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
PROMPTS = ("Write a Python function that reverses a string.", "Explain what a hash map is in two sentences.",
           "Write a function that checks whether a number is prime.", "List three uses of a queue.")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def level(client, endpoint: str, *, concurrency: int, requests: int, seconds: float, max_tokens: int,
          ttft_target_ms: float, component: str | None = None) -> dict:
    """One concurrency level: clients send back to back until the count or the time is reached."""
    lock = threading.Lock()
    state = {"sent": 0}
    results: list[dict] = []
    deadline = time.monotonic() + seconds

    def client_loop(worker: int) -> None:
        while True:
            with lock:
                if state["sent"] >= requests or time.monotonic() > deadline:
                    return
                n = state["sent"]
                state["sent"] += 1
            body = {"messages": [{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            try:
                r = invoke_stream(client, endpoint, body, component=component)
                row = {"ok": r.output_tokens > 0, "ttft_ms": r.ttft_s * 1000, "e2e_ms": r.e2e_s * 1000,
                       "tokens": r.output_tokens,
                       "tpot_ms": (r.e2e_s - r.ttft_s) * 1000 / (r.output_tokens - 1) if r.output_tokens > 1 else None}
            except Exception as exc:  # an error is a figure of the load test, not its end
                row = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
            with lock:
                results.append(row)

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(client_loop, range(concurrency)))
    wall = time.monotonic() - started
    good = [r for r in results if r["ok"]]
    ttfts = [r["ttft_ms"] for r in good]
    tpots = [r["tpot_ms"] for r in good if r["tpot_ms"] is not None]
    out = {"concurrency": concurrency, "requests": len(results), "errors": len(results) - len(good),
           "wall_s": round(wall, 2), "tokens_per_s": round(sum(r["tokens"] for r in good) / wall, 2),
           "goodput": round(sum(1 for r in good if r["ttft_ms"] <= ttft_target_ms) / max(len(results), 1), 3)}
    for name, values in (("ttft_ms", ttfts), ("tpot_ms", tpots)):
        for q in (50, 90, 99):
            value = percentile(values, q)
            out[f"{name}_p{q}"] = round(value, 1) if value is not None else None
    out["error_examples"] = sorted({r["error"] for r in results if "error" in r})[:3]
    return out


def table(levels: list[dict], target_ms: float) -> str:
    head = (f"{'conc':>4} {'reqs':>5} {'err':>4} {'TTFT p50':>9} {'p90':>7} {'p99':>7} {'TPOT p50':>9} {'p90':>6} "
            f"{'tok/s':>7} {f'goodput (TTFT<={target_ms:.0f} ms)':>26}")
    rows = [head, "-" * len(head)]
    for lv in levels:
        def f(key):
            return "-" if lv[key] is None else f"{lv[key]:.0f}"
        rows.append(f"{lv['concurrency']:>4} {lv['requests']:>5} {lv['errors']:>4} {f('ttft_ms_p50'):>9} "
                    f"{f('ttft_ms_p90'):>7} {f('ttft_ms_p99'):>7} {f('tpot_ms_p50'):>9} {f('tpot_ms_p90'):>6} "
                    f"{lv['tokens_per_s']:>7.1f} {lv['goodput']:>26.0%}")
    return "\n".join(rows)


def plot(levels: list[dict], path: Path, *, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [lv["concurrency"] for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for q in (50, 90, 99):
        axes[0].plot(conc, [lv[f"ttft_ms_p{q}"] for lv in levels], "o-", label=f"TTFT p{q}")
        axes[1].plot(conc, [lv[f"tpot_ms_p{q}"] for lv in levels], "o-", label=f"TPOT p{q}")
    axes[2].plot(conc, [lv["tokens_per_s"] for lv in levels], "o-", label="output tokens/s")
    for ax, label in zip(axes, ("ms", "ms", "tokens / s")):
        ax.set(xscale="log", xlabel="concurrency", ylabel=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from stacks.environments import ENVIRONMENTS

    parser = argparse.ArgumentParser(prog="python -m ops.loadtest", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="dev")
    parser.add_argument("--target", choices=("local", "aws"), default="local")
    parser.add_argument("--region")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=64, help="at most this many per level (default 64)")
    parser.add_argument("--seconds", type=float, default=120.0, help="at most this long per level (default 120)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ttft-target-ms", type=float, help="goodput's TTFT bound (default: the env's alarm)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    by_name = {env.name.lower(): env for env in ENVIRONMENTS}
    if args.env.lower() not in by_name:
        parser.error(f"--env: got {args.env!r}; allowed: {', '.join(by_name)}")
    if min(args.concurrency) < 1 or max(args.concurrency) > 256 or args.requests < 1 or args.seconds <= 0:
        parser.error("--concurrency 1..256, --requests >= 1, --seconds > 0")
    env = by_name[args.env.lower()]
    target_ms = args.ttft_target_ms or env.model.alarm_thresholds.ttft_p90_ms
    with ExitStack() as stack:
        if args.target == "local":
            from harness.front_door import FrontDoor
            from harness.runtime import LocalRuntime, local_serving
            from harness.serve import pick_pair

            kind, pair = pick_pair("auto")
            serving = local_serving(num_speculative_tokens=pair.trained_k(), max_model_len=2048,
                                    max_num_seqs=max(args.concurrency))
            runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, serving=serving, name="loadtest-runtime")
            print(f"starting a runtime ({kind} pair) ...", flush=True)
            stack.callback(runtime.stop)
            runtime.start().wait_ready(timeout_s=900)
            door = stack.enter_context(FrontDoor(backend=runtime.base,
                                                 endpoints={env.endpoint_name: env.component_name}))
            client = runtime_client(endpoint_url=door.url, max_connections=max(args.concurrency))
            what = f"local runtime ({kind} pair, CPU)"
        else:
            client = runtime_client(region=args.region, max_connections=max(args.concurrency))
            what = f"{env.endpoint_name} on AWS"
        levels = []
        for concurrency in args.concurrency:
            print(f"concurrency {concurrency} ...", flush=True)
            levels.append(level(client, env.endpoint_name, concurrency=concurrency, requests=args.requests,
                                seconds=args.seconds, max_tokens=args.max_tokens, ttft_target_ms=target_ms,
                                component=env.component_name))
    print(table(levels, target_ms))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"target": what, "endpoint": env.endpoint_name, "ttft_target_ms": target_ms,
              "date": time.strftime("%Y-%m-%d"), "command": "make loadtest " + " ".join(argv or sys.argv[1:]),
              "max_tokens": args.max_tokens, "levels": levels,
              "median_tokens_per_s": statistics.median(lv["tokens_per_s"] for lv in levels)}
    (out / "loadtest.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(levels, out / "loadtest.png", title=f"Load test through boto3's sagemaker-runtime client: {what}")
    print(f"wrote {out / 'loadtest.json'} and {out / 'loadtest.png'}")
    return 0 if all(lv["errors"] == 0 for lv in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
