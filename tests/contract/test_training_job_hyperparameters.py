"""The drafter training job's contract: the hyperparameters the stack renders are exactly what the trainer reads
back, and anything else (what SageMaker would pass on from a hand-edited job, or a forged one) is refused by name."""

from __future__ import annotations

import json

import pytest

from peagle_contract.training_job import (
    HP_CPU_SECONDS, HP_K, HP_MARGIN, TrainingJobConfig, TrainingJobError, parse_hyperparameters,
    render_hyperparameters,
)

PIN = "0f" * 32


def _config(**changes) -> TrainingJobConfig:
    fields = dict(stage="dev", target_name="gpt-oss-20b", k=7, margin=1.05, max_tokens=128, bundle_sha256=PIN)
    return TrainingJobConfig(**{**fields, **changes})


@pytest.mark.parametrize("config", [_config(), _config(cpu_seconds=3600.0, margin=1.0, k=1),
                                    _config(stage="staging", target_name="org/model-1.5b", max_tokens=4096)])
def test_what_the_stack_renders_the_trainer_reads_back(config):
    rendered = render_hyperparameters(config)
    assert all(isinstance(v, str) for v in rendered.values())  # SageMaker takes strings only
    assert parse_hyperparameters(json.dumps(rendered)) == config


@pytest.mark.parametrize(("change", "field"), [
    ({HP_K: "7.0"}, "k"), ({HP_K: "0"}, "k"), ({HP_K: "33"}, "k"), ({HP_K: 7}, "k"),
    ({HP_MARGIN: "nan"}, "margin"), ({HP_MARGIN: "0.9"}, "margin"), ({HP_MARGIN: "1e1"}, "margin"),
    ({HP_CPU_SECONDS: "-5"}, "cpu_seconds"), ({"stage": "../prod"}, "stage"), ({"bundle_sha256": "AB" * 32},
                                                                              "bundle_sha256"),
    ({"epochs": "3"}, "hyperparameters.json"),
])
def test_anything_else_is_refused_naming_the_field(change, field):
    raw = {**render_hyperparameters(_config()), **change}
    with pytest.raises(TrainingJobError) as caught:
        parse_hyperparameters(json.dumps(raw))
    assert caught.value.field_name.endswith(field) and "allowed" in str(caught.value)


def test_a_missing_key_an_oversized_or_broken_file_is_refused():
    raw = render_hyperparameters(_config())
    del raw["bundle_sha256"]
    with pytest.raises(TrainingJobError, match=r"missing \['bundle_sha256'\]"):
        parse_hyperparameters(json.dumps(raw))
    with pytest.raises(TrainingJobError, match="holds 70000 bytes"):
        parse_hyperparameters(" " * 70000)
    with pytest.raises(TrainingJobError, match="not valid JSON"):
        parse_hyperparameters(b"{\xff")
    with pytest.raises(TrainingJobError, match="got a JSON list"):
        parse_hyperparameters("[]")


def test_a_long_value_is_not_echoed_whole():
    raw = {**render_hyperparameters(_config()), "stage": "x" * 5000}
    with pytest.raises(TrainingJobError) as caught:
        parse_hyperparameters(json.dumps(raw))
    assert len(str(caught.value)) < 300
