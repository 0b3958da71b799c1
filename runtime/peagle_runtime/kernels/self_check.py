"""Before the fused kernel serves, it proves itself against vLLM's own input build on this machine's device.

:func:`agrees_with_vllm` builds representative batches twice - by vLLM's own ``set_inputs_first_pass`` on a
proposer-shaped state and by the fused kernel - and compares every output byte for byte. The batches are the
shapes the engine drafts (:func:`representative_batches`): one decoding request; ``max_num_seqs`` decoding
requests with a mix of rejected drafts, one of them at ``max_model_len``; ``max_num_seqs`` requests on their
first step after a prefill (long query, nothing rejected); and the two kinds mixed, as chunked prefill
schedules them - at the configured K, hidden size and dtype. The kernel serves only when all of them agree.

It runs at container start, before vLLM starts, in a child process of the entrypoint
(:mod:`peagle_runtime.kernels.start_check`), where a device fault cannot poison the server. The same helpers
run the parity table in the tests (interpreted on the CPU), so the check that gates production is the one the
tests exercise.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable

import torch

from peagle_runtime.kernels.draft_io import DraftBatch, DraftInputs, DraftSpec
from peagle_runtime.kernels.synthetic import make_batch

SENTINEL_ROWS = 8  # buffer rows past the output: nothing may write there


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def prefilled(batch: DraftBatch, spec: DraftSpec, rows: int) -> DraftInputs:
    """Buffers full of recognisable junk, like a proposer's buffers after earlier steps."""
    g = torch.Generator().manual_seed(99)
    device = batch.target_hidden_states.device
    return DraftInputs(
        token_ids=torch.full((rows,), -5, dtype=torch.int32, device=device),
        positions=torch.full((rows,), -5, dtype=torch.int64, device=device),
        is_rejected=torch.ones(rows, dtype=torch.bool, device=device),
        is_masked=torch.ones(rows, dtype=torch.bool, device=device),
        sample_indices=torch.full((batch.num_reqs * spec.num_slots,), -5, dtype=torch.int32, device=device),
        hidden_states=torch.randn(rows, batch.hidden_size, generator=g).to(batch.target_hidden_states.dtype)
        .to(device),
        slot_mapping=torch.full((rows,), -5, dtype=torch.int64, device=device),
    )


def proposer_state(batch: DraftBatch, spec: DraftSpec, rows: int) -> SimpleNamespace:
    """The attributes of vLLM's SpecDecodeBaseProposer that set_inputs_first_pass reads, P-EAGLE flavour."""
    buf = prefilled(batch, spec, rows)
    device = batch.target_hidden_states.device
    return SimpleNamespace(
        use_heterogeneous_vocab=False, needs_extra_input_slots=True, parallel_drafting=True,
        pass_hidden_states_to_model=True, method="eagle3", uses_mrope=False, device=device,
        extra_slots_per_request=spec.num_slots, net_num_new_slots_per_request=spec.num_slots - 1,
        parallel_drafting_token_id=spec.mask_token_id, parallel_drafting_hidden_state_tensor=batch.mask_hidden,
        block_size=spec.block_size, max_model_len=spec.max_model_len,
        input_ids=buf.token_ids, positions=buf.positions, is_rejected_token_mask=buf.is_rejected,
        is_masked_token_mask=buf.is_masked, hidden_states=buf.hidden_states,
        arange=torch.arange(max(rows, batch.num_reqs + 1), dtype=torch.int32, device=device),
    )


def attention_metadata(batch: DraftBatch):  # noqa: ANN201 - vllm's CommonAttentionMetadata
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = batch.query_start_loc
    lens = qsl[1:] - qsl[:-1]
    last_pos = batch.target_positions[(qsl[1:] - 1).long()]
    seq_lens = (last_pos + 1).to(torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.cpu().clone(), seq_lens=seq_lens, num_reqs=batch.num_reqs,
        num_actual_tokens=batch.num_input_rows, max_query_len=int(lens.max()), max_seq_len=int(seq_lens.max()),
        block_table_tensor=batch.block_table,
        slot_mapping=torch.zeros(batch.num_input_rows, dtype=torch.int64, device=qsl.device),
    )


def run_proposer(method: Callable, batch: DraftBatch, spec: DraftSpec, rows: int) -> tuple[int, DraftInputs, Any]:
    """``method`` (vLLM's set_inputs_first_pass, or the plugin's) on a fresh proposer-shaped state."""
    state = proposer_state(batch, spec, rows)
    n_out, sample, cad = method(
        state, target_token_ids=batch.target_token_ids, next_token_ids=batch.next_token_ids,
        target_positions=batch.target_positions, target_hidden_states=batch.target_hidden_states,
        token_indices_to_sample=None, cad=attention_metadata(batch), num_rejected_tokens_gpu=batch.num_rejected,
    )
    full = DraftInputs(token_ids=state.input_ids, positions=state.positions, is_rejected=state.is_rejected_token_mask,
                       is_masked=state.is_masked_token_mask, sample_indices=sample,
                       hidden_states=state.hidden_states, slot_mapping=cad.slot_mapping)
    return n_out, full, cad


def representative_batches(spec: DraftSpec, *, hidden_size: int, dtype: torch.dtype, device: torch.device,
                           max_num_seqs: int) -> list[DraftBatch]:
    """Decode, prefill and mixed batches at the batch limit (see the module doc); seeded, so every start of the
    same configuration checks the same bytes."""
    k = spec.num_slots
    n = max(1, max_num_seqs)
    decode = k + 1  # a decode step verifies K drafts plus the bonus row
    room = max(spec.max_model_len - decode - k, 0)
    first = [min(17 * i + 3, room) for i in range(n)]
    first[-1] = max(spec.max_model_len - decode - 1, 0)  # draft rows run into max_model_len
    # A first step after a prefill drafts from the whole prompt chunk: long queries, nothing rejected yet.
    prefill = [max(1, min(64 >> (i % 4), spec.max_model_len - k - 1)) for i in range(n)]
    mixed = [prefill[i] if i % 2 else decode for i in range(n)]
    mixed_first = [0 if i % 2 else first[i] for i in range(n)]

    def batch(query_lens: list[int], num_rejected: list[int] | None, first_positions: list[int], seed: int):
        return make_batch(query_lens=query_lens, num_rejected=num_rejected, first_positions=first_positions,
                          spec=spec, hidden_size=hidden_size, dtype=dtype, device=device, seed=seed)

    return [
        batch([decode], [0], [5], 1),
        batch([decode] * n, [i % (k + 1) for i in range(n)], first, 2),
        batch(prefill, None, [0] * n, 3),
        batch(mixed, [0 if i % 2 else i % (k + 1) for i in range(n)], mixed_first, 4),
    ]


def agrees_with_vllm(vllm_method: Callable, fused_method: Callable, *, spec: DraftSpec, hidden_size: int,
                     dtype: torch.dtype, device: torch.device, max_num_seqs: int) -> dict:
    """Build each representative batch both ways; the decision and what differed, as a JSON-able dict."""
    started = time.perf_counter()
    mismatched: list[str] = []
    batches = representative_batches(spec, hidden_size=hidden_size, dtype=dtype, device=device,
                                     max_num_seqs=max_num_seqs)
    for index, batch in enumerate(batches):
        rows = batch.num_output_rows(spec) + SENTINEL_ROWS
        n_v, theirs, cad_v = run_proposer(vllm_method, batch, spec, rows)
        n_f, ours, cad_f = run_proposer(fused_method, batch, spec, rows)
        if n_v != n_f:
            mismatched.append(f"batch{index}.num_tokens")
        for name, want in theirs.fields().items():
            if not same_bits(ours.fields()[name], want):
                mismatched.append(f"batch{index}.{name}")
        for attr in ("query_start_loc", "seq_lens"):
            if not same_bits(getattr(cad_f, attr), getattr(cad_v, attr)):
                mismatched.append(f"batch{index}.cad.{attr}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"agree": not mismatched, "mismatched": mismatched, "batches": len(batches),
            "max_num_seqs": max_num_seqs, "k": spec.num_slots, "hidden_size": hidden_size,
            "dtype": str(dtype).removeprefix("torch."), "device": str(device),
            "seconds": round(time.perf_counter() - started, 3)}
