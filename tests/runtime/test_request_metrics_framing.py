"""The middleware's stream handling, without an engine: SSE events split across body chunks at odd places.

The app is a real Starlette streaming endpoint that answers like vLLM does when asked for usage (token
events, then a usage-only event, then [DONE]), cut into chunks that break events in the middle.
"""

from __future__ import annotations

import asyncio
import json

import httpx
from peagle_contract.request_log import parse_line
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from peagle_runtime.request_checks import COMPLETION, CHAT
from peagle_runtime.request_metrics import RequestMetricsMiddleware

FIELDS = {COMPLETION: frozenset({"prompt", "max_tokens", "stream", "stream_options", "model"}),
          CHAT: frozenset({"messages", "max_tokens", "stream", "stream_options", "model"})}


def _events(include_usage: bool) -> bytes:
    chunks = [{"id": "cmpl-1", "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("a", "b", "c")]
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    if include_usage:
        usage = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
                 "metrics": {"speculative_decoding": {"num_draft_tokens": 8, "num_accepted_draft_tokens": 2}}}
        out += b"data: " + json.dumps(usage).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


async def generate(request: Request):
    body = await request.json()
    if not body.get("stream"):
        return JSONResponse({"id": "cmpl-2", "choices": [{"text": "abc"}],
                             "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}})
    data = _events(bool((body.get("stream_options") or {}).get("include_usage")))

    async def pieces():
        for i in range(0, len(data), 37):  # cuts through events and through "\n\n"
            yield data[i:i + 37]
            await asyncio.sleep(0)

    return StreamingResponse(pieces(), media_type="text/event-stream")


def _client(lines: list[str]) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/invocations", generate, methods=["POST"])])
    wrapped = RequestMetricsMiddleware(app, known_fields=FIELDS, emit=lines.append)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=wrapped), base_url="http://test")


def _run(coro):
    return asyncio.run(coro)


def test_stream_without_usage_request_hides_the_usage_event_and_logs_counts():
    lines: list[str] = []

    async def go():
        async with _client(lines) as client:
            r = await client.post("/invocations", json={"prompt": "x", "stream": True})
            return r.status_code, r.content

    status, content = _run(go())
    assert status == 200
    assert content == _events(include_usage=False)  # byte for byte what a no-usage stream looks like
    (rec,) = [parse_line(line) for line in lines]
    assert (rec["stream"], rec["prompt_tokens"], rec["output_tokens"]) == (True, 4, 3)
    assert (rec["drafted_tokens"], rec["accepted_tokens"]) == (8, 2)
    assert rec["request_id"] == "cmpl-1"


def test_stream_with_usage_request_is_untouched():
    lines: list[str] = []

    async def go():
        async with _client(lines) as client:
            r = await client.post("/invocations", json={"prompt": "x", "stream": True,
                                                         "stream_options": {"include_usage": True}})
            return r.content

    assert _run(go()) == _events(include_usage=True)
    assert len(lines) == 1


def test_whole_body_and_rejection():
    lines: list[str] = []

    async def go():
        async with _client(lines) as client:
            ok = await client.post("/invocations", json={"messages": [], "max_tokens": 3})
            bad = await client.post("/invocations", json={"prompt": "x", "max_tokens": True})
            return ok, bad

    ok, bad = _run(go())
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "abc"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    (rec,) = [parse_line(line) for line in lines]  # only the served request has a line
    assert rec["stream"] is False and "drafted_tokens" not in rec and rec["ttft_ms"] <= rec["e2e_ms"]
