"""Acceptance measured the way vLLM serves a head: its own engine and counters, on held-out prompts.

A head's teacher-forced agreement on training windows is an estimate; what counts is what vLLM accepts when
it drafts with the head from whole prompts. :func:`measure` runs each configuration (plain decoding, or a
speculative config) in a child process with its own engine (fp32, eager, greedy, one request at a time,
after a warm-up request) and returns, per configuration: output tokens per second, acceptance length and
acceptance per draft position from vLLM's spec-decode counters, and the greedy tokens (so a caller can
check them against plain decoding). ``per_prompt`` holds each prompt's own counters and time (the counters read
around it), the rows :mod:`models.acceptance_stats` pools and bootstraps over prompts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]


def measure(target: Path, configs: Sequence[dict], prompts: Sequence[list[int]], *, max_tokens: int,
            log=print) -> list[dict]:
    """``configs``: ``{"name": ..., "speculative_config": dict | None}`` each; results in the same order."""
    with tempfile.TemporaryDirectory(prefix="serving-check-") as folder:
        return [_measure_one(target, config, prompts, max_tokens=max_tokens, workdir=Path(folder), log=log)
                for config in configs]


def _measure_one(target: Path, config: dict, prompts: Sequence[list[int]], *, max_tokens: int, workdir: Path,
                 log) -> dict:
    from models.cpu_engine import cpu_engine_environment

    env = {**cpu_engine_environment(), "PYTHONPATH": str(REPO_ROOT), "PEAGLE_FUSED_DRAFT": "0",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    request, out = workdir / f"{config['name']}.request.json", workdir / f"{config['name']}.result.json"
    request.write_text(json.dumps({"target": str(target), "prompts": list(prompts), "max_tokens": max_tokens,
                                   "speculative_config": config["speculative_config"]}))
    with (workdir / f"{config['name']}.log").open("w") as stream:
        proc = subprocess.run([sys.executable, "-m", "models.trainer.serving_check", str(request), str(out)],
                              cwd=REPO_ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not out.is_file():
        tail = (workdir / f"{config['name']}.log").read_text()[-3000:]
        raise RuntimeError(f"serving check {config['name']} failed (exit {proc.returncode}):\n{tail}")
    result = {"name": config["name"], **json.loads(out.read_text())}
    log(f"  vLLM on {len(prompts)} held-out prompts, {config['name']}: {result['tokens_per_s']} tok/s, "
        f"AL {result['acceptance_length']}, per position {result['accepted_per_position']}")
    return result


def _child(request_path: str, out_path: str) -> int:
    from vllm import LLM, SamplingParams

    from models import spec_metrics

    request = json.loads(Path(request_path).read_text())
    from models.cpu_engine import exact_engine_kwargs

    llm = LLM(**exact_engine_kwargs(request["target"], max_model_len=2048, max_num_seqs=4, disable_log_stats=False,
                                    speculative_config=request["speculative_config"]))
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    prompts = [{"prompt_token_ids": p} for p in request["prompts"]]
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up: first-call costs stay out of the timing
    before = spec_metrics.from_engine(llm.get_metrics())
    outputs, elapsed, per_prompt = [], 0.0, []
    previous = before
    for prompt in prompts:
        started = time.perf_counter()
        result = llm.generate([prompt], params, use_tqdm=False)[0]
        seconds = time.perf_counter() - started
        elapsed += seconds
        outputs.append(list(result.outputs[0].token_ids))
        now = spec_metrics.from_engine(llm.get_metrics())  # read outside the timed call
        own = now - previous
        previous = now
        per_prompt.append({"drafts": int(own.drafts), "accepted": [int(a) for a in own.accepted_per_position],
                           "output_tokens": len(outputs[-1]), "seconds": round(seconds, 6)})
    spec = spec_metrics.from_engine(llm.get_metrics()) - before
    produced = sum(len(o) for o in outputs)
    Path(out_path).write_text(json.dumps({
        "tokens_per_s": round(produced / elapsed, 2), "output_tokens": produced,
        "acceptance_length": round(spec.acceptance_length, 3) if spec.drafts else None,
        "accepted_per_position": [round(x, 3) for x in spec.per_position_rates()],
        "token_ids": outputs, "per_prompt": per_prompt}))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
