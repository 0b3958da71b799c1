"""How the server stops: SIGTERM drains within a budget that fits SageMaker's 30 s, and a dead engine exits non-zero.

SageMaker sends SIGTERM and, 30 s later, SIGKILL - on scale-in, on every rolling batch, when a component copy
goes, after a blue/green shift. On SIGTERM (:class:`Drain`):

1. nothing new starts: a request whose body completes after SIGTERM, or that arrives then, gets a 503 with
   ``Retry-After`` (no token was generated, so another instance can simply take it); ``/ping`` answers 503 too;
   a body still being read when the budget ends gets the same 503 and is read no further;
2. what is in flight runs on for :data:`DEFAULT_DRAIN_S` (``PEAGLE_DRAIN_SECONDS``, at most
   :data:`MAX_DRAIN_S`): vLLM runs in its drain mode (the entrypoint gives it a shutdown timeout
   :data:`ENGINE_MARGIN_S` longer than the budget), so its engine keeps stepping the requests it holds;
3. at the end of the budget, what is still open is ended here: a stream with an error event and ``[DONE]``, a
   response not yet started with a 503; vLLM's handler is cancelled, which aborts the request in the engine, so
   the engine has nothing left and stops, and the process exits - in the budget plus about a second. Each such
   request's line says aborted (status 503), and one stderr line per request says so too.

vLLM's server shuts down with status 0 when its engine dies; a supervisor must see a failure, so the process
then exits with :data:`EXIT_ENGINE_DIED`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import sys
import time
from typing import Any, Awaitable, Callable, Mapping

from peagle_runtime.refusals import RETRY_AFTER_S, Rejection
from peagle_runtime.response_measure import ResponseMeasure

EXIT_ENGINE_DIED = 70  # EX_SOFTWARE
DRAIN_VAR = "PEAGLE_DRAIN_SECONDS"
DEFAULT_DRAIN_S = 20
MAX_DRAIN_S = 22  # + ENGINE_MARGIN_S (vLLM kills its engine then) + about 1 s to exit: inside SageMaker's 30 s
ENGINE_MARGIN_S = 4  # vLLM's own drain timeout is the budget plus this: it never kills the engine first
# vLLM's error shape, as the last event of a stream the drain cut short.
_DRAIN_EVENT_MESSAGE = "the server is shutting down; this response was cut short (retry it: another instance serves)"
Scope = dict[str, Any]
Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]


def drain_budget_from_environment(env: Mapping[str, str]) -> int:
    """The drain budget in seconds; ValueError naming the variable when it is not an integer in range."""
    raw = env.get(DRAIN_VAR, str(DEFAULT_DRAIN_S)).strip()
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_DRAIN_S:
        raise ValueError(f"{DRAIN_VAR}: got {raw[:20]!r}; allowed: an integer in 1..{MAX_DRAIN_S} (seconds; "
                         "SageMaker kills a container 30 s after SIGTERM)")
    return int(raw)


def shutting_down_refusal() -> Rejection:
    return Rejection(503, "the server is shutting down and takes no new requests; retry: another instance serves",
                     type="ServiceUnavailableError", retry_after=RETRY_AFTER_S)


class Drain:
    """The shutdown's state: whether SIGTERM came, and when the in-flight requests' budget ends (loop time)."""

    def __init__(self, budget_s: float = DEFAULT_DRAIN_S) -> None:
        self.budget_s = budget_s
        self.event = asyncio.Event()
        self.deadline: float | None = None

    def begin(self) -> None:
        if self.deadline is None:
            self.deadline = asyncio.get_running_loop().time() + self.budget_s
            self.event.set()
            # When the loop took the signal in, which can be later than it came when the loop is held up.
            print(f"peagle-serve: drain: began; open requests have {self.budget_s:g} s", file=sys.stderr,
                  flush=True)

    def is_set(self) -> bool:
        return self.event.is_set()

    def left(self) -> float:
        """Seconds of budget left (0 when spent); the whole budget while no shutdown has begun."""
        if self.deadline is None:
            return self.budget_s
        return max(0.0, self.deadline - asyncio.get_running_loop().time())


async def ends_unless_shut_down(served: asyncio.Future, drain: Drain) -> bool:
    """Wait for vLLM's handling of a request; True when it ended by itself (its exception re-raised), False
    when a shutdown came and it was still running when the drain budget ran out (then it is cancelled)."""
    stop = asyncio.ensure_future(drain.event.wait())
    try:
        await asyncio.wait({served, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not served.done():
            await asyncio.wait({served}, timeout=drain.left())
    except BaseException:  # this request's own task was cancelled: take vLLM's handling with it
        served.cancel()
        raise
    finally:
        stop.cancel()
    if served.done():
        served.result()
        return True
    served.cancel()
    with contextlib.suppress(BaseException):
        await served
    return False


async def end_cut_short(send: Send, measure: ResponseMeasure, budget_s: float) -> None:
    """End a response the drain cut short, as vLLM would have: a stream with an error event and [DONE], a
    response not yet started with a 503. Its request line says aborted; so does one line on stderr."""
    measure.aborted = True
    if measure.status == 0:
        refusal = shutting_down_refusal()
        messages = [{"type": "http.response.start", "status": 503, "headers": refusal.headers()},
                    {"type": "http.response.body", "body": refusal.body(), "more_body": False}]
    elif measure.finished is None:
        event = Rejection(503, _DRAIN_EVENT_MESSAGE, type="ServiceUnavailableError").body()
        tail = b"data: " + event + b"\n\ndata: [DONE]\n\n" if measure.stream and 200 <= measure.status < 300 else b""
        messages = [{"type": "http.response.body", "body": tail, "more_body": False}]
    else:
        return
    with contextlib.suppress(Exception):  # the client may be gone too
        for message in messages:
            await send(message)
    measure.finished = time.perf_counter()
    print(f"peagle-serve: drain: request {str(measure.request_id or '(not started)')[:80]} on {measure.route} "
          f"aborted: still open when the {budget_s:g} s budget after SIGTERM ran out", file=sys.stderr, flush=True)


_SHUTDOWN_ASKED: list[int] = []  # the signals that asked this process to stop


def _note_shutdown_signals(drain: Drain) -> None:
    """Remember SIGTERM / SIGINT beside vLLM's own handling of them (its event loop reads signals through the
    wakeup fd, so a Python-level handler that chains to the previous one leaves that untouched), and begin the
    drain in the event loop (the handler runs between two bytecodes of the loop's thread)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: object, previous: object = previous) -> None:
            _SHUTDOWN_ASKED.append(signum)
            loop.call_soon_threadsafe(drain.begin)
            if callable(previous):
                previous(signum, frame)

        signal.signal(sig, handler)


def exit_non_zero_if_the_engine_died(scope: Scope, send: Send, drain: Drain) -> Send:
    """Lifespan: vLLM's server shuts down with status 0 when its engine dies. SageMaker (and any supervisor)
    must see a failure, so a shutdown nobody asked for (no SIGTERM/SIGINT) on a dead engine ends the process
    with :data:`EXIT_ENGINE_DIED`. (On an asked-for shutdown vLLM stops the engine too; that is not a failure.)"""

    started: dict = {}

    async def watch(message: Message) -> None:
        await send(message)
        if message["type"] == "lifespan.startup.complete":
            _note_shutdown_signals(drain)
            # Held now: vLLM clears app.state.engine_client before its shutdown completes.
            started["engine"] = getattr(getattr(scope.get("app"), "state", None), "engine_client", None)
        if message["type"] != "lifespan.shutdown.complete" or _SHUTDOWN_ASKED:
            return
        engine = started.get("engine")
        if engine is not None and getattr(engine, "errored", False):
            print(f"peagle-serve: the engine died; exiting with status {EXIT_ENGINE_DIED}", file=sys.stderr,
                  flush=True)
            atexit.register(os._exit, EXIT_ENGINE_DIED)  # registered last, so it runs first at exit

    return watch
