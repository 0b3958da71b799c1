"""Checks on a generation request body that vLLM does not make (or makes with a 200).

vLLM's request models accept unknown fields and silently ignore them (a typo such as ``max_token``
would then generate with the default length); behind SageMaker the client only sees a 200. We refuse
such bodies with a 4xx JSON error that names the field, before the engine sees them. The checks that
vLLM already makes well (prompt longer than the model, max_tokens larger than the context) stay
with vLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

COMPLETION, CHAT = "completion", "chat"
ROUTE_KINDS = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT, "/invocations": None}
MAX_BODY_BYTES = 16 * 1024 * 1024
_TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens")


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str
    param: str | None = None
    type: str = "BadRequestError"

    def body(self) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.type, "param": self.param,
                                     "code": self.status}}).encode()


@dataclass(frozen=True)
class CheckedRequest:
    kind: str  # COMPLETION or CHAT
    body: dict


def known_fields_from_vllm() -> dict[str, frozenset[str]]:
    """Field names and aliases of vLLM's own completion and chat request models."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    def names(model) -> frozenset[str]:
        out: set[str] = set()
        for name, info in model.model_fields.items():
            out.add(name)
            if info.alias:
                out.add(info.alias)
        return frozenset(out)

    return {COMPLETION: names(CompletionRequest), CHAT: names(ChatCompletionRequest)}


def _content_type_ok(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def check_request(*, route: str, content_type: str | None, body: bytes,
                  known_fields: dict[str, frozenset[str]]) -> CheckedRequest | Rejection:
    if content_type is None or not _content_type_ok(content_type):
        return Rejection(415, f"Content-Type {content_type!r} is not supported; allowed: application/json",
                         "Content-Type", "UnsupportedMediaType")
    if not body.strip():
        return Rejection(400, "request body is empty; allowed: a JSON object with 'prompt' (completion) or "
                              "'messages' (chat)")
    if len(body) > MAX_BODY_BYTES:
        return Rejection(413, f"request body is {len(body)} bytes; allowed: at most {MAX_BODY_BYTES}",
                         type="PayloadTooLarge")
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        return Rejection(400, f"request body is not valid JSON{where}")
    if not isinstance(parsed, dict):
        return Rejection(400, f"request body is a JSON {type(parsed).__name__}; allowed: a JSON object")

    kind = ROUTE_KINDS.get(route)
    if kind is None:
        if "messages" in parsed:
            kind = CHAT
        elif "prompt" in parsed:
            kind = COMPLETION
        else:
            return Rejection(400, "request needs 'prompt' (completion) or 'messages' (chat)", "prompt")

    unknown = sorted(set(parsed) - known_fields[kind])
    if unknown:
        return Rejection(400, f"unknown field(s) {unknown} for a {kind} request; see the OpenAI {kind} API "
                              "(vLLM would ignore them silently)", unknown[0])
    for name in _TOKEN_LIMIT_FIELDS:
        value = parsed.get(name)
        if value is None:
            continue
        low = 0 if name == "min_tokens" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return Rejection(400, f"{name}: got {value!r}; allowed: an integer >= {low}", name)
    return CheckedRequest(kind=kind, body=parsed)


def rejection_headers(rejection: Rejection) -> Iterable[tuple[bytes, bytes]]:
    body = rejection.body()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
