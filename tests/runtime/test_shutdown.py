"""A second P-EAGLE engine with another K: one drafter pass per step again, then SIGTERM mid-stream with
SageMaker's own bound (SIGKILL 30 s after SIGTERM); a third whose engine core dies under it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness import spec_metrics
from runtime_server import FIGURES, RuntimeServer

pytestmark = pytest.mark.engine

K = 7


@pytest.fixture(scope="module")
def server_k7(tiny_pair, tmp_path_factory):
    # Long enough for a stream that outlives the shutdown grace at any speed this machine runs the tiny
    # model (its RoPE config says 2048, which vLLM would otherwise hold it to).
    srv = RuntimeServer(target=tiny_pair.target, drafter=tiny_pair.drafter, k=K, max_model_len=8192,
                        extra_env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
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


def test_sigterm_mid_stream_ends_the_stream_cleanly_and_exits_within_sagemakers_bound(server_k7):
    """An 8000-token stream when SIGTERM comes: it is aborted (the entrypoint's abort mode; the middleware
    ends it after its grace when vLLM's abort never arrives), the client still gets a clean end ([DONE]), the
    request still gets its line (status 503, the tokens it had), and the process exits 0 well inside
    SageMaker's 30 s."""
    events: list[str] = []
    errors: list[BaseException] = []
    first_event = threading.Event()
    before = {rec["request_id"] for rec in server_k7.request_lines()}

    def stream() -> None:
        try:
            body = {"prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": True, "stream": True}
            with httpx.Client(timeout=120) as client, client.stream("POST", server_k7.base + "/invocations", json=body) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        first_event.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            first_event.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first_event.wait(120)
    server_k7.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    reader.join(SAGEMAKER_KILL_AFTER_S)
    assert not reader.is_alive()
    code = server_k7.proc.wait(SAGEMAKER_KILL_AFTER_S)
    took = time.monotonic() - t0
    FIGURES["SIGTERM mid-stream"] = f"exit {code} after {took:.1f} s, {len(events) - 1} events, last {events[-1][:20]!r}"
    assert code == 0, server_k7.tail()
    assert took < EXIT_WITHIN_S, took
    assert not errors, f"the stream broke: {errors!r}"
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    # Cut by the shutdown, not finished. vLLM 0.32 stops the engine at once in abort mode, so three endings
    # were seen: vLLM's abort event (the engine's abort reached the server), vLLM's engine-dead error event
    # (500), or the middleware's 503 error event (neither arrived within its grace).
    last = chunks[-1]
    if "error" in last:
        assert last["error"]["code"] in (500, 503), last
        FIGURES["SIGTERM mid-stream"] += (", ended by the middleware" if last["error"]["code"] == 503
                                          else ", ended by vLLM's engine-dead error event")
    else:
        assert last["choices"][0].get("finish_reason") == "abort", chunks[-3:]
        FIGURES["SIGTERM mid-stream"] += ", ended by vLLM's abort"
    (rec,) = [r for r in server_k7.request_lines() if r["request_id"] not in before]
    assert rec["status"] == 503 and 0 < rec["output_tokens"] < 8000, rec


@pytest.fixture(scope="module")
def doomed(tiny_pair, tmp_path_factory):
    srv = RuntimeServer(target=tiny_pair.target, drafter=tiny_pair.drafter, k=2,
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
