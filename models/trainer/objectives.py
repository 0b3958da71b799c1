"""The two drafter training objectives, on one batch of target features.

Notation for one training row r (0 <= r < T-1) of a sequence x_0..x_{T-1} the target has read:
the drafter gets token x_{r+1}, the target's fused hidden state at r and RoPE position r, and must predict
what the target predicts at r+1 (the next token after x_{r+1}). That is the layout vLLM builds at
inference: shifted target tokens, hidden states of the same positions.

- P-EAGLE (`parallel_loss`): for sampled anchor rows a, K-1 extra rows at positions a+1..a+K-1 carry the
  mask token and `fc(mask_hidden)`; the row at depth k must predict the target's prediction at a+1+k. A
  mask row sees the real rows up to its anchor and the mask rows before it in its own block - exactly what
  it sees in vLLM's single drafting pass. All depths are predicted in one forward and all contribute.
- EAGLE-3 (`sequential_loss`), training-time test: pass 0 is the real rows; pass d feeds every row the
  token d steps further on and the head's own pre-norm output of pass d-1, at position r+d; a row sees the
  real rows up to r plus its own earlier passes, as in vLLM's sequential draft loop.

Labels are the target's own greedy next tokens (cross-entropy on its argmax), since what counts at greedy
verification is agreeing with the target, not with the corpus; hard labels also keep the loss cheap on
these 2 cores. Depth d is weighted 0.8**d in both. A batch may say which label positions count
(``valid``: the answer, not the prompt or padding) and may hold labels the head cannot produce (-1: outside
a reduced draft vocabulary): those rows are left out of the loss and count as misses in the agreement.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.trainer.drafter import DrafterHead

DEPTH_DECAY = 0.8


@dataclass
class TargetBatch:
    tokens: torch.Tensor  # [B, T]
    fused: torch.Tensor  # [B, T, 3H] target aux hidden states, concatenated (before fc)
    labels: torch.Tensor  # [B, T] the target's greedy next token after each position (in the head's vocabulary)
    valid: torch.Tensor | None = None  # [B, T] bool: which labels count; None: all

    def counts(self, at: torch.Tensor) -> torch.Tensor:
        """[B, len(at)]: whether the labels at positions ``at`` count."""
        if self.valid is None:
            return torch.ones(self.tokens.shape[0], at.numel(), dtype=torch.bool)
        return self.valid[:, at]


@torch.no_grad()
def target_batch(target, tokens: torch.Tensor, aux_layer_ids: list[int]) -> TargetBatch:
    """Run the target once. HF's hidden_states[i] is the residual stream entering layer i, which is what
    vLLM's Llama collects for aux layer id i (ids must be below the layer count: HF's last entry is
    normalised)."""
    out = target(input_ids=tokens, output_hidden_states=True)
    fused = torch.cat([out.hidden_states[i] for i in aux_layer_ids], dim=-1)
    return TargetBatch(tokens=tokens, fused=fused, labels=out.logits.argmax(-1))


def _depth_loss(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy and greedy agreement over valid rows; returns (loss, hits, count, per-row hit).

    A label below zero (outside the draft vocabulary) is a miss and no loss."""
    trained = valid & (labels >= 0)
    if bool(trained.any()):
        ce = F.cross_entropy(logits.flatten(0, 1), labels.masked_fill(~trained, -100).flatten(), ignore_index=-100)
    else:
        ce = logits.sum() * 0.0
    hit = (logits.detach().argmax(-1) == labels) & trained
    return ce, hit.sum(), valid.sum(), hit


@dataclass
class StepResult:
    loss: torch.Tensor
    hits: list[int]  # per depth, greedy agreements with the target
    counts: list[int]  # per depth, rows scored
    chain: torch.Tensor | None = None  # P-EAGLE: [B, anchors, depth] hit matrix, for acceptance estimates


def parallel_loss(head: DrafterHead, batch: TargetBatch, *, depth: int, anchors: torch.Tensor,
                  mask_token: int) -> StepResult:
    """P-EAGLE: real rows plus, per anchor, depth-1 mask rows, all in one forward."""
    tokens, fused, labels = batch.tokens, batch.fused, batch.labels
    b, t = tokens.shape
    rows = t - 1
    n_mask = depth - 1
    a = anchors.numel()
    # Real rows.
    real_tok = tokens[:, 1:]
    real_pos = torch.arange(rows)
    real_hidden = head.fc(fused[:, :-1])
    # Mask rows, anchor-major: row (i, k) at position anchors[i] + k, k = 1..depth-1.
    ks = torch.arange(1, depth)
    mask_pos = (anchors[:, None] + ks[None, :]).reshape(-1)
    mask_tok = torch.full((b, a * n_mask), mask_token, dtype=torch.long)
    mask_hidden = head.shared_hidden().expand(b, a * n_mask, -1)
    # Attention: causal over real rows; a mask row sees real rows <= its anchor and its block up to itself.
    n = rows + a * n_mask
    allow = torch.zeros(n, n, dtype=torch.bool)
    allow[:rows, :rows] = torch.ones(rows, rows, dtype=torch.bool).tril()
    row_anchor = anchors.repeat_interleave(n_mask)
    allow[rows:, :rows] = torch.arange(rows)[None, :] <= row_anchor[:, None]
    block, within = torch.arange(a * n_mask) // n_mask, torch.arange(a * n_mask) % n_mask
    allow[rows:, rows:] = (block[:, None] == block[None, :]) & (within[None, :] <= within[:, None])
    logits, _, _ = head.step(torch.cat([real_tok, mask_tok], 1), torch.cat([real_hidden, mask_hidden], 1),
                             torch.cat([real_pos, mask_pos]), allow)
    # Depth 0 label for row r: target distribution at r+1.
    loss, h0, c0, hit0 = _depth_loss(logits[:, :rows], labels[:, 1:], batch.counts(torch.arange(1, t)))
    total, hits, counts = loss, [int(h0)], [int(c0)]
    mask_logits = logits[:, rows:].view(b, a, n_mask, -1)
    chain = torch.zeros(b, a, depth, dtype=torch.bool)
    chain[:, :, 0] = hit0[:, anchors]
    for k in range(1, depth):
        label_at = anchors + 1 + k
        inside = label_at.clamp(max=t - 1)
        valid = (label_at <= t - 1)[None, :].expand(b, a) & batch.counts(inside)
        loss_k, hk, ck, hit_k = _depth_loss(mask_logits[:, :, k - 1], labels[:, inside], valid)
        total = total + DEPTH_DECAY ** k * loss_k
        hits.append(int(hk))
        counts.append(int(ck))
        chain[:, :, k] = hit_k
    return StepResult(loss=total, hits=hits, counts=counts, chain=chain)


def sequential_loss(head: DrafterHead, batch: TargetBatch, *, depth: int) -> StepResult:
    """EAGLE-3 with training-time test: `depth` passes, each feeding the previous pass's output forward."""
    tokens, fused, labels = batch.tokens, batch.fused, batch.labels
    b, t = tokens.shape
    rows = t - 1
    r = torch.arange(rows)
    past: list = []  # per pass, per layer (k, v)
    hidden = head.fc(fused[:, :-1])
    total = torch.zeros(())
    hits: list[int] = []
    counts: list[int] = []
    for d in range(depth):
        tok_at = (r + 1 + d).clamp(max=t - 1)
        label_at = (r + 1 + d).clamp(max=t - 1)
        valid = (r + 1 + d <= t - 1)[None, :].expand(b, rows) & batch.counts(label_at)
        logits, pre, kv = head.step(tokens[:, tok_at], hidden, r + d, None, past)
        loss_d, hd, cd, _ = _depth_loss(logits, labels[:, label_at], valid)
        total = total + DEPTH_DECAY ** d * loss_d
        hits.append(int(hd))
        counts.append(int(cd))
        past.append(kv)
        hidden = pre
    return StepResult(loss=total, hits=hits, counts=counts)
