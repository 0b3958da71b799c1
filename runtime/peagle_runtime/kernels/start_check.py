"""The fused kernel's check at container start: once, before vLLM starts, in a child process.

With ``PEAGLE_FUSED_DRAFT=auto`` (the default) the entrypoint calls :func:`fused_draft_at_start` before it
execs vLLM. Where the kernel could run - a CUDA device, or the Triton interpreter (``TRITON_INTERPRET=1``, for
tests on a CPU) - it starts ``python -m peagle_runtime.kernels.start_check`` with the deployment's shapes: K, the
batch limit (``max_num_seqs``), ``max_model_len``, the block size, and the drafter's hidden size, dtype and
mask-token id. The child builds decode, prefill and mixed batches both ways
(:func:`peagle_runtime.kernels.self_check.agrees_with_vllm`) and prints its verdict. The entrypoint then hands
vLLM ``PEAGLE_FUSED_DRAFT=1`` when every byte agreed, ``0`` otherwise, and logs one line saying which and why.

Why a child: a kernel that faults the device (an illegal address, a sticky CUDA error) poisons the CUDA context
of the process it runs in; in the engine that context is the engine's, its fallback fails too, the engine dies,
and SageMaker restarts the container into the same fault. The child's context dies with the child. A check
that disagrees, crashes, or runs past :data:`CHECK_TIMEOUT_S` leaves the kernel off for the life of this
container: it is never retried, and the server starts either way. No CUDA device and no interpreter: nothing
runs and nothing is logged (the kernel has nowhere to run).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

from peagle_contract.drafter import mask_token_id
from peagle_contract.serving import ENV_PREFIX

from peagle_runtime.plugin import DECISION_EVENT, ENV_SWITCH, switch_value
CHECK_TIMEOUT_S = 300.0  # a vLLM import and a Triton compile fit with room to spare
RESULT_MARK = "PEAGLE_START_CHECK "
DEFAULT_MAX_NUM_SEQS, DEFAULT_BLOCK_SIZE = 256, 16
_DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
           "bfloat16": "bfloat16"}


@dataclass(frozen=True)
class CheckShapes:
    k: int
    max_num_seqs: int
    max_model_len: int
    block_size: int
    hidden_size: int
    dtype: str
    mask_token_id: int


def may_run_here(env: Mapping[str, str]) -> bool:
    """Without importing torch: a CUDA device node, or the interpreter asked for."""
    return env.get("TRITON_INTERPRET") == "1" or bool(glob.glob("/dev/nvidia[0-9]*"))


def shapes_for(env: Mapping[str, str], spec: Mapping, target: str) -> CheckShapes:
    """What the engine will draft with, read from the serving environment and the two models' configs.
    ValueError (with the reason) when a config it needs is not a local file."""
    drafter_config = _config(spec["model"], "the drafter")
    target_config = _config(target, "the target") if Path(target).expanduser().is_dir() else {}
    token = mask_token_id(drafter_config)
    hidden = drafter_config.get("hidden_size")
    if not isinstance(token, int) or not isinstance(hidden, int):
        raise ValueError("the drafter's config.json names no hidden_size or mask-token id")
    dtype = env.get(ENV_PREFIX + "DTYPE", "auto")
    if dtype == "auto":
        dtype = str(target_config.get("torch_dtype") or target_config.get("dtype") or drafter_config.get(
            "torch_dtype") or "bfloat16")
    max_len = env.get(ENV_PREFIX + "MAX_MODEL_LEN") or target_config.get("max_position_embeddings") or 8192
    return CheckShapes(k=int(spec["num_speculative_tokens"]),
                       max_num_seqs=int(env.get(ENV_PREFIX + "MAX_NUM_SEQS") or DEFAULT_MAX_NUM_SEQS),
                       max_model_len=int(max_len),
                       block_size=int(env.get(ENV_PREFIX + "BLOCK_SIZE") or DEFAULT_BLOCK_SIZE),
                       hidden_size=hidden, dtype=_DTYPES.get(dtype, dtype), mask_token_id=token)


def _config(model: str, what: str) -> dict:
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        raise ValueError(f"{what}'s config.json is not a local file ({str(path)[:120]})")
    return json.loads(path.read_text())


def fused_draft_at_start(env: Mapping[str, str], spec: Mapping, target: str, *,
                         timeout_s: float = CHECK_TIMEOUT_S, log: Callable[[str], None] = print) -> str:
    """The switch value vLLM gets: ``1`` (the kernel proved itself here) or ``0``; an explicit 0 or 1 as it
    is. ``log`` gets the one line that says what was decided and why (none when nothing could run)."""
    switch = switch_value(env)
    if switch != "auto" or not may_run_here(env):
        return "0" if switch == "auto" else switch
    decision: dict = {"event": DECISION_EVENT, "checked": "at start, in a child process"}
    try:
        shapes = shapes_for(env, spec, target)
    except (ValueError, OSError) as exc:
        decision.update(use="vllm", why=f"no check possible: {exc}"[:300])
        log(json.dumps(decision))
        return "0"
    decision["shapes"] = asdict(shapes)
    verdict = run_check(shapes, env, timeout_s=timeout_s)
    decision.update(verdict)
    log(json.dumps(decision))
    return "1" if verdict["use"] == "fused" else "0"


def run_check(shapes: CheckShapes, env: Mapping[str, str], *, timeout_s: float) -> dict:
    """Run the child once; its verdict, or why there is none (crash, timeout, no result)."""
    command = [sys.executable, "-m", "peagle_runtime.kernels.start_check",
               *[f"--{key.replace('_', '-')}={value}" for key, value in asdict(shapes).items()]]
    child_env = {**env, ENV_SWITCH: "0"}  # the child compares vLLM's own path with the kernel: no plugin swap
    started = time.monotonic()
    proc = subprocess.Popen(command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"use": "vllm", "agree": False, "why": f"the check ran past {timeout_s:g} s and was killed"}
    took = round(time.monotonic() - started, 1)
    lines = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode < 0:
        why = f"the check crashed ({signal.Signals(-proc.returncode).name})"
    elif not lines:
        why = f"the check exited {proc.returncode} without a verdict: {err.strip().splitlines()[-1:]}"[:300]
    else:
        result = json.loads(lines[-1].removeprefix(RESULT_MARK))
        agree = bool(result.get("agree"))
        why = "every batch agreed byte for byte with vLLM's build" if agree else \
            f"differs from vLLM's build in {', '.join(result.get('mismatched', []))[:200]}" if "mismatched" in result \
            else f"the check failed: {result.get('error', '?')}"[:300]
        return {"use": "fused" if agree else "vllm", "agree": agree, "why": why, "seconds": took,
                **{k: result[k] for k in ("batches", "device") if k in result}}
    return {"use": "vllm", "agree": False, "why": why, "seconds": took}


def main(argv: list[str] | None = None) -> int:
    """The child: build the representative batches both ways on this device and print the verdict."""
    parser = argparse.ArgumentParser(prog="peagle_runtime.kernels.start_check")
    for name in ("k", "max_num_seqs", "max_model_len", "block_size", "hidden_size", "mask_token_id"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, required=True)
    parser.add_argument("--dtype", required=True, choices=sorted(set(_DTYPES.values())))
    args = parser.parse_args(argv)
    try:
        import torch
        from vllm.platforms import current_platform
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        from peagle_runtime.kernels.draft_io import DraftSpec
        from peagle_runtime.kernels.self_check import agrees_with_vllm
        from peagle_runtime.plugin import _fused_build

        if torch.cuda.is_available():
            device = torch.device("cuda", 0)
        else:
            device = torch.device("cpu")
            current_platform.register_triton_kernel_overrides()  # as vLLM's CPU worker does (its build is C++ there)
        spec = DraftSpec(num_slots=args.k, mask_token_id=args.mask_token_id, block_size=args.block_size,
                         max_model_len=args.max_model_len)
        result = agrees_with_vllm(SpecDecodeBaseProposer.set_inputs_first_pass, _fused_build, spec=spec,
                                  hidden_size=args.hidden_size, dtype=getattr(torch, args.dtype), device=device,
                                  max_num_seqs=args.max_num_seqs)
    except Exception as exc:  # noqa: BLE001 - a Python-level failure is a verdict too: not agreed
        result = {"agree": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
