"""checkov (Prisma Cloud's open-source scanner, its CloudFormation checks) on every stage's synthesized
template: a judge nobody here wrote, beside cdk-nag, the Control Tower Guard rules (synth plugins) and
cfn-lint. It runs from a venv of its own (`make setup`: it pins an older boto3), offline; the checks it
may skip are acknowledged, each with its reason, in peagle_constructs.security.CHECKOV_ACKNOWLEDGED."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from peagle_constructs.security import CHECKOV_ACKNOWLEDGED

CHECKOV = Path(__file__).resolve().parents[2] / ".venv-checkov" / "bin" / "checkov"


def _checkov(directory: Path) -> dict:
    assert CHECKOV.is_file(), f"no checkov at {CHECKOV}: `make setup` installs it (requirements-checkov.txt)"
    cmd = [str(CHECKOV), "-d", str(directory), "--framework", "cloudformation", "--skip-download", "--quiet",
           "--compact", "-o", "json"]
    for check in CHECKOV_ACKNOWLEDGED:
        cmd += ["--skip-check", check]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), f"checkov crashed ({proc.returncode}): {proc.stderr[-2000:]}"
    report = json.loads(proc.stdout)
    (found,) = [r for r in (report if isinstance(report, list) else [report]) if r["check_type"] == "cloudformation"]
    return found


def test_checkov_finds_nothing_in_any_stage(synthesized_app):
    report = _checkov(Path(synthesized_app.outdir))
    failed = [(c["check_id"], c["resource"], c["file_path"]) for c in report["results"]["failed_checks"]]
    assert failed == [], failed
    summary = report["summary"]
    assert summary["parsing_errors"] == 0 and summary["passed"] >= 50 and summary["resource_count"] >= 90, summary
    assert all(len(reason) > 40 for reason in CHECKOV_ACKNOWLEDGED.values())


def test_checkov_can_fail(tmp_path):
    """Negative control: a key without rotation, an unencrypted topic and log group must fail."""
    (tmp_path / "bad.template.json").write_text(json.dumps({"Resources": {
        "Key": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "kms:*", "Resource": "*"}]}}},
        "Topic": {"Type": "AWS::SNS::Topic", "Properties": {}},
        "Logs": {"Type": "AWS::Logs::LogGroup", "Properties": {}},
    }}))
    failed = {c["check_id"] for c in _checkov(tmp_path)["results"]["failed_checks"]}
    assert {"CKV_AWS_7", "CKV_AWS_26", "CKV_AWS_158"} <= failed, failed
