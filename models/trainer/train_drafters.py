"""Training loops for the two drafter heads against a frozen target, and a held-out acceptance estimate."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from models.trainer.drafter import DrafterHead, DrafterShape
from models.trainer.objectives import TargetBatch, parallel_loss, sequential_loss, target_batch
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


def init_head(shape: DrafterShape, target, *, parallel: bool, seed: int, learn_embedding: bool = True,
              mask_token: int | None = None, draft_ids: torch.Tensor | None = None) -> DrafterHead:
    """Same seed and same start for both heads: embedding and LM head start as the target's (the LM head's
    rows restricted to ``draft_ids`` for a reduced draft vocabulary); the final norm starts at one, not at
    the target's: the head's early output has a random direction, and the target's larger norm weights
    (about 1.8 on SmolLM2) turn that into confident wrong logits (a first loss of ~19 nats per depth
    instead of ~11) that take many steps to unlearn."""
    torch.manual_seed(seed)
    head = DrafterHead(shape, parallel=parallel, learn_embedding=learn_embedding, mask_token=mask_token)
    for module in head.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.02)
    with torch.no_grad():
        embedding = target.get_input_embeddings().weight
        head.embed_tokens.weight.copy_(embedding)
        if head.mask_embedding is not None:
            head.mask_embedding.copy_(embedding[mask_token])
        lm_head = target.get_output_embeddings().weight
        head.lm_head.weight.copy_(lm_head if draft_ids is None else lm_head[draft_ids])
    return head


def anchors_for(spec: DrafterTraining, t: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(t - 2, generator=gen)[: spec.anchors or t].sort().values


def train_head(head: DrafterHead, batches: Callable[[torch.Generator], TargetBatch], spec: DrafterTraining, *,
               mask_token: int, log=print) -> DrafterHead:
    """``batches(gen)`` draws one training batch; the same generator then draws P-EAGLE's anchors."""
    parallel = head.mask_hidden is not None
    name = "p-eagle" if parallel else "eagle-3"
    trainable = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed + (1 if parallel else 2))
    start = time.time()
    head.train()
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, spec.steps, spec.lr)
        batch = batches(gen)
        if parallel:
            result = parallel_loss(head, batch, depth=spec.depth, anchors=anchors_for(spec, batch.tokens.shape[1], gen),
                                   mask_token=mask_token)
        else:
            result = sequential_loss(head, batch, depth=spec.depth)
        opt.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        if step % 50 == 0 or step == spec.steps - 1:
            acc = " ".join(f"{h / max(c, 1):.2f}" for h, c in zip(result.hits, result.counts))
            log(f"{name} step {step:4d} loss {result.loss.item():.3f} agree/depth [{acc}] ({time.time() - start:.0f}s)")
    head.eval()
    return head


def target_rows(target, rows: torch.Tensor, spec: DrafterTraining, aux_layer_ids: list[int]
                ) -> Callable[[torch.Generator], TargetBatch]:
    """Batches for a target trained here: random packed rows, the target's features computed on the fly."""
    return lambda gen: target_batch(target, rows[torch.randint(0, rows.shape[0], (spec.batch_size,), generator=gen)],
                                    aux_layer_ids)


@torch.no_grad()
def estimate_acceptance(head: DrafterHead, batch: TargetBatch, *, depth: int, mask_token: int) -> dict[str, float]:
    """Teacher-forced agreement with the target on held-out rows, per depth, and the acceptance length it
    implies for K = depth (1 + the expected run of leading agreements). Only an estimate: vLLM's counters in
    the benchmarks are the measurement."""
    t = batch.tokens.shape[1]
    if head.mask_hidden is not None:
        anchors = torch.arange(0, t - 1 - depth)
        result = parallel_loss(head, batch, depth=depth, anchors=anchors, mask_token=mask_token)
        assert result.chain is not None
        # Anchors whose every label counts (inside the answer, not padding).
        scored = torch.stack([batch.counts(anchors + 1 + k) for k in range(depth)], dim=-1).all(-1)
        run = result.chain.int().cumprod(-1).sum(-1).float()
        est = 1.0 + run[scored].mean().item()
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


def head_weights(head: DrafterHead, *, d2t: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint tensors in vLLM's naming.

    The EAGLE-3 head stores a zero mask_hidden (unused, vLLM skips it). A frozen embedding is left out when it
    is the target's own (vLLM then shares the target's) and written whole when a learned mask row makes it
    differ. ``d2t``: the draft-to-target offsets of a reduced draft vocabulary.
    """
    skip = {"mask_hidden", "mask_embedding", "embed_tokens.weight"}
    weights = {k: v.detach().clone() for k, v in head.state_dict().items() if k not in skip}
    if head.learn_embedding or head.mask_embedding is not None:
        weights["embed_tokens.weight"] = head.embedding_for_checkpoint()
    width = head.fc.in_features
    mask = head.mask_hidden.detach().clone() if head.mask_hidden is not None else torch.zeros(width)
    weights["mask_hidden"] = mask.view(1, width)
    if d2t is not None:
        weights["d2t"] = d2t.to(torch.long)
    return weights
