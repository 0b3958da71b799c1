"""Fused kernel == torch reference == staged sequence == vLLM 0.32's own path (C++ op on CPU) == our plugin's
replacement, bit for bit, over the table in kernel_parity_cases.py. The Triton parts run interpreted in one
subprocess (TRITON_INTERPRET=1 set there only, so it never leaks into other tests' processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_parity_cases import CASES

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


@pytest.fixture(scope="module")
def parity(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("parity") / "parity.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(HERE / "kernel_parity_worker.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0 and out.is_file(), f"parity worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def test_vllm_path_ran_its_cpp_op(parity):
    # Without the CPU override vLLM's layout kernel is a Triton placeholder that cannot run here.
    assert parity["_meta"]["vllm_layout_kernel"] == "KernelOverride"
    assert parity["_meta"]["cpp_op"] == "_C::copy_and_expand_eagle_inputs_kernel_impl"


def test_comparison_can_fail(parity):
    assert parity["_control"] == {"hidden_one_ulp_detected": True, "hidden_rest_equal": True,
                                  "wrong_block_size_detected": True}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_parity(parity, case):
    result = parity[case.name]
    assert "error" not in result, result.get("error")
    failed = sorted(name for name, ok in result["checks"].items() if not ok)
    assert not failed, f"{case.name}: mismatching {failed}"
    # 5 implementations x 7 outputs, plus row counts and the attention metadata the plugin hands on.
    assert len(result["checks"]) == 4 * 7 + 2 + 5
    assert result["rows_out"] == sum(case.query_lens) + len(case.query_lens) * (case.k - 1)


def test_cases_reach_their_edges(parity):
    facts = {name: r["facts"] for name, r in parity.items() if not name.startswith("_")}
    assert facts["no_rejected_none"]["rejected_rows"] == 0
    all_rejected = next(c for c in CASES if c.name == "all_rejected")
    assert all(n == q - 1 for n, q in zip(all_rejected.num_rejected, all_rejected.query_lens))
    assert facts["all_rejected"]["rejected_rows"] == sum(all_rejected.num_rejected)
    assert facts["k1"]["mask_rows"] == 0
    assert facts["k16"]["mask_rows"] == 2 * 15
    for name in ("max_len_boundary", "max_len_tight"):
        assert facts[name]["past_end_rows"] > 0
        assert facts[name]["padding_slots"] == facts[name]["past_end_rows"] + facts[name]["rejected_rows"]
