"""A client in a process of its own: TTFT of a few requests as it sees them, for tests/runtime/test_server.py.

    python ttft_client.py BASE ROUTE BODY_JSON COUNT   ->  stdout: [[client_ms, request_id], ...]

TTFT here: request sent -> first event carrying generated text (a whole body: the body). The client object
exists before the clock starts (building it costs tens of milliseconds); its connection opens inside the
clock (a loopback connect is well under a millisecond), one connection per request.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for harness.client

import httpx  # noqa: E402

from harness.client import event_text  # noqa: E402


def client_ttft(base: str, route: str, body: dict) -> tuple[float, str]:
    with httpx.Client(timeout=120) as client:
        started = time.perf_counter()
        with client.stream("POST", base + route, json=body) as r:
            if r.status_code != 200:
                raise SystemExit(f"{route}: status {r.status_code}: {r.read()[:500]!r}")
            if not body.get("stream"):
                content = r.read()
                return (time.perf_counter() - started) * 1000, json.loads(content)["id"]
            ttft, request_id = None, None
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    request_id = request_id or event.get("id")
                    if ttft is None and event_text(event):
                        ttft = (time.perf_counter() - started) * 1000
            if ttft is None:
                raise SystemExit(f"{route}: no generated text in the stream")
            return ttft, request_id


def main() -> None:
    base, route, body, count = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    print(json.dumps([client_ttft(base, route, body) for _ in range(count)]))


if __name__ == "__main__":
    main()
