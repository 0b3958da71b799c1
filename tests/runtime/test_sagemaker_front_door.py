"""The real boto3 sagemaker-runtime client against the runtime, through the loopback front door
(harness.front_door): botocore's own parsers judge the event-stream framing and the error shape."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError
from peagle_contract.served_config import VLLM_RELEASE, ServedConfig, parse, release
from peagle_contract.serving import DRAFTER_MODEL_DIR
from ops import loadtest, smoke
from harness.front_door import FrontDoor, event_message
from ops.sagemaker_client import invoke, invoke_stream, runtime_client

pytestmark = pytest.mark.engine
ENDPOINT = "peagle-dev"


@pytest.fixture(scope="module")
def door(server):
    with FrontDoor(backend=server.base, endpoints={ENDPOINT: None}) as front:
        yield front


def test_the_smoke_checks_pass_through_boto3(server):
    report = smoke.smoke_local(ENDPOINT, base=server.base, request_lines=server.request_lines,
                               environment=server.environment())
    assert report.ok, report.checks
    names = [name for name, _, _ in report.checks]
    assert "InvokeEndpointWithResponseStream streams" in names and "a wrongly typed request is refused" in names
    assert "the container runs the serving config deployed" in names


def test_the_container_says_what_its_engine_runs_on_both_operations(door, server):
    """The statement comes back through boto3's own CustomAttributes, on a whole answer and on a stream."""
    client = runtime_client(endpoint_url=door.url)
    body = {"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}
    whole = client.invoke_endpoint(EndpointName=ENDPOINT, Body=json.dumps(body).encode(), ContentType="application/json")
    streamed = client.invoke_endpoint_with_response_stream(
        EndpointName=ENDPOINT, Body=json.dumps({**body, "stream": True}).encode(), ContentType="application/json")
    list(streamed["Body"])
    for answer in (whole, streamed):
        said = parse(answer["CustomAttributes"])
        assert said == ServedConfig(k=4, drafter=str(server.drafter), method="eagle3", parallel_drafting=True,
                                    vllm=said.vllm)
        assert release(said.vllm) == VLLM_RELEASE


def test_the_smoke_test_fails_naming_both_when_the_container_runs_another_config(server):
    """Staging's model asks for K=7 with the drafter at /opt/ml/model/drafter; this runtime runs K=4 from a
    local folder: the one check that fails says both."""
    from peagle_constructs.weights import WeightsLayout
    from stacks.environments import ENVIRONMENTS

    staging = next(config for config in ENVIRONMENTS if config.name == "Staging")
    deployed = WeightsLayout.of(staging.model.serving).environment(staging.model.serving)
    report = smoke.smoke_local(ENDPOINT, base=server.base, request_lines=server.request_lines, environment=deployed)
    failed = [(name, detail) for name, ok, detail in report.checks if not ok]
    assert [name for name, _ in failed] == ["the container runs the serving config deployed"], report.checks
    assert "k: the container runs 4, the stack deployed 7" in failed[0][1]
    assert f"drafter: the container runs {str(server.drafter)!r}, the stack deployed {DRAFTER_MODEL_DIR!r}" in failed[0][1]


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
