"""The middleware's stream handling, without an engine: SSE events split across body chunks at odd places.

The app is a real Starlette streaming endpoint that answers as vLLM does for the stream options it is given
(usage in every event with ``continuous_usage_stats``, a usage-only last event with ``include_usage``), cut
into chunks that break events in the middle. Requests are checked by vLLM's own request models.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from peagle_contract.request_log import parse_line
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from peagle_runtime.request_checks import RequestValidator
from peagle_runtime.request_metrics import RequestMetricsMiddleware
from peagle_runtime.response_measure import ResponseMeasure

TOKENS = ("a", "b", "c")


@pytest.fixture(scope="module")
def validator() -> RequestValidator:
    return RequestValidator.from_vllm()


def _events(options: dict, *, upto: int = len(TOKENS), done: bool = True) -> bytes:
    """The SSE bytes vLLM sends for ``stream_options``; a chat-like role-only first event included."""
    continuous = options.get("continuous_usage_stats") is True
    events = [{"id": "cmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    for i, text in enumerate(TOKENS[:upto], 1):
        event = {"id": "cmpl-1", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        if continuous:
            event["usage"] = {"prompt_tokens": 4, "completion_tokens": i, "total_tokens": 4 + i}
        events.append(event)
    if done and options.get("include_usage") is True:
        events.append({"id": "cmpl-1", "choices": [],
                       "usage": {"prompt_tokens": 4, "completion_tokens": upto, "total_tokens": 4 + upto},
                       "metrics": {"speculative_decoding": {"num_draft_tokens": 8, "num_accepted_draft_tokens": 2}}})
    out = b"".join(b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


async def generate(request: Request):
    body = await request.json()
    if not body.get("stream"):
        return JSONResponse({"id": "cmpl-2", "choices": [{"text": "abc"}],
                             "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
                             "metrics": {"generation_time_ms": 10.0}})
    data = _events(body.get("stream_options") or {})

    async def pieces():
        for i in range(0, len(data), 37):  # cuts through events and through "\n\n"
            yield data[i:i + 37]
            await asyncio.sleep(0)

    return StreamingResponse(pieces(), media_type="text/event-stream")


APP = Starlette(routes=[Route("/invocations", generate, methods=["POST"])])


def _client(validator, lines: list[str]) -> httpx.AsyncClient:
    wrapped = RequestMetricsMiddleware(APP, validator=validator, emit=lines.append)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=wrapped), base_url="http://test")


def _post(validator, body: dict) -> tuple[httpx.Response, list[dict]]:
    lines: list[str] = []

    async def go():
        async with _client(validator, lines) as client:
            return await client.post("/invocations", json=body)

    response = asyncio.run(go())
    return response, [parse_line(line) for line in lines]


def _parsed_events(content: bytes) -> list:
    return [json.loads(e[6:]) if e[6:] != b"[DONE]" else "[DONE]" for e in content.split(b"\n\n") if e]


@pytest.mark.parametrize("options", [{}, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}],
                         ids=["no-usage", "usage", "continuous-usage"])
def test_the_client_gets_exactly_the_stream_it_asked_for_and_the_line_has_the_counts(validator, options):
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    if options:
        body["stream_options"] = options
    response, (rec,) = _post(validator, body)
    assert response.status_code == 200
    # vLLM's own bytes, less what the client did not ask for: nothing re-serialized.
    assert response.content == _events(options)
    assert (rec["status"], rec["stream"], rec["prompt_tokens"], rec["output_tokens"]) == (200, True, 4, 3)
    assert (rec["drafted_tokens"], rec["accepted_tokens"]) == (8, 2) and rec["request_id"] == "cmpl-1"
    assert 0 < rec["ttft_ms"] <= rec["e2e_ms"]


def _measure_of(*events: bytes, strip: bool = True) -> tuple[ResponseMeasure, bytes]:
    measure = ResponseMeasure(route="/invocations", stream=True, drop_usage_event=strip, strip_event_usage=strip, arrival=0.0)
    out = b"".join(measure.stream_chunk(b"data: " + event + b"\n\n")[0] for event in events)
    return measure, out


FIRST = b'{"id":"cmpl-1","choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}'


@pytest.mark.parametrize("event, forwarded, tokens, aborted", [
    # The common event: usage cut from vLLM's bytes, the tokens counted.
    (b'{"id":"cmpl-1","choices":[{"index":0,"text":"b"}],"usage":{"prompt_tokens":4,"completion_tokens":2,'
     b'"prompt_tokens_details":{"cached_tokens":0}}}',
     b'{"id":"cmpl-1","choices":[{"index":0,"text":"b"}]}', 2, False),
    # Text that spells the markers: inside a JSON string they are escaped, so the short read still applies.
    (b'{"id":"cmpl-1","choices":[{"index":0,"text":"\\",\\"usage\\":{\\"error\\""}],'
     b'"usage":{"prompt_tokens":4,"completion_tokens":3}}',
     b'{"id":"cmpl-1","choices":[{"index":0,"text":"\\",\\"usage\\":{\\"error\\""}]}', 3, False),
    # A field after usage: the event is parsed whole, and that field kept.
    (b'{"id":"cmpl-1","choices":[{"index":0,"text":"b"}],"usage":{"prompt_tokens":4,"completion_tokens":2},'
     b'"token_ids":[7]}',
     b'{"id":"cmpl-1","choices":[{"index":0,"text":"b"}],"token_ids":[7]}', 2, False),
    # A finish reason (here an abort): parsed whole, so the abort is seen.
    (b'{"id":"cmpl-1","choices":[{"index":0,"text":"","finish_reason":"abort"}],'
     b'"usage":{"prompt_tokens":4,"completion_tokens":1}}',
     b'{"id":"cmpl-1","choices":[{"index":0,"text":"","finish_reason":"abort"}]}', 1, True),
], ids=["common", "text-spells-the-markers", "field-after-usage", "abort"])
def test_an_event_after_the_first_text_is_read_once_and_forwarded_as_vllm_wrote_it(event, forwarded, tokens, aborted):
    measure, out = _measure_of(FIRST, event)
    assert out == b'data: {"id":"cmpl-1","choices":[{"index":0,"text":"a"}]}\n\n' + b"data: " + forwarded + b"\n\n"
    assert (measure.latest_usage()["completion_tokens"], measure.aborted) == (tokens, aborted)
    kept, out = _measure_of(FIRST, event, strip=False)  # the client asked for usage in every event: untouched
    assert out == b"data: " + FIRST + b"\n\n" + b"data: " + event + b"\n\n"


COMMON = (b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"b",'
          b'"logprobs":null,"finish_reason":null,"stop_reason":null}],'
          b'"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}\n\n')


@pytest.mark.parametrize("strip", [True, False], ids=["usage-not-asked", "usage-asked"])
def test_the_common_event_passes_as_vllms_bytes_and_its_usage_is_read_only_for_the_line(strip):
    measure, _ = _measure_of(FIRST, strip=strip)
    out, generated = measure.stream_chunk(COMMON)
    if strip:
        assert out == COMMON.replace(b',"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}', b"")
    else:
        assert out is COMMON  # vLLM's own bytes, not a copy: the middleware forwards vLLM's message itself
    assert generated is False and measure._usage_event is COMMON  # kept as bytes, not decoded per event
    assert measure.latest_usage() == {"prompt_tokens": 4, "total_tokens": 6, "completion_tokens": 2}


def test_the_usage_only_last_event_is_still_dropped_after_the_common_ones():
    measure, _ = _measure_of(FIRST)
    measure.stream_chunk(COMMON)
    last = b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3}}\n\n'
    assert measure.stream_chunk(last) == (b"", False)
    assert measure.latest_usage()["completion_tokens"] == 3


def test_whole_body_tpot_is_on_the_engines_clock_and_rejections_get_no_line(validator):
    response, (rec,) = _post(validator, {"prompt": "x", "max_tokens": 3})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "abc"
    assert rec["stream"] is False and rec["tpot_ms"] == pytest.approx(5.0)  # 10 ms of decoding / 2 tokens after the first
    assert rec["ttft_ms"] <= rec["e2e_ms"]
    bad, lines = _post(validator, {"prompt": "x", "max_tokens": True})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens" and lines == []


def _drive(validator, *, fail_send_after: int | None = None, disconnect_after: int | None = None):
    """Call the middleware directly: the transport dies after ``fail_send_after`` body messages, or the
    client's disconnect arrives after ``disconnect_after``."""
    lines: list[str] = []
    sent: list[dict] = []
    body = json.dumps({"prompt": "x", "stream": True}).encode()
    scope = {"type": "http", "method": "POST", "path": "/invocations", "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    delivered = {"body": False}
    gone = asyncio.Event()

    async def receive():
        if not delivered["body"]:
            delivered["body"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body":
            bodies = sum(1 for m in sent if m["type"] == "http.response.body")
            if fail_send_after is not None and bodies >= fail_send_after:
                raise OSError("connection reset by peer")
            if disconnect_after is not None and bodies + 1 >= disconnect_after:
                gone.set()
        sent.append(message)

    middleware = RequestMetricsMiddleware(APP, validator=validator, emit=lines.append)
    try:
        asyncio.run(middleware(scope, receive, send))
    except OSError:
        pass
    return [parse_line(line) for line in lines], sent


@pytest.mark.parametrize("how", ["transport-dies", "client-disconnects"])
def test_a_stream_the_client_drops_still_gets_its_line_with_the_tokens_so_far(validator, how):
    kwargs = {"fail_send_after": 2} if how == "transport-dies" else {"disconnect_after": 2}
    records, sent = _drive(validator, **kwargs)
    (rec,) = records
    assert rec["status"] == 499 and rec["stream"] is True
    assert rec["output_tokens"] < len(TOKENS)  # what vLLM had produced when the client left
    assert rec["e2e_ms"] >= rec["ttft_ms"] > 0


def _shutdown_run(validator, monkeypatch, *, vllm_ends_it: str | None):
    """A stream under way when SIGTERM comes (the middleware's event set as its signal handler does). vLLM
    ends the stream itself - its abort (a last event with finish_reason "abort") or, its engine stopped
    under it, its engine-dead error event, then [DONE] - or, when neither reaches the server, never does."""
    monkeypatch.setenv("PEAGLE_DRAIN_SECONDS", "1")
    lines: list[str] = []
    sent: list[dict] = []

    async def scenario():
        vllm_aborts = asyncio.Event()

        async def stream(request: Request):
            await request.json()

            async def pieces():
                yield _events({"include_usage": True, "continuous_usage_stats": True}, upto=2, done=False)
                await vllm_aborts.wait()  # never set when vLLM leaves the stream open
                last = ({"id": "cmpl-1", "choices": [{"index": 0, "text": "", "finish_reason": "abort"}]}
                        if vllm_ends_it == "abort" else
                        {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError",
                                   "param": None, "code": 500}})
                yield b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n"

            return StreamingResponse(pieces(), media_type="text/event-stream")

        middleware = RequestMetricsMiddleware(Starlette(routes=[Route("/invocations", stream, methods=["POST"])]),
                                              validator=validator, emit=lines.append)
        body = json.dumps({"prompt": "x", "stream": True}).encode()
        scope = {"type": "http", "method": "POST", "path": "/invocations",
                 "headers": [(b"content-type", b"application/json")]}
        delivered = asyncio.Event()

        async def receive():
            if not delivered.is_set():
                delivered.set()
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client stays

        async def send(message):
            sent.append(message)

        served = asyncio.ensure_future(middleware(scope, receive, send))
        while not any(m["type"] == "http.response.body" and m.get("body") for m in sent):
            await asyncio.sleep(0.01)
        middleware.drain.begin()
        if vllm_ends_it:
            vllm_aborts.set()
        await asyncio.wait_for(served, timeout=5)

    asyncio.run(scenario())
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert sent[-1] == {"type": "http.response.body", "body": sent[-1]["body"], "more_body": False}
    return [parse_line(line) for line in lines], _parsed_events(content)


@pytest.mark.parametrize("vllm_ends_it", ["abort", "error", None],
                         ids=["vllm-aborts-it", "vllm-engine-dead-error", "vllm-leaves-it-open"])
def test_sigterm_ends_every_open_stream_and_logs_it_aborted(validator, monkeypatch, vllm_ends_it):
    (rec,), events = _shutdown_run(validator, monkeypatch, vllm_ends_it=vllm_ends_it)
    assert events[-1] == "[DONE]"
    if vllm_ends_it == "abort":  # vLLM's own last event, nothing added
        assert events[-2]["choices"][0]["finish_reason"] == "abort"
        assert not any(isinstance(e, dict) and "error" in e for e in events)
    elif vllm_ends_it == "error":  # vLLM's engine-dead event passes as it is; the line blames the shutdown
        assert events[-2]["error"]["code"] == 500
    else:  # the middleware's: vLLM's error shape, 503
        assert events[-2]["error"]["code"] == 503 and "shutting down" in events[-2]["error"]["message"]
    assert all("usage" not in e for e in events if isinstance(e, dict))  # the client did not ask for usage
    assert rec["status"] == 503 and rec["output_tokens"] == 2 and rec["stream"] is True


# -- issue 30: what a hostile client moves, and what the drain does, without an engine ------------------------


def _slow_reader_run(validator) -> tuple[dict, float]:
    """A stream whose client takes 50 ms to read each message (its send blocks that long, as a full socket
    does); vLLM's last usage event says the engine decoded the 3 tokens in 10 ms."""
    lines: list[str] = []

    async def app_stream(request: Request):
        await request.json()
        data = _events({"include_usage": True, "continuous_usage_stats": True})
        data = data.replace(b'"metrics":{', b'"metrics":{"generation_time_ms":10.0,')

        async def pieces():
            for event in data.split(b"\n\n")[:-1]:
                yield event + b"\n\n"

        return StreamingResponse(pieces(), media_type="text/event-stream")

    middleware = RequestMetricsMiddleware(Starlette(routes=[Route("/invocations", app_stream, methods=["POST"])]),
                                          validator=validator, emit=lines.append)
    body = json.dumps({"prompt": "x", "stream": True}).encode()
    scope = {"type": "http", "method": "POST", "path": "/invocations", "headers": [(b"content-type", b"application/json")]}

    async def scenario():
        delivered = asyncio.Event()

        async def receive():
            if not delivered.is_set():
                delivered.set()
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()

        async def slow_send(message):
            if message["type"] == "http.response.body":
                await asyncio.sleep(0.05)

        await middleware(scope, receive, slow_send)

    asyncio.run(scenario())
    (rec,) = [parse_line(line) for line in lines]
    return rec, (rec["e2e_ms"] - rec["ttft_ms"]) / (rec["output_tokens"] - 1)


def test_a_slow_reader_does_not_move_the_logged_time_per_token(validator):
    """TPOT is the rollback alarm's signal: on the server's clock, a client reading slowly would set it."""
    rec, reader_pace = _slow_reader_run(validator)
    assert reader_pace > 40  # the stream went at the reader's pace ...
    assert rec["tpot_ms"] == pytest.approx(10.0 / 2)  # ... the line says what the engine took


async def _call(middleware, scope: dict, chunks: list[bytes], *, between=None) -> list[dict]:
    """Drive one request through the middleware: the body in ``chunks``, ``between`` awaited after the first."""
    sent: list[dict] = []
    queue = list(chunks)

    async def receive():
        if queue:
            chunk = queue.pop(0)
            if between is not None and len(queue) == len(chunks) - 1:
                await between()
            return {"type": "http.request", "body": chunk, "more_body": bool(queue)}
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(middleware(scope, receive, send), timeout=10)
    return sent


def _answer(sent: list[dict]) -> tuple[int, dict, dict]:
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, json.loads(body)


def _scope(path: str = "/invocations", headers: list | None = None, method: str = "POST") -> dict:
    return {"type": "http", "method": method, "path": path,
            "headers": headers if headers is not None else [(b"content-type", b"application/json")]}


def test_a_body_still_being_read_when_sigterm_comes_gets_503_with_retry_after_at_once(validator):
    """The drain takes nothing new: a request whose body is still arriving is answered 503 + Retry-After the moment
    the drain begins, not read on (and not left outside the shutdown's bound); so is one arriving later, and /ping."""
    middleware = RequestMetricsMiddleware(APP, validator=validator, emit=lambda line: None)

    async def scenario():
        async def sigterm():
            middleware.drain.begin()
            await asyncio.sleep(0)

        mid_body = await _call(middleware, _scope(), [b'{"prompt": ', b'"x"}'], between=sigterm)
        later = await _call(middleware, _scope(), [b'{"prompt": "x"}'])
        ping = await _call(middleware, _scope("/ping", method="GET"), [b""])
        return mid_body, later, ping

    for sent in asyncio.run(scenario()):
        status, headers, body = _answer(sent)
        assert status == 503 and headers["retry-after"] == "1" and body["error"]["code"] == 503


def test_ping_is_unhealthy_until_a_check_worker_is_ready(validator):
    class Starting:
        def ready(self) -> bool:
            return False

    middleware = RequestMetricsMiddleware(APP, validator=validator, emit=lambda line: None)
    middleware.checks = Starting()
    status, _, body = _answer(asyncio.run(_call(middleware, _scope("/ping", method="GET"), [b""])))
    assert status == 503 and "starting" in body["error"]["message"]


def _refusing_app(status: int, message: str, param: str | None = None) -> Starlette:
    async def refuse(request: Request):
        await request.json()
        return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}},
                            status_code=status)

    return Starlette(routes=[Route("/invocations", refuse, methods=["POST"])])


def test_vllms_own_refusal_that_quotes_a_whole_value_is_cut(validator):
    """vLLM quotes the value it refuses (50,000 bad words came back as 540 KB): its message is cut to its start."""
    quoted = "Too many bad words (parameter=bad_words, value=[" + ", ".join(f"'w{i}'" for i in range(50_000)) + "])"
    middleware = RequestMetricsMiddleware(_refusing_app(400, quoted, "bad_words"), validator=validator,
                                          emit=lambda line: None)
    sent = asyncio.run(_call(middleware, _scope(), [json.dumps({"prompt": "x"}).encode()]))
    status, headers, body = _answer(sent)
    assert status == 400 and int(headers["content-length"]) < 1024
    assert body["error"]["message"].startswith("Too many bad words") and body["error"]["param"] == "bad_words"


@pytest.mark.parametrize("grammar", [True, False], ids=["with-a-grammar", "without"])
def test_the_engine_failing_on_a_requests_grammar_is_a_400_naming_the_field(validator, grammar):
    """vLLM answers 500 "Internal server error" when the engine ends a request with an error; on a request that
    carries a grammar the grammar did it (a client's input, which must not count against the 5xx alarm). Without
    one, the 500 stands: that is a server fault."""
    middleware = RequestMetricsMiddleware(_refusing_app(500, "Internal server error"), validator=validator,
                                          emit=lambda line: None)
    body = {"prompt": "x", **({"structured_outputs": {"regex": "[a-z]+"}} if grammar else {})}
    status, _, answer = _answer(asyncio.run(_call(middleware, _scope(), [json.dumps(body).encode()])))
    if grammar:
        assert status == 400 and answer["error"]["param"] == "structured_outputs"
    else:
        assert status == 500


@pytest.mark.parametrize("headers, status, param", [
    ([(b"content-type", b"application/json"), (b"x-big", b"h" * (2 * 1024 * 1024))], 431, None),
    ([(b"content-type", b"application/json")] + [(b"x-h%d" % i, b"v") for i in range(200)], 431, None),
    ([(b"content-type", b"application/json"), (b"x-vllm-priority", b"-9")], 400, "header x-vllm-priority"),
    ([(b"content-type", b"application/json"), (b"x-request-id", b"a" * 65)], 400, "x-request-id"),
], ids=["2-mib-header", "200-headers", "priority-header", "long-request-id"])
def test_headers_are_bounded_and_levers_in_them_refused_before_the_body_is_read(validator, headers, status, param):
    middleware = RequestMetricsMiddleware(APP, validator=validator, emit=lambda line: None)
    got, _, body = _answer(asyncio.run(_call(middleware, _scope(headers=headers), [b'{"prompt": "x"}'])))
    assert (got, body["error"]["param"]) == (status, param)
