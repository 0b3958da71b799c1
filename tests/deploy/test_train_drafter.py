"""`python -m ops.train_drafter` (`make train-drafter`): where a capture is read from, what is refused before any
training, the staging of a candidate beside its target on moto's S3 with the real boto3 client, and the pin change
it prints, applied with git. The gate's own run on vLLM is tests/models/test_traffic_training.py's."""

from __future__ import annotations

import json
import shutil
import subprocess

import boto3
import pytest
from moto import mock_aws
from peagle_contract.bundle import BundleError
from peagle_contract.capture import CaptureConfig, format_record

from ops import cdk, train_drafter

PIN = "ab" * 32


def _record(rid: str, stage: str = "dev", target: str = "peagle-local") -> str:
    return format_record(config=CaptureConfig(sample_rate=1.0, stage=stage, target=target), request_id=rid,
                         route="/v1/completions", stream=False, request={"prompt": f"question {rid}"},
                         answer=f"answer {rid}", finish_reason="stop", prompt_tokens=3, output_tokens=2)


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="captures")
        yield client


def test_an_s3_key_names_no_path_here(s3, tmp_path):
    # Whoever can write the prefix chooses the keys: one that climbs out must still land inside the work folder.
    s3.put_object(Bucket="captures", Key="dev/../../../../escape.jsonl", Body=b"climbed\n")
    s3.put_object(Bucket="captures", Key="dev/2026/12/07/a.jsonl", Body=b"plain\n")
    work = tmp_path / "work"
    files = train_drafter.capture_files(["s3://captures/dev/"], work, s3=s3)
    assert sorted(f.read_bytes() for f in files) == [b"climbed\n", b"plain\n"]
    assert {f.parent for f in files} == {work / "capture" / "s3-0"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_an_object_that_is_no_capture_file_is_refused_by_name(s3, tmp_path):
    s3.put_object(Bucket="captures", Key="dev/a.jsonl", Body=b"\n")
    s3.put_object(Bucket="captures", Key="dev/notes.txt", Body=b"?")
    with pytest.raises(train_drafter.TrainDrafterError, match=r"1 objects that are not capture files \('dev/notes"):
        train_drafter.capture_files(["s3://captures/dev/"], tmp_path, s3=s3)
    with pytest.raises(train_drafter.TrainDrafterError, match="no .jsonl object below s3://captures/empty/"):
        train_drafter.capture_files(["s3://captures/empty/"], tmp_path, s3=s3)


def test_a_capture_too_big_to_copy_down_is_refused_before_a_byte_is_copied(s3, tmp_path):
    s3.put_object(Bucket="captures", Key="dev/a.jsonl", Body=b"x" * 100)
    with pytest.raises(train_drafter.TrainDrafterError, match="holds 100 bytes in 1 objects; allowed: at most 99"):
        train_drafter._s3_capture("s3://captures/dev/", tmp_path / "into", s3, max_bytes=99)
    assert not (tmp_path / "into").exists()


def test_a_local_folder_holds_capture_files_only(tmp_path):
    (tmp_path / "a.jsonl").write_text(_record("a") + "\n")
    (tmp_path / ".partial").mkdir()  # capture-export's, while it writes
    assert train_drafter.capture_files([str(tmp_path)], tmp_path / "w") == [tmp_path / "a.jsonl"]
    (tmp_path / "b.json").write_text("{}")
    with pytest.raises(train_drafter.TrainDrafterError, match=r"1 entries that are not capture files \(b\.json\)"):
        train_drafter.capture_files([str(tmp_path)], tmp_path / "w")
    with pytest.raises(train_drafter.TrainDrafterError, match="is not a folder"):
        train_drafter.capture_files([str(tmp_path / "a.jsonl")], tmp_path / "w")


def _repo_copy(tmp_path):
    repo = tmp_path / "repo"
    (repo / "stacks").mkdir(parents=True)
    shutil.copy(cdk.REPO_ROOT / train_drafter.ENVIRONMENTS_FILE, repo / train_drafter.ENVIRONMENTS_FILE)
    return repo


def _pins(repo) -> str:
    return next(line for line in (repo / train_drafter.ENVIRONMENTS_FILE).read_text().splitlines()
                if line.startswith("PINNED_BUNDLES"))


def test_the_printed_pin_change_applies_with_git_and_pins_that_stage_only(tmp_path):
    repo = _repo_copy(tmp_path)
    before = _pins(repo)
    patch = train_drafter.pin_change("dev", PIN, repo=repo)
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=repo, check=True)
    after = _pins(repo)
    assert after == before.replace('"dev": None', f'"dev": "{PIN}"') != before  # that stage's entry, no other
    assert train_drafter.pin_change("dev", PIN, repo=repo) == ""  # pinned to it already: nothing to change
    repinned = train_drafter.pin_change("dev", "cd" * 32, repo=repo)
    assert '-PINNED_BUNDLES' in repinned and f'"dev": "{"cd" * 32}"' in repinned
    with pytest.raises(BundleError, match="pin: got 'not-a-digest'"):
        train_drafter.pin_change("dev", "not-a-digest", repo=repo)
    with pytest.raises(train_drafter.TrainDrafterError, match="no one PINNED_BUNDLES line with a 'qa' entry"):
        train_drafter.pin_change("qa", PIN, repo=repo)


def test_a_candidate_is_staged_beside_its_target_as_a_new_bundle(untrained, s3, tmp_path, monkeypatch):
    monkeypatch.setattr(boto3, "client", lambda *a, **k: s3)  # the stager makes its own client: moto's
    s3.create_bucket(Bucket="weights")
    staged = train_drafter.stage_candidate(target=untrained.target, candidate=untrained.drafter,
                                           bundle="s3://weights/bundles/dev/", log=lambda line: None)
    pin = staged["manifest_sha256"]
    manifest = json.loads(s3.get_object(Bucket="weights", Key=f"bundles/dev/{pin}/manifest.json")["Body"].read())
    assert {f["path"].split("/")[0] for f in manifest["files"]} == {"target", "drafter"}
    assert manifest["sources"]["drafter"]["source"] == f"train-drafter:{untrained.drafter.name}"
    again = train_drafter.stage_candidate(target=untrained.target, candidate=untrained.drafter,
                                          bundle="s3://weights/bundles/dev/", log=lambda line: None)
    assert again["existing"] and again["uploaded"] == 0  # nothing written over


def _models(tmp_path):
    for name in ("target", "drafter"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    return ["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter")]


@pytest.mark.parametrize("args, message", [
    (["--env", "qa"], "--env: got 'qa'; allowed: Dev, Staging, Prod"),
    # Dev records its traffic, so its capture names the target; Staging records nothing, so it names none.
    ([], "capture.jsonl:1.target: got 'peagle-local'; allowed: 'gpt-oss-20b'"),
    (["--env", "staging"], "Staging.model.serving.capture: none, so no target name"),
    (["--served-name", "peagle-local", "--k", "0"], "--k: got 0; allowed: 1 to 32"),
    (["--served-name", "peagle-local", "--margin", "0.9"], "--margin: got 0.9; allowed: a number >= 1"),
    (["--served-name", "peagle-local", "--bundle", "weights/bundle/"], "--bundle: got 'weights/bundle/'; allowed: s3://"),
    (["--served-name", "other-model"], "capture.jsonl:1.target: got 'peagle-local'; allowed: 'other-model'"),
])
def test_bad_input_is_refused_before_any_training(tmp_path, capsys, args, message):
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "capture.jsonl").write_text(_record("a") + "\n")
    argv = ["--env", "dev", "--capture", str(capture), "--work", str(tmp_path / "work"), *_models(tmp_path)]
    assert train_drafter.main(argv + args) == 2
    err = capsys.readouterr().err
    assert message in err and "nothing staged" in err
    assert not (tmp_path / "work" / "features").exists()


def test_a_capture_of_another_stage_is_refused_by_record_and_field(tmp_path, capsys):
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "capture.jsonl").write_text(_record("a") + "\n" + _record("b", stage="prod") + "\n")
    argv = ["--env", "dev", "--capture", str(capture), "--served-name", "peagle-local", *_models(tmp_path),
            "--work", str(tmp_path / "work")]
    assert train_drafter.main(argv) == 2
    assert "capture.jsonl:2.stage: got 'prod'; allowed: 'dev'" in capsys.readouterr().err


@pytest.mark.engine
def test_a_candidate_the_gate_refuses_exits_1_with_both_figures_and_stages_nothing(untrained, s3, tmp_path, capsys,
                                                                                   monkeypatch):
    monkeypatch.setattr(boto3, "client", lambda *a, **k: s3)
    s3.create_bucket(Bucket="weights")
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "capture.jsonl").write_text("".join(
        format_record(config=CaptureConfig(sample_rate=1.0, stage="dev", target="random-pair"), request_id=f"r{i}",
                      route="/v1/completions", stream=False, request={"prompt": f"Once upon a time, number {i},"},
                      answer=f" there was a model, the {i}th", finish_reason="length", prompt_tokens=8,
                      output_tokens=8) + "\n" for i in range(40)))
    argv = ["--env", "dev", "--capture", str(capture), "--served-name", "random-pair", "--target",
            str(untrained.target), "--drafter", str(untrained.drafter), "--k", "3", "--cpu-seconds", "2",
            "--max-tokens", "8", "--margin", "1000", "--bundle", "s3://weights/bundles/dev/",
            "--work", str(tmp_path / "work")]
    assert train_drafter.main(argv) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["gate"] == "refused" and report["requests_held_out"] == 8 and "staged" not in report
    assert "the candidate is not staged: AL" in err and "must reach 1000" in err
    assert s3.list_objects_v2(Bucket="weights").get("KeyCount", 0) == 0
