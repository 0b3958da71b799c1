"""A SageMaker Runtime front door on loopback, in front of the local runtime, so the real boto3
``sagemaker-runtime`` client - not ours - is what the smoke and load tests drive.

It speaks the two operations' wire format as botocore's service model describes it (rest-json):
- ``POST /endpoints/<name>/invocations`` -> the container's ``/invocations``; the body and ``Content-Type``
  back, ``x-Amzn-Invoked-Production-Variant`` set;
- ``POST /endpoints/<name>/invocations-response-stream`` -> the same, streamed: the container's bytes, as
  they come, each in a ``PayloadPart`` event of the AWS event-stream encoding (prelude with CRCs, string
  headers ``:message-type``/``:event-type``/``:content-type``, the raw bytes as payload), the container's
  content type in ``X-Amzn-SageMaker-Content-Type``;
- a container answer outside 2xx becomes SageMaker's ``ModelError`` (HTTP 424, ``OriginalStatusCode``,
  ``OriginalMessage``); an unknown endpoint name a ``ValidationError`` (400), as SageMaker answers them;
- the container's ``X-Amzn-SageMaker-Custom-Attributes`` passed back verbatim on both operations (boto3's
  ``CustomAttributes``), as SageMaker does; nothing else of the container's headers;
- several endpoints may share the one backend (``endpoints``: name -> its inference component or None);
- for an endpoint of inference components, a request must name that component in
  ``X-Amzn-SageMaker-Inference-Component`` (botocore's header for ``InferenceComponentName``); without it,
  or naming another, a ``ValidationError`` (our wording: SageMaker's own is not documented);
- a body over SageMaker's payload limit (botocore's ``BodyBlob`` maximum, 6 MiB) is refused with a
  ``ValidationError`` before it is read, as SageMaker refuses it: the container never sees one;
- with ``ping_every_s``, it health-checks the container as SageMaker does: ``GET /ping`` with SageMaker's 2 s
  timeout, every answer recorded (``pings``; ``ping_failures`` those that were late or not 200) - a container
  that misses it would be replaced.
Requests are not signed-checked (credentials are fake on loopback). Only 127.0.0.1 is listened on.
"""

from __future__ import annotations

import json
import re
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping

import httpx
from peagle_contract.served_config import HEADER as CUSTOM_ATTRIBUTES

from harness.ports import free_port

_PATH = re.compile(r"^/endpoints/(?P<name>[^/]+)/(?P<op>invocations|invocations-response-stream)$")
VARIANT = "AllTraffic"
COMPONENT_HEADER = "X-Amzn-SageMaker-Inference-Component"
# SageMaker's own answer limit for InvokeEndpoint; the stream has a longer one.
INVOKE_TIMEOUT_S, STREAM_TIMEOUT_S = 60.0, 600.0
PING_TIMEOUT_S = 2.0  # SageMaker's health check waits this long for /ping


def _payload_limit() -> int:
    """InvokeEndpoint's body limit, from botocore's service model (the API's own figure, not ours)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    return int(model.shape_for("BodyBlob").metadata["max"])


MAX_PAYLOAD_BYTES = _payload_limit()


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return struct.pack("B", len(raw_name)) + raw_name + b"\x07" + struct.pack(">H", len(raw_value)) + raw_value


def event_message(payload: bytes, headers: dict[str, str]) -> bytes:
    """One message of the AWS event-stream encoding: total and header lengths, prelude CRC, headers, payload,
    message CRC (CRC-32, big-endian throughout)."""
    head = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def payload_part(data: bytes) -> bytes:
    return event_message(data, {":message-type": "event", ":event-type": "PayloadPart",
                                ":content-type": "application/octet-stream"})


def model_stream_error(message: str) -> bytes:
    body = json.dumps({"Message": message, "ErrorCode": "ModelStreamError"}).encode()
    return event_message(body, {":message-type": "exception", ":exception-type": "ModelStreamError",
                                ":content-type": "application/json"})


class _Handler(BaseHTTPRequestHandler):
    server: "FrontDoor"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:  # quiet: the runtime logs every request
        pass

    def _error(self, status: int, kind: str, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-amzn-ErrorType", kind)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        match = _PATH.match(self.path.split("?", 1)[0])
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_PAYLOAD_BYTES:
            self.close_connection = True  # the body is never read, so this connection cannot carry another
            self._error(400, "ValidationError", {"message": (
                "1 validation error detected: Value at 'body' failed to satisfy constraint: Member must have "
                f"length less than or equal to {MAX_PAYLOAD_BYTES}")})
            return
        body = self.rfile.read(length) if length else b""
        if not match:
            self._error(404, "UnknownOperationException", {"message": f"no operation at {self.path}"})
            return
        if match["name"] not in self.server.endpoints:
            self._error(400, "ValidationError",
                        {"message": f"Endpoint {match['name']} of account 123456789012 not found."})
            return
        wanted, named = self.server.endpoints[match["name"]], self.headers.get(COMPONENT_HEADER)
        if wanted is not None and named != wanted:
            self._error(400, "ValidationError", {"message": (
                f"Inference component {named} not found on endpoint {match['name']}." if named else
                f"Endpoint {match['name']} hosts inference components: name one (InferenceComponentName).")})
            return
        self.server.last_route = (match["name"], wanted)
        content_type = self.headers.get("Content-Type", "application/json")
        if match["op"] == "invocations":
            self._invoke(body, content_type)
        else:
            self._stream(body, content_type)

    def _model_error(self, status: int, text: str) -> None:
        kind = "client" if 400 <= status < 500 else "server"
        self._error(424, "ModelError", {
            "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL", "OriginalStatusCode": status, "OriginalMessage": text,
            "Message": f"Received {kind} error ({status}) from primary with message \"{text}\".",
            "LogStreamArn": f"arn:aws:logs:local:123456789012:log-group:/aws/sagemaker/Endpoints/{self.server.last_route[0]}"})

    def _invoke(self, body: bytes, content_type: str) -> None:
        try:
            r = httpx.post(self.server.backend + "/invocations", content=body, headers={"content-type": content_type},
                           timeout=INVOKE_TIMEOUT_S)
        except httpx.TimeoutException:
            self._model_error(408, "the model did not answer within 60 seconds")
            return
        if not 200 <= r.status_code < 300:
            self._model_error(r.status_code, r.text)
            return
        self.send_response(200)
        self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
        self.send_header("x-Amzn-Invoked-Production-Variant", VARIANT)
        self._custom_attributes(r)
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    def _stream(self, body: bytes, content_type: str) -> None:
        with httpx.Client(timeout=STREAM_TIMEOUT_S) as client, client.stream(
                "POST", self.server.backend + "/invocations", content=body,
                headers={"content-type": content_type}) as r:
            if not 200 <= r.status_code < 300:
                self._model_error(r.status_code, r.read().decode(errors="replace"))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.amazon.eventstream")
            self.send_header("X-Amzn-SageMaker-Content-Type", r.headers.get("content-type", "text/event-stream"))
            self.send_header("x-Amzn-Invoked-Production-Variant", VARIANT)
            self._custom_attributes(r)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for data in r.iter_raw():
                    if data:
                        self._chunk(payload_part(data))
                self._chunk(b"")
            except httpx.HTTPError as exc:
                self._chunk(model_stream_error(f"the model's stream broke: {exc}"))
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                # The client left (or read [DONE] and closed): leaving the with-block closes the container's
                # stream too, which the runtime logs as a client disconnect - as SageMaker's front end would.
                self.close_connection = True

    def _custom_attributes(self, r: httpx.Response) -> None:
        if CUSTOM_ATTRIBUTES in r.headers:
            self.send_header(CUSTOM_ATTRIBUTES, r.headers[CUSTOM_ATTRIBUTES])

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class FrontDoor(ThreadingHTTPServer):
    """``with FrontDoor(backend="http://127.0.0.1:8080", endpoints={"peagle-dev": None}) as door: door.url``.

    ``endpoints``: each endpoint name it answers for, with the inference component a request must name there
    (None: a single-model endpoint). ``last_route`` is the (endpoint, component) of the latest request."""

    daemon_threads = True

    def __init__(self, *, backend: str, endpoints: Mapping[str, str | None], port: int | None = None,
                 ping_every_s: float | None = None) -> None:
        super().__init__(("127.0.0.1", port or free_port()), _Handler)
        self.backend, self.endpoints = backend.rstrip("/"), dict(endpoints)
        self.last_route: tuple[str, str | None] | None = None
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        # (seconds it took, or None past SageMaker's timeout; HTTP status or 0) per health check.
        self.pings: list[tuple[float | None, int]] = []
        self._ping_every_s = ping_every_s
        self._stop_pings = threading.Event()
        self._pinger = threading.Thread(target=self._health_checks, daemon=True)

    @property
    def ping_failures(self) -> list[tuple[float | None, int]]:
        return [(took, status) for took, status in self.pings if took is None or status != 200]

    def _health_checks(self) -> None:
        with httpx.Client(timeout=PING_TIMEOUT_S) as client:
            while not self._stop_pings.wait(self._ping_every_s):
                started = time.monotonic()
                try:
                    status = client.get(self.backend + "/ping").status_code
                    self.pings.append((time.monotonic() - started, status))
                except httpx.TimeoutException:
                    self.pings.append((None, 0))
                except httpx.HTTPError:
                    self.pings.append((time.monotonic() - started, 0))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> "FrontDoor":
        self._thread.start()
        if self._ping_every_s:
            self._pinger.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop_pings.set()
        self.shutdown()
        self.server_close()

    def handle_error(self, request, client_address) -> None:
        # A client that closes its idle keep-alive connection (boto3's pool does at exit) is not an error;
        # anything else still prints its traceback.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


