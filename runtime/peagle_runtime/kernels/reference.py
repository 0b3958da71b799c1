"""Torch reference of the whole parallel-draft input build: one request at a time, written for reading.

It follows vLLM 0.32's semantics (layout kernel, hidden scatter, h_shared fill, slot-mapping recompute),
including the rows vLLM leaves alone: hidden rows of rejected slots past the request's input are not written.
"""

from __future__ import annotations

import torch

from peagle_runtime.kernels.draft_io import PADDING_SLOT, DraftBatch, DraftInputs, DraftSpec


def build_draft_inputs_reference(
    *, batch: DraftBatch, spec: DraftSpec, out: DraftInputs | None = None
) -> DraftInputs:
    batch.check()
    out = out if out is not None else DraftInputs.empty(batch, spec)
    k = spec.num_slots
    starts = batch.query_start_loc.tolist()
    rejected = batch.num_rejected.tolist() if batch.num_rejected is not None else [0] * batch.num_reqs
    dev = batch.target_hidden_states.device

    for b in range(batch.num_reqs):
        start, end, nr = starts[b], starts[b + 1], rejected[b]
        n_in = end - start
        if n_in < 1 or not 0 <= nr <= n_in - 1:
            raise ValueError(f"request {b}: num_rejected={nr} must be in [0, {n_in - 1}] for {n_in} input rows")
        nv = n_in - 1 - nr  # accepted tokens whose successor is known
        o = start + b * (k - 1)  # every earlier request grew by K-1 rows
        rows = torch.arange(o, o + n_in + k - 1, device=dev)

        def const(value: int, n: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((n,), value, dtype=dtype, device=dev)

        # Tokens: shift left by one (row j pairs token j+1 with hidden j), then bonus, masks, padding.
        out.token_ids[rows] = torch.cat([
            batch.target_token_ids[start + 1: start + 1 + nv].to(torch.int32),
            batch.next_token_ids[b: b + 1].to(torch.int32),
            const(spec.mask_token_id, k - 1, torch.int32),
            const(spec.padding_token_id, nr, torch.int32),
        ])
        # Positions count on from the request's first position; rejected rows get 0.
        first = batch.target_positions[start].to(torch.int64)
        positions = torch.cat([first + torch.arange(nv + k, device=dev), const(0, nr, torch.int64)])
        out.positions[rows] = positions
        is_rejected = torch.cat([const(False, nv + k, torch.bool), const(True, nr, torch.bool)])
        is_masked = torch.cat([const(False, nv + 1, torch.bool), const(True, k - 1, torch.bool),
                               const(False, nr, torch.bool)])
        out.is_rejected[rows] = is_rejected
        out.is_masked[rows] = is_masked
        out.sample_indices[b * k: (b + 1) * k] = (o + nv + torch.arange(k, device=dev)).to(torch.int32)

        # Hidden: input row j -> output row j (no shift), then h_shared over the mask rows.
        out.hidden_states[o: o + n_in] = batch.target_hidden_states[start:end]
        out.hidden_states[o + nv + 1: o + nv + k] = batch.mask_hidden

        # KV slots from the block table; rejected rows and rows past the model length write nowhere.
        clamped = positions.clamp(max=spec.max_model_len - 1)
        blocks = batch.block_table[b, clamped // spec.block_size].to(torch.int64)
        slots = blocks * spec.block_size + clamped % spec.block_size
        slots[is_rejected | (positions >= spec.max_model_len)] = PADDING_SLOT
        out.slot_mapping[rows] = slots
    return out
