"""The random pair: a small seeded target and P-EAGLE drafter with untrained weights, built offline in seconds,
cached by content hash (the trained small pair is models.toy_pair).

    from models.random_pair import build
    paths = build()            # -> models.pair.ModelPair(root, target, drafter, mask_token_id)
    paths.target               # Path: a 4-layer hidden-128 Llama with its byte-level BPE tokenizer
    paths.drafter              # Path: an EAGLE-3 head with mask_hidden and ptd_token_id (models.layout)
    paths.speculative_config(k=4)  # dict for vLLM's --speculative-config

The weights are random (seeded), so the drafter's guesses are rarely accepted: the pair proves the
serving path and greedy parity, not speed. The cache key hashes this recipe and models/layout.py,
so changing either rebuilds; ``build(out_dir=...)`` writes to a fresh folder instead of the cache.
Command line: ``python -m models.random_pair [--out DIR]`` prints the paths as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from models import cache, layout
from models.pair import ModelPair, cached

SEED = 1234
VOCAB_SIZE = 512
TARGET = layout.TargetSpec(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256,
                           initializer_range=0.2)
DRAFTER = layout.DrafterSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)

# Enough varied text for BPE to learn merges; the model never sees it (weights are random).
CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "SageMaker endpoints serve large language models behind an HTTPS API.",
    "Speculative decoding drafts several tokens and the target model verifies them in one pass.",
    "P-EAGLE predicts all draft tokens at once using a mask token and a shared hidden state.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10): print(i * i)",
    "Once upon a time there was a small model that wanted to be fast.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828",
    "Questions? Answers! Lists; colons: quotes \"like this\" and 'that'.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "user assistant system <|user|> <|assistant|>",
) * 4


def cache_root() -> Path:
    """The cache folder of this recipe: its name hashes the recipe, this module and models/layout.py."""
    recipe = {"seed": SEED, "vocab": VOCAB_SIZE, "target": asdict(TARGET),
              "drafter": {k: v for k, v in asdict(DRAFTER).items() if k != "extra"}, "corpus": CORPUS}
    return cache.CACHE_DIR / cache.recipe_key("random", recipe, [Path(layout.__file__), Path(__file__)])


def _write(root: Path) -> ModelPair:
    tok = layout.write_tokenizer(root / "tokenizer", corpus=CORPUS, vocab_size=VOCAB_SIZE)
    target_dir = layout.write_target(root / "target", tokenizer=tok, spec=TARGET, seed=SEED)
    target_cfg = json.loads((target_dir / "config.json").read_text())
    mask_id = layout.mask_token_id(tok)
    cfg = layout.drafter_config(target=target_cfg, spec=DRAFTER, mask_token=mask_id)
    weights = layout.random_drafter_weights(cfg, seed=SEED + 1)
    drafter_dir = layout.write_drafter(root / "drafter", config=cfg, weights=weights, tokenizer=tok)
    shutil.rmtree(root / "tokenizer")
    return ModelPair(root=root, target=target_dir, drafter=drafter_dir, mask_token_id=mask_id).save()


def build(out_dir: str | Path | None = None) -> ModelPair:
    """Return the random pair; build it (a few seconds) unless the cache already holds this recipe."""
    if out_dir is not None:
        return _write(Path(out_dir))
    return cached(cache_root(), _write)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write here instead of the content-addressed cache")
    args = parser.parse_args(argv)
    pair = build(args.out)
    print(json.dumps({"target": str(pair.target), "drafter": str(pair.drafter),
                      "mask_token_id": pair.mask_token_id,
                      "speculative_config": pair.speculative_config()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
