"""ASGI middleware: check each generation request, and print one JSON line per request whose response started.

vLLM's server loads it with ``--middleware peagle_runtime.request_metrics.RequestMetricsMiddleware``.
For POSTs to /invocations, /v1/completions and /v1/chat/completions it

1. on the event loop, only what costs nothing: the content type, the headers (:mod:`peagle_runtime.header_checks`:
   431 past their bound, operator levers refused by name), and the body read up to
   :data:`~peagle_runtime.request_checks.MAX_BODY_BYTES`, SageMaker's own limit (413 at the first byte past it,
   the rest never read);
2. has the body checked (:mod:`peagle_runtime.request_checks`: what vLLM would wrongly accept or cannot afford
   is refused) by the check workers (:mod:`peagle_runtime.check_pool`) - only a small body that names no
   grammar is checked on the loop, at C speed - so ``/ping`` and every stream keep their pace whatever is being
   checked; ``/ping`` answers healthy only once a worker is ready;
3. for a stream, asks vLLM for usage in every event (``stream_options``), so that the tokens produced are
   known even when the stream is cut short, and gives the client exactly what it asked for: usage it did not
   ask for is removed, the usage-only last event too;
4. timestamps arrival, the moment the first generated text leaves (time to first token) and the last byte;
5. prints :func:`peagle_contract.request_log.format_line` on stdout - the line the CloudWatch metric
   filters read - also for a stream the client drops or vLLM aborts, with a status that says so;
6. keeps vLLM's own refusals short (a message that quotes a whole value is cut) and turns the engine's failure
   on a request's grammar into a 400 naming the field: no client input answers 5xx;
7. on SIGTERM drains (:mod:`peagle_runtime.shutdown`), and makes the process exit non-zero when vLLM's server
   shuts down because its engine died;
8. says on every answer what the engine runs - K, drafter, method, vLLM release - in the header SageMaker hands
   the client as ``CustomAttributes`` (:mod:`peagle_runtime.served_statement`), for the deploy checks;
9. when the serving config turns capture on, writes a record of the prompt and answer of a sample of the requests
   that completed (:mod:`peagle_runtime.capture`), after the request's line; a capture fault never fails a request.

The reading of a response and its figures are :mod:`peagle_runtime.response_measure`'s. A request refused
before vLLM saw it gets no line (SageMaker's own 4XX metric counts it).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, Awaitable, Callable

from peagle_contract.request_log import format_line
from peagle_contract.serving import parse_request_capabilities

from peagle_runtime.capture import Capturer, Sampled
from peagle_runtime.check_pool import CheckPool, InlineChecks, workers_from_environment
from peagle_runtime.header_checks import check_headers
from peagle_runtime.refusals import Rejection, cut_error_body
from peagle_runtime.request_checks import MAX_BODY_BYTES, ROUTE_KINDS, RequestValidator, content_type_ok, too_large
from peagle_runtime.response_measure import ResponseMeasure
from peagle_runtime.served_statement import Statement
from peagle_runtime.shutdown import (
    Drain,
    drain_budget_from_environment,
    end_cut_short,
    ends_unless_shut_down,
    exit_non_zero_if_the_engine_died,
    shutting_down_refusal,
)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
BODY_READ_TIMEOUT_S = 60.0  # SageMaker's own limit for an InvokeEndpoint answer: a body slower than that is dead
PING = "/ping"
# vLLM's answer when its engine ended a request with an error; on a request with a grammar, the grammar's doing.
_ENGINE_FAILED = b'"Internal server error"'


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class RequestMetricsMiddleware:
    """Pure ASGI middleware (streams pass through event by event; only a whole body is held, to read its usage).

    ``validator`` runs the checks in this process (in a thread): for tests; by default they run in worker
    processes."""

    def __init__(self, app, validator: RequestValidator | None = None,
                 emit: Callable[[str], None] = _emit) -> None:
        self.app = app
        self.emit = emit
        self.capabilities = parse_request_capabilities(os.environ)
        self.checks = InlineChecks(validator) if validator is not None else CheckPool(
            workers_from_environment(os.environ), inline=RequestValidator.from_vllm(capabilities=self.capabilities))
        self.drain = Drain(drain_budget_from_environment(os.environ))  # begun on SIGTERM / SIGINT
        self.statement = Statement()  # what the engine runs, on every answer (SageMaker's CustomAttributes)
        self.capture = Capturer.from_environment(os.environ, emit=emit)  # None: no request is recorded

    @property
    def shutting_down(self) -> asyncio.Event:
        return self.drain.event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") == "lifespan":
            await self.app(scope, receive, exit_non_zero_if_the_engine_died(scope, send, self.drain))
            return
        path = scope.get("path", "")
        if scope.get("type") == "http" and path == PING and (self.drain.is_set() or not self.checks.ready()):
            # Not healthy while requests could not be checked, nor once draining (no new traffic wanted).
            await _send_rejection(send, shutting_down_refusal() if self.drain.is_set() else Rejection(
                503, "the request checks are starting", type="ServiceUnavailableError"))
            return
        if scope.get("type") != "http" or scope.get("method") != "POST" or path not in ROUTE_KINDS:
            await self.app(scope, receive, send)
            return
        arrival = time.perf_counter()
        send = self.statement.stamping(scope, send)
        refusal = self._refusal_before_body(scope)
        body = refusal or await self._read_body(receive, scope)
        if body is None:
            return  # the client left while sending its body
        checked = body if isinstance(body, Rejection) else await self.checks.check(route=path, body=body)
        if self.drain.is_set() and not isinstance(checked, Rejection):
            checked = shutting_down_refusal()  # nothing started yet: another instance takes it
        if isinstance(checked, Rejection):
            await _send_rejection(send, checked)
            return
        sampled = self.capture.take(body) if self.capture is not None else None  # the body the client sent
        body = checked.body if checked.body is not None else body
        measure = ResponseMeasure(route=path, stream=checked.stream, drop_usage_event=checked.drop_usage_event,
                                  strip_event_usage=checked.strip_event_usage, arrival=arrival)
        if sampled is not None:
            measure.gather_answer()
        exchange = _Exchange(self, measure, body, receive, send, grammar_field=checked.grammar_field,
                             sampled=sampled)
        await exchange.run(_with_body_length(scope, len(body)))

    def _refusal_before_body(self, scope: Scope) -> Rejection | None:
        if self.drain.is_set():
            return shutting_down_refusal()
        headers = scope.get("headers", [])
        content_type = next((v.decode("latin-1") for k, v in headers if k.lower() == b"content-type"), None)
        if not content_type_ok(content_type):
            return Rejection(415, f"Content-Type {content_type[:40] if content_type else None!r} is not supported; "
                                  "allowed: application/json", "Content-Type", "UnsupportedMediaType")
        refusal = check_headers(headers, self.capabilities)
        if refusal is not None:
            return refusal
        length = next((v for k, v in headers if k.lower() == b"content-length"), b"").strip()
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return too_large(int(length))  # refused on the declared length, before any byte is read
        return None

    async def _read_body(self, receive: Receive, scope: Scope) -> bytes | Rejection | None:
        """The whole body, a 413 at the first byte past the limit (the rest is never read), None if the client
        left. Reading is bounded in time too: :data:`BODY_READ_TIMEOUT_S`, and a drain that begins meanwhile
        answers 503 at once (the request had not started: another instance takes it)."""
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        give_up = loop.time() + BODY_READ_TIMEOUT_S
        while True:
            incoming = asyncio.ensure_future(receive())
            stop = asyncio.ensure_future(self.drain.event.wait())
            await asyncio.wait({incoming, stop}, timeout=max(give_up - loop.time(), 0.0),
                               return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not incoming.done():
                incoming.cancel()
                if self.drain.is_set():
                    return shutting_down_refusal()
                return Rejection(408, f"request body not received within {BODY_READ_TIMEOUT_S:g} s; allowed: a "
                                      "body sent at once", type="RequestTimeout")
            message = incoming.result()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return too_large(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def log(self, measure: ResponseMeasure, *, client_gone: bool, sampled: Sampled | None = None) -> None:
        measure.logged = True
        rec = measure.record(now=time.perf_counter(), client_gone=client_gone, shut_down=self.drain.is_set())
        if rec is None:
            return
        self.emit(format_line(rec))
        if sampled is not None and self.capture is not None:
            self.capture.write(sampled, request_id=str(rec["request_id"]), route=measure.route, stream=measure.stream,
                               status=int(rec["status"]), answer=measure.captured_answer(),
                               finish_reason=measure.finish_reason, prompt_tokens=int(rec["prompt_tokens"]),
                               output_tokens=int(rec["output_tokens"]))


class _Exchange:
    """One checked request handed to vLLM: its body replayed, its response measured on the way out, the
    client's disconnect noticed, and its line written however it ends."""

    def __init__(self, middleware: RequestMetricsMiddleware, measure: ResponseMeasure, body: bytes,
                 receive: Receive, send: Send, *, grammar_field: str | None = None,
                 sampled: Sampled | None = None) -> None:
        self.middleware, self.measure, self.body = middleware, measure, body
        self.sampled = sampled
        self.receive, self.send = receive, send
        self.grammar_field = grammar_field
        self.sent_body = False
        self.client_gone = False
        self.held_start: Message | None = None  # a refusal's start, sent once its (bounded) body is known
        self.error_body = bytearray()
        # Set by the one reader of the client's side after the body: uvicorn answers it with http.disconnect
        # when the connection closes. Servers do not all raise on a send to a closed connection, so a stream
        # would otherwise run to its end for nobody, logged as a success.
        self.gone = asyncio.Event()

    async def run(self, scope: Scope) -> None:
        listener = asyncio.ensure_future(self._listen())
        served = asyncio.ensure_future(self.middleware.app(scope, self._replay, self._watch))
        try:
            if not await ends_unless_shut_down(served, self.middleware.drain):
                await end_cut_short(self.send, self.measure, self.middleware.drain.budget_s)
        finally:
            listener.cancel()
            # A response that never ended - the client left, vLLM aborted or failed - still gets its line.
            if not self.measure.logged:
                self.middleware.log(self.measure, client_gone=self.client_gone or self.gone.is_set(),
                                    sampled=self.sampled)

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
            if measure.status >= 400:
                self.held_start = message  # vLLM refused or failed: its body decides what is sent
                return
            if measure.stream and 200 <= measure.status < 300:
                # Events are rewritten, so the length vLLM computed would be wrong.
                message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                  if k.lower() != b"content-length"]}
            await self._forward(message)
        elif kind != "http.response.body":
            await self._forward(message)
        elif self.held_start is not None:
            await self._error_body(message)
        elif rewriting:
            await self._stream_body(message)
        else:
            await self._whole_body(message)

    async def _error_body(self, message: Message) -> None:
        """vLLM's refusal or failure, sent whole once it ended: cut when it quotes too much, and a 400 naming the
        field when the engine failed on the request's grammar (a client's input, not a server fault)."""
        self.error_body += message.get("body", b"")
        if message.get("more_body", False):
            return
        status, body = self.measure.status, bytes(self.error_body)
        if status == 500 and self.grammar_field and _ENGINE_FAILED in body:
            status = self.measure.status = 400
            body = Rejection(400, f"{self.grammar_field}: the engine could not follow this grammar (vLLM ended the "
                                  "request with an error); allowed: a grammar some text satisfies",
                             self.grammar_field).body()
        else:
            body = cut_error_body(body, status)
        headers = [(k, v) for k, v in self.held_start.get("headers", []) if k.lower() != b"content-length"]
        await self._forward({**self.held_start, "status": status,
                             "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await self._forward({"type": "http.response.body", "body": body, "more_body": False})
        await self._end()

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
        self.middleware.log(measure, client_gone=self.client_gone, sampled=self.sampled)


async def _written() -> None:
    """Return once what was just sent is in the kernel. uvloop (the loop vLLM's server runs on) queues a
    write and flushes it when the loop's current iteration ends, which on a busy engine is milliseconds
    later; one turn of the loop waits for that flush, so a clock read after it is when the bytes left."""
    await asyncio.sleep(0)


async def _send_rejection(send: Send, rejection: Rejection) -> None:
    await send({"type": "http.response.start", "status": rejection.status, "headers": rejection.headers()})
    await send({"type": "http.response.body", "body": rejection.body(), "more_body": False})


def _with_body_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(length).encode()))
    return {**scope, "headers": headers}
