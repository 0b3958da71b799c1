"""The container's statement is built from the engine's configuration: K by load included, as the contract
renders it for the deployed environment (so a deploy check compares like with like)."""

from __future__ import annotations

from types import SimpleNamespace

from peagle_contract.served_config import expected_from_environment, parse
from peagle_contract.serving import ServingConfig
from peagle_runtime.served_statement import from_vllm_config

S3 = dict(target_model="s3://weights-bucket/t/", drafter_model="s3://weights-bucket/d/")


def _engine_config(serving: ServingConfig):
    # vLLM keeps the parsed speculative config as attributes; the schedule as it was given (a list of lists).
    spec = serving.speculative_config()
    return SimpleNamespace(speculative_config=SimpleNamespace(
        num_speculative_tokens=spec["num_speculative_tokens"], model=spec["model"], method=spec["method"],
        parallel_drafting=True, num_speculative_tokens_per_batch_size=spec.get("num_speculative_tokens_per_batch_size")))


def test_the_statement_says_the_schedule_the_engine_runs_and_matches_the_deployed_environment():
    for schedule, said in ((None, "fixed"), (((1, 2, 7), (3, 64, 0)), "1-2:7,3-64:0")):
        serving = ServingConfig(**S3, num_speculative_tokens_per_batch_size=schedule)
        served = from_vllm_config(_engine_config(serving), "0.32.0")
        assert served.k_by_load == said
        assert parse(served.render()) == served == expected_from_environment(serving.to_environment())
