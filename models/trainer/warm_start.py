"""A served P-EAGLE head back in the trainer: the weights of a drafter folder (config.json + model.safetensors, as
vLLM loads them) as a :class:`~models.trainer.drafter.DrafterHead`, so that training on an endpoint's own traffic
starts from the head the stage serves now rather than from scratch.

The checkpoint keys are the head's own parameter names (models.trainer.drafter), so loading is a strict
``load_state_dict`` after three translations: ``mask_hidden`` is stored ``[1, width]``; a head whose embedding is
the target's own stores none (vLLM then shares the target's), so the target's is given; and ``d2t`` (draft id ->
target id offset) is not a parameter but the draft vocabulary, returned as the target ids it names. A key the
architecture does not have, or one it needs and the checkpoint lacks, is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.trainer.drafter import DrafterHead, DrafterShape

_NOT_PARAMETERS = ("d2t", "t2d")


@dataclass(frozen=True)
class ServedHead:
    head: DrafterHead
    config: dict
    draft_ids: np.ndarray  # [D] target token ids, ascending: draft id i is target id draft_ids[i]


def shape_of(config: dict) -> DrafterShape:
    """The head's shape as its config.json states it (the keys models.layout.drafter_config writes)."""
    return DrafterShape(vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
                        heads=int(config["num_attention_heads"]), kv_heads=int(config["num_key_value_heads"]),
                        intermediate_size=int(config["intermediate_size"]),
                        aux_layers=len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
                        rms_norm_eps=float(config["rms_norm_eps"]), rope_theta=float(config["rope_theta"]),
                        layers=int(config["num_hidden_layers"]),
                        draft_vocab_size=int(config.get("draft_vocab_size") or config["vocab_size"]),
                        target_hidden_size=int(config.get("target_hidden_size") or config["hidden_size"]))


def load_head(folder: Path, *, target_embedding: torch.Tensor | None = None) -> ServedHead:
    """The head in ``folder``. ``target_embedding``: the target's input embedding, needed when the checkpoint holds
    none. ValueError naming the folder and the key for a checkpoint this architecture cannot take."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    weights = load_file(str(folder / "model.safetensors"))
    parallel = bool(config.get("parallel_drafting"))
    head = DrafterHead(shape_of(config), parallel=parallel, learn_embedding=True)
    state = {k: v for k, v in weights.items() if k not in _NOT_PARAMETERS}
    if "mask_hidden" in state:
        if not parallel:
            del state["mask_hidden"]  # EAGLE-3 heads store a zero one that vLLM skips (train_drafters.head_weights)
        else:
            state["mask_hidden"] = state["mask_hidden"].reshape(-1)
    if "embed_tokens.weight" not in state:
        if target_embedding is None:
            raise ValueError(f"{folder}: embed_tokens.weight: not in the checkpoint (vLLM shares the target's); "
                             "allowed: give the target's input embedding")
        state["embed_tokens.weight"] = target_embedding.detach().clone()
    expected = set(head.state_dict())
    unknown, missing = sorted(set(state) - expected), sorted(expected - set(state))
    if unknown or missing:
        raise ValueError(f"{folder}: {(unknown or missing)[0]}: "
                         f"{'not a weight of' if unknown else 'missing from the checkpoint of'} a "
                         f"{config['num_hidden_layers']}-layer {'P-EAGLE' if parallel else 'EAGLE-3'} head")
    for name, tensor in head.state_dict().items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{folder}: {name}: shape {tuple(state[name].shape)}; allowed: {tuple(tensor.shape)} "
                             "(from its config.json)")
    head.load_state_dict(state, strict=True)
    draft = head.shape.draft_vocab
    d2t = weights.get("d2t")
    ids = np.arange(draft, dtype=np.int64) + (d2t.numpy().astype(np.int64) if d2t is not None else 0)
    return ServedHead(head=head, config=config, draft_ids=ids)
