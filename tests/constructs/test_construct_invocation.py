"""What a client sends: boto3's sagemaker-runtime calls built by invoke_arguments, InferenceComponentName included.

The judge is botocore itself: its service model validates the arguments for both invoke operations, and a real
client serialises them, so the test reads the header SageMaker routes a component's requests by.
"""

from __future__ import annotations

import json

import pytest

from peagle_constructs import ConfigError, invoke_arguments

OPERATIONS = {"invoke_endpoint": "InvokeEndpoint",
              "invoke_endpoint_with_response_stream": "InvokeEndpointWithResponseStream"}


class _Sent(Exception):
    """Raised by the test's hook once botocore has built the request: nothing leaves the machine."""


def _sent_request(method: str, arguments: dict):
    import boto3

    client = boto3.client("sagemaker-runtime", region_name="eu-west-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
    seen = []

    def capture(request, **_):  # noqa: ANN001 - botocore's AWSPreparedRequest
        seen.append(request)
        raise _Sent

    client.meta.events.register(f"before-send.sagemaker-runtime.{OPERATIONS[method]}", capture)
    with pytest.raises(_Sent):
        getattr(client, method)(**arguments)
    (request,) = seen
    return request


@pytest.mark.parametrize("method", sorted(OPERATIONS))
def test_a_component_is_named_in_the_header_sagemaker_routes_by(method):
    arguments = invoke_arguments("peagle-dev", {"prompt": "def add(a, b):", "max_tokens": 8},
                                 inference_component_name="peagle-dev-gpt-oss-20b")
    request = _sent_request(method, arguments)
    assert request.headers["X-Amzn-SageMaker-Inference-Component"] == b"peagle-dev-gpt-oss-20b"
    assert request.url.endswith("/endpoints/peagle-dev/" + ("invocations-response-stream"
                                                           if "stream" in method else "invocations"))
    assert json.loads(request.body) == {"prompt": "def add(a, b):", "max_tokens": 8}
    assert request.headers["Content-Type"] == b"application/json"


def test_a_single_model_endpoint_is_invoked_without_a_component():
    request = _sent_request("invoke_endpoint", invoke_arguments("peagle-prod", b'{"prompt": "hi"}', accept="text/plain"))
    assert "X-Amzn-SageMaker-Inference-Component" not in request.headers
    assert request.body == b'{"prompt": "hi"}' and request.headers["Accept"] == b"text/plain"


@pytest.mark.parametrize(("args", "kwargs", "field"), [
    (("has_underscore", {}), {}, "endpoint_name"),
    (("peagle-dev", {}), {"inference_component_name": "-bad"}, "inference_component_name"),
    (("peagle-dev", 42), {}, "body"),
])
def test_bad_arguments_name_the_field(args, kwargs, field):
    with pytest.raises(ConfigError) as caught:
        invoke_arguments(*args, **kwargs)
    assert caught.value.field_name == field and "allowed" in str(caught.value)
