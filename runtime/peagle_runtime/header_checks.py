"""Checks on a generation request's headers, before its body is read: cheap, on the event loop.

- The block of headers is bounded (:data:`MAX_HEADER_BYTES`, :data:`MAX_HEADERS`; 431 past either). uvicorn's
  httptools parser has no limit of its own (a 2 MiB block was accepted), so this bounds what reaches vLLM's
  handlers; what a connection may buffer before that is bounded in production by SageMaker's front end, which
  forwards only its own few headers.
- vLLM reads three levers from headers - ``X-Vllm-Priority``, ``X-Session-ID``, ``X-data-parallel-rank`` - which
  are refused by name like the fields they stand for, unless the operator enabled them.
- ``X-Request-Id`` becomes vLLM's request id (in every stream event and the log line): the same bound as the
  body's ``request_id``.
"""

from __future__ import annotations

from typing import Iterable

from peagle_runtime.refusals import Rejection, preview
from peagle_runtime.request_checks import REQUEST_ID, REQUEST_ID_ALLOWED, capability_refused

MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 100
CAPABILITY_HEADERS = {b"x-vllm-priority": "priority", b"x-session-id": "session_id",
                      b"x-data-parallel-rank": "data_parallel_rank"}
REQUEST_ID_HEADER = b"x-request-id"


def check_headers(headers: Iterable[tuple[bytes, bytes]], capabilities: frozenset[str]) -> Rejection | None:
    headers = list(headers)
    size = sum(len(name) + len(value) + 4 for name, value in headers)  # "name: value\r\n"
    if len(headers) > MAX_HEADERS or size > MAX_HEADER_BYTES:
        return Rejection(431, f"request headers are {len(headers)} fields, {size} bytes; allowed: at most "
                              f"{MAX_HEADERS} fields and {MAX_HEADER_BYTES} bytes", type="RequestHeaderFieldsTooLarge")
    for name, value in headers:
        lowered = name.lower()
        capability = CAPABILITY_HEADERS.get(lowered)
        if capability is not None and capability not in capabilities:
            return capability_refused(capability, f"header {lowered.decode('latin-1')}")
        if lowered == REQUEST_ID_HEADER and not REQUEST_ID.fullmatch(value.decode("latin-1")):
            return Rejection(400, f"header x-request-id: got {preview(value.decode('latin-1'))}; allowed: "
                                  f"{REQUEST_ID_ALLOWED}", "x-request-id")
    return None
