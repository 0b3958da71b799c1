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
5. makes the process exit non-zero when vLLM's server shuts down because its engine died;
6. on SIGTERM, ends what vLLM leaves open: vLLM 0.32 stops its engine at once in abort mode, and a stream
   whose abort never reached the server would stay open until SageMaker's SIGKILL. After
   :data:`SHUTDOWN_GRACE_S` the middleware ends such a stream itself (an error event, then ``[DONE]``),
   and the request is logged as aborted.

How each figure is measured is the schema's to say (:mod:`peagle_contract.request_log`). A request refused
before vLLM saw it gets no line (SageMaker's own 4XX metric counts it).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from typing import Any, Awaitable, Callable

from peagle_contract.request_log import (
    STATUS_ABORTED,
    STATUS_CLIENT_GONE,
    STATUS_STREAM_ERROR,
    format_line,
)

from peagle_runtime.request_checks import (
    MAX_BODY_BYTES,
    ROUTE_KINDS,
    CheckedRequest,
    Rejection,
    RequestValidator,
    too_large,
)

EXIT_ENGINE_DIED = 70  # EX_SOFTWARE
# How long vLLM may take to end its own streams after SIGTERM before the middleware ends them. Its abort
# path ends them in well under a second when the engine's abort arrives; SageMaker kills after 30 s.
SHUTDOWN_GRACE_S = 2.0
# vLLM's error shape, as the last event of a stream the shutdown cut short.
_SHUTDOWN_EVENT = (b"data: " + Rejection(503, "the server is shutting down; this response was cut short",
                                         type="ServiceUnavailableError").body() + b"\n\ndata: [DONE]\n\n")
_USAGE_KEY = b',"usage":{'  # as vLLM's serializer writes it: no spaces
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _generated(choice: dict) -> bool:
    """Whether a choice of an event carries generated output (text, content, reasoning or a tool call)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    or delta.get("tool_calls"))
    return bool(choice.get("text"))


class _Measure:
    """What one request's response tells us, fed chunk by chunk."""

    def __init__(self, *, route: str, stream: bool, drop_usage_event: bool, strip_event_usage: bool,
                 arrival: float) -> None:
        self.route = route
        self.stream = stream
        self.drop_usage_event = drop_usage_event
        self.strip_event_usage = strip_event_usage
        self.arrival = arrival
        self.status = 0
        self.first_output: float | None = None
        self.finished: float | None = None
        self.request_id: str | None = None
        self.usage: dict | None = None
        self._usage_event: bytes | None = None  # a stream's latest event with usage, as vLLM wrote it
        self._usage_at = 0  # where in it the usage object starts
        self.metrics: dict | None = None
        self.aborted = False  # vLLM ended a choice with finish_reason "abort"
        self.error_event = False
        self.done = False  # the stream's [DONE] was sent
        self.logged = False
        self.text_seen = False  # an event carried generated text: later events take the short read
        self._pending = b""  # a stream's incomplete SSE event, held until its end arrives
        self._body = bytearray()  # a whole body, parsed at its end

    # -- streams -----------------------------------------------------------------------------------
    def stream_chunk(self, chunk: bytes) -> tuple[bytes, bool]:
        """(what to forward: whole SSE events as the client asked for them, whether they carry generated text).
        What is forwarded is ``chunk`` itself (the same object) when nothing in it had to change."""
        if self.text_seen and not self._pending:
            forward = self._pass_ordinary(chunk)
            if forward is not None:
                return forward, False
        if not self._pending and chunk.endswith(b"\n\n") and chunk.find(b"\n\n") == len(chunk) - 2:
            forward, generated = self._read_event(chunk[:-2])  # vLLM sends one whole event per message
            return (b"" if forward is None else forward + b"\n\n"), generated
        data = self._pending + chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._pending = data
            return b"", False
        complete, self._pending = data[: cut + 2], data[cut + 2:]
        out = bytearray()
        generated = False
        for event in complete.split(b"\n\n")[:-1]:
            forward, has_text = self._read_event(event)
            generated = generated or has_text
            if forward is not None:
                out += forward + b"\n\n"
        return bytes(out), generated

    def _pass_ordinary(self, chunk: bytes) -> bytes | None:
        """The common message once the first text has been seen: one whole event with choices, no finish
        reason, and a flat usage object as its last field. Forwarded as vLLM wrote it (less its usage when the
        client did not ask for it) and not parsed: its usage is kept as bytes and decoded once, when the line is
        written. None: not such a message (it is then read whole). Per event that is a few byte scans and, when
        the usage is cut, one copy: most of what the middleware costs on a stream (``make bench-middleware``).

        vLLM's serializer writes no spaces, and a JSON string holds a quote or a newline only escaped, so none
        of the markers below can come from generated text."""
        cut = chunk.rfind(_USAGE_KEY)
        end = len(chunk) - 4  # "...}}\n\n": the usage object's brace, then the event's
        if (cut < 0 or chunk.find(b"}", cut) != end or not chunk.endswith(b"}}\n\n")
                or chunk[cut - 2:cut] != b"}]"  # the last field before usage is the choices' list, not empty
                or not chunk.startswith(b"data: {") or chunk.find(b"\n\n") != end + 2
                or b'"finish_reason":"' in chunk):
            return None
        self._usage_event, self._usage_at = chunk, cut + len(_USAGE_KEY) - 1
        return chunk[:cut] + b"}\n\n" if self.strip_event_usage else chunk

    def latest_usage(self) -> dict | None:
        """The usage the response reported last (a stream: in its latest event that carried one)."""
        if self._usage_event is not None:
            try:
                usage = json.loads(self._usage_event[self._usage_at:-3])
            except (json.JSONDecodeError, UnicodeDecodeError):
                usage = None
            self.usage, self._usage_event = (usage if isinstance(usage, dict) else self.usage), None
        return self.usage

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest

    def _read_event(self, event: bytes) -> tuple[bytes | None, bool]:
        """Read the event whole: record what it says; return it as forwarded (None: dropped) and its text."""
        if not event.startswith(b"data:"):
            return event, False
        payload = event[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return event, False
        try:
            obj = json.loads(payload)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return event, False
        if not isinstance(obj, dict):
            return event, False
        self.request_id = self.request_id or obj.get("id")
        if obj.get("error"):
            self.error_event = True
        choices = obj.get("choices") or []
        generated = any(_generated(c) for c in choices if isinstance(c, dict))
        self.text_seen = self.text_seen or generated
        if any(isinstance(c, dict) and c.get("finish_reason") == "abort" for c in choices):
            self.aborted = True
        if obj.get("usage"):
            self.usage, self._usage_event = obj["usage"], None
        if isinstance(obj.get("metrics"), dict):
            self.metrics = obj["metrics"]
        if not choices and obj.get("usage") and self.drop_usage_event:
            return None, False
        if choices and self.strip_event_usage and "usage" in obj:
            del obj["usage"]
            return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(), generated
        return event, generated

    # -- whole bodies --------------------------------------------------------------------------------
    def body_chunk(self, chunk: bytes) -> None:
        self._body += chunk

    def finish_body(self) -> None:
        try:
            obj = json.loads(self._body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return
        if isinstance(obj, dict):
            self.request_id = obj.get("id")
            self.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
            self.metrics = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None

    # -- the line ----------------------------------------------------------------------------------------
    def outcome(self, *, client_gone: bool, shut_down: bool = False) -> int:
        """The line's status: the HTTP status of a response that completed, else what cut it short."""
        completed = self.done if self.stream else self.finished is not None
        if client_gone and not completed:
            return STATUS_CLIENT_GONE
        if self.aborted:
            return STATUS_ABORTED
        if shut_down and (self.error_event or not completed):
            # Cut by the shutdown, whatever vLLM said: its engine, stopped at once, may end a stream with an
            # "EngineCore encountered an issue" error event rather than an abort.
            return STATUS_ABORTED
        if self.error_event or not completed:
            return STATUS_STREAM_ERROR
        return self.status

    def record(self, *, now: float, client_gone: bool = False, shut_down: bool = False) -> dict | None:
        if not (200 <= self.status < 300 or self.status == 0 and client_gone):
            return None  # vLLM refused the request itself: no tokens to measure (SageMaker counts its 4XX)
        end = self.finished or now
        e2e = (end - self.arrival) * 1000.0
        ttft = ((self.first_output or end) - self.arrival) * 1000.0
        usage = self.latest_usage() or {}
        output_tokens = int(usage.get("completion_tokens") or 0)
        rec: dict[str, object] = {
            "request_id": str(self.request_id or uuid.uuid4().hex),
            "route": self.route,
            "stream": self.stream,
            "status": self.outcome(client_gone=client_gone, shut_down=shut_down),
            "ttft_ms": ttft,
            "e2e_ms": e2e,
            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": output_tokens,
        }
        tpot = self._tpot(e2e=e2e, ttft=ttft, output_tokens=output_tokens)
        if tpot is not None:
            rec["tpot_ms"] = tpot
        spec = (self.metrics or {}).get("speculative_decoding")
        if isinstance(spec, dict):
            rec["drafted_tokens"] = int(spec.get("num_draft_tokens") or 0)
            rec["accepted_tokens"] = int(spec.get("num_accepted_draft_tokens") or 0)
        return rec

    def _tpot(self, *, e2e: float, ttft: float, output_tokens: int) -> float | None:
        if output_tokens <= 1:
            return None
        if self.stream:
            return max(e2e - ttft, 0.0) / (output_tokens - 1)  # the server's clock: both ends seen here
        # Nothing of a whole body leaves before its end: its decode time is the engine's, on the engine's clock.
        metrics = self.metrics or {}
        decode = metrics.get("generation_time_ms")
        if isinstance(decode, (int, float)) and not isinstance(decode, bool) and decode >= 0:
            return float(decode) / (output_tokens - 1)
        itl = metrics.get("mean_itl_ms")
        return float(itl) if isinstance(itl, (int, float)) and not isinstance(itl, bool) and itl >= 0 else None


class RequestMetricsMiddleware:
    """Pure ASGI middleware (streams pass through event by event; only a whole body is held, to read its usage)."""

    def __init__(self, app, validator: RequestValidator | None = None,
                 emit: Callable[[str], None] = _emit) -> None:
        self.app = app
        self.validator = validator or RequestValidator.from_vllm()
        self.emit = emit
        self.shutting_down = asyncio.Event()  # set on SIGTERM / SIGINT (after the lifespan's startup)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") == "lifespan":
            await self.app(scope, receive, _exit_non_zero_if_the_engine_died(scope, send, self.shutting_down))
            return
        path = scope.get("path", "")
        if scope.get("type") != "http" or scope.get("method") != "POST" or path not in ROUTE_KINDS:
            await self.app(scope, receive, send)
            return
        arrival = time.perf_counter()
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
        measure = _Measure(route=path, stream=stream, drop_usage_event=drop_usage_event,
                           strip_event_usage=strip_event_usage, arrival=arrival)
        scope = _with_body_length(scope, len(body))
        state = {"sent_body": False, "client_gone": False}
        # The one reader of the client's side after the body: uvicorn answers it with http.disconnect when the
        # connection closes. Servers do not all raise on a send to a closed connection, so a stream would
        # otherwise run to its end for nobody, logged as a success.
        gone = asyncio.Event()

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        listener = asyncio.ensure_future(listen())

        async def replay() -> Message:
            if not state["sent_body"]:
                state["sent_body"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def forward(message: Message) -> None:
            if gone.is_set() and measure.finished is None:
                state["client_gone"] = True
                raise OSError("the client closed the connection")  # as uvicorn does: vLLM then aborts the request
            try:
                await send(message)
            except Exception:  # the transport is gone
                state["client_gone"] = True
                raise

        async def watch(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                measure.status = int(message["status"])
                if stream and 200 <= measure.status < 300:
                    # Events are rewritten, so the length vLLM computed would be wrong.
                    message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                      if k.lower() != b"content-length"]}
                await forward(message)
                return
            if kind != "http.response.body":
                await forward(message)
                return
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if stream and 200 <= measure.status < 300:
                out, generated = measure.stream_chunk(chunk)
                if not more:
                    out += measure.flush()
                if out is chunk:
                    await forward(message)  # vLLM's own message: nothing in it changed
                elif out or not more:
                    await forward({"type": "http.response.body", "body": out, "more_body": more})
                if generated and measure.first_output is None:
                    await _written()
                    measure.first_output = time.perf_counter()  # the first text has left the server
            else:
                measure.body_chunk(chunk)
                await forward(message)
                if not more and measure.first_output is None:
                    await _written()
                    measure.first_output = time.perf_counter()
            if not more:
                if stream:
                    await _written()
                measure.finished = time.perf_counter()
                if not stream:
                    measure.finish_body()
                self._log(measure, client_gone=state["client_gone"])

        served = asyncio.ensure_future(self.app(scope, replay, watch))
        try:
            if not await _ends_unless_shut_down(served, self.shutting_down):
                await _end_cut_short(send, measure)
        finally:
            listener.cancel()
            # A response that never ended - the client left, vLLM aborted or failed - still gets its line.
            if not measure.logged:
                self._log(measure, client_gone=state["client_gone"] or gone.is_set())

    def _log(self, measure: _Measure, *, client_gone: bool) -> None:
        measure.logged = True
        rec = measure.record(now=time.perf_counter(), client_gone=client_gone, shut_down=self.shutting_down.is_set())
        if rec is not None:
            self.emit(format_line(rec))


async def _ends_unless_shut_down(served: asyncio.Future, shutting_down: asyncio.Event) -> bool:
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


async def _end_cut_short(send: Send, measure: _Measure) -> None:
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


def _exit_non_zero_if_the_engine_died(scope: Scope, send: Send, shutting_down: asyncio.Event) -> Send:
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
