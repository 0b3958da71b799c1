"""The emulator process: moto_server with the extension loaded, started and stopped by its pid file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import pytest

from harness.aws import server

ALARM_TEMPLATE = {"Resources": {"Alarm": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
    "AlarmName": "peagle-ttft", "Namespace": "PEagle/Serving", "MetricName": "TimeToFirstToken",
    "Statistic": "Average", "Period": 60, "EvaluationPeriods": 1, "Threshold": 1000,
    "ComparisonOperator": "GreaterThanThreshold"}}}}


@pytest.mark.slow
def test_server_loads_the_extension_and_stops_by_pid(tmp_path: Path) -> None:
    emulator = server.start(state_dir=tmp_path, account="111111111111")
    try:
        state = json.loads((tmp_path / "emulator.json").read_text())
        assert state["pid"] == emulator.pid and state["port"] == emulator.port
        assert server.running(tmp_path) == emulator
        # A second start from the same state dir reuses the running one; another account is refused.
        assert server.start(state_dir=tmp_path, account="111111111111").pid == emulator.pid
        with pytest.raises(server.EmulatorError, match="already running"):
            server.start(state_dir=tmp_path, account="222222222222")

        env = emulator.client_environment({})
        session = boto3.Session(aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key="x",
                                region_name=env["AWS_REGION"])
        assert session.client("sts", endpoint_url=emulator.url).get_caller_identity()["Account"] == "111111111111"
        cfn = session.client("cloudformation", endpoint_url=emulator.url)
        cfn.create_stack(StackName="alarm", TemplateBody=json.dumps(ALARM_TEMPLATE))
        # Without the extension moto_server reports CREATE_COMPLETE and holds no alarm.
        alarms = session.client("cloudwatch", endpoint_url=emulator.url).describe_alarms()["MetricAlarms"]
        assert [a["AlarmName"] for a in alarms] == ["peagle-ttft"]
    finally:
        pid = server.stop(state_dir=tmp_path)
    assert pid == emulator.pid
    assert not (tmp_path / "emulator.json").exists()
    assert not Path(f"/proc/{pid}").exists() or b"harness.aws.server" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert server.stop(state_dir=tmp_path) is None  # nothing left to stop


def test_client_environment_never_reads_real_credentials() -> None:
    emulator = server.Emulator(pid=1, port=4566, account="111111111111", region="us-east-1", log="x")
    env = emulator.client_environment({"AWS_PROFILE": "prod", "AWS_ROLE_ARN": "arn:aws:iam::1:role/x", "PATH": "/bin"})
    assert "AWS_PROFILE" not in env and "AWS_ROLE_ARN" not in env and env["PATH"] == "/bin"
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == os.devnull and env["AWS_ENDPOINT_URL"] == "http://localhost:4566"
