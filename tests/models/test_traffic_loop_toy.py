"""The loop on the toy pair, as CI can run it: a capture of traffic the head in service was not trained on ->
`make train-drafter`'s command -> the gate on vLLM -> the candidate staged on moto's S3 with the real boto3 client
-> the pin change applied with git.

The head in service is the toy P-EAGLE head with its hidden-state input cut (``fc`` zeroed): one that drafts from
the token embeddings alone, so the gate has something to find. The capture is made here, at the edge: the toy
target's own greedy answers (transformers, fp32) to prompts built from names its corpus never uses, written as the
runtime writes its records; the capture's path through the real server is tests/runtime/test_capture_server.py's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import boto3
import pytest
from moto import mock_aws
from peagle_contract.capture import CaptureConfig, format_record
from safetensors.torch import load_file, save_file

from ops import cdk, train_drafter
from ops.stage_weights import MANIFESTS_DIR

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CONFIG = CaptureConfig(sample_rate=1.0, stage="dev", target="toy")


@pytest.fixture(scope="module")
def toy():
    from models import toy_pair

    if toy_pair.existing_pair() is None:  # built in its own process: the builder pins torch's threads
        subprocess.run([sys.executable, "-m", "models.toy_pair"], check=True, capture_output=True)
    return toy_pair.existing_pair()


def _capture(target, folder, n: int = 48) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.trainer.corpus import held_out_prompts

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    lines = []
    for i, prompt in enumerate(held_out_prompts(n, seed=7)):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=48, do_sample=False)
        answer = tokenizer.decode(out[0, ids.shape[1]:])
        lines.append(format_record(config=CONFIG, request_id=f"t{i}", route="/v1/completions", stream=i % 2 == 0,
                                   request={"prompt": prompt}, answer=answer, finish_reason="length",
                                   prompt_tokens=int(ids.shape[1]), output_tokens=int(out.shape[1] - ids.shape[1])))
    folder.mkdir()
    (folder / "capture.jsonl").write_text("".join(line + "\n" for line in lines))


def _blinded(drafter, folder):
    shutil.copytree(drafter, folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["fc.weight"] = weights["fc.weight"] * 0
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_traffic_trains_a_better_head_which_is_staged_and_pinned(toy, tmp_path, capsys, monkeypatch):
    _capture(toy.target, tmp_path / "capture")
    in_service = _blinded(toy.drafter, tmp_path / "in-service")
    repo = tmp_path / "repo"
    (repo / "stacks").mkdir(parents=True)
    shutil.copy(cdk.REPO_ROOT / train_drafter.ENVIRONMENTS_FILE, repo / train_drafter.ENVIRONMENTS_FILE)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="weights")
        monkeypatch.setattr(boto3, "client", lambda *a, **k: s3)
        argv = ["--env", "dev", "--capture", str(tmp_path / "capture"), "--served-name", "toy", "--target",
                str(toy.target), "--drafter", str(in_service), "--k", "4", "--cpu-seconds", "60", "--max-tokens", "32",
                "--bundle", "s3://weights/bundles/dev/", "--work", str(tmp_path / "work"), "--repo", str(repo)]
        code = train_drafter.main(argv)
        out, err = capsys.readouterr()
        assert code == 0, err[-3000:]
        report = json.loads(out)
        assert report["gate"] == "passed" and report["outputs_identical"] is True
        assert report["al_after"]["value"] > report["al_before"]["value"]
        pin = report["staged"]["manifest_sha256"]
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="weights")["Contents"]}
    assert f"bundles/dev/{pin}/manifest.json" in keys and f"bundles/dev/{pin}/drafter/model.safetensors" in keys
    manifest = (repo / MANIFESTS_DIR / f"{pin}.json").read_bytes()
    assert json.loads(manifest)["sources"]["drafter"]["source"].startswith("train-drafter:candidate-")
    patch = err[err.index("--- a/stacks/environments.py"):]
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=repo, check=True)
    assert f'"dev": "{pin}"' in (repo / train_drafter.ENVIRONMENTS_FILE).read_text()
    # The head in service is untouched; the candidate is a folder of its own.
    assert (load_file(str(in_service / "model.safetensors"))["fc.weight"] == 0).all()
