"""A second P-EAGLE engine with another K: one drafter pass per step again; SIGTERM with a stream open, one the
budget holds and one it does not, each on a server of its own (the drain, inside SageMaker's own bound:
SIGKILL 30 s after SIGTERM); an engine whose core dies under it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
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
MAX_MODEL_LEN = 32768


def _k7_server(untrained, log_dir: Path, name: str) -> RuntimeServer:
    # Long enough for a stream that outlives the drain budget at any speed this machine runs the random
    # model (its RoPE config says 2048, which vLLM would otherwise hold it to; 2 KiB of KV cache a token).
    return RuntimeServer(target=untrained.target, drafter=untrained.drafter,
                         serving=local_serving(num_speculative_tokens=K, max_model_len=MAX_MODEL_LEN),
                         extra_env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "PEAGLE_DRAIN_SECONDS": str(DRAIN_S)},
                         log_dir=log_dir, name=name, count_drafter_calls=True)


@pytest.fixture(scope="module")
def server_k7(untrained, tmp_path_factory):
    srv = _k7_server(untrained, tmp_path_factory.mktemp("k7"), "peagle-k7")
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


# Reads one stream in a process of its own and writes every SSE data field to a file, one per line. As a thread
# of the test's process, a reader taking ~400 events a second starved the others (most likely the GIL's convoy
# effect on back-to-back socket reads): the main thread's 0.5 s sleep before SIGTERM once took 7 s, and a
# second stream's request went out only after the first had ended.
_READER = """
import json, sys, httpx
url, body, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
with open(out, "w") as f, httpx.Client(timeout=120) as client, client.stream("POST", url, json=body) as r:
    f.write(f"status {r.status_code}\\n"); f.flush()
    for line in r.iter_lines():
        if line.startswith("data: "):
            f.write(line[6:] + "\\n"); f.flush()
"""


def _start_stream(base: str, tokens: int, out: Path) -> subprocess.Popen:
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    return subprocess.Popen([sys.executable, "-c", _READER, base + "/invocations", json.dumps(body), str(out)],
                            stderr=subprocess.PIPE, text=True)


def _steady_pace(base: str) -> float:
    """Tokens/s of one stream now (the machine's load moves it), from the difference of two lengths so that a
    request's fixed cost does not hide it: a 200-token request alone read it slow enough that an 8000-token
    stream once finished before the drain began."""
    def seconds_for(tokens: int) -> float:
        t0 = time.monotonic()
        httpx.post(base + "/invocations", json={"prompt": "Once upon a time", "max_tokens": tokens,
                                                "ignore_eos": True}, timeout=120).raise_for_status()
        return time.monotonic() - t0

    return 800 / max(seconds_for(1000) - seconds_for(200), 1e-3)


DRAIN_BEGAN = "peagle-serve: drain: began"
STREAM_OPEN_WITHIN_S = 30.0  # the stream's first event, at most (an idle engine's first token: ~25 ms)


def _sigterm_with_one_stream(untrained, log_dir: Path, tokens: int, *, before_sigterm=None) -> dict:
    """Start a server (SIGTERM ends it: one per drain), send it one stream, SIGTERM it 0.5 s after its first event
    and wait for the process: what came back. The drain's own stderr line must come while the stream is still open,
    or the test would judge a drain of nothing."""
    server = _k7_server(untrained, log_dir, "peagle-k7-drain").start().wait_ready()
    try:
        out = log_dir / "stream.txt"
        reader = _start_stream(server.base, tokens, out)
        # The stream is open once an event has come back: the reader is a process of its own, and its start (an
        # interpreter, httpx) once took longer than a fixed 0.5 s, so SIGTERM met no stream, or one not yet answered.
        deadline = time.monotonic() + STREAM_OPEN_WITHIN_S
        while reader.poll() is None and time.monotonic() < deadline and (
                not out.exists() or len(out.read_text().splitlines()) < 2):
            time.sleep(0.01)
        sent = time.monotonic()
        after = before_sigterm(server) if before_sigterm is not None else None
        time.sleep(max(0.0, 0.5 - (time.monotonic() - sent)))
        server.proc.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()
        began_while_open = False
        while reader.poll() is None and not began_while_open:
            began_while_open = DRAIN_BEGAN in server.tail(200)
            time.sleep(0.02)
        _, reader_errors = reader.communicate(timeout=SAGEMAKER_KILL_AFTER_S)
        code = server.proc.wait(SAGEMAKER_KILL_AFTER_S)
        took = time.monotonic() - sigterm
        status, *events = out.read_text().splitlines()
        got = {"status": status, "events": events, "reader": (reader.returncode, reader_errors[-2000:]),
               "code": code, "took": took, "tail": server.tail(200), "lines": server.request_lines(),
               "sent_to_sigterm_s": sigterm - sent, "after": after() if after is not None else None}
    finally:
        server.stop()
    # Seen on this machine (2026-12-06): with another CPU-bound job running, even niced in its own session, every
    # process but vLLM's slept through a long stream (a 0.1 s sleep took 21 s; 0.04 s with the job stopped).
    assert began_while_open, (f"the drain began only after the stream had ended (SIGTERM went out "
                              f"{got['sent_to_sigterm_s']:.1f} s after the stream; is another CPU-bound job running?)")
    return got


def _refusals(server: RuntimeServer):
    """Before SIGTERM: a request still uploading its body; 0.5 s into the drain: a new request. Returns what
    gives back both answers once the server is gone."""
    uploading = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    uploading.sendall(b"POST /invocations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: 40\r\n\r\n{\"prompt\": ")
    arriving: list[object] = []

    def arrive() -> None:
        time.sleep(1.0)
        try:
            arriving.append(httpx.post(server.base + "/invocations", json={"prompt": "x", "max_tokens": 2},
                                       timeout=SAGEMAKER_KILL_AFTER_S))
        except httpx.HTTPError as exc:
            arriving.append(exc)

    late = threading.Thread(target=arrive)
    late.start()

    def answers() -> tuple[bytes, object]:
        late.join(SAGEMAKER_KILL_AFTER_S)
        return read_response_head(uploading), arriving[0] if arriving else None

    return answers


def test_sigterm_lets_a_stream_that_fits_the_budget_finish_and_refuses_what_comes_after(server_k7, untrained,
                                                                                        tmp_path):
    """SIGTERM with a stream open (about a quarter of the budget's worth of tokens) and a request still
    uploading its body: the upload is answered 503 + Retry-After at once, so is a request arriving during the
    drain, and the stream completes normally; the process exits 0 well inside SageMaker's 30 s."""
    pace = _steady_pace(server_k7.base)
    tokens = max(20, int(pace * DRAIN_S / 4))
    got = _sigterm_with_one_stream(untrained, tmp_path, tokens, before_sigterm=_refusals)
    refused_mid_body, arriving = got["after"]
    FIGURES["SIGTERM drain, a stream that fits"] = (
        f"budget {DRAIN_S} s at {pace:.0f} tokens/s: {tokens}-token stream completed; exit {got['code']} "
        f"after {got['took']:.1f} s")
    assert got["code"] == 0 and got["took"] < EXIT_WITHIN_S, (got["code"], got["took"], got["tail"])
    assert refused_mid_body.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in refused_mid_body.lower()
    assert isinstance(arriving, httpx.Response), arriving
    assert arriving.status_code == 503 and arriving.headers["retry-after"] == "1"
    assert got["status"] == "status 200" and got["reader"][0] == 0, got["reader"]
    events = got["events"]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("error" in c for c in chunks)
    (line,) = [rec for rec in got["lines"] if rec["request_id"] == chunks[0]["id"]]
    assert line["status"] == 200 and line["output_tokens"] == tokens


def test_sigterm_ends_a_stream_the_budget_cannot_hold_with_an_error_event(server_k7, untrained, tmp_path):
    """SIGTERM with a stream open that the budget cannot hold: it runs until the budget ends, then ends with an
    error event and [DONE], its line says aborted (503) with the tokens it had, one stderr line says so; the
    process exits 0 soon after the budget, well inside SageMaker's 30 s."""
    pace = _steady_pace(server_k7.base)
    # The longest stream the engine holds. An 8,000-token stream came back with no error event in 3 of 4 runs
    # here (2026-12-07), likely finished inside the budget: the pace is measured on another server than the one
    # drained. The drain cuts the stream anyway, so a longer one costs no time.
    tokens = MAX_MODEL_LEN - 64
    assert pace * (DRAIN_S + 4) < tokens, f"{pace:.0f} tokens/s: no stream the engine holds outlasts the drain"
    got = _sigterm_with_one_stream(untrained, tmp_path, tokens)
    events = got["events"]
    FIGURES["SIGTERM drain, a stream that does not fit"] = (
        f"budget {DRAIN_S} s at {pace:.0f} tokens/s: {tokens}-token stream ended after {len(events) - 2} events; "
        f"exit {got['code']} after {got['took']:.1f} s")
    assert got["code"] == 0 and got["took"] < EXIT_WITHIN_S, (got["code"], got["took"], got["tail"])
    assert got["status"] == "status 200" and got["reader"][0] == 0, got["reader"]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["error"]["code"] == 503 and "shutting down" in last["error"]["message"], last
    (line,) = [rec for rec in got["lines"] if rec["request_id"] == json.loads(events[0])["id"]]
    assert line["status"] == 503 and 0 < line["output_tokens"] < tokens, line
    assert f"aborted: still open when the {DRAIN_S} s budget after SIGTERM ran out" in got["tail"]
    assert DRAIN_S - 1 < got["took"], got["took"]  # it drained rather than cutting at once


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
