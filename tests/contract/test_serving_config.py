"""The serving contract's own rules: rendering by the DLC rule and the limits both sides share."""

import json

import pytest

from peagle_contract.serving import (
    DRAFTER_MODEL_DIR,
    TARGET_MODEL_DIR,
    ServingConfig,
    ServingConfigError,
    check_environment,
    environment_to_argv,
    parse_speculative_config,
)

S3 = dict(target_model="s3://weights-bucket/gpt-oss-20b/", drafter_model="s3://weights-bucket/gpt-oss-20b-peagle/")


def test_renders_peagle_environment_by_the_dlc_rule():
    env = ServingConfig(**S3, num_speculative_tokens=5, extra_args={"enable_prefix_caching": True,
                                                                     "disable_log_stats": False}).to_environment()
    assert env["SM_VLLM_MODEL"] == TARGET_MODEL_DIR
    spec = json.loads(env["SM_VLLM_SPECULATIVE_CONFIG"])
    assert spec == {"method": "eagle3", "model": DRAFTER_MODEL_DIR, "num_speculative_tokens": 5,
                    "parallel_drafting": True}
    assert "\n" not in env["SM_VLLM_SPECULATIVE_CONFIG"] and " " not in env["SM_VLLM_SPECULATIVE_CONFIG"]
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    argv = environment_to_argv(env)
    assert "--enable-prefix-caching" in argv  # true -> bare flag
    assert "--disable-log-stats" not in argv  # false -> dropped
    assert argv[argv.index("--max-model-len") + 1] == "8192"
    assert not any(a.startswith("--use-v2") for a in argv)  # plain variables are not vLLM flags


def test_hub_ids_pass_through_and_are_not_s3():
    config = ServingConfig(target_model="openai/gpt-oss-20b", drafter_model="amazon/gpt-oss-20b-p-eagle")
    assert not config.weights_in_s3
    env = config.to_environment()
    assert env["SM_VLLM_MODEL"] == "openai/gpt-oss-20b"
    assert json.loads(env["SM_VLLM_SPECULATIVE_CONFIG"])["model"] == "amazon/gpt-oss-20b-p-eagle"


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        ({"num_speculative_tokens": 0}, "num_speculative_tokens", "1..32"),
        ({"num_speculative_tokens": 33}, "num_speculative_tokens", "1..32"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens", "1..32"),
        ({"parallel_drafting": False}, "parallel_drafting", "must be true"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size", "(1, 2, 4, 8)"),
        ({"max_model_len": 10}, "max_model_len", "256.."),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "0.1..0.98"),
        ({"dtype": "int3"}, "dtype", "bfloat16"),
        ({"target_model": ""}, "target_model", "S3 prefix"),
        ({"drafter_model": "http://example.com/x"}, "drafter_model", "S3 prefix"),
        ({"extra_args": {"api_key": "secret"}}, "extra_args['api_key']", "Authorization"),
        ({"extra_args": {"max_model_len": 4}}, "extra_args['max_model_len']", "ServingConfig field"),
        ({"extra_args": {"Bad-Name": 1}}, "extra_args['Bad-Name']", "snake_case"),
        ({"extra_args": {"chat_template": "a\nb"}}, "extra_args['chat_template']", "single line"),
    ],
)
def test_bad_settings_name_the_field_and_what_is_allowed(overrides, field, allowed):
    with pytest.raises(ServingConfigError) as err:
        ServingConfig(**{**S3, **overrides})
    assert err.value.field_name == field
    assert allowed in str(err.value)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"method":"eagle3",', "SM_VLLM_SPECULATIVE_CONFIG"),
        ("[1,2]", "SM_VLLM_SPECULATIVE_CONFIG"),
        ('{"method":"draft_model","model":"/d","num_speculative_tokens":3,"parallel_drafting":true}',
         "SM_VLLM_SPECULATIVE_CONFIG.method"),
        ('{"method":"eagle3","model":"/d","num_speculative_tokens":3}', "SM_VLLM_SPECULATIVE_CONFIG.parallel_drafting"),
        ('{"method":"eagle3","model":"/d","num_speculative_tokens":64,"parallel_drafting":true}',
         "SM_VLLM_SPECULATIVE_CONFIG.num_speculative_tokens"),
        ('{"method":"eagle3","num_speculative_tokens":4,"parallel_drafting":true}', "SM_VLLM_SPECULATIVE_CONFIG.model"),
    ],
)
def test_speculative_config_checks(raw, field):
    with pytest.raises(ServingConfigError) as err:
        parse_speculative_config(raw)
    assert err.value.field_name == field


def test_environment_checks_refuse_api_key_and_multiline_values():
    good = ServingConfig(**S3).to_environment()
    assert check_environment(good)["num_speculative_tokens"] == 7
    with pytest.raises(ServingConfigError, match="SM_VLLM_API_KEY"):
        check_environment({**good, "SM_VLLM_API_KEY": "x"})
    with pytest.raises(ServingConfigError, match="single line"):
        check_environment({**good, "SM_VLLM_CHAT_TEMPLATE": "{{a}}\n{{b}}"})
    with pytest.raises(ServingConfigError, match="is required"):
        check_environment({"SM_VLLM_MODEL": "/opt/ml/model"})


def test_a_flag_turned_off_renders_the_no_form_and_contradictions_are_refused():
    env = ServingConfig(**S3, extra_args={"enable_prefix_caching": False}).to_environment()
    assert env["SM_VLLM_NO_ENABLE_PREFIX_CACHING"] == "true" and "SM_VLLM_ENABLE_PREFIX_CACHING" not in env
    assert "--no-enable-prefix-caching" in environment_to_argv(env)
    with pytest.raises(ServingConfigError) as err:
        ServingConfig(**S3, extra_args={"enable_prefix_caching": True, "no_enable_prefix_caching": True})
    assert err.value.field_name == "extra_args['no_enable_prefix_caching']"


def test_environment_limits_are_sagemakers_and_fail_at_construction():
    """The limits come from botocore's SageMaker service model (CreateModel's EnvironmentMap), not from us."""
    import botocore.session

    from peagle_contract.serving import ENV_MAX_ENTRIES, ENV_MAX_KEY_CHARS, ENV_MAX_VALUE_CHARS

    model = botocore.session.get_session().get_service_model("sagemaker")
    assert model.shape_for("EnvironmentMap").metadata["max"] == ENV_MAX_ENTRIES
    assert model.shape_for("EnvironmentKey").metadata["max"] == ENV_MAX_KEY_CHARS
    assert model.shape_for("EnvironmentValue").metadata["max"] == ENV_MAX_VALUE_CHARS

    with pytest.raises(ServingConfigError) as err:
        ServingConfig(**S3, extra_args={"chat_template": "x" * (ENV_MAX_VALUE_CHARS + 1)})
    assert err.value.field_name == "extra_args['chat_template']" and "1024" in str(err.value)
    ServingConfig(**S3, extra_args={"chat_template": "x" * ENV_MAX_VALUE_CHARS})  # the bound itself is allowed
    many = {f"flag_{i}": i for i in range(ENV_MAX_ENTRIES)}
    with pytest.raises(ServingConfigError) as err:
        ServingConfig(**S3, extra_args=many)
    assert err.value.field_name == "extra_args" and "at most 100" in str(err.value)


PIN = "3c" * 32
PINNED = dict(target_model=f"s3://weights-bucket/bundles/gpt-oss/{PIN}/target/",
              drafter_model=f"s3://weights-bucket/bundles/gpt-oss/{PIN}/drafter/", bundle_manifest_sha256=PIN)


def test_a_pin_renders_beside_the_two_folders_of_the_bundle_it_names():
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR, bundle_uri

    assert bundle_uri("s3://weights-bucket/bundles/gpt-oss/", PIN) + "target/" == PINNED["target_model"]
    assert ServingConfig(**PINNED).to_environment()[MANIFEST_DIGEST_VAR] == PIN


@pytest.mark.parametrize(("overrides", "field", "allowed"), [
    # Not 64 lowercase hex characters.
    ({"bundle_manifest_sha256": "3C" * 32}, "bundle_manifest_sha256", "64 lowercase hex"),
    ({"bundle_manifest_sha256": "3c" * 31}, "bundle_manifest_sha256", "64 lowercase hex"),
    ({"bundle_manifest_sha256": ""}, "bundle_manifest_sha256", "64 lowercase hex"),
    # A pin with models outside the bundle it names: the old fixed prefix, another digest's folder, two bundles,
    # the drafter inside the target, hub ids (the container would find no bundle to verify).
    ({"target_model": "s3://weights-bucket/bundles/gpt-oss/target/",
      "drafter_model": "s3://weights-bucket/bundles/gpt-oss/drafter/"}, "target_model", f"/{PIN[:12]}.../target/"),
    ({"target_model": f"s3://weights-bucket/bundles/gpt-oss/{'4d' * 32}/target/"}, "target_model", "ending in"),
    ({"drafter_model": f"s3://weights-bucket/bundles/other/{PIN}/drafter/"}, "drafter_model",
     f"'s3://weights-bucket/bundles/gpt-oss/{PIN}/drafter/'"),
    ({"drafter_model": f"s3://weights-bucket/bundles/gpt-oss/{PIN}/target/drafter/"}, "drafter_model", "same bundle"),
    ({"target_model": "openai/gpt-oss-20b", "drafter_model": "amazon/gpt-oss-20b-p-eagle"}, "target_model",
     "S3 prefix ending in"),
])
def test_a_pin_must_be_a_digest_and_name_the_bundle_the_models_come_from(overrides, field, allowed):
    with pytest.raises(ServingConfigError) as err:
        ServingConfig(**{**PINNED, **overrides})
    assert err.value.field_name == field
    assert allowed in str(err.value) and "got " in str(err.value)


# -- K by load (vLLM's num_speculative_tokens_per_batch_size) ---------------------------------------------

ON_OFF = ((1, 2, 7), (3, 64, 0))


def test_a_k_schedule_renders_into_the_speculative_config_and_reads_back_as_the_container_states_it():
    from peagle_contract.served_config import expected_from_environment

    env = ServingConfig(**S3, num_speculative_tokens_per_batch_size=ON_OFF).to_environment()
    spec = parse_speculative_config(env["SM_VLLM_SPECULATIVE_CONFIG"])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 7], [3, 64, 0]]
    assert spec["num_speculative_tokens"] == 7 and spec["parallel_drafting"] is True
    assert expected_from_environment(env).k_by_load == "1-2:7,3-64:0"
    fixed = ServingConfig(**S3).to_environment()
    assert "num_speculative_tokens_per_batch_size" not in json.loads(fixed["SM_VLLM_SPECULATIVE_CONFIG"])
    assert expected_from_environment(fixed).k_by_load == "fixed"


def test_a_k_schedule_is_checked_with_vllms_own_rules_first():
    """Whatever this module admits, vLLM's validator admits too (the same ranges, normalised alike)."""
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    for schedule in (ON_OFF, ((1, 64, 7),), ((1, 1, 7), (2, 2, 0), (3, 9, 7))):
        ServingConfig(**S3, num_speculative_tokens_per_batch_size=schedule)
        assert validate_and_normalize_dynamic_sd_schedule([list(e) for e in schedule]) == [tuple(e) for e in schedule]


@pytest.mark.parametrize(("schedule", "field", "allowed"), [
    ([], "num_speculative_tokens_per_batch_size", "ascending from 1"),
    ("1-2:7", "num_speculative_tokens_per_batch_size", "ascending from 1"),
    ([[1, 1, 7]] * 17, "num_speculative_tokens_per_batch_size", "at most 16"),
    ([[1, 2]], "num_speculative_tokens_per_batch_size[0]", "three integers"),
    ([[1, 2, True]], "num_speculative_tokens_per_batch_size[0]", "three integers"),
    ([[1, 2, "7"]], "num_speculative_tokens_per_batch_size[0]", "three integers"),
    ([[0, 2, 7]], "num_speculative_tokens_per_batch_size[0]", "1 <= first <= last"),
    ([[3, 2, 7]], "num_speculative_tokens_per_batch_size[0]", "1 <= first <= last"),
    ([[2, 8, 7]], "num_speculative_tokens_per_batch_size[0]", "start at 1"),
    ([[1, 2, 7], [4, 8, 0]], "num_speculative_tokens_per_batch_size[1]", "start at 3"),   # a gap
    ([[1, 4, 7], [3, 8, 0]], "num_speculative_tokens_per_batch_size[1]", "start at 5"),   # an overlap
    ([[3, 8, 0], [1, 2, 7]], "num_speculative_tokens_per_batch_size[0]", "start at 1"),   # unsorted
    ([[1, 2, 4]], "num_speculative_tokens_per_batch_size[0]", "0 (no drafting"),         # K between
    ([[1, 2, 8]], "num_speculative_tokens_per_batch_size[0]", "or 7"),                  # above K
    ([[1, 2, -1]], "num_speculative_tokens_per_batch_size[0]", "or 7"),
])
def test_a_bad_k_schedule_names_the_range_and_what_is_allowed(schedule, field, allowed):
    with pytest.raises(ServingConfigError) as err:
        ServingConfig(**S3, num_speculative_tokens_per_batch_size=schedule)
    assert err.value.field_name == field
    assert allowed in str(err.value)
    assert len(str(err.value)) < 400  # a long value is cut, never echoed whole


def test_the_image_refuses_a_k_schedule_the_contract_would_not_render():
    base = {"method": "eagle3", "model": "/d", "num_speculative_tokens": 7, "parallel_drafting": True}
    assert parse_speculative_config(json.dumps({**base, "num_speculative_tokens_per_batch_size": [[1, 2, 7],
                                                                                                  [3, 9, 0]]}))
    with pytest.raises(ServingConfigError) as err:
        parse_speculative_config(json.dumps({**base, "num_speculative_tokens_per_batch_size": [[1, 9, 3]]}))
    assert err.value.field_name == "SM_VLLM_SPECULATIVE_CONFIG.num_speculative_tokens_per_batch_size[0]"
