"""Inputs and outputs of the parallel-draft input build, shared by the reference, the fused kernel and the
staged (upstream-style) sequence. Plain torch: importable without vLLM or Triton.

One drafting step of P-EAGLE turns the target's verified batch into the drafter's batch. Request ``b`` has
``n_in`` input rows (its verified tokens, the last ``num_rejected[b]`` of them rejected) and gets
``n_in + K - 1`` output rows starting at ``query_start_loc[b] + b * (K - 1)``::

    [ nv shifted target tokens | bonus token | K-1 mask tokens | nr rejected (padding) rows ]
      nv = n_in - 1 - nr         row nv       rows nv+1..nv+K-1   rows nv+K..n_in+K-2

Hidden row ``j < n_in`` of the request comes from its target row ``j`` (hidden states are not shifted),
the mask rows take ``h_shared`` (``mask_hidden``), and the KV slot of a row comes from the block table,
or is the padding slot -1 for rejected rows and rows at or past ``max_model_len``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PADDING_SLOT = -1


@dataclass(frozen=True)
class DraftSpec:
    """The per-deployment constants of the build."""

    num_slots: int  # K: rows sampled per request (bonus + K-1 mask rows)
    mask_token_id: int
    block_size: int
    max_model_len: int
    padding_token_id: int = 0

    def __post_init__(self) -> None:
        if self.num_slots < 1:
            raise ValueError(f"num_slots (K) must be >= 1, got {self.num_slots}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")


@dataclass(frozen=True)
class DraftBatch:
    """What the target step hands to the drafter (device tensors, vLLM's dtypes)."""

    target_token_ids: torch.Tensor  # [T_in] int32
    target_positions: torch.Tensor  # [T_in] int64
    target_hidden_states: torch.Tensor  # [T_in, H]
    next_token_ids: torch.Tensor  # [B] int32: the bonus token sampled by the target
    query_start_loc: torch.Tensor  # [B + 1] int32
    num_rejected: torch.Tensor | None  # [B] int32, None = nothing rejected
    block_table: torch.Tensor  # [B, max_blocks] int32
    mask_hidden: torch.Tensor  # [H]: h_shared, already in the drafter's hidden width

    @property
    def num_reqs(self) -> int:
        return int(self.next_token_ids.shape[0])

    @property
    def num_input_rows(self) -> int:
        return int(self.target_token_ids.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.target_hidden_states.shape[1])

    def num_output_rows(self, spec: DraftSpec) -> int:
        return self.num_input_rows + self.num_reqs * (spec.num_slots - 1)

    def check(self) -> None:
        """Shape and dtype checks only (no device sync), so the fused path can afford them every step."""
        b, t = self.num_reqs, self.num_input_rows
        if self.target_hidden_states.dim() != 2:
            raise ValueError(f"target_hidden_states must be [tokens, hidden], got {tuple(self.target_hidden_states.shape)}")
        h = self.hidden_size
        expect = {
            "target_positions": (self.target_positions, (t,)),
            "target_hidden_states": (self.target_hidden_states, (t, h)),
            "query_start_loc": (self.query_start_loc, (b + 1,)),
            "mask_hidden": (self.mask_hidden, (h,)),
        }
        if self.num_rejected is not None:
            expect["num_rejected"] = (self.num_rejected, (b,))
        for name, (tensor, shape) in expect.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
        if self.block_table.dim() != 2 or self.block_table.shape[0] < b:
            raise ValueError(f"block_table must be [>= {b} requests, blocks], got {tuple(self.block_table.shape)}")
        for name in ("target_token_ids", "target_positions", "next_token_ids", "query_start_loc", "block_table"):
            tensor = getattr(self, name)
            if tensor.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"{name} must be int32 or int64, got {tensor.dtype}")
        if self.mask_hidden.dtype != self.target_hidden_states.dtype:
            raise ValueError(
                f"mask_hidden dtype {self.mask_hidden.dtype} must equal target_hidden_states dtype "
                f"{self.target_hidden_states.dtype}"
            )


@dataclass(frozen=True)
class DraftInputs:
    """The drafter's batch. Views of length T_out (B*K for sample_indices)."""

    token_ids: torch.Tensor  # [T_out] int32
    positions: torch.Tensor  # [T_out] int64
    is_rejected: torch.Tensor  # [T_out] bool
    is_masked: torch.Tensor  # [T_out] bool: the K-1 rows that carry the mask token and h_shared
    sample_indices: torch.Tensor  # [B * K] int32: bonus row then the mask rows, per request
    hidden_states: torch.Tensor  # [T_out, H]
    slot_mapping: torch.Tensor  # [T_out] int64

    @classmethod
    def empty(cls, batch: DraftBatch, spec: DraftSpec) -> "DraftInputs":
        """Fresh outputs. Hidden rows the build never writes (see the module doc) stay zero."""
        n, dev = batch.num_output_rows(spec), batch.target_hidden_states.device
        return cls(
            token_ids=torch.empty(n, dtype=torch.int32, device=dev),
            positions=torch.empty(n, dtype=torch.int64, device=dev),
            is_rejected=torch.empty(n, dtype=torch.bool, device=dev),
            is_masked=torch.empty(n, dtype=torch.bool, device=dev),
            sample_indices=torch.empty(batch.num_reqs * spec.num_slots, dtype=torch.int32, device=dev),
            hidden_states=torch.zeros(n, batch.hidden_size, dtype=batch.target_hidden_states.dtype, device=dev),
            slot_mapping=torch.empty(n, dtype=torch.int64, device=dev),
        )

    def fields(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
