"""Parallel-draft input build for P-EAGLE: torch reference (reference.py), fused one-launch Triton kernel
(fused.py) and their shared types (draft_io.py); the upstream-style multi-launch sequence it is measured
against is bench/staged_baseline.py.

Only draft_io and reference import here; the Triton modules are imported on use, because TRITON_INTERPRET
must be set before triton is first imported when running on a CPU.
"""

from peagle_runtime.kernels.draft_io import PADDING_SLOT, DraftBatch, DraftInputs, DraftSpec
from peagle_runtime.kernels.reference import build_draft_inputs_reference

__all__ = ["PADDING_SLOT", "DraftBatch", "DraftInputs", "DraftSpec", "build_draft_inputs_reference"]
