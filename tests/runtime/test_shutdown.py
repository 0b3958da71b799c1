"""A second P-EAGLE engine with another K: one drafter pass per step again, then SIGTERM mid-stream."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from harness import spec_metrics
from runtime_server import FIGURES, RuntimeServer

pytestmark = pytest.mark.engine

K = 7


@pytest.fixture(scope="module")
def server_k7(tiny_pair, tmp_path_factory):
    srv = RuntimeServer(target=tiny_pair.target, drafter=tiny_pair.drafter, k=K,
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


def test_sigterm_while_streaming_ends_cleanly_and_exits_0(server_k7):
    events: list[str] = []
    errors: list[BaseException] = []
    first_event = threading.Event()

    def stream() -> None:
        try:
            body = {"prompt": "Once upon a time", "max_tokens": 120, "ignore_eos": True, "stream": True}
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
    reader.join(60)
    assert not reader.is_alive()
    code = server_k7.proc.wait(60)
    FIGURES["SIGTERM mid-stream"] = (f"exit {code} after {time.monotonic() - t0:.1f} s, "
                                     f"{len(events) - 1} events, stream ended with [DONE]" if events else f"exit {code}")
    assert code == 0, server_k7.tail()
    assert not errors, f"the stream broke: {errors!r}"
    assert events and events[-1] == "[DONE]", events[-3:]
    assert any('"token_ids"' in e or '"text"' in e for e in events[1:]), "tokens kept coming after SIGTERM"
    chunks = [json.loads(e) for e in events[:-1]]
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert finish[-1] in ("length", "abort", "stop"), finish[-3:]
    assert time.monotonic() - t0 < 60
