"""The per-request log line: what the runtime may print and what the metric filters read."""

import json

import pytest

from peagle_contract.request_log import (
    EVENT_NAME,
    METRIC_FIELDS,
    RequestLogError,
    filter_pattern,
    metric_value,
    format_line,
    parse_line,
)

RECORD = dict(request_id="r-1", route="/invocations", stream=True, status=200, ttft_ms=12.3456, tpot_ms=3.2,
              e2e_ms=80.0, prompt_tokens=7, output_tokens=22, drafted_tokens=30, accepted_tokens=18)


def test_line_is_single_line_json_with_the_schema_fields():
    line = format_line(RECORD)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["event"] == EVENT_NAME and obj["ttft_ms"] == 12.346 and obj["output_tokens"] == 22
    assert parse_line(line) == obj
    assert parse_line("INFO 12-01 started") is None and parse_line('{"event":"other"}') is None


def test_optional_metrics_are_left_out_when_unknown():
    record = {k: v for k, v in RECORD.items() if k not in ("drafted_tokens", "accepted_tokens", "tpot_ms")}
    obj = json.loads(format_line(record))
    assert "drafted_tokens" not in obj and "tpot_ms" not in obj


@pytest.mark.parametrize(
    ("change", "message"),
    [({"latency": 1}, "unknown"), ({"ttft_ms": None}, "missing"), ({"ttft_ms": -1}, "non-negative"),
     ({"status": "200"}, "status"), ({"output_tokens": True}, "non-negative")],
)
def test_bad_records_are_refused(change, message):
    with pytest.raises(RequestLogError, match=message):
        format_line({**RECORD, **change})


def test_every_metric_field_has_a_pattern_on_its_own_key():
    names = [f.metric_name for f in METRIC_FIELDS]
    assert len(set(names)) == len(names)
    for f in METRIC_FIELDS:
        pattern = filter_pattern(f)
        assert EVENT_NAME in pattern and "= *" not in pattern
        if f.key is None:  # a count of the lines a request cut short
            assert "($.status != 200)" in pattern and metric_value(f) == "1"
        else:  # CloudWatch's documented numeric comparison, on completed requests only
            assert f"($.{f.key} >= 0)" in pattern and "($.status = 200)" in pattern
    ttft = next(f for f in METRIC_FIELDS if f.key == "ttft_ms")
    assert "($.stream IS TRUE)" in filter_pattern(ttft)  # a whole body's first text leaves with its last
