"""`python -m models.trainer.training_job train` (the drafter's SageMaker training job) on a folder laid out like
/opt/ml: what it refuses before any training and how it says so (output/failure, exit 2, nothing in model/), the
capture found in Firehose's dated folders, and its outputs: a passed candidate's manifest is the one the stager
writes (moto's S3) for the bundle's target and the job's drafter/. The last test trains and gates on vLLM."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from peagle_contract import training_job as contract
from peagle_contract.training_job import CHECKPOINTS_DIR
from peagle_contract.bundle import DRAFTER_DIR, MANIFEST_NAME, TARGET_DIR, digest, parse_manifest
from peagle_contract.capture import CaptureConfig, format_record

from models.trainer import traffic_training, training_job
from ops.stage_weights import Source, stage
from tests.bundle_helpers import mount_bundle

CONFIG = CaptureConfig(sample_rate=1.0, stage="dev", target="random-pair")
REPO = Path(__file__).resolve().parents[2]
DAYS = ("2026/12/06/21", "2026/12/07/09")  # Firehose's dated folders


def _records(n: int) -> list[str]:
    return [format_record(config=CONFIG, request_id=f"r{i}", route="/v1/completions", stream=False,
                          request={"prompt": f"Once upon a time, number {i},"},
                          answer=f" there was a little model, the {i}th, that drafted {7 * i} tokens a day",
                          finish_reason="length", prompt_tokens=8, output_tokens=16) for i in range(n)]


def _job(tmp_path: Path, pair, monkeypatch, *, records: int = 48, sources: bool = True, **overrides) -> Path:
    """A root laid out as SageMaker lays out /opt/ml: the bundle of ``pair`` pinned, the capture in two days."""
    root = tmp_path / "ml"
    bundle = root / contract.CHANNELS_DIR / contract.BUNDLE_CHANNEL
    bundle.mkdir(parents=True)
    pin = mount_bundle(bundle, pair.target, pair.drafter, sources=sources)
    lines = _records(records)
    for index, day in enumerate(DAYS):
        folder = root / contract.CHANNELS_DIR / contract.CAPTURE_CHANNEL / day
        folder.mkdir(parents=True)
        (folder / f"peagle-capture-{index}.jsonl").write_text("\n".join(lines[index::2]) + "\n")
    hyper = contract.render_hyperparameters(contract.TrainingJobConfig(
        stage="dev", target_name="random-pair", k=3, margin=1.0, max_tokens=16, bundle_sha256=pin, cpu_seconds=4.0))
    hyper = {k: v for k, v in {**hyper, **overrides}.items() if v is not None}
    (root / contract.HYPERPARAMETERS_FILE).parent.mkdir(parents=True)
    (root / contract.HYPERPARAMETERS_FILE).write_text(json.dumps(hyper))
    (root / contract.MODEL_DIR).mkdir()  # SageMaker's, empty
    monkeypatch.setenv(training_job.ROOT_VAR, str(root))
    return root


def _refused(root: Path) -> str:
    assert training_job.main(["train"]) == 2
    reason = (root / contract.FAILURE_FILE).read_text()
    assert "\n" not in reason and len(reason) <= contract.MAX_FAILURE_CHARS
    assert list((root / contract.MODEL_DIR).iterdir()) == []
    return reason


@pytest.fixture
def no_training(monkeypatch):
    def run(**kwargs):
        raise AssertionError("trained on input that should have been refused")

    monkeypatch.setattr(traffic_training, "run", run)


@pytest.mark.parametrize("overrides, field, message", [
    ({"epochs": "3"}, contract.HYPERPARAMETERS_FILE, "unknown keys ['epochs']"),
    ({contract.HP_K: "7.0"}, contract.HP_K, "got '7.0'; allowed: a whole number"),
    ({contract.HP_BUNDLE_SHA256: None}, contract.HYPERPARAMETERS_FILE, "missing ['bundle_sha256']"),
    ({contract.HP_MARGIN: "nan"}, contract.HP_MARGIN, "got 'nan'"),
    ({contract.HP_STAGE: "dev\n" + "x" * 5000}, contract.HP_STAGE, "allowed: 1-128 of letters"),
])
def test_bad_hyperparameters_fail_the_job_naming_the_field(untrained, tmp_path, monkeypatch, no_training, overrides,
                                                           field, message):
    root = _job(tmp_path, untrained, monkeypatch, **overrides)
    reason = _refused(root)
    assert reason.startswith(f"{field}: ") and message in reason
    assert len(reason) < 400  # a value quoted short, never whole


def test_the_hyperparameters_are_read_before_the_bundle(untrained, tmp_path, monkeypatch, no_training):
    root = _job(tmp_path, untrained, monkeypatch, **{contract.HP_K: "0"})
    shutil.rmtree(root / contract.CHANNELS_DIR / contract.BUNDLE_CHANNEL)
    assert _refused(root).startswith("k: got 0")


def test_sagemaker_runs_it_with_train_and_nothing_else(untrained, tmp_path, monkeypatch, no_training):
    root = _job(tmp_path, untrained, monkeypatch, **{contract.HP_K: "7.0"})
    assert training_job.main(["serve"]) == 2
    assert "allowed: none or 'train'" in (root / contract.FAILURE_FILE).read_text()
    # As SageMaker runs the image: the module, in a process of its own, refusing before torch is imported.
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "models.trainer.training_job", "train"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and (root / contract.FAILURE_FILE).read_text().startswith("k: got '7.0'")
    assert "training-job: failed: k: got '7.0'" in done.stderr and not re.search(r"\| +torch$", done.stderr, re.M)


def test_a_bundle_that_is_not_the_pinned_one_is_refused_naming_each_file(untrained, tmp_path, monkeypatch,
                                                                         no_training):
    root = _job(tmp_path, untrained, monkeypatch)
    bundle = root / contract.CHANNELS_DIR / contract.BUNDLE_CHANNEL
    config = bundle / TARGET_DIR / "config.json"
    data = bytearray(config.read_bytes())
    data[10] ^= 1  # one byte, same size
    config.write_bytes(bytes(data))
    (bundle / DRAFTER_DIR / "extra.bin").write_bytes(b"x")
    (bundle / DRAFTER_DIR / "tokenizer.json").unlink()
    reason = _refused(root)
    assert reason.startswith(f"{contract.HP_BUNDLE_SHA256}: pins manifest ") and "(3 problems)" in reason
    assert "target/config.json: sha256 expected" in reason
    assert "drafter/extra.bin: not in the manifest" in reason and "drafter/tokenizer.json: missing" in reason


def test_a_pinned_manifest_that_names_no_target_origin_is_refused_before_training(untrained, tmp_path, monkeypatch,
                                                                                  no_training):
    # The candidate's manifest names the pinned target's origin; a manifest without one was not the stager's.
    root = _job(tmp_path, untrained, monkeypatch, sources=False)
    assert "manifest.json: sources.target: allowed:" in _refused(root)


def test_a_capture_file_that_is_not_jsonl_is_refused_by_name(untrained, tmp_path, monkeypatch, no_training):
    root = _job(tmp_path, untrained, monkeypatch)
    capture = root / contract.CHANNELS_DIR / contract.CAPTURE_CHANNEL
    (capture / DAYS[1] / "notes.txt").write_text("?")
    (capture / DAYS[0] / ("a" * 200 + ".json")).write_text("{}")
    reason = _refused(root)
    assert reason.startswith("capture: holds 2 entries that are not capture files (2026/12/06/21/aaaa")
    assert "2026/12/07/09/notes.txt" in reason and "a" * 100 not in reason  # names shortened
    shutil.rmtree(capture)
    capture.mkdir()
    (capture / "2026").mkdir()
    assert _refused(root) == "capture: holds no .jsonl file; allowed: a prefix Firehose delivered to"


def test_a_capture_record_of_another_stage_fails_the_job_naming_file_line_and_field(untrained, tmp_path,
                                                                                    monkeypatch):
    root = _job(tmp_path, untrained, monkeypatch, **{contract.HP_STAGE: "prod"})
    reason = _refused(root)  # read by traffic_training, before any feature is computed
    assert reason == "peagle-capture-0.jsonl:1.stage: got 'dev'; allowed: 'prod', the stage this capture is read for"
    assert not any((root / CHECKPOINTS_DIR).glob("features-*"))


def test_a_failure_of_the_job_itself_is_named_by_its_kind_not_its_message(untrained, tmp_path, monkeypatch):
    root = _job(tmp_path, untrained, monkeypatch)

    def run(**kwargs):
        raise RuntimeError("a message that may quote a captured prompt")

    monkeypatch.setattr(traffic_training, "run", run)
    with pytest.raises(RuntimeError):  # so the job fails, its traceback in the log
        training_job.main(["train"])
    reason = (root / contract.FAILURE_FILE).read_text()
    assert reason == "internal error: RuntimeError (the job's log has the traceback)"
    assert list((root / contract.MODEL_DIR).iterdir()) == []


def _fake_run(gate: str, candidate: Path, seen: dict):
    def run(**kwargs):
        seen.update(kwargs)
        return {"gate": gate, "al_ratio": {"value": 1.0, "interval": [1.0, 1.0]}, "candidate": str(candidate),
                "training": {"steps": 1}}

    return run


def test_a_refused_gate_is_the_job_s_answer_not_its_failure(untrained, tmp_path, monkeypatch):
    root = _job(tmp_path, untrained, monkeypatch)
    seen: dict = {}
    monkeypatch.setattr(traffic_training, "run", _fake_run("refused", tmp_path / "candidate-x", seen))
    assert training_job.main([]) == 0
    capture = root / contract.CHANNELS_DIR / contract.CAPTURE_CHANNEL
    assert seen["capture"] == [capture / DAYS[0] / "peagle-capture-0.jsonl",
                               capture / DAYS[1] / "peagle-capture-1.jsonl"]  # found in both dated folders
    assert seen["work"] == root / CHECKPOINTS_DIR
    assert seen["target"] == root / contract.CHANNELS_DIR / contract.BUNDLE_CHANNEL / TARGET_DIR
    assert (seen["k"], seen["margin"], seen["cpu_seconds"], seen["max_tokens"]) == (3, 1.0, 4.0, 16)
    report = json.loads((root / contract.MODEL_DIR / contract.GATE_REPORT).read_text())
    assert report["gate"] == "refused" and report["candidate_sha256"] is None and "candidate" not in report
    assert sorted(p.name for p in (root / contract.MODEL_DIR).iterdir()) == [contract.GATE_REPORT]
    assert not (root / contract.FAILURE_FILE).exists()


def _check_passed(root: Path, report: dict, s3) -> None:
    """A passed job's outputs: the head, and the manifest the stager writes for the pinned target beside it."""
    model = root / contract.MODEL_DIR
    bundle = root / contract.CHANNELS_DIR / contract.BUNDLE_CHANNEL
    manifest = (model / contract.CANDIDATE_MANIFEST).read_bytes()
    pinned = (bundle / MANIFEST_NAME).read_bytes()
    assert digest(manifest) == report["candidate_sha256"]
    in_target = [f for f in parse_manifest(manifest) if f.path.startswith("target/")]
    assert in_target == [f for f in parse_manifest(pinned) if f.path.startswith("target/")]
    sources = json.loads(manifest)["sources"]
    assert sources[TARGET_DIR] == json.loads(pinned)["sources"][TARGET_DIR]
    assert sources[DRAFTER_DIR]["source"].startswith("train-drafter:candidate-")
    # Staged with the origins the manifest states: the same bytes, so the same pin.
    s3.create_bucket(Bucket="weights")
    staged = stage(Source(bundle / TARGET_DIR, sources[TARGET_DIR]["source"], sources[TARGET_DIR]["revision"]),
                   Source(model / DRAFTER_DIR, sources[DRAFTER_DIR]["source"], None),
                   "s3://weights/bundles/dev/", s3=s3, log=lambda line: None)
    assert staged["manifest_sha256"] == report["candidate_sha256"] and staged["uploaded"] == staged["files"]
    there = s3.get_object(Bucket="weights", Key=f"bundles/dev/{staged['manifest_sha256']}/manifest.json")
    assert there["Body"].read() == manifest


@pytest.fixture
def s3():
    with mock_aws():
        yield boto3.client("s3", region_name="us-east-1")


def test_a_passed_candidate_is_the_manifest_the_stager_writes_for_it(untrained, tmp_path, monkeypatch, s3):
    root = _job(tmp_path, untrained, monkeypatch)
    candidate = tmp_path / "checkpoints" / "candidate-0123456789abcdef"
    shutil.copytree(untrained.drafter, candidate)
    (candidate / "training.json").write_text('{"steps": 1}')
    (candidate / ".partial-marker").write_text("")  # a dot file: the stager leaves it out, so does the job
    monkeypatch.setattr(traffic_training, "run", _fake_run("passed", candidate, {}))
    assert training_job.main(["train"]) == 0
    report = json.loads((root / contract.MODEL_DIR / contract.GATE_REPORT).read_text())
    assert report["gate"] == "passed" and "candidate" not in report
    assert sorted(p.name for p in (root / contract.MODEL_DIR / DRAFTER_DIR).iterdir()) == sorted(
        p.name for p in candidate.iterdir() if not p.name.startswith("."))
    _check_passed(root, report, s3)
    assert json.loads((root / contract.MODEL_DIR / MANIFEST_NAME).read_text())["sources"][DRAFTER_DIR] == {
        "source": f"train-drafter:{candidate.name}", "revision": None}


@pytest.mark.engine
def test_the_job_trains_gates_and_writes_its_outputs(untrained, tmp_path, monkeypatch, s3):
    root = _job(tmp_path, untrained, monkeypatch)
    assert training_job.main(["train"]) == 0
    model = root / contract.MODEL_DIR
    report = json.loads((model / contract.GATE_REPORT).read_text())
    assert report["requests_held_out"] == 10 and report["requests_training"] == 38
    assert report["training"]["steps"] > 0 and "candidate" not in report
    assert any((root / CHECKPOINTS_DIR).glob("candidate-*/config.json"))  # kept for a restart
    if report["gate"] == "passed":
        _check_passed(root, report, s3)
    else:
        assert report["candidate_sha256"] is None and sorted(p.name for p in model.iterdir()) == [contract.GATE_REPORT]
    print(f"gate: {report['gate']}, AL ratio {report['al_ratio']}")
