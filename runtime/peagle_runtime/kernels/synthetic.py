"""Seeded synthetic drafting batches for the parity tests and the benchmark (torch only)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peagle_runtime.kernels.draft_io import DraftBatch, DraftSpec


def make_batch(
    *,
    query_lens: Sequence[int],
    num_rejected: Sequence[int] | None,
    first_positions: Sequence[int],
    spec: DraftSpec,
    hidden_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    vocab_size: int = 1000,
    seed: int = 0,
) -> DraftBatch:
    """A batch whose requests have ``query_lens[b]`` input rows starting at ``first_positions[b]``.

    Block tables hold distinct shuffled block ids so a wrong lookup changes the slot; each request gets
    enough blocks to cover positions up to ``max_model_len - 1``.
    """
    b = len(query_lens)
    if len(first_positions) != b or (num_rejected is not None and len(num_rejected) != b):
        raise ValueError("query_lens, num_rejected and first_positions need one entry per request")
    g = torch.Generator().manual_seed(seed)
    t = sum(query_lens)
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(first_positions, query_lens)]) if b else \
        torch.empty(0, dtype=torch.int64)
    blocks_per_req = -(-spec.max_model_len // spec.block_size)
    block_table = torch.randperm(b * blocks_per_req + 7, generator=g)[: b * blocks_per_req].view(b, blocks_per_req)
    qsl = torch.zeros(b + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(list(query_lens), dtype=torch.int32), 0)
    hidden = torch.randn(t, hidden_size, generator=g).to(dtype)
    return DraftBatch(
        target_token_ids=torch.randint(1, vocab_size, (t,), generator=g, dtype=torch.int32).to(device),
        target_positions=positions.to(torch.int64).to(device),
        target_hidden_states=hidden.to(device),
        next_token_ids=torch.randint(1, vocab_size, (b,), generator=g, dtype=torch.int32).to(device),
        query_start_loc=qsl.to(device),
        num_rejected=None if num_rejected is None else torch.tensor(list(num_rejected), dtype=torch.int32).to(device),
        block_table=block_table.to(torch.int32).to(device),
        mask_hidden=torch.randn(hidden_size, generator=g).to(dtype).to(device),
    )
