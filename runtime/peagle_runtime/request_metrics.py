"""ASGI middleware: check each generation request, and print one JSON line per finished request.

vLLM's server loads it with ``--middleware peagle_runtime.request_metrics.RequestMetricsMiddleware``.
For POSTs to /invocations, /v1/completions and /v1/chat/completions it

1. reads the body and refuses what vLLM would wrongly accept (:mod:`peagle_runtime.request_checks`);
2. for a stream whose client did not ask for usage, asks vLLM for it (``stream_options.include_usage``)
   and removes that extra usage-only event from what the client receives, so the client sees exactly
   what it asked for;
3. timestamps arrival, the first event that carries output (time to first token), and the last byte;
4. prints :func:`peagle_contract.request_log.format_line` on stdout - the line the CloudWatch metric
   filters read. Token counts come from the usage block; drafted/accepted counts from vLLM's
   per-request ``metrics.speculative_decoding`` (the entrypoint turns it on).

Only 2xx responses get a line: a refused request has no tokens to measure (SageMaker's own 4XX/5XX
metrics count those).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any, Awaitable, Callable

from peagle_contract.request_log import format_line

from peagle_runtime.request_checks import (
    ROUTE_KINDS,
    CheckedRequest,
    Rejection,
    check_request,
    known_fields_from_vllm,
    rejection_headers,
)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _Measure:
    """What one request's response tells us, fed chunk by chunk."""

    def __init__(self, *, route: str, stream: bool, drop_usage_event: bool, arrival: float) -> None:
        self.route = route
        self.stream = stream
        self.drop_usage_event = drop_usage_event
        self.arrival = arrival
        self.status = 0
        self.first_output: float | None = None
        self.finished: float | None = None
        self.request_id: str | None = None
        self.usage: dict | None = None
        self.metrics: dict | None = None
        self._pending = b""  # a stream's incomplete SSE event, held until its end arrives
        self._body = bytearray()  # a non-stream response, parsed at its end

    # -- streams -----------------------------------------------------------------------------------
    def stream_chunk(self, chunk: bytes, now: float) -> bytes:
        """Return what to forward: whole SSE events, less the usage event the client did not ask for."""
        data = self._pending + chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._pending = data
            return b""
        complete, self._pending = data[: cut + 2], data[cut + 2:]
        out = bytearray()
        for event in complete.split(b"\n\n")[:-1]:
            if self._read_event(event, now):
                out += event + b"\n\n"
        return bytes(out)

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest

    def _read_event(self, event: bytes, now: float) -> bool:
        """Record what the event says; False when it must not reach the client."""
        text = event.decode("utf-8", "replace").strip()
        if not text.startswith("data:"):
            return True
        payload = text[5:].strip()
        if payload == "[DONE]":
            return True
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            return True
        if not isinstance(obj, dict):
            return True
        self.request_id = self.request_id or obj.get("id")
        choices = obj.get("choices") or []
        if choices and self.first_output is None:
            self.first_output = now
        if obj.get("usage"):
            self.usage = obj["usage"]
        if isinstance(obj.get("metrics"), dict):
            self.metrics = obj["metrics"]
        if self.drop_usage_event and not choices and obj.get("usage"):
            return False
        return True

    # -- whole bodies --------------------------------------------------------------------------------
    def body_chunk(self, chunk: bytes, now: float) -> None:
        if chunk and self.first_output is None:
            self.first_output = now
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
    def record(self) -> dict | None:
        if not 200 <= self.status < 300 or self.usage is None or self.finished is None:
            return None
        e2e = (self.finished - self.arrival) * 1000.0
        ttft = ((self.first_output or self.finished) - self.arrival) * 1000.0
        engine_ttft = (self.metrics or {}).get("time_to_first_token_ms")
        if not self.stream and isinstance(engine_ttft, (int, float)):
            # A whole-body response only shows its first token at the end; the engine saw it earlier.
            ttft = min(float(engine_ttft), e2e)
        output_tokens = int(self.usage.get("completion_tokens") or 0)
        rec: dict[str, object] = {
            "request_id": str(self.request_id or uuid.uuid4().hex),
            "route": self.route,
            "stream": self.stream,
            "status": self.status,
            "ttft_ms": ttft,
            "e2e_ms": e2e,
            "prompt_tokens": int(self.usage.get("prompt_tokens") or 0),
            "output_tokens": output_tokens,
        }
        if output_tokens > 1:
            rec["tpot_ms"] = max(e2e - ttft, 0.0) / (output_tokens - 1)
        spec = (self.metrics or {}).get("speculative_decoding")
        if isinstance(spec, dict):
            rec["drafted_tokens"] = int(spec.get("num_draft_tokens") or 0)
            rec["accepted_tokens"] = int(spec.get("num_accepted_draft_tokens") or 0)
        return rec


class RequestMetricsMiddleware:
    """Pure ASGI middleware (streams pass through chunk by chunk; nothing is buffered but SSE framing)."""

    def __init__(self, app, known_fields: dict[str, frozenset[str]] | None = None,
                 emit: Callable[[str], None] = _emit) -> None:
        self.app = app
        self.known_fields = known_fields or known_fields_from_vllm()
        self.emit = emit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope.get("type") != "http" or scope.get("method") != "POST" or path not in ROUTE_KINDS:
            await self.app(scope, receive, send)
            return
        arrival = time.perf_counter()
        body, disconnected = await _read_body(receive)
        if disconnected:
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        checked = check_request(route=path, content_type=headers.get("content-type"), body=body,
                                known_fields=self.known_fields)
        if isinstance(checked, Rejection):
            await _send_rejection(send, checked)
            return

        stream, drop_usage_event, body = _ask_for_usage(checked, body)
        measure = _Measure(route=path, stream=stream, drop_usage_event=drop_usage_event, arrival=arrival)
        scope = _with_body_length(scope, len(body))

        sent_body = False

        async def replay() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def watch(message: Message) -> None:
            kind = message["type"]
            now = time.perf_counter()
            if kind == "http.response.start":
                measure.status = int(message["status"])
                if stream and 200 <= measure.status < 300:
                    # We may drop an event, so the length vLLM computed would be wrong.
                    message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                      if k.lower() != b"content-length"]}
                await send(message)
                return
            if kind != "http.response.body":
                await send(message)
                return
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if stream and 200 <= measure.status < 300:
                out = measure.stream_chunk(chunk, now)
                if not more:
                    out += measure.flush()
                if out or not more:
                    await send({"type": "http.response.body", "body": out, "more_body": more})
            else:
                measure.body_chunk(chunk, now)
                await send(message)
            if not more:
                measure.finished = time.perf_counter()
                if not stream:
                    measure.finish_body()
                rec = measure.record()
                if rec is not None:
                    self.emit(format_line(rec))

        await self.app(scope, replay, watch)


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


async def _send_rejection(send: Send, rejection: Rejection) -> None:
    await send({"type": "http.response.start", "status": rejection.status,
                "headers": list(rejection_headers(rejection))})
    await send({"type": "http.response.body", "body": rejection.body(), "more_body": False})


def _ask_for_usage(checked: CheckedRequest, body: bytes) -> tuple[bool, bool, bytes]:
    """(stream, drop_usage_event, body to forward)."""
    parsed = checked.body
    if parsed.get("stream") is not True:
        return False, False, body
    options = parsed.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return True, False, body
    new_options = dict(options) if isinstance(options, dict) else {}
    new_options["include_usage"] = True
    return True, True, json.dumps({**parsed, "stream_options": new_options}).encode()


def _with_body_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(length).encode()))
    return {**scope, "headers": headers}
