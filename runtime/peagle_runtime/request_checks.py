"""Checks on a generation request body before vLLM sees it, decided by vLLM's own request models.

vLLM's server validates bodies in pydantic's lax mode: ``"stream": "yes"`` and ``"temperature": "0.5"`` are
coerced and answered 200, unknown fields are ignored (a typo such as ``max_token`` generates with the
default length), a chat message may carry any role, and a deeply nested body ends in a 500. Behind SageMaker
the client only sees the status. So every body is checked here, in this order, and refused with a 4xx JSON
body in vLLM's error shape that names the field, what is allowed and what was sent:

1. content type, emptiness (the size limit applies while reading: :mod:`peagle_runtime.request_metrics`);
2. the bytes: UTF-8, nesting at most :data:`MAX_DEPTH` (counted without recursion), a JSON object, no
   NaN or Infinity;
3. the fields: known to vLLM's model for the route, then the model itself in strict mode (JSON types exactly
   as its schema says), which also runs vLLM's own cross-field checks;
4. chat roles: the roles vLLM's message types declare.

The models are read from the installed vLLM, never typed here, so an upgrade cannot drift from them.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Iterable

COMPLETION, CHAT = "completion", "chat"
ROUTE_KINDS = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT, "/invocations": None}
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
# Location parts pydantic adds for the branches of a union: not field names.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "json-or-python", "union"})
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")
# What pydantic's strict mode refuses, in the words a client understands.
_ALLOWED = {
    "bool_type": "a JSON boolean (true or false)", "int_type": "a JSON integer", "float_type": "a JSON number",
    "string_type": "a JSON string", "list_type": "a JSON array", "dict_type": "a JSON object",
    "model_type": "a JSON object", "typed_dict_type": "a JSON object", "int_from_float": "a whole number",
    "missing": "this field is required", "too_long": "fewer items", "too_short": "more items",
}


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str
    param: str | None = None
    type: str = "BadRequestError"

    def body(self) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.type, "param": self.param,
                                     "code": self.status}}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"content-type", b"application/json"), (b"content-length", str(len(self.body())).encode())]


def too_large(received: int) -> Rejection:
    return Rejection(413, f"request body is over {MAX_BODY_BYTES} bytes (at least {received}); allowed: at most "
                          f"{MAX_BODY_BYTES}", type="PayloadTooLarge")


@dataclass(frozen=True)
class CheckedRequest:
    kind: str  # COMPLETION or CHAT
    body: dict


class RequestValidator:
    """vLLM's request model per kind, the fields (and aliases) it knows, and the chat roles it declares."""

    def __init__(self, models: dict[str, type], client_errors: tuple[type[Exception], ...] = ()) -> None:
        self.models = models
        self.client_errors = (ValueError, *client_errors)
        self.known_fields = {kind: _field_names(model) for kind, model in models.items()}
        self.roles = _declared_roles(models[CHAT])

    @classmethod
    def from_vllm(cls) -> "RequestValidator":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.exceptions import VLLMClientError

        return cls({COMPLETION: CompletionRequest, CHAT: ChatCompletionRequest}, (VLLMClientError,))

    def check(self, *, route: str, content_type: str | None, body: bytes) -> CheckedRequest | Rejection:
        if content_type is None or not _content_type_ok(content_type):
            return Rejection(415, f"Content-Type {content_type!r} is not supported; allowed: application/json",
                             "Content-Type", "UnsupportedMediaType")
        if not body.strip():
            return Rejection(400, "request body is empty; allowed: a JSON object with 'prompt' (completion) or "
                                  "'messages' (chat)")
        parsed = parse_body(body)
        if isinstance(parsed, Rejection):
            return parsed
        kind = ROUTE_KINDS.get(route)
        if kind is None:
            if "messages" in parsed:
                kind = CHAT
            elif "prompt" in parsed:
                kind = COMPLETION
            else:
                return Rejection(400, "request needs 'prompt' (completion) or 'messages' (chat)", "prompt")
        unknown = sorted(set(parsed) - self.known_fields[kind])
        if unknown:
            return Rejection(400, f"unknown field(s) {unknown} for a {kind} request; see the OpenAI {kind} API "
                                  "(vLLM would ignore them silently)", unknown[0])
        rejection = self._validate(kind, body)
        if rejection is None and kind == CHAT:
            rejection = self._check_roles(parsed.get("messages"))
        return rejection or CheckedRequest(kind=kind, body=parsed)

    def _validate(self, kind: str, body: bytes) -> Rejection | None:
        import pydantic

        try:
            self.models[kind].model_validate_json(body, strict=True)
        except pydantic.ValidationError as exc:
            return _from_pydantic(exc)
        except self.client_errors as exc:  # vLLM's own checks across fields (a VLLMValidationError names the field)
            param = getattr(exc, "parameter", None)
            message = str(exc.args[0]) if exc.args else str(exc)
            return Rejection(400, f"{param}: {message}" if isinstance(param, str) else message,
                             param if isinstance(param, str) else None)
        return None

    def _check_roles(self, messages: Any) -> Rejection | None:
        for index, message in enumerate(messages or []):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in self.roles:
                return Rejection(400, f"messages[{index}].role: got {role!r}; allowed: one of {sorted(self.roles)}",
                                 f"messages[{index}].role")
        return None


def parse_body(body: bytes) -> dict | Rejection:
    """The body as a JSON object, or the reason it is not one, decided before any recursive parsing."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Rejection(400, f"request body is not valid UTF-8 (byte {exc.start}); allowed: a UTF-8 JSON object")
    depth = nesting_depth(body)
    if depth > MAX_DEPTH:
        return Rejection(400, f"request body nests arrays and objects {depth}+ deep; allowed: at most {MAX_DEPTH}")

    def no_constants(name: str) -> float:
        raise ValueError(name)

    try:
        parsed = json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        return Rejection(400, f"request body is not valid JSON at character {exc.pos}")
    except ValueError as exc:
        return Rejection(400, f"request body holds {exc}, which JSON does not allow; allowed: finite numbers")
    if not isinstance(parsed, dict):
        return Rejection(400, f"request body is a JSON {type(parsed).__name__}; allowed: a JSON object")
    return parsed


def nesting_depth(body: bytes) -> int:
    """How deep arrays and objects nest, counted over the brackets outside strings; stops past MAX_DEPTH."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRINGS.sub(b'""', body)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    break
        else:
            depth -= 1
    return deepest


def _from_pydantic(exc) -> Rejection:  # noqa: ANN001 - pydantic.ValidationError
    """The first field pydantic refused, with every type its schema allows there (a union lists several)."""
    errors = exc.errors(include_url=False)
    field = _field_path(errors[0]["loc"])
    same = [e for e in errors if _field_path(e["loc"]) == field]
    allowed: list[str] = []
    for error in same:
        described = _ALLOWED.get(error["type"])
        if described is None and error["type"] == "literal_error":
            described = f"one of {error.get('ctx', {}).get('expected')}"
        if described and described not in allowed:
            allowed.append(described)
    first = same[0]
    sent = f"got {json.dumps(first.get('input'))[:80]}" if "input" in first and first["type"] != "missing" else ""
    what = " or ".join(allowed) if allowed else first["msg"]
    detail = f"{sent}; allowed: {what}" if sent else what
    return Rejection(400, f"{field}: {detail}" if field else detail, field or None)


def _field_path(loc: Iterable[Any]) -> str:
    """``messages.0.content`` from pydantic's location, without its union branches (class and type tags)."""
    parts = []
    for part in loc:
        text = str(part)
        if isinstance(part, int) or text.isdigit():
            parts.append(text)
        elif not (text[:1].isupper() or "[" in text or text in _TYPE_TAGS):
            parts.append(text)
    return ".".join(parts)


def _field_names(model) -> frozenset[str]:  # noqa: ANN001 - a pydantic model class
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return frozenset(names)


def _declared_roles(chat_model) -> frozenset[str]:  # noqa: ANN001
    """The Literal roles of the message types in the chat model's ``messages`` (a role typed plain ``str``,
    vLLM's catch-all message, declares none)."""
    (message,) = typing.get_args(chat_model.model_fields["messages"].annotation)
    roles: set[str] = set()
    for member in typing.get_args(message) or (message,):
        hint = typing.get_type_hints(member, include_extras=True).get("role") if hasattr(member, "__annotations__") \
            else None
        roles.update(_literals(hint))
    if not roles:
        raise RuntimeError("vLLM's chat request model declares no message roles; the role check cannot work")
    return frozenset(roles)


def _literals(hint: Any) -> Iterable[str]:
    if hint is None:
        return ()
    if typing.get_origin(hint) is typing.Literal:
        return [a for a in typing.get_args(hint) if isinstance(a, str)]
    return [value for arg in typing.get_args(hint) for value in _literals(arg)]


def _content_type_ok(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
