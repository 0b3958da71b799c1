"""`python -m ops.stage_weights` (what `make stage-weights` runs) against moto's S3 server on loopback, with
AWS_ENDPOINT_URL (as a user points it at any S3 endpoint): a good pair lands under its manifest's digest in the
layout the stacks deploy, manifest last; a rerun uploads nothing over it; a drafter without mask_hidden is refused
with nothing uploaded; the entrypoint accepts the pinned bundle and refuses another. Then, in-process (moto's
mock_aws): an existing bundle is never written over, an incomplete one resumes by S3's own SHA-256 checksums (single
part and multipart) and never by user metadata, and strays stop the manifest."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
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


def _stage(emulator, *args: str, manifests=None) -> subprocess.CompletedProcess:
    # The manifest kept for the pull request goes to a folder of the test's, never into this checkout.
    manifests = manifests or Path(tempfile.mkdtemp(prefix="manifests-"))
    return subprocess.run([sys.executable, "-m", "ops.stage_weights", *args, "--manifests", str(manifests)],
                          cwd=REPO_ROOT,
                          env=emulator.client_environment(), capture_output=True, text=True,
                          timeout=300)


def _keys(s3) -> dict[str, dict]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="peagle-weights-test", Prefix="bundles/")
    return {o["Key"]: o for page in pages for o in page.get("Contents", [])}


def test_a_good_pair_is_staged_with_its_manifest_last_and_a_rerun_skips_it(emulator, s3, untrained, tmp_path):
    kept = tmp_path / "bundles"
    proc = _stage(emulator, "--target", str(untrained.target), "--drafter", str(untrained.drafter), "--bundle", BUNDLE,
                  manifests=kept)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result = json.loads(proc.stdout)
    # The manifest is kept to commit beside the pin, byte for byte what the bundle holds.
    assert [p.name for p in kept.iterdir()] == [f"{result['manifest_sha256']}.json"]
    assert digest((kept / f"{result['manifest_sha256']}.json").read_bytes()) == result["manifest_sha256"]
    keys = _keys(s3)
    prefix = f"bundles/tiny-p-eagle/{result['manifest_sha256']}/"  # content-addressed: the digest names the folder
    assert f"bundle_manifest_sha256={result['manifest_sha256']!r}" in proc.stderr
    assert f"make verify-bundle BUNDLE={BUNDLE} SHA256={result['manifest_sha256']}" in proc.stderr
    local = {f"target/{p.relative_to(untrained.target).as_posix()}": p for p in untrained.target.rglob("*") if p.is_file()}
    local.update({f"drafter/{p.relative_to(untrained.drafter).as_posix()}": p
                  for p in untrained.drafter.rglob("*") if p.is_file()})
    assert set(keys) == {prefix + rel for rel in local} | {prefix + MANIFEST_NAME}
    # The manifest was written after every file (a bundle without one is incomplete).
    manifest_time = keys[prefix + MANIFEST_NAME]["LastModified"]
    assert all(o["LastModified"] <= manifest_time for o in keys.values())
    body = s3.get_object(Bucket="peagle-weights-test", Key=prefix + MANIFEST_NAME)["Body"].read()
    assert digest(body) == result["manifest_sha256"]
    manifest = json.loads(body)
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {rel: file_sha256(p) for rel, p in local.items()}
    assert manifest["sources"]["drafter"] == {"source": str(untrained.drafter), "revision": None}
    weights = s3.head_object(Bucket="peagle-weights-test", Key=prefix + "drafter/model.safetensors",
                             ChecksumMode="ENABLED")
    assert weights["ChecksumSHA256"] == _b64_sha256((untrained.drafter / "model.safetensors").read_bytes())
    assert weights["Metadata"] == {}  # nothing a reader would trust
    assert result["target_model"] == f"{BUNDLE}{result['manifest_sha256']}/target/"
    assert result["drafter_model"] == f"{BUNDLE}{result['manifest_sha256']}/drafter/"
    # The uploaded bytes are the files' bytes.
    got = s3.get_object(Bucket="peagle-weights-test", Key=prefix + "drafter/config.json")["Body"].read()
    assert got == (untrained.drafter / "config.json").read_bytes()

    again = _stage(emulator, "--target", str(untrained.target), "--drafter", str(untrained.drafter), "--bundle", BUNDLE)
    assert again.returncode == 0, again.stderr
    rerun = json.loads(again.stdout)
    assert rerun["existing"] is True and rerun["uploaded"] == 0 and "nothing uploaded" in again.stderr
    assert rerun["manifest_sha256"] == result["manifest_sha256"]  # same content, same digest
    assert _keys(s3) == keys  # not one object written again
    # The operator's check before pinning, as `make verify-bundle` runs it, through the same endpoint.
    check = subprocess.run([sys.executable, "-m", "ops.verify_bundle", "--bundle", BUNDLE, "--sha256",
                            result["manifest_sha256"]], cwd=REPO_ROOT, env=emulator.client_environment(),
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and check.stdout.startswith(f"verified {result['bundle']}: "), check.stderr

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


def test_a_drafter_without_mask_hidden_is_refused_and_nothing_is_uploaded(emulator, s3, untrained, tmp_path):
    broken = tmp_path / "drafter"
    shutil.copytree(untrained.drafter, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    tensors.pop("mask_hidden")
    save_file(tensors, str(broken / "model.safetensors"))
    bundle = "s3://peagle-weights-test/bundles/broken/"
    proc = _stage(emulator, "--target", str(untrained.target), "--drafter", str(broken), "--bundle", bundle)
    assert proc.returncode == 2
    assert "mask_hidden" in proc.stderr and "no manifest written" in proc.stderr
    assert not [k for k in _keys(s3) if k.startswith("bundles/broken/")]


@pytest.mark.parametrize(("change", "message"), [
    (lambda cfg: cfg.pop("ptd_token_id"), "mask-token id"),
    (lambda cfg: cfg.update(architectures=["LlamaForCausalLM"]), "EAGLE-3 head"),
])
def test_a_drafter_vllm_would_refuse_is_refused_before_any_upload(emulator, s3, untrained, tmp_path, change, message):
    broken = tmp_path / "drafter"
    shutil.copytree(untrained.drafter, broken)
    config = json.loads((broken / "config.json").read_text())
    change(config)
    (broken / "config.json").write_text(json.dumps(config))
    proc = _stage(emulator, "--target", str(untrained.target), "--drafter", str(broken),
                  "--bundle", "s3://peagle-weights-test/bundles/refused/")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not [k for k in _keys(s3) if k.startswith("bundles/refused/")]


# -- in-process (moto's mock_aws): immutability and resuming by S3's own checksums ------------------------------

BUCKET = "peagle-weights-inproc"
PREFIX = f"s3://{BUCKET}/bundles/tiny/"
WRITES = ("put_object", "upload_file", "upload_fileobj", "create_multipart_upload", "copy_object", "delete_object")


def _b64_sha256(data: bytes) -> str:
    import base64
    import hashlib

    return base64.b64encode(hashlib.sha256(data).digest()).decode()


class _Recording:
    """The S3 client, with every write the stager makes recorded."""

    def __init__(self, client) -> None:
        self.client, self.writes = client, []

    def __getattr__(self, name):
        if name in WRITES:
            self.writes.append(name)
        return getattr(self.client, name)


@pytest.fixture
def mocked_s3(moto_region):
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("s3", region_name=moto_region)
        client.create_bucket(Bucket=BUCKET)
        yield client


def _stage_in_process(s3, target: Path, drafter: Path, **kw) -> tuple[dict, list[str]]:
    from ops.stage_weights import Source, stage

    lines: list[str] = []
    result = stage(Source(target, str(target), None), Source(drafter, str(drafter), None), PREFIX, s3=s3,
                   log=lines.append, **kw)
    return result, lines


def _objects(s3, result) -> dict[str, dict]:
    key = result["bundle"][len(f"s3://{BUCKET}/"):]
    return {o["Key"][len(key):]: o for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=key).get("Contents", [])}


def test_an_existing_bundle_is_never_written_over(mocked_s3, untrained):
    first, _ = _stage_in_process(mocked_s3, untrained.target, untrained.drafter)
    assert first["uploaded"] == first["files"] and not first["existing"]
    recording = _Recording(mocked_s3)
    again, lines = _stage_in_process(recording, untrained.target, untrained.drafter)
    assert again["existing"] and recording.writes == []
    assert lines[-1] == f"bundle {first['bundle']} already exists (its manifest is there): nothing uploaded"


def test_a_foreign_manifest_under_the_digest_is_refused_and_nothing_written(mocked_s3, untrained):
    from ops.stage_weights import StageError

    first, _ = _stage_in_process(mocked_s3, untrained.target, untrained.drafter)
    key = first["bundle"][len(f"s3://{BUCKET}/"):] + MANIFEST_NAME
    mocked_s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"version": 1, "files": []}\n')
    recording = _Recording(mocked_s3)
    with pytest.raises(StageError, match=r"manifest.json exists but is not this bundle's manifest .* nothing is "
                                         r"written over an existing bundle"):
        _stage_in_process(recording, untrained.target, untrained.drafter)
    assert recording.writes == []


def test_an_incomplete_bundle_resumes_by_s3s_sha256_never_by_user_metadata(mocked_s3, untrained):
    """The old stager skipped a file whose x-amz-meta-sha256 matched: any writer sets that. Here one object has the
    wrong bytes and the right metadata, one the right bytes and no S3 checksum: both go up again."""
    first, _ = _stage_in_process(mocked_s3, untrained.target, untrained.drafter)
    key = first["bundle"][len(f"s3://{BUCKET}/"):]
    mocked_s3.delete_object(Bucket=BUCKET, Key=key + MANIFEST_NAME)  # an upload cut short: no manifest yet
    weights = untrained.drafter / "model.safetensors"
    mocked_s3.put_object(Bucket=BUCKET, Key=key + "drafter/model.safetensors", Body=b"not the weights",
                         ChecksumAlgorithm="SHA256", Metadata={"sha256": file_sha256(weights)})
    config = (untrained.target / "config.json").read_bytes()
    mocked_s3.put_object(Bucket=BUCKET, Key=key + "target/config.json", Body=config)  # right bytes, no checksum

    resumed, lines = _stage_in_process(mocked_s3, untrained.target, untrained.drafter)
    assert (resumed["uploaded"], resumed["skipped"]) == (2, first["files"] - 2)
    replaced = [line for line in lines if "replacing an object whose S3 SHA-256 differs" in line]
    assert [line.split("] ")[1].split(":")[0] for line in replaced] == ["drafter/model.safetensors",
                                                                        "target/config.json"], lines
    got = mocked_s3.get_object(Bucket=BUCKET, Key=key + "drafter/model.safetensors")["Body"].read()
    assert got == weights.read_bytes()
    assert resumed["manifest_sha256"] == first["manifest_sha256"] and MANIFEST_NAME in _objects(mocked_s3, resumed)


def test_multipart_files_resume_by_s3s_composite_checksum(mocked_s3, untrained, tmp_path):
    """S3's SHA-256 of a multipart object is the SHA-256 of the parts' SHA-256s: computed here with the same part
    size. moto 5.2.5 reports it without S3's "-<parts>" suffix; the comparison takes either."""
    from ops.stage_weights import s3_sha256

    part = 5 * 1024 * 1024  # S3's (and moto's) smallest part
    target = tmp_path / "target"
    shutil.copytree(untrained.target, target)
    big = target / "model-00002-of-00002.safetensors"
    big.write_bytes(bytes(range(256)) * (2 * part // 256) + b"tail")  # two whole parts and a short third
    first, _ = _stage_in_process(mocked_s3, target, untrained.drafter, part_size=part)
    key = first["bundle"][len(f"s3://{BUCKET}/"):]
    head = mocked_s3.head_object(Bucket=BUCKET, Key=key + "target/" + big.name, ChecksumMode="ENABLED")
    want = s3_sha256(big, big.stat().st_size, file_sha256(big), part)
    assert want.endswith("-3") and head["ChecksumSHA256"] in (want, want.split("-")[0])
    assert head["ETag"].endswith('-3"')  # it did go up in parts

    mocked_s3.delete_object(Bucket=BUCKET, Key=key + MANIFEST_NAME)
    resumed, _ = _stage_in_process(mocked_s3, target, untrained.drafter, part_size=part)
    assert resumed["uploaded"] == 0 and resumed["skipped"] == first["files"]

    mocked_s3.delete_object(Bucket=BUCKET, Key=key + MANIFEST_NAME)
    tampered = tmp_path / "tampered"
    tampered.write_bytes(big.read_bytes()[:-4] + b"TAIL")  # same size, same part count, last part differs
    from boto3.s3.transfer import TransferConfig

    mocked_s3.upload_file(str(tampered), BUCKET, key + "target/" + big.name, ExtraArgs={"ChecksumAlgorithm": "SHA256"},
                          Config=TransferConfig(multipart_threshold=part, multipart_chunksize=part))
    again, _ = _stage_in_process(mocked_s3, target, untrained.drafter, part_size=part)
    assert again["uploaded"] == 1
    assert mocked_s3.get_object(Bucket=BUCKET, Key=key + "target/" + big.name)["Body"].read() == big.read_bytes()


def test_a_stray_object_in_an_incomplete_bundle_stops_the_manifest(mocked_s3, untrained):
    from ops.stage_weights import StageError

    first, _ = _stage_in_process(mocked_s3, untrained.target, untrained.drafter)
    key = first["bundle"][len(f"s3://{BUCKET}/"):]
    mocked_s3.delete_object(Bucket=BUCKET, Key=key + MANIFEST_NAME)
    mocked_s3.put_object(Bucket=BUCKET, Key=key + "model.py", Body=b"import os")
    with pytest.raises(StageError, match=r"holds 1 objects that are not part of this bundle \(model.py\)"):
        _stage_in_process(mocked_s3, untrained.target, untrained.drafter)
    assert MANIFEST_NAME not in _objects(mocked_s3, first)


def test_a_manifest_written_meanwhile_is_not_written_over(mocked_s3, untrained, monkeypatch):
    """The manifest goes up with If-None-Match: a stager racing another sees S3 refuse, not a silent overwrite."""
    from ops import stage_weights

    _stage_in_process(mocked_s3, untrained.target, untrained.drafter)
    monkeypatch.setattr(stage_weights, "existing_manifest", lambda s3, where: None)  # lost the race to look
    with pytest.raises(stage_weights.StageError, match="written by someone else while staging"):
        _stage_in_process(mocked_s3, untrained.target, untrained.drafter)


def test_a_model_folder_with_a_model_py_is_refused_before_any_upload(mocked_s3, untrained, tmp_path):
    from ops.stage_weights import StageError

    target = tmp_path / "target"
    shutil.copytree(untrained.target, target)
    (target / "model.py").write_text("import os\n")
    recording = _Recording(mocked_s3)
    with pytest.raises(StageError, match=r"^target/model.py: named model.py; allowed: no such name"):
        _stage_in_process(recording, target, untrained.drafter)
    assert recording.writes == []
