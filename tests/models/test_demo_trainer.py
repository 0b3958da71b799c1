"""The demo-pair trainer: corpus, packed training attention, objectives. Cheap: no full training here."""

from __future__ import annotations

import torch

from models.trainer.corpus import CorpusSpec, held_out_prompts, make_corpus
from models.trainer.drafter import DrafterHead, DrafterShape
from models.trainer.objectives import TargetBatch, parallel_loss, sequential_loss
from models.trainer.target import pack_tokens

SHAPE = DrafterShape(vocab_size=40, hidden_size=32, heads=2, intermediate_size=48)
MASK = 3


def _head(parallel: bool, seed: int = 0) -> DrafterHead:
    torch.manual_seed(seed)
    head = DrafterHead(SHAPE, parallel=parallel)
    for p in head.parameters():  # norms away from one, so a wrong wiring shows up in the numbers
        torch.nn.init.normal_(p, std=0.3)
    return head.eval()


def _batch(b: int = 2, t: int = 12, seed: int = 1) -> TargetBatch:
    g = torch.Generator().manual_seed(seed)
    return TargetBatch(tokens=torch.randint(0, SHAPE.vocab_size, (b, t), generator=g),
                       fused=torch.randn(b, t, 3 * SHAPE.hidden_size, generator=g),
                       labels=torch.randint(0, SHAPE.vocab_size, (b, t), generator=g))


def test_corpus_is_deterministic_and_prompts_are_held_out():
    spec = CorpusSpec(documents=300)
    docs = make_corpus(spec)
    assert docs == make_corpus(spec)
    assert docs != make_corpus(CorpusSpec(documents=300, seed=spec.seed + 1))
    full = "\n".join(make_corpus())
    prompts = held_out_prompts(12)
    assert len(set(prompts)) == len(prompts) == 12
    for prompt in prompts:
        assert prompt not in full, f"held-out prompt occurs in the training corpus: {prompt!r}"


def test_pack_tokens_joins_with_eos_and_drops_the_tail():
    rows = pack_tokens([[5, 6, 7], [8, 9]], eos_id=0, seq_len=3)
    assert rows.tolist() == [[5, 6, 7], [0, 8, 9]]


@torch.no_grad()
def test_parallel_packing_equals_one_drafting_pass_per_anchor():
    """Each anchor's block of mask rows, packed beside all others, must give the logits that vLLM's single
    drafting pass gives: real rows up to the anchor, then depth-1 mask rows, plain causal attention."""
    head, batch, depth = _head(parallel=True), _batch(), 4
    anchors = torch.tensor([2, 5, 7])
    logits_packed = {}

    def capture(step):
        def wrapped(tokens, hidden, positions, mask, past=None):
            out = step(tokens, hidden, positions, mask, past)
            logits_packed["all"] = out[0]
            return out
        return wrapped

    head.step = capture(head.step)
    result = parallel_loss(head, batch, depth=depth, anchors=anchors, mask_token=MASK)
    del head.step
    packed = logits_packed["all"]
    rows = batch.tokens.shape[1] - 1
    for i, a in enumerate(anchors.tolist()):
        n = a + 1 + depth - 1
        tokens = torch.cat([batch.tokens[:, 1:a + 2], torch.full((2, depth - 1), MASK)], 1)
        hidden = torch.cat([head.fc(batch.fused[:, :a + 1]), head.shared_hidden().expand(2, depth - 1, -1)], 1)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        alone, _, _ = head.step(tokens, hidden, torch.arange(n), causal)
        torch.testing.assert_close(packed[:, : a + 1], alone[:, : a + 1])
        lo = rows + i * (depth - 1)
        torch.testing.assert_close(packed[:, lo:lo + depth - 1], alone[:, a + 1:])
    assert len(result.hits) == depth and result.chain.shape == (2, 3, depth)


@torch.no_grad()
def test_training_time_test_equals_incremental_sequential_drafting():
    """Pass d of the EAGLE-3 objective must equal drafting step by step with a KV cache, as vLLM does."""
    head, batch, depth = _head(parallel=False), _batch(b=1), 3
    seen = []

    def capture(step):
        def wrapped(tokens, hidden, positions, mask, past=None):
            out = step(tokens, hidden, positions, mask, past)
            seen.append(out[0])
            return out
        return wrapped

    head.step = capture(head.step)
    sequential_loss(head, batch, depth=depth)
    del head.step
    t = batch.tokens.shape[1]
    anchor = 4
    # First pass over real rows 0..anchor, then one row per step attending to everything before it.
    logits, pre, kv = head.step(batch.tokens[:, 1:anchor + 2], head.fc(batch.fused[:, :anchor + 1]),
                                torch.arange(anchor + 1), torch.ones(anchor + 1, anchor + 1, dtype=torch.bool).tril())
    torch.testing.assert_close(seen[0][:, anchor], logits[:, anchor])
    past, hidden = [kv], pre[:, anchor:anchor + 1]
    for d in range(1, depth):
        token = batch.tokens[:, anchor + 1 + d:anchor + 2 + d]
        keys = anchor + 1 + d
        logits, pre, kv = head.step(token, hidden, torch.tensor([anchor + d]), torch.ones(1, keys, dtype=torch.bool), past)
        torch.testing.assert_close(seen[d][:, anchor], logits[:, 0])
        past.append(kv)
        hidden = pre
    assert t > anchor + depth


def test_both_objectives_learn_a_fixed_batch():
    batch = _batch(b=4, t=16)
    for parallel in (True, False):
        head = _head(parallel=parallel).train()
        opt = torch.optim.Adam(head.parameters(), lr=1e-2)

        def loss():
            if parallel:
                return parallel_loss(head, batch, depth=3, anchors=torch.tensor([1, 4, 9]), mask_token=MASK).loss
            return sequential_loss(head, batch, depth=3).loss

        first = loss().item()
        for _ in range(30):
            opt.zero_grad()
            value = loss()
            value.backward()
            opt.step()
        assert value.item() < 0.7 * first, (parallel, first, value.item())
        if parallel:
            assert head.mask_hidden.grad is not None and head.mask_hidden.grad.abs().sum() > 0
