"""Training batches from precomputed target features (models.trainer.distill), and a reduced draft vocabulary.

A real target is too slow to run inside every training step on 2 cores, so its features are extracted once
and the heads train on windows of them. A window is a slice of one sample (never two: rows of different
samples must not attend to each other) that starts a little before the answer, so the first answer tokens
have context; only labels inside the answer count (the prompt's next tokens are not what the target
generates, and padding is nothing). Shorter samples are padded at the end, which causal attention keeps
out of every real row.

The draft vocabulary is the target's most frequent greedy tokens on the training answers, as the published
EAGLE-3 heads do it (32k of Llama 3's 128k); a label outside it is a token the head cannot propose.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.trainer.distill import Features
from models.trainer.objectives import TargetBatch


@dataclass(frozen=True)
class DraftVocab:
    ids: np.ndarray  # [D] target token ids, ascending: draft id i is target id ids[i]
    coverage: float  # share of training-answer labels inside the draft vocabulary

    @property
    def size(self) -> int:
        return len(self.ids)

    def target_to_draft(self, vocab_size: int) -> np.ndarray:
        """[vocab_size] int64: each target id's draft id, -1 outside the draft vocabulary."""
        mapping = np.full(vocab_size, -1, dtype=np.int64)
        mapping[self.ids] = np.arange(self.size)
        return mapping

    def d2t(self) -> torch.Tensor:
        """vLLM's checkpoint tensor: target id = draft id + d2t[draft id]."""
        return torch.from_numpy(self.ids - np.arange(self.size)).to(torch.long)


def answer_positions(features: Features, samples: np.ndarray) -> np.ndarray:
    """Flat indices of every label position inside the answers of ``samples``."""
    spans = [np.arange(features.offsets[i] + features.answer_starts[i] - 1, features.offsets[i + 1] - 1)
             for i in samples]
    return np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)


def draft_vocab(features: Features, samples: np.ndarray, *, size: int, vocab_size: int) -> DraftVocab:
    """The ``size`` most frequent target labels on the answers of ``samples`` (ties: the lower id)."""
    labels = features.labels[answer_positions(features, samples)]
    counts = np.bincount(labels, minlength=vocab_size)
    order = np.lexsort((np.arange(vocab_size), -counts))[:size]
    ids = np.sort(order)
    return DraftVocab(ids=ids, coverage=float(counts[ids].sum() / max(counts.sum(), 1)))


def split_samples(features: Features, *, held_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training samples, held-out samples), a seeded permutation of the samples that have an answer."""
    lengths = features.offsets[1:] - features.offsets[:-1]
    usable = np.flatnonzero(lengths - features.answer_starts >= 2)
    order = np.random.default_rng(seed).permutation(usable)
    return np.sort(order[held_out:]), np.sort(order[:held_out])


class FeatureWindows:
    """Draws :class:`TargetBatch` windows of ``window`` rows from ``samples`` of ``features``."""

    def __init__(self, features: Features, samples: np.ndarray, *, window: int, context: int,
                 vocab: DraftVocab | None, vocab_size: int):
        self.features, self.samples, self.window, self.context = features, samples, window, context
        self.to_draft = vocab.target_to_draft(vocab_size) if vocab is not None else None

    def _window(self, sample: int, start_choice: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        f = self.features
        lo, hi = int(f.offsets[sample]), int(f.offsets[sample + 1])
        n, answer = hi - lo, int(f.answer_starts[sample])
        first = max(0, answer - self.context)
        last = max(first, n - self.window)
        start = first + int(start_choice * (last - first + 1)) if last > first else first
        start = min(start, last)
        real = min(self.window, n - start)
        tokens = np.zeros(self.window, dtype=np.int64)
        labels = np.full(self.window, -1, dtype=np.int64)
        fused = np.zeros((self.window, f.fused.shape[1]), dtype=np.float32)
        tokens[:real] = f.tokens[lo + start:lo + start + real]
        raw = f.labels[lo + start:lo + start + real].astype(np.int64)
        labels[:real] = self.to_draft[raw] if self.to_draft is not None else raw
        fused[:real] = f.fused[lo + start:lo + start + real]
        position = start + np.arange(self.window)
        # A label counts inside the answer (its first token is predicted at answer - 1) and before the
        # sample's last position (the prediction past the end was never generated).
        valid = (position >= answer - 1) & (position <= n - 2) & (np.arange(self.window) < real)
        return tokens, labels, fused, valid

    def batch(self, gen: torch.Generator, size: int) -> TargetBatch:
        picks = torch.randint(0, len(self.samples), (size,), generator=gen).tolist()
        starts = torch.rand(size, generator=gen).tolist()
        return self._stack([self._window(int(self.samples[p]), s) for p, s in zip(picks, starts)])

    def evaluation(self, limit: int) -> TargetBatch:
        """A fixed batch: the first window of each of the first ``limit`` samples (for held-out estimates)."""
        return self._stack([self._window(int(s), 0.0) for s in self.samples[:limit]])

    @staticmethod
    def _stack(rows) -> TargetBatch:
        tokens, labels, fused, valid = (np.stack(column) for column in zip(*rows))
        return TargetBatch(tokens=torch.from_numpy(tokens), fused=torch.from_numpy(fused),
                           labels=torch.from_numpy(labels), valid=torch.from_numpy(valid))
