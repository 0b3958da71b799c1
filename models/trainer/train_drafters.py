"""Training loops for the two drafter heads against a frozen target, and a held-out acceptance estimate."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
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
    # P-EAGLE depth sampling: depth k keeps a row for max(keep_decay**k, KEEP_FLOOR) of the anchors (the
    # published recipe's 0.7); None: every anchor drafts every depth.
    keep_decay: float | None = None
    # The whole token embedding trains (the published recipes do); False: only P-EAGLE's mask row.
    learn_embedding: bool = True
    weight_decay: float = 0.0  # AdamW's decoupled decay
    # EAGLE-3: the training-time passes after the first on answer rows only (objectives.sequential_loss).
    answer_rows_only: bool = False
    # Train for this much process CPU time (every thread's) instead of a step count, ``steps`` then only a cap:
    # heads compared at equal training cost. The learning-rate schedule follows the share of the budget spent.
    cpu_seconds: float | None = None
    # Early stopping on held-out acceptance: every ``eval_every`` steps the held-out estimate at ``depth``; the
    # best weights are kept and training stops after ``patience`` estimates without a gain. The estimates' CPU
    # time is reported apart and not charged to ``cpu_seconds``. None: no estimates while training.
    eval_every: int | None = None
    patience: int = 3


KEEP_FLOOR = 0.2


def depth_keep(spec: DrafterTraining) -> list[float] | None:
    """The share of anchors with a row at each depth 1..depth-1, or None for all."""
    if spec.keep_decay is None:
        return None
    return [max(spec.keep_decay ** k, KEEP_FLOOR) for k in range(1, spec.depth)]


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


def anchors_for(spec: DrafterTraining, batch: TargetBatch, gen: torch.Generator) -> torch.Tensor:
    """P-EAGLE's anchor rows: without ``valid``, ``spec.anchors`` rows shared by the batch; with it, per
    sequence, rows whose next label counts (an anchor in the prompt would train mask rows on labels that never
    count). A sequence with fewer such rows repeats some. Random order when depths are sampled (the first
    slots keep the deep rows), sorted otherwise."""
    t = batch.tokens.shape[1]
    if batch.valid is None:
        picked = torch.randperm(t - 2, generator=gen)[: spec.anchors or t]
        return picked if spec.keep_decay is not None else picked.sort().values
    candidates = [row.nonzero().flatten() for row in batch.valid[:, 1:]]
    count = spec.anchors or min(len(c) for c in candidates)
    rows = []
    for c in candidates:
        order = c[torch.randperm(len(c), generator=gen)]
        if len(order) < count:
            order = torch.cat([order, c[torch.randint(0, len(c), (count - len(order),), generator=gen)]])
        order = order[:count]
        rows.append(order if spec.keep_decay is not None else order.sort().values)
    return torch.stack(rows)


@dataclass
class TrainingRun:
    """What a training run reached: steps, windows drawn, CPU seconds, and the held-out estimates taken."""

    steps: int = 0
    windows: int = 0
    cpu_seconds: float = 0.0
    eval_cpu_seconds: float = 0.0
    stopped: str = "steps"  # "steps", "cpu_seconds" or "early" (no held-out gain for `patience` estimates)
    best_step: int | None = None
    estimates: list = field(default_factory=list)  # (step, estimated acceptance length) per held-out estimate

    def epochs(self, training_windows: int) -> float:
        return round(self.windows / max(training_windows, 1), 3)


def train_head(head: DrafterHead, batches: Callable[[torch.Generator], TargetBatch], spec: DrafterTraining, *,
               mask_token: int, held_out: list[TargetBatch] | None = None, log=print) -> TrainingRun:
    """``batches(gen)`` draws one training batch; the same generator then draws P-EAGLE's anchors.

    ``held_out``: the batches early stopping estimates acceptance on (needed with ``spec.eval_every``).
    The head ends with the best weights seen when estimates were taken, else the last ones.
    """
    parallel = head.mask_hidden is not None
    name = "p-eagle" if parallel else "eagle-3"
    if spec.eval_every is not None and not held_out:
        raise ValueError("early stopping (eval_every) needs held-out batches")
    trainable = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay)
    gen = torch.Generator().manual_seed(spec.seed + (1 if parallel else 2))
    run = TrainingRun()
    start, cpu_start = time.time(), time.process_time()
    best_al, best_state, since_best = -1.0, None, 0
    head.train()
    for step in range(spec.steps):
        spent = time.process_time() - cpu_start - run.eval_cpu_seconds
        if spec.cpu_seconds is not None:
            if spent >= spec.cpu_seconds:
                run.stopped = "cpu_seconds"
                break
            # The cosine schedule over the budget: the step count it would reach at the current pace.
            pace = spent / step if step else None
            total = max(step + 1, round(spec.cpu_seconds / pace)) if pace else spec.steps
            lr = cosine_lr(step, min(total, spec.steps), spec.lr)
        else:
            lr = cosine_lr(step, spec.steps, spec.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = batches(gen)
        run.windows += batch.tokens.shape[0]
        if parallel:
            result = parallel_loss(head, batch, depth=spec.depth, anchors=anchors_for(spec, batch, gen),
                                   mask_token=mask_token, keep=depth_keep(spec))
        else:
            result = sequential_loss(head, batch, depth=spec.depth, answer_rows_only=spec.answer_rows_only)
        opt.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        run.steps = step + 1
        if step % 50 == 0 or step == spec.steps - 1:
            acc = " ".join(f"{h / max(c, 1):.2f}" for h, c in zip(result.hits, result.counts))
            log(f"{name} step {step:4d} loss {result.loss.item():.3f} agree/depth [{acc}] ({time.time() - start:.0f}s)")
        if spec.eval_every is not None and run.steps % spec.eval_every == 0:
            eval_start = time.process_time()
            head.eval()
            al = estimate_acceptance(head, held_out, depth=spec.depth, mask_token=mask_token)[
                "estimated_acceptance_length"]
            head.train()
            run.eval_cpu_seconds += time.process_time() - eval_start
            run.estimates.append((run.steps, al))
            if al > best_al:
                best_al, since_best, run.best_step = al, 0, run.steps
                best_state = {k: v.detach().clone() for k, v in head.state_dict().items()}
            else:
                since_best += 1
            log(f"{name} step {run.steps}: held-out estimate AL {al} (best {best_al} at step {run.best_step})")
            if since_best >= spec.patience:
                run.stopped = "early"
                break
    run.cpu_seconds = round(time.process_time() - cpu_start - run.eval_cpu_seconds, 1)
    run.eval_cpu_seconds = round(run.eval_cpu_seconds, 1)
    if best_state is not None:
        head.load_state_dict(best_state)
    head.eval()
    return run


def target_rows(target, rows: torch.Tensor, spec: DrafterTraining, aux_layer_ids: list[int]
                ) -> Callable[[torch.Generator], TargetBatch]:
    """Batches for a target trained here: random packed rows, the target's features computed on the fly."""
    return lambda gen: target_batch(target, rows[torch.randint(0, rows.shape[0], (spec.batch_size,), generator=gen)],
                                    aux_layer_ids)


@torch.no_grad()
def estimate_acceptance(head: DrafterHead, batches: TargetBatch | list[TargetBatch], *, depth: int,
                        mask_token: int) -> dict:
    """Teacher-forced agreement with the target on held-out rows, per depth, and the acceptance length it
    implies for K = depth: 1 + the mean run of leading agreements over every drafting start whose labels
    all count, each start drafting as vLLM does (P-EAGLE: one block of mask rows after it; EAGLE-3: its
    own passes). Only an estimate: vLLM's counters on held-out prompts are the measurement."""
    parallel = head.mask_hidden is not None
    runs, hits, counts = [], [0] * depth, [0] * depth
    for batch in [batches] if isinstance(batches, TargetBatch) else batches:
        t = batch.tokens.shape[1]
        if parallel:
            if batch.valid is None:
                anchors = torch.arange(0, t - 1 - depth)
            else:  # one sequence per batch here: its rows whose next label counts
                assert batch.tokens.shape[0] == 1, "estimate P-EAGLE on one sequence per batch"
                anchors = batch.valid[0, 1:].nonzero().flatten()
            result = parallel_loss(head, batch, depth=depth, anchors=anchors, mask_token=mask_token)
        else:  # the same chains as every row's passes (only drafting starts in the answer are complete)
            result = sequential_loss(head, batch, depth=depth, answer_rows_only=True)
        assert result.chain is not None and result.complete is not None
        runs.append(result.chain.int().cumprod(-1)[result.complete])
        hits = [a + b for a, b in zip(hits, result.hits)]
        counts = [a + b for a, b in zip(counts, result.counts)]
    chains = torch.cat(runs).float()
    return {"estimated_acceptance_length": round(1.0 + chains.sum(-1).mean().item(), 3),
            "estimated_acceptance_per_position": [round(x, 3) for x in chains.mean(0).tolist()],
            "agreement_per_depth": [round(h / max(c, 1), 3) for h, c in zip(hits, counts)]}


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
