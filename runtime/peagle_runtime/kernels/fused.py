"""The fused parallel-draft input kernel: the whole P-EAGLE drafter input in ONE Triton launch.

vLLM 0.32 builds it in four steps (layout kernel, hidden scatter, ``torch.where`` fill of h_shared, slot
mapping recompute: a dozen launches and three passes over the hidden rows). Here every program computes the
layout of its rows itself, so it can copy hidden rows and look up KV slots in the same pass: each target
hidden row is read at most once (rows under a mask slot are not read at all) and each drafter row is
written once. Needs only torch + triton; see ``reference.py`` for the same build in plain torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from peagle_runtime.kernels.draft_io import PADDING_SLOT, DraftBatch, DraftInputs, DraftSpec

# A module constant is folded into the kernel at compile time.
PADDING_SLOT_ID: tl.constexpr = tl.constexpr(PADDING_SLOT)


@triton.jit
def fused_parallel_draft_input_kernel(
    target_token_ids_ptr,  # [T_in]
    target_positions_ptr,  # [T_in] int64
    target_hidden_ptr,  # [T_in, H]
    target_hidden_stride,
    next_token_ids_ptr,  # [B]
    query_start_loc_ptr,  # [B + 1]
    num_rejected_ptr,  # [B], unused when not HAS_REJECTED
    block_table_ptr,  # [B, max_blocks]
    block_table_stride,
    mask_hidden_ptr,  # [H]
    out_token_ids_ptr,  # [T_out] int32
    out_positions_ptr,  # [T_out] int64
    out_is_rejected_ptr,  # [T_out] bool
    out_is_masked_ptr,  # [T_out] bool
    out_sample_indices_ptr,  # [B * K] int32
    out_hidden_ptr,  # [T_out, H]
    out_hidden_stride,
    out_slot_mapping_ptr,  # [T_out] int64
    hidden_size,
    mask_token_id,
    padding_token_id,
    block_size,
    max_model_len,
    K: tl.constexpr,
    HAS_REJECTED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """One program = one request x BLOCK_T of its output rows x BLOCK_H hidden columns.

    Grid (num_reqs, cdiv(max_query_len + K - 1, BLOCK_T), cdiv(H, BLOCK_H)). The program classifies its
    rows (shifted target token | bonus | mask | rejected) from the request's query_start_loc and
    num_rejected, then copies its [BLOCK_T, BLOCK_H] hidden tile: target row j for non-mask rows j < n_in,
    h_shared for mask rows, nothing for rejected rows past the input (vLLM leaves those alone too). The
    programs of hidden block 0 also write the row metadata: token id, position, rejected / masked flags,
    the sample index of bonus and mask rows, and the KV slot looked up in the block table (-1 for rejected
    rows and rows at or past max_model_len).
    """
    req = tl.program_id(0)
    row_block = tl.program_id(1)
    col_block = tl.program_id(2)

    start = tl.load(query_start_loc_ptr + req)
    n_in = tl.load(query_start_loc_ptr + req + 1) - start
    if HAS_REJECTED:
        n_rej = tl.load(num_rejected_ptr + req)
    else:
        n_rej = 0
    n_valid = n_in - 1 - n_rej
    out_start = start + req * (K - 1)

    j = row_block * BLOCK_T + tl.arange(0, BLOCK_T)
    live = j < n_in + K - 1
    is_mask = (j > n_valid) & (j < n_valid + K)
    is_rej = j >= n_valid + K
    out_row = (out_start + j).to(tl.int64)

    # Hidden tile: one read of each needed target row, one write of each drafter row.
    cols = col_block * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < hidden_size
    from_target = live & (j < n_in) & (~is_mask)
    src_row = (start + j).to(tl.int64)
    tile = tl.load(
        target_hidden_ptr + src_row[:, None] * target_hidden_stride + cols[None, :],
        mask=from_target[:, None] & col_ok[None, :],
    )
    shared = tl.load(mask_hidden_ptr + cols, mask=col_ok)
    tile = tl.where(is_mask[:, None], shared[None, :], tile)
    tl.store(
        out_hidden_ptr + out_row[:, None] * out_hidden_stride + cols[None, :],
        tile,
        mask=(from_target | (live & is_mask))[:, None] & col_ok[None, :],
    )

    if col_block == 0:
        is_valid = j < n_valid
        tokens = tl.load(target_token_ids_ptr + start + 1 + j, mask=live & is_valid, other=0).to(tl.int32)
        bonus = tl.load(next_token_ids_ptr + req).to(tl.int32)
        tokens = tl.where(j == n_valid, bonus, tokens)
        tokens = tl.where(is_mask, mask_token_id, tokens)
        tokens = tl.where(is_rej, padding_token_id, tokens)

        first_pos = tl.load(target_positions_ptr + start).to(tl.int64)
        pos = tl.where(is_rej, 0, first_pos + j)

        # KV slot; the clamp keeps the (masked) block-table address inside the row.
        past_end = pos >= max_model_len
        clamped = tl.minimum(pos, max_model_len - 1)
        block = tl.load(
            block_table_ptr + req * block_table_stride + clamped // block_size,
            mask=live & (~is_rej) & (~past_end),
            other=0,
        ).to(tl.int64)
        slot = block * block_size + clamped % block_size
        slot = tl.where(is_rej | past_end, PADDING_SLOT_ID, slot)

        tl.store(out_token_ids_ptr + out_row, tokens, mask=live)
        tl.store(out_positions_ptr + out_row, pos, mask=live)
        tl.store(out_is_rejected_ptr + out_row, is_rej, mask=live)
        tl.store(out_is_masked_ptr + out_row, is_mask, mask=live)
        tl.store(out_slot_mapping_ptr + out_row, slot, mask=live)
        is_sampled = (j >= n_valid) & (j < n_valid + K)
        tl.store(out_sample_indices_ptr + req * K + (j - n_valid), out_row.to(tl.int32), mask=live & is_sampled)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def launch_config(*, max_query_len: int, num_slots: int, hidden_size: int) -> dict[str, int]:
    """Tile sizes: up to 16 rows x 1024 columns (2 KiB of bf16 per row: wide, coalesced accesses)."""
    rows = max_query_len + num_slots - 1
    return {"BLOCK_T": min(16, _next_pow2(rows)), "BLOCK_H": min(1024, _next_pow2(hidden_size))}


def build_draft_inputs_fused(
    *,
    batch: DraftBatch,
    spec: DraftSpec,
    max_query_len: int | None = None,
    out: DraftInputs | None = None,
    block_t: int | None = None,
    block_h: int | None = None,
    num_warps: int = 4,
) -> DraftInputs:
    """Build the drafter input in one launch. ``max_query_len`` (the longest request's input rows) sizes
    the grid; pass it from host metadata (vLLM's ``cad.max_query_len``) to avoid a device sync."""
    batch.check()
    out = out if out is not None else DraftInputs.empty(batch, spec)
    if max_query_len is None:
        max_query_len = int((batch.query_start_loc[1:] - batch.query_start_loc[:-1]).max().item())
    if batch.num_reqs == 0:
        return out
    cfg = launch_config(max_query_len=max_query_len, num_slots=spec.num_slots, hidden_size=batch.hidden_size)
    block_t = block_t or cfg["BLOCK_T"]
    block_h = block_h or cfg["BLOCK_H"]
    if out.hidden_states.stride(1) != 1 or batch.target_hidden_states.stride(1) != 1:
        raise ValueError("hidden_states and target_hidden_states need contiguous rows (stride(1) == 1)")
    grid = (
        batch.num_reqs,
        triton.cdiv(max_query_len + spec.num_slots - 1, block_t),
        triton.cdiv(batch.hidden_size, block_h),
    )
    has_rejected = batch.num_rejected is not None
    fused_parallel_draft_input_kernel[grid](
        batch.target_token_ids,
        batch.target_positions,
        batch.target_hidden_states,
        batch.target_hidden_states.stride(0),
        batch.next_token_ids,
        batch.query_start_loc,
        batch.num_rejected if has_rejected else batch.query_start_loc,
        batch.block_table,
        batch.block_table.stride(0),
        batch.mask_hidden,
        out.token_ids,
        out.positions,
        out.is_rejected,
        out.is_masked,
        out.sample_indices,
        out.hidden_states,
        out.hidden_states.stride(0),
        out.slot_mapping,
        batch.hidden_size,
        spec.mask_token_id,
        spec.padding_token_id,
        spec.block_size,
        spec.max_model_len,
        K=spec.num_slots,
        HAS_REJECTED=has_rejected,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        num_warps=num_warps,
    )
    return out
