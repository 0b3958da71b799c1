"""The real boto3 sagemaker-runtime client against the runtime, through the loopback front door
(harness.front_door): botocore's own parsers judge the event-stream framing and the error shape."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from harness import loadtest, smoke
from harness.front_door import FrontDoor, event_message
from harness.sagemaker_client import invoke, invoke_stream, runtime_client

pytestmark = pytest.mark.engine
ENDPOINT = "peagle-dev"


@pytest.fixture(scope="module")
def door(server):
    with FrontDoor(backend=server.base, endpoints={ENDPOINT: None}) as front:
        yield front


def test_the_smoke_checks_pass_through_boto3(server):
    report = smoke.smoke_local(ENDPOINT, base=server.base, request_lines=server.request_lines)
    assert report.ok, report.checks
    names = [name for name, _, _ in report.checks]
    assert "InvokeEndpointWithResponseStream streams" in names and "a wrongly typed request is refused" in names


def test_a_stream_and_a_whole_answer_agree(door):
    client = runtime_client(endpoint_url=door.url)
    body = {"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True, "temperature": 0}
    whole = invoke(client, ENDPOINT, body)
    streamed = invoke_stream(client, ENDPOINT, body)
    assert whole.variant == "AllTraffic" and whole.output_tokens == streamed.output_tokens == 16
    assert streamed.text == whole.text and streamed.events > 1


def test_an_unknown_endpoint_is_sagemakers_validation_error(door):
    with pytest.raises(ClientError) as caught:
        invoke(runtime_client(endpoint_url=door.url), "no-such-endpoint", {"prompt": "x", "max_tokens": 2})
    assert caught.value.response["Error"]["Code"] == "ValidationError"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_an_endpoint_of_inference_components_is_invoked_naming_one(server):
    """boto3 sends InferenceComponentName as its header; the front door of a components endpoint wants it."""
    component = "peagle-dev-gpt-oss-20b"
    with FrontDoor(backend=server.base, endpoints={ENDPOINT: component}) as front:
        client = runtime_client(endpoint_url=front.url)
        body = {"prompt": "Once upon a time", "max_tokens": 4, "ignore_eos": True, "temperature": 0}
        assert invoke(client, ENDPOINT, body, component=component).output_tokens == 4
        assert invoke_stream(client, ENDPOINT, body, component=component).output_tokens == 4
        for named in (None, "another-component"):
            with pytest.raises(ClientError) as caught:
                invoke(client, ENDPOINT, body, component=named)
            assert caught.value.response["Error"]["Code"] == "ValidationError"
        report = smoke.smoke_local(ENDPOINT, component=component, base=server.base, request_lines=server.request_lines)
        assert report.ok, report.checks


def test_the_event_encoding_is_what_botocore_decodes():
    """Negative control for the framing: botocore's own decoder reads our message and rejects a corrupted one."""
    from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

    message = event_message(b"data: {}\n\n", {":message-type": "event", ":event-type": "PayloadPart"})
    buffer = EventStreamBuffer()
    buffer.add_data(message)
    (decoded,) = list(buffer)
    assert decoded.payload == b"data: {}\n\n" and decoded.headers[":event-type"] == "PayloadPart"
    broken = bytearray(message)
    broken[-6] ^= 0xFF  # a payload byte: the message CRC no longer matches
    buffer = EventStreamBuffer()
    buffer.add_data(bytes(broken))
    with pytest.raises(ChecksumMismatch):
        list(buffer)


def test_a_small_load_sweep_reports_percentiles_and_goodput(door):
    client = runtime_client(endpoint_url=door.url, max_connections=4)
    levels = [loadtest.level(client, ENDPOINT, concurrency=c, requests=6, seconds=120, max_tokens=8,
                             ttft_target_ms=60_000) for c in (1, 4)]
    for lv in levels:
        assert lv["requests"] == 6 and lv["errors"] == 0, lv
        assert lv["ttft_ms_p50"] <= lv["ttft_ms_p90"] <= lv["ttft_ms_p99"]
        assert lv["tokens_per_s"] > 0 and lv["goodput"] == 1.0
    strict = loadtest.level(client, ENDPOINT, concurrency=2, requests=4, seconds=120, max_tokens=8, ttft_target_ms=0.001)
    assert strict["goodput"] == 0.0  # goodput counts the TTFT target, not only success
    assert "goodput" in loadtest.table(levels, 60_000)
