"""The per-request log line: one JSON object per request whose response started, printed by the serving image.

This module is the single source of truth for that line. The runtime formats lines with
:func:`format_line`; the CDK side generates its CloudWatch metric filters from :data:`METRIC_FIELDS`
and :func:`filter_pattern`. Standard library only.

How each field is measured (the runtime's middleware, in the container):

- ``ttft_ms``: from the request's arrival to the moment the first generated text left the server - a
  stream's first event that carries text (a chat stream's role-only first event is not a token), a whole
  body's body. The metric reads completed streams only: a whole body's first text leaves with its last.
- ``tpot_ms``: mean time per output token after the first, on the engine's own clock (vLLM's per-request decode
  time / (tokens - 1)) for streams and whole bodies alike: on the server's clock a stream's pace is its reader's,
  and one slow reader could move the alarm that reads it. Only a stream cut short before vLLM's figures arrive
  falls back to ``(e2e - ttft) / (output_tokens - 1)`` on the server's clock.
- ``e2e_ms``: from arrival to the last byte sent (or to the moment the request was cut short).
- token counts: vLLM's usage (for a cut-short stream, its usage when it was cut: tokens produced until then).
- ``status``: the HTTP status of a completed request, or what cut it short: :data:`STATUS_CLIENT_GONE` when
  the client closed the connection first, :data:`STATUS_ABORTED` when vLLM aborted it (shutdown, engine
  failure), :data:`STATUS_STREAM_ERROR` when the stream ended in an error. Latency metrics read completed
  (200) lines only; the cut-short ones are counted on their own (``CutShortRequests``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

EVENT_FIELD = "event"
EVENT_NAME = "peagle.request"

# Default namespace for the metrics the filters publish; the constructs may give each endpoint its own.
DEFAULT_NAMESPACE = "PEagle/Serving"

STATUS_OK = 200
STATUS_CLIENT_GONE = 499  # the client closed the connection before the end (the convention nginx started)
STATUS_STREAM_ERROR = 500
STATUS_ABORTED = 503  # vLLM aborted the request after the response had started

# Which lines feed a metric.
COMPLETED, COMPLETED_STREAMS, CUT_SHORT = "completed", "completed streams", "cut short"


@dataclass(frozen=True)
class MetricField:
    """A CloudWatch metric from the lines: a numeric field's value, or (``key`` None) a count of lines."""

    key: str | None  # JSON key in the line; None: each selected line counts 1
    metric_name: str  # CloudWatch metric name
    unit: str  # CloudWatch unit
    description: str
    # Only present when the value exists for this request (e.g. no spec-decode counts without drafts).
    optional: bool = False
    lines: str = COMPLETED


METRIC_FIELDS: tuple[MetricField, ...] = (
    MetricField("ttft_ms", "TimeToFirstToken", "Milliseconds",
                "request arrival to the first generated text leaving the server (completed streams)",
                lines=COMPLETED_STREAMS),
    MetricField("tpot_ms", "TimePerOutputToken", "Milliseconds", "mean time per output token after the first",
                optional=True),
    MetricField("e2e_ms", "EndToEndLatency", "Milliseconds", "request arrival to the last byte sent"),
    MetricField("prompt_tokens", "PromptTokens", "Count", "tokens in the prompt"),
    MetricField("output_tokens", "OutputTokens", "Count", "tokens generated"),
    MetricField("drafted_tokens", "DraftedTokens", "Count", "draft tokens proposed for this request", optional=True),
    MetricField("accepted_tokens", "AcceptedTokens", "Count", "draft tokens the target accepted", optional=True),
    MetricField(None, "CutShortRequests", "Count",
                "requests whose response started but did not complete (client gone, aborted, stream error)",
                lines=CUT_SHORT),
)

# Non-metric fields: who and what, for Logs Insights.
INFO_FIELDS: dict[str, type | tuple[type, ...]] = {
    EVENT_FIELD: str,
    "request_id": str,
    "route": str,  # the HTTP path the request came in on (/invocations, /v1/completions, ...)
    "stream": bool,
    "status": int,  # HTTP status sent
}

METRIC_KEYS = tuple(f.key for f in METRIC_FIELDS if f.key is not None)
REQUIRED_KEYS = tuple(INFO_FIELDS) + tuple(f.key for f in METRIC_FIELDS if f.key is not None and not f.optional)


class RequestLogError(ValueError):
    pass


def format_line(record: Mapping[str, object]) -> str:
    """Render one record as the single-line JSON the metric filters read.

    Missing optional metrics are left out (a filter on them then does not fire); unknown keys are refused
    so the schema stays the only list of fields.
    """
    line = {EVENT_FIELD: EVENT_NAME, **record}
    unknown = set(line) - set(INFO_FIELDS) - set(METRIC_KEYS)
    if unknown:
        raise RequestLogError(f"unknown request-log fields {sorted(unknown)}; allowed: {list(INFO_FIELDS) + list(METRIC_KEYS)}")
    missing = [k for k in REQUIRED_KEYS if line.get(k) is None]
    if missing:
        raise RequestLogError(f"request-log fields missing: {missing}")
    for key, kind in INFO_FIELDS.items():
        if not isinstance(line[key], kind) or (kind is int and isinstance(line[key], bool)):
            raise RequestLogError(f"request-log field {key!r} must be {kind}")
    out: dict[str, object] = {k: line[k] for k in INFO_FIELDS}
    for f in METRIC_FIELDS:
        value = line.get(f.key) if f.key is not None else None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise RequestLogError(f"request-log field {f.key!r} must be a non-negative number, got {value!r}")
        out[f.key] = round(float(value), 3) if f.unit == "Milliseconds" else int(value)
    return json.dumps(out, separators=(",", ":"))


def parse_line(text: str) -> dict | None:
    """The record in a line of container output, or None when the line is not a request-log line."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and obj.get(EVENT_FIELD) == EVENT_NAME else None


def filter_pattern(metric: MetricField) -> str:
    """CloudWatch Logs JSON filter pattern that selects the request lines feeding ``metric``.

    Every value field is a non-negative number, so ``>= 0`` (the documented numeric comparison) selects
    exactly the lines that carry it; a line without the field, or with a non-number, is not matched.
    """
    terms = [f'($.{EVENT_FIELD} = "{EVENT_NAME}")']
    if metric.lines == CUT_SHORT:
        terms.append(f"($.status != {STATUS_OK})")
    else:
        terms.append(f"($.status = {STATUS_OK})")
    if metric.lines == COMPLETED_STREAMS:
        terms.append("($.stream IS TRUE)")
    if metric.key is not None:
        terms.append(f"($.{metric.key} >= 0)")
    return "{ " + " && ".join(terms) + " }"


def metric_value(metric: MetricField) -> str:
    return f"$.{metric.key}" if metric.key is not None else "1"
