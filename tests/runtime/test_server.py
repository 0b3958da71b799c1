"""The runtime end to end: our entrypoint -> vLLM's OpenAI server with P-EAGLE, real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import select
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from models import spec_metrics
from runtime_server import FIGURES, read_response_head

pytestmark = pytest.mark.engine

CHAT = {"messages": [{"role": "user", "content": "Name three colours."}]}
COMPLETION = {"prompt": "Once upon a time"}


def _sse_events(lines: list[str]) -> list[str]:
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def _stream(client: httpx.Client, url: str, body: dict) -> tuple[int, list[str]]:
    with client.stream("POST", url, json=body) as r:
        return r.status_code, _sse_events(list(r.iter_lines()))


def test_ping_healthy_only_once_ready(server):
    # While the engine loaded, /ping was polled and never answered 200 ...
    assert server.pings_before_ready, "the server answered /ping at once: it cannot have loaded an engine yet"
    assert "200" not in server.pings_before_ready
    # ... and the first 200 means the engine serves.
    r = httpx.post(server.base + "/invocations", json={**COMPLETION, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_invocations_whole_body(server, kind):
    body = {**(COMPLETION if kind == "completion" else CHAT), "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.base + "/invocations", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] == 12
    choice = out["choices"][0]
    text = choice["text"] if kind == "completion" else choice["message"]["content"]
    assert isinstance(text, str) and text


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_invocations_stream_client_sees_what_it_asked_for(server, kind):
    body = {**(COMPLETION if kind == "completion" else CHAT), "max_tokens": 10, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=120) as client:
        status, events = _stream(client, server.base + "/invocations", body)
        assert status == 200
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        # The middleware asked vLLM for usage; the client did not, so it must not see it.
        assert all("usage" not in c or c["usage"] is None for c in chunks)
        assert all(c["choices"] for c in chunks)
        pieces = [c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "" for c in chunks]
        assert "".join(pieces)

        status, events = _stream(client, server.base + "/invocations",
                                 {**body, "stream_options": {"include_usage": True}})
        assert status == 200
        usage = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage")]
        assert usage and usage[-1]["completion_tokens"] == 10


def test_request_lines_one_per_finished_request(server):
    with httpx.Client(timeout=120) as client:
        r = client.post(server.base + "/invocations", json={**COMPLETION, "max_tokens": 9, "ignore_eos": True})
        assert r.status_code == 200
        status, events = _stream(client, server.base + "/v1/chat/completions",
                                 {**CHAT, "model": str(server.target), "max_tokens": 7, "ignore_eos": True,
                                  "stream": True})
        assert status == 200
    # Found by the ids the client saw, not by position: an earlier test's last line may land after this began.
    records = _lines_for(server, [r.json()["id"], _stream_id(events)])
    whole, streamed = records
    assert (whole["route"], whole["stream"], whole["output_tokens"]) == ("/invocations", False, 9)
    assert (streamed["route"], streamed["stream"], streamed["output_tokens"]) == ("/v1/chat/completions", True, 7)
    for rec in records:
        assert rec["status"] == 200 and rec["prompt_tokens"] > 0
        assert 0 < rec["ttft_ms"] <= rec["e2e_ms"]
    # TPOT on the engine's clock (its decode time), for a stream too: a slow reader cannot stretch it, and it is at
    # most the pace the stream left the server at.
    assert 0 < streamed["tpot_ms"] <= (streamed["e2e_ms"] - streamed["ttft_ms"]) / 6 + 5.0
    assert 0 < whole["tpot_ms"] < whole["e2e_ms"] / 8
    assert whole["ttft_ms"] == pytest.approx(whole["e2e_ms"], abs=5.0)  # a body's first text leaves with its last
    for rec in records:
        # One draft of K=4 tokens per verify step; at least one step per output token beyond the first.
        assert rec["drafted_tokens"] >= 4 and rec["drafted_tokens"] % 4 == 0
        assert 0 <= rec["accepted_tokens"] <= rec["drafted_tokens"]


def test_metrics_show_drafts(server):
    counters = spec_metrics.scrape(server.base)
    assert counters.drafts > 0 and counters.draft_tokens == 4 * counters.drafts
    assert len(counters.accepted_per_position) == 4
    assert sum(counters.accepted_per_position) == counters.accepted


def test_the_promql_alarms_read_metric_families_vllm_really_exposes(server):
    """The names in the constructs' PromQL alarms, against a real vLLM server's /metrics (what SageMaker scrapes)."""
    from peagle_constructs.native_metrics import VllmMetricNames

    families = {line.split("{", 1)[0].split(" ", 1)[0] for line in
                httpx.get(server.base + "/metrics", timeout=30).text.splitlines() if line and not line.startswith("#")}
    names = VllmMetricNames()
    for histogram in (names.time_to_first_token, names.inter_token_latency):
        assert f"{histogram}_bucket" in families, histogram
    for counter in (names.accepted_tokens, names.draft_tokens):
        assert f"{counter}_total" in families, counter


def test_one_drafter_pass_per_step(server):
    """P-EAGLE drafts all K=4 tokens in one forward: drafter passes track verify steps, not steps x K."""
    def drafts() -> float:
        return spec_metrics.scrape(server.base).drafts

    calls0, drafts0 = server.drafter_calls(), drafts()
    r = httpx.post(server.base + "/v1/completions",
                   json={**COMPLETION, "model": str(server.target), "max_tokens": 40, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200
    steps = drafts() - drafts0
    passes = server.drafter_calls() - calls0
    FIGURES["drafter passes, K=4"] = f"{passes} passes for {steps:.0f} verify steps (40 tokens)"
    assert steps >= 10
    # The proposal after the prefill (and possibly after the last step) is a pass without a verify step.
    assert steps <= passes <= steps + 2, (passes, steps)


LONG_TOKENS = "hello world " * 300  # about 3600 characters: under vLLM's character bound, over 512 tokens


JSON = {"content-type": "application/json"}

BAD_REQUESTS = [
    ("malformed-json", {"content": b'{"prompt": "x", "max_tokens": ', "headers": JSON}, 400),
    ("wrong-content-type", {"content": b'{"prompt": "x"}', "headers": {"content-type": "text/plain"}}, 415),
    ("unknown-field", {"json": {"prompt": "x", "max_token": 5}}, 400),
    ("negative-max-tokens", {"json": {"prompt": "x", "max_tokens": -1}}, 400),
    ("zero-max-tokens", {"json": {"prompt": "x", "max_tokens": 0}}, 400),
    ("huge-max-tokens", {"json": {"prompt": "x", "max_tokens": 10**9}}, 400),
    ("prompt-longer-than-model", {"json": {"prompt": "hello world " * 2000, "max_tokens": 5}}, 400),
    ("prompt-over-model-tokens", {"json": {"prompt": LONG_TOKENS, "max_tokens": 5}}, 400),
    ("empty-body", {"content": b"", "headers": JSON}, 400),
    ("json-array", {"json": [{"prompt": "x"}]}, 400),
    ("neither-prompt-nor-messages", {"json": {"max_tokens": 5}}, 400),
    ("chat-unknown-field", {"json": {**CHAT, "temprature": 0.5}}, 400),
    ("stream-unknown-field", {"json": {"prompt": "x", "stream": True, "strem_options": {}}}, 400),
    # Wrong JSON types that vLLM's lax models would coerce and answer 200.
    ("stream-as-string", {"json": {"prompt": "x", "stream": "yes"}}, 400),
    ("stream-as-number", {"json": {"prompt": "x", "stream": 1}}, 400),
    ("temperature-as-string", {"json": {"prompt": "x", "temperature": "0.5"}}, 400),
    ("max-tokens-as-bool", {"json": {"prompt": "x", "max_tokens": True}}, 400),
    ("n-as-string", {"json": {**CHAT, "n": "1"}}, 400),
    ("content-as-number", {"json": {"messages": [{"role": "user", "content": 5}]}}, 400),
    ("unknown-chat-role", {"json": {"messages": [{"role": "wizard", "content": "hi"}]}}, 400),
    ("missing-chat-role", {"json": {"messages": [{"content": "hi"}]}}, 400),
    ("stream-options-without-stream", {"json": {"prompt": "x", "stream_options": {"include_usage": True}}}, 400),
    # Bytes no JSON parser should be asked to read.
    ("deeply-nested", {"content": b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}", "headers": JSON}, 400),
    ("nan-literal", {"content": b'{"prompt": "x", "temperature": NaN}', "headers": JSON}, 400),
    ("infinity-literal", {"content": b'{"prompt": "x", "top_p": Infinity}', "headers": JSON}, 400),
    ("invalid-utf8", {"content": b'{"prompt": "\xff\xfe"}', "headers": JSON}, 400),
]


@pytest.mark.parametrize("name,kwargs,status", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_gets_4xx_json_and_server_keeps_serving(server, name, kwargs, status, bad_request_table):
    before = {rec["request_id"] for rec in server.request_lines()}
    with httpx.Client(timeout=120) as client:
        r = client.post(server.base + "/invocations", **kwargs)
        body = r.json()
        bad_request_table.append((name, r.status_code, body.get("error", {}).get("message", "")[:110]))
        assert r.status_code == status, r.text
        assert 400 <= r.status_code < 500
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        assert body["error"]["code"] == status  # vLLM's error shape
        good = client.post(server.base + "/invocations", json={**COMPLETION, "max_tokens": 3})
        assert good.status_code == 200, good.text
    _line_for(server, lambda rec: rec["request_id"] == good.json()["id"])
    # Refused before the engine: no request line. The new lines are the good request's (and perhaps an earlier
    # test's, written late), all 200s.
    assert all(rec["status"] == 200 for rec in server.request_lines() if rec["request_id"] not in before)


def test_sixteen_concurrent_clients_no_failures(server):
    def client_run(i: int) -> list[tuple[int, str]]:
        results = []
        with httpx.Client(timeout=300) as client:
            for j in range(3):
                body = {**(CHAT if (i + j) % 2 else COMPLETION), "max_tokens": 8 + i % 5, "ignore_eos": True}
                if j % 2:
                    status, events = _stream(client, server.base + "/invocations", {**body, "stream": True})
                    results.append((status if events and events[-1] == "[DONE]" else -1, _stream_id(events)))
                else:
                    r = client.post(server.base + "/invocations", json=body)
                    whole = r.json()
                    ok = r.status_code == 200 and whole["usage"]["completion_tokens"] == body["max_tokens"]
                    results.append((200 if ok else -1, whole.get("id", "")))
        return results

    with ThreadPoolExecutor(16) as pool:
        results = [c for run in pool.map(client_run, range(16)) for c in run]
    assert [code for code, _ in results] == [200] * 48
    records = _lines_for(server, [request_id for _, request_id in results])  # one line each, none lost
    assert all(rec["status"] == 200 for rec in records)


def _raw_request(server, head: bytes, body_chunks, *, timeout: float = 30.0) -> tuple[int, bytes, int]:
    """Send a request over a plain socket, chunk by chunk, stopping as soon as the server answers; return
    (status, response, body bytes sent). A real client that keeps uploading cannot show an early refusal."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5.0)
    sent = 0
    try:
        sock.sendall(head)
        time.sleep(0.2)  # room for a refusal that needs no body
        for chunk in body_chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the server has answered
            try:
                sock.sendall(chunk)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break  # the server stopped reading
            sent += len(chunk)
        sock.settimeout(timeout)
    except BaseException:
        sock.close()
        raise
    response = read_response_head(sock)
    return int(response.split(b" ", 2)[1]), response, sent


def test_an_oversized_body_is_refused_at_the_first_byte_past_the_limit(server, bad_request_table):
    """413 while the client is still sending: the server reads no further and buffers nothing more."""
    from peagle_runtime.request_checks import MAX_BODY_BYTES

    declared = MAX_BODY_BYTES * 4  # the client means to send 24 MiB (SageMaker's limit is 6 MiB)
    head = (f"POST /invocations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {declared}\r\n\r\n").encode()
    undeclared = head.replace(f"content-length: {declared}".encode(), b"transfer-encoding: chunked")

    def body(chunked: bool):
        piece = b"x" * (1024 * 1024)
        for _ in range(64):
            yield (b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece

    status, response, sent = _raw_request(server, head, body(False))
    bad_request_table.append(("declared-64-mib", status, response.split(b"\r\n\r\n", 1)[-1][:110].decode()))
    assert status == 413 and sent <= MAX_BODY_BYTES  # refused on the declared length, before the body
    status, response, sent = _raw_request(server, undeclared, body(True))
    bad_request_table.append(("chunked-past-the-limit", status, response.split(b"\r\n\r\n", 1)[-1][:110].decode()))
    assert status == 413 and sent < 32 * 1024 * 1024  # refused long before the client's 64 MiB (buffers hold some)
    assert httpx.post(server.base + "/invocations", json={**COMPLETION, "max_tokens": 2}, timeout=60).status_code == 200


def _line_for(server, wanted, *, timeout: float = 20.0) -> dict:
    """The one request line ``wanted`` selects, waiting for it: a line is printed once the response has ended,
    which a client can see before the server has written it."""
    deadline = time.monotonic() + timeout
    while True:
        found = [rec for rec in server.request_lines() if wanted(rec)]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, f"expected one request line, found {found}"
            return found[0]
        time.sleep(0.05)


def _lines_for(server, request_ids: list[str]) -> list[dict]:
    """The request line of each id, in order, waiting for each: exactly one line per request."""
    assert len(set(request_ids)) == len(request_ids), request_ids
    return [_line_for(server, lambda rec, rid=rid: rec["request_id"] == rid) for rid in request_ids]


def _stream_id(events: list[str]) -> str:
    """The response id a stream's chunks carry (the id its request line names)."""
    return json.loads(events[0])["id"]


def _client_ttfts(server, route: str, body: dict, *, count: int) -> list[tuple[float, str, float, float]]:
    """(client TTFT ms, request id, ms the server's loop waited for a CPU, ms the client did) of ``count``
    requests as a client in a process of its own measures them (ttft_client.py, through harness.client), as a
    SageMaker client is apart from the server."""
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("ttft_client.py")), server.base, route,
                           json.dumps(body), str(count), str(server.proc.pid)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [tuple(row) for row in json.loads(proc.stdout)]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole-body"])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_logged_ttft_is_what_a_real_client_measures(server, route, stream):
    """The first generated text leaving the server (a chat stream's role-only first event is not a token).

    The server runs at a lower CPU priority than this client (the fixture's ``nice``): on these 2 cores the
    engine would otherwise keep the client from reading for tens of milliseconds, which on SageMaker - client
    and server on different machines - cannot happen. Other work on the machine can still hold both CPUs:
    with two busy loops beside it, gaps of +30..+230 ms came (chat and completions alike, 2026-12-01). Before
    the fixture lowered the server's autogroup as well as its nice (runtime_server.py says why), the streams
    after the sixteen-client test had gaps of +20..+140 ms with as long a wait of the client itself for a CPU
    (141 ms of gap, 160 ms of waiting): the first text sat in the client's socket, the server's clock was
    right. The kernel counts how long the server's event loop and the client waited for a CPU during each
    request (ttft_client.py): a median gap past the bound that those waits explain is reported as a skip (the
    machine was too busy to judge), one they do not explain fails. On an idle machine the gaps are +0..+5 ms
    and the client waits about 0 ms.
    The median of 7."""
    base = {**(COMPLETION if route == "/v1/completions" else CHAT), "model": str(server.target),
            "max_tokens": 12, "ignore_eos": True, "stream": stream}
    gaps, unexplained, waits = [], [], []
    for client_ms, request_id, server_waited, client_waited in _client_ttfts(server, route, base, count=7):
        logged = _line_for(server, lambda rec, rid=request_id: rec["request_id"] == rid)
        assert logged["status"] == 200 and logged["stream"] is stream
        gaps.append(client_ms - logged["ttft_ms"])
        unexplained.append(gaps[-1] - server_waited - client_waited)
        waits.append(f"{server_waited:.0f}/{client_waited:.0f}")
    FIGURES[f"ttft client - logged {route.removeprefix('/v1/')}{' stream' if stream else ''}"] = \
        " ".join(f"{g:+.1f}" for g in gaps) + " ms; CPU waits server/client " + " ".join(waits) + " ms"
    # The client's clock starts before it sends and stops when it has read the text; the server's stops one
    # turn of its event loop after the write (request_metrics._written), which may come after the client's.
    assert statistics.median(gaps) >= -5.0, gaps
    if statistics.median(gaps) > 10.0 and statistics.median(unexplained) <= 10.0:
        pytest.skip(f"the machine was busy: the client and the server's loop waited for a CPU as long as the gaps "
                    f"(gaps {[round(g, 1) for g in gaps]} ms; waits server/client {waits} ms)")
    assert statistics.median(gaps) <= 10.0, (gaps, unexplained)


def test_a_stream_the_client_drops_gets_its_line_with_the_tokens_it_had(server):
    """Read over a plain socket and close it after 5 events: httpx's client may hand over a stream's events
    only at its end (harness.client says how that was measured), and then the stream is over before the
    client "drops" it. 400 tokens take the engine seconds, so the client leaves mid-stream even when it waits
    for a CPU a while (a 200-token stream can end, with status 200, before a client that waited for a CPU
    reads its fifth event)."""
    body = json.dumps({**COMPLETION, "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    raw = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        while raw.count(b"\ndata: ") < 5:  # each event's line starts after a chunk-size line or a blank line
            chunk = sock.recv(65536)
            assert chunk, raw[-500:]
            raw += chunk
    assert b"[DONE]" not in raw, "the whole stream had arrived before the client left: nothing was dropped"
    # Leaving the with-block closed the connection mid-stream. The events, as the client read them:
    events = [piece.split(b"\n", 1)[0].decode() for piece in raw.split(b"data: ")[1:]]
    # By its id: a line of an earlier test may still land after this one began.
    rec = _line_for(server, lambda rec, rid=_stream_id(events): rec["request_id"] == rid)
    assert rec["status"] == 499 and rec["stream"] is True
    assert 0 < rec["output_tokens"] < 400, rec
    FIGURES["stream dropped after 5 events"] = f"status {rec['status']}, {rec['output_tokens']} tokens logged"
    assert httpx.post(server.base + "/invocations", json={**COMPLETION, "max_tokens": 2}, timeout=60).status_code == 200
