"""The demo-pair trainer: corpus, packed training attention, objectives. Cheap: no full training here."""

from __future__ import annotations

import pytest
import torch

from models import layout
from models.trainer.corpus import CorpusSpec, held_out_prompts, make_corpus
from models.trainer.drafter import DrafterHead, DrafterShape
from models.trainer.objectives import TargetBatch, parallel_loss, sequential_loss
from models.trainer.target import pack_tokens

SHAPE = DrafterShape(vocab_size=40, hidden_size=32, heads=2, intermediate_size=48)
# A deeper head as the real pair trains them: 3 layers, grouped-query attention, a reduced draft vocabulary,
# a frozen embedding with a learned mask row.
DEEP = DrafterShape(vocab_size=40, hidden_size=32, heads=4, kv_heads=2, intermediate_size=48, layers=3,
                    draft_vocab_size=24)
SHAPES = pytest.mark.parametrize("shape", [SHAPE, DEEP], ids=["one-layer", "three-layer-gqa"])
MASK = 3


def _head(parallel: bool, seed: int = 0, shape: DrafterShape = SHAPE) -> DrafterHead:
    torch.manual_seed(seed)
    frozen = shape is DEEP
    head = DrafterHead(shape, parallel=parallel, learn_embedding=not frozen, mask_token=MASK if frozen else None)
    for p in head.parameters():  # norms away from one, so a wrong wiring shows up in the numbers
        torch.nn.init.normal_(p, std=0.3)
    return head.eval()


def _batch(b: int = 2, t: int = 12, seed: int = 1, shape: DrafterShape = SHAPE) -> TargetBatch:
    g = torch.Generator().manual_seed(seed)
    return TargetBatch(tokens=torch.randint(0, shape.vocab_size, (b, t), generator=g),
                       fused=torch.randn(b, t, 3 * shape.hidden_size, generator=g),
                       labels=torch.randint(0, shape.draft_vocab, (b, t), generator=g))


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


def _logits_of_every_pass(head: DrafterHead, objective):
    """Run ``objective()``; return its result and the logits of every row of each pass the head made in it."""
    seen: list[torch.Tensor] = []
    step = head.step_hidden

    def wrapped(tokens, hidden, positions, mask, past=None, ttt_rows=None):
        out = step(tokens, hidden, positions, mask, past, ttt_rows)
        seen.append(head.logits(out[0]))
        return out

    head.step_hidden = wrapped
    try:
        result = objective()
    finally:
        del head.step_hidden
    return result, seen


@SHAPES
@torch.no_grad()
def test_parallel_packing_equals_one_drafting_pass_per_anchor(shape):
    """Each anchor's block of mask rows, packed beside all others, must give the logits that vLLM's single
    drafting pass gives: real rows up to the anchor, then depth-1 mask rows, plain causal attention."""
    head, batch, depth = _head(parallel=True, shape=shape), _batch(shape=shape), 4
    anchors = torch.tensor([2, 5, 7])
    result, (packed,) = _logits_of_every_pass(
        head, lambda: parallel_loss(head, batch, depth=depth, anchors=anchors, mask_token=MASK))
    rows = batch.tokens.shape[1] - 1
    for i, a in enumerate(anchors.tolist()):
        n = a + 1 + depth - 1
        tokens = torch.cat([batch.tokens[:, 1:a + 2], torch.full((2, depth - 1), MASK)], 1)
        hidden = torch.cat([head.fc(batch.fused[:, :a + 1]), head.shared_hidden().expand(2, depth - 1, -1)], 1)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        alone, _, _ = head.step(tokens, hidden, torch.arange(n), causal)
        torch.testing.assert_close(packed[:, : a + 1], alone[:, : a + 1])
        # Mask rows are depth-major: anchor i's depth-k row is the i-th of depth k's rows.
        at = [rows + (k - 1) * len(anchors) + i for k in range(1, depth)]
        torch.testing.assert_close(packed[:, at], alone[:, a + 1:])
    assert len(result.hits) == depth and result.chain.shape == (2, 3, depth)


@SHAPES
@torch.no_grad()
def test_per_sequence_anchors_and_sampled_depths_pack_like_one_drafting_pass(shape):
    """Whole-prompt windows give each sequence its own anchors, and depth sampling keeps a nested subset of
    deep rows: every kept mask row must still equal its row in vLLM's drafting pass for that sequence."""
    from models.trainer.objectives import depth_rows

    head, batch, depth = _head(parallel=True, shape=shape), _batch(shape=shape), 4
    anchors = torch.tensor([[7, 2, 5, 9], [1, 8, 3, 6]])  # random order: the first slots draft deepest
    keep = [1.0, 0.5, 0.25]
    slot, row_depth = depth_rows(anchors.shape[1], depth, keep)
    assert row_depth.tolist() == [1, 1, 1, 1, 2, 2, 3] and slot.tolist() == [0, 1, 2, 3, 0, 1, 0]
    result, (packed,) = _logits_of_every_pass(
        head, lambda: parallel_loss(head, batch, depth=depth, anchors=anchors, mask_token=MASK, keep=keep))
    rows = batch.tokens.shape[1] - 1
    for b in range(2):
        for i, a in enumerate(anchors[b].tolist()):
            n = a + 1 + depth - 1
            tokens = torch.cat([batch.tokens[b:b + 1, 1:a + 2], torch.full((1, depth - 1), MASK)], 1)
            hidden = torch.cat([head.fc(batch.fused[b:b + 1, :a + 1]),
                                head.shared_hidden().expand(1, depth - 1, -1)], 1)
            alone, _, _ = head.step(tokens, hidden, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
            for row in ((slot == i) & (row_depth > 0)).nonzero().flatten().tolist():
                torch.testing.assert_close(packed[b, rows + row], alone[0, a + int(row_depth[row])])
    assert result.chain is None and [c > 0 for c in result.counts] == [True] * depth


def test_soft_targets_that_are_one_hot_give_the_hard_loss():
    """KL distillation to a one-hot top-k distribution is cross-entropy on its label: the soft path can be
    checked against the hard one; a spread distribution gives another loss."""
    head, batch = _head(parallel=False), _batch()
    k = 4
    ids = torch.stack([batch.labels, *(torch.randint(0, SHAPE.vocab_size, batch.labels.shape) for _ in range(k - 1))], -1)
    one_hot = torch.zeros(*batch.labels.shape, k)
    one_hot[..., 0] = 1.0
    hard = sequential_loss(head, batch, depth=2).loss
    soft = sequential_loss(head, TargetBatch(**{**batch.__dict__, "top_ids": ids, "top_probs": one_hot}), depth=2).loss
    torch.testing.assert_close(soft, hard)
    spread = torch.full((*batch.labels.shape, k), 1.0 / k)
    other = sequential_loss(head, TargetBatch(**{**batch.__dict__, "top_ids": ids, "top_probs": spread}), depth=2).loss
    assert abs(other.item() - hard.item()) > 1e-3


@SHAPES
@torch.no_grad()
def test_training_time_test_equals_incremental_sequential_drafting(shape):
    """Pass d of the EAGLE-3 objective must equal drafting step by step with a KV cache, as vLLM does."""
    head, batch, depth = _head(parallel=False, shape=shape), _batch(b=1, shape=shape), 3
    _, seen = _logits_of_every_pass(head, lambda: sequential_loss(head, batch, depth=depth))
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


def test_a_frozen_embedding_learns_only_the_mask_row():
    head = _head(parallel=True, shape=DEEP).train()
    before = head.embed_tokens.weight.detach().clone()
    parallel_loss(head, _batch(shape=DEEP), depth=3, anchors=torch.tensor([1, 4]), mask_token=MASK).loss.backward()
    assert head.embed_tokens.weight.grad is None and head.mask_embedding.grad.abs().sum() > 0
    written = head.embedding_for_checkpoint()
    changed = (written != before).any(-1).nonzero().flatten().tolist()
    assert changed == [MASK]


def test_the_checkpoint_a_deep_head_writes_is_the_layout_vllm_loads(tmp_path):
    """Names and shapes from the trainer's state dict equal what models.layout declares for the config (the
    names vLLM's llama_eagle3 loader maps: midlayer. -> layers.0., layers.N. for deeper layers)."""
    from models.trainer.train_drafters import head_weights

    head = _head(parallel=True, shape=DEEP)
    target = {"num_hidden_layers": 6, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "vocab_size": 40,
              "hidden_size": 32}
    spec = layout.DrafterSpec(hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=48, num_layers=3,
                              draft_vocab_size=24, trained_k=3)
    config = layout.drafter_config(target=target, spec=spec, mask_token=MASK)
    weights = head_weights(head, d2t=torch.arange(24) % 3)
    assert {"layers.1.self_attn.q_proj.weight", "layers.2.mlp.down_proj.weight", "d2t",
            "embed_tokens.weight"} <= set(weights)
    out = layout.write_drafter(tmp_path, config=config, weights=weights)
    assert config["num_hidden_layers"] == 3 and config["trained_num_speculative_tokens"] == 3
    from peagle_contract.drafter import check_drafter_dir

    info = check_drafter_dir(out, where="drafter")
    assert info.mask_token_id == MASK and info.trained == ("trained_num_speculative_tokens", 3)


@SHAPES
def test_training_time_test_on_answer_rows_only_gives_those_rows_the_same_passes(shape):
    """EAGLE-3's later passes on answer rows alone: every answer row's logits at every pass, its loss terms
    and the acceptance chains equal the passes over every row; prompt rows are simply not drafted from."""
    head, depth = _head(parallel=False, shape=shape), 3
    batch = _batch(b=2, t=14, shape=shape)
    valid = torch.zeros(2, 14, dtype=torch.bool)
    valid[0, 5:13] = True  # sequence 0: the answer's labels from position 5; the last position never counts
    valid[1, 9:12] = True  # sequence 1: a shorter answer, so its row list is padded
    batch.valid = valid
    full_result, full = _logits_of_every_pass(head, lambda: sequential_loss(head, batch, depth=depth))
    part_result, part = _logits_of_every_pass(
        head, lambda: sequential_loss(head, batch, depth=depth, answer_rows_only=True))
    starts = valid[:, 1:]  # row r drafts from the answer when its first label (at r + 1) counts
    torch.testing.assert_close(part[0], full[0])
    for d in range(1, depth):
        for b in range(2):
            answer_rows = starts[b].nonzero().flatten()
            torch.testing.assert_close(part[d][b, :len(answer_rows)], full[d][b, answer_rows])
    assert part[1].shape[1] == int(starts.sum(1).max()) < full[1].shape[1]
    assert torch.equal(part_result.complete, full_result.complete & starts)
    assert torch.equal(part_result.chain[part_result.complete], full_result.chain[part_result.complete])
