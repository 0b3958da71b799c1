"""A P-EAGLE head trained on an endpoint's own traffic, warm-started from the head it serves, then gated.

    from models.trainer import traffic_training
    report = traffic_training.run(capture=[...jsonl], stage="dev", target_name="...", target=<target folder>,
                                  in_service=<drafter folder>, work=<folder>, k=7)

Steps, each kept in ``work`` under the SHA-256 of what it depends on, so a run stopped half way resumes at the
first step not done:

1. the capture read for this stage and target, split by conversation, proven apart (capture_samples);
2. the target's features on the training requests (distill.extract_features, the aux layers the served head reads);
3. the candidate: the served head (warm_start) trained with the benchmark's P-EAGLE recipe
   (``models.real_pair.RECIPES["bench"]``: the same objective, windows, distillation and early stopping; only its
   CPU budget may be given), in its draft vocabulary, written in vLLM's layout beside the folder it came from;
4. the gate (gate.measure): both heads served by vLLM on the held-out requests at the stage's K.

The report says every figure whichever way the gate went; nothing is staged here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Sequence

from peagle_contract.capture import read_records
from peagle_contract.drafter import MASK_TOKEN_WRITE_KEY, TRAINED_K_KEYS

from models.trainer import capture_samples, distill, gate

REPORT = "report.json"


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _files_digest(folder: Path) -> str:
    return _digest(*[(p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(folder.iterdir())
                     if p.is_file()])


def recipe(k: int, cpu_seconds: float | None = None):  # noqa: ANN201 - (PairRecipe, DrafterTraining)
    """The benchmark's recipe and its P-EAGLE training, trained for the stage's ``k`` (a head serves K up to the
    depth it was trained for) and with ``cpu_seconds`` as the budget when given."""
    from models.real_pair import RECIPES

    bench = RECIPES["bench"]
    training = next(h.training for h in bench.heads if h.parallel and h.layers == 1)
    training = dataclasses.replace(training, depth=int(k))
    if cpu_seconds is not None:
        training = dataclasses.replace(training, cpu_seconds=float(cpu_seconds))
    return bench, training


def _prepare(capture: Sequence[Path], *, stage: str, target_name: str, target: Path, work: Path, log) -> tuple:
    from transformers import AutoTokenizer

    records = read_records(capture, stage=stage, target=target_name)
    parts = capture_samples.split(records.records)
    folder = work / f"samples-{_digest([r['request_id'] for r in parts.training], _files_digest(target))}"
    if not (folder / distill.SAMPLES).is_file():
        tokenizer = AutoTokenizer.from_pretrained(target)
        capture_samples.write_samples(parts.training, tokenizer, folder / "partial.jsonl")
        held = [capture_samples.sample(r, tokenizer)["prompt_ids"] for r in parts.held_out]
        (folder / "held_out_prompts.json").write_text(json.dumps(held))
        (folder / "partial.jsonl").rename(folder / distill.SAMPLES)
    log(f"step: {len(records.records)} captured requests ({records.duplicates} delivered twice) -> "
        f"{len(parts.training)} to train on, {len(parts.held_out)} held out ({parts.conversations} conversations, "
        f"{len(parts.left_out_for_leaks)} left out for holding held-out text) -> {folder.name}")
    return parts, folder


def _features(samples: Path, *, target: Path, aux: list[int], top_k: int, work: Path, log) -> Path:
    folder = work / f"features-{_digest(_files_digest(samples), aux, top_k)}"
    if not (folder / "features.json").is_file():
        rows = distill.read_samples(samples / distill.SAMPLES)
        log(f"step: the target's features on {len(rows)} training requests -> {folder.name}")
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # a run killed while writing it
        distill.extract_features(target, rows, partial, aux_layer_ids=aux, top_k=top_k, log=log)
        partial.rename(folder)
    return folder


def _candidate(features_dir: Path, *, target: Path, in_service: Path, training, bench, work: Path, log) -> Path:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from models import layout
    from models.trainer.feature_batches import DraftVocab, FeatureWindows, answer_positions
    from models.trainer.train_drafters import head_weights, train_head
    from models.trainer.warm_start import load_head

    folder = work / f"candidate-{_digest(features_dir.name, _files_digest(in_service), dataclasses.asdict(training))}"
    if (folder / "config.json").is_file():
        log(f"step: the candidate, from an earlier run -> {folder.name}")
        return folder
    torch.set_num_threads(bench.threads)
    embedding = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).get_input_embeddings().weight
    served = load_head(in_service, target_embedding=embedding)
    features = distill.Features.load(features_dir)
    samples = np.arange(len(features.answer_starts))
    usable = samples[(features.offsets[1:] - features.offsets[:-1] - features.answer_starts) >= 2]
    validation = usable[:max(1, len(usable) // 10)] if training.eval_every else usable[:0]
    train = np.setdiff1d(usable, validation)
    labels = features.labels[answer_positions(features, train)]
    vocab = DraftVocab(ids=served.draft_ids, coverage=float(np.isin(labels, served.draft_ids).mean()) if len(labels)
                       else 0.0)
    vocab_size = served.head.shape.vocab_size
    windows = FeatureWindows(features, train, window=bench.window, context=bench.context, vocab=vocab,
                             vocab_size=vocab_size, soft=bench.distill_top_k > 0)
    held = FeatureWindows(features, validation, window=bench.window, context=bench.context, vocab=vocab,
                          vocab_size=vocab_size, soft=bench.distill_top_k > 0).each(len(validation)) \
        if len(validation) else None
    mask = int(served.config[MASK_TOKEN_WRITE_KEY])
    log(f"step: the candidate: the served head trained on {len(train)} requests ({training.cpu_seconds:g} CPU "
        f"seconds at most; its draft vocabulary covers {vocab.coverage:.1%} of their answers' tokens)")
    clock = time.monotonic()
    run = train_head(served.head, lambda gen: windows.batch(gen, training.batch_size), training, mask_token=mask,
                     held_out=held if training.eval_every else None, log=lambda line: log(f"  candidate: {line}"))
    reduced = len(served.draft_ids) < vocab_size  # a whole-vocabulary head has no d2t to write
    d2t = torch.from_numpy(served.draft_ids - np.arange(len(served.draft_ids))) if reduced else None
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    config = {**served.config, TRAINED_K_KEYS[0]: training.depth}  # the K it is trained for now
    layout.write_drafter(partial, config=config, weights=head_weights(served.head, d2t=d2t))
    (partial / "training.json").write_text(json.dumps({"steps": run.steps, "cpu_seconds": run.cpu_seconds,
                                                       "wall_seconds": round(time.monotonic() - clock, 1),
                                                       "stopped": run.stopped, "training_requests": int(len(train))}))
    partial.rename(folder)
    return folder


def run(*, capture: Sequence[Path], stage: str, target_name: str, target: Path, in_service: Path, work: Path,
        k: int, margin: float = 1.05, cpu_seconds: float | None = None, max_tokens: int = 128,
        log=print) -> dict:
    """Every step (each resumed where it was kept); the gate's report with the counts, written to ``work``."""
    started = time.time()
    work.mkdir(parents=True, exist_ok=True)
    bench, training = recipe(k, cpu_seconds)
    parts, samples = _prepare(capture, stage=stage, target_name=target_name, target=target, work=work, log=log)
    aux = list(json.loads((in_service / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    features = _features(samples, target=target, aux=aux, top_k=bench.distill_top_k, work=work, log=log)
    candidate = _candidate(features, target=target, in_service=in_service, training=training, bench=bench,
                           work=work, log=log)
    prompts = json.loads((samples / "held_out_prompts.json").read_text())
    result = gate.measure(target, in_service=in_service, candidate=candidate, prompts=prompts, k=k, margin=margin,
                          max_tokens=max_tokens, log=log)
    log(result.summary())
    report = {**result.report(), **parts.report(), "candidate": str(candidate),
              "training": json.loads((candidate / "training.json").read_text()),
              "minutes": round((time.time() - started) / 60, 2)}
    (work / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report
