"""ASGI middleware: check each generation request, and print one JSON line per request whose response started.

vLLM's server loads it with ``--middleware peagle_runtime.request_metrics.RequestMetricsMiddleware``.
For POSTs to /invocations, /v1/completions and /v1/chat/completions it

1. reads the body up to :data:`~peagle_runtime.request_checks.MAX_BODY_BYTES` (413 at the first byte past
   it, the rest never read) and refuses what vLLM would wrongly accept (:mod:`peagle_runtime.request_checks`);
2. for a stream, asks vLLM for usage in every event (``stream_options``), so that the tokens produced are
   known even when the stream is cut short, and gives the client exactly what it asked for: usage it did not
   ask for is removed, the usage-only last event too;
3. timestamps arrival, the moment the first generated text leaves (time to first token) and the last byte;
4. prints :func:`peagle_contract.request_log.format_line` on stdout - the line the CloudWatch metric
   filters read - also for a stream the client drops or vLLM aborts, with a status that says so;
5. on SIGTERM ends what vLLM leaves open, and makes the process exit non-zero when vLLM's server shuts
   down because its engine died (:mod:`peagle_runtime.shutdown`).
6. says on every answer what the engine runs - K, drafter, method, vLLM release - in the header SageMaker hands
   the client as ``CustomAttributes`` (:mod:`peagle_runtime.served_statement`), for the deploy checks.

The checks are :mod:`peagle_runtime.request_checks`'s, the reading of a response and its figures
:mod:`peagle_runtime.response_measure`'s. A request refused before vLLM saw it gets no line (SageMaker's own
4XX metric counts it).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, Awaitable, Callable

from peagle_contract.request_log import format_line

from peagle_runtime.request_checks import (
    MAX_BODY_BYTES,
    ROUTE_KINDS,
    CheckedRequest,
    Rejection,
    RequestValidator,
    too_large,
)
from peagle_runtime.response_measure import ResponseMeasure
from peagle_runtime.served_statement import Statement
from peagle_runtime.shutdown import end_cut_short, ends_unless_shut_down, exit_non_zero_if_the_engine_died

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class RequestMetricsMiddleware:
    """Pure ASGI middleware (streams pass through event by event; only a whole body is held, to read its usage)."""

    def __init__(self, app, validator: RequestValidator | None = None,
                 emit: Callable[[str], None] = _emit) -> None:
        self.app = app
        self.validator = validator or RequestValidator.from_vllm()
        self.emit = emit
        self.shutting_down = asyncio.Event()  # set on SIGTERM / SIGINT (after the lifespan's startup)
        self.statement = Statement()  # what the engine runs, on every answer (SageMaker's CustomAttributes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") == "lifespan":
            await self.app(scope, receive, exit_non_zero_if_the_engine_died(scope, send, self.shutting_down))
            return
        path = scope.get("path", "")
        if scope.get("type") != "http" or scope.get("method") != "POST" or path not in ROUTE_KINDS:
            await self.app(scope, receive, send)
            return
        arrival = time.perf_counter()
        send = self.statement.stamping(scope, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        body = await _read_body(receive, headers.get("content-length"))
        if body is None:
            return  # the client left while sending its body
        checked = body if isinstance(body, Rejection) else self.validator.check(
            route=path, content_type=headers.get("content-type"), body=body)
        if isinstance(checked, Rejection):
            await _send_rejection(send, checked)
            return
        stream, drop_usage_event, strip_event_usage, body = _ask_for_usage(checked, body)
        measure = ResponseMeasure(route=path, stream=stream, drop_usage_event=drop_usage_event,
                                  strip_event_usage=strip_event_usage, arrival=arrival)
        await _Exchange(self, measure, body, receive, send).run(_with_body_length(scope, len(body)))

    def log(self, measure: ResponseMeasure, *, client_gone: bool) -> None:
        measure.logged = True
        rec = measure.record(now=time.perf_counter(), client_gone=client_gone, shut_down=self.shutting_down.is_set())
        if rec is not None:
            self.emit(format_line(rec))


class _Exchange:
    """One checked request handed to vLLM: its body replayed, its response measured on the way out, the
    client's disconnect noticed, and its line written however it ends."""

    def __init__(self, middleware: RequestMetricsMiddleware, measure: ResponseMeasure, body: bytes,
                 receive: Receive, send: Send) -> None:
        self.middleware, self.measure, self.body = middleware, measure, body
        self.receive, self.send = receive, send
        self.sent_body = False
        self.client_gone = False
        # Set by the one reader of the client's side after the body: uvicorn answers it with http.disconnect
        # when the connection closes. Servers do not all raise on a send to a closed connection, so a stream
        # would otherwise run to its end for nobody, logged as a success.
        self.gone = asyncio.Event()

    async def run(self, scope: Scope) -> None:
        listener = asyncio.ensure_future(self._listen())
        served = asyncio.ensure_future(self.middleware.app(scope, self._replay, self._watch))
        try:
            if not await ends_unless_shut_down(served, self.middleware.shutting_down):
                await end_cut_short(self.send, self.measure)
        finally:
            listener.cancel()
            # A response that never ended - the client left, vLLM aborted or failed - still gets its line.
            if not self.measure.logged:
                self.middleware.log(self.measure, client_gone=self.client_gone or self.gone.is_set())

    async def _listen(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone.set()

    async def _replay(self) -> Message:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _forward(self, message: Message) -> None:
        if self.gone.is_set() and self.measure.finished is None:
            self.client_gone = True
            raise OSError("the client closed the connection")  # as uvicorn does: vLLM then aborts the request
        try:
            await self.send(message)
        except Exception:  # the transport is gone
            self.client_gone = True
            raise

    async def _watch(self, message: Message) -> None:
        measure = self.measure
        kind = message["type"]
        rewriting = measure.stream and 200 <= measure.status < 300
        if kind == "http.response.start":
            measure.status = int(message["status"])
            if measure.stream and 200 <= measure.status < 300:
                # Events are rewritten, so the length vLLM computed would be wrong.
                message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                  if k.lower() != b"content-length"]}
            await self._forward(message)
        elif kind != "http.response.body":
            await self._forward(message)
        elif rewriting:
            await self._stream_body(message)
        else:
            await self._whole_body(message)

    async def _stream_body(self, message: Message) -> None:
        measure = self.measure
        chunk, more = message.get("body", b""), message.get("more_body", False)
        out, generated = measure.stream_chunk(chunk)
        if not more:
            out += measure.flush()
        if out is chunk:
            await self._forward(message)  # vLLM's own message: nothing in it changed
        elif out or not more:
            await self._forward({"type": "http.response.body", "body": out, "more_body": more})
        if generated and measure.first_output is None:
            await _written()
            measure.first_output = time.perf_counter()  # the first text has left the server
        if not more:
            await self._end()

    async def _whole_body(self, message: Message) -> None:
        measure = self.measure
        more = message.get("more_body", False)
        measure.body_chunk(message.get("body", b""))
        await self._forward(message)
        if not more and measure.first_output is None:
            await _written()
            measure.first_output = time.perf_counter()
        if not more:
            await self._end()

    async def _end(self) -> None:
        """The response's last byte went out: the line is written now."""
        measure = self.measure
        if measure.stream:
            await _written()
        measure.finished = time.perf_counter()
        if not measure.stream:
            measure.finish_body()
        self.middleware.log(measure, client_gone=self.client_gone)


async def _written() -> None:
    """Return once what was just sent is in the kernel. uvloop (the loop vLLM's server runs on) queues a
    write and flushes it when the loop's current iteration ends, which on a busy engine is milliseconds
    later; one turn of the loop waits for that flush, so a clock read after it is when the bytes left."""
    await asyncio.sleep(0)


async def _read_body(receive: Receive, content_length: str | None) -> bytes | Rejection | None:
    """The whole body, a 413 at the first byte past the limit (the rest is never read), or None if the client
    left. A declared Content-Length over the limit is refused before any byte is read."""
    if content_length is not None and content_length.strip().isdigit() and int(content_length) > MAX_BODY_BYTES:
        return too_large(int(content_length))
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return too_large(size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_rejection(send: Send, rejection: Rejection) -> None:
    await send({"type": "http.response.start", "status": rejection.status, "headers": rejection.headers()})
    await send({"type": "http.response.body", "body": rejection.body(), "more_body": False})


def _ask_for_usage(checked: CheckedRequest, body: bytes) -> tuple[bool, bool, bool, bytes]:
    """(stream, drop_usage_event, strip_event_usage, body to forward).

    A stream asks vLLM for usage in every event (``continuous_usage_stats``) so a stream cut short still
    says how many tokens it produced; what the client did not ask for is taken out again.
    """
    parsed = checked.body
    if parsed.get("stream") is not True:
        return False, False, False, body
    options = parsed.get("stream_options") if isinstance(parsed.get("stream_options"), dict) else {}
    wants_usage = options.get("include_usage") is True
    wants_continuous = options.get("continuous_usage_stats") is True
    if wants_usage and wants_continuous:
        return True, False, False, body
    new_options = {**options, "include_usage": True, "continuous_usage_stats": True}
    return True, not wants_usage, not wants_continuous, json.dumps({**parsed, "stream_options": new_options}).encode()


def _with_body_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(length).encode()))
    return {**scope, "headers": headers}
