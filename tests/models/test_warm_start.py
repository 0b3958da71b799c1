"""A served head back in the trainer: what the trainer writes for vLLM loads back weight for weight, with its draft
vocabulary; the committed random pair's head (which shares the target's embedding) loads with the target's; a
checkpoint this architecture cannot take is refused by key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from models import layout
from models.trainer.drafter import DrafterHead
from models.trainer.train_drafters import head_weights
from models.trainer.warm_start import load_head, shape_of


@pytest.fixture
def written(untrained, tmp_path):
    target_cfg = json.loads((untrained.target / "config.json").read_text())
    spec = layout.DrafterSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256, num_layers=2,
                              draft_vocab_size=100, trained_k=5)
    config = layout.drafter_config(target=target_cfg, spec=spec, mask_token=3)
    torch.manual_seed(7)
    head = DrafterHead(shape_of(config), parallel=True)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    ids = np.sort(np.random.default_rng(0).choice(int(target_cfg["vocab_size"]), 100, replace=False))
    d2t = torch.from_numpy(ids - np.arange(100))
    folder = layout.write_drafter(tmp_path / "served", config=config, weights=head_weights(head, d2t=d2t))
    return head, ids, folder


def test_what_the_trainer_writes_loads_back_weight_for_weight(written):
    head, ids, folder = written
    served = load_head(folder)
    assert served.head.shape.layers == 2 and served.head.mask_hidden is not None
    loaded = served.head.state_dict()
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
    assert np.array_equal(served.draft_ids, ids)


def test_a_head_sharing_the_targets_embedding_loads_with_it(untrained):
    from transformers import AutoModelForCausalLM

    embedding = AutoModelForCausalLM.from_pretrained(untrained.target).get_input_embeddings().weight
    with pytest.raises(ValueError, match="embed_tokens.weight: not in the checkpoint"):
        load_head(untrained.drafter)
    served = load_head(untrained.drafter, target_embedding=embedding)
    assert torch.equal(served.head.embed_tokens.weight, embedding)
    assert np.array_equal(served.draft_ids, np.arange(served.head.shape.draft_vocab))


@pytest.mark.parametrize("change, message", [
    (lambda w: w.pop("layers.1.mlp.up_proj.weight"), "layers.1.mlp.up_proj.weight: missing from the checkpoint"),
    (lambda w: w.update({"layers.2.norm.weight": torch.ones(128)}), "layers.2.norm.weight: not a weight of"),
    (lambda w: w.update({"fc.weight": torch.ones(128, 10)}), r"fc.weight: shape \(128, 10\); allowed"),
], ids=["missing", "unknown", "wrong-shape"])
def test_a_checkpoint_the_architecture_cannot_take_is_refused_by_key(written, change, message):
    _, _, folder = written
    weights = load_file(str(folder / "model.safetensors"))
    change(weights)
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=message):
        load_head(folder)
