"""The interpreter runs kernels as numpy and would accept code the GPU compiler rejects: so the kernels are
also compiled ahead of time, with the Triton wheel's ptxas and no GPU (subprocess, no TRITON_INTERPRET), for
every architecture the construct library's instance catalog can serve on - sm_89 (L4, L40S), sm_90
(H100/H200), sm_100 (B200), sm_120 (g7e's RTX PRO 6000) and the older ones. The list comes from the catalog,
so a family added there is compiled for here. With the launch-time specialisations for 16-divisible hidden
widths, the fused kernel's hidden copy must use 128-bit loads and stores on each of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from peagle_constructs.instance_types import GPU_FAMILIES

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CAPABILITIES = sorted({family.compute_capability for family in GPU_FAMILIES.values()})
VARIANTS = ["fused_bf16_k7_h16", "fused_fp32_k16_no_rejected", "fused_fp16_k1_odd_width", "staged_layout_k3"]


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(REPO / ".cache" / "triton-aot")
    proc = subprocess.run([sys.executable, str(HERE / "gpu_compile_worker.py"), json.dumps(CAPABILITIES)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("AOT "))
    return json.loads(line.removeprefix("AOT "))


def test_the_catalog_names_the_architectures_the_stages_serve_on():
    # L40S (the stages), H100/H200, B200 and RTX PRO 6000 must all be in the catalog, or the test shrinks
    assert {89, 90, 100, 120} <= set(CAPABILITIES), CAPABILITIES


@pytest.mark.parametrize("capability", CAPABILITIES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_compiles_to_a_cubin_for_every_catalog_architecture(compiled, capability, variant):
    result = compiled[str(capability)][variant]
    assert "error" not in result, result.get("error")
    assert result["cubin_bytes"] > 0


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_hidden_copy_is_vectorised(compiled, capability):
    ops = compiled[str(capability)]["fused_bf16_k7_h16"]["global_ops"]
    assert "ld.global.v4.b32" in ops and "st.global.v4.b32" in ops, ops
    # and no element-by-element bf16 traffic left on the hidden rows
    assert "ld.global.b16" not in ops and "st.global.b16" not in ops, ops
