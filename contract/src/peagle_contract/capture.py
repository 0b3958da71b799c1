"""Traffic capture: which requests the serving image records, and the record it writes for each one.

This module is the single source of truth for the capture, like :mod:`peagle_contract.request_log` is for the
request line. The runtime renders records with :func:`format_record`; the drafter's trainer reads them back with
:func:`read_records`; the two export formats other trainers take are :func:`to_openai_chat` and
:func:`to_sharegpt`. Standard library only.

Why a line on the container's stdout, not SageMaker's Data Capture: Data Capture is part of Model Monitor, which
AWS's documentation says is no longer open to new customers; Model Monitor's guide says it supports endpoints that
host a single model; and we found no statement that it records streamed responses (docs/capture.md has the
sources). A line on stdout works wherever this product serves: SageMaker ships a container's output to the
endpoint's (or component's) log group with network isolation on, and that group is already encrypted with the
stage's key and kept for the stage's retention (peagle_constructs.log_groups).

What is recorded: the prompt as the client sent it (chat messages, or a completion prompt) and the target's own
answer (the text of choice 0), for streamed and whole answers alike. Not recorded: a request that was refused,
cut short (client gone, aborted, stream error), that asked for several choices, whose answer did not end by
``stop`` or ``length``, or whose record would not fit one CloudWatch Logs event (:data:`MAX_RECORD_BYTES`).
Each record names the stage and the target, so a capture from another stage or of another model is refused by
the reader, with the record's place and the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

CAPTURE_VAR = "PEAGLE_CAPTURE"
EVENT_FIELD = "event"
EVENT_NAME = "peagle.capture"
SCHEMA_VERSION = 1
# CloudWatch Logs takes events of at most 256 KB (PutLogEvents); a longer line is split and no longer parses.
# The margin is for the bytes SageMaker's log agent may add around a line.
MAX_RECORD_BYTES = 250_000
ROUTES = ("/invocations", "/v1/completions", "/v1/chat/completions")
FINISH_REASONS = ("stop", "length")
# A stage's name, a model's name: what a record may carry (and what a training job is asked to read).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][\w.\-/]{0,127}$")
NAME_ALLOWED = "1-128 of letters, digits, . _ - / (starting with a letter or digit)"
_MAX_ID_CHARS = 128


class CaptureError(ValueError):
    """A capture setting or record is not what this module writes. The message names the field (and, for a
    record, where it was read) and what is allowed."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name


def short_repr(value: object, limit: int = 40) -> str:
    """``value`` as an error message shows it: its repr, cut to ``limit`` characters (never echoed whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...'"


@dataclass(frozen=True, kw_only=True)
class CaptureConfig:
    """Record a sample of the requests an endpoint serves (``sample_rate`` of them, 0 < rate <= 1), each record
    naming ``stage`` and ``target`` (the name of the target model its answers come from)."""

    sample_rate: float
    stage: str
    target: str

    def __post_init__(self) -> None:
        rate = self.sample_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0 < rate <= 1) or math.isnan(rate):
            raise CaptureError("capture.sample_rate", f"got {short_repr(rate)}; allowed: a number in (0, 1], the share of "
                                                      "requests recorded (leave capture unset to record none)")
        for name in ("stage", "target"):
            value = getattr(self, name)
            if not isinstance(value, str) or not NAME_PATTERN.match(value):
                raise CaptureError(f"capture.{name}", f"got {short_repr(value)}; allowed: {NAME_ALLOWED}")

    def render(self) -> str:
        """The value of :data:`CAPTURE_VAR` in the container's environment."""
        return json.dumps({"sample_rate": self.sample_rate, "stage": self.stage, "target": self.target},
                          separators=(",", ":"), sort_keys=True)


def parse_capture(env: Mapping[str, str]) -> CaptureConfig | None:
    """The capture the container's environment asks for; None when :data:`CAPTURE_VAR` is unset (nothing is
    recorded). A value that is not what :meth:`CaptureConfig.render` writes raises :class:`CaptureError`
    naming the variable and the key, before vLLM starts."""
    raw = env.get(CAPTURE_VAR)
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CaptureError(CAPTURE_VAR, f"is not valid JSON ({exc.msg} at character {exc.pos})") from None
    keys = {"sample_rate", "stage", "target"}
    if not isinstance(obj, dict) or set(obj) != keys:
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise CaptureError(CAPTURE_VAR, f"got keys {short_repr(got, 80)}; allowed: exactly {sorted(keys)}")
    try:
        return CaptureConfig(**obj)
    except CaptureError as exc:
        raise CaptureError(f"{CAPTURE_VAR}.{exc.field_name.split('.', 1)[1]}",
                           str(exc).split(": ", 1)[1]) from None


# -- the record ---------------------------------------------------------------------------------------------

_STR_FIELDS = ("stage", "target", "request_id", "route", "answer", "finish_reason")
_INT_FIELDS = ("prompt_tokens", "output_tokens")
_FIELDS = frozenset({EVENT_FIELD, "schema", *_STR_FIELDS, *_INT_FIELDS, "stream", "bundle", "messages", "prompt"})


def format_record(*, config: CaptureConfig, request_id: str, route: str, stream: bool, request: Mapping,
                  answer: str, finish_reason: str, prompt_tokens: int, output_tokens: int,
                  bundle: str | None = None) -> str | None:
    """One request as a single JSON line; None when it is not recorded: the prompt is neither chat messages of
    text nor a text prompt, the answer did not end by stop or length, or the line would pass
    :data:`MAX_RECORD_BYTES`. ``request`` is the client's body as parsed JSON; ``bundle`` the manifest digest of the
    weights bundle the container verified (target and drafter), None when it runs unpinned."""
    record: dict[str, object] = {EVENT_FIELD: EVENT_NAME, "schema": SCHEMA_VERSION, "stage": config.stage,
                                 "target": config.target, "bundle": bundle,
                                 "request_id": str(request_id)[:_MAX_ID_CHARS], "route": route, "stream": stream}
    prompt = _prompt_of(request)
    if prompt is None or finish_reason not in FINISH_REASONS:
        return None
    record.update(prompt)
    record.update(answer=answer, finish_reason=finish_reason, prompt_tokens=int(prompt_tokens),
                  output_tokens=int(output_tokens))
    check_record(record, "record")
    # ASCII only: a raw U+2028 (or any character str.splitlines breaks on) from a prompt would let a reader that
    # splits lines that way see a second record the client wrote.
    line = json.dumps(record, separators=(",", ":"))
    return line if len(line.encode("utf-8")) <= MAX_RECORD_BYTES else None


def _prompt_of(request: Mapping) -> dict | None:
    """``{"messages": [...]}`` (role and text content only) or ``{"prompt": text}``; None for anything else (a
    batch of prompts, token ids, images, tool calls: not what the drafter's trainer reads)."""
    messages = request.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            return None
        kept = []
        for message in messages:
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)) or set(message) - {"role", "content", "name"}:
                return None
            kept.append({"role": message["role"], "content": message["content"]})
        return {"messages": kept}
    prompt = request.get("prompt")
    return {"prompt": prompt} if isinstance(prompt, str) else None


# CloudWatch Logs' JSON filter pattern that selects capture records (and no request line) in a container's log group.
FILTER_PATTERN = '{ $.%s = "%s" }' % (EVENT_FIELD, EVENT_NAME)


def is_record_line(text: str) -> bool:
    """Whether a line of container output is a capture record (its first key is the event, as written)."""
    return text.startswith('{"%s":"%s"' % (EVENT_FIELD, EVENT_NAME))


def check_record(record: object, where: str) -> dict:
    """``record`` if it is a capture record as :func:`format_record` writes it; else :class:`CaptureError`
    naming ``where`` and the field."""
    if not isinstance(record, dict):
        raise CaptureError(where, f"got {type(record).__name__}; allowed: a JSON object")
    if record.get(EVENT_FIELD) != EVENT_NAME:
        raise CaptureError(f"{where}.{EVENT_FIELD}", f"got {short_repr(record.get(EVENT_FIELD))}; allowed: {EVENT_NAME!r}")
    if record.get("schema") != SCHEMA_VERSION:
        raise CaptureError(f"{where}.schema", f"got {short_repr(record.get('schema'))}; allowed: {SCHEMA_VERSION}")
    unknown = sorted(set(record) - _FIELDS)
    if unknown:
        raise CaptureError(f"{where}.{unknown[0][:40]}", f"unknown field; allowed: {sorted(_FIELDS)}")
    for name in _STR_FIELDS:
        if not isinstance(record.get(name), str):
            raise CaptureError(f"{where}.{name}", f"got {short_repr(record.get(name))}; allowed: a string")
    for name in _INT_FIELDS:
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CaptureError(f"{where}.{name}", f"got {short_repr(value)}; allowed: a non-negative integer")
    if not isinstance(record.get("stream"), bool):
        raise CaptureError(f"{where}.stream", f"got {short_repr(record.get('stream'))}; allowed: true or false")
    if record.get("bundle") is not None and not isinstance(record["bundle"], str):
        raise CaptureError(f"{where}.bundle", f"got {short_repr(record['bundle'])}; allowed: a string or null")
    if record["route"] not in ROUTES:
        raise CaptureError(f"{where}.route", f"got {short_repr(record['route'])}; allowed: one of {ROUTES}")
    if record["finish_reason"] not in FINISH_REASONS:
        raise CaptureError(f"{where}.finish_reason",
                           f"got {short_repr(record['finish_reason'])}; allowed: one of {FINISH_REASONS}")
    if ("messages" in record) == ("prompt" in record):
        raise CaptureError(where, "allowed: exactly one of 'messages' (a chat request) and 'prompt' (a completion)")
    if "prompt" in record and not isinstance(record["prompt"], str):
        raise CaptureError(f"{where}.prompt", f"got {type(record['prompt']).__name__}; allowed: a string")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise CaptureError(f"{where}.messages", "allowed: a non-empty list of {role, content} objects")
        for i, message in enumerate(messages):
            if not (isinstance(message, dict) and set(message) == {"role", "content"}
                    and all(isinstance(message[k], str) for k in ("role", "content"))):
                raise CaptureError(f"{where}.messages.{i}", "allowed: an object of two strings, role and content")
    return record


@dataclass(frozen=True)
class Capture:
    """A capture read back: its records (one per request, in the order read) and the copies left out (a log
    pipeline may deliver a line twice; the same request with other content is refused, not dropped)."""

    records: tuple[dict, ...]
    duplicates: int


def read_records(paths: Iterable[Path], *, stage: str, target: str) -> Capture:
    """Every record in the JSON-lines files ``paths`` (blank lines skipped), checked; a record of another stage or
    target, a truncated or malformed line, or a request id seen with other content raises :class:`CaptureError`
    naming ``file:line`` and the field."""
    seen: dict[str, tuple[str, str]] = {}  # request id -> (its canonical text, where it was first read)
    records: list[dict] = []
    duplicates = 0
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                where = f"{Path(path).name}:{number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CaptureError(where, f"not a whole JSON record ({exc.msg} at character {exc.pos}; a line "
                                              "cut short?)") from None
                check_record(record, where)
                for name, wanted in (("stage", stage), ("target", target)):
                    if record[name] != wanted:
                        raise CaptureError(f"{where}.{name}", f"got {short_repr(record[name])}; allowed: {wanted!r}, "
                                                              f"the {name} this capture is read for")
                canonical = json.dumps(record, sort_keys=True)
                first = seen.get(record["request_id"])
                if first is not None:
                    if first[0] != canonical:
                        raise CaptureError(f"{where}.request_id", f"{short_repr(record['request_id'])} was read at "
                                                                  f"{first[1]} with other content")
                    duplicates += 1
                    continue
                seen[record["request_id"]] = (canonical, where)
                records.append(record)
    return Capture(tuple(records), duplicates)


# -- what other trainers take ----------------------------------------------------------------------------------


def to_openai_chat(record: Mapping) -> dict:
    """A chat record as OpenAI's chat fine-tuning line (``{"messages": [..., assistant]}``). A completion
    record has no chat turns: it is refused, not turned into a user message it never was."""
    if "messages" not in record:
        raise CaptureError(f"{short_repr(record.get('request_id'))}.prompt",
                           "a completion record has no chat messages; allowed here: chat records")
    return {"messages": [*record["messages"], {"role": "assistant", "content": record["answer"]}]}


_SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}


def to_sharegpt(record: Mapping) -> dict:
    """A chat record as a ShareGPT conversation (``from``: system / human / gpt); other roles (tool, developer)
    have no ShareGPT name and are refused by name."""
    turns = to_openai_chat(record)["messages"]
    out = []
    for i, turn in enumerate(turns):
        role = _SHAREGPT_ROLES.get(turn["role"])
        if role is None:
            raise CaptureError(f"{short_repr(record.get('request_id'))}.messages.{i}.role",
                               f"got {short_repr(turn['role'])}; allowed in ShareGPT: {sorted(_SHAREGPT_ROLES)}")
        out.append({"from": role, "value": turn["content"]})
    return {"conversations": out}
