"""How a client calls an endpoint of this library: the keyword arguments of boto3's sagemaker-runtime invoke calls.

An endpoint that hosts inference components serves a request only when it names one: without
``InferenceComponentName`` SageMaker answers with a ValidationError ("Inference Component Name header is
required ..."), the error its users meet most. :func:`invoke_arguments` names it whenever one is given, for
``invoke_endpoint`` and ``invoke_endpoint_with_response_stream`` alike (both take the same arguments)::

    import boto3
    from peagle_constructs import invoke_arguments

    runtime = boto3.client("sagemaker-runtime")
    request = invoke_arguments("peagle-dev", {"prompt": "def add(a, b):", "max_tokens": 64},
                               inference_component_name="peagle-dev-gpt-oss-20b")
    answer = runtime.invoke_endpoint(**request)
    stream = runtime.invoke_endpoint_with_response_stream(**invoke_arguments(
        "peagle-dev", {"prompt": "def add(a, b):", "max_tokens": 64, "stream": True},
        inference_component_name="peagle-dev-gpt-oss-20b"))

Without this package the same call is ``invoke_endpoint(EndpointName=..., InferenceComponentName=...,
Body=json.dumps(body), ContentType="application/json")``. The names come from the stack: the endpoint's
``endpoint_name`` and the component's ``component_name`` (``PEagleInferenceComponent.add_name_output()`` makes
the latter a stack output; this repository's stages output both, ``EndpointName`` and ``InferenceComponentName``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from peagle_constructs.endpoint_names import check_component_name, check_endpoint_name
from peagle_constructs.errors import ConfigError

JSON = "application/json"


def invoke_arguments(endpoint_name: str, body: Mapping[str, Any] | bytes | str, *,
                     inference_component_name: str | None = None, content_type: str = JSON,
                     accept: str | None = None) -> dict[str, Any]:
    """The keyword arguments of ``invoke_endpoint`` / ``invoke_endpoint_with_response_stream`` for ``body``.

    ``body``: a JSON object (serialised here) or the bytes or text to send as they are. ``inference_component_name``:
    the component to serve the request, required by SageMaker on an endpoint that hosts components; None for an
    endpoint that serves one model. ``accept`` None: no Accept header (the container answers in its own type).
    """
    arguments: dict[str, Any] = {"EndpointName": check_endpoint_name(endpoint_name)}
    if inference_component_name is not None:
        arguments["InferenceComponentName"] = check_component_name(inference_component_name,
                                                                   "inference_component_name")
    if isinstance(body, Mapping):
        body = json.dumps(body)
    elif not isinstance(body, (bytes, str)):
        raise ConfigError("body", f"got {type(body).__name__}; allowed: a JSON object (a Mapping), bytes or str")
    arguments["Body"] = body
    arguments["ContentType"] = content_type
    if accept is not None:
        arguments["Accept"] = accept
    return arguments
