"""The hostile clients the first tables never tried: cost, amplification, operator levers and client-made 5xx.

Against the real runtime (our entrypoint, vLLM's server and engine on this CPU). Each row is a finding of
issue 30: before the change it got a 500, a Python message, its own bytes back amplified, a lever vLLM honoured,
or it froze the event loop; now each is a short 4xx naming the field, and the server keeps serving. Rows are
also written to the end-of-run table of refusals."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from runtime_server import FIGURES

from harness.front_door import MAX_PAYLOAD_BYTES, FrontDoor
from bench import ping_under_load
from peagle_runtime.request_checks import MAX_BODY_BYTES

pytestmark = pytest.mark.engine

JSON = {"content-type": "application/json"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 3}
MAX_REFUSAL_BYTES = 1024  # whatever was sent, a refusal stays this short


def _schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _nested(depth: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}}
    return node


# (name, httpx keyword arguments, status, the field the refusal must name - None: the body as a whole)
HOSTILE = [
    # A client could make the server answer 500 (and every 5xx counts against the rollback alarm).
    ("schema-refers-to-itself", {"json": {**CHAT, "response_format": _schema({"$ref": "#"})}}, 400, "response_format"),
    ("schema-refers-to-itself-stream", {"json": {**CHAT, "stream": True, "response_format": _schema({"$ref": "#"})}},
     400, "response_format"),
    ("structured-outputs-self-ref", {"json": {**COMPLETION, "structured_outputs": {"json": {"$ref": "#"}}}}, 400,
     "structured_outputs"),
    ("anyof-self-ref", {"json": {**CHAT, "response_format": _schema({"anyOf": [{"$ref": "#"}]})}}, 400,
     "response_format"),
    # Text that is not text: refused by its field, no Python message.
    ("lone-surrogate", {"content": b'{"messages":[{"role":"user","content":"\\ud800"}],"max_tokens":3}',
                        "headers": JSON}, 400, "messages.0.content"),
    ("lone-surrogate-in-a-key", {"content": b'{"prompt":"x","\\udc00":1}', "headers": JSON}, 400, None),
    # Echoes that amplify: the refusal stays short whatever was sent.
    ("200k-unknown-keys", {"json": {**COMPLETION, **{f"k{i}": 0 for i in range(200_000)}}}, 400, "k0"),
    ("512-kib-role", {"json": {"messages": [{"role": "r" * 512 * 1024, "content": "x"}]}}, 400, "messages[0].role"),
    ("50k-bad-words", {"json": {**COMPLETION, "bad_words": [f"zq{i}" for i in range(50_000)]}}, 400, "bad_words"),
    ("100k-logit-bias", {"json": {**COMPLETION, "logit_bias": {str(i): 1 for i in range(100_000)}}}, 400,
     "logit_bias"),
    ("256-kib-request-id", {"json": {**COMPLETION, "stream": True, "request_id": "r" * 256 * 1024}}, 400,
     "request_id"),
    ("request-id-with-newline", {"json": {**COMPLETION, "request_id": "a\nb"}}, 400, "request_id"),
    ("5000-char-x-request-id", {"json": COMPLETION, "headers": {"X-Request-Id": "h" * 5000}}, 400, "x-request-id"),
    ("2-mib-of-headers", {"json": COMPLETION, "headers": {"X-Big": "h" * 2 * 1024 * 1024}}, 431, None),
    ("5000-digit-integer", {"content": b'{"prompt":"x","seed":1' + b"0" * 5000 + b"}", "headers": JSON}, 400, None),
    # Operator levers, refused by name unless the serving config enables them.
    ("chat-template", {"json": {**CHAT, "chat_template": "{{ 'x' }}"}}, 400, "chat_template"),
    ("chat-template-in-kwargs", {"json": {**CHAT, "chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}}, 400,
     "chat_template_kwargs.chat_template"),
    ("kv-transfer-params", {"json": {**COMPLETION, "kv_transfer_params": {"do_remote_prefill": True}}}, 400,
     "kv_transfer_params"),
    ("priority", {"json": {**COMPLETION, "priority": -100}}, 400, "priority"),
    ("priority-header", {"json": COMPLETION, "headers": {"X-Vllm-Priority": "-100"}}, 400, "header x-vllm-priority"),
    ("session-header", {"json": COMPLETION, "headers": {"X-Session-ID": "s1"}}, 400, "header x-session-id"),
    ("vllm-xargs", {"json": {**COMPLETION, "vllm_xargs": {"session_id": "s1"}}}, 400, "vllm_xargs"),
    # Grammar inputs bounded before any compiler sees them.
    ("schema-40-deep", {"json": {**CHAT, "response_format": _schema(_nested(20))}}, 400, "response_format"),
    ("schema-of-64-kib", {"json": {**CHAT, "response_format": _schema(
        {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}})}}, 400,
     "response_format"),
    ("regex-of-64-kib", {"json": {**COMPLETION, "structured_outputs": {"regex": "a" * 65536}}}, 400,
     "structured_outputs"),
]


@pytest.mark.parametrize("name,kwargs,status,field", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_gets_a_short_4xx_naming_the_field(server, name, kwargs, status, field, bad_request_table):
    before = {rec["request_id"] for rec in server.request_lines()}
    with httpx.Client(timeout=120) as client:
        r = client.post(server.base + "/invocations", **kwargs)
        bad_request_table.append((name, r.status_code, r.text[:110]))
        assert r.status_code == status, r.text[:500]
        assert len(r.content) <= MAX_REFUSAL_BYTES, f"{len(r.content)} bytes: {r.text[:200]}"
        error = r.json()["error"]
        assert error["code"] == status and error["param"] == field, error
        for python in ("Traceback", "Object of type", "JSON serializable", "Internal server error"):
            assert python not in error["message"], error["message"]
        good = client.post(server.base + "/invocations", json=COMPLETION)
        assert good.status_code == 200, good.text
    assert all(rec["status"] == 200 for rec in server.request_lines() if rec["request_id"] not in before)


def _hostile_bodies() -> list[bytes]:
    """Four bodies of up to SageMaker's limit, as costly to check as the benchmark's (bench/ping_under_load.py): all
    refused, two of them only after a parse and a walk of a quarter of a million values."""
    made = ping_under_load.hostile_bodies()
    return [made["containers"], made["keys"], made["nested"], made["keys"]]


def test_ping_answers_within_sagemakers_2s_while_four_maximum_size_hostile_bodies_are_checked(server):
    """SageMaker replaces an instance whose /ping takes 2 s; four 5 MiB bodies held it 4.5 s when the checks ran
    on the event loop. The front door pings as SageMaker does (its 2 s timeout), every 200 ms, while four such
    bodies are checked at once, twice over; a legitimate request sent meanwhile is served."""
    bodies = _hostile_bodies()
    assert all(len(b) <= MAX_PAYLOAD_BYTES for b in bodies)

    def send(body: bytes) -> tuple[int, float]:
        started = time.monotonic()
        r = httpx.post(server.base + "/invocations", content=body, headers=JSON, timeout=120)
        return r.status_code, time.monotonic() - started

    with FrontDoor(backend=server.base, endpoints={"peagle-dev": None}, ping_every_s=0.2) as door:
        opened = time.monotonic()
        time.sleep(0.5)
        with ThreadPoolExecutor(5) as pool:
            hostile = [pool.submit(send, body) for body in bodies + bodies]
            time.sleep(1.0)
            good = httpx.post(server.base + "/invocations", json=COMPLETION, timeout=120)
            results = [f.result() for f in hostile]
        time.sleep(0.5)
        window = time.monotonic() - opened
    took = sorted(t for t, _ in door.pings if t is not None)
    FIGURES["/ping under 4 hostile 6 MiB bodies"] = (
        f"{len(door.pings)} pings, max {max(took) * 1000:.0f} ms, failures {len(door.ping_failures)}; "
        f"hostile answered in {min(t for _, t in results):.1f}-{max(t for _, t in results):.1f} s")
    assert [status for status, _ in results] == [400] * len(results)
    assert good.status_code == 200, good.text
    # Every ping answered in time, and they kept coming throughout: the front door pings 0.2 s after each
    # answer, so a stalled loop shows as fewer than one ping per 0.4 s over the window (at least 2 s long,
    # however fast the checks; a fixed count failed when they were quick).
    assert door.ping_failures == [], door.ping_failures
    assert len(door.pings) >= window / 0.4, (len(door.pings), window)


def test_the_front_door_refuses_what_sagemaker_refuses_before_the_container_sees_it(server):
    """Past botocore's BodyBlob maximum (SageMaker's 6 MiB), the real boto3 client gets SageMaker's
    ValidationError and the container reads nothing; the container's own limit is the same number."""
    from botocore.exceptions import ClientError

    from ops.sagemaker_client import runtime_client

    assert MAX_BODY_BYTES == MAX_PAYLOAD_BYTES
    with FrontDoor(backend=server.base, endpoints={"peagle-dev": None}) as door:
        client = runtime_client(endpoint_url=door.url)
        with pytest.raises(ClientError) as refused:
            client.invoke_endpoint(EndpointName="peagle-dev", Body=b" " * (MAX_PAYLOAD_BYTES + 1),
                                   ContentType="application/json")
        assert refused.value.response["Error"]["Code"] == "ValidationError"
        assert door.last_route is None  # refused at the door
        answered = client.invoke_endpoint(EndpointName="peagle-dev", Body=json.dumps(COMPLETION).encode(),
                                          ContentType="application/json")
        assert json.loads(answered["Body"].read())["choices"]


def test_refusals_never_reach_the_engine_and_it_keeps_serving_a_burst(server):
    """Twenty hostile bodies and twenty good requests interleaved: every good one is served, no hostile one is
    answered 5xx."""
    rows = [kwargs for _, kwargs, _, _ in HOSTILE[:8]]
    with ThreadPoolExecutor(8) as pool:
        hostile = [pool.submit(httpx.post, server.base + "/invocations", timeout=120, **rows[i % len(rows)])
                   for i in range(20)]
        good = [pool.submit(httpx.post, server.base + "/invocations", json=COMPLETION, timeout=120) for _ in range(20)]
        statuses = [f.result().status_code for f in hostile]
        assert [f.result().status_code for f in good] == [200] * 20
    assert all(400 <= s < 500 for s in statuses), statuses

