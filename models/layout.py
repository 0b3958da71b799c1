"""Write a tokenizer, a Llama target and an EAGLE-3 / P-EAGLE drafter head in the layout vLLM 0.32 loads.

This module only knows the on-disk format; it does not decide the weights. Two callers use it:
``models.tiny`` (random, seeded weights in seconds, for tests) and the trained demo pair (real
weights). API, in the order a caller needs it:

- :func:`write_tokenizer(out_dir, corpus=..., vocab_size=...)` trains a byte-level BPE tokenizer on a few
  strings and saves it (``tokenizer.json`` + ``tokenizer_config.json`` with a chat template). It always
  holds :data:`SPECIAL_TOKENS`, including :data:`MASK_TOKEN` - the token P-EAGLE feeds at draft positions
  2..K. Returns the ``PreTrainedTokenizerFast``.
- :class:`TargetSpec` / :func:`target_config(spec, tokenizer)` / :func:`write_target(out_dir, ...)`:
  a ``LlamaForCausalLM`` checkpoint (config.json + model.safetensors + the tokenizer files), fp32.
  ``write_target`` takes either a ready ``LlamaForCausalLM`` (trained) or a seed (random init).
- :class:`DrafterSpec` / :func:`drafter_config(...)` / :func:`drafter_weight_shapes(...)` /
  :func:`random_drafter_weights(...)` / :func:`write_drafter(out_dir, config=..., weights=...)`:
  an EAGLE-3 head (one decoder layer, or more: layer N >= 1 under ``layers.N.``, reading width H), in the
  checkpoint naming vLLM's ``llama_eagle3`` loader reads:

  ========================================  =====================================================
  ``fc.weight``                             [hidden, n_aux * target_hidden] - fuses target features
  ``midlayer.input_layernorm.weight``       [hidden] - norm of the token embedding
  ``midlayer.hidden_norm.weight``           [hidden] - norm of the fused hidden state
  ``midlayer.self_attn.{q,k,v}_proj.weight`` [heads*head_dim, 2*hidden] - input is [embeds | hidden]
  ``midlayer.self_attn.o_proj.weight``      [hidden, heads*head_dim]
  ``midlayer.post_attention_layernorm.weight`` [hidden]
  ``midlayer.mlp.{gate,up}_proj.weight``    [intermediate, hidden]; ``down_proj`` [hidden, intermediate]
  ``norm.weight``                           [hidden]
  ``lm_head.weight``                        [draft_vocab, hidden]
  ``mask_hidden``                           [1, n_aux * target_hidden] - P-EAGLE's h_shared, taken
                                            *before* ``fc`` (vLLM projects it through fc at load)
  ``d2t``                                   [draft_vocab] int64 offsets, only when draft_vocab < vocab
  ========================================  =====================================================

  ``embed_tokens.weight`` [vocab, hidden] is optional: without it vLLM shares the target's embedding.
  ``trained_num_speculative_tokens`` states the K the head was trained for (the runtime refuses more).
  The config names the mask token by ``ptd_token_id`` (the keys vLLM reads and the tensor name are
  declared once, in :mod:`peagle_contract.drafter`), and the target layers whose outputs feed ``fc`` by
  ``eagle_config.eagle_aux_hidden_state_layer_ids``.

Serve the pair with :func:`peagle_contract.serving.speculative_config` (eagle3 with parallel drafting).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import torch
from peagle_contract.drafter import MASK_HIDDEN, MASK_TOKEN_WRITE_KEY, TRAINED_K_KEYS

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, MASK_TOKEN)

# Our own minimal chat format: a role line per message, then the assistant's turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

DRAFTER_ARCHITECTURE = "LlamaForCausalLMEagle3"


# --------------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------------


def write_tokenizer(out_dir: str | Path, *, corpus: Iterable[str], vocab_size: int = 512,
                    model_max_length: int = 2048):
    """Train a byte-level BPE tokenizer on ``corpus`` and save it to ``out_dir``; return it.

    Byte-level means every string encodes (no unknown token), whatever the corpus held.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(corpus), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[MASK_TOKEN],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    return tok


def mask_token_id(tokenizer) -> int:
    token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"tokenizer has no {MASK_TOKEN!r} token; build it with write_tokenizer")
    return int(token_id)


# --------------------------------------------------------------------------------------------------
# target
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TargetSpec:
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    # Std of the random init. A larger one than transformers' 0.02 gives a random model peaked logits:
    # varied greedy text and wide top-1/top-2 margins (exact-match tests then do not hinge on ties).
    initializer_range: float = 0.02


def target_config(spec: TargetSpec, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        rope_theta=spec.rope_theta,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )


def write_target(out_dir: str | Path, *, tokenizer, spec: TargetSpec | None = None, model=None,
                 seed: int = 0) -> Path:
    """Save a Llama target (``model``, or a seeded random one built from ``spec``) with its tokenizer."""
    from transformers import LlamaForCausalLM

    if model is None:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(target_config(spec or TargetSpec(), tokenizer))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """Three distinct target layers (early, middle, last) whose inputs feed the drafter's ``fc``.

    They must be distinct: vLLM collects each listed layer once, so a repeated id would give ``fc``
    fewer features than it expects (vLLM's (2, n//2, n-3) default repeats ids for small n).
    """
    n = num_target_layers
    if n < 3:
        raise ValueError(f"a P-EAGLE target needs at least 3 layers for 3 aux features, got {n}")
    ids = sorted({1, n // 2, n - 1})
    return ids if len(ids) == 3 else [0, 1, 2]


# --------------------------------------------------------------------------------------------------
# drafter
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DrafterSpec:
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    num_layers: int = 1  # decoder layers: layer 0 is ``midlayer.``, the others ``layers.N.``
    aux_layer_ids: tuple[int, ...] | None = None  # None: default_aux_layer_ids(target layers)
    draft_vocab_size: int | None = None  # None: the target's vocabulary
    trained_k: int | None = None  # the K the head was trained for, stated in config.json when known
    extra: Mapping[str, object] = field(default_factory=dict)  # more config.json keys


def drafter_config(*, target: Mapping[str, object] | object, spec: DrafterSpec, mask_token: int) -> dict:
    """config.json of a P-EAGLE head for ``target`` (its LlamaConfig or config dict)."""
    t = target if isinstance(target, Mapping) else target.to_dict()
    aux = list(spec.aux_layer_ids or default_aux_layer_ids(int(t["num_hidden_layers"])))
    cfg = {
        "architectures": [DRAFTER_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.hidden_size // spec.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": t["max_position_embeddings"],
        "rms_norm_eps": t["rms_norm_eps"],
        "rope_theta": t.get("rope_theta") or (t.get("rope_parameters") or {}).get("rope_theta", 10000.0),
        "vocab_size": t["vocab_size"],
        "draft_vocab_size": spec.draft_vocab_size or t["vocab_size"],
        "target_hidden_size": t["hidden_size"],
        "tie_word_embeddings": False,
        "bos_token_id": t.get("bos_token_id"),
        "eos_token_id": t.get("eos_token_id"),
        "torch_dtype": "float32",
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": aux},
        MASK_TOKEN_WRITE_KEY: int(mask_token),
        "parallel_drafting": True,
    }
    if spec.trained_k is not None:
        cfg[TRAINED_K_KEYS[0]] = int(spec.trained_k)
    cfg.update(spec.extra)
    return cfg


def _layer_shapes(prefix: str, *, h: int, heads: int, kv: int, hd: int, inter: int, in_width: int
                  ) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.input_layernorm.weight": (h,),
        f"{prefix}.hidden_norm.weight": (h,),
        f"{prefix}.self_attn.q_proj.weight": (heads * hd, in_width),
        f"{prefix}.self_attn.k_proj.weight": (kv * hd, in_width),
        f"{prefix}.self_attn.v_proj.weight": (kv * hd, in_width),
        f"{prefix}.self_attn.o_proj.weight": (h, heads * hd),
        f"{prefix}.post_attention_layernorm.weight": (h,),
        f"{prefix}.mlp.gate_proj.weight": (inter, h),
        f"{prefix}.mlp.up_proj.weight": (inter, h),
        f"{prefix}.mlp.down_proj.weight": (h, inter),
    }


def drafter_weight_shapes(config: Mapping[str, object]) -> dict[str, tuple[int, ...]]:
    """Every tensor a drafter checkpoint for ``config`` holds, by name, with its shape (``embed_tokens`` is
    optional: without it vLLM shares the target's embedding)."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config["num_key_value_heads"])
    hd = int(config.get("head_dim") or h // heads)
    inter = int(config["intermediate_size"])
    n_aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    fused = n_aux * int(config["target_hidden_size"])
    draft_vocab = int(config["draft_vocab_size"])
    dims = dict(h=h, heads=heads, kv=kv, hd=hd, inter=inter)
    shapes = {"fc.weight": (h, fused), **_layer_shapes("midlayer", in_width=2 * h, **dims)}
    for i in range(1, int(config.get("num_hidden_layers", 1))):
        shapes.update(_layer_shapes(f"layers.{i}", in_width=h, **dims))
    shapes.update({"norm.weight": (h,), "lm_head.weight": (draft_vocab, h), MASK_HIDDEN: (1, fused)})
    if draft_vocab != int(config["vocab_size"]):
        shapes["d2t"] = (draft_vocab,)
    return shapes


def random_drafter_weights(config: Mapping[str, object], *, seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Seeded random weights (norms at one, ``d2t`` the identity offsets) in checkpoint naming."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in drafter_weight_shapes(config).items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        elif name == "d2t":
            out[name] = torch.zeros(shape, dtype=torch.long)
        else:
            out[name] = torch.randn(shape, generator=gen) * std
    return out


def write_drafter(out_dir: str | Path, *, config: Mapping[str, object], weights: Mapping[str, torch.Tensor],
                  tokenizer=None) -> Path:
    """Save a P-EAGLE head: config.json + model.safetensors (+ the tokenizer files when given).

    Checks names and shapes against :func:`drafter_weight_shapes` so a wrong checkpoint fails here, not
    at vLLM's load.
    """
    from safetensors.torch import save_file

    expected = drafter_weight_shapes(config)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected) - {"embed_tokens.weight", "t2d"})
    if missing or extra:
        raise ValueError(f"drafter weights: missing {missing}, unexpected {extra}")
    if "embed_tokens.weight" in weights:
        expected = {**expected, "embed_tokens.weight": (int(config["vocab_size"]), int(config["hidden_size"]))}
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"drafter weight {name}: shape {tuple(weights[name].shape)}, expected {shape}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v if v.dtype in (torch.long, torch.bool) else v.to(torch.float32)).contiguous()
               for k, v in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
