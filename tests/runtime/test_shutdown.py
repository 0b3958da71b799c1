"""A second P-EAGLE engine with another K: one drafter pass per step again, then SIGTERM with streams open
(the drain, inside SageMaker's own bound: SIGKILL 30 s after SIGTERM); a third whose engine core dies under it."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from models import spec_metrics
from runtime_server import FIGURES, RuntimeServer, read_response_head

from harness.runtime import local_serving

pytestmark = pytest.mark.engine

K = 7
DRAIN_S = 6  # the fixture's drain budget (PEAGLE_DRAIN_SECONDS); SageMaker's default here is 20 s


@pytest.fixture(scope="module")
def server_k7(untrained, tmp_path_factory):
    # Long enough for a stream that outlives the drain budget at any speed this machine runs the tiny
    # model (its RoPE config says 2048, which vLLM would otherwise hold it to).
    srv = RuntimeServer(target=untrained.target, drafter=untrained.drafter,
                        serving=local_serving(num_speculative_tokens=K, max_model_len=8192),
                        extra_env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "PEAGLE_DRAIN_SECONDS": str(DRAIN_S)},
                        log_dir=tmp_path_factory.mktemp("k7"), name="peagle-k7", count_drafter_calls=True)
    try:
        yield srv.start().wait_ready()
    finally:
        srv.stop()


def test_one_drafter_pass_per_step_at_k7(server_k7):
    before = spec_metrics.scrape(server_k7.base)
    calls0 = server_k7.drafter_calls()
    r = httpx.post(server_k7.base + "/invocations",
                   json={"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200
    counted = spec_metrics.scrape(server_k7.base) - before
    steps, tokens = counted.drafts, counted.draft_tokens
    passes = server_k7.drafter_calls() - calls0
    FIGURES["drafter passes, K=7"] = f"{passes} passes for {steps:.0f} verify steps (40 tokens)"
    assert tokens == K * steps  # each step verified a K-token draft ...
    assert steps >= 10 and steps <= passes <= steps + 2, (passes, steps)  # ... made by one drafter pass


SAGEMAKER_KILL_AFTER_S = 30  # SageMaker sends SIGKILL this long after SIGTERM
EXIT_WITHIN_S = 25
JSON = {"content-type": "application/json"}


def _stream(base: str, body: dict, events: list[str], errors: list[BaseException], first: threading.Event) -> None:
    try:
        with httpx.Client(timeout=120) as client, client.stream("POST", base + "/invocations", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first.set()
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
    finally:
        first.set()


def test_sigterm_drains_what_fits_the_budget_ends_the_rest_and_exits_before_sagemakers_kill(server_k7):
    """SIGTERM with two streams open and a third request still uploading its body: the request not yet started
    is answered 503 + Retry-After at once, and so is one arriving during the drain; the short stream (about a
    third of the budget's worth of tokens) completes normally; the 8000-token stream runs until the budget ends,
    then ends with an error event and [DONE], its line says aborted (503) with the tokens it had, one stderr line
    says so; the process exits 0 soon after the budget, well inside SageMaker's 30 s."""
    # The engine's pace now (the machine's load moves it): the short stream is sized to finish well inside.
    t0 = time.monotonic()
    r = httpx.post(server_k7.base + "/invocations", json={"prompt": "Once upon a time", "max_tokens": 200,
                                                           "ignore_eos": True}, timeout=120)
    pace = 200 / (time.monotonic() - t0)
    assert pace * DRAIN_S < 6000, f"{pace:.0f} tokens/s: the 8000-token stream would fit the budget"
    short_tokens = max(20, int(pace * DRAIN_S / 3))
    before = {rec["request_id"] for rec in server_k7.request_lines()}

    streams = {name: ([], [], threading.Event()) for name in ("short", "long")}
    readers = [threading.Thread(target=_stream, args=(server_k7.base, {
        "prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True, "stream": True}, *streams[name]))
        for name, tokens in (("long", 8000), ("short", short_tokens))]
    for reader in readers:
        reader.start()
    assert all(first.wait(120) for _, _, first in streams.values())
    uploading = socket.create_connection(("127.0.0.1", server_k7.port), timeout=30)
    uploading.sendall(b"POST /invocations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: 40\r\n\r\n{\"prompt\": ")
    time.sleep(0.3)

    server_k7.proc.send_signal(signal.SIGTERM)
    sigterm = time.monotonic()
    refused_mid_body = read_response_head(uploading)
    time.sleep(0.5)
    arriving = httpx.post(server_k7.base + "/invocations", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    for reader in readers:
        reader.join(SAGEMAKER_KILL_AFTER_S)
    code = server_k7.proc.wait(SAGEMAKER_KILL_AFTER_S)
    took = time.monotonic() - sigterm

    short_events, short_errors, _ = streams["short"]
    long_events, long_errors, _ = streams["long"]
    FIGURES["SIGTERM drain"] = (f"budget {DRAIN_S} s: {short_tokens}-token stream completed; 8000-token stream ended "
                                f"after {len(long_events) - 2} events; exit {code} after {took:.1f} s")
    assert code == 0, server_k7.tail()
    assert took < EXIT_WITHIN_S, took
    assert refused_mid_body.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in refused_mid_body.lower()
    assert arriving.status_code == 503 and arriving.headers["retry-after"] == "1"
    assert not short_errors and not long_errors, (short_errors, long_errors)
    # The short stream completed: a finish reason of its own, no error.
    assert short_events[-1] == "[DONE]"
    short_chunks = [json.loads(e) for e in short_events[:-1]]
    assert short_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("error" in c for c in short_chunks)
    # The long one ran until the budget ended, then got the drain's error event.
    assert long_events[-1] == "[DONE]"
    last = json.loads(long_events[-2])
    assert last["error"]["code"] == 503 and "shutting down" in last["error"]["message"], last
    lines = {rec["request_id"]: rec for rec in server_k7.request_lines() if rec["request_id"] not in before}
    short_line = lines[short_chunks[0]["id"]]
    long_line = lines[json.loads(long_events[0])["id"]]
    assert short_line["status"] == 200 and short_line["output_tokens"] == short_tokens
    assert long_line["status"] == 503 and short_tokens < long_line["output_tokens"] < 8000, long_line
    assert "aborted: still open when the 6 s budget after SIGTERM ran out" in server_k7.tail(200)
    assert DRAIN_S - 1 < took, took  # it drained rather than cutting at once


@pytest.fixture(scope="module")
def doomed(untrained, tmp_path_factory):
    srv = RuntimeServer(target=untrained.target, drafter=untrained.drafter, serving=local_serving(num_speculative_tokens=2),
                        log_dir=tmp_path_factory.mktemp("doomed"), name="peagle-engine-dies")
    try:
        yield srv.start().wait_ready()
    finally:
        srv.stop()


def _engine_core_pid(server_pid: int) -> int:
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        if b"EngineCore" in Path(f"/proc/{child}/cmdline").read_bytes() or \
                "EngineCore" in Path(f"/proc/{child}/comm").read_text():
            return int(child)
    raise AssertionError(f"no engine core among the children of {server_pid}")


def test_an_engine_that_dies_fails_ping_and_the_process_exits_non_zero_promptly(doomed):
    assert httpx.get(doomed.base + "/ping", timeout=10).status_code == 200
    os.kill(_engine_core_pid(doomed.proc.pid), signal.SIGKILL)
    t0 = time.monotonic()
    ping_failed_after = None
    while doomed.proc.poll() is None and time.monotonic() - t0 < EXIT_WITHIN_S:
        if ping_failed_after is None:
            try:
                if httpx.get(doomed.base + "/ping", timeout=2).status_code != 200:
                    ping_failed_after = time.monotonic() - t0
            except httpx.TransportError:
                ping_failed_after = time.monotonic() - t0
        time.sleep(0.2)
    code = doomed.proc.wait(SAGEMAKER_KILL_AFTER_S)
    took = time.monotonic() - t0
    failing = "never" if ping_failed_after is None else f"after {ping_failed_after:.1f} s"
    FIGURES["engine core killed"] = f"/ping failing {failing}, exit {code} after {took:.1f} s"
    assert ping_failed_after is not None
    assert code != 0 and took < EXIT_WITHIN_S, (code, took, doomed.tail())
