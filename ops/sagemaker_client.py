"""The real boto3 ``sagemaker-runtime`` client, as a user's application calls an endpoint: the smoke and load
tests' only way in, locally (through harness.front_door) and on AWS alike.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable

from harness.client import StreamMeter, StreamResult, streaming_body

# Loopback has no credentials to find; the front door does not check signatures.
_FAKE_CREDENTIALS = {"aws_access_key_id": "LOCALFRONTDOOR", "aws_secret_access_key": "local",
                     "aws_session_token": "local"}


def runtime_client(*, endpoint_url: str | None = None, region: str | None = None, max_connections: int = 10):
    """A sagemaker-runtime client: AWS (credentials and region as boto3 finds them) or a local front door."""
    import boto3
    from botocore.config import Config

    config = Config(max_pool_connections=max_connections, retries={"max_attempts": 1, "mode": "standard"},
                    read_timeout=600)
    if endpoint_url is None:
        return boto3.client("sagemaker-runtime", region_name=region, config=config)
    return boto3.client("sagemaker-runtime", endpoint_url=endpoint_url, region_name=region or "us-east-1",
                        config=config, **_FAKE_CREDENTIALS)


@dataclass(frozen=True)
class WholeResult:
    seconds: float
    body: dict
    variant: str | None
    # What the container says it runs (peagle_contract.served_config), as SageMaker hands it over.
    custom_attributes: str | None = None

    @property
    def output_tokens(self) -> int:
        return int((self.body.get("usage") or {}).get("completion_tokens") or 0)

    @property
    def text(self) -> str:
        choice = (self.body.get("choices") or [{}])[0]
        return choice.get("text") or (choice.get("message") or {}).get("content") or ""


def _component(component: str | None) -> dict:
    """An endpoint that hosts inference components is invoked naming one."""
    return {"InferenceComponentName": component} if component else {}


def invoke(client, endpoint: str, body: dict, *, component: str | None = None) -> WholeResult:
    """InvokeEndpoint with a JSON body; the whole answer."""
    started = time.perf_counter()
    response = client.invoke_endpoint(EndpointName=endpoint, Body=json.dumps(body).encode(),
                                      ContentType="application/json", Accept="application/json", **_component(component))
    payload = json.loads(response["Body"].read())
    return WholeResult(seconds=time.perf_counter() - started, body=payload,
                       variant=response.get("InvokedProductionVariant"),
                       custom_attributes=response.get("CustomAttributes"))


def invoke_stream(client, endpoint: str, body: dict, *, on_text: Callable[[str], None] | None = None,
                  component: str | None = None) -> StreamResult:
    """InvokeEndpointWithResponseStream; TTFT is the first generated text as boto3 hands it to the caller."""
    sent = time.perf_counter()
    meter = StreamMeter(sent, on_text)
    response = client.invoke_endpoint_with_response_stream(
        EndpointName=endpoint, Body=json.dumps(streaming_body(body)).encode(), ContentType="application/json",
        **_component(component))
    for event in response["Body"]:
        if "PayloadPart" in event and meter.feed(event["PayloadPart"]["Bytes"]):
            break
    return meter.result()
