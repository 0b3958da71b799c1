"""What a P-EAGLE drafter checkpoint must hold, and the check that reads it before vLLM does.

vLLM's parallel-drafting proposer needs two things beside an EAGLE-3 head's usual weights: a
``mask_hidden`` tensor (the learned shared hidden state h_shared that stands in for the draft positions
2..K, stored before the ``fc`` projection) and the id of the mask token fed at those positions, read
from config.json under one of :data:`MASK_TOKEN_KEYS`. vLLM only finds either missing after the target
has loaded (minutes on a large model, then a crash loop on SageMaker); both are cheap to see up front:
the id is a config key, and a safetensors file starts with a JSON header naming every tensor, so no
torch import is needed. The runtime's entrypoint, the model builders and the weights stager all use
this one module, so the keys are declared once.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

# The checkpoint tensor P-EAGLE adds: [1, n_aux * target_hidden], projected by ``fc`` at load.
MASK_HIDDEN = "mask_hidden"
# Top-level config keys vLLM 0.32's proposer reads for the mask-token id, after
# ``dflash_config.mask_token_id``, in its order. The published amazon/*-P-EAGLE heads use ptd_token_id,
# and so do the heads this project writes.
MASK_TOKEN_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")
MASK_TOKEN_WRITE_KEY = "ptd_token_id"
# Where a drafter's config.json may state the K it was trained for (the depth of its parallel objective);
# past it acceptance collapses. The heads this project writes use the first key.
# vLLM 0.32's registry names for EAGLE-3-family heads: the ones its parallel-drafting proposer runs.
PARALLEL_DRAFTING_ARCHITECTURES = frozenset({
    "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "PEagleDraftModel", "PeagleLlamaForCausalLM",
    "Eagle3MiniMaxM2ForCausalLM", "Eagle3Qwen2_5vlForCausalLM", "Eagle3Qwen3vlForCausalLM", "Eagle3Qwen3ForCausalLM",
    "PeagleQwen3ForCausalLM", "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM",
})
TRAINED_K_KEYS = ("trained_num_speculative_tokens", "num_speculative_tokens")

# A safetensors header over this size is not a real checkpoint header (guards a corrupt length field).
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class DrafterCheckError(ValueError):
    pass


def mask_token_id(config: dict) -> int | None:
    dflash = config.get("dflash_config")
    if isinstance(dflash, dict) and dflash.get("mask_token_id") is not None:
        return dflash["mask_token_id"]
    for key in MASK_TOKEN_KEYS:
        if config.get(key) is not None:
            return config[key]
    return None


def safetensors_names(path: Path) -> set[str]:
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise DrafterCheckError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", raw)
        if size > _MAX_HEADER_BYTES:
            raise DrafterCheckError(f"{path}: not a safetensors file (header length {size})")
        try:
            header = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DrafterCheckError(f"{path}: safetensors header is not valid JSON") from None
    return {k for k in header if k != "__metadata__"}


def tensor_names(directory: Path) -> set[str]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text()).get("weight_map", {}))
    names: set[str] = set()
    for file in sorted(directory.glob("*.safetensors")):
        names |= safetensors_names(file)
    return names


def trained_k(config: dict) -> tuple[str, int] | None:
    """(key, K) when the config states the K the head was trained for, else None."""
    for key in TRAINED_K_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


@dataclass(frozen=True)
class DrafterInfo:
    mask_token_id: int
    trained: tuple[str, int] | None  # (config key, K) when the config states the K it was trained for
    architectures: tuple[str, ...] = ()

    def check_k(self, num_speculative_tokens: int, *, where: str) -> None:
        """Refuse a K above the one the head was trained for: acceptance collapses past it."""
        if self.trained is not None and num_speculative_tokens > self.trained[1]:
            key, k = self.trained
            raise DrafterCheckError(f"{where}: got {num_speculative_tokens}, but the drafter was trained for K up to "
                                    f"{k} ({key} in its config.json); acceptance collapses past it; allowed: 1..{k}")


def check_drafter_dir(directory: str | Path, *, where: str) -> DrafterInfo:
    """Raise :class:`DrafterCheckError` naming what is missing or malformed; return what the head states."""
    d = Path(directory)
    if not d.is_dir():
        raise DrafterCheckError(f"{where}: drafter directory {d} does not exist")
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise DrafterCheckError(f"{where}: {d} has no config.json")
    try:
        config = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise DrafterCheckError(f"{where}: {cfg_file} is not valid JSON ({exc.msg})") from None
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not set(architectures) & PARALLEL_DRAFTING_ARCHITECTURES:
        raise DrafterCheckError(f"{where}: architectures {architectures!r} in {cfg_file}; allowed: an EAGLE-3 head "
                                f"vLLM's parallel drafting runs, one of {sorted(PARALLEL_DRAFTING_ARCHITECTURES)}")
    token = mask_token_id(config)
    if token is None:
        raise DrafterCheckError(
            f"{where}: {cfg_file} names no mask-token id; P-EAGLE needs one of "
            f"{', '.join(MASK_TOKEN_KEYS)} or dflash_config.mask_token_id"
        )
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise DrafterCheckError(f"{where}: mask-token id {token!r} in {cfg_file}; allowed: a non-negative integer")
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and token >= vocab:
        raise DrafterCheckError(f"{where}: mask-token id {token} is outside the vocabulary (vocab_size {vocab})")
    if not any(d.glob("*.safetensors")):
        raise DrafterCheckError(f"{where}: {d} holds no *.safetensors weights")
    names = tensor_names(d)
    if not any(n == MASK_HIDDEN or n.endswith("." + MASK_HIDDEN) for n in names):
        raise DrafterCheckError(
            f"{where}: the weights in {d} have no '{MASK_HIDDEN}' tensor (P-EAGLE's shared hidden state h_shared); "
            "this is not a parallel-drafting head"
        )
    return DrafterInfo(mask_token_id=token, trained=trained_k(config), architectures=tuple(architectures))
