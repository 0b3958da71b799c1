"""Self-distillation data for drafter heads of a real target: its own greedy answers, then its features.

The published P-EAGLE and EAGLE-3 heads are trained on the target's own generations; so are ours:

1. :func:`generate` - vLLM (the engine that will serve the target, fp32, greedy) answers coding tasks in a
   child process; ``samples.jsonl`` holds each task's prompt and answer token ids.
2. :func:`extract_features` - the target (transformers, fp32) reads every prompt + answer once; for each
   position it stores the three auxiliary hidden states the drafter's ``fc`` fuses (fp16, a memmap), the
   target's own greedy next token (the label: agreeing with the target is what greedy verification accepts)
   and its ``top_k`` largest logits with their token ids (what KL distillation needs: on this target's
   answers the top 32 of 49,152 tokens hold 97% of the next-token probability on average, 99% at the
   median, measured on 1,058 answer rows of the demo recipe).

Both steps print a progress line per chunk; both write into a folder the caller publishes atomically.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES = "samples.jsonl"


def generate(target: Path, messages: Sequence[list[dict]], out: Path, *, max_tokens: int, max_model_len: int = 1024,
             batch: int = 128, log=print) -> Path:
    """Greedy answers of ``target`` to ``messages`` (chat), by vLLM in a child process; returns samples.jsonl."""
    from models.cpu_engine import cpu_engine_environment

    out.mkdir(parents=True, exist_ok=True)
    request = out / "generate.json"
    request.write_text(json.dumps({"target": str(target), "messages": list(messages), "max_tokens": max_tokens,
                                   "max_model_len": max_model_len, "batch": batch}))
    # A batch of 128 answers needs about 4 GiB of KV cache (46 KB a token on this target); a 1 GiB cache
    # held it to about 64 sequences at once.
    base = {"VLLM_CPU_KVCACHE_SPACE": "4", **os.environ}
    env = {**cpu_engine_environment(base), "PYTHONPATH": str(REPO_ROOT), "PEAGLE_FUSED_DRAFT": "0"}
    run_child(["models.trainer.distill", str(request), str(out / SAMPLES)], env=env, prefix="distill:", log=log,
              what="generation")
    return out / SAMPLES


def run_child(module_args: Sequence[str], *, env: dict[str, str], prefix: str, log=print, what: str) -> None:
    """``python -m <module_args>`` from the repository root, its lines starting with ``prefix`` passed to ``log``;
    RuntimeError with the child's last 40 lines when it fails (a vLLM engine says why only at the end)."""
    proc = subprocess.Popen([sys.executable, "-m", *module_args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            log(line.rstrip())
        tail = (tail + [line])[-40:]
    if proc.wait() != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{''.join(tail)}")


def _generate_child(request_path: str, samples_path: str) -> int:
    from vllm import LLM, SamplingParams

    request = json.loads(Path(request_path).read_text())
    from models.cpu_engine import exact_engine_kwargs

    llm = LLM(**exact_engine_kwargs(request["target"], max_model_len=request["max_model_len"],
                                    max_num_seqs=request["batch"]))
    tokenizer = llm.get_tokenizer()
    room = request["max_model_len"] - request["max_tokens"]
    prompts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in request["messages"]]
    prompts = [list(p if isinstance(p, list) else p["input_ids"]) for p in prompts]  # a list or an encoding
    kept = [p for p in prompts if len(p) <= room]
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    started, produced = time.time(), 0
    with open(samples_path, "w") as out:
        for lo in range(0, len(kept), request["batch"]):
            chunk = kept[lo:lo + request["batch"]]
            results = llm.generate([{"prompt_token_ids": p} for p in chunk], params, use_tqdm=False)
            for prompt, result in zip(chunk, results):
                answer = list(result.outputs[0].token_ids)
                produced += len(answer)
                out.write(json.dumps({"prompt_ids": prompt, "output_ids": answer}) + "\n")
            out.flush()
            rate = produced / max(time.time() - started, 1e-9)
            print(f"distill: answered {min(lo + len(chunk), len(kept))}/{len(kept)} tasks, {produced} tokens, "
                  f"{rate:.0f} tok/s ({len(prompts) - len(kept)} prompts too long, left out)", flush=True)
    return 0


def read_samples(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Features:
    """Every sample's tokens, fused target features and the target's greedy labels, end to end.

    ``offsets[i]:offsets[i+1]`` is sample i; ``answer_starts[i]`` the index (within the sample) of its first
    answer token.
    """

    tokens: np.ndarray  # [N] int32
    labels: np.ndarray  # [N] int32: the target's argmax after each position
    fused: np.ndarray  # [N, n_aux * hidden] float16 (a memmap)
    offsets: np.ndarray  # [S + 1] int64
    answer_starts: np.ndarray  # [S] int64
    top_ids: np.ndarray | None = None  # [N, k] int32: the target's k most likely next tokens, most likely first
    top_logits: np.ndarray | None = None  # [N, k] float16: their logits

    @classmethod
    def load(cls, folder: Path) -> "Features":
        meta = json.loads((folder / "features.json").read_text())
        fused = np.memmap(folder / "fused.f16", dtype=np.float16, mode="r", shape=(meta["tokens"], meta["width"]))
        top = meta.get("top_k", 0)
        return cls(tokens=np.load(folder / "tokens.npy"), labels=np.load(folder / "labels.npy"), fused=fused,
                   offsets=np.load(folder / "offsets.npy"), answer_starts=np.load(folder / "answer_starts.npy"),
                   top_ids=np.load(folder / "top_ids.npy") if top else None,
                   top_logits=np.load(folder / "top_logits.npy") if top else None)

    @property
    def samples(self) -> int:
        return len(self.offsets) - 1


def extract_features(target: Path, samples: list[dict], out: Path, *, aux_layer_ids: Sequence[int],
                     top_k: int = 32, batch_tokens: int = 4096, log=print) -> Features:
    """Run the target once over every prompt + answer; write the arrays of :class:`Features` into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    width = len(aux_layer_ids) * model.config.hidden_size
    seqs = [s["prompt_ids"] + s["output_ids"] for s in samples]
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    total = int(offsets[-1])
    out.mkdir(parents=True, exist_ok=True)
    fused = np.memmap(out / "fused.f16", dtype=np.float16, mode="w+", shape=(total, width))
    labels = np.zeros(total, dtype=np.int32)
    top_ids = np.zeros((total, top_k), dtype=np.int32)
    top_logits = np.zeros((total, top_k), dtype=np.float16)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # similar lengths together: little padding
    started, done = time.time(), 0
    with torch.no_grad():
        i = 0
        while i < len(order):
            group = [order[i]]
            while i + len(group) < len(order) and (len(group) + 1) * len(seqs[order[i + len(group)]]) <= batch_tokens:
                group.append(order[i + len(group)])
            i += len(group)
            length = max(len(seqs[g]) for g in group)
            ids = torch.zeros(len(group), length, dtype=torch.long)
            mask = torch.zeros(len(group), length, dtype=torch.long)
            for row, g in enumerate(group):
                ids[row, :len(seqs[g])] = torch.tensor(seqs[g])
                mask[row, :len(seqs[g])] = 1
            result = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            stacked = torch.cat([result.hidden_states[a] for a in aux_layer_ids], dim=-1)
            greedy = result.logits.argmax(-1)
            best = result.logits.topk(top_k, dim=-1) if top_k else None
            for row, g in enumerate(group):
                lo, n = int(offsets[g]), len(seqs[g])
                fused[lo:lo + n] = stacked[row, :n].to(torch.float16).numpy()
                labels[lo:lo + n] = greedy[row, :n].numpy()
                if best is not None:
                    top_ids[lo:lo + n] = best.indices[row, :n].numpy()
                    top_logits[lo:lo + n] = best.values[row, :n].to(torch.float16).numpy()
            done += sum(len(seqs[g]) for g in group)
            log(f"distill: features for {done}/{total} tokens ({done / max(time.time() - started, 1e-9):.0f} tok/s)")
    fused.flush()
    np.save(out / "tokens.npy", np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs]))
    np.save(out / "labels.npy", labels)
    if top_k:
        np.save(out / "top_ids.npy", top_ids)
        np.save(out / "top_logits.npy", top_logits)
    np.save(out / "offsets.npy", offsets)
    np.save(out / "answer_starts.npy", np.asarray([len(s["prompt_ids"]) for s in samples], dtype=np.int64))
    (out / "features.json").write_text(json.dumps({"tokens": total, "width": width, "top_k": top_k,
                                                   "aux_layer_ids": list(aux_layer_ids)}) + "\n")
    return Features.load(out)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(_generate_child(sys.argv[1], sys.argv[2]))
