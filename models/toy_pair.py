"""The trained toy pair: a small Llama target and two drafter heads (P-EAGLE and EAGLE-3), built here from nothing.

    from models.toy_pair import build, existing_pair
    pair = existing_pair()     # a models.pair.ModelPair if the cache holds this recipe, else None (never trains)
    pair = build()             # trains (about 6 minutes on 2 cores) unless cached, then returns the pair
    pair.target                # Llama target with its tokenizer
    pair.drafter               # P-EAGLE head (mask_hidden, ptd_token_id): serve with parallel_drafting
    pair.eagle3_drafter        # sequential EAGLE-3 head of the same size, for comparison
    pair.speculative_config(k=4)

Steps, all seeded: a synthetic structured corpus (models.trainer.corpus) -> a byte-level BPE tokenizer ->
the target (next-token loss) -> the P-EAGLE head (parallel objective) and the EAGLE-3 head (training-time
test), both distilled from the target's distributions -> saved in vLLM 0.32's layout by models.layout.
The cache key hashes the recipe and the source of every module involved, so an edit rebuilds and a rerun
is instant. Command line: ``python -m models.toy_pair [--out DIR] [--force]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from models import cache, layout
from models.pair import ModelPair, cached

TRAINER_DIR = Path(__file__).resolve().parent / "trainer"
# The trainer modules that decide this pair's weights (the real pair's data modules do not).
TRAINER_MODULES = ("corpus.py", "target.py", "drafter.py", "objectives.py", "train_drafters.py")
VOCAB_SIZE = 1024
SEQ_LEN = 128
HELD_OUT_ROWS = 16  # rows of the packed corpus kept out of drafter training, for the acceptance estimate


def _recipe():
    from models.trainer.corpus import CorpusSpec
    from models.trainer.target import TargetTraining
    from models.trainer.train_drafters import DrafterTraining

    target_spec = layout.TargetSpec(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=4,
                                    intermediate_size=384, max_position_embeddings=2048)
    drafter_spec = layout.DrafterSpec(hidden_size=128, num_heads=4, num_kv_heads=4, intermediate_size=384)
    return {
        "corpus": CorpusSpec(),
        "target_spec": target_spec,
        "target_training": TargetTraining(seq_len=SEQ_LEN, batch_size=16, steps=400, lr=3e-3, seed=0),
        "drafter_spec": drafter_spec,
        "drafter_training": DrafterTraining(steps=400, batch_size=8, depth=7, anchors=None, lr=3e-3, seed=0),
    }


def cache_root() -> Path:
    """The cache folder of this recipe: its name hashes the recipe and every module that trains or writes it."""
    recipe = {k: asdict(v) for k, v in _recipe().items()}
    recipe["sizes"] = [VOCAB_SIZE, SEQ_LEN, HELD_OUT_ROWS]
    sources = [Path(__file__), Path(layout.__file__), *(TRAINER_DIR / name for name in TRAINER_MODULES)]
    return cache.CACHE_DIR / cache.recipe_key("toy", recipe, sources)


def _write(root: Path, *, log=print) -> ModelPair:
    import torch

    from models.trainer.corpus import make_corpus
    from models.trainer.drafter import DrafterShape
    from models.trainer.target import pack_tokens, train_target
    from models.trainer.objectives import target_batch
    from models.trainer.train_drafters import estimate_acceptance, head_weights, init_head, target_rows, train_head

    # One thread: on this shared 2-core machine, two OpenMP threads competing with other jobs ran up to 10x
    # slower than one, and a fixed thread count keeps the float sums (so the weights) reproducible.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    r = _recipe()
    started = time.time()
    docs = make_corpus(r["corpus"])
    tok = layout.write_tokenizer(root / "tokenizer", corpus=docs, vocab_size=VOCAB_SIZE)
    mask_id = layout.mask_token_id(tok)
    rows = pack_tokens([tok(d)["input_ids"] for d in docs], eos_id=tok.eos_token_id, seq_len=SEQ_LEN)
    train_rows, held_rows = rows[:-HELD_OUT_ROWS], rows[-HELD_OUT_ROWS:]
    log(f"corpus: {len(docs)} documents, {rows.numel()} tokens, vocabulary {len(tok)}")

    target_cfg = layout.target_config(r["target_spec"], tok)
    target = train_target(train_rows, target_cfg, r["target_training"], log=log)
    target_dir = layout.write_target(root / "target", tokenizer=tok, model=target)
    target_json = json.loads((target_dir / "config.json").read_text())
    for p in target.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        held_loss = target(input_ids=held_rows, labels=held_rows).loss.item()

    training = r["drafter_training"]
    spec = dataclasses.replace(r["drafter_spec"], trained_k=training.depth)
    p_cfg = layout.drafter_config(target=target_json, spec=spec, mask_token=mask_id)
    e_cfg = layout.drafter_config(target=target_json, spec=spec, mask_token=mask_id)
    e_cfg["parallel_drafting"] = False
    aux = list(p_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    shape = DrafterShape(vocab_size=len(tok), hidden_size=spec.hidden_size, heads=spec.num_heads,
                         kv_heads=spec.num_kv_heads, intermediate_size=spec.intermediate_size, aux_layers=len(aux),
                         rms_norm_eps=float(p_cfg["rms_norm_eps"]), rope_theta=float(p_cfg["rope_theta"]))
    batches = target_rows(target, train_rows, training, aux)
    held_out = target_batch(target, held_rows, aux)
    report: dict = {"recipe": cache_root().name, "target_held_out_loss": round(held_loss, 4),
                    "aux_layer_ids": aux, "mask_token_id": mask_id}
    dirs = {}
    for name, parallel, cfg in (("p_eagle", True, p_cfg), ("eagle3", False, e_cfg)):
        head = init_head(shape, target, parallel=parallel, seed=training.seed)
        train_head(head, batches, training, mask_token=mask_id, log=log)
        report[name] = estimate_acceptance(head, held_out, depth=training.depth, mask_token=mask_id)
        report[name]["parameters"] = sum(p.numel() for p in head.parameters())
        log(f"{name}: {report[name]}")
        dirs[name] = layout.write_drafter(root / ("drafter" if parallel else "drafter_eagle3"), config=cfg,
                                          weights=head_weights(head), tokenizer=tok)
    shutil.rmtree(root / "tokenizer")
    report["build_seconds"] = round(time.time() - started, 1)
    (root / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"demo pair built in {report['build_seconds']} s: {root}")
    return ModelPair(root=root, target=target_dir, drafter=dirs["p_eagle"], eagle3_drafter=dirs["eagle3"],
                     mask_token_id=mask_id).save()


def existing_pair() -> ModelPair | None:
    """The cached pair for the current recipe, or None; never trains."""
    return ModelPair.load(cache_root())


def build(out_dir: str | Path | None = None, *, force: bool = False, log=print) -> ModelPair:
    """Return the demo pair, training it first unless the cache holds this recipe."""
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        return _write(out, log=log)
    return cached(cache_root(), lambda folder: _write(folder, log=log), force=force)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write here instead of the content-addressed cache")
    parser.add_argument("--force", action="store_true", help="retrain even if the cache holds this recipe")
    args = parser.parse_args(argv)
    if os.name == "posix" and hasattr(os, "nice"):
        os.nice(10)  # a long CPU job on a shared 2-core machine
    pair = build(args.out, force=args.force)
    print(json.dumps({"target": str(pair.target), "drafter": str(pair.drafter),
                      "eagle3_drafter": str(pair.eagle3_drafter), "mask_token_id": pair.mask_token_id,
                      "training": pair.report(), "speculative_config": pair.speculative_config()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
