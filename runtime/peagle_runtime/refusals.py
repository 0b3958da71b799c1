"""How the image refuses a request: vLLM's error shape, with a bounded message that never echoes a value whole.

Every refusal names the field, what is allowed and what was sent - the last only as a short preview
(:func:`preview`): a client that sends a 512 KiB role or 200,000 unknown keys must not get its bytes back
amplified, nor leave them in a log line. The message itself is cut at :data:`MAX_MESSAGE_CHARS` whatever
built it (vLLM's own messages quote whole values: 50,000 ``bad_words`` came back as 540 KB).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

ECHO_CHARS = 40  # of a value sent, at most this much comes back
MAX_LISTED = 3  # names listed in one refusal (unknown keys, ...); the rest are counted
MAX_MESSAGE_CHARS = 400
# vLLM's error bodies above this are cut to their message's first characters (request_metrics).
MAX_ERROR_BODY_BYTES = 2048
RETRY_AFTER_S = 1  # a 503 before any work: another instance can take it at once
_VLLM_MESSAGE = re.compile(rb'"message"\s*:\s*"((?:[^"\\]|\\.){0,%d})' % MAX_MESSAGE_CHARS, re.S)
_VLLM_PARAM = re.compile(rb'"param"\s*:\s*"([A-Za-z0-9_.\[\]-]{1,%d})"' % ECHO_CHARS)


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str
    param: str | None = None
    type: str = "BadRequestError"
    retry_after: int | None = None  # seconds, for a 503 a client may retry elsewhere

    def body(self) -> bytes:
        message = self.message if len(self.message) <= MAX_MESSAGE_CHARS else self.message[:MAX_MESSAGE_CHARS] + "..."
        param = None if self.param is None else self.param[:ECHO_CHARS]
        # ensure_ascii: a lone surrogate in a name is written escaped, never raised on.
        return json.dumps({"error": {"message": message, "type": self.type, "param": param,
                                     "code": self.status}}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json"), (b"content-length", str(len(self.body())).encode())]
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        return out


def preview(value: Any) -> str:
    """A short, safe rendering of a value a client sent: strings cut to :data:`ECHO_CHARS`, containers and
    bytes described by their size, never serialized whole."""
    if isinstance(value, str):
        shown = json.dumps(value[:ECHO_CHARS])  # ensure_ascii escapes what is not text
        return shown if len(value) <= ECHO_CHARS else f"{shown[:-1]}...\" ({len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        digits = len(str(abs(value))) if abs(value) < 10 ** 60 else None
        return str(value) if digits is not None else "an integer of more than 60 digits"
    if isinstance(value, float):
        return repr(value)[:ECHO_CHARS]
    if isinstance(value, (list, tuple)):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes that are not valid text"
    return f"a value of type {type(value).__name__}"


def listed(names: Iterable[Any]) -> str:
    """At most :data:`MAX_LISTED` previews, then how many more."""
    names = list(names)
    shown = ", ".join(preview(n) for n in names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def cut_error_body(body: bytes, status: int) -> bytes:
    """vLLM's error body, cut to its message's first :data:`MAX_MESSAGE_CHARS` characters when it is longer than
    :data:`MAX_ERROR_BODY_BYTES` (read from its first bytes, never parsed whole)."""
    if len(body) <= MAX_ERROR_BODY_BYTES:
        return body
    found = _VLLM_MESSAGE.search(body[:MAX_MESSAGE_CHARS * 8])
    message = ""
    if found:
        raw = found.group(1)
        for end in range(len(raw), max(len(raw) - 6, -1), -1):  # a cut may split an escape: back off to a whole one
            try:
                message = json.loads(b'"' + raw[:end] + b'"')
                break
            except ValueError:
                continue
    param = _VLLM_PARAM.search(body[-512:])  # vLLM writes the param after the message
    return Rejection(status, f"{message}... (vLLM's message was {len(body)} bytes; cut)",
                     param.group(1).decode() if param else None,
                     type="BadRequestError" if status < 500 else "InternalServerError").body()
