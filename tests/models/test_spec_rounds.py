"""bench/spec_rounds.py: engines kept alive side by side answer interleaved rounds (real vLLM engines on the
random pair), per-round ratios to plain decoding, greedy parity checked every round."""

from __future__ import annotations

import pytest

from bench import paired_stats, spec_rounds


@pytest.fixture(scope="module")
def rounds_module():
    return spec_rounds


def test_the_bootstrap_interval_holds_the_median_and_narrows_with_agreeing_rounds():
    median_interval = paired_stats.median_interval
    scattered = [0.9, 1.3, 1.0, 1.2, 0.8, 1.25, 1.1, 0.95]
    low, high = median_interval(scattered)
    assert low <= sorted(scattered)[4] <= high and high - low > 0.1
    tight = [1.1, 1.11, 1.09, 1.1, 1.12, 1.1, 1.08, 1.1]
    t_low, t_high = median_interval(tight)
    assert 1.0 < t_low <= 1.1 <= t_high and t_high - t_low < 0.05


def test_paired_ratio_is_round_by_round(rounds_module):
    a = [{"tokens_per_s": x} for x in (12.0, 24.0, 11.0)]
    b = [{"tokens_per_s": x} for x in (10.0, 20.0, 10.0)]  # the machine slowed in round 2 for both
    ratio = rounds_module.paired_ratio(a, b)
    assert ratio["per_round"] == [1.2, 1.2, 1.1] and ratio["median"] == 1.2


@pytest.mark.slow
def test_live_engines_answer_interleaved_rounds_and_parity_is_checked(rounds_module, tmp_path):
    from models import random_pair

    pair = random_pair.build()
    base = {"target": str(pair.target), "warmup_prompt": "def f(x):", "max_tokens": 12, "max_model_len": 512,
            "max_num_seqs": 2}
    configs = [dict(base, name="plain", method="plain", k=0, speculative_config=None),
               dict(base, name="p-eagle-k2", method="p-eagle", k=2, speculative_config=pair.speculative_config(k=2)),
               # Negative control: fewer tokens per request, so its output differs from plain decoding's.
               dict(base, name="short", method="plain", k=0, speculative_config=None, max_tokens=6)]
    workers = rounds_module.start_workers(configs, tmp_path)
    try:
        assert all(w.proc.poll() is None for w in workers.values())  # every engine alive at once
        prompts = ["def add(a, b):", "class Stack:", "import os\n"]
        two = {n: workers[n] for n in ("plain", "p-eagle-k2")}
        measured = rounds_module.rounds(two, prompts, concurrency=1, count=3, per_round=2)
        assert [len(measured[n]) for n in two] == [3, 3]
        for r in measured["plain"]:
            assert r["ratio_to_plain"] == 1.0 and len(r["token_ids"]) == 2
        # Round 2 sent prompts 2 and 0 (cycling): each engine answered the same ones as plain did.
        assert measured["p-eagle-k2"][1]["token_ids"] == measured["plain"][1]["token_ids"]
        assert measured["p-eagle-k2"][1]["token_ids"] != measured["plain"][0]["token_ids"]
        summary = rounds_module.summary(dict(configs[1], concurrency=1), measured["p-eagle-k2"])
        assert summary["drafts"] > 0 and summary["acceptance_length"] >= 1.0
        assert summary["drafter_forwards_per_step"] > 0 and summary["rounds"] == 3
        low, high = summary["speedup_vs_plain_90ci"]
        assert low <= summary["speedup_vs_plain"] <= high
        with pytest.raises(RuntimeError, match="short: greedy output differs from plain decoding in round 1"):
            rounds_module.rounds({n: workers[n] for n in ("plain", "short")}, prompts, concurrency=1, count=1,
                                 per_round=1)
    finally:
        rounds_module.close_workers(workers)
    assert all(w.proc.poll() is not None for w in workers.values())
