"""The drain on SIGTERM: the longest stream that still completes, and how long the container takes to exit.

    make bench-drain   # or: .venv/bin/python -m bench.drain [--rounds 3] [--budget 20] [--publish]

Each round starts the runtime as the tests do (our entrypoint, vLLM on this CPU, the random pair with P-EAGLE
K=4) with the drain budget given (SageMaker's default here: 20 s), measures the engine's pace, then opens
streams sized at 50%, 90%, 110% and 150% of what that pace delivers within the budget, plus an 8000-token one,
and sends SIGTERM once every stream has its first event. Per round: which streams completed (their own finish
reason) and which the drain ended (its error event); how many tokens the longest stream delivered before its
end (the longest stream that would have completed at this pace); and the time from SIGTERM to the process's
exit, against SageMaker's 30 s. Writes bench/results/drain.json, or bench/figures/drain.json with --publish.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.reports import write_report
from harness.runtime import LocalRuntime, local_serving

SAGEMAKER_KILL_AFTER_S = 30
SHARES = (0.5, 0.9, 1.1, 1.5)
LONG = 8000
PROMPT = "Once upon a time"


def _stream(base: str, max_tokens: int, out: dict, first: threading.Event) -> None:
    """Read one stream; ``out`` gets the tokens it delivered, its finish reason or error, and when it ended."""
    import httpx

    out.update(tokens=0, ending=None)
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # tokens so far, per event
    try:
        with httpx.Client(timeout=120) as client, client.stream("POST", base + "/invocations", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                first.set()
                event = json.loads(line[6:])
                if "error" in event:
                    out["ending"] = f"error {event['error']['code']}"
                out["tokens"] = (event.get("usage") or {}).get("completion_tokens", out["tokens"])
                for choice in event.get("choices", []):
                    out["ending"] = choice.get("finish_reason") or out["ending"]
    except Exception as exc:  # noqa: BLE001 - a broken stream is a result too
        out["ending"] = f"broken: {type(exc).__name__}"
    finally:
        out["ended_at"] = time.monotonic()
        first.set()


def one_round(pair, budget_s: int, logs: Path, index: int) -> dict:
    import httpx

    runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, log_dir=logs,
                           serving=local_serving(num_speculative_tokens=4, max_model_len=8192),
                           name=f"bench-drain-{index}", extra_env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
                                                                   "PEAGLE_DRAIN_SECONDS": str(budget_s)})
    runtime.start().wait_ready()
    try:
        started = time.monotonic()
        httpx.post(runtime.base + "/invocations", json={"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True},
                   timeout=300)
        pace = 400 / (time.monotonic() - started)
        sizes = {f"{share:.0%} of the budget": max(8, int(share * pace * budget_s)) for share in SHARES}
        sizes[f"{LONG} tokens"] = LONG
        results = {name: {} for name in sizes}
        firsts = {name: threading.Event() for name in sizes}
        readers = [threading.Thread(target=_stream, args=(runtime.base, tokens, results[name], firsts[name]))
                   for name, tokens in sizes.items()]
        for reader in readers:
            reader.start()
        for first in firsts.values():
            first.wait(120)
        runtime.proc.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()
        for reader in readers:
            reader.join(SAGEMAKER_KILL_AFTER_S + 5)
        code = runtime.proc.wait(SAGEMAKER_KILL_AFTER_S + 5)
        exit_s = time.monotonic() - sigterm
    finally:
        runtime.stop()
    streams = {name: {"max_tokens": sizes[name], "tokens": r["tokens"], "ending": r["ending"],
                      "ended_after_sigterm_s": round(r["ended_at"] - sigterm, 2)} for name, r in results.items()}
    completed = [s["max_tokens"] for s in streams.values() if s["ending"] == "length"]
    return {"engine_tokens_per_s": round(pace, 1), "exit_code": code, "exit_after_sigterm_s": round(exit_s, 2),
            "streams": streams, "longest_completed": max(completed, default=0),
            "tokens_by_the_budget_on_the_longest": streams[f"{LONG} tokens"]["tokens"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=20, help="PEAGLE_DRAIN_SECONDS (the image's default: 20)")
    parser.add_argument("--publish", action="store_true", help="write bench/figures/ rather than bench/results/")
    args = parser.parse_args(argv)
    from models.random_pair import build

    pair = build()
    with tempfile.TemporaryDirectory() as logs:
        rounds = [one_round(pair, args.budget, Path(logs), i) for i in range(args.rounds)]
    exits = [r["exit_after_sigterm_s"] for r in rounds]
    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "load_average_at_end": os.getloadavg(), "budget_s": args.budget, "rounds": rounds,
              "exit_after_sigterm_s": {"median": statistics.median(exits), "max": max(exits)},
              "goal": f"every stream that fits the budget completes; the rest end with an error event; exit before "
                      f"SageMaker's {SAGEMAKER_KILL_AFTER_S} s",
              "met": all(r["exit_code"] == 0 and r["exit_after_sigterm_s"] < SAGEMAKER_KILL_AFTER_S
                         and all(s["ending"] in ("length", "error 503") for s in r["streams"].values())
                         for r in rounds)}
    write_report("drain", report, publish=args.publish)
    return 0


if __name__ == "__main__":
    sys.exit(main())
