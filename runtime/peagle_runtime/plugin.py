"""vLLM plugin: run P-EAGLE's drafter-input build as our fused one-launch kernel.

Entry point ``vllm.general_plugins: peagle_fused_draft = peagle_runtime.plugin:register``. vLLM calls
``register()`` in every process it starts; when enabled, it swaps ``SpecDecodeBaseProposer.set_inputs_first_pass``
for a version that, on the parallel-drafting EAGLE path (K >= 2, hidden states passed to the drafter), builds
the input with ``peagle_runtime.kernels.fused`` and hands every other case back to vLLM's own code.

Switch ``PEAGLE_FUSED_DRAFT``:
  "0"              off: vLLM's path.
  "1"              on, unchecked. On a machine without CUDA this also needs TRITON_INTERPRET=1 (the Triton
                   interpreter is then what runs the kernel: for tests, not for speed).
  "auto" / unset   decided before vLLM starts, by the image's entrypoint: the kernel proves itself once, in a
                   child process, against vLLM's own build on decode, prefill and mixed batches at the batch
                   limit (peagle_runtime.kernels.start_check), and vLLM is started with "1" or "0" - one JSON
                   log line (``"event": "peagle.fused_draft"``) says which and why. When the plugin itself meets
                   "auto" (vLLM started some other way) it leaves vLLM's path in place: on a CUDA platform with
                   one log line saying so, elsewhere silently. Nothing is ever checked inside the engine, where
                   a device fault would take the engine (and its fallback) down with it.
Only vLLM 0.32.0 is patched (the method's contract is version specific): any other version gets one log line
and vLLM's path.

Observing it from outside the engine process: every call is counted per process. With
``PEAGLE_FUSED_DRAFT_STATS=/some/path.json`` (``{pid}`` in the path is replaced by the process id) the
process that runs the build rewrites that file atomically after each call with
``{"calls": N, "rows": total drafter rows built, "pid": ..., "vllm": ..., ...}``; without it, a log line
on the first call and every 1000th one. The file costs one small write per drafting step: a test and
bring-up hook, leave it unset in production.

Diagnostic ``PEAGLE_FUSED_DRAFT_VERIFY=1``: every fused build is checked bit for bit against vLLM's own build
of the same step (stats ``verified`` / ``mismatches``; a warning names any field that differs), and the stats
also record which edges the engine reached: ``rejected_rows``, ``past_end_rows`` (rows at or past
max_model_len) and ``max_live_position``. Slow (buffer copies, device syncs): for tests and bring-up on a new
machine, not for serving.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Mapping

from peagle_contract.served_config import VLLM_RELEASE, release

SUPPORTED_VLLM = VLLM_RELEASE  # the method's contract is this release's
ENV_SWITCH = "PEAGLE_FUSED_DRAFT"
ENV_STATS = "PEAGLE_FUSED_DRAFT_STATS"
ENV_VERIFY = "PEAGLE_FUSED_DRAFT_VERIFY"
LOG_EVERY = 1000

# A child of vLLM's logger, so lines come out in the server's format.
logger = logging.getLogger("vllm.peagle_fused_draft")

_state: dict[str, Any] = {"original": None, "calls": 0, "rows": 0, "verified": 0,
                          "mismatches": 0, "past_end_rows": 0, "rejected_rows": 0, "max_live_position": -1}
DECISION_EVENT = "peagle.fused_draft"


def switch_value(env: Mapping[str, str] = os.environ) -> str:
    """The switch's value; ValueError naming the variable when it is not one of the three allowed.

    The entrypoint calls this too, so a bad value stops the container before vLLM starts.
    """
    value = env.get(ENV_SWITCH, "auto").strip().lower() or "auto"
    if value not in ("0", "1", "auto"):
        raise ValueError(f"{ENV_SWITCH}: got {value!r}; allowed: '0', '1' or 'auto'")
    return value


def _decide() -> tuple[bool, str | None]:
    """(install?, reason to log when not). A None reason means stay silent."""
    switch = switch_value()
    if switch == "0":
        return False, None
    import vllm
    from vllm.platforms import current_platform

    version = str(getattr(vllm, "__version__", "unknown"))
    if release(version) != SUPPORTED_VLLM:
        return False, (f"peagle fused draft: not installed, written for vLLM {SUPPORTED_VLLM} and this is "
                       f"vLLM {version}; vLLM's own parallel-draft input path stays in place")
    if switch == "auto":
        return False, (f"peagle fused draft: not installed, {ENV_SWITCH}=auto is decided at container start by the "
                       "image's entrypoint (peagle_runtime.kernels.start_check), which did not run; vLLM's own "
                       "parallel-draft input path stays in place") if current_platform.is_cuda() else None
    if current_platform.is_cuda():
        return True, None
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False, (f"peagle fused draft: not installed, {ENV_SWITCH}=1 without CUDA needs "
                       "TRITON_INTERPRET=1 (Triton has no CPU backend here)")
    return True, None


def register() -> None:
    """The vllm.general_plugins entry point. Safe to call more than once."""
    install, reason = _decide()
    if not install:
        if reason:
            logger.warning(reason)
        return
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    current = SpecDecodeBaseProposer.set_inputs_first_pass
    if getattr(current, "__peagle_fused__", False):
        return
    _state["original"] = current
    SpecDecodeBaseProposer.set_inputs_first_pass = _fused_set_inputs_first_pass
    logger.info("peagle fused draft: installed into vLLM %s SpecDecodeBaseProposer (pid %d)",
                SUPPORTED_VLLM, os.getpid())


def is_installed() -> bool:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    return bool(getattr(SpecDecodeBaseProposer.set_inputs_first_pass, "__peagle_fused__", False))


def calls() -> int:
    return int(_state["calls"])


def _applies(proposer: Any) -> bool:
    """The fused kernel covers P-EAGLE's layout only; draft models, DFlash and friends keep vLLM's path."""
    return bool(
        proposer.needs_extra_input_slots
        and proposer.parallel_drafting
        and proposer.pass_hidden_states_to_model
        and proposer.method != "dflash"
        and not proposer.use_heterogeneous_vocab
        and not proposer.uses_mrope
        and proposer.parallel_drafting_hidden_state_tensor is not None
        and proposer.net_num_new_slots_per_request == proposer.extra_slots_per_request - 1
    )


def _fused_set_inputs_first_pass(
    self: Any,
    target_token_ids,
    next_token_ids,
    target_positions,
    target_hidden_states,
    token_indices_to_sample,
    cad,
    num_rejected_tokens_gpu,
):
    args = dict(target_token_ids=target_token_ids, next_token_ids=next_token_ids,
                target_positions=target_positions, target_hidden_states=target_hidden_states,
                token_indices_to_sample=token_indices_to_sample, cad=cad,
                num_rejected_tokens_gpu=num_rejected_tokens_gpu)
    if not _applies(self):
        return _state["original"](self, **args)
    if os.environ.get(ENV_VERIFY) == "1":
        result = _fused_checked_against_vllm(self, args)
    else:
        result = _fused_build(self, **args)
    _count(result[0])
    return result


def _fused_build(
    self: Any, *, target_token_ids, next_token_ids, target_positions, target_hidden_states,
    token_indices_to_sample, cad, num_rejected_tokens_gpu,
):
    import torch
    from vllm.v1.spec_decode.utils import extend_all_queries_by_N

    from peagle_runtime.kernels.draft_io import DraftBatch, DraftInputs, DraftSpec
    from peagle_runtime.kernels.fused import build_draft_inputs_fused

    assert self.block_size > 0, "block_size has not been initialized."
    batch = DraftBatch(
        target_token_ids=target_token_ids,
        target_positions=target_positions,
        target_hidden_states=target_hidden_states,
        next_token_ids=next_token_ids,
        query_start_loc=cad.query_start_loc,
        num_rejected=num_rejected_tokens_gpu,
        block_table=cad.block_table_tensor,
        mask_hidden=self.parallel_drafting_hidden_state_tensor,
    )
    spec = DraftSpec(
        num_slots=self.extra_slots_per_request,
        mask_token_id=self.parallel_drafting_token_id,
        block_size=self.block_size,
        max_model_len=self.max_model_len,
    )
    n_out = batch.num_output_rows(spec)
    # Write straight into the proposer's persistent buffers, as vLLM's own path does.
    out = DraftInputs(
        token_ids=self.input_ids[:n_out],
        positions=self.positions[:n_out],
        is_rejected=self.is_rejected_token_mask[:n_out],
        is_masked=self.is_masked_token_mask[:n_out],
        sample_indices=torch.empty(batch.num_reqs * spec.num_slots, dtype=torch.int32, device=self.device),
        hidden_states=self.hidden_states[:n_out],
        slot_mapping=torch.empty(n_out, dtype=torch.int64, device=self.device),
    )
    build_draft_inputs_fused(batch=batch, spec=spec, max_query_len=cad.max_query_len, out=out)
    new_cad = extend_all_queries_by_N(
        cad, N=self.net_num_new_slots_per_request, arange=self.arange, new_slot_mapping=out.slot_mapping
    )
    return n_out, out.sample_indices, new_cad


_BUFFERS = ("input_ids", "positions", "is_rejected_token_mask", "is_masked_token_mask", "hidden_states")


def _fused_checked_against_vllm(self: Any, args: dict[str, Any]):
    """Diagnostic mode (PEAGLE_FUSED_DRAFT_VERIFY=1): run vLLM's own build, then ours from the same buffer
    state, and compare every buffer and output bit for bit. Costs a copy of the buffers and a device sync
    per step; the fused result is the one used."""
    import torch

    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(torch.uint8)

    before = {name: getattr(self, name).clone() for name in _BUFFERS}
    n_v, idx_v, cad_v = _state["original"](self, **args)
    theirs = {name: getattr(self, name).clone() for name in _BUFFERS}
    for name in _BUFFERS:
        getattr(self, name).copy_(before[name])
    n_f, idx_f, cad_f = _fused_build(self, **args)
    mismatched = [name for name in _BUFFERS if not torch.equal(bits(getattr(self, name)), bits(theirs[name]))]
    pairs = {"num_tokens": (n_f, n_v), "max_query_len": (cad_f.max_query_len, cad_v.max_query_len),
             "num_actual_tokens": (cad_f.num_actual_tokens, cad_v.num_actual_tokens)}
    mismatched += [name for name, (a, b) in pairs.items() if a != b]
    tensors = {"sample_indices": (idx_f, idx_v), "slot_mapping": (cad_f.slot_mapping, cad_v.slot_mapping),
               "query_start_loc": (cad_f.query_start_loc, cad_v.query_start_loc),
               "seq_lens": (cad_f.seq_lens, cad_v.seq_lens)}
    mismatched += [name for name, (a, b) in tensors.items()
                   if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(bits(a), bits(b))]
    _state["verified"] += 1
    # Edge coverage, visible in the stats file: rows whose KV slot is the padding slot for being past the end.
    live = ~self.is_rejected_token_mask[:n_f]
    _state["past_end_rows"] += int((live & (self.positions[:n_f] >= self.max_model_len)).sum())
    _state["rejected_rows"] += int((~live).sum())
    if bool(live.any()):
        _state["max_live_position"] = max(_state["max_live_position"], int(self.positions[:n_f][live].max()))
    if mismatched:
        _state["mismatches"] += 1
        logger.warning("peagle fused draft: differs from vLLM's build in %s", ", ".join(mismatched))
    return n_f, idx_f, cad_f


_fused_set_inputs_first_pass.__peagle_fused__ = True  # type: ignore[attr-defined]


def _count(rows: int) -> None:
    _state["calls"] += 1
    _state["rows"] += rows
    n = _state["calls"]
    path = os.environ.get(ENV_STATS)
    if path:
        _write_stats(path.replace("{pid}", str(os.getpid())))
    elif n == 1 or n % LOG_EVERY == 0:
        logger.info("peagle fused draft: %d calls, %d drafter rows built (pid %d)", n, _state["rows"], os.getpid())


def _write_stats(path: str) -> None:
    import vllm

    payload = {"calls": _state["calls"], "rows": _state["rows"], "verified": _state["verified"],
               "mismatches": _state["mismatches"], "past_end_rows": _state["past_end_rows"],
               "rejected_rows": _state["rejected_rows"], "max_live_position": _state["max_live_position"],
               "pid": os.getpid(),
               "vllm": str(getattr(vllm, "__version__", "unknown"))}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".peagle-stats-", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)  # readers never see half a file
