"""The capture on the request path, without an engine: which requests get a record, what it holds, and that a
capture that fails never fails the request.

The app is a Starlette stand-in that answers as vLLM does (chat and completion, whole and streamed, in chunks
that cut events in the middle); requests are checked by vLLM's own request models. What the real engine's answers
look like in a record is tests/runtime/test_capture_server.py's.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from peagle_contract.capture import CAPTURE_VAR, MAX_RECORD_BYTES, CaptureConfig
from peagle_contract.capture import EVENT_NAME as CAPTURE_EVENT
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from peagle_runtime.capture import Capturer
from peagle_runtime.request_checks import RequestValidator
from peagle_runtime.request_metrics import RequestMetricsMiddleware

PIECES = ("def ", "add", "(a, b)")
CONFIG = CaptureConfig(sample_rate=1.0, stage="dev", target="stand-in")
CHAT = {"messages": [{"role": "user", "content": "add two numbers"}], "max_tokens": 8}


def _choice(chat: bool, text: str, index: int = 0, finish: str | None = None) -> dict:
    body = {"delta": {"content": text}} if chat else {"text": text}
    return {"index": index, **body, "finish_reason": finish}


async def generate(request: Request):
    body = await request.json()
    chat = "messages" in body
    n = int(body.get("n", 1))
    finish = body.get("_finish", "length")  # the stand-in's own knob: how the answer ends
    if not body.get("stream"):
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": "".join(PIECES)},
                        "finish_reason": finish} for i in range(n)]
        else:
            choices = [{"index": i, "text": "".join(PIECES), "finish_reason": finish} for i in range(n)]
        return JSONResponse({"id": "cmpl-whole", "choices": choices,
                             "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
    events = [{"id": "cmpl-stream", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}] if chat else []
    for i, text in enumerate(PIECES):
        last = i == len(PIECES) - 1
        events += [{"id": "cmpl-stream", "choices": [_choice(chat, text, c, finish if last else None)]} for c in range(n)]
    events.append({"id": "cmpl-stream", "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
    data = b"".join(b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events)
    data += b"data: [DONE]\n\n"

    async def pieces():
        for i in range(0, len(data), 29):
            yield data[i:i + 29]
            await asyncio.sleep(0)

    return StreamingResponse(pieces(), media_type="text/event-stream")


APP = Starlette(routes=[Route(path, generate, methods=["POST"])
                        for path in ("/invocations", "/v1/chat/completions", "/v1/completions")])


@pytest.fixture(scope="module")
def validator() -> RequestValidator:
    return RequestValidator.from_vllm()


def _exchange(validator, monkeypatch, path: str, body: dict | bytes, *, emit=None, rate: float = 1.0):
    """(response, request lines, capture records) for one request through the middleware."""
    monkeypatch.setenv(CAPTURE_VAR, CaptureConfig(sample_rate=rate, stage="dev", target="stand-in").render())
    lines: list[str] = []
    middleware = RequestMetricsMiddleware(APP, validator=validator, emit=emit or lines.append)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), base_url="http://test") as client:
            if isinstance(body, bytes):
                return await client.post(path, content=body, headers={"content-type": "application/json"})
            return await client.post(path, json=body)

    response = asyncio.run(go())
    parsed = [json.loads(line) for line in lines]
    return response, [p for p in parsed if p["event"] != CAPTURE_EVENT], [p for p in parsed if p["event"] == CAPTURE_EVENT]


@pytest.mark.parametrize("path, body, stream", [
    ("/v1/chat/completions", {**CHAT, "stream": True}, True),
    ("/v1/chat/completions", CHAT, False),
    ("/invocations", {"prompt": "def", "max_tokens": 8, "stream": True}, True),
    ("/v1/completions", {"prompt": "def", "max_tokens": 8}, False),
], ids=["chat-stream", "chat-whole", "completion-stream", "completion-whole"])
def test_a_sampled_request_that_completed_gets_one_record_of_its_prompt_and_whole_answer(validator, monkeypatch, path,
                                                                                         body, stream):
    response, (line,), (record,) = _exchange(validator, monkeypatch, path, body)
    assert response.status_code == 200
    assert record["answer"] == "".join(PIECES) and record["finish_reason"] == "length"
    assert (record["route"], record["stream"], record["request_id"]) == (path, stream, line["request_id"])
    assert (record["prompt_tokens"], record["output_tokens"]) == (5, 3)
    assert record.get("messages", body.get("messages")) == body.get("messages")
    assert record.get("prompt") == body.get("prompt")
    if stream:  # the client still gets exactly the stream it asked for: no usage it did not ask for
        assert b'"usage"' not in response.content


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {**CHAT, "n": 2}),
    ("/v1/chat/completions", {**CHAT, "n": 2, "stream": True}),
    ("/v1/completions", {"prompt": "def", "max_tokens": 8, "echo": True}),
    ("/v1/chat/completions", {**CHAT, "bogus": 1}),  # refused by the checks (an unknown field): 400
], ids=["two-choices", "two-choices-stream", "echo", "refused"])
def test_what_a_record_cannot_hold_gets_none_and_the_answer_is_unchanged(validator, monkeypatch, path, body):
    response, lines, records = _exchange(validator, monkeypatch, path, body)
    assert records == []
    assert response.status_code == (400 if "bogus" in body else 200)


def test_a_rate_below_one_samples_that_share(validator):
    drawn = iter([0.05, 0.5, 0.09, 0.9])
    capturer = Capturer(CaptureConfig(sample_rate=0.1, stage="dev", target="t"), emit=print, draw=lambda: next(drawn))
    body = json.dumps(CHAT).encode()
    assert [capturer.take(body) is not None for _ in range(4)] == [True, False, True, False]


def test_a_body_too_long_for_a_record_is_never_parsed(monkeypatch):
    capturer = Capturer(CONFIG, emit=print)
    calls = []
    monkeypatch.setattr("peagle_runtime.capture.json.loads", lambda raw: calls.append(len(raw)))
    assert capturer.take(b"{" + b" " * MAX_RECORD_BYTES + b"}") is None
    assert calls == []  # the event loop never paid for it


def test_a_capture_that_fails_does_not_fail_the_request(validator, monkeypatch, capsys):
    written: list[str] = []

    def emit(line: str) -> None:
        if CAPTURE_EVENT in line:
            raise OSError("stdout is gone")
        written.append(line)

    for body in ({**CHAT, "stream": True}, CHAT):
        response, _, _ = _exchange(validator, monkeypatch, "/v1/chat/completions", body, emit=emit)
        assert response.status_code == 200 and b"add" in response.content
    assert len(written) == 2  # both request lines went out
    assert "peagle-serve: capture: a record was not written (OSError); 1 so far" in capsys.readouterr().err
