"""The random pair: built offline, in vLLM 0.32's layout, cached by content."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from models import layout, random_pair
from peagle_contract.drafter import check_drafter_dir


def test_pair_layout(untrained):
    target = json.loads((untrained.target / "config.json").read_text())
    drafter = json.loads((untrained.drafter / "config.json").read_text())
    assert target["architectures"] == ["LlamaForCausalLM"] and target["num_hidden_layers"] == 4
    assert target["hidden_size"] == 128
    assert drafter["architectures"] == [layout.DRAFTER_ARCHITECTURE]
    assert check_drafter_dir(untrained.drafter, where="test").mask_token_id == untrained.mask_token_id
    aux = drafter["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(set(aux)) == 3 and all(0 <= i < target["num_hidden_layers"] for i in aux)
    with safe_open(str(untrained.drafter / "model.safetensors"), "pt") as f:
        assert tuple(f.get_tensor("mask_hidden").shape) == (1, 3 * target["hidden_size"])
        assert tuple(f.get_tensor("fc.weight").shape) == (drafter["hidden_size"], 3 * target["hidden_size"])
        assert "embed_tokens.weight" not in f.keys()  # shared with the target by vLLM


def test_tokenizer_round_trips_and_knows_the_mask_token(untrained):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(untrained.target))
    text = "Unseen text, émojis 🙂 and code: x = [1, 2]"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    assert tok.convert_ids_to_tokens(untrained.mask_token_id) == layout.MASK_TOKEN
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|assistant|>\n")


def test_cached_by_content_and_rebuildable(untrained, tmp_path, monkeypatch):
    assert random_pair.build() == untrained  # second call: the cache
    monkeypatch.setattr(random_pair, "SEED", random_pair.SEED + 1)
    assert random_pair.cache_root() != untrained.root  # another recipe, another folder: never a stale pair
    monkeypatch.undo()
    fresh = random_pair.build(tmp_path / "fresh")
    for name in ("config.json", "model.safetensors"):
        assert (fresh.drafter / name).read_bytes() == (untrained.drafter / name).read_bytes()  # seeded


def test_write_drafter_refuses_wrong_shapes(untrained, tmp_path):
    cfg = json.loads((untrained.drafter / "config.json").read_text())
    weights = layout.random_drafter_weights(cfg, seed=0)
    weights["mask_hidden"] = weights["mask_hidden"][:, :128]  # width hidden instead of 3*hidden
    with pytest.raises(ValueError, match="mask_hidden"):
        layout.write_drafter(tmp_path / "d", config=cfg, weights=weights)
