"""`make stage-candidate`: a candidate the cloud's training passed, picked up from what the state machine published
and staged beside the pinned target as a new content-addressed bundle, on moto's S3 and SSM with the real boto3
client; and what an attacker who can rewrite the published parameter (or a candidate's files) cannot make it stage.

The candidate is made here as models.trainer.training_job makes one (its manifest function, on the random pair's
head plus the report the training writes beside it); the training job itself runs in tests/models."""

from __future__ import annotations

import json
import shutil

import boto3
import pytest
from moto import mock_aws
from peagle_contract.bundle import digest

from models.trainer.training_job import candidate_manifest
from ops import cdk, stage_candidate, train_drafter, verify_bundle
from ops.stage_weights import Source, stage
from stacks.environments import BUNDLE_PREFIXES, DEV
from tests.training_config import trains

ACCOUNT, REGION = "123456789012", "us-east-1"
JOB = "peagle-dev-drafter-6f1c2d3e-0000-4000-8000-000000000000"


@pytest.fixture
def aws(monkeypatch):
    for key in [k for k in __import__("os").environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield boto3.client("s3"), boto3.client("ssm")


@pytest.fixture
def world(untrained, aws, tmp_path, monkeypatch):
    """The pinned bundle in the weights bucket, Dev pinned to it and training, and one passing candidate published."""
    s3, ssm = aws
    prefix = BUNDLE_PREFIXES["dev"]
    s3.create_bucket(Bucket=prefix.split("/")[2])
    pinned = stage(Source(folder=untrained.target, origin="org/target", revision="a" * 40),
                   Source(folder=untrained.drafter, origin="org/p-eagle", revision="b" * 40), prefix, s3=s3,
                   log=lambda line: None)["manifest_sha256"]
    monkeypatch.setattr(stage_candidate, "find_stage", lambda env: trains(DEV, pinned))
    bucket = DEV.capture_bucket_name(ACCOUNT, REGION)
    s3.create_bucket(Bucket=bucket)
    head = tmp_path / "candidate"
    shutil.copytree(untrained.drafter, head)
    (head / "training.json").write_text('{"steps": 12}')  # what the trainer leaves beside a head it trained
    pinned_manifest = s3.get_object(Bucket=prefix.split("/")[2],
                                    Key=f"{prefix.split('/', 3)[3]}{pinned}/manifest.json")["Body"].read()
    manifest = candidate_manifest(pinned_manifest, head, f"train-drafter:{head.name}")
    output = f"candidates/dev/{JOB}/output/model/"
    for path in sorted(head.rglob("*")):
        if path.is_file():
            s3.put_object(Bucket=bucket, Key=f"{output}drafter/{path.relative_to(head).as_posix()}",
                          Body=path.read_bytes())
    s3.put_object(Bucket=bucket, Key=f"{output}manifest.json", Body=manifest)
    s3.put_object(Bucket=bucket, Key=f"{output}gate.json", Body=json.dumps(
        {"gate": "passed", "candidate_sha256": digest(manifest), "al_before": {"value": 1.2}}))
    ssm.put_parameter(Name="/peagle/dev/drafter-candidate", Type="String", Value=json.dumps(
        {"candidate_sha256": digest(manifest), "manifest": f"s3://{bucket}/{output}manifest.json"}))
    repo = tmp_path / "repo"
    (repo / "stacks").mkdir(parents=True)
    shutil.copy(cdk.REPO_ROOT / train_drafter.ENVIRONMENTS_FILE, repo / train_drafter.ENVIRONMENTS_FILE)
    return dict(s3=s3, ssm=ssm, bucket=bucket, output=output, prefix=prefix, pinned=pinned, new=digest(manifest),
                repo=repo, manifest=manifest)


def _staged(world) -> list[str]:
    """The manifests of bundles staged beside the pinned one (a bundle exists when its manifest does)."""
    bucket, key = world["prefix"].split("/")[2], world["prefix"].split("/", 3)[3]
    listed = world["s3"].list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
    return sorted(o["Key"] for o in listed if o["Key"].endswith("/manifest.json") and world["pinned"] not in o["Key"])


def test_the_published_candidate_is_staged_beside_its_target_and_checks_as_the_container_checks(world, capsys):
    assert stage_candidate.main(["--env", "dev", "--repo", str(world["repo"])]) == 0
    verified = verify_bundle.verify(world["s3"], world["prefix"], world["new"])  # every file against the new pin
    assert verified.files >= 5
    kept = world["repo"] / "stacks" / "bundles" / f"{world['new']}.json"
    assert kept.read_bytes() == world["manifest"]
    err = capsys.readouterr().err
    assert f'+PINNED_BUNDLES' in err and f'"dev": "{world["new"]}"' in err
    # Again: the bundle is there, nothing is written over it.
    assert stage_candidate.main(["--env", "dev", "--repo", str(world["repo"])]) == 0
    assert '"existing": true' in capsys.readouterr().out


def _forge_parameter(world, bucket: str) -> None:
    world["s3"].create_bucket(Bucket=bucket)
    world["ssm"].put_parameter(Name="/peagle/dev/drafter-candidate", Type="String", Overwrite=True, Value=json.dumps(
        {"manifest": f"s3://{bucket}/{world['output']}manifest.json"}))


ATTACKS = {
    # Whoever may put the parameter points it at a bucket of theirs holding a head the gate never measured.
    "the parameter names another bucket": (lambda w: _forge_parameter(w, "mallory-candidates"), "candidate: got"),
    "the parameter names another stage's prefix": (lambda w: w["ssm"].put_parameter(
        Name="/peagle/dev/drafter-candidate", Type="String", Overwrite=True, Value=json.dumps(
            {"manifest": f"s3://{w['bucket']}/candidates/prod/{JOB.replace('dev', 'prod')}/output/model/"
                         "manifest.json"})), "candidate: got"),
    # A head's bytes changed after its manifest was written.
    "a drafter file changed": (lambda w: w["s3"].put_object(
        Bucket=w["bucket"], Key=f"{w['output']}drafter/config.json", Body=b'{"architectures": ["x"]}'),
        "not the bytes the candidate's manifest lists"),
    # A report of a refused gate, or of another manifest.
    "the gate refused it": (lambda w: w["s3"].put_object(Bucket=w["bucket"], Key=f"{w['output']}gate.json",
                                                         Body=json.dumps({"gate": "refused"})), "allowed: 'passed'"),
    "the report passed another manifest": (lambda w: w["s3"].put_object(
        Bucket=w["bucket"], Key=f"{w['output']}gate.json",
        Body=json.dumps({"gate": "passed", "candidate_sha256": "cd" * 32})), "allowed: the manifest the gate passed"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_what_an_attacker_rewrites_is_refused_and_nothing_is_staged(world, attack, capsys):
    forge, message = ATTACKS[attack]
    forge(world)
    assert stage_candidate.main(["--env", "dev", "--repo", str(world["repo"])]) == 2
    assert message in capsys.readouterr().err
    assert _staged(world) == [] and not (world["repo"] / "stacks" / "bundles").exists()


def test_a_manifest_that_swaps_the_target_is_refused_even_with_a_matching_report(world, capsys):
    """A candidate's manifest names the target too: one listing other target bytes would serve another model."""
    body = json.loads(world["manifest"])
    first = next(f for f in body["files"] if f["path"].startswith("target/"))
    first["sha256"] = "ee" * 32
    forged = (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()
    s3 = world["s3"]
    s3.put_object(Bucket=world["bucket"], Key=f"{world['output']}manifest.json", Body=forged)
    s3.put_object(Bucket=world["bucket"], Key=f"{world['output']}gate.json",
                  Body=json.dumps({"gate": "passed", "candidate_sha256": digest(forged)}))
    assert stage_candidate.main(["--env", "dev", "--repo", str(world["repo"])]) == 2
    assert "that is not the pinned one" in capsys.readouterr().err and _staged(world) == []


def test_a_stage_whose_weights_are_not_pinned_has_nothing_to_stage_beside(world, monkeypatch, capsys):
    monkeypatch.setattr(stage_candidate, "find_stage", lambda env: DEV)  # as committed: unpinned
    assert stage_candidate.main(["--env", "dev", "--repo", str(world["repo"])]) == 2
    assert "Dev: its weights are not pinned" in capsys.readouterr().err
