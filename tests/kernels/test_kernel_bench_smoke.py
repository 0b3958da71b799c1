"""The GPU benchmarks stay runnable: their --smoke modes run here on the CPU (kernel bench under the Triton
interpreter). Checks shape coverage and bit-identity, never speed (that is for a GPU machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


def _run(module: str, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the module sets it itself
    proc = subprocess.run([sys.executable, "-m", module, "--smoke", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_kernel_bench_smoke(tmp_path):
    result = _run("bench.kernel", tmp_path / "kernel.json")
    assert result["env"]["mode"].startswith("cpu-smoke")
    rows = result["rows"]
    assert {(r["batch"], r["k"], r["hidden"]) for r in rows} == {
        (b, k, h) for b in (1, 4) for k in (3, 7) for h in (64, 160)}
    assert all(r["identical"] for r in rows)
    assert all(r["output_rows"] == r["input_rows"] + r["batch"] * (r["k"] - 1) for r in rows)


@pytest.mark.slow
def test_drafter_vs_k_bench_smoke(tmp_path):
    result = _run("bench.drafter_vs_k", tmp_path / "drafter.json")
    assert result["env"]["mode"].startswith("cpu-smoke")
    assert {(r["batch"], r["k"]) for r in result["rows"]} == {(b, k) for b in (1, 4) for k in (1, 4, 8)}
    assert all(r["parallel_us"] > 0 and r["sequential_us"] > 0 for r in result["rows"])
