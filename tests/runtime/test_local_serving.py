"""The local runtime's one road: its container environment is the serving contract's own rendering of a
ServingConfig, and a stage's config reaches it whole but for what a CPU cannot take (harness.runtime)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from peagle_contract.serving import SPECULATIVE_CONFIG_VAR, ServingConfig, parse_speculative_config

from harness.runtime import LOCAL_BUNDLE, LocalRuntime, local_serving, on_this_cpu

TARGET, DRAFTER = Path("/models/target"), Path("/models/drafter")


def _stage() -> ServingConfig:
    from stacks.environments import DEV

    return replace(DEV.model.serving, num_speculative_tokens_per_batch_size=((1, 2, 7), (3, 64, 0)),
                   request_capabilities=frozenset({"priority"}))


def test_a_stages_config_keeps_k_its_schedule_and_levers_and_drops_what_a_cpu_cannot_take():
    stage = _stage()
    assert stage.extra_args.get("kv_cache_dtype") == "fp8" and stage.extra_environment  # the GPU preset's flags
    local = on_this_cpu(stage, max_model_len=2048, max_num_seqs=8)
    assert (local.num_speculative_tokens, local.num_speculative_tokens_per_batch_size, local.request_capabilities) == \
        (stage.num_speculative_tokens, stage.num_speculative_tokens_per_batch_size, stage.request_capabilities)
    assert (local.dtype, local.max_model_len, local.max_num_seqs, local.tensor_parallel_size) == ("float32", 2048, 8, 1)
    # Dev captures; a run here serves other weights, whose records must not pass as Dev's target's.
    assert stage.capture is not None and local.capture is None
    assert dict(local.extra_args) == {"enforce_eager": True, "seed": 0} and not local.extra_environment
    assert local.bundle_manifest_sha256 is None  # the weights are this machine's: the caller pins its own bundle


def test_the_runtime_environment_is_the_contracts_rendering_with_the_local_folders():
    serving = on_this_cpu(_stage(), max_model_len=2048)
    runtime = LocalRuntime(target=TARGET, drafter=DRAFTER, serving=serving)
    env = runtime.environment()
    rendered = serving.to_environment(target_dir=str(TARGET), drafter_dir=str(DRAFTER))
    assert {k: env[k] for k in rendered} == rendered  # every variable as the contract renders it
    spec = parse_speculative_config(env[SPECULATIVE_CONFIG_VAR])
    assert spec["model"] == str(DRAFTER) and spec["num_speculative_tokens"] == 7
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 7], [3, 64, 0]]
    assert env["PEAGLE_PORT"] == str(runtime.port)
    # Plain decoding: the same flags without the speculative config.
    plain = LocalRuntime(target=TARGET, drafter=None, serving=serving).environment()
    assert SPECULATIVE_CONFIG_VAR not in plain and plain["SM_VLLM_MAX_MODEL_LEN"] == "2048"


def test_a_local_config_takes_the_contracts_k_unless_given_and_is_checked_by_it():
    assert local_serving().num_speculative_tokens == ServingConfig.__dataclass_fields__["num_speculative_tokens"].default
    assert local_serving(num_speculative_tokens=3).num_speculative_tokens == 3
    assert local_serving().target_model.startswith(LOCAL_BUNDLE)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        local_serving(num_speculative_tokens=0)
