"""P-EAGLE does not change the output: greedy tokens equal the no-speculation engine's, prompt by prompt,
with a drafter that gets most of its tokens accepted - the trained toy pair (models.toy_pair), on prompts
held out of its training. Equal output from a drafter that accepts nothing would only show that plain
decoding equals itself, so the acceptance is asserted too."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from models import spec_metrics
from models.trainer.corpus import held_out_prompts
from runtime_server import FIGURES

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MAX_TOKENS = 32
K = 4


def _greedy_tokens(base: str, model: str, prompt: str) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(base + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_greedy_output_identical_with_a_drafter_that_is_mostly_accepted(demo_engines):
    spec, plain = demo_engines["spec"], demo_engines["base"]
    # The held-out makers repeat a prompt now and then (four held-out names): 24 distinct ones.
    prompts = list(dict.fromkeys(held_out_prompts(48)))[:24]
    assert len(prompts) == 24
    model = str(spec.target)
    before = spec_metrics.scrape(spec.base)
    # Both engines get the prompts concurrently (batched), as they would in service.
    with ThreadPoolExecutor(8) as pool:
        drafted = list(pool.map(lambda p: _greedy_tokens(spec.base, model, p), prompts))
        reference = list(pool.map(lambda p: _greedy_tokens(plain.base, model, p), prompts))
    counted = spec_metrics.scrape(spec.base) - before
    mismatched = [p for p, a, b in zip(prompts, drafted, reference) if a != b]
    FIGURES["greedy parity, demo pair K=4"] = (
        f"{len(prompts) - len(mismatched)}/{len(prompts)} prompts token-identical, {MAX_TOKENS} tokens each; "
        f"acceptance rate {counted.acceptance_rate:.2f}, AL {counted.acceptance_length:.2f}")
    assert all(len(t) == MAX_TOKENS for t in drafted + reference)
    assert not mismatched, f"{len(mismatched)}/{len(prompts)} prompts differ: {mismatched}"
    assert len({tuple(t) for t in reference}) >= len(prompts) // 2  # the continuations follow the prompts
    # The drafter really drafts what the target says: most draft tokens are accepted, at every position.
    assert counted.draft_tokens >= K * 100
    assert counted.acceptance_rate >= 0.4, counted
    assert all(rate > 0.1 for rate in counted.per_position_rates()), counted.per_position_rates()
