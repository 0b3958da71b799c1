"""The per-request log line: one JSON object per finished request, printed by the serving image.

This module is the single source of truth for that line. The runtime formats lines with
:func:`format_line`; the CDK side generates its CloudWatch metric filters from :data:`METRIC_FIELDS`
and :func:`filter_pattern`. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

EVENT_FIELD = "event"
EVENT_NAME = "peagle.request"

# Default namespace for the metrics the filters publish; the constructs may give each endpoint its own.
DEFAULT_NAMESPACE = "PEagle/Serving"


@dataclass(frozen=True)
class MetricField:
    """A numeric field of the line that becomes a CloudWatch metric."""

    key: str  # JSON key in the line
    metric_name: str  # CloudWatch metric name
    unit: str  # CloudWatch unit
    description: str
    # Only present when the value exists for this request (e.g. no spec-decode counts without drafts).
    optional: bool = False


METRIC_FIELDS: tuple[MetricField, ...] = (
    MetricField("ttft_ms", "TimeToFirstToken", "Milliseconds", "time from request arrival to the first output token"),
    MetricField("tpot_ms", "TimePerOutputToken", "Milliseconds",
                "mean time per output token after the first ((e2e - ttft) / (output_tokens - 1))", optional=True),
    MetricField("e2e_ms", "EndToEndLatency", "Milliseconds", "time from request arrival to the last byte"),
    MetricField("prompt_tokens", "PromptTokens", "Count", "tokens in the prompt"),
    MetricField("output_tokens", "OutputTokens", "Count", "tokens generated"),
    MetricField("drafted_tokens", "DraftedTokens", "Count", "draft tokens proposed for this request", optional=True),
    MetricField("accepted_tokens", "AcceptedTokens", "Count", "draft tokens the target accepted", optional=True),
)

# Non-metric fields: who and what, for Logs Insights.
INFO_FIELDS: dict[str, type | tuple[type, ...]] = {
    EVENT_FIELD: str,
    "request_id": str,
    "route": str,  # the HTTP path the request came in on (/invocations, /v1/completions, ...)
    "stream": bool,
    "status": int,  # HTTP status sent
}

METRIC_KEYS = tuple(f.key for f in METRIC_FIELDS)
REQUIRED_KEYS = tuple(INFO_FIELDS) + tuple(f.key for f in METRIC_FIELDS if not f.optional)


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
        value = line.get(f.key)
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
    """CloudWatch Logs JSON filter pattern that selects request lines carrying ``metric``'s field.

    Every metric field is a non-negative number, so ``>= 0`` (the documented numeric comparison) selects
    exactly the lines that carry it; a line without the field, or with a non-number, is not matched.
    """
    return f'{{ ($.{EVENT_FIELD} = "{EVENT_NAME}") && ($.{metric.key} >= 0) }}'


def metric_value(metric: MetricField) -> str:
    return f"$.{metric.key}"
