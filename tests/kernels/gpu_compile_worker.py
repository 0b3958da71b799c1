"""Compiles the Triton kernels ahead of time, for each CUDA compute capability given on the command line, with the
Triton wheel's own ptxas: no GPU needed. Must run WITHOUT TRITON_INTERPRET (the interpreter replaces @triton.jit).
Prints JSON after "AOT ": {capability: {variant: result}}.

The integer/pointer attributes mirror what Triton's JIT specialises at launch: 16-byte aligned tensors and
16-divisible strides/widths (hidden sizes 2880, 4096, 5120 all are), which is what lets the hidden copy use
128-bit accesses.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("gpu_compile_worker: unset TRITON_INTERPRET (the interpreter cannot compile kernels)")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from peagle_runtime.kernels.fused import fused_parallel_draft_input_kernel  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.staged_baseline
from bench.staged_baseline import staged_layout_kernel  # noqa: E402

FUSED_TYPES = dict(
    target_token_ids_ptr="*i32", target_positions_ptr="*i64", target_hidden_ptr="*{h}", target_hidden_stride="i32",
    next_token_ids_ptr="*i32", query_start_loc_ptr="*i32", num_rejected_ptr="*i32", block_table_ptr="*i32",
    block_table_stride="i32", mask_hidden_ptr="*{h}", out_token_ids_ptr="*i32", out_positions_ptr="*i64",
    out_is_rejected_ptr="*i1", out_is_masked_ptr="*i1", out_sample_indices_ptr="*i32", out_hidden_ptr="*{h}",
    out_hidden_stride="i32", out_slot_mapping_ptr="*i64", hidden_size="i32", mask_token_id="i32",
    padding_token_id="i32", block_size="i32", max_model_len="i32",
)
STAGED_TYPES = dict(
    target_token_ids_ptr="*i32", target_positions_ptr="*i64", next_token_ids_ptr="*i32", query_start_loc_ptr="*i32",
    num_rejected_ptr="*i32", out_token_ids_ptr="*i32", out_positions_ptr="*i64", out_is_rejected_ptr="*i1",
    out_is_masked_ptr="*i1", out_sample_indices_ptr="*i32", out_hidden_map_ptr="*i32", mask_token_id="i32",
    padding_token_id="i32",
)
WIDE_INTS = ("target_hidden_stride", "out_hidden_stride", "hidden_size")


def compile_one(kernel, types: dict[str, str], consts: dict, aligned_widths: bool, capability: int) -> dict:
    names = kernel.arg_names
    signature = {n: types.get(n, "constexpr") for n in names}
    divisible = [i for i, n in enumerate(names) if n.endswith("_ptr") or (aligned_widths and n in WIDE_INTS)]
    src = ASTSource(fn=kernel, signature=signature, constexprs={(names.index(n),): v for n, v in consts.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in divisible})
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32))
    ptx = compiled.asm["ptx"]
    return {"cubin_bytes": len(compiled.asm["cubin"]),
            "global_ops": sorted(set(re.findall(r"(?:ld|st)\.global[\.\w]*", ptx))),
            "num_warps": compiled.metadata.num_warps}


def main() -> int:
    fused = fused_parallel_draft_input_kernel
    variants = {
        "fused_bf16_k7_h16": (fused, {k: v.format(h="bf16") for k, v in FUSED_TYPES.items()},
                              {"K": 7, "HAS_REJECTED": True, "BLOCK_T": 16, "BLOCK_H": 1024}, True),
        "fused_fp32_k16_no_rejected": (fused, {k: v.format(h="fp32") for k, v in FUSED_TYPES.items()},
                                       {"K": 16, "HAS_REJECTED": False, "BLOCK_T": 16, "BLOCK_H": 1024}, True),
        "fused_fp16_k1_odd_width": (fused, {k: v.format(h="fp16") for k, v in FUSED_TYPES.items()},
                                    {"K": 1, "HAS_REJECTED": True, "BLOCK_T": 2, "BLOCK_H": 64}, False),
        "staged_layout_k3": (staged_layout_kernel, STAGED_TYPES, {"K": 3, "HAS_REJECTED": True, "BLOCK_T": 4}, False),
    }
    results: dict = {}
    for capability in json.loads(sys.argv[1]):
        per_arch = results[str(capability)] = {}
        for name, (kernel, types, consts, aligned) in variants.items():
            try:
                per_arch[name] = compile_one(kernel, types, consts, aligned, capability)
            except Exception as exc:  # report every variant on every architecture
                per_arch[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    results["_triton"] = triton.__version__
    print("AOT " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
