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


def stream_invocation(base: str, body: dict, *, timeout_s: float = 300.0,
                      on_text: Callable[[str], None] | None = None) -> StreamResult:
    """POST ``body`` to ``<base>/invocations`` with ``stream: true``; ``on_text`` sees each piece as it arrives."""
    import httpx

    body = {**body, "stream": True}
    body.setdefault("stream_options", {"include_usage": True})
    sent = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    tokens = 0
    with httpx.Client(timeout=timeout_s) as client, \
            client.stream("POST", base.rstrip("/") + "/invocations", json=body) as response:
        if response.status_code != 200:
            raise InvocationError(response.status_code, response.read().decode(errors="replace"))
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            piece = event_text(event)
            if piece:
                first = first or time.perf_counter()
                pieces.append(piece)
                if on_text is not None:
                    on_text(piece)
            if event.get("usage"):
                tokens = int(event["usage"].get("completion_tokens") or 0)
    done = time.perf_counter()
    return StreamResult(ttft_s=(first or done) - sent, e2e_s=done - sent, output_tokens=tokens,
                        text="".join(pieces), events=len(pieces))
