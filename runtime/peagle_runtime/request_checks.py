"""Checks on a generation request body before vLLM sees it, decided by vLLM's own request models.

vLLM's server validates bodies in pydantic's lax mode: ``"stream": "yes"`` and ``"temperature": "0.5"`` are
coerced and answered 200, unknown fields are ignored (a typo such as ``max_token`` generates with the
default length), a chat message may carry any role, and a deeply nested body ends in a 500. Behind SageMaker
the client only sees the status. So every body is checked here, in this order, and refused with a 4xx JSON
body in vLLM's error shape that names the field, what is allowed and a short preview of what was sent
(:mod:`peagle_runtime.refusals`):

1. the bytes: UTF-8, a JSON object parsed at C speed (a nesting that defeats the parser is a 400), no NaN or
   Infinity; then one iterative pass over the parsed object: nesting at most :data:`MAX_DEPTH`, at most
   :data:`MAX_JSON_VALUES` values in all (what passes must be cheap for vLLM to parse again, on its event
   loop), every string valid text (a lone surrogate is refused by its field's name);
2. the fields: known to vLLM's model for the route; no operator capability the serving config did not enable
   (:data:`peagle_contract.serving.REQUEST_CAPABILITIES`); ``request_id`` short and plain; the lists vLLM
   quotes back whole bounded; grammar inputs bounded (:mod:`peagle_runtime.grammar_checks`);
3. vLLM's model itself in strict mode (JSON types exactly as its schema says), which also runs vLLM's own
   cross-field checks; chat roles are the roles vLLM's message types declare;
4. where a probe is given, the grammar the engine would compile admits some output.

These run in the check workers (:mod:`peagle_runtime.check_worker`), never on the server's event loop. The
models are read from the installed vLLM, never typed here, so an upgrade cannot drift from them.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Iterable

from peagle_contract.serving import REQUEST_CAPABILITIES

from peagle_runtime.grammar_checks import GrammarProbe, check_grammar_inputs, grammar_inputs
from peagle_runtime.refusals import ECHO_CHARS, Rejection, listed, preview

COMPLETION, CHAT = "completion", "chat"
ROUTE_KINDS = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT, "/invocations": None}
MAX_BODY_BYTES = 6 * 1024 * 1024  # SageMaker's InvokeEndpoint limit (6,291,456 bytes): nothing larger arrives
MAX_DEPTH = 64
MAX_JSON_VALUES = 256 * 1024  # arrays and objects and the values in them, all levels together
# Client ids are repeated in every stream event and in the log line: short, and nothing a log parser trips on.
REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")  # whole value: fullmatch
REQUEST_ID_ALLOWED = "1-64 of letters, digits and . _ : - (starting with a letter or digit)"
# Lists vLLM checks item by item and quotes back whole when it refuses them; past these it refuses anyway.
LIST_LIMITS = {"bad_words": 128, "stop": 64, "stop_token_ids": 1024, "logit_bias": 1024, "logprob_token_ids": 1024,
               "allowed_token_ids": 65536, "tools": 128}
# Location parts pydantic adds for the branches of a union: not field names.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "json-or-python", "union"})
# What pydantic's strict mode refuses, in the words a client understands.
_ALLOWED = {
    "bool_type": "a JSON boolean (true or false)", "int_type": "a JSON integer", "float_type": "a JSON number",
    "string_type": "a JSON string", "list_type": "a JSON array", "dict_type": "a JSON object",
    "model_type": "a JSON object", "typed_dict_type": "a JSON object", "int_from_float": "a whole number",
    "missing": "this field is required", "too_long": "fewer items", "too_short": "more items",
}


def too_large(received: int) -> Rejection:
    return Rejection(413, f"request body is over {MAX_BODY_BYTES} bytes (at least {received}); allowed: at most "
                          f"{MAX_BODY_BYTES}, SageMaker's InvokeEndpoint limit", type="PayloadTooLarge")


@dataclass(frozen=True)
class Verdict:
    """A request that passed: what the middleware needs to forward and measure it, without parsing it again."""

    kind: str  # COMPLETION or CHAT
    stream: bool
    drop_usage_event: bool  # the client did not ask for the usage-only last event
    strip_event_usage: bool  # ... nor for usage in every event
    body: bytes | None = None  # the body to forward when it changed (usage asked for); None: as sent
    grammar_field: str | None = None  # the field that carries a grammar, if any


class RequestValidator:
    """vLLM's request model per kind, the fields (and aliases) it knows, and the chat roles it declares."""

    def __init__(self, models: dict[str, type], client_errors: tuple[type[Exception], ...] = (), *,
                 capabilities: frozenset[str] = frozenset(), grammar_probe: GrammarProbe | None = None) -> None:
        self.models = models
        self.client_errors = (ValueError, *client_errors)
        self.known_fields = {kind: _field_names(model) for kind, model in models.items()}
        self.roles = _declared_roles(models[CHAT])
        self.capabilities = capabilities
        self.grammar_probe = grammar_probe
        # A capability refused only when it asks for something: its value is not the model's own default.
        self.levers = {kind: {name: _default(model, name) for name in REQUEST_CAPABILITIES if name in model.model_fields}
                       for kind, model in models.items()}

    @classmethod
    def from_vllm(cls, *, capabilities: frozenset[str] = frozenset(),
                  grammar_probe: GrammarProbe | None = None) -> "RequestValidator":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.exceptions import VLLMClientError

        return cls({COMPLETION: CompletionRequest, CHAT: ChatCompletionRequest}, (VLLMClientError,),
                   capabilities=capabilities, grammar_probe=grammar_probe)

    def check(self, *, route: str, body: bytes) -> Verdict | Rejection:
        """The verdict on a body whose content type and size the middleware has already accepted."""
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
        rejection = self._check_fields(kind, parsed)
        if rejection is not None:
            return rejection
        request = self._validate(kind, body)
        if isinstance(request, Rejection):
            return request
        if kind == CHAT:
            rejection = self._check_roles(parsed.get("messages"))
            if rejection is not None:
                return rejection
        grammar_field = next((field for field, _ in grammar_inputs(parsed)), None)
        if grammar_field is not None and self.grammar_probe is not None:
            rejection = self.grammar_probe.check(request)
            if rejection is not None:
                return rejection
        return _with_usage(kind, parsed, grammar_field)

    def _check_fields(self, kind: str, parsed: dict) -> Rejection | None:
        unknown = [key for key in parsed if key not in self.known_fields[kind]]
        if unknown:
            return Rejection(400, f"unknown field(s) {listed(unknown)} for a {kind} request; allowed: the fields of "
                                  f"the OpenAI {kind} API (vLLM would ignore them silently)", unknown[0])
        for name, default in self.levers[kind].items():
            if name in parsed and name not in self.capabilities and not _is_default(parsed[name], default):
                return capability_refused(name)
        kwargs = parsed.get("chat_template_kwargs")
        if isinstance(kwargs, dict) and "chat_template" in kwargs and "chat_template" not in self.capabilities:
            return capability_refused("chat_template", "chat_template_kwargs.chat_template")
        if "request_id" in parsed and not (isinstance(parsed["request_id"], str)
                                           and REQUEST_ID.fullmatch(parsed["request_id"])):
            return Rejection(400, f"request_id: got {preview(parsed['request_id'])}; allowed: {REQUEST_ID_ALLOWED} "
                                  "(it is repeated in every stream event and in the log line)", "request_id")
        for name, limit in LIST_LIMITS.items():
            value = parsed.get(name)
            if isinstance(value, (list, dict)) and len(value) > limit:
                return Rejection(400, f"{name}: {len(value)} items; allowed: at most {limit}", name)
        return check_grammar_inputs(parsed)

    def _validate(self, kind: str, body: bytes) -> Any:
        import pydantic

        try:
            return self.models[kind].model_validate_json(body, strict=True)
        except pydantic.ValidationError as exc:
            return _from_pydantic(exc)
        except self.client_errors as exc:  # vLLM's own checks across fields (a VLLMValidationError names the field)
            param = getattr(exc, "parameter", None)
            message = str(exc.args[0]) if exc.args else str(exc)
            # vLLM's messages may quote a whole value ("value=[...]"): only their start is kept (refusals).
            return Rejection(400, f"{param}: {message}" if isinstance(param, str) else message,
                             param if isinstance(param, str) else None)

    def _check_roles(self, messages: Any) -> Rejection | None:
        for index, message in enumerate(messages or []):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in self.roles:
                return Rejection(400, f"messages[{index}].role: got {preview(role)}; allowed: one of "
                                      f"{sorted(self.roles)}", f"messages[{index}].role")
        return None


def capability_refused(name: str, where: str | None = None) -> Rejection:
    where = where or name
    return Rejection(400, f"{where}: not allowed on this endpoint: {REQUEST_CAPABILITIES[name]}; the operator "
                          f"enables it in the serving config (request_capabilities={{'{name}'}})", where)


def parse_body(body: bytes) -> dict | Rejection:
    """The body as a JSON object whose every part is within bounds, or the reason it is not one."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Rejection(400, f"request body is not valid UTF-8 (byte {exc.start}); allowed: a UTF-8 JSON object")

    bound = _structure_at_least(body)
    if bound > MAX_JSON_VALUES:
        return _too_many_values()

    def no_constants(name: str) -> float:
        raise ValueError(f"the literal {name}")

    try:
        parsed = json.loads(text, parse_constant=no_constants)
    except RecursionError:  # the C parser's own guard, far past MAX_DEPTH
        return _too_deep(MAX_DEPTH)
    except json.JSONDecodeError as exc:
        return Rejection(400, f"request body is not valid JSON at character {exc.pos}")
    except ValueError as exc:  # a constant, or an integer past Python's digit limit
        what = str(exc) if str(exc).startswith("the literal") else "an integer of more than 4300 digits"
        return Rejection(400, f"request body holds {what}, which is not allowed; allowed: finite numbers")
    if not isinstance(parsed, dict):
        return Rejection(400, f"request body is {preview(parsed) if isinstance(parsed, (list, dict)) else 'a JSON scalar'}"
                              "; allowed: a JSON object")
    return scan(parsed) or parsed


def scan(parsed: dict) -> Rejection | None:
    """One pass over the parsed body, without recursion: nesting, the number of values, and text that is not
    text (a JSON escape such as \\ud800 parses into a lone surrogate, which no encoder downstream accepts)."""
    count = 0
    stack: list[tuple[Any, int, tuple]] = [(parsed, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            return _too_deep(MAX_DEPTH)
        count += 1 + len(node)
        if count > MAX_JSON_VALUES:
            return _too_many_values()
        for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(key, str) and not _is_text(key):
                return _not_text(path, "a key")
            kind = type(value)
            if kind is str:
                if not _is_text(value):
                    return _not_text((*path, key), "the value")
            elif kind is dict or kind is list:
                stack.append((value, depth + 1, (*path, key)))
    return None


def _structure_at_least(body: bytes) -> int:
    """A lower bound, read at C speed, on what :func:`scan` counts: every array or object and every value in one
    (commas separate a container's values, so commas + containers never exceed that count). Only bytes outside
    strings count: escaped backslashes, then escaped quotes, are taken out first, so the quotes left delimit the
    strings. Bodies of millions of tiny containers are refused here, without building them (a C parser builds
    them at about a million a second, holding its worker the while)."""
    def structural(part: bytes) -> int:
        return part.count(b",") + part.count(b"[") + part.count(b"{")

    if structural(body) <= MAX_JSON_VALUES:
        return 0
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return sum(map(structural, body.split(b'"')[::2]))


def _too_many_values() -> Rejection:
    return Rejection(400, f"request body holds more than {MAX_JSON_VALUES} arrays, objects and values in them; "
                          f"allowed: at most {MAX_JSON_VALUES}")


def _is_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_text(path: tuple, what: str) -> Rejection:
    field = ".".join(str(p)[:ECHO_CHARS] for p in path) or "request body"
    return Rejection(400, f"{field}: {what} is not valid text (a lone UTF-16 surrogate such as \\ud800); allowed: "
                          "Unicode text", field if path else None)


def _too_deep(limit: int) -> Rejection:
    return Rejection(400, f"request body nests arrays and objects more than {limit} deep; allowed: at most {limit}")


def _with_usage(kind: str, parsed: dict, grammar_field: str | None) -> Verdict:
    """A stream asks vLLM for usage in every event (``continuous_usage_stats``) so a stream cut short still
    says how many tokens it produced; what the client did not ask for is taken out again on the way back."""
    if parsed.get("stream") is not True:
        return Verdict(kind, False, False, False, grammar_field=grammar_field)
    options = parsed.get("stream_options") if isinstance(parsed.get("stream_options"), dict) else {}
    wants_usage = options.get("include_usage") is True
    wants_continuous = options.get("continuous_usage_stats") is True
    if wants_usage and wants_continuous:
        return Verdict(kind, True, False, False, grammar_field=grammar_field)
    new_options = {**options, "include_usage": True, "continuous_usage_stats": True}
    return Verdict(kind, True, not wants_usage, not wants_continuous,
                   json.dumps({**parsed, "stream_options": new_options}).encode(), grammar_field)


def _from_pydantic(exc) -> Rejection:  # noqa: ANN001 - pydantic.ValidationError
    """The first field pydantic refused, with every type its schema allows there (a union lists several)."""
    errors = exc.errors(include_url=False)
    field = _field_path(errors[0]["loc"])
    same = [e for e in errors if _field_path(e["loc"]) == field]
    allowed: list[str] = []
    for error in same:
        described = _ALLOWED.get(error["type"])
        if described is None and error["type"] == "literal_error":
            described = f"one of {str(error.get('ctx', {}).get('expected'))[:200]}"
        if described and described not in allowed:
            allowed.append(described)
    first = same[0]
    sent = f"got {preview(first.get('input'))}" if "input" in first and first["type"] != "missing" else ""
    what = " or ".join(allowed) if allowed else first["msg"]
    detail = f"{sent}; allowed: {what}" if sent else what
    return Rejection(400, f"{field}: {detail}" if field else detail, field or None)


def _field_path(loc: Iterable[Any]) -> str:
    """``messages.0.content`` from pydantic's location, without its union branches (class and type tags)."""
    parts = []
    for part in loc:
        text = str(part)[:ECHO_CHARS]
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


def _default(model, name: str) -> Any:  # noqa: ANN001 - a pydantic model class
    info = model.model_fields[name]
    return None if info.default_factory is not None else info.default


def _is_default(value: Any, default: Any) -> bool:
    return value is None or (type(value) is type(default) and value == default)


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


def content_type_ok(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
