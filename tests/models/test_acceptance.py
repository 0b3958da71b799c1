"""bench/acceptance.py: acceptance per draft position read per prompt from vLLM's counters, pooled, and
bootstrapped over prompts (paired between heads); the HumanEval set holds the end-to-end run's problems; and
on a real engine (the random pair) the per-prompt counters add up to what one run over every prompt counts."""

from __future__ import annotations

import pytest

from bench import acceptance, prompt_sets, spec_rounds


@pytest.fixture(scope="module")
def acc():
    return acceptance


def _row(drafts: int, *accepted: int) -> dict:
    return {"drafts": drafts, "accepted": list(accepted), "output_tokens": 0}


def test_pooled_acceptance_sums_counts_before_dividing(acc):
    rows = [_row(10, 6, 3, 1), _row(30, 12, 6, 0)]  # 40 drafts; 18, 9, 1 reached positions 1, 2, 3
    out = acc.pooled(rows, 3)
    assert out["drafts"] == 40
    assert out["at_least"] == [0.45, 0.225, 0.025]
    assert out["acceptance_length"] == {1: 1.45, 2: 1.675, 3: 1.7}
    assert out["conditional"] == [0.45, 0.5, pytest.approx(1 / 9, abs=1e-4)]
    assert acc.pooled([_row(0, 0)], 1)["acceptance_length"] == {}
    # A prompt vLLM reported fewer positions for counts zeros there.
    assert acc.counts({"drafts": 5, "accepted_per_position": [2], "token_ids": [[1, 2, 3]]}, 3) == \
        {"drafts": 5, "accepted": [2, 0, 0], "output_tokens": 3}


def test_the_paired_ratio_resamples_the_same_prompts_for_both_heads(acc):
    base = [_row(10, 4 + i % 3, 1) for i in range(12)]
    same = acc.paired_ratio(base, base, 2)
    assert same == {"value": 1.0, "interval": [1.0, 1.0]}  # paired: a head against itself never varies
    better = [_row(r["drafts"], r["accepted"][0] + 2, r["accepted"][1] + 1) for r in base]
    ratio = acc.paired_ratio(better, base, 2)
    assert ratio["value"] > 1.0 and ratio["interval"][0] > 1.0
    with pytest.raises(ValueError, match="the same prompts"):
        acc.paired_ratio(base, base[:3], 2)


def test_the_goal_is_the_interval_lower_bound(acc):
    figures = {"p_eagle_over_eagle3": {"humaneval": {"k3": {"value": 0.99, "interval": [0.96, 1.02]},
                                                     "k4": {"value": 0.99, "interval": [0.93, 1.04]}}}}
    goals = acc.goals(figures)
    assert goals["accept_ratio_k3"]["met"] and not goals["accept_ratio_k4"]["met"]
    assert goals["accept_ratio_k4"]["value"] == 0.99 and goals["accept_ratio_k4"]["interval"] == [0.93, 1.04]


def test_the_humaneval_set_holds_the_end_to_end_problems_where_it_says(acc):
    spread = prompt_sets.spread
    picked, positions = acc.humaneval_indexes(16)
    assert [picked[i] for i in positions] == spread(164, 16)
    assert picked == sorted(set(picked)) and set(spread(164, 48)) <= set(picked)
    assert spread(164, 16)[:3] == [0, 11, 22] and spread(164, 16)[-1] == 163


@pytest.mark.engine
def test_per_prompt_counters_add_up_to_one_run_over_every_prompt(acc, tmp_path):
    from models import random_pair

    pair = random_pair.build()
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    measured = acc.measure(pair, {"set": prompts}, max_tokens=12, workdir=tmp_path, warmup=[5, 6], k=3,
                           max_model_len=512)
    rows = measured["p-eagle"]["set"]
    assert len(rows) == 3 and all(r["drafts"] > 0 and r["output_tokens"] == 12 for r in rows)
    # The same engine settings over all prompts at once count what the per-prompt readings add up to.
    config = {"name": "whole", "target": str(pair.target), "warmup_prompt": [5, 6], "max_tokens": 12,
              "max_model_len": 512, "max_num_seqs": 1, "speculative_config": pair.speculative_config(k=3)}
    workers = spec_rounds.start_workers([config], tmp_path / "whole")
    try:
        whole = acc.counts(workers["whole"].run(prompts, concurrency=1), 3)
    finally:
        spec_rounds.close_workers(workers)
    assert whole["drafts"] == sum(r["drafts"] for r in rows)
    assert whole["accepted"] == [sum(r["accepted"][i] for r in rows) for i in range(3)]
