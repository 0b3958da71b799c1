"""Operator levers a request may pull only when the serving config enables them, end to end without an engine:
checked at synth (ServingConfig), rendered into the container's environment, parsed back by the entrypoint,
and honoured by the checks (vLLM's own request models) - every other lever refused by name.

Before issue 30 which levers a client could pull was vLLM's flags of the day: ``kv_transfer_params`` and
``priority`` were accepted (``X-Vllm-Priority`` too), ``chat_template`` refused only while a vLLM flag was off."""

from __future__ import annotations

import pytest
from peagle_contract.serving import (
    REQUEST_CAPABILITIES,
    REQUEST_CAPABILITIES_VAR,
    ServingConfig,
    ServingConfigError,
    parse_request_capabilities,
)

from peagle_runtime.entrypoint import EntrypointError, build_command
from peagle_runtime.header_checks import CAPABILITY_HEADERS, check_headers
from peagle_runtime.request_checks import RequestValidator, Verdict
from peagle_runtime.refusals import Rejection

HEADER_ONLY = {"data_parallel_rank"}  # vLLM reads it from a header only


def _env(untrained, **kw) -> dict[str, str]:
    cfg = ServingConfig(target_model="s3://bucket/models/target/", drafter_model="s3://bucket/models/drafter/", **kw)
    return cfg.to_environment(target_dir=str(untrained.target), drafter_dir=str(untrained.drafter))


def test_enabled_capabilities_travel_from_the_config_to_the_server(untrained):
    env = _env(untrained, request_capabilities=frozenset({"priority", "chat_template"}))
    assert env[REQUEST_CAPABILITIES_VAR] == "chat_template,priority"
    _, child_env = build_command(env)
    assert parse_request_capabilities(child_env) == {"priority", "chat_template"}
    assert REQUEST_CAPABILITIES_VAR not in _env(untrained)  # none enabled: nothing rendered, nothing allowed
    assert parse_request_capabilities(build_command(_env(untrained))[1]) == frozenset()


def test_an_unknown_capability_is_refused_at_synth_and_by_the_entrypoint(untrained):
    with pytest.raises(ServingConfigError, match=r"^request_capabilities: got 'logits_processors'; allowed: any of"):
        _env(untrained, request_capabilities=frozenset({"logits_processors"}))
    with pytest.raises(EntrypointError, match=rf"^{REQUEST_CAPABILITIES_VAR}: got 'everything'"):
        build_command({**_env(untrained), REQUEST_CAPABILITIES_VAR: "priority,everything"})


def test_every_capability_is_a_field_of_vllms_request_models_or_a_header_vllm_reads():
    """The list is ours, the fields are vLLM's: a vLLM upgrade that renames one must fail here, not go quiet."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    fields = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    assert set(REQUEST_CAPABILITIES) - HEADER_ONLY <= fields
    assert HEADER_ONLY <= set(CAPABILITY_HEADERS.values()) <= set(REQUEST_CAPABILITIES)


@pytest.fixture(scope="module")
def validators() -> dict[str, RequestValidator]:
    return {"none": RequestValidator.from_vllm(),
            "priority": RequestValidator.from_vllm(capabilities=frozenset({"priority"}))}


@pytest.mark.parametrize("field, value", [("priority", -5), ("kv_transfer_params", {"do_remote_prefill": True}),
                                          ("vllm_xargs", {"a": 1}), ("session_id", "s1"), ("cache_salt", None)])
def test_a_lever_is_refused_by_name_unless_enabled(validators, field, value):
    import json

    body = json.dumps({"prompt": "x", field: value}).encode()
    refused = validators["none"].check(route="/v1/completions", body=body)
    if field == "cache_salt":  # a client's own cache isolation, not a lever
        assert isinstance(refused, Verdict)
        return
    assert isinstance(refused, Rejection) and refused.param == field and "request_capabilities" in refused.message
    enabled = validators["priority"].check(route="/v1/completions", body=body)
    assert isinstance(enabled, Verdict) == (field == "priority"), enabled


def test_a_lever_at_its_default_asks_for_nothing_and_passes(validators):
    """Clients that send every field with its default (``"priority": 0``) are not refused."""
    assert isinstance(validators["none"].check(route="/v1/completions", body=b'{"prompt": "x", "priority": 0}'),
                      Verdict)


def test_a_header_lever_follows_the_same_switch():
    headers = [(b"content-type", b"application/json"), (b"X-Vllm-Priority", b"-5")]
    refused = check_headers(headers, frozenset())
    assert refused is not None and refused.param == "header x-vllm-priority"
    assert check_headers(headers, frozenset({"priority"})) is None
