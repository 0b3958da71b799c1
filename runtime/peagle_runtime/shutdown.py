"""How the server stops: SIGTERM ends open responses within a bound, and a dead engine exits non-zero.

vLLM 0.32 stops its engine at once in abort mode on SIGTERM, and a stream whose abort never reached the
server would stay open until SageMaker's SIGKILL: after :data:`SHUTDOWN_GRACE_S` such a response is ended
here (a stream with an error event and ``[DONE]``, a response not yet started with a 503). vLLM's server
shuts down with status 0 when its engine dies; a supervisor must see a failure, so the process then exits
with :data:`EXIT_ENGINE_DIED`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import sys
import time
from typing import Any, Awaitable, Callable

from peagle_runtime.request_checks import Rejection
from peagle_runtime.response_measure import ResponseMeasure

EXIT_ENGINE_DIED = 70  # EX_SOFTWARE
# How long vLLM may take to end its own streams after SIGTERM before they are ended here. Its abort path
# ends them in well under a second when the engine's abort arrives; SageMaker kills after 30 s.
SHUTDOWN_GRACE_S = 2.0
# vLLM's error shape, as the last event of a stream the shutdown cut short.
_SHUTDOWN_EVENT = (b"data: " + Rejection(503, "the server is shutting down; this response was cut short",
                                         type="ServiceUnavailableError").body() + b"\n\ndata: [DONE]\n\n")
Scope = dict[str, Any]
Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]


async def ends_unless_shut_down(served: asyncio.Future, shutting_down: asyncio.Event) -> bool:
    """Wait for vLLM's handling of a request; True when it ended by itself (its exception re-raised), False
    when a shutdown came and it was still running :data:`SHUTDOWN_GRACE_S` later (then it is cancelled)."""
    stop = asyncio.ensure_future(shutting_down.wait())
    try:
        await asyncio.wait({served, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not served.done():
            await asyncio.wait({served}, timeout=SHUTDOWN_GRACE_S)
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


async def end_cut_short(send: Send, measure: ResponseMeasure) -> None:
    """End a response the shutdown cut short, as vLLM would have: a stream with an error event and [DONE],
    a response not yet started with a 503. The line says aborted."""
    measure.aborted = True
    if measure.status == 0:
        refusal = Rejection(503, "the server is shutting down", type="ServiceUnavailableError")
        messages = [{"type": "http.response.start", "status": 503, "headers": refusal.headers()},
                    {"type": "http.response.body", "body": refusal.body(), "more_body": False}]
    elif measure.finished is None:
        tail = _SHUTDOWN_EVENT if measure.stream and 200 <= measure.status < 300 else b""
        messages = [{"type": "http.response.body", "body": tail, "more_body": False}]
    else:
        return
    with contextlib.suppress(Exception):  # the client may be gone too
        for message in messages:
            await send(message)
    measure.finished = time.perf_counter()


_SHUTDOWN_ASKED: list[int] = []  # the signals that asked this process to stop


def _note_shutdown_signals(shutting_down: asyncio.Event) -> None:
    """Remember SIGTERM / SIGINT beside vLLM's own handling of them (its event loop reads signals through the
    wakeup fd, so a Python-level handler that chains to the previous one leaves that untouched), and set
    ``shutting_down`` in the event loop (the handler runs between two bytecodes of the loop's thread)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: object, previous: object = previous) -> None:
            _SHUTDOWN_ASKED.append(signum)
            loop.call_soon_threadsafe(shutting_down.set)
            if callable(previous):
                previous(signum, frame)

        signal.signal(sig, handler)


def exit_non_zero_if_the_engine_died(scope: Scope, send: Send, shutting_down: asyncio.Event) -> Send:
    """Lifespan: vLLM's server shuts down with status 0 when its engine dies. SageMaker (and any supervisor)
    must see a failure, so a shutdown nobody asked for (no SIGTERM/SIGINT) on a dead engine ends the process
    with :data:`EXIT_ENGINE_DIED`. (On an asked-for shutdown vLLM stops the engine too; that is not a failure.)"""

    started: dict = {}

    async def watch(message: Message) -> None:
        await send(message)
        if message["type"] == "lifespan.startup.complete":
            _note_shutdown_signals(shutting_down)
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
