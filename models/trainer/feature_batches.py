"""Training batches from precomputed target features (models.trainer.distill), and a reduced draft vocabulary.

A real target is too slow to run inside every training step on 2 cores, so its features are extracted once
and the heads train on windows of them. A window holds one sample (never two: rows of different samples
must not attend to each other), by default all of it from the first prompt token, as vLLM drafts; only labels
inside the answer count (the prompt's next tokens are not what the target generates, and padding is
nothing). Shorter samples are padded at the end, which causal attention keeps out of every real row.

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
    """Draws :class:`TargetBatch` windows from ``samples`` of ``features``.

    ``context=None`` (the real pair's recipe): a window is the whole sample from its first prompt token, as
    vLLM drafts with the whole prompt before it; ``window`` only caps its length. A P-EAGLE mask row gets its
    context through attention alone, so a mask row trained on a short slice of the prompt is trained for
    another input than the one it is served. ``context=N``: a slice of ``window`` rows starting at most N
    rows before the answer (the toy pair's layout). Rows are padded to the longest window of a batch.
    ``soft``: the batch carries the target's top-k distribution (the features must hold it).
    """

    def __init__(self, features: Features, samples: np.ndarray, *, window: int, context: int | None,
                 vocab: DraftVocab | None, vocab_size: int, soft: bool = False):
        if soft and features.top_ids is None:
            raise ValueError("soft targets need features extracted with top_k > 0")
        self.features, self.samples, self.window, self.context, self.soft = features, samples, window, context, soft
        self.to_draft = vocab.target_to_draft(vocab_size) if vocab is not None else None

    def _draft(self, ids: np.ndarray) -> np.ndarray:
        ids = ids.astype(np.int64)
        return self.to_draft[ids] if self.to_draft is not None else ids

    def _window(self, sample: int, start_choice: float) -> dict[str, np.ndarray]:
        f = self.features
        lo, hi = int(f.offsets[sample]), int(f.offsets[sample + 1])
        n, answer = hi - lo, int(f.answer_starts[sample])
        if self.context is None:
            start = 0
        else:
            first = max(0, answer - self.context)
            last = max(first, n - self.window)
            start = min(first + int(start_choice * (last - first + 1)), last)
        real = min(self.window, n - start)
        span = slice(lo + start, lo + start + real)
        position = start + np.arange(real)
        # A label counts inside the answer (its first token is predicted at answer - 1) and before the
        # sample's last position (the prediction past the end was never generated).
        row = {"tokens": f.tokens[span].astype(np.int64), "labels": self._draft(f.labels[span]),
               "fused": np.asarray(f.fused[span], dtype=np.float32),
               "valid": (position >= answer - 1) & (position <= n - 2)}
        if self.soft:
            row["top_ids"], row["top_probs"] = self._distribution(span)
        return row

    def _distribution(self, span: slice) -> tuple[np.ndarray, np.ndarray]:
        """The target's top-k next-token probabilities (softmax over its top-k logits), mapped to the draft
        vocabulary; tokens outside it get probability 0 and the rest are renormalised."""
        logits = self.features.top_logits[span].astype(np.float32)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        ids = self._draft(self.features.top_ids[span])
        probs = np.where(ids >= 0, probs, 0.0)
        total = probs.sum(-1, keepdims=True)
        return ids, (probs / np.where(total > 0, total, 1.0)).astype(np.float32)

    def batch(self, gen: torch.Generator, size: int) -> TargetBatch:
        picks = torch.randint(0, len(self.samples), (size,), generator=gen).tolist()
        starts = torch.rand(size, generator=gen).tolist()
        return self._stack([self._window(int(self.samples[p]), s) for p, s in zip(picks, starts)])

    def evaluation(self, limit: int) -> TargetBatch:
        """A fixed batch: the first window of each of the first ``limit`` samples (for held-out estimates)."""
        return self._stack([self._window(int(s), 0.0) for s in self.samples[:limit]])

    def each(self, limit: int) -> list[TargetBatch]:
        """The first window of each of the first ``limit`` samples, one batch each (no padding)."""
        return [self._stack([self._window(int(s), 0.0)]) for s in self.samples[:limit]]

    @staticmethod
    def _stack(rows: list[dict[str, np.ndarray]]) -> TargetBatch:
        """Pad every field to the longest row (tokens 0, labels -1, not valid) and stack."""
        length = max(len(r["tokens"]) for r in rows)
        fill = {"tokens": 0, "labels": -1, "fused": 0.0, "valid": False, "top_ids": -1, "top_probs": 0.0}

        def stacked(key):
            out = np.full((len(rows), length, *rows[0][key].shape[1:]), fill[key], dtype=rows[0][key].dtype)
            for i, r in enumerate(rows):
                out[i, :len(r[key])] = r[key]
            return torch.from_numpy(out)

        fields = {key: stacked(key) for key in rows[0]}
        return TargetBatch(**fields)
