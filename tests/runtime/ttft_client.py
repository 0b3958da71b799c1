"""A client in a process of its own: TTFT of a few requests as it sees them, for tests/runtime/test_server.py.

    python ttft_client.py BASE ROUTE BODY_JSON COUNT SERVER_PID
        ->  stdout: [[client_ms, request_id, server_waited_ms, client_waited_ms], ...]

TTFT here: request sent -> first event carrying generated text, as harness.client reads it (a whole body:
the body), one connection per request opened inside the clock (a loopback connect is well under a
millisecond).

``*_waited_ms``: how long, during that request, the server's event loop (its main thread) and this client
were ready to run but waiting for a CPU, as the kernel counts it (/proc/<pid>/schedstat, second field). A
request that sits in the server's socket while the server cannot run, or a first event that sits in this
client's socket while the client cannot, is on the client's clock only; that time is this.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for harness.client

from harness.client import post  # noqa: E402


def run_queue_wait_ns(pid: int | str) -> int:
    """Nanoseconds the thread ``pid`` (a process: its main thread) has spent runnable but not running."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1])


def client_ttft(base: str, route: str, body: dict, server_pid: int) -> tuple[float, str, float, float]:
    server_before, client_before = run_queue_wait_ns(server_pid), run_queue_wait_ns("thread-self")
    measured = post(base, route, body, timeout_s=120)
    waited = ((run_queue_wait_ns(server_pid) - server_before) / 1e6, (run_queue_wait_ns("thread-self") - client_before) / 1e6)
    if isinstance(measured, tuple):  # a whole body: its id and the time it took to read
        seconds, answer = measured
        return seconds * 1000, answer["id"], *waited
    if measured.first is None:
        raise SystemExit(f"{route}: no generated text in the stream")
    return (measured.first - measured.sent) * 1000, measured.request_id, *waited


def main() -> None:
    base, route, body, count, pid = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    print(json.dumps([client_ttft(base, route, body, pid) for _ in range(count)]))


if __name__ == "__main__":
    main()
