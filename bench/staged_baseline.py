"""The upstream-style input build, written here as the baseline the fused kernel is measured against
(`make bench-kernel` and the kernel parity tests; not shipped in the image).

Same steps and launch pattern as vLLM 0.32's proposer (torch + triton only, so it runs on a GPU machine
without vLLM): (1) a Triton layout kernel writes token ids, positions, flags, sample indices and a
target->drafter hidden-row map; (2) an index_put scatters every target hidden row; (3) ``torch.where``
fills h_shared into the mask rows (a second full pass over the drafter rows); (4) a chain of torch ops
recomputes the KV slot mapping from positions and the block table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from peagle_runtime.kernels.draft_io import PADDING_SLOT, DraftBatch, DraftInputs, DraftSpec


@triton.jit
def staged_layout_kernel(
    target_token_ids_ptr,
    target_positions_ptr,
    next_token_ids_ptr,
    query_start_loc_ptr,
    num_rejected_ptr,
    out_token_ids_ptr,
    out_positions_ptr,
    out_is_rejected_ptr,
    out_is_masked_ptr,
    out_sample_indices_ptr,
    out_hidden_map_ptr,  # [T_in] int32: drafter row of each target row
    mask_token_id,
    padding_token_id,
    K: tl.constexpr,
    HAS_REJECTED: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """One program = one request x BLOCK_T of its output rows: the layout only, no hidden rows."""
    req = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    start = tl.load(query_start_loc_ptr + req)
    n_in = tl.load(query_start_loc_ptr + req + 1) - start
    if HAS_REJECTED:
        n_rej = tl.load(num_rejected_ptr + req)
    else:
        n_rej = 0
    n_valid = n_in - 1 - n_rej
    live = j < n_in + K - 1
    is_mask = (j > n_valid) & (j < n_valid + K)
    is_rej = j >= n_valid + K
    out_row = start + req * (K - 1) + j

    tokens = tl.load(target_token_ids_ptr + start + 1 + j, mask=live & (j < n_valid), other=0).to(tl.int32)
    tokens = tl.where(j == n_valid, tl.load(next_token_ids_ptr + req).to(tl.int32), tokens)
    tokens = tl.where(is_mask, mask_token_id, tokens)
    tokens = tl.where(is_rej, padding_token_id, tokens)
    pos = tl.where(is_rej, 0, tl.load(target_positions_ptr + start).to(tl.int64) + j)

    tl.store(out_token_ids_ptr + out_row, tokens, mask=live)
    tl.store(out_positions_ptr + out_row, pos, mask=live)
    tl.store(out_is_rejected_ptr + out_row, is_rej, mask=live)
    tl.store(out_is_masked_ptr + out_row, is_mask, mask=live)
    is_sampled = (j >= n_valid) & (j < n_valid + K)
    tl.store(out_sample_indices_ptr + req * K + (j - n_valid), out_row, mask=live & is_sampled)
    tl.store(out_hidden_map_ptr + start + j, out_row, mask=j < n_in)


def build_draft_inputs_staged(
    *,
    batch: DraftBatch,
    spec: DraftSpec,
    max_query_len: int | None = None,
    out: DraftInputs | None = None,
) -> DraftInputs:
    batch.check()
    out = out if out is not None else DraftInputs.empty(batch, spec)
    if max_query_len is None:
        max_query_len = int((batch.query_start_loc[1:] - batch.query_start_loc[:-1]).max().item())
    k, n_out, dev = spec.num_slots, batch.num_output_rows(spec), batch.target_hidden_states.device
    rows = max_query_len + k - 1
    block_t = min(256, triton.next_power_of_2(rows))
    hidden_map = torch.empty(batch.num_input_rows, dtype=torch.int32, device=dev)
    has_rejected = batch.num_rejected is not None
    staged_layout_kernel[(batch.num_reqs, triton.cdiv(rows, block_t))](
        batch.target_token_ids, batch.target_positions, batch.next_token_ids, batch.query_start_loc,
        batch.num_rejected if has_rejected else batch.query_start_loc,
        out.token_ids, out.positions, out.is_rejected, out.is_masked, out.sample_indices, hidden_map,
        spec.mask_token_id, spec.padding_token_id,
        K=k, HAS_REJECTED=has_rejected, BLOCK_T=block_t,
    )
    # (2) scatter every target row, (3) overwrite the mask rows with h_shared.
    out.hidden_states[hidden_map.long()] = batch.target_hidden_states
    torch.where(out.is_masked.unsqueeze(1), batch.mask_hidden, out.hidden_states, out=out.hidden_states)
    # (4) slot mapping, the way vLLM's compute_new_slot_mapping does it.
    lens = batch.query_start_loc[1:] - batch.query_start_loc[:-1] + (k - 1)
    req_of_row = torch.repeat_interleave(torch.arange(batch.num_reqs, device=dev), lens, output_size=n_out)
    clamped = torch.clamp(out.positions, max=spec.max_model_len - 1)
    blocks = batch.block_table[req_of_row, clamped // spec.block_size].to(torch.int64)
    slots = blocks * spec.block_size + clamped % spec.block_size
    slots.masked_fill_(out.positions >= spec.max_model_len, PADDING_SLOT)
    slots.masked_fill_(out.is_rejected, PADDING_SLOT)
    out.slot_mapping.copy_(slots)
    return out
