"""What one response says, read as it passes: the events of a stream (rewritten to what the client asked
for), a whole body, and the figures of the request's log line.

:class:`ResponseMeasure` is fed chunk by chunk by :mod:`peagle_runtime.request_metrics`; how each figure is
measured is the schema's to say (:mod:`peagle_contract.request_log`).
"""

from __future__ import annotations

import json
import uuid

from peagle_contract.request_log import STATUS_ABORTED, STATUS_CLIENT_GONE, STATUS_STREAM_ERROR

_USAGE_KEY = b',"usage":{'  # as vLLM's serializer writes it: no spaces
MAX_ID_CHARS = 128


def _generated(choice: dict) -> bool:
    """Whether a choice of an event carries generated output (text, content, reasoning or a tool call)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    or delta.get("tool_calls"))
    return bool(choice.get("text"))


class ResponseMeasure:
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
        # Choice 0's text, gathered only for a request the capture sampled (peagle_runtime.capture): then every
        # event is read whole. ``answer_unrecordable``: a part a record cannot hold (another choice, reasoning, a
        # tool call).
        self.answer: list[str] | None = None
        self.finish_reason: str | None = None
        self.answer_unrecordable = False

    def gather_answer(self) -> None:
        self.answer = []

    def captured_answer(self) -> str | None:
        """The answer's whole text, for the capture; None when it was not gathered or cannot be recorded."""
        return None if self.answer is None or self.answer_unrecordable else "".join(self.answer)

    def _gather(self, choices: list, *, whole: bool) -> None:
        if whole and len(choices) != 1:
            self.answer_unrecordable = True
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.answer_unrecordable = True
                continue
            part = choice.get("message" if whole else "delta")
            if isinstance(part, dict):
                if part.get("reasoning_content") or part.get("reasoning") or part.get("tool_calls"):
                    self.answer_unrecordable = True
                text = part.get("content")
            else:
                text = choice.get("text")
            if isinstance(text, str):
                self.answer.append(text)  # type: ignore[union-attr] - gathered only once gather_answer ran
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]

    # -- streams -----------------------------------------------------------------------------------
    def stream_chunk(self, chunk: bytes) -> tuple[bytes, bool]:
        """(what to forward: whole SSE events as the client asked for them, whether they carry generated text).
        What is forwarded is ``chunk`` itself (the same object) when nothing in it had to change."""
        if self.text_seen and not self._pending and self.answer is None:
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
        if self.answer is not None and isinstance(choices, list):
            self._gather(choices, whole=False)
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
            if self.answer is not None:
                choices = obj.get("choices")
                self._gather(choices if isinstance(choices, list) else [], whole=True)

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
            # vLLM's id (the client's request_id is bounded before vLLM sees it); cut all the same, since a line past
            # CloudWatch's event size is split and its metric filters would drop the request.
            "request_id": str(self.request_id or uuid.uuid4().hex)[:MAX_ID_CHARS],
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
        """On the engine's clock (vLLM's per-request decode time) wherever vLLM reports it: a whole body's text leaves
        only at its end, and a stream's pace on the server's clock is the reader's to set - a client that reads
        slowly holds each send, so a TPOT timed here would be the client's, and one client could move the
        rollback alarm that reads it. A stream without vLLM's figures (cut short) falls back to the server's clock."""
        if output_tokens <= 1:
            return None
        metrics = self.metrics or {}
        decode = metrics.get("generation_time_ms")
        if isinstance(decode, (int, float)) and not isinstance(decode, bool) and decode >= 0:
            return float(decode) / (output_tokens - 1)
        itl = metrics.get("mean_itl_ms")
        if isinstance(itl, (int, float)) and not isinstance(itl, bool) and itl >= 0:
            return float(itl)
        return max(e2e - ttft, 0.0) / (output_tokens - 1) if self.stream else None
