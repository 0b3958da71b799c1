"""The capture on the real engine: vLLM's own server behind our middleware, on the random pair, every request
sampled. Each record holds the prompt and exactly the answer the client received, streamed or whole; a stream the
client drops and a request the checks refuse get none; the drafter's trainer reads the records back."""

from __future__ import annotations

import dataclasses
import json
import socket
import time

import httpx
import pytest
from peagle_contract.capture import CaptureConfig, read_records
from runtime_server import RuntimeServer

from harness.runtime import local_serving

pytestmark = pytest.mark.engine
CAPTURE = CaptureConfig(sample_rate=1.0, stage="dev", target="random-pair")


@pytest.fixture(scope="module")
def capturing(untrained, tmp_path_factory):
    serving = dataclasses.replace(local_serving(num_speculative_tokens=4), capture=CAPTURE)
    srv = RuntimeServer(target=untrained.target, drafter=untrained.drafter, serving=serving,
                        log_dir=tmp_path_factory.mktemp("capture"), name="peagle-capture", nice=10)
    try:
        yield srv.start().wait_ready()
    finally:
        srv.stop()


def _streamed_text(client: httpx.Client, url: str, body: dict) -> tuple[str, str]:
    """(the id, the text the client received) of a stream."""
    pieces, rid = [], None
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            rid = rid or event["id"]
            for choice in event["choices"]:
                pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return rid, "".join(pieces)


def test_each_completed_request_is_recorded_with_the_answer_the_client_received(capturing, tmp_path):
    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12, "ignore_eos": True}
    received: dict[str, str] = {}
    with httpx.Client(timeout=120) as client:
        rid, text = _streamed_text(client, capturing.base + "/v1/chat/completions",
                                   {**chat, "model": str(capturing.target), "stream": True})
        received[rid] = text
        whole = client.post(capturing.base + "/invocations", json=chat).json()
        received[whole["id"]] = whole["choices"][0]["message"]["content"]
        completion = client.post(capturing.base + "/invocations",
                                 json={"prompt": "Once upon a time", "max_tokens": 9}).json()
        received[completion["id"]] = completion["choices"][0]["text"]
        refused = client.post(capturing.base + "/invocations", json={**chat, "bogus": 1})
        assert refused.status_code == 400
    dropped = _drop_a_stream(capturing)

    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in capturing.capture_lines()))
    records = {r["request_id"]: r for r in read_records([capture], stage="dev", target="random-pair").records}
    assert set(received) <= set(records) and dropped not in records
    for rid, text in received.items():
        assert records[rid]["answer"] == text  # streamed or whole, the same bytes the client got
    streamed = records[rid := next(iter(received))]
    assert streamed["stream"] is True and streamed["messages"] == chat["messages"]
    assert streamed["output_tokens"] == 12 and streamed["finish_reason"] == "length"
    assert records[completion["id"]]["prompt"] == "Once upon a time"
    # The request lines are untouched: one per request that started, the dropped one included.
    ids = {line["request_id"] for line in capturing.request_lines()}
    assert set(received) | {dropped} <= ids


def _drop_a_stream(server) -> str:
    """Open a 400-token stream over a plain socket and close it after 5 events; its id."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    raw = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        while raw.count(b"\ndata: ") < 5:
            chunk = sock.recv(65536)
            assert chunk, raw[-500:]
            raw += chunk
    assert b"[DONE]" not in raw
    first = raw.split(b"data: ", 1)[1].split(b"\n", 1)[0]
    rid = json.loads(first)["id"]
    # The dropped stream's line is written once vLLM notices; wait for it so the capture is read after it.
    deadline = time.monotonic() + 60
    while rid not in {line["request_id"] for line in server.request_lines()}:
        assert time.monotonic() < deadline, "the dropped stream never got its line"
        time.sleep(0.2)
    return rid


def test_through_sagemaker_an_inference_components_whole_and_streamed_answers_are_recorded(capturing, tmp_path):
    """The real boto3 client, naming the component, through the loopback front door: both operations."""
    from harness.front_door import FrontDoor
    from ops.sagemaker_client import invoke, invoke_stream, runtime_client

    chat = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 10, "ignore_eos": True}
    with FrontDoor(backend=capturing.base, endpoints={"peagle-dev": "peagle-dev-model"}) as door:
        client = runtime_client(endpoint_url=door.url)
        whole = invoke(client, "peagle-dev", chat, component="peagle-dev-model")
        streamed = invoke_stream(client, "peagle-dev", chat, component="peagle-dev-model")
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in capturing.capture_lines()))
    records = read_records([capture], stage="dev", target="random-pair").records
    answers = {(r["stream"], r["answer"]) for r in records if r["route"] == "/invocations"
               and r.get("messages") == chat["messages"]}
    assert (False, whole.body["choices"][0]["message"]["content"]) in answers
    assert (True, streamed.text) in answers
