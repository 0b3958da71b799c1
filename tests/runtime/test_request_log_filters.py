"""Real server output through the CloudWatch metric filters generated from the request-log schema."""

from __future__ import annotations

import httpx
import pytest
from peagle_contract.request_log import METRIC_FIELDS, filter_pattern, metric_value, parse_line

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
]


@pytest.mark.parametrize("pattern,line,expected", PATTERN_CASES)
def test_evaluator_knows_the_pattern_subset(pattern, line, expected):
    assert cw_filter.matches(pattern, line) is expected


@pytest.mark.engine
def test_filters_read_real_server_output(server):
    with httpx.Client(timeout=120) as client:
        assert client.post(server.base + "/invocations", json={"prompt": "Filters", "max_tokens": 6,
                                                             "ignore_eos": True}).status_code == 200
        with client.stream("POST", server.base + "/invocations",
                           json={"prompt": "Filters", "max_tokens": 5, "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200 and list(r.iter_lines())
        assert client.post(server.base + "/invocations", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    # Everything the process printed: vLLM's own log lines and ours, as CloudWatch would receive them.
    lines = server.stdout_path.read_text(errors="replace").splitlines()
    records = {i: parse_line(line) for i, line in enumerate(lines) if parse_line(line)}
    assert len(records) >= 2 and len(lines) > len(records)
    assert [r["output_tokens"] for r in records.values()][-2:] == [6, 5]
    for field in METRIC_FIELDS:
        pattern = filter_pattern(field)
        selected = [i for i, line in enumerate(lines) if cw_filter.matches(pattern, line)]
        with_field = [i for i, rec in records.items() if field.key in rec]
        assert selected == with_field, field.key  # no vLLM log line matches; no request line is missed
        if not field.optional:
            assert selected == sorted(records), field.key
        for i in selected:
            assert cw_filter.metric_value(metric_value(field), lines[i]) == pytest.approx(records[i][field.key])
    assert all(r["drafted_tokens"] > 0 for r in records.values())
