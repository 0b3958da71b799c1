"""The entrypoint: SM_VLLM_* -> vLLM's own argument parser, and every refusal before vLLM starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from peagle_contract.drafter import MASK_HIDDEN, MASK_TOKEN_WRITE_KEY
from peagle_contract.serving import ServingConfig

from models import layout
from peagle_runtime import entrypoint, shutdown
from peagle_runtime.entrypoint import EntrypointError, build_command


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(description="test"))


def _parse(parser, cmd: list[str]):
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    assert cmd[1:3] == ["-m", entrypoint.SERVER_MODULE]
    args = parser.parse_args(cmd[3:])
    validate_parsed_serve_args(args)
    return args


def _env_for(untrained, **kw) -> dict[str, str]:
    cfg = ServingConfig(target_model="s3://bucket/models/target/", drafter_model="s3://bucket/models/drafter/", **kw)
    return cfg.to_environment(target_dir=str(untrained.target), drafter_dir=str(untrained.drafter))


CONFIGS = [
    {},
    {"num_speculative_tokens": 1, "tensor_parallel_size": 2, "max_model_len": 4096, "dtype": "bfloat16"},
    {"num_speculative_tokens": 32, "max_num_seqs": 8, "gpu_memory_utilization": 0.5,
     "served_model_name": "org/model-a", "extra_args": {"enable_prefix_caching": True, "block_size": 32}},
    # Off: flags vLLM turns on by default (the DLC rule would drop a plain `false`), and one it keeps off.
    {"extra_args": {"enable_prefix_caching": False, "enable_chunked_prefill": False, "disable_log_stats": False}},
]


@pytest.mark.parametrize("kw", CONFIGS, ids=["defaults", "tp2-bf16", "k32-extras", "flags-off"])
def test_round_trip_through_vllm_parser(vllm_parser, untrained, kw):
    from vllm.engine.arg_utils import AsyncEngineArgs

    cfg = ServingConfig(target_model="s3://bucket/models/target/", drafter_model="s3://bucket/models/drafter/", **kw)
    env = cfg.to_environment(target_dir=str(untrained.target), drafter_dir=str(untrained.drafter))
    cmd, child_env = build_command(env)
    args = _parse(vllm_parser, cmd)
    engine = AsyncEngineArgs.from_cli_args(args)

    assert engine.model == str(untrained.target)
    expected_spec = cfg.speculative_config(drafter_dir=str(untrained.drafter))
    assert engine.speculative_config == expected_spec
    assert engine.tensor_parallel_size == cfg.tensor_parallel_size
    assert engine.max_model_len == cfg.max_model_len
    assert engine.max_num_seqs == cfg.max_num_seqs
    assert engine.gpu_memory_utilization == pytest.approx(cfg.gpu_memory_utilization)
    assert engine.dtype == cfg.dtype
    if cfg.served_model_name:
        assert args.served_model_name == [cfg.served_model_name]
    for key, value in cfg.extra_args.items():
        assert getattr(engine, key) == value
    assert (args.host, args.port) == ("0.0.0.0", 8080)
    assert args.middleware == [entrypoint.MIDDLEWARE]
    assert engine.per_request_spec_decode_metrics == "summary"
    # vLLM drains, longer than the middleware's budget: the middleware ends what is left, then vLLM exits.
    assert engine.shutdown_timeout == shutdown.DEFAULT_DRAIN_S + shutdown.ENGINE_MARGIN_S < 30
    assert child_env["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_a_flag_vllm_turns_on_by_default_is_off_when_the_config_says_false(vllm_parser, untrained):
    from vllm.engine.arg_utils import AsyncEngineArgs

    default = AsyncEngineArgs.from_cli_args(_parse(vllm_parser, build_command(_env_for(untrained))[0]))
    env = _env_for(untrained, extra_args={"enable_prefix_caching": False})
    assert env["SM_VLLM_NO_ENABLE_PREFIX_CACHING"] == "true" and "SM_VLLM_ENABLE_PREFIX_CACHING" not in env
    off = AsyncEngineArgs.from_cli_args(_parse(vllm_parser, build_command(env)[0]))
    assert default.enable_prefix_caching is not False and off.enable_prefix_caching is False


def test_the_flags_without_a_no_form_are_vllms_own(vllm_parser):
    """The contract renders False as --no-<flag>; vLLM's parser decides which flags have that form."""
    import argparse

    from peagle_contract.serving import FLAGS_WITHOUT_NO_FORM

    store_true = {a.dest for a in vllm_parser._actions if isinstance(a, argparse._StoreTrueAction)}
    optional = {a.dest for a in vllm_parser._actions if isinstance(a, argparse.BooleanOptionalAction)}
    assert store_true == set(FLAGS_WITHOUT_NO_FORM) and len(optional) > 50


def test_serve_argument_and_local_listener(untrained, vllm_parser):
    env = {**_env_for(untrained), "PEAGLE_HOST": "127.0.0.1", "PEAGLE_PORT": "18123"}
    cmd, _ = build_command(env, ["--enforce-eager"])
    args = _parse(vllm_parser, cmd)
    assert (args.host, args.port, args.enforce_eager) == ("127.0.0.1", 18123, True)


def test_model_defaults_to_sagemaker_dir_when_it_holds_files(untrained, tmp_path, vllm_parser):
    env = _env_for(untrained)
    del env["SM_VLLM_MODEL"]
    model_dir = tmp_path / "opt-ml-model"
    model_dir.mkdir()
    with pytest.raises(EntrypointError, match="SM_VLLM_MODEL: not set"):
        build_command(env, model_dir=model_dir)
    shutil.copytree(untrained.target, model_dir, dirs_exist_ok=True)
    cmd, _ = build_command(env, model_dir=model_dir)
    assert _parse(vllm_parser, cmd).model == str(model_dir)


def _broken_drafter(untrained, tmp_path, *, drop_mask_hidden=False, drop_token=False, trained_k=None):
    import torch
    from safetensors.torch import load_file

    cfg = json.loads((untrained.drafter / "config.json").read_text())
    weights = load_file(str(untrained.drafter / "model.safetensors"))
    if drop_token:
        del cfg[MASK_TOKEN_WRITE_KEY]
    if trained_k is not None:
        cfg["trained_num_speculative_tokens"] = trained_k
    if drop_mask_hidden:
        del weights[MASK_HIDDEN]
        from safetensors.torch import save_file

        out = tmp_path / "drafter"
        out.mkdir()
        save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps(cfg))
        return out
    assert isinstance(weights[MASK_HIDDEN], torch.Tensor)
    return layout.write_drafter(tmp_path / "drafter", config=cfg, weights=weights)


def _with_spec(env: dict[str, str], spec: dict | str) -> dict[str, str]:
    return {**env, "SM_VLLM_SPECULATIVE_CONFIG": spec if isinstance(spec, str) else json.dumps(spec)}


def _spec(untrained, **over) -> dict:
    return {**untrained.speculative_config(k=4), **over}


REFUSALS = [
    ("invalid-json", lambda p, t: _with_spec(_env_for(p), '{"method": "eagle3",'), "not valid JSON"),
    ("method-draft-model", lambda p, t: _with_spec(_env_for(p), _spec(p, method="draft_model")), ".method"),
    ("sequential-eagle3", lambda p, t: _with_spec(_env_for(p), _spec(p, parallel_drafting=False)), ".parallel_drafting"),
    ("k-zero", lambda p, t: _with_spec(_env_for(p), _spec(p, num_speculative_tokens=0)), "1..32"),
    ("k-33", lambda p, t: _with_spec(_env_for(p), _spec(p, num_speculative_tokens=33)), "1..32"),
    ("no-mask-hidden", lambda p, t: _with_spec(_env_for(p), _spec(p, model=str(_broken_drafter(p, t, drop_mask_hidden=True)))),
     "no 'mask_hidden' tensor"),
    ("no-mask-token", lambda p, t: _with_spec(_env_for(p), _spec(p, model=str(_broken_drafter(p, t, drop_token=True)))),
     "names no mask-token id"),
    ("missing-drafter-dir", lambda p, t: _with_spec(_env_for(p), _spec(p, model=str(t / "nowhere"))), "does not exist"),
    ("k-above-trained", lambda p, t: _with_spec(_env_for(p), _spec(p, model=str(_broken_drafter(p, t, trained_k=3)))),
     "SM_VLLM_SPECULATIVE_CONFIG.num_speculative_tokens: got 4, but the drafter was trained for K up to 3"),
    ("k-schedule-between", lambda p, t: _with_spec(_env_for(p), _spec(p, num_speculative_tokens_per_batch_size=[
        [1, 1, 4], [2, 8, 2]])), "got K=2; allowed: 0"),
    ("k-schedule-gap", lambda p, t: _with_spec(_env_for(p), _spec(p, num_speculative_tokens_per_batch_size=[
        [1, 1, 4], [3, 8, 0]])), "starts at 3; allowed: start at 2, right after the range before"),
    ("api-key", lambda p, t: {**_env_for(p), "SM_VLLM_API_KEY": "secret"}, "SM_VLLM_API_KEY: not allowed"),
    ("multi-line", lambda p, t: {**_env_for(p), "SM_VLLM_MAX_MODEL_LEN": "512\n--api-key x"}, "single line"),
    ("port-override", lambda p, t: {**_env_for(p), "SM_VLLM_PORT": "9000"}, "SM_VLLM_PORT: not allowed"),
    ("fused-draft-switch", lambda p, t: {**_env_for(p), "PEAGLE_FUSED_DRAFT": "yes"}, "PEAGLE_FUSED_DRAFT: got 'yes'"),
    ("capture-rate-above-one", lambda p, t: {**_env_for(p), "PEAGLE_CAPTURE": json.dumps(
        {"sample_rate": 1.5, "stage": "dev", "target": "t"})}, "PEAGLE_CAPTURE.sample_rate: got 1.5; allowed: a number in (0, 1]"),
    ("capture-not-json", lambda p, t: {**_env_for(p), "PEAGLE_CAPTURE": "0.1"}, "PEAGLE_CAPTURE: got keys 'float'"),
    ("capture-unknown-key", lambda p, t: {**_env_for(p), "PEAGLE_CAPTURE": json.dumps(
        {"sample_rate": 0.1, "stage": "dev", "target": "t", "bucket": "b"})}, "PEAGLE_CAPTURE: got keys"),
    ("no-spec", lambda p, t: {k: v for k, v in _env_for(p).items() if k != "SM_VLLM_SPECULATIVE_CONFIG"}, "is required"),
]


@pytest.mark.parametrize("name,make_env,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refuses_before_vllm_starts(untrained, tmp_path, name, make_env, message):
    with pytest.raises(EntrypointError, match=message.replace(".", r"\.").replace("(", r"\(")):
        build_command(make_env(untrained, tmp_path))


def test_refuses_api_key_argument(untrained):
    with pytest.raises(EntrypointError, match="--api-key"):
        build_command(_env_for(untrained), ["--api-key", "x"])


def test_console_script_exits_2_with_one_clear_line(untrained, tmp_path):
    """The real process: a bad config ends it with status 2 and a message, without importing vLLM."""
    env = {"PATH": "/usr/bin:/bin", **_with_spec(_env_for(untrained), _spec(untrained, num_speculative_tokens=40))}
    script = "import sys, peagle_runtime.entrypoint as e; assert 'vllm' not in sys.modules; sys.exit(e.main(['serve']))"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "SM_VLLM_SPECULATIVE_CONFIG.num_speculative_tokens: got 40; allowed: an integer in 1..32" in done.stderr
    assert "Traceback" not in done.stderr
    peagle_serve = shutil.which("peagle-serve", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert peagle_serve, "the peagle-serve console script is installed"
    done = subprocess.run([peagle_serve, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "peagle-serve: error:" in done.stderr


@pytest.mark.parametrize("name", ["GPT-OSS-20B", "GPT-OSS-120B", "Qwen3-Coder-30B-A3B-Instruct", "Gemma-4-31B-IT"])
def test_every_presets_flags_are_vllms_own_and_reach_the_engine(vllm_parser, untrained, name):
    """The flags each head's card recommends, rendered by the DLC rule, parse with vLLM's own parser and land
    in its engine arguments with the values the preset states."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from peagle_constructs.presets import PRESETS

    preset = PRESETS[name]
    cfg = preset.serving(target_model="s3://bucket/models/target/", drafter_model="s3://bucket/models/drafter/")
    env = cfg.to_environment(target_dir=str(untrained.target), drafter_dir=str(untrained.drafter))
    cmd, child_env = build_command(env)
    args = _parse(vllm_parser, cmd)
    engine = AsyncEngineArgs.from_cli_args(args)
    assert cfg.extra_args["kv_cache_dtype"] == preset.kv_cache_dtype
    for key, value in cfg.extra_args.items():
        assert (getattr(engine, key) if hasattr(engine, key) else getattr(args, key)) == value, key
    assert engine.speculative_config["num_speculative_tokens"] == preset.recommended_k
    assert engine.max_model_len == preset.max_model_len and engine.max_num_seqs == preset.max_num_seqs
    for key, value in preset.extra_environment.items():
        assert child_env[key] == value


# -- the weights bundle: verified exactly against the pin before anything else -------------------------------

def _pinned(untrained, root) -> dict[str, str]:
    """The environment a pinned stage gives the container, with the random pair mounted as its bundle in ``root``."""
    from tests.bundle_helpers import mount_bundle

    pin = mount_bundle(root, untrained.target, untrained.drafter)
    cfg = ServingConfig(target_model=f"s3://bucket/bundles/tiny/{pin}/target/", num_speculative_tokens=4,
                        drafter_model=f"s3://bucket/bundles/tiny/{pin}/drafter/", bundle_manifest_sha256=pin)
    return cfg.to_environment(target_dir=str(root / "target"), drafter_dir=str(root / "drafter"))


def test_a_pinned_bundle_is_verified_and_one_line_says_what_and_how_fast(untrained, tmp_path, capsys, vllm_parser):
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR

    root = tmp_path / "opt-ml-model"
    env = _pinned(untrained, root)
    cmd, child_env = build_command(env, model_dir=root)
    assert _parse(vllm_parser, cmd).model == str(root / "target")
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "verified" in x]
    files = sum(1 for p in root.rglob("*") if p.is_file()) - 1
    assert line.startswith(f"peagle-serve: bundle {root} verified against {MANIFEST_DIGEST_VAR} "
                           f"({env[MANIFEST_DIGEST_VAR][:12]}...): {files} files, ")
    assert " MB in " in line and " MB/s, " in line and line.endswith(" threads)")
    assert child_env[entrypoint.LOADER_PATH_VAR] == entrypoint.NO_CUSTOM_CODE_DIR
    # The server's statement names the bundle verified (peagle.bundle): the digest, set after the check.
    assert child_env[entrypoint.VERIFIED_BUNDLE_VAR] == env[MANIFEST_DIGEST_VAR]


def _flip_a_byte(root):
    path = root / "drafter" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _link_outside(root: Path) -> None:
    """target/config.json becomes a link to a readable file outside the bundle."""
    outside = root.parent / "outside-the-bundle.json"
    outside.write_text("{}")
    (root / "target" / "config.json").unlink()
    (root / "target" / "config.json").symlink_to(outside)


ATTACKS = [
    ("changed-byte", _flip_a_byte, "drafter/model.safetensors: sha256 expected"),
    ("missing-file", lambda root: (root / "target" / "config.json").unlink(), "target/config.json: missing"),
    ("extra-at-root", lambda root: (root / "extra.bin").write_bytes(b"x"), "extra.bin: a file at the bundle root"),
    ("extra-in-target", lambda root: (root / "target" / "extra.bin").write_bytes(b"x"),
     "target/extra.bin: not in the manifest"),
    ("model-py", lambda root: (root / "model.py").write_text("import os\n"), "model.py: a file named model.py"),
    ("escaping-link", _link_outside, "target/config.json: a symbolic link"),
    ("incomplete", lambda root: (root / "manifest.json").unlink(), "incomplete bundle"),
]


@pytest.mark.parametrize("name,attack,message", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_an_unverified_bundle_never_reaches_the_vllm_command(untrained, tmp_path, monkeypatch, capsys, name, attack,
                                                             message):
    """Before the change only manifest.json was hashed: each of these started vLLM on the attacker's bytes."""
    root = tmp_path / "opt-ml-model"
    env = _pinned(untrained, root)
    attack(root)

    def built(*_a, **_k):
        raise AssertionError("the vLLM command was built from an unverified bundle")

    monkeypatch.setattr(entrypoint, "environment_to_argv", built)
    with pytest.raises(EntrypointError, match="^PEAGLE_BUNDLE_MANIFEST_SHA256: pins manifest ") as err:
        build_command(env, model_dir=root)
    assert message in str(err.value)
    # The process: status 2, one line, and nothing exec'd.
    monkeypatch.setattr(entrypoint, "build_command", lambda e, a: build_command(e, a, model_dir=root))
    monkeypatch.setattr(entrypoint.os, "execvpe", built)
    monkeypatch.setattr(entrypoint.os, "environ", env)
    assert entrypoint.main(["serve"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("peagle-serve: error:")]
    assert message in line


@pytest.mark.parametrize("pin", ["", "latest", "AB" * 32])
def test_a_pin_that_is_not_64_lowercase_hex_stops_the_start(untrained, tmp_path, pin):
    root = tmp_path / "opt-ml-model"
    env = {**_pinned(untrained, root), "PEAGLE_BUNDLE_MANIFEST_SHA256": pin}
    with pytest.raises(EntrypointError, match="^PEAGLE_BUNDLE_MANIFEST_SHA256: got .*; allowed: a SHA-256 digest, 64 "
                                              "lowercase hex characters"):
        build_command(env, model_dir=root)


def test_unpinned_weights_are_said_to_be_unverified_and_still_never_the_loaders_path(untrained, capsys):
    # A model environment that claims a verified bundle is overwritten: only the check says one was verified.
    _, child_env = build_command({**_env_for(untrained), entrypoint.VERIFIED_BUNDLE_VAR: "ab" * 32})
    assert child_env[entrypoint.VERIFIED_BUNDLE_VAR] == "unpinned"
    assert "PEAGLE_BUNDLE_MANIFEST_SHA256 not set: the weights in /opt/ml/model are not verified" in capsys.readouterr().err
    assert (child_env[entrypoint.LOADER_PATH_VAR], child_env[entrypoint.LOADER_SCRIPT_VAR]) == (
        entrypoint.NO_CUSTOM_CODE_DIR, "model.py")
