"""The builder end to end on a miniature recipe (seconds): files, vLLM layout, cache behaviour."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

import models.toy_pair as toy
from models import cache, layout
from peagle_contract.drafter import MASK_TOKEN_WRITE_KEY, check_drafter_dir
from models.trainer.corpus import CorpusSpec


_FULL_RECIPE = toy._recipe


def _mini_recipe():
    r = _FULL_RECIPE()
    return {
        "corpus": CorpusSpec(documents=80),
        "target_spec": dataclasses.replace(r["target_spec"], hidden_size=32, intermediate_size=64),
        "target_training": dataclasses.replace(r["target_training"], steps=3, batch_size=2),
        "drafter_spec": dataclasses.replace(r["drafter_spec"], hidden_size=32, intermediate_size=64),
        "drafter_training": dataclasses.replace(r["drafter_training"], steps=2, batch_size=2, depth=3, anchors=4),
    }


@pytest.fixture(scope="module")
def mini_pair(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(toy, "_recipe", _mini_recipe)
    mp.setattr(toy, "VOCAB_SIZE", 300)
    mp.setattr(toy, "HELD_OUT_ROWS", 2)
    # The builder pins torch to one thread and deterministic kernels; give other tests their settings back.
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        yield toy.build(tmp_path_factory.mktemp("demo"), log=lambda _msg: None)
    finally:
        mp.undo()
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def test_pair_is_written_in_the_layout_vllm_loads(mini_pair):
    p_cfg = json.loads((mini_pair.drafter / "config.json").read_text())
    e_cfg = json.loads((mini_pair.eagle3_drafter / "config.json").read_text())
    t_cfg = json.loads((mini_pair.target / "config.json").read_text())
    assert p_cfg["architectures"] == [layout.DRAFTER_ARCHITECTURE]
    assert p_cfg[MASK_TOKEN_WRITE_KEY] == mini_pair.mask_token_id
    assert check_drafter_dir(mini_pair.drafter, where="test").mask_token_id == mini_pair.mask_token_id
    assert p_cfg["parallel_drafting"] is True and e_cfg["parallel_drafting"] is False
    aux = p_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(aux) == 3 and max(aux) < t_cfg["num_hidden_layers"]

    p_w = load_file(str(mini_pair.drafter / "model.safetensors"))
    e_w = load_file(str(mini_pair.eagle3_drafter / "model.safetensors"))
    expected = set(layout.drafter_weight_shapes(p_cfg)) | {"embed_tokens.weight"}
    assert set(p_w) == set(e_w) == expected
    width = 3 * t_cfg["hidden_size"]
    assert p_w["mask_hidden"].shape == (1, width) and p_w["mask_hidden"].abs().sum() > 0
    assert torch.count_nonzero(e_w["mask_hidden"]) == 0  # unused by sequential EAGLE-3
    assert all(t.dtype == torch.float32 for t in p_w.values())


def test_training_report_and_reloadable_target(mini_pair):
    from transformers import AutoTokenizer, LlamaForCausalLM

    report = mini_pair.report()
    assert set(report["p_eagle"]) >= {"estimated_acceptance_length", "agreement_per_depth", "parameters"}
    # Same architecture: the P-EAGLE head only adds mask_hidden (3 * hidden values).
    assert report["p_eagle"]["parameters"] - report["eagle3"]["parameters"] == 3 * 32
    tok = AutoTokenizer.from_pretrained(mini_pair.target)
    assert tok.convert_tokens_to_ids(layout.MASK_TOKEN) == mini_pair.mask_token_id
    model = LlamaForCausalLM.from_pretrained(mini_pair.target)
    out = model.generate(**tok("def add_x(x):\n", return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert out.shape[1] > 3


def test_cache_lookup_never_trains_and_the_key_follows_the_recipe(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "CACHE_DIR", tmp_path)
    assert toy.existing_pair() is None and not any(tmp_path.iterdir())  # looked, built nothing
    assert toy.cache_root().parent == tmp_path
    before = toy.cache_root()
    monkeypatch.setattr(toy, "HELD_OUT_ROWS", toy.HELD_OUT_ROWS + 1)
    assert toy.cache_root() != before  # a changed recipe never reads the old folder
