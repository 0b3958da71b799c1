"""Train the small Llama target on the corpus (plain next-token cross-entropy, fp32, CPU)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class TargetTraining:
    """How the target is trained; its architecture is a models.layout.TargetSpec."""

    seq_len: int = 128
    batch_size: int = 16
    steps: int = 500
    lr: float = 3e-3
    seed: int = 0


def pack_tokens(docs_ids: list[list[int]], *, eos_id: int, seq_len: int) -> torch.Tensor:
    """Join documents with end-of-text and cut into [n, seq_len] rows (the tail that does not fill a row is dropped)."""
    flat: list[int] = []
    for ids in docs_ids:
        flat.extend(ids)
        flat.append(eos_id)
    n = len(flat) // seq_len
    return torch.tensor(flat[: n * seq_len], dtype=torch.long).view(n, seq_len)


def cosine_lr(step: int, total: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_target(rows: torch.Tensor, config: LlamaConfig, spec: TargetTraining, *, log=print) -> LlamaForCausalLM:
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).float()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(spec.seed)
    start = time.time()
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, spec.steps, spec.lr)
        batch = rows[torch.randint(0, rows.shape[0], (spec.batch_size,), generator=gen)]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == spec.steps - 1:
            log(f"target step {step:4d} loss {loss.item():.3f} ({time.time() - start:.0f}s)")
    model.eval()
    return model
