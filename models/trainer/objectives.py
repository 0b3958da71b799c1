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

Labels are the target's own next-token choices, since what counts at greedy verification is agreeing with
the target, not with the corpus. A batch carries either hard labels only (its argmax: cross-entropy) or also
the target's top-k distribution (``top_ids``/``top_probs``: the loss is the cross-entropy to that
distribution, which is KL distillation up to the target's entropy, a constant): the target's second choice
tells the head which near-misses are close, which hard labels throw away. Depth d is weighted 0.8**d in
both objectives. A batch may say which label positions count (``valid``: the answer, not the prompt or
padding) and may hold labels the head cannot produce (-1: outside a reduced draft vocabulary): those rows are
left out of the loss and count as misses in the agreement. The LM head runs on scored rows only: with whole
prompts in a window most rows are context, and the LM head is the widest matrix of a one-layer head.

P-EAGLE may sample its depths (``keep``: the share of anchors that carry a row at each depth 1..K-1): the
deep positions are rarely accepted, so fewer of their rows are trained. The kept sets are nested (an anchor
with a depth-3 row has its depth-1 and depth-2 rows too), so every mask row sees exactly the rows before it
that vLLM's drafting pass gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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
    top_ids: torch.Tensor | None = None  # [B, T, k] the target's top-k next tokens (head vocabulary; -1 outside)
    top_probs: torch.Tensor | None = None  # [B, T, k] their probabilities, renormalised over those inside

    def counts(self, at: torch.Tensor) -> torch.Tensor:
        """Whether the labels at positions ``at`` count: ``at`` [M] (the same for every sequence) or [B, M]."""
        b = self.tokens.shape[0]
        if self.valid is None:
            return torch.ones(b, at.shape[-1], dtype=torch.bool)
        return self.valid[:, at] if at.dim() == 1 else self.valid.gather(1, at)

    def targets(self, at: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(hard labels, soft targets or None) at positions ``at`` ([M] or [B, M])."""
        def pick(x):
            if at.dim() == 1:
                return x[:, at]
            index = at.view(*at.shape, *([1] * (x.dim() - 2))).expand(*at.shape, *x.shape[2:])
            return x.gather(1, index)
        soft = None if self.top_ids is None else (pick(self.top_ids), pick(self.top_probs))
        return pick(self.labels), soft


@torch.no_grad()
def target_batch(target, tokens: torch.Tensor, aux_layer_ids: list[int]) -> TargetBatch:
    """Run the target once. HF's hidden_states[i] is the residual stream entering layer i, which is what
    vLLM's Llama collects for aux layer id i (ids must be below the layer count: HF's last entry is
    normalised)."""
    out = target(input_ids=tokens, output_hidden_states=True)
    fused = torch.cat([out.hidden_states[i] for i in aux_layer_ids], dim=-1)
    return TargetBatch(tokens=tokens, fused=fused, labels=out.logits.argmax(-1))


def _scored(head: DrafterHead, x: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor,
            soft: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, int, int, torch.Tensor]:
    """The loss and greedy agreement of the head's outputs ``x`` [B, R, H] at valid rows; returns (loss, hits,
    rows scored, per-row hit [B, R]). A label below zero (outside the draft vocabulary) is a miss."""
    trained = valid & (labels >= 0) if soft is None else valid & (soft[1].sum(-1) > 0)
    hit = torch.zeros_like(valid)
    if not bool(trained.any()):
        return x.sum() * 0.0, 0, int(valid.sum()), hit
    logits = head.logits(x[trained])
    logp = logits.log_softmax(-1)
    if soft is None:
        loss = F.nll_loss(logp, labels[trained])
    else:
        ids, probs = soft[0][trained], soft[1][trained]
        loss = -(probs * logp.gather(1, ids.clamp(min=0))).sum(-1).mean()
    hit[trained] = logits.detach().argmax(-1) == labels[trained]
    return loss, int(hit.sum()), int(valid.sum()), hit


@dataclass
class StepResult:
    loss: torch.Tensor
    hits: list[int]  # per depth, greedy agreements with the target
    counts: list[int]  # per depth, rows scored
    # [B, X, depth] hit matrix of X drafting starts (P-EAGLE: its anchors; EAGLE-3: every row) and [B, X]
    # whether every depth of a start was scored: what an acceptance estimate reads. P-EAGLE with sampled
    # depths has none (not every anchor drafts every depth).
    chain: torch.Tensor | None = None
    complete: torch.Tensor | None = None


def depth_rows(anchors: int, depth: int, keep: Sequence[float] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask rows of one drafting block layout, depth-major: (anchor slot, depth) per row. Depth k (1..depth-1)
    has a row for the first ``round(anchors * keep[k - 1])`` slots (at least one), all of them when ``keep`` is
    None; the caller puts the anchors in random order, so the kept slots are a random, nested subset."""
    slots, depths = [], []
    for k in range(1, depth):
        n = anchors if keep is None else max(1, min(anchors, round(anchors * keep[k - 1])))
        slots.append(torch.arange(n))
        depths.append(torch.full((n,), k))
    if not slots:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(slots), torch.cat(depths)


def parallel_loss(head: DrafterHead, batch: TargetBatch, *, depth: int, anchors: torch.Tensor,
                  mask_token: int, keep: Sequence[float] | None = None) -> StepResult:
    """P-EAGLE: real rows plus mask rows after each anchor, all in one forward.

    ``anchors``: [A] rows shared by the batch's sequences, or [B, A], one set per sequence (whole-prompt
    windows, where each answer starts elsewhere). ``keep``: depth sampling (see :func:`depth_rows`)."""
    tokens, fused = batch.tokens, batch.fused
    b, t = tokens.shape
    rows = t - 1
    anchors = anchors.expand(b, -1) if anchors.dim() == 1 else anchors
    a = anchors.shape[1]
    slot, row_depth = depth_rows(a, depth, keep)
    m = slot.numel()
    row_anchor = anchors[:, slot]  # [B, M]
    mask_pos = row_anchor + row_depth
    positions = torch.cat([torch.arange(rows).expand(b, rows), mask_pos], 1)
    mask_tok = torch.full((b, m), mask_token, dtype=torch.long)
    mask_hidden = head.shared_hidden().expand(b, m, -1)
    # Attention: causal over real rows; a mask row sees real rows <= its anchor and its block's shallower rows.
    n = rows + m
    allow = torch.zeros(b, n, n, dtype=torch.bool)
    allow[:, :rows, :rows] = torch.ones(rows, rows, dtype=torch.bool).tril()
    allow[:, rows:, :rows] = torch.arange(rows)[None, None, :] <= row_anchor[:, :, None]
    allow[:, rows:, rows:] = ((slot[:, None] == slot[None, :]) & (row_depth[None, :] <= row_depth[:, None]))[None]
    x, _ = head.step_hidden(torch.cat([tokens[:, 1:], mask_tok], 1),
                            torch.cat([head.fc(fused[:, :-1]), mask_hidden], 1), positions, allow[:, None])
    # Depth 0: row r predicts the target's choice at r+1.
    at = torch.arange(1, t)
    labels, soft = batch.targets(at)
    loss, h0, c0, hit0 = _scored(head, x[:, :rows], labels, batch.counts(at), soft)
    total, hits, counts = loss, [h0], [c0]
    chain = torch.zeros(b, a, depth, dtype=torch.bool)
    complete = torch.ones(b, a, dtype=torch.bool)
    chain[:, :, 0] = hit0.gather(1, anchors)
    complete &= batch.counts(anchors + 1)
    lo = rows
    for k in range(1, depth):
        n_k = int((row_depth == k).sum())
        label_at = anchors[:, :n_k] + 1 + k
        inside = label_at.clamp(max=t - 1)
        valid = (label_at <= t - 1) & batch.counts(inside)
        labels, soft = batch.targets(inside)
        loss_k, hk, ck, hit_k = _scored(head, x[:, lo:lo + n_k], labels, valid, soft)
        total = total + DEPTH_DECAY ** k * loss_k
        hits.append(hk)
        counts.append(ck)
        if keep is None:
            chain[:, :, k] = hit_k
            complete &= valid
        lo += n_k
    if keep is not None:
        chain = complete = None
    return StepResult(loss=total, hits=hits, counts=counts, chain=chain, complete=complete)


def sequential_loss(head: DrafterHead, batch: TargetBatch, *, depth: int, answer_rows_only: bool = False
                    ) -> StepResult:
    """EAGLE-3 with training-time test: `depth` passes, each feeding the previous pass's output forward.

    ``answer_rows_only`` (a batch that says which labels count): the passes after the first run on the rows
    whose first label counts and no others. vLLM only ever drafts from those rows, so a prompt row's later
    passes train nothing that is served; with whole prompts in a window they are most of the work.
    """
    if answer_rows_only and batch.valid is not None and depth > 1:
        return _sequential_on_answer_rows(head, batch, depth=depth)
    tokens, fused = batch.tokens, batch.fused
    b, t = tokens.shape
    rows = t - 1
    r = torch.arange(rows)
    past: list = []  # per pass, per layer (k, v)
    hidden = head.fc(fused[:, :-1])
    total = torch.zeros(())
    hits: list[int] = []
    counts: list[int] = []
    chain = torch.zeros(b, rows, depth, dtype=torch.bool)
    complete = torch.ones(b, rows, dtype=torch.bool)
    for d in range(depth):
        tok_at = (r + 1 + d).clamp(max=t - 1)
        valid = (r + 1 + d <= t - 1)[None, :].expand(b, rows) & batch.counts(tok_at)
        x, kv = head.step_hidden(tokens[:, tok_at], hidden, r + d, None, past)
        labels, soft = batch.targets(tok_at)
        loss_d, hd, cd, hit = _scored(head, x, labels, valid, soft)
        total = total + DEPTH_DECAY ** d * loss_d
        hits.append(hd)
        counts.append(cd)
        chain[:, :, d] = hit
        complete &= valid
        past.append(kv)
        hidden = x
    return StepResult(loss=total, hits=hits, counts=counts, chain=chain, complete=complete)


def _sequential_on_answer_rows(head: DrafterHead, batch: TargetBatch, *, depth: int) -> StepResult:
    """:func:`sequential_loss` with the passes after the first on answer rows only (same losses on them)."""
    tokens, fused = batch.tokens, batch.fused
    b, t = tokens.shape
    rows = t - 1
    r = torch.arange(rows)
    x, kv = head.step_hidden(tokens[:, 1:], head.fc(fused[:, :-1]), r, None, [])
    first = batch.counts(r + 1)
    labels, soft = batch.targets(r + 1)
    total, h0, c0, hit0 = _scored(head, x, labels, first, soft)
    hits, counts = [h0], [c0]
    chain = torch.zeros(b, rows, depth, dtype=torch.bool)
    chain[:, :, 0] = hit0
    complete = first.clone()
    # Each sequence's answer rows first, in order; a sequence with fewer is padded with other rows of its own,
    # which are computed and never scored (the indexes stay distinct, so scattering back is exact).
    n = int(first.sum(1).max())
    idx = torch.argsort((~first).to(torch.int8), dim=1, stable=True)[:, :max(n, 1)]
    real = first.gather(1, idx)
    past = [kv]
    hidden = x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))
    for d in range(1, depth):
        tok_at = (idx + 1 + d).clamp(max=t - 1)
        valid = (idx + 1 + d <= t - 1) & batch.counts(tok_at) & real
        x, kv = head.step_hidden(tokens.gather(1, tok_at), hidden, idx + d, None, past, ttt_rows=idx)
        labels, soft = batch.targets(tok_at)
        loss_d, hd, cd, hit = _scored(head, x, labels, valid, soft)
        total = total + DEPTH_DECAY ** d * loss_d
        hits.append(hd)
        counts.append(cd)
        chain[:, :, d] = torch.zeros(b, rows, dtype=torch.bool).scatter(1, idx, hit)
        complete &= torch.zeros(b, rows, dtype=torch.bool).scatter(1, idx, valid)
        past.append(kv)
        hidden = x
    return StepResult(loss=total, hits=hits, counts=counts, chain=chain, complete=complete)
