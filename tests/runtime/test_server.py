"""The runtime end to end: our entrypoint -> vLLM's OpenAI server with P-EAGLE, real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from harness import spec_metrics
from runtime_server import FIGURES

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
    before = len(server.request_lines())
    with httpx.Client(timeout=120) as client:
        r = client.post(server.base + "/invocations", json={**COMPLETION, "max_tokens": 9, "ignore_eos": True})
        assert r.status_code == 200
        status, _ = _stream(client, server.base + "/v1/chat/completions",
                            {**CHAT, "model": str(server.target), "max_tokens": 7, "ignore_eos": True, "stream": True})
        assert status == 200
    records = server.request_lines()[before:]
    assert len(records) == 2
    whole, streamed = records
    assert (whole["route"], whole["stream"], whole["output_tokens"]) == ("/invocations", False, 9)
    assert (streamed["route"], streamed["stream"], streamed["output_tokens"]) == ("/v1/chat/completions", True, 7)
    for rec in records:
        assert rec["status"] == 200 and rec["prompt_tokens"] > 0
        assert 0 < rec["ttft_ms"] <= rec["e2e_ms"]
        assert rec["tpot_ms"] == pytest.approx((rec["e2e_ms"] - rec["ttft_ms"]) / (rec["output_tokens"] - 1), abs=0.01)
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


BAD_REQUESTS = [
    ("malformed-json", {"content": b'{"prompt": "x", "max_tokens": ', "headers": {"content-type": "application/json"}}, 400),
    ("wrong-content-type", {"content": b'{"prompt": "x"}', "headers": {"content-type": "text/plain"}}, 415),
    ("unknown-field", {"json": {"prompt": "x", "max_token": 5}}, 400),
    ("negative-max-tokens", {"json": {"prompt": "x", "max_tokens": -1}}, 400),
    ("zero-max-tokens", {"json": {"prompt": "x", "max_tokens": 0}}, 400),
    ("huge-max-tokens", {"json": {"prompt": "x", "max_tokens": 10**9}}, 400),
    ("prompt-longer-than-model", {"json": {"prompt": "hello world " * 2000, "max_tokens": 5}}, 400),
    ("prompt-over-model-tokens", {"json": {"prompt": LONG_TOKENS, "max_tokens": 5}}, 400),
    ("empty-body", {"content": b"", "headers": {"content-type": "application/json"}}, 400),
    ("json-array", {"json": [{"prompt": "x"}]}, 400),
    ("neither-prompt-nor-messages", {"json": {"max_tokens": 5}}, 400),
    ("chat-unknown-field", {"json": {**CHAT, "temprature": 0.5}}, 400),
    ("stream-unknown-field", {"json": {"prompt": "x", "stream": True, "strem_options": {}}}, 400),
]


@pytest.mark.parametrize("name,kwargs,status", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_gets_4xx_json_and_server_keeps_serving(server, name, kwargs, status, bad_request_table):
    with httpx.Client(timeout=120) as client:
        r = client.post(server.base + "/invocations", **kwargs)
        body = r.json()
        bad_request_table.append((name, r.status_code, body.get("error", {}).get("message", "")[:110]))
        assert r.status_code == status, r.text
        assert 400 <= r.status_code < 500
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        good = client.post(server.base + "/invocations", json={**COMPLETION, "max_tokens": 3})
        assert good.status_code == 200, good.text


def test_sixteen_concurrent_clients_no_failures(server):
    def client_run(i: int) -> list[int]:
        codes = []
        with httpx.Client(timeout=300) as client:
            for j in range(3):
                body = {**(CHAT if (i + j) % 2 else COMPLETION), "max_tokens": 8 + i % 5, "ignore_eos": True}
                if j % 2:
                    status, events = _stream(client, server.base + "/invocations", {**body, "stream": True})
                    codes.append(status if events and events[-1] == "[DONE]" else -1)
                else:
                    r = client.post(server.base + "/invocations", json=body)
                    codes.append(r.status_code if r.json()["usage"]["completion_tokens"] == body["max_tokens"] else -1)
        return codes

    before = len(server.request_lines())
    with ThreadPoolExecutor(16) as pool:
        codes = [c for run in pool.map(client_run, range(16)) for c in run]
    assert codes == [200] * 48
    assert len(server.request_lines()) - before == 48
