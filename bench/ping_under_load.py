"""/ping while hostile maximum-size bodies are checked: what SageMaker's health check sees under a cost attack.

    make bench-ping   # or: .venv/bin/python -m bench.ping_under_load [--seconds 60] [--publish]

Starts the runtime as the tests do (our entrypoint, vLLM on this CPU, the random pair with P-EAGLE K=4, two check
workers). A pinger GETs /ping every 100 ms with SageMaker's 2 s timeout, first with nothing else running (the
baseline), then while four senders post maximum-size hostile bodies back to back (:func:`hostile_bodies`: just
under SageMaker's 6 MiB, each built to be as costly to check as we know how) and one client sends ordinary
requests. Reports per phase the /ping latency p50 / p99 / max, with a 90% bootstrap interval on p99, the pings
past 2 s, how long the hostile bodies took to be refused and what the ordinary requests took meanwhile.
Goal: /ping p99 under 2 s under the hostile load. Writes bench/results/ping_under_load.json, or
bench/figures/ping_under_load.json with --publish.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.paired_stats import quantile, quantile_interval
from bench.reports import write_report
from harness.front_door import MAX_PAYLOAD_BYTES
from harness.runtime import LocalRuntime, local_serving
from peagle_runtime import request_checks

PING_TIMEOUT_S = 2.0  # SageMaker's
PING_EVERY_S = 0.1
JSON = {"content-type": "application/json"}
ORDINARY = {"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True}


def hostile_bodies(limit: int = MAX_PAYLOAD_BYTES) -> dict[str, bytes]:
    """Bodies just under ``limit`` bytes (SageMaker's: no larger one reaches a container), each costly in its own way: millions of tiny containers behind an escape
    (what froze the loop for seconds before; now counted at C speed and refused unbuilt), a quarter of a million
    distinct keys and a quarter of a million containers nested 60 deep (both just inside the values bound, so
    parsed whole and walked before they are refused), and one string of the whole size (valid to the checks:
    vLLM parses and refuses it)."""
    room = limit - 64
    # The checks' bound on values; a runtime from before it had none (the benchmark measures either).
    values = getattr(request_checks, "MAX_JSON_VALUES", 256 * 1024)
    keys = (room - 32) // 23  # '"<18 digits>":0,' per key; 1 + keys values, inside the bound
    deep = b"[" * 60 + b"]" * 60
    nested = b'{"prompt": "x", "x": [' + b",".join([deep] * ((values - 8) // 61)) + b"]"
    return {
        "containers": b'{"prompt": "\\\\", "x": [' + b",".join([b"[]"] * (room // 3 - 8)) + b"]}",
        "keys": b'{"prompt": "x", ' + b",".join(b'"%018d":0' % i for i in range(min(keys, values - 2))) + b"}",
        "nested": nested + b', "pad": "' + b"a" * (room - len(nested) - 16) + b'"}',  # padded to the full size
        "one-string": b'{"prompt": "' + b"a" * (room - 16) + b'"}',
    }


def ping_phase(base: str, seconds: float) -> list[float | None]:
    """/ping latencies (seconds; None past SageMaker's timeout or not 200) for ``seconds``."""
    import httpx

    out: list[float | None] = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=PING_TIMEOUT_S) as client:
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                ok = client.get(base + "/ping").status_code == 200
                out.append(time.monotonic() - started if ok else None)
            except httpx.HTTPError:
                out.append(None)
            time.sleep(max(0.0, PING_EVERY_S - (time.monotonic() - started)))
    return out


def summary(pings: list[float | None]) -> dict:
    took = [p * 1000 for p in pings if p is not None]
    low, high = quantile_interval(took, 0.99)
    return {"pings": len(pings), "failed_or_past_2s": len(pings) - len(took), "p50_ms": round(statistics.median(took), 1),
            "p99_ms": round(quantile(took, 0.99), 1), "p99_interval_ms": [round(low, 1), round(high, 1)],
            "max_ms": round(max(took), 1)}


def main(argv: list[str] | None = None) -> int:
    import httpx

    parser = argparse.ArgumentParser(prog="python -m bench.ping_under_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the hostile phase")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--publish", action="store_true", help="write bench/figures/ rather than bench/results/")
    args = parser.parse_args(argv)
    from models.random_pair import build

    pair = build()
    bodies = list(hostile_bodies().items())
    report: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                    "load_average_at_start": os.getloadavg(), "senders": args.senders,
                    "body_bytes": {name: len(body) for name, body in bodies}}
    with tempfile.TemporaryDirectory() as logs, LocalRuntime(target=pair.target, drafter=pair.drafter,
                                                             serving=local_serving(num_speculative_tokens=4),
                                                             log_dir=Path(logs), name="bench-ping") as runtime:
        httpx.post(runtime.base + "/invocations", json=ORDINARY, timeout=120)  # first-request costs out of the way
        report["idle"] = summary(ping_phase(runtime.base, min(args.seconds, 20.0)))
        stop = threading.Event()
        refused: list[tuple[str, int, float]] = []
        ordinary: list[tuple[int, float]] = []

        def sender(index: int) -> None:
            with httpx.Client(timeout=120) as client:
                turn = index
                while not stop.is_set():
                    name, body = bodies[turn % len(bodies)]
                    started = time.monotonic()
                    status = client.post(runtime.base + "/invocations", content=body, headers=JSON).status_code
                    refused.append((name, status, time.monotonic() - started))
                    turn += 1

        def ordinary_client() -> None:
            with httpx.Client(timeout=120) as client:
                while not stop.is_set():
                    started = time.monotonic()
                    status = client.post(runtime.base + "/invocations", json=ORDINARY).status_code
                    ordinary.append((status, time.monotonic() - started))
                    time.sleep(0.5)

        with ThreadPoolExecutor(args.senders + 1) as pool:
            for i in range(args.senders):
                pool.submit(sender, i)
            pool.submit(ordinary_client)
            time.sleep(1.0)  # every sender has a body in flight
            pings = ping_phase(runtime.base, args.seconds)
            stop.set()
    report["hostile"] = summary(pings)
    report["hostile_bodies"] = {
        name: {"sent": len(times), "statuses": sorted({s for n, s, _ in refused if n == name}),
               "median_s": round(statistics.median(times), 2), "max_s": round(max(times), 2)}
        for name in dict(bodies) if (times := [t for n, _, t in refused if n == name])}
    report["ordinary_requests"] = {"sent": len(ordinary), "statuses": sorted({s for s, _ in ordinary}),
                                   "median_s": round(statistics.median(t for _, t in ordinary), 2),
                                   "max_s": round(max(t for _, t in ordinary), 2)}
    report["goal"] = "/ping p99 under 2 s under the hostile load"
    report["met"] = report["hostile"]["p99_ms"] < 2000 and report["hostile"]["failed_or_past_2s"] == 0
    write_report("ping_under_load", report, publish=args.publish)
    return 0


if __name__ == "__main__":
    sys.exit(main())
