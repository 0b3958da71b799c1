"""The vLLM plugin's switch, version gate, fallback and call counter, in one subprocess (see
plugin_scenarios_worker.py): vLLM's real proposer class is patched and restored there, never here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


@pytest.fixture(scope="module")
def scenarios() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    env.pop("PEAGLE_FUSED_DRAFT", None)
    proc = subprocess.run([sys.executable, str(HERE / "plugin_scenarios_worker.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_point_is_declared(scenarios):
    assert scenarios["entry_points"] == ["peagle_runtime.plugin:register"]


@pytest.mark.parametrize("name", ["auto_on_cpu", "auto_explicit_on_cpu", "off"])
def test_silent_no_op(scenarios, name):
    # Every vLLM process in this repo's other tests loads the plugin with the default: it must stay quiet.
    assert scenarios[name] == {"installed": False, "log": [], "error": None}


def test_on_without_cuda_needs_the_interpreter(scenarios):
    result = scenarios["on_without_interpreter"]
    assert not result["installed"]
    assert len(result["log"]) == 1 and "TRITON_INTERPRET=1" in result["log"][0]


def test_on_installs_once(scenarios):
    result = scenarios["on_with_interpreter"]
    assert result["installed"]
    assert len(result["log"]) == 1 and "installed" in result["log"][0]  # registered twice, patched once


def test_other_vllm_version_keeps_vllms_path(scenarios):
    result = scenarios["other_vllm_version"]
    assert not result["installed"]
    assert len(result["log"]) == 1
    assert "0.32.0" in result["log"][0] and "0.33.0" in result["log"][0]


def test_bad_switch_value_names_the_variable(scenarios):
    result = scenarios["bad_value"]
    assert not result["installed"]
    assert "PEAGLE_FUSED_DRAFT" in result["error"] and "'yes'" in result["error"]


def test_other_drafting_methods_fall_back_uncounted(scenarios):
    result = scenarios["fallback_and_stats"]
    assert result["fallback_not_counted"]
    assert result["fallback_same_as_vllm"]


def test_calls_are_counted_in_the_stats_file(scenarios):
    result = scenarios["fallback_and_stats"]
    assert result["calls_after_two_peagle_steps"] == 2
    stats = result["stats"]  # written after the third (deliberately broken) step
    assert stats["calls"] == 3 and stats["pid"] == result["pid"] and stats["vllm"] == "0.32.0"
    assert stats["rows"] == 3 * (20 + 4 * 3)  # mixed_rejected: 20 input rows, 4 requests, K=4


def test_verify_mode_checks_against_vllm_and_can_fail(scenarios):
    result = scenarios["fallback_and_stats"]
    assert result["verified_clean"] == {"verified": 2, "mismatches": 0}
    assert result["stats"]["verified"] == 3 and result["stats"]["mismatches"] == 1


def test_auto_is_never_decided_inside_the_engine(scenarios):
    """The check runs at container start, in a child process (test_start_check.py); met in the engine, ``auto``
    leaves vLLM's path in place and says why, once."""
    result = scenarios["auto_on_gpu"]
    assert not result["installed"] and result["error"] is None
    (line,) = result["log"]
    assert "entrypoint" in line and "start_check" in line
