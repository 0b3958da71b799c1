"""P-EAGLE and EAGLE-3 heads for a real pretrained target (SmolLM2-135M-Instruct), trained here by
self-distillation on coding tasks from the Python standard library; HumanEval is held out.

    from models import real_pair
    pair = real_pair.build("bench")   # the benchmark's pair (several hours on 2 cores the first time)
    pair = real_pair.build("demo")    # a smaller recipe for `make demo` (minutes), same steps
    pair = real_pair.build("compare") # the demo's data: one-layer EAGLE-3 and P-EAGLE heads, and the demo's (minutes)
    real_pair.existing("bench")       # the pair if the cache holds it, else None (never builds)

Steps, each cached by what it depends on (so an unchanged step is never redone):
1. the target from its PyPI wheel (models.smollm2);
2. the target's greedy answers to the recipe's tasks, by vLLM (key: the tasks' text and the engine);
3. the target's features and top-32 logits on those answers (key: the answers, the aux layers, k);
4. each head, trained on the features (key: the features, the shared recipe, the head's own recipe and the
   trainer's source), written in vLLM's layout with a reduced draft vocabulary (``d2t``), its config stating
   the K it was trained for, then measured by vLLM on held-out prompts (its ``head.json`` holds that and
   the window estimate); the pair folder links the recipe's heads and the target, and (unless the recipe
   leaves it to the benchmark) the K at which the serving head is fastest here.
The heads: EAGLE-3 (one layer, training-time test) and P-EAGLE at the same size: the same bytes read per
drafting pass, the primary comparison; and (bench) a two-layer P-EAGLE head beside them. The bench heads are
trained at equal cost (the same process CPU time each, with weight decay, stopped early on a validation set
apart from the held-out answers) for K = 5, and each reports the steps and epochs it reached.
Command line: ``python -m models.real_pair [bench|demo|compare]``.

Keys chain: the answers' key names the target's folder, whose key hashes models/smollm2.py, so an edit
there re-answers every task (about 66 min for the bench recipe); the features' key hashes the answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from models import answer_shards, cache, layout, smollm2
from models.pair import ModelPair, cached, drafter_config
from models.trainer import coding_tasks, distill, serving_check
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
    window: int = 1024  # rows per training window at most (the answers' max_model_len)
    context: int | None = None  # None: a window is the whole prompt and answer, as vLLM drafts
    distill_top_k: int = 32  # KL distillation to the target's top-k distribution; 0: its argmax only
    held_out_samples: int = 48  # answers kept out of training, for the acceptance figures
    # Further answers kept out of training for early stopping (DrafterTraining.eval_every), apart from the
    # held-out ones above so the figures are not measured on what picked the weights. 0: none.
    validation_samples: int = 0
    gate_prompts: int = 12  # held-out prompts vLLM answers with each head (its measured acceptance)
    gate_max_tokens: int = 128
    # The serving head's acceptance length, measured by vLLM at its trained K on the held-out prompts, must
    # reach this; below it the build fails (a head that drafts nothing vLLM accepts is not served).
    min_acceptance_length: float = 1.0
    # Measure the serving head's fastest K here when the pair is built (plain and each K: an engine each);
    # False leaves it to the benchmark (the demo reads the committed one's), which keeps a fresh demo short.
    measure_serve_k: bool = True
    threads: int = 1  # torch threads: a fixed count keeps the float sums, so the weights, reproducible


# The target's shape: SmolLM2-135M's hidden width, heads and MLP width, so a drafter layer is one of its layers.
DRAFTER_SHAPE = dict(hidden_size=576, num_heads=9, num_kv_heads=3, intermediate_size=1536)


def _training(steps: int, *, batch: int, anchors: int | None, lr: float, depth: int,
              keep_decay: float | None = None) -> DrafterTraining:
    return DrafterTraining(steps=steps, batch_size=batch, depth=depth, anchors=anchors, lr=lr, seed=0,
                           keep_decay=keep_decay, learn_embedding=True)


# The benchmark's heads are compared at equal cost: each trains for the same process CPU time (both threads),
# with weight decay, and stops early when its held-out acceptance estimate stops improving.
BENCH_HEAD_CPU_SECONDS = 3600.0
BENCH_DEPTH = 5  # the K each head is trained for (P-EAGLE's deep rows sampled)


def _fair(*, parallel: bool) -> DrafterTraining:
    return DrafterTraining(steps=100_000, batch_size=8, depth=BENCH_DEPTH, anchors=48 if parallel else None,
                           lr=3e-3, seed=0, keep_decay=0.7 if parallel else None, learn_embedding=True,
                           weight_decay=0.05, cpu_seconds=BENCH_HEAD_CPU_SECONDS, eval_every=100, patience=4,
                           answer_rows_only=not parallel)


_DEMO_DATA = DataRecipe(tasks=160, max_tokens=128)
_DEMO_HEAD = HeadRecipe("p_eagle", parallel=True, layers=2,
                        training=_training(200, batch=8, anchors=32, lr=3e-3, depth=4, keep_decay=0.7))
# EAGLE-3's steps at the P-EAGLE demo head's training time: its training-time test runs K passes over every
# row, 2.6 s a step against P-EAGLE's 1.1 s (10 steps each, 2 idle cores, 2026-12-02).
EAGLE3_DEMO_STEPS = 85

# Every head: whole-prompt windows, KL to the target's top 32, a trainable embedding. P-EAGLE samples its
# depths (0.7**k of the anchors at depth k, at least a fifth), so its deep rows cost little.
RECIPES: dict[str, PairRecipe] = {
    # The primary comparison is one layer against one layer (the same bytes read per drafting pass); the
    # two-layer P-EAGLE head is secondary. min_acceptance_length: below the 1.46 vLLM measured on held-out
    # standard-library prompts for the compare recipe's head (152 answers, K = 4), so only a regression fails.
    "bench": PairRecipe(
        data=DataRecipe(tasks=2400, max_tokens=256),  # of about 2,465 functions the filters find
        heads=(HeadRecipe("eagle3", parallel=False, layers=1, training=_fair(parallel=False)),
               HeadRecipe("p_eagle", parallel=True, layers=1, training=_fair(parallel=True)),
               HeadRecipe("p_eagle_2l", parallel=True, layers=2, training=_fair(parallel=True))),
        serve="p_eagle", threads=2, validation_samples=48, min_acceptance_length=1.3),
    "demo": PairRecipe(data=_DEMO_DATA, heads=(_DEMO_HEAD,), serve="p_eagle", held_out_samples=8, gate_prompts=8,
                       threads=2, measure_serve_k=False),
    # The demo's data: a one-layer EAGLE-3 head and a one-layer P-EAGLE head (the bench's shapes, the same bytes
    # read per drafting pass; P-EAGLE at the demo head's steps), and the demo's two-layer head (shared through
    # the cache) beside them. Builds in minutes: what the drafting cost at equal synthetic acceptance is measured
    # with (`python -m bench.synthetic_sweep --recipe compare`: that cost does not depend on the weights), and
    # a quick end-to-end side-by-side (`bench/real_spec.py --recipe compare`). The benchmark measures its K.
    "compare": PairRecipe(
        data=_DEMO_DATA,
        heads=(HeadRecipe("eagle3", parallel=False, layers=1,
                          training=_training(EAGLE3_DEMO_STEPS, batch=8, anchors=None, lr=3e-3, depth=4)),
               HeadRecipe("p_eagle_1l", parallel=True, layers=1,
                          training=_training(200, batch=8, anchors=32, lr=3e-3, depth=4, keep_decay=0.7)),
               _DEMO_HEAD),
        serve="p_eagle_1l", held_out_samples=8, gate_prompts=8, threads=2, measure_serve_k=False),
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
    """Step 2: the folder holding samples.jsonl for this recipe's tasks: from the answers committed in
    models/answers when they answer exactly these tasks with this target and engine, else answered by vLLM."""
    import vllm

    root = _samples_root(recipe, target)
    if not (root / distill.SAMPLES).is_file():
        messages = training_messages(recipe)
        shards = answer_shards.committed(messages, max_tokens=recipe.max_tokens, target=target,
                                         vllm_version=vllm.__version__, log=log)
        if shards is not None:
            log(f"step: the target's answers to {len(messages)} coding tasks from the committed shards in "
                f"models/answers/{shards.name} -> {root.name}")
            cache.publish(root, lambda folder: answer_shards.samples(shards, folder, messages=messages),
                          prefix="distill-samples-build-")
            return root
        log(f"step: the target answers {len(messages)} coding tasks (vLLM, greedy, fp32) -> {root.name}")
        cache.publish(root, lambda folder: distill.generate(target, messages, folder, max_tokens=recipe.max_tokens,
                                                            log=log), prefix="distill-samples-build-")
    return root


def _features_root(samples_dir: Path, target: Path, top_k: int) -> Path:
    digest = hashlib.sha256((samples_dir / distill.SAMPLES).read_bytes()).hexdigest()
    key = cache.recipe_key("distill-features", {"samples": digest, "target": target.parent.name,
                                                "aux_layer_ids": list(AUX_LAYER_IDS), "top_k": top_k}, [])
    return cache.CACHE_DIR / key


def features(samples_dir: Path, target: Path, *, top_k: int, log=_log_default) -> Path:
    """Step 3: the folder holding the target's features (and its top-k logits) on the samples."""
    root = _features_root(samples_dir, target, top_k)
    if not (root / "features.json").is_file():
        rows = distill.read_samples(samples_dir / distill.SAMPLES)
        log(f"step: the target's features on {len(rows)} answers (transformers, fp32) -> {root.name}")
        cache.publish(root, lambda folder: distill.extract_features(target, rows, folder, aux_layer_ids=AUX_LAYER_IDS,
                                                                    top_k=top_k, log=log),
                      prefix="distill-features-build-")
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
    shared = {k: v for k, v in asdict(recipe).items() if k not in ("heads", "serve", "measure_serve_k")}
    key = cache.recipe_key("smollm2-head", {"recipe": shared, "head": asdict(head), "features": feature_dir.name,
                                            "target": target.parent.name},
                           [*TRAINER_SOURCES, Path(layout.__file__)])
    return cache.CACHE_DIR / key


HEAD_REPORT = "head.json"  # in each head's folder: what the head is and its acceptance estimate


@dataclass(frozen=True)
class _Gate:
    """What vLLM answers to judge a head: the recipe's first held-out prompts, on the target."""

    target: Path
    prompts: list
    max_tokens: int


def _gate(recipe: PairRecipe, target: Path, sample_dir: Path, held) -> _Gate:  # noqa: ANN001 - held: sample indexes
    rows = distill.read_samples(sample_dir / distill.SAMPLES)  # features keep the samples' order
    return _Gate(target=target, prompts=[rows[int(i)]["prompt_ids"] for i in held[:recipe.gate_prompts]],
                 max_tokens=recipe.gate_max_tokens)


def split(recipe: PairRecipe, features) -> tuple:  # noqa: ANN001 - distill.Features
    """(training, held-out, validation) sample indexes: the figures' held-out answers first, then early
    stopping's, both out of training."""
    from models.trainer.feature_batches import split_samples

    train, kept = split_samples(features, held_out=recipe.held_out_samples + recipe.validation_samples,
                                seed=recipe.data.seed)
    return train, kept[:recipe.held_out_samples], kept[recipe.held_out_samples:]


def _held_out_gate(recipe: PairRecipe, target: Path, sample_dir: Path, feature_dir: Path) -> _Gate:
    """The same gate without building a training set (no target weights loaded, no windows built)."""
    _, held, _ = split(recipe, distill.Features.load(feature_dir))
    return _gate(recipe, target, sample_dir, held)


class _TrainingSet:
    """What every head of a recipe trains on: the target, the draft vocabulary, training and held-out
    windows. Built once, on the first head that is not cached."""

    def __init__(self, recipe: PairRecipe, target: Path, sample_dir: Path, feature_dir: Path, *, log):
        import torch
        from transformers import AutoModelForCausalLM

        from models.trainer.feature_batches import FeatureWindows, draft_vocab

        torch.set_num_threads(recipe.threads)
        torch.use_deterministic_algorithms(True)
        self.held_out = held_out_check(target, sample_dir)
        log(f"step: HumanEval held out - none of its prompts or solutions in {self.held_out['texts_checked']} "
            "training texts")
        self.target = target
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        self.target_cfg = json.loads((target / "config.json").read_text())
        self.vocab_size = int(self.target_cfg["vocab_size"])
        self.mask_id = smollm2.mask_token_id(target)
        features = distill.Features.load(feature_dir)
        train, held, validation = split(recipe, features)
        self.vocab = draft_vocab(features, train, size=recipe.draft_vocab, vocab_size=self.vocab_size)
        log(f"step: heads on {len(train)} answers ({len(held)} held out); draft vocabulary {self.vocab.size} "
            f"tokens covers {self.vocab.coverage:.1%} of the answers' tokens")
        soft = recipe.distill_top_k > 0
        self.windows = FeatureWindows(features, train, window=recipe.window, context=recipe.context,
                                      vocab=self.vocab, vocab_size=self.vocab_size, soft=soft)
        # Held out: each answer whole, one batch each (the estimate drafts from every answer row).
        self.held_batches = FeatureWindows(features, held, window=recipe.window, context=recipe.context,
                                           vocab=self.vocab, vocab_size=self.vocab_size, soft=soft).each(len(held))
        self.validation_batches = FeatureWindows(features, validation, window=recipe.window, context=recipe.context,
                                                 vocab=self.vocab, vocab_size=self.vocab_size,
                                                 soft=soft).each(len(validation)) if len(validation) else None
        self.gate = _gate(recipe, target, sample_dir, held)
        self.summary = {"training_answers": int(len(train)), "held_out_answers": int(len(held)),
                        "validation_answers": int(len(validation)),
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
    head = init_head(shape, data.model, parallel=head_recipe.parallel, seed=training.seed,
                     learn_embedding=training.learn_embedding,
                     mask_token=data.mask_id if head_recipe.parallel else None,
                     draft_ids=torch.from_numpy(data.vocab.ids))
    budget = f"{training.cpu_seconds:.0f} CPU seconds" if training.cpu_seconds else f"{training.steps} steps"
    log(f"training {head_recipe.name}: {head_recipe.layers} layer(s), {budget}")
    run = train_head(head, lambda gen: data.windows.batch(gen, training.batch_size), training,
                     mask_token=data.mask_id, held_out=data.validation_batches,
                     log=lambda line: log(f"  {head_recipe.name}: {line}"))
    train_seconds = round(time.time() - t0)
    estimate = estimate_acceptance(head, data.held_batches, depth=training.depth, mask_token=data.mask_id)
    log(f"{head_recipe.name}: {estimate}")
    layout.write_drafter(folder, config=config, weights=head_weights(head, d2t=data.vocab.d2t()))
    measured = serving_check.measure(data.target, [{"name": head_recipe.name, "speculative_config": drafter_config(
        folder, training.depth, parallel=head_recipe.parallel)}], data.gate.prompts,
        max_tokens=data.gate.max_tokens, log=log)[0]
    report = {"head": asdict(head_recipe), "layers": head_recipe.layers, "parallel": head_recipe.parallel,
              "trained_k": training.depth,
              "trainable_parameters": sum(p.numel() for p in head.parameters() if p.requires_grad),
              "train_seconds": train_seconds,
              "training_run": {"steps": run.steps, "epochs": run.epochs(len(data.windows.samples)),
                               "cpu_seconds": run.cpu_seconds, "eval_cpu_seconds": run.eval_cpu_seconds,
                               "stopped": run.stopped, "best_step": run.best_step,
                               "validation_estimates": run.estimates},
              "window_estimate": estimate,
              "vllm_held_out": {"k": training.depth, "prompts": len(data.gate.prompts),
                                "max_tokens": data.gate.max_tokens,
                                **{k: measured[k] for k in ("acceptance_length", "accepted_per_position",
                                                            "tokens_per_s")}},
              **data.summary}
    (folder / HEAD_REPORT).write_text(json.dumps(report, indent=2, default=int) + "\n")


SERVE_K = "serve_k.json"


def _serving_k(gate: _Gate, folder: Path, trained_k: int, *, log) -> dict:
    """The K at which the serving head is fastest on this machine: plain decoding and the head at each K up to
    the one it was trained for, one after another on the held-out prompts (one request at a time). Cached by
    the head and the prompts, so recipes that share a head share the measurement."""
    head_dir = folder.resolve()
    root = cache.CACHE_DIR / cache.recipe_key("serve-k", {"head": head_dir.name, "prompts": gate.prompts,
                                                          "max_tokens": gate.max_tokens}, [])
    if not (root / SERVE_K).is_file():
        cache.publish(root, lambda out: (out / SERVE_K).write_text(json.dumps(
            _measure_serving_k(gate, head_dir, trained_k, log=log), indent=2) + "\n"), prefix=f"{root.name}-build-")
    return json.loads((root / SERVE_K).read_text())


def _measure_serving_k(gate: _Gate, folder: Path, trained_k: int, *, log) -> dict:
    configs = [{"name": "plain", "speculative_config": None},
               *({"name": f"k{k}", "speculative_config": drafter_config(folder, k, parallel=True)}
                 for k in range(1, trained_k + 1))]
    results = serving_check.measure(gate.target, configs, gate.prompts, max_tokens=gate.max_tokens,
                                    log=log)
    plain, runs = results[0], results[1:]
    for r in runs:
        if r["token_ids"] != plain["token_ids"]:
            raise RuntimeError(f"{folder.name} at {r['name']}: greedy output differs from plain decoding")
    best = max(runs, key=lambda r: r["tokens_per_s"])
    return {"k": int(best["name"][1:]), "plain_tokens_per_s": plain["tokens_per_s"],
            "tokens_per_s": {r["name"]: r["tokens_per_s"] for r in runs},
            "acceptance_length": {r["name"]: r["acceptance_length"] for r in runs},
            "prompts": len(gate.prompts), "max_tokens": gate.max_tokens,
            "how": "plain decoding and the serving head at each K up to its trained K, in that order, each in "
                   "its own vLLM engine on the held-out prompts, one request at a time; the fastest K"}


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
        if head_recipe.name == recipe.serve:
            measured = report["heads"][head_recipe.name]["vllm_held_out"]["acceptance_length"] or 1.0
            if measured < recipe.min_acceptance_length:
                raise RuntimeError(f"{head_recipe.name}: acceptance length {measured} measured by vLLM on held-out "
                                   f"prompts is below the recipe's min_acceptance_length "
                                   f"{recipe.min_acceptance_length}; the head is cached in {head_dir.name}")
        # The pair names its heads and its target by reference: symlinks into the cache.
        (root / head_recipe.name).symlink_to(head_dir)
        folders[head_recipe.name] = root / head_recipe.name
    (root / "target").symlink_to(target)
    if recipe.measure_serve_k:
        gate = data.gate if data is not None else _held_out_gate(recipe, target, sample_dir, feature_dir)
        serve = next(h for h in recipe.heads if h.name == recipe.serve)
        report["serve_k"] = _serving_k(gate, folders[recipe.serve], serve.training.depth, log=log)
        log(f"serving K on this machine: {report['serve_k']['k']} ({report['serve_k']['tokens_per_s']} tok/s; "
            f"plain {report['serve_k']['plain_tokens_per_s']})")
    report["mask_token_id"] = smollm2.mask_token_id(target)
    report["build_seconds"] = round(time.time() - started)
    (root / "training.json").write_text(json.dumps(report, indent=2, default=int) + "\n")
    eagle3 = next((folders[h.name] for h in recipe.heads if not h.parallel), None)
    extra = {h.name: folders[h.name] for h in recipe.heads if h.parallel and h.name != recipe.serve}
    return ModelPair(root=root, target=root / "target", drafter=folders[recipe.serve],
                     mask_token_id=report["mask_token_id"], eagle3_drafter=eagle3, other_drafters=extra).save()


def _target_folder() -> Path:
    return smollm2.cache_root(smollm2.wheel()) / "target"


def sample_dir(name: str) -> Path:
    """The answers folder of recipe ``name`` (built or not)."""
    return _samples_root(RECIPES[name].data, _target_folder())


def held_out_prompts(name: str, count: int | None = None) -> list[list[int]]:
    """The prompts (chat-template token ids) of recipe ``name``'s held-out answers, in the split's order (the
    gate's first): never trained on, never used for early stopping. The recipe's answers and features must
    be built."""
    recipe = RECIPES[name]
    samples_dir = sample_dir(name)
    features_dir = _features_root(samples_dir, _target_folder(), recipe.distill_top_k)
    _, held, _ = split(recipe, distill.Features.load(features_dir))
    rows = distill.read_samples(samples_dir / distill.SAMPLES)
    return [rows[int(i)]["prompt_ids"] for i in held[:count]]


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
    feature_dir = _features_root(sample_dir, target, recipe.distill_top_k)
    if not (feature_dir / "features.json").is_file():
        return None
    return ModelPair.load(_heads_root(recipe, target, feature_dir))


def build(name: str = "bench", *, log=_log_default) -> ModelPair:
    """Every step of the recipe ``name``, each skipped when cached."""
    recipe = RECIPES[name]
    target = smollm2.build()
    sample_dir = samples(recipe.data, target, log=log)
    feature_dir = features(sample_dir, target, top_k=recipe.distill_top_k, log=log)
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
