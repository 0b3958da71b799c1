"""`python -m harness.stage_weights` (what `make stage-weights` runs) against moto's S3 server on loopback, with
AWS_ENDPOINT_URL (as a user points it at any S3 endpoint): a good pair lands in the layout the stacks
deploy with its manifest last; a rerun skips what is there; a drafter without mask_hidden is refused with
nothing uploaded; the entrypoint accepts the pinned bundle and refuses another."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from harness.aws import server
from peagle_contract.bundle import MANIFEST_DIGEST_VAR, MANIFEST_NAME, digest, file_sha256
from safetensors.torch import load_file, save_file

BUNDLE = "s3://peagle-weights-test/bundles/tiny-p-eagle/"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    emulator = server.start(state_dir=tmp_path_factory.mktemp("moto-s3"), account="123456789012")
    try:
        yield emulator
    finally:
        server.stop(state_dir=Path(emulator.log).parent)


@pytest.fixture(scope="module")
def s3(emulator):
    env = emulator.client_environment({})
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key="testing")
    client.create_bucket(Bucket="peagle-weights-test")
    return client


def _stage(emulator, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.stage_weights", *args], cwd=REPO_ROOT,
                          env=emulator.client_environment(), capture_output=True, text=True,
                          timeout=300)


def _keys(s3) -> dict[str, dict]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="peagle-weights-test", Prefix="bundles/")
    return {o["Key"]: o for page in pages for o in page.get("Contents", [])}


def test_a_good_pair_is_staged_with_its_manifest_last_and_a_rerun_skips_it(emulator, s3, tiny_pair, tmp_path):
    proc = _stage(emulator, "--target", str(tiny_pair.target), "--drafter", str(tiny_pair.drafter), "--bundle", BUNDLE)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result = json.loads(proc.stdout)
    keys = _keys(s3)
    prefix = "bundles/tiny-p-eagle/"
    local = {f"target/{p.relative_to(tiny_pair.target).as_posix()}": p for p in tiny_pair.target.rglob("*") if p.is_file()}
    local.update({f"drafter/{p.relative_to(tiny_pair.drafter).as_posix()}": p
                  for p in tiny_pair.drafter.rglob("*") if p.is_file()})
    assert set(keys) == {prefix + rel for rel in local} | {prefix + MANIFEST_NAME}
    # The manifest was written after every file (a bundle without one is incomplete).
    manifest_time = keys[prefix + MANIFEST_NAME]["LastModified"]
    assert all(o["LastModified"] <= manifest_time for o in keys.values())
    body = s3.get_object(Bucket="peagle-weights-test", Key=prefix + MANIFEST_NAME)["Body"].read()
    assert digest(body) == result["manifest_sha256"]
    manifest = json.loads(body)
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {rel: file_sha256(p) for rel, p in local.items()}
    assert manifest["sources"]["drafter"] == {"source": str(tiny_pair.drafter), "revision": None}
    weights = s3.head_object(Bucket="peagle-weights-test", Key=prefix + "drafter/model.safetensors",
                             ChecksumMode="ENABLED")
    assert weights["Metadata"]["sha256"] == file_sha256(tiny_pair.drafter / "model.safetensors")
    assert result["target_model"] == BUNDLE + "target/" and result["drafter_model"] == BUNDLE + "drafter/"
    # The uploaded bytes are the files' bytes.
    got = s3.get_object(Bucket="peagle-weights-test", Key=prefix + "drafter/config.json")["Body"].read()
    assert got == (tiny_pair.drafter / "config.json").read_bytes()

    again = _stage(emulator, "--target", str(tiny_pair.target), "--drafter", str(tiny_pair.drafter), "--bundle", BUNDLE)
    assert again.returncode == 0, again.stderr
    rerun = json.loads(again.stdout)
    assert rerun["uploaded"] == 0 and rerun["skipped"] == len(local)
    assert rerun["manifest_sha256"] == result["manifest_sha256"]  # same content, same digest

    # The image's entrypoint accepts the bundle it was pinned to and refuses another, before vLLM starts.
    from peagle_runtime.entrypoint import EntrypointError, build_command

    mounted = tmp_path / "opt-ml-model"
    for rel in [*local, MANIFEST_NAME]:
        dest = mounted / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(s3.get_object(Bucket="peagle-weights-test", Key=prefix + rel)["Body"].read())
    env = {"SM_VLLM_MODEL": str(mounted / "target"), "SM_VLLM_SPECULATIVE_CONFIG": json.dumps(
        {"method": "eagle3", "model": str(mounted / "drafter"), "num_speculative_tokens": 4, "parallel_drafting": True}),
        MANIFEST_DIGEST_VAR: result["manifest_sha256"]}
    build_command(env, model_dir=mounted)
    with pytest.raises(EntrypointError, match=MANIFEST_DIGEST_VAR):
        build_command({**env, MANIFEST_DIGEST_VAR: "0" * 64}, model_dir=mounted)
    (mounted / MANIFEST_NAME).unlink()
    with pytest.raises(EntrypointError, match="incomplete bundle"):
        build_command(env, model_dir=mounted)


def test_a_drafter_without_mask_hidden_is_refused_and_nothing_is_uploaded(emulator, s3, tiny_pair, tmp_path):
    broken = tmp_path / "drafter"
    shutil.copytree(tiny_pair.drafter, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    tensors.pop("mask_hidden")
    save_file(tensors, str(broken / "model.safetensors"))
    bundle = "s3://peagle-weights-test/bundles/broken/"
    proc = _stage(emulator, "--target", str(tiny_pair.target), "--drafter", str(broken), "--bundle", bundle)
    assert proc.returncode == 2
    assert "mask_hidden" in proc.stderr and "nothing uploaded" in proc.stderr
    assert not [k for k in _keys(s3) if k.startswith("bundles/broken/")]


@pytest.mark.parametrize(("change", "message"), [
    (lambda cfg: cfg.pop("ptd_token_id"), "mask-token id"),
    (lambda cfg: cfg.update(architectures=["LlamaForCausalLM"]), "EAGLE-3 head"),
])
def test_a_drafter_vllm_would_refuse_is_refused_before_any_upload(emulator, s3, tiny_pair, tmp_path, change, message):
    broken = tmp_path / "drafter"
    shutil.copytree(tiny_pair.drafter, broken)
    config = json.loads((broken / "config.json").read_text())
    change(config)
    (broken / "config.json").write_text(json.dumps(config))
    proc = _stage(emulator, "--target", str(tiny_pair.target), "--drafter", str(broken),
                  "--bundle", "s3://peagle-weights-test/bundles/refused/")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not [k for k in _keys(s3) if k.startswith("bundles/refused/")]
