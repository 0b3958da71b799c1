"""A client in a process of its own: TTFT of a few requests as it sees them, for tests/runtime/test_server.py.

    python ttft_client.py BASE ROUTE BODY_JSON COUNT   ->  stdout: [[client_ms, request_id], ...]

TTFT here: request sent -> first event carrying generated text, as harness.client reads it (a whole body:
the body), one connection per request opened inside the clock (a loopback connect is well under a
millisecond).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for harness.client

from harness.client import post  # noqa: E402


def client_ttft(base: str, route: str, body: dict) -> tuple[float, str]:
    measured = post(base, route, body, timeout_s=120)
    if isinstance(measured, tuple):  # a whole body: its id and the time it took to read
        seconds, answer = measured
        return seconds * 1000, answer["id"]
    if measured.first is None:
        raise SystemExit(f"{route}: no generated text in the stream")
    return (measured.first - measured.sent) * 1000, measured.request_id


def main() -> None:
    base, route, body, count = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    print(json.dumps([client_ttft(base, route, body) for _ in range(count)]))


if __name__ == "__main__":
    main()
