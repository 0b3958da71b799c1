"""Real server output through the CloudWatch metric filters generated from the request-log schema."""

from __future__ import annotations

import time

import httpx
import pytest
from peagle_contract.request_log import (
    COMPLETED_STREAMS, CUT_SHORT, METRIC_FIELDS, filter_pattern, metric_value, parse_line,
)

import cw_filter

PATTERN_CASES = [
    ('{ ($.event = "peagle.request") && ($.ttft_ms = *) }', '{"event":"peagle.request","ttft_ms":3.5}', True),
    ('{ ($.event = "peagle.request") && ($.ttft_ms = *) }', '{"event":"peagle.request"}', False),
    ('{ ($.event = "peagle.request") && ($.ttft_ms = *) }', '{"event":"other","ttft_ms":3.5}', False),
    ('{ ($.event = "peagle.request") && ($.ttft_ms = *) }', 'INFO 11-29 [loggers.py] ttft_ms=3', False),
    ('{ ($.event = "peagle.request") && ($.ttft_ms = *) }', '["peagle.request"]', False),
    ('{ $.status >= 400 || ($.stream = "x") }', '{"status":404}', True),
    ('{ $.status >= 400 || ($.stream = "x") }', '{"status":200}', False),
    ('{ $.a.b != 3 }', '{"a":{"b":4}}', True),
    ('{ ($.status = 200) && ($.stream IS TRUE) }', '{"status":200,"stream":true}', True),
    ('{ ($.status = 200) && ($.stream IS TRUE) }', '{"status":200,"stream":false}', False),
    ('{ ($.status = 200) && ($.stream IS TRUE) }', '{"status":499,"stream":true}', False),
]


@pytest.mark.parametrize("pattern,line,expected", PATTERN_CASES)
def test_evaluator_knows_the_pattern_subset(pattern, line, expected):
    assert cw_filter.matches(pattern, line) is expected


def _feeds(field, rec: dict) -> bool:
    """Which lines a metric reads, from the schema's words (not from the pattern under test)."""
    if field.lines == CUT_SHORT:
        return rec["status"] != 200
    if rec["status"] != 200 or field.lines == COMPLETED_STREAMS and not rec["stream"]:
        return False
    return field.key is None or field.key in rec


@pytest.mark.engine
def test_filters_read_real_server_output(server):
    with httpx.Client(timeout=120) as client:
        assert client.post(server.base + "/invocations", json={"prompt": "Filters", "max_tokens": 6,
                                                             "ignore_eos": True}).status_code == 200
        with client.stream("POST", server.base + "/invocations",
                           json={"prompt": "Filters", "max_tokens": 5, "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200 and list(r.iter_lines())
        with client.stream("POST", server.base + "/invocations",  # dropped after its first event: cut short
                           json={"prompt": "Filters", "max_tokens": 300, "ignore_eos": True, "stream": True}) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))
        assert client.post(server.base + "/invocations", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    for _ in range(50):  # the dropped stream's line is written once the server sees the connection close
        if any(rec["status"] == 499 for rec in server.request_lines()):
            break
        time.sleep(0.2)
    # Everything the process printed: vLLM's own log lines and ours, as CloudWatch would receive them.
    lines = server.stdout_path.read_text(errors="replace").splitlines()
    records = {i: parse_line(line) for i, line in enumerate(lines) if parse_line(line)}
    assert len(records) >= 3 and len(lines) > len(records)
    assert {r["status"] for r in records.values()} >= {200, 499}
    for field in METRIC_FIELDS:
        pattern = filter_pattern(field)
        selected = [i for i, line in enumerate(lines) if cw_filter.matches(pattern, line)]
        expected = [i for i, rec in records.items() if _feeds(field, rec)]
        assert selected == expected and selected, field.metric_name  # no vLLM log line matches, no line missed
        for i in selected:
            value = records[i][field.key] if field.key is not None else 1
            assert cw_filter.metric_value(metric_value(field), lines[i]) == pytest.approx(value)
    assert all(r["drafted_tokens"] > 0 for r in records.values() if r["status"] == 200)
