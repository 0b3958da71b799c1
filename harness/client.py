"""A streaming /invocations client, as SageMaker's InvokeEndpointWithResponseStream reaches the container.

One piece of code for `make invoke`, the demo, the benchmarks and the TTFT test. Time to first token is
measured at the client: request sent -> first event carrying generated text (a chat stream's role-only
first event is not a token). Token counts come from the usage block, which the client asks for.

The HTTP stack is urllib3, boto3's own. httpx's synchronous client, used here before, now and then handed
over a stream's events only at its end on this machine (a 12-token stream's first text 50-110 ms late),
while raw sockets and urllib3 saw every event within about a millisecond of the server writing it.
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
    ops.sagemaker_client - and measures it. One parser for every client of the stream."""

    def __init__(self, sent: float, on_text: Callable[[str], None] | None = None) -> None:
        self.sent, self.on_text = sent, on_text
        self.first: float | None = None
        self.request_id: str | None = None  # the response id the events carry (the one its request line names)
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
        self.request_id = self.request_id or event.get("id")
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


def post(base: str, route: str, body: dict, *, timeout_s: float = 300.0,
         on_text: Callable[[str], None] | None = None) -> StreamMeter | tuple[float, dict]:
    """POST ``body`` (JSON) to ``<base><route>`` on a connection of its own, the clock started just before
    it opens. A stream (``body["stream"]``) is read through a :class:`StreamMeter`, which is returned;
    a whole body returns (seconds until it was read, its JSON). ConnectionError when nothing listens."""
    import urllib3

    url = urllib3.util.parse_url(base)
    pool = urllib3.HTTPConnectionPool(url.host, url.port or 80, maxsize=1, retries=False,
                                      timeout=urllib3.Timeout(connect=10.0, read=timeout_s))
    meter = StreamMeter(time.perf_counter(), on_text)
    try:
        response = pool.urlopen("POST", (url.path or "").rstrip("/") + route, body=json.dumps(body).encode(),
                                headers={"content-type": "application/json"}, preload_content=False)
    except urllib3.exceptions.NewConnectionError as exc:
        raise ConnectionError(f"nothing listens on {base}") from exc
    try:
        if response.status != 200:
            raise InvocationError(response.status, response.read().decode(errors="replace"))
        if not body.get("stream"):
            content = response.read()
            return time.perf_counter() - meter.sent, json.loads(content)
        for chunk in response.read_chunked() if response.chunked else response.stream():
            meter.feed(chunk)
        return meter
    finally:
        response.release_conn()
        pool.close()


def stream_invocation(base: str, body: dict, *, timeout_s: float = 300.0,
                      on_text: Callable[[str], None] | None = None) -> StreamResult:
    """POST ``body`` to ``<base>/invocations`` with ``stream: true``; ``on_text`` sees each piece as it arrives."""
    meter = post(base, "/invocations", streaming_body(body), timeout_s=timeout_s, on_text=on_text)
    return meter.result()
