"""A request-check worker: a process of its own that runs :mod:`peagle_runtime.request_checks` on bodies the
server hands it, so that no body, however costly to check, holds the server's event loop.

Started by :class:`peagle_runtime.check_pool.CheckPool` as ``python -m peagle_runtime.check_worker``. It talks
over its stdin and stdout in frames (a 4-byte big-endian length, then the bytes): it says it is ready once vLLM's
request models are imported; then for each request it reads two frames (``{"route": ...}``, the body) and
answers one (:func:`encode`: the verdict or the refusal), followed by the body to forward when the check
rewrote it. Anything a library prints goes to stderr: stdout is the channel. It exits when its stdin closes
(the server is gone).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import traceback

from peagle_runtime.refusals import Rejection
from peagle_runtime.request_checks import Verdict

FRAME_LENGTH = struct.Struct(">I")
WORKER_NICE = 5  # hostile bodies are checked with the CPU the server and the engine leave


def framed(frames: list[bytes]) -> bytes:
    return b"".join(FRAME_LENGTH.pack(len(frame)) + frame for frame in frames)


def write_frames(fd: int, frames: list[bytes]) -> None:
    data = memoryview(framed(frames))
    while data:
        data = data[os.write(fd, data):]


def read_frame(fd: int) -> bytes | None:
    head = _read_exactly(fd, FRAME_LENGTH.size)
    return None if head is None else _read_exactly(fd, FRAME_LENGTH.unpack(head)[0])


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def encode(result: Verdict | Rejection) -> list[bytes]:
    if isinstance(result, Rejection):
        return [json.dumps({"rejection": [result.status, result.message, result.param, result.type]}).encode()]
    fields = {"kind": result.kind, "stream": result.stream, "drop_usage_event": result.drop_usage_event,
              "strip_event_usage": result.strip_event_usage, "grammar_field": result.grammar_field}
    head = json.dumps({"verdict": fields, "body": result.body is not None}).encode()
    return [head] if result.body is None else [head, result.body]


def main() -> int:
    channel_in, channel_out = 0, os.dup(1)
    os.dup2(2, 1)  # vLLM's logger and any stray print write to stdout: send them to stderr
    sys.stdout = sys.stderr
    os.nice(WORKER_NICE)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from peagle_contract.serving import parse_request_capabilities

    from peagle_runtime.grammar_checks import GrammarProbe
    from peagle_runtime.request_checks import RequestValidator

    validator = RequestValidator.from_vllm(capabilities=parse_request_capabilities(os.environ),
                                           grammar_probe=GrammarProbe.from_environment(os.environ))
    write_frames(channel_out, [json.dumps({"ready": True, "pid": os.getpid()}).encode()])
    while True:
        head = read_frame(channel_in)
        body = read_frame(channel_in) if head is not None else None
        if body is None:
            return 0
        try:
            result = validator.check(route=json.loads(head)["route"], body=body)
        except Exception as exc:  # noqa: BLE001 - a body that breaks a check is the body's fault: a 400, logged
            traceback.print_exc()
            result = Rejection(400, f"request body could not be checked ({type(exc).__name__}); allowed: a "
                                    "request of the OpenAI completion or chat API")
        write_frames(channel_out, encode(result))


if __name__ == "__main__":
    sys.exit(main())
