"""A streaming /invocations client, as SageMaker's InvokeEndpointWithResponseStream reaches the container.

One piece of code for `make invoke`, the demo and the benchmarks. Time to first token is measured at the
client: request sent -> first event carrying generated text (a chat stream's role-only first event is not
a token). Token counts come from the usage block, which the client asks for.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable


class InvocationError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"/invocations answered {status}: {body[:300]}")
        self.status = status


@dataclass(frozen=True)
class StreamResult:
    ttft_s: float
    e2e_s: float
    output_tokens: int  # from the usage block
    text: str
    events: int  # events that carried text

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after the first one (the stream's own decode rate)."""
        if self.output_tokens <= 1 or self.e2e_s <= self.ttft_s:
            return 0.0
        return (self.output_tokens - 1) / (self.e2e_s - self.ttft_s)


def event_text(event: dict) -> str:
    """The generated text an SSE event carries: completions in ``text``, chat in ``delta.content``."""
    pieces = []
    for choice in event.get("choices") or []:
        pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(pieces)


class StreamMeter:
    """Reads a stream's SSE bytes as they arrive - from httpx here, from boto3's PayloadPart events in
    harness.sagemaker_client - and measures it. One parser for every client of the stream."""

    def __init__(self, sent: float, on_text: Callable[[str], None] | None = None) -> None:
        self.sent, self.on_text = sent, on_text
        self.first: float | None = None
        self.pieces: list[str] = []
        self.tokens = 0
        self.done = False
        self._pending = b""

    def feed(self, chunk: bytes) -> bool:
        """Take the next bytes (any split); True once the stream's [DONE] has arrived."""
        self._pending += chunk
        while b"\n\n" in self._pending and not self.done:
            event, self._pending = self._pending.split(b"\n\n", 1)
            for line in event.decode().splitlines():
                if line.startswith("data:"):
                    self._data(line[5:].strip())
        return self.done

    def _data(self, data: str) -> None:
        if data == "[DONE]":
            self.done = True
            return
        event = json.loads(data)
        piece = event_text(event)
        if piece:
            self.first = self.first or time.perf_counter()
            self.pieces.append(piece)
            if self.on_text is not None:
                self.on_text(piece)
        if event.get("usage"):
            self.tokens = int(event["usage"].get("completion_tokens") or 0)

    def result(self) -> StreamResult:
        end = time.perf_counter()
        return StreamResult(ttft_s=(self.first or end) - self.sent, e2e_s=end - self.sent, output_tokens=self.tokens,
                            text="".join(self.pieces), events=len(self.pieces))


def streaming_body(body: dict) -> dict:
    """``body`` as a stream request that reports its token count."""
    body = {**body, "stream": True}
    body.setdefault("stream_options", {"include_usage": True})
    return body


def stream_invocation(base: str, body: dict, *, timeout_s: float = 300.0,
                      on_text: Callable[[str], None] | None = None) -> StreamResult:
    """POST ``body`` to ``<base>/invocations`` with ``stream: true``; ``on_text`` sees each piece as it arrives."""
    import httpx

    body = streaming_body(body)
    meter = StreamMeter(time.perf_counter(), on_text)
    with httpx.Client(timeout=timeout_s) as client, \
            client.stream("POST", base.rstrip("/") + "/invocations", json=body) as response:
        if response.status_code != 200:
            raise InvocationError(response.status_code, response.read().decode(errors="replace"))
        for chunk in response.iter_bytes():
            if meter.feed(chunk):
                break
    return meter.result()
