"""`python -m ops.capture_export`: a stage's capture records out of its log group, on moto's CloudWatch Logs with
the real boto3 client. moto does not apply JSON filter patterns (it returns every event), so these tests also show
that the exporter's own check keeps only the records."""

from __future__ import annotations

import time

import boto3
import pytest
from moto import mock_aws
from peagle_contract.capture import CaptureConfig, CaptureError, format_record, read_records
from peagle_contract.request_log import format_line

from ops import capture_export

GROUP = "/aws/sagemaker/InferenceComponents/peagle-dev-gpt-oss-20b"
DEV = CaptureConfig(sample_rate=0.05, stage="dev", target="gpt-oss-20b")


def _record(rid: str, config: CaptureConfig = DEV) -> str:
    return format_record(config=config, request_id=rid, route="/v1/chat/completions", stream=True,
                         request={"messages": [{"role": "user", "content": f"question {rid}"}]}, answer=f"answer {rid}",
                         finish_reason="stop", prompt_tokens=3, output_tokens=2)


def _request_line(rid: str) -> str:
    return format_line({"request_id": rid, "route": "/v1/chat/completions", "stream": True, "status": 200,
                        "ttft_ms": 1.0, "e2e_ms": 2.0, "prompt_tokens": 3, "output_tokens": 2})


@pytest.fixture
def logs():
    with mock_aws():
        client = boto3.client("logs", region_name="us-east-1")
        client.create_log_group(logGroupName=GROUP)
        client.create_log_stream(logGroupName=GROUP, logStreamName="i-1")
        yield client


def _put(logs, *messages: str) -> tuple[int, int]:
    now = int(time.time() * 1000)
    logs.put_log_events(logGroupName=GROUP, logStreamName="i-1",
                        logEvents=[{"timestamp": now + i, "message": m} for i, m in enumerate(messages)])
    return now - 1000, now + len(messages) + 1000


def _export(logs, window, out):
    return capture_export.export(logs, log_group=GROUP, out_dir=out, stage="dev", target="gpt-oss-20b",
                                 start_ms=window[0], end_ms=window[1])


def test_only_the_records_are_exported_and_they_read_back_for_the_trainer(logs, tmp_path):
    window = _put(logs, _record("a"), _request_line("a"), "INFO peagle.capture is on", _record("b"), _record("a"))
    result = _export(logs, window, tmp_path)
    assert (result["records"], result["duplicates"], result["log_lines_not_records"]) == (2, 1, 2)
    capture = read_records([tmp_path / result["file"].rsplit("/", 1)[1]], stage="dev", target="gpt-oss-20b")
    assert [r["request_id"] for r in capture.records] == ["a", "b"]
    assert [p.name for p in tmp_path.iterdir()] == [result["file"].rsplit("/", 1)[1]]  # no partial left behind


@pytest.mark.parametrize("bad, message", [
    (lambda: _record("x", CaptureConfig(sample_rate=1.0, stage="prod", target="gpt-oss-20b")), ":2.stage: got 'prod'"),
    (lambda: _record("x", CaptureConfig(sample_rate=1.0, stage="dev", target="qwen3-8b")), ":2.target: got 'qwen3-8b'"),
    (lambda: _record("x")[:-30], ":2: not a whole JSON record"),
], ids=["another-stage", "another-target", "cut"])
def test_a_bad_record_is_refused_by_place_and_nothing_is_written(logs, tmp_path, bad, message):
    window = _put(logs, _record("a"), bad())
    with pytest.raises(CaptureError, match=message):
        _export(logs, window, tmp_path)
    assert list(tmp_path.rglob("*")) == []


def test_a_stage_that_records_nothing_is_refused_by_name(capsys):
    assert capture_export.main(["--env", "Staging", "--out", "unused"]) == 2  # Dev records; Staging does not
    assert "Staging.model.serving.capture: none; this stage records nothing" in capsys.readouterr().err
    assert capture_export.main(["--env", "Nowhere", "--out", "unused"]) == 2
    assert "--env: got 'Nowhere'; allowed: Dev, Staging, Prod" in capsys.readouterr().err
