"""Exercises peagle_runtime.plugin.register() under each switch setting in one process (importing vLLM costs
seconds), restoring vLLM's method between scenarios. Prints one JSON object on its last stdout line.
Started by test_fused_plugin.py with TRITON_INTERPRET=1 in its environment."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm  # noqa: E402
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer  # noqa: E402

from peagle_runtime import plugin  # noqa: E402

VLLMS_METHOD = SpecDecodeBaseProposer.set_inputs_first_pass


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def scenario(env: dict[str, str | None], version: str | None = None, calls: int = 1) -> dict:
    SpecDecodeBaseProposer.set_inputs_first_pass = VLLMS_METHOD
    saved = {k: os.environ.get(k) for k in env}
    real_version = vllm.__version__
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if version is not None:
        vllm.__version__ = version
    capture = Capture()
    logger = logging.getLogger("vllm.peagle_fused_draft")
    logger.addHandler(capture)
    logger.setLevel(logging.DEBUG)
    try:
        error = None
        for _ in range(calls):
            try:
                plugin.register()
            except ValueError as exc:
                error = str(exc)
        return {"installed": plugin.is_installed(), "log": capture.lines, "error": error}
    finally:
        logger.removeHandler(capture)
        vllm.__version__ = real_version
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        SpecDecodeBaseProposer.set_inputs_first_pass = VLLMS_METHOD


def fallback_and_stats() -> dict:
    """Installed plugin: a non-P-EAGLE proposer (draft model: hidden states not passed) takes vLLM's path
    untouched and is not counted; a P-EAGLE one is counted, and the stats file says so."""
    from kernel_parity_cases import CASES

    from peagle_runtime.kernels import DraftSpec
    from peagle_runtime.kernels.self_check import attention_metadata, proposer_state, same_bits
    from peagle_runtime.kernels.synthetic import make_batch

    case = next(c for c in CASES if c.name == "mixed_rejected")
    spec = DraftSpec(num_slots=case.k, mask_token_id=777, block_size=case.block_size, max_model_len=case.max_model_len)
    batch = make_batch(query_lens=case.query_lens, num_rejected=case.num_rejected,
                       first_positions=case.first_positions, spec=spec, hidden_size=case.hidden_size)
    rows = batch.num_output_rows(spec) + batch.num_reqs + 4  # room for the draft-model layout (K new rows)
    stats = Path(tempfile.mkdtemp()) / "stats-{pid}.json"
    os.environ[plugin.ENV_STATS] = str(stats)
    os.environ[plugin.ENV_SWITCH] = "1"
    plugin.register()
    try:
        def call(draft_model: bool):
            state = proposer_state(batch, spec, rows)
            if draft_model:
                # vLLM's draft-model flavour: no shift, no hidden states, K new rows per request.
                state.pass_hidden_states_to_model = False
                state.parallel_drafting_hidden_state_tensor = None
                state.net_num_new_slots_per_request = spec.num_slots
            result = SpecDecodeBaseProposer.set_inputs_first_pass(
                state, target_token_ids=batch.target_token_ids, next_token_ids=batch.next_token_ids,
                target_positions=batch.target_positions, target_hidden_states=batch.target_hidden_states,
                token_indices_to_sample=None, cad=attention_metadata(batch),
                num_rejected_tokens_gpu=batch.num_rejected)
            return state, result

        before = plugin.calls()
        patched_state, (n_patched, idx_patched, _) = call(draft_model=True)
        after_fallback = plugin.calls()
        SpecDecodeBaseProposer.set_inputs_first_pass = VLLMS_METHOD
        vllm_state, (n_vllm, idx_vllm, _) = call(draft_model=True)
        plugin.register()
        os.environ[plugin.ENV_VERIFY] = "1"
        call(draft_model=False)
        call(draft_model=False)
        verified_clean = dict(plugin._state)
        # The verifier must be able to fail: a build that gets one field wrong is reported.
        from peagle_runtime.kernels import fused

        real_build = fused.build_draft_inputs_fused

        def off_by_one_mask_token(*, batch, spec, **kw):
            return real_build(batch=batch, spec=DraftSpec(**{**spec.__dict__, "mask_token_id": spec.mask_token_id + 1}),
                              **kw)

        fused.build_draft_inputs_fused = off_by_one_mask_token
        try:
            call(draft_model=False)
        finally:
            fused.build_draft_inputs_fused = real_build
            os.environ.pop(plugin.ENV_VERIFY, None)
        stats_file = Path(str(stats).replace("{pid}", str(os.getpid())))
        return {
            "fallback_not_counted": after_fallback == before,
            "fallback_same_as_vllm": n_patched == n_vllm and same_bits(idx_patched, idx_vllm)
            and same_bits(patched_state.input_ids, vllm_state.input_ids)
            and same_bits(patched_state.positions, vllm_state.positions),
            "calls_after_two_peagle_steps": verified_clean["calls"] - after_fallback,
            "verified_clean": {k: verified_clean[k] for k in ("verified", "mismatches")},
            "stats": json.loads(stats_file.read_text()) if stats_file.is_file() else None,
            "pid": os.getpid(),
        }
    finally:
        SpecDecodeBaseProposer.set_inputs_first_pass = VLLMS_METHOD
        os.environ.pop(plugin.ENV_STATS, None)


def auto_on_a_gpu() -> dict:
    """``auto`` where vLLM's platform is CUDA (faked here) but the entrypoint did not decide it: the plugin never
    checks inside the engine (a device fault there would take the engine and its fallback down), so it stays out
    of the way with one line saying where the decision is made."""
    from vllm.platforms import current_platform

    real_is_cuda = current_platform.is_cuda
    current_platform.is_cuda = lambda: True
    try:
        return scenario({plugin.ENV_SWITCH: "auto"})
    finally:
        current_platform.is_cuda = real_is_cuda


def main() -> int:
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # as vLLM's CPU worker does: its layout op is C++ here
    results = {
        "auto_on_cpu": scenario({plugin.ENV_SWITCH: None}),
        "auto_explicit_on_cpu": scenario({plugin.ENV_SWITCH: "auto"}),
        "off": scenario({plugin.ENV_SWITCH: "0"}),
        "on_without_interpreter": scenario({plugin.ENV_SWITCH: "1", "TRITON_INTERPRET": None}),
        "on_with_interpreter": scenario({plugin.ENV_SWITCH: "1", "TRITON_INTERPRET": "1"}, calls=2),
        "other_vllm_version": scenario({plugin.ENV_SWITCH: "1", "TRITON_INTERPRET": "1"}, version="0.33.0"),
        "bad_value": scenario({plugin.ENV_SWITCH: "yes"}),
        "fallback_and_stats": fallback_and_stats(),
        "auto_on_gpu": auto_on_a_gpu(),
        "entry_points": sorted(ep.value for ep in entry_points(group="vllm.general_plugins")
                               if ep.name == "peagle_fused_draft"),
    }
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
