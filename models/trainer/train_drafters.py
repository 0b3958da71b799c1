"""Training loops for the two drafter heads against a frozen target, and a held-out acceptance estimate."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from models.trainer.drafter import DrafterHead, DrafterShape
from models.trainer.objectives import parallel_loss, sequential_loss, target_batch
from models.trainer.target import cosine_lr


@dataclass(frozen=True)
class DrafterTraining:
    steps: int = 500
    batch_size: int = 12
    depth: int = 7  # draft positions trained: covers K up to 7
    # P-EAGLE anchor rows per sequence; None: every row, so the parallel head sees as many training rows
    # per sequence ((T-1) * depth) as the EAGLE-3 head's training-time test does.
    anchors: int | None = None
    lr: float = 3e-3
    seed: int = 0


def init_head(shape: DrafterShape, target, *, parallel: bool, seed: int) -> DrafterHead:
    """Same seed and same start for both heads; embedding and LM head start as the target's (both trainable)."""
    torch.manual_seed(seed)
    head = DrafterHead(shape, parallel=parallel)
    for module in head.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.02)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight)
        head.norm.weight.copy_(target.model.norm.weight)
    return head


def train_head(head: DrafterHead, target, rows: torch.Tensor, spec: DrafterTraining, *, aux_layer_ids: list[int],
               mask_token: int, log=print) -> DrafterHead:
    parallel = head.mask_hidden is not None
    name = "p-eagle" if parallel else "eagle-3"
    opt = torch.optim.AdamW(head.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed + (1 if parallel else 2))
    t = rows.shape[1]
    start = time.time()
    head.train()
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, spec.steps, spec.lr)
        tokens = rows[torch.randint(0, rows.shape[0], (spec.batch_size,), generator=gen)]
        batch = target_batch(target, tokens, aux_layer_ids)
        if parallel:
            anchors = torch.randperm(t - 2, generator=gen)[: spec.anchors or t].sort().values
            result = parallel_loss(head, batch, depth=spec.depth, anchors=anchors, mask_token=mask_token)
        else:
            result = sequential_loss(head, batch, depth=spec.depth)
        opt.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == spec.steps - 1:
            acc = " ".join(f"{h / max(c, 1):.2f}" for h, c in zip(result.hits, result.counts))
            log(f"{name} step {step:4d} loss {result.loss.item():.3f} agree/depth [{acc}] ({time.time() - start:.0f}s)")
    head.eval()
    return head


@torch.no_grad()
def estimate_acceptance(head: DrafterHead, target, rows: torch.Tensor, *, depth: int, aux_layer_ids: list[int],
                        mask_token: int) -> dict[str, float]:
    """Teacher-forced agreement with the target on held-out rows, per depth, and the acceptance length it
    implies for K = depth (1 + the expected run of leading agreements). Only an estimate: vLLM's counters in
    bench/cpu_spec.py are the measurement."""
    t = rows.shape[1]
    batch = target_batch(target, rows, aux_layer_ids)
    if head.mask_hidden is not None:
        anchors = torch.arange(0, t - 1 - depth)
        result = parallel_loss(head, batch, depth=depth, anchors=anchors, mask_token=mask_token)
        assert result.chain is not None
        run = result.chain.int().cumprod(-1).sum(-1).float()
        est = 1.0 + run.mean().item()
    else:
        result = sequential_loss(head, batch, depth=depth)
        rates = [h / max(c, 1) for h, c in zip(result.hits, result.counts)]
        # Without the joint matrix, the product of per-depth rates is the usual estimate.
        est, p = 1.0, 1.0
        for rate in rates:
            p *= rate
            est += p
    return {"estimated_acceptance_length": round(est, 3),
            "agreement_per_depth": [round(h / max(c, 1), 3) for h, c in zip(result.hits, result.counts)]}


def head_weights(head: DrafterHead) -> dict[str, torch.Tensor]:
    """Checkpoint tensors in vLLM's naming; the EAGLE-3 head stores a zero mask_hidden (unused, vLLM skips it)."""
    weights = {k: v.detach().clone() for k, v in head.state_dict().items() if k != "mask_hidden"}
    width = head.fc.in_features
    mask = head.mask_hidden.detach().clone() if head.mask_hidden is not None else torch.zeros(width)
    weights["mask_hidden"] = mask.view(1, width)
    return weights
