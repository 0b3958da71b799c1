"""Acceptance at equal data: each head's acceptance per draft position as vLLM serves it, prompt by prompt,
with a bootstrap over prompts, on held-out standard-library prompts and on HumanEval.

    .venv/bin/python -m bench.acceptance [--recipe bench] [--publish]   # or as part of `make bench-real`

Each head runs in its own engine (bench/spec_rounds.py's worker: fp32, eager, greedy, natural stops, one
request at a time) at the K it was trained for, and vLLM's spec-decode counters are read around every prompt.
From a prompt's drafts ``d`` and tokens accepted at position i, ``a_i``:

* ``a_i / d`` is the share of drafts with at least i tokens accepted, so ``AL(k) = 1 + sum_{i <= k} a_i / d``
  for every k up to the trained K, and the conditional acceptance at i is ``a_i / a_(i-1)``;
* figures pool the prompts (counts summed, then divided); 90% intervals resample prompts, and a ratio between
  two heads resamples the same prompts for both (paired).

AL at a k below the trained K is read from the same drafts: a draft's first k tokens do not depend on K
(EAGLE-3 drafts them one after another, P-EAGLE's attention is causal), but with another K the steps start
at other tokens, so it is an estimate of a run at that K; the end-to-end screen (bench/real_spec.py) measures
each K directly and its report sets the two side by side.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from bench import prompt_sets, spec_rounds, spec_runs
# pooled: not used here, but the acceptance tests read it through this module beside the rest.
from models.acceptance_stats import acceptance_length, counts, paired_ratio, pooled, summary  # noqa: F401

# HumanEval, besides the end-to-end run's problems (which this set always holds, so the cost model can be fed
# acceptance measured on exactly the prompts it predicts): this many more, spread over the 164.
HUMANEVAL_SPREAD = 48


def humaneval_set(tokenizer, e2e_problems: int) -> tuple[list[list[int]], list[str], list[int]]:
    """HumanEval prompts for acceptance: the end-to-end run's ``e2e_problems`` problems and
    ``HUMANEVAL_SPREAD`` more spread over the set (distinct, in the set's order); their task ids; and the
    positions of the end-to-end run's problems in that list."""
    picked, positions = humaneval_indexes(e2e_problems)
    prompts, problems = prompt_sets.humaneval(tokenizer, picked)
    return prompts, problems, positions


def humaneval_indexes(e2e_problems: int) -> tuple[list[int], list[int]]:
    """(the HumanEval indexes measured, where the end-to-end run's problems sit among them)."""
    e2e = prompt_sets.spread(prompt_sets.HUMANEVAL_PROBLEMS, e2e_problems)
    picked = sorted(set(e2e) | set(prompt_sets.spread(prompt_sets.HUMANEVAL_PROBLEMS, HUMANEVAL_SPREAD)))
    return picked, [picked.index(i) for i in e2e]


def label(name: str) -> str:
    """A head's label in the reports: its folder's name with dashes (p_eagle_2l -> p-eagle-2l)."""
    return name.replace("_", "-")


def heads(pair, k: int | None = None) -> dict[str, tuple[str, bool, int]]:
    """label -> (head folder's name, parallel drafting, K), for every head of the pair: the serving head is
    "p-eagle", the EAGLE-3 head "eagle3" (as in ModelPair.compared_heads), others by folder. K is the one each
    head's config.json says it was trained for, or ``k`` for every head."""
    from peagle_contract.drafter import trained_k

    out = {}
    for name, (folder, parallel) in pair.heads().items():
        found = trained_k(json.loads((folder / "config.json").read_text()))
        if found is None and k is None:
            raise ValueError(f"{name}/config.json states no trained K; give one")
        role = "p-eagle" if folder == pair.drafter else "eagle3" if folder == pair.eagle3_drafter else label(name)
        out[role] = (name, parallel, k if k is not None else found[1])
    return out


def measure(pair, sets: dict[str, list[list[int]]], *, max_tokens: int, workdir: Path, warmup: list[int],
            k: int | None = None, max_model_len: int = 2048, log=print) -> dict[str, dict[str, list[dict]]]:
    """{head label: {set name: per-prompt counts}}: one engine per head (at its trained K, or ``k``), every
    prompt of every set."""
    out: dict[str, dict[str, list[dict]]] = {}
    for head, (name, parallel, k) in heads(pair, k).items():
        spec = pair.speculative_config(k, parallel=parallel, head=None if name == pair.drafter.name or not parallel
                                       else name)
        config = {"name": f"{head}-k{k}", "target": str(pair.target), "warmup_prompt": warmup,
                  "max_tokens": max_tokens, "max_model_len": max_model_len, "max_num_seqs": 1,
                  "speculative_config": spec}
        workers = spec_rounds.start_workers([config], workdir)
        try:
            worker = workers[config["name"]]
            out[head] = {}
            for set_name, prompts in sets.items():
                started = time.time()
                out[head][set_name] = [counts(worker.run([p], concurrency=1), k) for p in prompts]
                rows = out[head][set_name]
                log(f"        {head} on {set_name}: {len(rows)} prompts, AL(K={k}) "
                    f"{acceptance_length(rows, k):.3f}, {time.time() - started:.0f} s")
        finally:
            spec_rounds.close_workers(workers)
    return out


def report(measured: dict[str, dict[str, list[dict]]], trained: dict[str, int], *, e2e_positions: list[int]) -> dict:
    """Per head and set: the pooled figures with intervals; on HumanEval, also on the end-to-end run's problems
    alone; and P-EAGLE (one layer) over EAGLE-3 at every shared K, paired."""
    out: dict = {"heads": {}, "p_eagle_over_eagle3": {}}
    for head, sets in measured.items():
        k = trained[head]
        out["heads"][head] = {"trained_k": k, **{name: summary(rows, k) for name, rows in sets.items()}}
        if "humaneval" in sets:
            out["heads"][head]["humaneval_e2e_problems"] = summary([sets["humaneval"][i] for i in e2e_positions], k)
    if {"p-eagle", "eagle3"} <= set(measured):
        shared = min(trained["p-eagle"], trained["eagle3"])
        for set_name in measured["p-eagle"]:
            out["p_eagle_over_eagle3"][set_name] = {
                f"k{k}": paired_ratio(measured["p-eagle"][set_name], measured["eagle3"][set_name], k)
                for k in range(1, shared + 1)}
    return out


def goals(figures: dict) -> dict:
    """accept_ratio_k3 / _k4: P-EAGLE AL over EAGLE-3 AL on HumanEval (one layer each, the same data and CPU
    time); met when the interval's lower bound is at least 0.95."""
    out = {}
    ratios = figures.get("p_eagle_over_eagle3", {}).get("humaneval", {})
    for k in (3, 4):
        if f"k{k}" in ratios:
            r = ratios[f"k{k}"]
            out[f"accept_ratio_k{k}"] = {"goal": "interval lower bound >= 0.95", **r, "met": r["interval"][0] >= 0.95}
    return out


def part_key(pair, *, recipe: str, e2e_problems: int, stdlib_prompts: int, max_tokens: int) -> dict:
    """What a report depends on: the heads' cache entries and the settings (bench/real_spec.py takes a report
    with the same key instead of measuring again)."""
    return {"heads": pair.head_entries(), "recipe": recipe, "e2e_problems": e2e_problems,
            "stdlib_prompts": stdlib_prompts, "max_tokens": max_tokens}


def run_and_write(pair, *, recipe: str, e2e_problems: int, stdlib_prompts: int, max_tokens: int, out_dir: Path,
                  command: str) -> dict:
    """Measure every head of a pair of recipe ``recipe``; write ``out_dir``/acceptance.json and return it as
    written (a JSON round trip, so a fresh report and a reused one read alike)."""
    from transformers import AutoTokenizer

    from models import real_pair

    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    humaneval, problems, e2e_positions = humaneval_set(tokenizer, e2e_problems)
    stdlib = real_pair.held_out_prompts(recipe, stdlib_prompts)
    measured = measure(pair, {"stdlib_held_out": stdlib, "humaneval": humaneval}, max_tokens=max_tokens,
                       workdir=out_dir / "acceptance_engines", warmup=prompt_sets.warmup(tokenizer))
    trained = {head: k for head, (_, _, k) in heads(pair).items()}
    figures = report(measured, trained, e2e_positions=e2e_positions)
    body = spec_runs.header(command=command, settings={"max_tokens": max_tokens, "stops": "natural (EOS) or the cap",
                                                       "concurrency": 1})
    body.update({
        "part_key": part_key(pair, recipe=recipe, e2e_problems=e2e_problems, stdlib_prompts=stdlib_prompts,
                             max_tokens=max_tokens),
        "recipe": recipe, "head_entries": pair.head_entries(),
        "prompt_sets": {"stdlib_held_out": f"{len(stdlib)} of the recipe's held-out answers' prompts (never "
                                           "trained on, never used for early stopping)",
                        "humaneval": f"{len(humaneval)} HumanEval problems: the end-to-end run's {e2e_problems} "
                                     f"and {HUMANEVAL_SPREAD} spread over the 164"},
        "humaneval_problems": problems, "e2e_positions": e2e_positions,
        "per_prompt": measured, **figures, "goals": goals(figures), "seconds": round(time.time() - started)})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "acceptance.json"
    path.write_text(json.dumps(spec_runs.portable(body), indent=1) + "\n")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.acceptance", description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="bench")
    parser.add_argument("--e2e-problems", type=int, default=16, help="the end-to-end run's HumanEval problems")
    parser.add_argument("--stdlib-prompts", type=int, default=32, help="held-out standard-library prompts")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", default=str(spec_runs.RESULTS_DIR))
    parser.add_argument("--publish", action="store_true", help="also copy the report to bench/figures/")
    args = parser.parse_args(argv)
    from models import real_pair

    written = run_and_write(real_pair.build(args.recipe), recipe=args.recipe, e2e_problems=args.e2e_problems,
                            stdlib_prompts=args.stdlib_prompts, max_tokens=args.max_tokens, out_dir=Path(args.out),
                            command="python -m bench.acceptance " + " ".join(argv))
    if args.publish:
        shutil.copy(Path(args.out) / "acceptance.json", spec_runs.REPO_ROOT / "bench" / "figures" / "acceptance.json")
    print(json.dumps(written["goals"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
