"""Model presets: a serving config from a preset, and the checks a preset makes of it on an instance."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from peagle_contract.serving import ServingConfig

from peagle_constructs import ConfigError
from peagle_constructs.presets import GPT_OSS_20B, GPT_OSS_120B, PRESETS

BUNDLE = {"target_model": "s3://peagle-weights/bundles/gpt-oss/target/", "drafter_model": "s3://peagle-weights/bundles/gpt-oss/drafter/"}


def test_a_preset_serves_its_cards_settings_and_takes_overrides():
    serving = GPT_OSS_20B.serving(**BUNDLE, max_model_len=8192, extra_args={"stream_interval": 5})
    assert serving.num_speculative_tokens == GPT_OSS_20B.recommended_k == 7
    assert serving.max_model_len == 8192
    # The card's flags, the KV cache dtype, and the override merged over them.
    assert serving.extra_args["kv_cache_dtype"] == "fp8" and serving.extra_args["stream_interval"] == 5
    assert serving.extra_args["async_scheduling"] is True
    assert serving.extra_environment == {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}


def test_overrides_are_the_serving_configs_own_fields_by_name():
    with pytest.raises(TypeError, match="unexpected keyword argument 'k'"):
        GPT_OSS_20B.serving(**BUNDLE, k=7)
    # Every keyword the preset takes is a ServingConfig field, so an override is never silently dropped.
    taken = set(inspect.signature(GPT_OSS_20B.serving).parameters)
    assert taken <= {f.name for f in dataclasses.fields(ServingConfig)}
    scheduled = GPT_OSS_20B.serving(**BUNDLE, num_speculative_tokens_per_batch_size=((1, 4, 7), (5, 64, 0)))
    assert scheduled.num_speculative_tokens == 7 and scheduled.num_speculative_tokens_per_batch_size[1] == (5, 64, 0)


def test_every_presets_defaults_fit_its_smallest_listed_instance():
    for preset in PRESETS.values():
        serving = preset.serving(**BUNDLE, tensor_parallel_size=1, num_speculative_tokens=1)
        fits = [name for name, tp in preset.instances.items() if tp == 1]
        for name in fits:
            preset.check(serving, instance_type=name)  # raises when it does not fit


@pytest.mark.parametrize(("changes", "instance", "field", "allowed"), [
    ({"num_speculative_tokens": 11}, "ml.g6e.xlarge", "preset.num_speculative_tokens", "allowed: 1..10"),
    ({"max_model_len": 262144}, "ml.g6e.xlarge", "preset.max_model_len", "at most 131072"),
    ({}, "ml.g5.xlarge", "preset.instance_type", "allowed for GPT-OSS-20B"),
    ({"tensor_parallel_size": 2}, "ml.g6e.xlarge", "preset.tensor_parallel_size", "uses 1"),
    # 512 sequences of 32K tokens of fp8 KV cache do not fit one 48 GB L40S beside the weights.
    ({"max_num_seqs": 512}, "ml.g6e.xlarge", "preset.max_num_seqs", "does not fit ml.g6e.xlarge"),
])
def test_what_a_preset_refuses_names_the_numbers(changes, instance, field, allowed):
    serving = GPT_OSS_20B.serving(**BUNDLE, **changes)
    with pytest.raises(ConfigError) as caught:
        GPT_OSS_20B.check(serving, instance_type=instance)
    assert caught.value.field_name == field and allowed in str(caught.value), str(caught.value)


def test_the_larger_model_needs_its_weights_split_on_smaller_gpus():
    serving = GPT_OSS_120B.serving(**BUNDLE, tensor_parallel_size=4, max_num_seqs=4, max_model_len=8192)
    GPT_OSS_120B.check(serving, instance_type="ml.g6e.12xlarge")  # 4 x 48 GB
    with pytest.raises(ConfigError, match=r"^preset.instance_type: got 'ml.g6e.xlarge'"):
        GPT_OSS_120B.check(serving, instance_type="ml.g6e.xlarge")
