"""The drafter training loop: a step count, or a CPU-time budget (heads compared at equal cost), weight decay,
and early stopping on held-out acceptance that keeps the best weights. Small heads, seconds each."""

from __future__ import annotations

import time

import torch

from models.trainer.drafter import DrafterHead, DrafterShape
from models.trainer.objectives import TargetBatch
from models.trainer.train_drafters import DrafterTraining, estimate_acceptance, train_head

SHAPE = DrafterShape(vocab_size=40, hidden_size=32, heads=2, intermediate_size=48)
MASK = 3


def _head(parallel: bool) -> DrafterHead:
    torch.manual_seed(0)
    return DrafterHead(SHAPE, parallel=parallel)


def _batches(seed: int):
    # A learnable stream: each token is the previous one plus one (mod the vocabulary), so acceptance can rise.
    def draw(gen: torch.Generator, b: int = 4, t: int = 16) -> TargetBatch:
        start = torch.randint(0, SHAPE.vocab_size, (b, 1), generator=gen)
        tokens = (start + torch.arange(t)) % SHAPE.vocab_size
        fused = torch.nn.functional.one_hot(tokens, 3 * SHAPE.hidden_size)[..., :3 * SHAPE.hidden_size].float()
        labels = torch.roll(tokens, -1, dims=1)
        return TargetBatch(tokens=tokens, fused=fused, labels=labels)
    return draw


def _held_out():
    gen = torch.Generator().manual_seed(99)
    return [_batches(0)(gen, b=1) for _ in range(4)]


def test_a_step_count_runs_exactly_that_many_steps_as_before():
    run = train_head(_head(False), _batches(0), DrafterTraining(steps=7, batch_size=4, depth=3), mask_token=MASK,
                     log=lambda _: None)
    assert (run.steps, run.windows, run.stopped, run.estimates) == (7, 28, "steps", [])
    assert run.epochs(14) == 2.0


def test_a_cpu_budget_stops_the_run_and_charges_training_only():
    spec = DrafterTraining(steps=100_000, batch_size=4, depth=3, anchors=8, keep_decay=0.7, cpu_seconds=1.5)
    started = time.process_time()
    run = train_head(_head(True), _batches(0), spec, mask_token=MASK, log=lambda _: None)
    assert run.stopped == "cpu_seconds" and run.steps > 1
    assert 1.5 <= run.cpu_seconds <= time.process_time() - started + 0.05  # reported to 0.1 s


def test_early_stopping_keeps_the_best_weights_and_reports_the_estimates():
    held = _held_out()
    # A learning rate far too high: acceptance peaks early, then falls; the run must stop and keep the peak.
    spec = DrafterTraining(steps=400, batch_size=4, depth=3, lr=0.3, eval_every=5, patience=3, weight_decay=0.1)
    head = _head(False)
    run = train_head(head, _batches(0), spec, mask_token=MASK, held_out=held, log=lambda _: None)
    als = [al for _, al in run.estimates]
    assert run.stopped == "early" and len(als) >= 4 and run.eval_cpu_seconds > 0
    assert run.best_step == run.estimates[als.index(max(als))][0]
    assert estimate_acceptance(head, held, depth=3, mask_token=MASK)["estimated_acceptance_length"] == max(als)


def test_early_stopping_without_held_out_batches_is_refused():
    import pytest

    with pytest.raises(ValueError, match="held-out"):
        train_head(_head(False), _batches(0), DrafterTraining(steps=3, eval_every=1), mask_token=MASK)
