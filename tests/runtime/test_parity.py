"""P-EAGLE does not change the output: greedy tokens equal the no-speculation engine's, prompt by prompt."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from runtime_server import FIGURES

pytestmark = pytest.mark.engine

PROMPTS = [
    "Once upon a time",
    "The quick brown fox",
    "def add(a, b):\n    return",
    "Paris is the capital of",
    "Numbers: 1 2 3 4",
    "SageMaker endpoints serve",
    "Speculative decoding drafts",
    "Questions? Answers!",
    "for i in range(10):",
    "A",
    "zzz",
    "Berlin is the capital of Germany. Paris is",
    "3.14159 2.71828",
    "user assistant system",
    "The target model verifies the draft tokens in one pass and",
    "lazy dog lazy dog lazy dog",
    "print(",
    "\"like this\" and 'that'",
    "Once",
    "large language models behind an HTTPS API",
    "mask token and a shared hidden state",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "small model that wanted to be fast. It",
    "!!! ???",
]
MAX_TOKENS = 32


def _greedy_tokens(base: str, model: str, prompt: str) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(base + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_greedy_output_identical_with_and_without_p_eagle(server, baseline):
    assert len(set(PROMPTS)) >= 20
    model = str(server.target)
    # Both engines get the prompts concurrently (batched), as they would in service.
    with ThreadPoolExecutor(8) as pool:
        spec = list(pool.map(lambda p: _greedy_tokens(server.base, model, p), PROMPTS))
        plain = list(pool.map(lambda p: _greedy_tokens(baseline.base, model, p), PROMPTS))
    mismatched = [p for p, a, b in zip(PROMPTS, spec, plain) if a != b]
    FIGURES["greedy parity (K=4 vs none)"] = (f"{len(PROMPTS) - len(mismatched)}/{len(PROMPTS)} prompts "
                                             f"token-identical, {MAX_TOKENS} tokens each")
    assert all(len(t) == MAX_TOKENS for t in spec + plain)
    assert not mismatched, f"{len(mismatched)}/{len(PROMPTS)} prompts differ: {mismatched}"
    # The outputs are not degenerate: different prompts lead to different continuations.
    assert len({tuple(t) for t in plain}) >= len(PROMPTS) - 2
