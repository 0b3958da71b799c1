"""The trained demo pair: a small Llama target and two drafter heads (P-EAGLE and EAGLE-3), built here from nothing.

    from tools.demo_models import build, existing_pair
    pair = existing_pair()     # DemoPair if the cache holds this recipe, else None (never trains)
    pair = build()             # trains (about 6 minutes on 2 cores) unless cached, then returns DemoPair
    pair.target                # Llama target with its tokenizer
    pair.drafter               # P-EAGLE head (mask_hidden, ptd_token_id): serve with parallel_drafting
    pair.eagle3_drafter        # sequential EAGLE-3 head of the same size, for comparison
    pair.speculative_config(k=4)

Steps, all seeded: a synthetic structured corpus (tools.trainer.corpus) -> a byte-level BPE tokenizer ->
the target (next-token loss) -> the P-EAGLE head (parallel objective) and the EAGLE-3 head (training-time
test), both distilled from the target's distributions -> saved in vLLM 0.32's layout by tools.model_layout.
The cache key hashes the recipe and the source of every module involved, so an edit rebuilds and a rerun
is instant. Command line: ``python -m tools.demo_models [--out DIR] [--force]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tools import model_cache
from tools import model_layout as layout

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache" / "models"
TRAINER_DIR = Path(__file__).resolve().parent / "trainer"
VOCAB_SIZE = 1024
SEQ_LEN = 128
HELD_OUT_ROWS = 16  # rows of the packed corpus kept out of drafter training, for the acceptance estimate


def _recipe():
    from tools.trainer.corpus import CorpusSpec
    from tools.trainer.target import TargetSpec as TargetTraining
    from tools.trainer.train_drafters import DrafterTraining

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


@dataclass(frozen=True)
class DemoPair:
    root: Path
    target: Path
    drafter: Path  # P-EAGLE
    eagle3_drafter: Path
    mask_token_id: int

    def speculative_config(self, k: int = 4, *, parallel: bool = True) -> dict:
        if parallel:
            return layout.speculative_config(self.drafter, num_speculative_tokens=k)
        return {"method": "eagle3", "model": str(self.eagle3_drafter), "num_speculative_tokens": k}

    def report(self) -> dict:
        path = self.root / "training.json"
        return json.loads(path.read_text()) if path.is_file() else {}


def recipe_hash() -> str:
    h = hashlib.sha256()
    h.update(json.dumps({k: asdict(v) for k, v in _recipe().items()}, sort_keys=True, default=str).encode())
    h.update(f"{VOCAB_SIZE}/{SEQ_LEN}/{HELD_OUT_ROWS}".encode())
    for source in sorted([Path(__file__), Path(layout.__file__), *TRAINER_DIR.glob("*.py")]):
        h.update(source.name.encode())
        h.update(source.read_bytes())
    return h.hexdigest()[:16]


def _write(root: Path, *, log=print) -> DemoPair:
    import torch

    from tools.trainer.corpus import make_corpus
    from tools.trainer.drafter import DrafterShape
    from tools.trainer.target import pack_tokens, train_target
    from tools.trainer.train_drafters import estimate_acceptance, head_weights, init_head, train_head

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

    spec: layout.DrafterSpec = r["drafter_spec"]
    p_cfg = layout.drafter_config(target=target_json, spec=spec, mask_token=mask_id)
    e_cfg = layout.drafter_config(target=target_json, spec=spec, mask_token=mask_id)
    e_cfg["parallel_drafting"] = False
    aux = list(p_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    shape = DrafterShape(vocab_size=len(tok), hidden_size=spec.hidden_size, heads=spec.num_heads,
                         intermediate_size=spec.intermediate_size, aux_layers=len(aux),
                         rms_norm_eps=float(p_cfg["rms_norm_eps"]), rope_theta=float(p_cfg["rope_theta"]))
    training = r["drafter_training"]
    report: dict = {"recipe_hash": root.name, "target_held_out_loss": round(held_loss, 4),
                    "aux_layer_ids": aux, "mask_token_id": mask_id}
    dirs = {}
    for name, parallel, cfg in (("p_eagle", True, p_cfg), ("eagle3", False, e_cfg)):
        head = init_head(shape, target, parallel=parallel, seed=training.seed)
        train_head(head, target, train_rows, training, aux_layer_ids=aux, mask_token=mask_id, log=log)
        report[name] = estimate_acceptance(head, target, held_rows, depth=training.depth, aux_layer_ids=aux,
                                           mask_token=mask_id)
        report[name]["parameters"] = sum(p.numel() for p in head.parameters())
        log(f"{name}: {report[name]}")
        dirs[name] = layout.write_drafter(root / ("drafter" if parallel else "drafter_eagle3"), config=cfg,
                                          weights=head_weights(head), tokenizer=tok)
    shutil.rmtree(root / "tokenizer")
    report["build_seconds"] = round(time.time() - started, 1)
    (root / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    (root / "pair.json").write_text(json.dumps({"target": "target", "drafter": "drafter",
                                                "eagle3_drafter": "drafter_eagle3", "mask_token_id": mask_id}))
    log(f"demo pair built in {report['build_seconds']} s: {root}")
    pair = _read(root)
    assert pair is not None
    return pair


def _read(root: Path) -> DemoPair | None:
    meta = root / "pair.json"
    if not meta.is_file():
        return None
    info = json.loads(meta.read_text())
    return DemoPair(root=root, target=root / info["target"], drafter=root / info["drafter"],
                    eagle3_drafter=root / info["eagle3_drafter"], mask_token_id=int(info["mask_token_id"]))


def cache_root() -> Path:
    return CACHE_DIR / f"demo-{recipe_hash()}"


def existing_pair() -> DemoPair | None:
    """The cached pair for the current recipe, or None; never trains."""
    return _read(cache_root())


def build(out_dir: str | Path | None = None, *, force: bool = False, log=print) -> DemoPair:
    """Return the demo pair, training it first unless the cache holds this recipe."""
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        return _write(out, log=log)
    root = cache_root()
    if not force:
        cached = _read(root)
        if cached is not None:
            return cached

    def train_into(tmp: Path) -> None:
        _write(tmp, log=log)
        report = json.loads((tmp / "training.json").read_text())
        report["recipe_hash"] = root.name
        (tmp / "training.json").write_text(json.dumps(report, indent=2) + "\n")

    model_cache.publish(root, train_into, prefix="demo-build-", replace=force)
    pair = _read(root)
    assert pair is not None
    return pair


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
