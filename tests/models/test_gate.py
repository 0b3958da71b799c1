"""The drafter gate: a candidate stages only when its AL ratio's paired interval clears the margin; both figures
are in its report whichever way it goes."""

from __future__ import annotations

import random

import pytest

from models.trainer.gate import PASSED, REFUSED, judge

K = 3


def _rows(rates: list[float], n: int, *, seed: int, drafts: int = 20) -> list[dict]:
    """``n`` requests, each ``drafts`` drafts whose position i is reached with probability rates[i] given i - 1."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        accepted = [0] * K
        for _ in range(drafts):
            for i, rate in enumerate(rates):
                if rng.random() >= rate:
                    break
                accepted[i] += 1
        rows.append({"drafts": drafts, "accepted": accepted, "output_tokens": 0})
    return rows


def test_a_clearly_better_head_passes_and_says_by_how_much():
    before, after = _rows([0.4, 0.4, 0.4], 40, seed=1), _rows([0.8, 0.7, 0.6], 40, seed=2)
    result = judge(before, after, k=K, margin=1.1)
    assert result.gate == PASSED and result.al_ratio["interval"][0] >= 1.1
    assert result.al_before["value"] < result.al_after["value"]
    assert result.report()["requests_held_out"] == 40 and len(result.conditional_after) == K
    assert "passed" in result.summary()


def test_an_equal_head_is_refused_with_both_figures():
    before, after = _rows([0.6, 0.6, 0.6], 40, seed=1), _rows([0.6, 0.6, 0.6], 40, seed=2)
    result = judge(before, after, k=K, margin=1.05)
    assert result.gate == REFUSED
    line = result.summary()
    assert "refused: the lower bound" in line and f"{result.al_before['value']:.3f}" in line


def test_a_ratio_above_the_margin_on_too_few_requests_is_refused():
    """Few, noisy requests: the point estimate clears the margin but its interval does not."""
    before, after = _rows([0.5, 0.5, 0.5], 4, seed=3, drafts=3), _rows([0.6, 0.6, 0.6], 4, seed=4, drafts=3)
    result = judge(before, after, k=K, margin=1.05)
    assert result.al_ratio["value"] > 1.05 and result.gate == REFUSED


@pytest.mark.parametrize("before, after, margin, message", [
    ([{"drafts": 1, "accepted": [1, 0, 0]}], [], 1.1, "rows: got 1 in service and 0 candidate"),
    ([{"drafts": 0, "accepted": [0, 0, 0]}], [{"drafts": 1, "accepted": [1, 0, 0]}], 1.1, "in service: no drafts"),
    ([{"drafts": 1, "accepted": [1, 0, 0]}], [{"drafts": 1, "accepted": [1, 0, 0]}], 0.9, "margin: got 0.9"),
])
def test_rows_that_cannot_be_compared_are_refused_by_name(before, after, margin, message):
    with pytest.raises(ValueError, match=message):
        judge(before, after, k=K, margin=margin)


@pytest.mark.engine
def test_on_vllm_the_head_in_service_against_itself_is_refused_with_equal_figures(untrained):
    """Both heads served by vLLM (the random pair's drafter as both): the same greedy tokens, the same counters per
    request, so a ratio of exactly 1 and a refusal; tokens/s is reported beside it."""
    from transformers import AutoTokenizer

    from models.trainer.gate import measure

    tokenizer = AutoTokenizer.from_pretrained(untrained.target)
    prompts = [tokenizer(f"Once upon a time, number {i},")["input_ids"] for i in range(8)]
    result = measure(untrained.target, in_service=untrained.drafter, candidate=untrained.drafter, prompts=prompts,
                     k=3, margin=1.05, max_tokens=16, log=lambda line: None)
    assert result.outputs_identical and result.requests == 8
    assert result.al_before["value"] == result.al_after["value"] and result.al_ratio["value"] == 1.0
    assert result.gate == REFUSED and "refused: the lower bound 1.000" in result.summary()
    assert result.tokens_per_s_ratio["value"] > 0 and len(result.report()["notes"]) == 1
