"""`python -m ops.verify_bundle` (what `make verify-bundle` runs) against moto's S3 in-process: a staged bundle
verifies; each attack on its objects ends in exit 1 with the object named; usage errors end in exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import boto3
import pytest

from ops import verify_bundle
from ops.stage_weights import Source, stage

BUCKET = "peagle-weights-verify"
PREFIX = f"s3://{BUCKET}/bundles/tiny/"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def staged(moto_region, untrained):
    """A bundle staged into moto's S3: (client, its key prefix, the pin)."""
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name=moto_region)
        s3.create_bucket(Bucket=BUCKET)
        result = stage(Source(untrained.target, "target", None), Source(untrained.drafter, "drafter", None), PREFIX,
                       s3=s3, log=lambda line: None)
        yield s3, result["bundle"][len(f"s3://{BUCKET}/"):], result["manifest_sha256"]


def _verify(capsys, *args: str) -> tuple[int, str, str]:
    status = verify_bundle.main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_staged_bundle_verifies_with_one_line_of_what_was_hashed(staged, capsys, untrained):
    _, key, pin = staged
    status, out, err = _verify(capsys, "--bundle", PREFIX, "--sha256", pin, "--threads", "4")
    files = sum(1 for p in [*untrained.target.rglob("*"), *untrained.drafter.rglob("*")] if p.is_file())
    assert status == 0, err
    assert out.startswith(f"verified {PREFIX}{pin}/: {files} files, ") and out.rstrip().endswith("4 threads)")


def _flip_a_byte(s3, key):
    obj = f"{key}drafter/model.safetensors"
    data = bytearray(s3.get_object(Bucket=BUCKET, Key=obj)["Body"].read())
    data[100] ^= 1
    s3.put_object(Bucket=BUCKET, Key=obj, Body=bytes(data))


ATTACKS = [
    ("changed-byte", _flip_a_byte, "drafter/model.safetensors: sha256 expected"),
    ("missing", lambda s3, key: s3.delete_object(Bucket=BUCKET, Key=f"{key}target/config.json"),
     "target/config.json: missing; expected"),
    ("extra-at-root", lambda s3, key: s3.put_object(Bucket=BUCKET, Key=f"{key}README", Body=b"hi"),
     "README: a file at the bundle root"),
    ("extra-in-target", lambda s3, key: s3.put_object(Bucket=BUCKET, Key=f"{key}target/x.bin", Body=b"hi"),
     "target/x.bin: not in the manifest; found a file of 2 bytes"),
    ("model-py", lambda s3, key: s3.put_object(Bucket=BUCKET, Key=f"{key}drafter/model.py", Body=b"import os"),
     "drafter/model.py: a file named model.py"),
    ("incomplete", lambda s3, key: s3.delete_object(Bucket=BUCKET, Key=f"{key}manifest.json"),
     "manifest.json: missing (an incomplete bundle"),
]


@pytest.mark.parametrize("name,attack,message", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_each_attack_exits_1_naming_the_object(staged, capsys, name, attack, message):
    s3, key, pin = staged
    attack(s3, key)
    status, out, err = _verify(capsys, "--bundle", PREFIX, "--sha256", pin)
    assert status == 1 and not out
    lines = err.splitlines()
    assert lines[0].startswith(f"verify-bundle: NOT VERIFIED: {PREFIX}{pin}/ is not the bundle SHA256 pins (1 problem")
    assert lines[1].startswith(f"  {message}"), err


def test_another_pin_is_not_this_bundle(staged, capsys):
    status, _, err = _verify(capsys, "--bundle", PREFIX, "--sha256", "0" * 64)
    assert status == 1 and "manifest.json: missing" in err  # nothing was staged under that digest


@pytest.mark.parametrize("args,message", [
    (["--bundle", PREFIX, "--sha256", "ABC"], "SHA256: got 'ABC'; allowed: a SHA-256 digest, 64 lowercase hex"),
    (["--bundle", f"s3://{BUCKET}/", "--sha256", "0" * 64], "BUNDLE: got "),
    (["--bundle", "/local/folder", "--sha256", "0" * 64], "allowed: 's3://bucket/prefix/'"),
    (["--bundle", "s3://no-such-bucket-here/x/", "--sha256", "0" * 64], "BUNDLE: could not list"),
    (["--bundle", PREFIX, "--sha256", "0" * 64, "--threads", "0"], "--threads: got 0"),
])
def test_usage_errors_exit_2_naming_the_argument(staged, capsys, args, message):
    status, _, err = _verify(capsys, *args)
    assert status == 2 and message in err, err


def test_make_verify_bundle_runs_this_module_on_the_prefix_and_digest():
    dry = subprocess.run(["make", "-n", "verify-bundle", f"BUNDLE={PREFIX}", f"SHA256={'a' * 64}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert f'-m ops.verify_bundle --bundle "{PREFIX}" --sha256 "{"a" * 64}"' in dry.stdout
