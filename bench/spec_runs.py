"""What the speculative-decoding benchmarks share: one vLLM engine per configuration in a child process, the
counters read inside it, the comparison with plain decoding, the table, the plot and the report header.

bench/cpu_spec.py (the trained toy pair) runs its configurations one after another here; bench/real_spec.py
(SmolLM2-135M-Instruct on HumanEval) runs them in interleaved rounds (bench/spec_rounds.py) and takes the
configurations, the counters, the plot and the report header from here.

Per configuration (same engine settings for all: fp32, enforce_eager, greedy; the same prompts, sent
``concurrency`` at a time):
- output tokens/s over the timed requests (after a warm-up request), wall time and process CPU time;
- acceptance length from vLLM's own spec-decode counters: AL = 1 + accepted / drafts, and the acceptance
  rate per draft position;
- drafter forward passes per decoding step and target forward passes per output token, and the time in
  each, from forward hooks on the two nn.Modules inside the engine (in-process engine core);
- whether every request's greedy tokens equal plain decoding's.

    python -m bench.spec_runs --child CONFIG --child-out RESULT   # one configuration (what run_config starts)
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from models import spec_metrics
from models.cpu_engine import cpu_engine_environment, exact_engine_kwargs

REPO_ROOT = Path(__file__).resolve().parent.parent

# What every engine of a run gets on top of the CPU settings (Intel OpenMP preloaded, plain runs too).
BENCH_ENV = {
    "PEAGLE_FUSED_DRAFT": "0",
    # Engine core in this process, so forward hooks can be installed on the models.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


# ---------------------------------------------------------------------------------------------------
# child: one engine, one configuration
# ---------------------------------------------------------------------------------------------------

def install_counters(worker) -> bool:
    """Runs inside the worker: count forward calls of the target and drafter models, and time them."""
    import time as _time

    runner = worker.model_runner
    counts = {"target": 0, "drafter": 0, "target_s": 0.0, "drafter_s": 0.0}

    def watch(module, key):
        started = []
        module.register_forward_pre_hook(lambda _m, _a: started.append(_time.perf_counter()))

        def done(_module, _args, _output):
            counts[key] += 1
            counts[key + "_s"] += _time.perf_counter() - started.pop()
        module.register_forward_hook(done)

    watch(runner.model, "target")
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and hasattr(drafter, "model"):
        watch(drafter.model, "drafter")
    # All of drafting, as the runner calls it once per step: the drafter's input build, its forward passes,
    # its LM head and the draft choice. The forward hooks above see the passes' layers only.
    propose = getattr(runner, "propose_draft_token_ids", None)
    counts.update(drafting=0, drafting_s=0.0)
    if propose is not None and drafter is not None:
        def timed(*args, **kwargs):
            t0 = _time.perf_counter()
            try:
                return propose(*args, **kwargs)
            finally:
                counts["drafting"] += 1
                counts["drafting_s"] += _time.perf_counter() - t0
        runner.propose_draft_token_ids = timed
    worker._bench_counts = counts
    return True


def read_counters(worker) -> dict:
    return dict(worker._bench_counts)


def as_prompt(prompt):
    """A text prompt, or token ids (a chat template already applied) as vLLM's token prompt."""
    return {"prompt_token_ids": prompt} if isinstance(prompt, list) else prompt


RESULTS_DIR = REPO_ROOT / "bench" / "results"


def sweep(base: dict, pair, *, eagle3_k, p_eagle_k, heads: dict[str, str | None], suffix: str = "") -> list[dict]:
    """The configurations of one run, each ``base`` plus its own fields: plain, EAGLE-3 at each K, each
    P-EAGLE head at each K, then plain again - the machine is shared, so the baseline is the mean of both
    plain runs and the gap between them is reported as the drift over the run. ``heads``: config label ->
    the pair's head for ``pair.speculative_config`` (None: its serving drafter). Each configuration names
    the head folder it drafts with."""
    out = [dict(base, name="plain" + suffix, method="plain", k=0, speculative_config=None)]
    for k in eagle3_k:
        out.append(dict(base, name=f"eagle3-k{k}{suffix}", method="eagle3", k=k, head=pair.eagle3_drafter.name,
                        speculative_config=pair.speculative_config(k, parallel=False)))
    for label, head in heads.items():
        folder = (pair.drafter if head is None else pair.other_drafters[head]).name
        for k in p_eagle_k:
            out.append(dict(base, name=f"{label}-k{k}{suffix}", method="p-eagle", k=k, head=folder,
                            speculative_config=pair.speculative_config(k, parallel=True, head=head)))
    out.append(dict(base, name="plain-end" + suffix, method="plain", k=0, speculative_config=None))
    return out


def run_child(config: dict) -> dict:
    from vllm import LLM, SamplingParams

    concurrency = int(config.get("concurrency", 1))
    kwargs = exact_engine_kwargs(config["target"], max_model_len=int(config.get("max_model_len", 1024)),
                                 max_num_seqs=max(4, concurrency), disable_log_stats=False,
                                 speculative_config=config["speculative_config"])
    started = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=config["max_tokens"],
                            ignore_eos=bool(config.get("ignore_eos", True)))
    llm.generate([as_prompt(config["warmup_prompt"])], params, use_tqdm=False)
    llm.collective_rpc(install_counters)
    before = spec_metrics.from_engine(llm.get_metrics())
    prompts = [as_prompt(p) for p in config["prompts"]]
    groups = [prompts[i:i + concurrency] for i in range(0, len(prompts), concurrency)]
    outputs: list[list[int]] = []
    texts: list[str] = []
    walls: list[float] = []
    cpus: list[float] = []
    # Round 1 feeds the counters; later rounds only repeat the timing. The machine is shared, so the fastest
    # round is the figure least disturbed by other jobs (the usual min-of-N for noisy timing).
    for round_no in range(config.get("rounds", 1)):
        elapsed = cpu = 0.0
        round_outputs = []
        for group in groups:
            t0, c0 = time.perf_counter(), time.process_time()
            results = llm.generate(group, params, use_tqdm=False)
            elapsed += time.perf_counter() - t0
            cpu += time.process_time() - c0
            for result in results:
                round_outputs.append(list(result.outputs[0].token_ids))
                if round_no == 0:
                    texts.append(result.outputs[0].text)
        if round_no == 0:
            outputs = round_outputs
            after = spec_metrics.from_engine(llm.get_metrics())
            passes = llm.collective_rpc(read_counters)[0]
            first_round_s = elapsed
        elif round_outputs != outputs:
            raise RuntimeError(f"{config['name']}: greedy output changed between rounds")
        walls.append(elapsed)
        cpus.append(cpu)
    elapsed, cpu = min(walls), min(cpus)
    out_tokens = sum(len(o) for o in outputs)
    spec = after - before
    drafts, accepted = spec.drafts, spec.accepted
    return {
        "name": config["name"], "method": config["method"], "k": config["k"], "head": config.get("head"),
        "concurrency": concurrency,
        "engine_start_s": round(start_s, 1), "generate_s": round(elapsed, 3),
        "rounds_s": [round(w, 3) for w in walls],
        "output_tokens": out_tokens, "tokens_per_s": round(out_tokens / elapsed, 2),
        # CPU seconds of this (single) engine process: less sensitive than wall time to other jobs' load.
        "cpu_s": round(cpu, 3), "tokens_per_cpu_s": round(out_tokens / cpu, 2),
        "target_forward_s": round(passes["target_s"], 3), "drafter_forward_s": round(passes["drafter_s"], 3),
        "drafter_share_of_time": round(passes["drafter_s"] / first_round_s, 3),
        "target_share_of_time": round(passes["target_s"] / first_round_s, 3),
        "target_forward_ms": round(1000 * passes["target_s"] / max(passes["target"], 1), 3),
        "drafter_forward_ms": round(1000 * passes["drafter_s"] / max(passes["drafter"], 1), 3),
        # Drafter time per decoding step: what "equal drafter time per step" compares.
        "drafter_ms_per_step": round(1000 * passes["drafter_s"] / max(passes["target"], 1), 3),
        "drafts": drafts, "draft_tokens": spec.draft_tokens, "accepted": accepted,
        "acceptance_length": round(spec.acceptance_length, 3) if drafts else None,
        "accepted_per_position": [round(x, 3) for x in spec.per_position_rates()],
        "target_forwards": passes["target"], "drafter_forwards": passes["drafter"],
        "target_forwards_per_output_token": round(passes["target"] / out_tokens, 4),
        # A step is one target forward (prefill or verify); the drafter runs after each, prefill included.
        "drafter_forwards_per_step": round(passes["drafter"] / passes["target"], 3),
        "token_ids": outputs, "texts": texts,
    }


def child_main(argv: list[str]) -> int:
    """``--child CONFIG --child-out RESULT``: what the parent starts for each configuration."""
    config, out = argv[argv.index("--child") + 1], argv[argv.index("--child-out") + 1]
    Path(out).write_text(json.dumps(run_child(json.loads(Path(config).read_text()))))
    return 0


# ---------------------------------------------------------------------------------------------------
# parent: orchestrate, compare, report
# ---------------------------------------------------------------------------------------------------

def run_config(config: dict, workdir: Path) -> dict:
    """One configuration in a fresh child process (``python -m bench.spec_runs --child``): its own engine,
    counters from zero."""
    cfg_path = workdir / f"{config['name']}.config.json"
    out_path = workdir / f"{config['name']}.result.json"
    cfg_path.write_text(json.dumps(config))
    env = {**cpu_engine_environment(), **BENCH_ENV, "PYTHONPATH": str(REPO_ROOT)}
    log_path = workdir / f"{config['name']}.log"
    with log_path.open("w") as log:
        proc = subprocess.run([sys.executable, "-m", "bench.spec_runs", "--child", str(cfg_path), "--child-out",
                               str(out_path)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    if proc.returncode != 0 or not out_path.is_file():
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"config {config['name']} failed (exit {proc.returncode}); log tail:\n{tail}")
    return json.loads(out_path.read_text())


def merge_cycles(best: dict | None, new: dict) -> dict:
    """Keep the faster timing of two runs of one config; counters and tokens must be the same in both."""
    if best is None:
        return dict(new, cycles_generate_s=[new["generate_s"]])
    if new["token_ids"] != best["token_ids"] or new["acceptance_length"] != best["acceptance_length"]:
        raise RuntimeError(f"{new['name']}: output or acceptance changed between cycles")
    merged = dict(best, cycles_generate_s=best["cycles_generate_s"] + [new["generate_s"]])
    if new["generate_s"] < best["generate_s"]:
        for key in ("generate_s", "tokens_per_s", "target_forward_s", "drafter_forward_s", "drafter_share_of_time",
                    "target_share_of_time", "target_forward_ms", "drafter_forward_ms", "drafter_ms_per_step",
                    "rounds_s"):
            if key in new:
                merged[key] = new[key]
    if new["tokens_per_cpu_s"] > best["tokens_per_cpu_s"]:
        merged["cpu_s"], merged["tokens_per_cpu_s"] = new["cpu_s"], new["tokens_per_cpu_s"]
    return merged


def run_all(configs: list[dict], workdir: Path, *, cycles: int = 1) -> list[dict]:
    """Every config ``cycles`` times, round robin (each then spans different moments of the shared machine's
    load); each keeps its fastest timing."""
    workdir.mkdir(parents=True, exist_ok=True)
    by_name: dict[str, dict] = {}
    started = time.time()
    for cycle in range(cycles):
        for config in configs:
            print(f"[{time.time() - started:5.0f}s] cycle {cycle + 1}/{cycles}: {config['name']} ...", flush=True)
            r = run_config(config, workdir)
            print(f"        {r['tokens_per_s']} tok/s, AL {r['acceptance_length']}, "
                  f"engine start {r['engine_start_s']} s", flush=True)
            by_name[config["name"]] = merge_cycles(by_name.get(config["name"]), r)
    return [by_name[c["name"]] for c in configs]


def summarise(results: list[dict]) -> dict:
    """Ratios between the configurations of one run; ``identical_to_plain`` set on each result."""
    plains = [r for r in results if r["method"] == "plain"]
    plain = plains[0]
    baseline = sum(r["tokens_per_s"] for r in plains) / len(plains)
    cpu_baseline = sum(r["tokens_per_cpu_s"] for r in plains) / len(plains)
    for r in results:
        r["identical_to_plain"] = r["token_ids"] == plain["token_ids"]
        r["speedup_vs_plain"] = round(r["tokens_per_s"] / baseline, 3)
        r["cpu_speedup_vs_plain"] = round(r["tokens_per_cpu_s"] / cpu_baseline, 3)
    eagle3 = [r for r in results if r["method"] == "eagle3"]
    peagle = [r for r in results if r["method"] == "p-eagle"]
    best_e3 = max(eagle3, key=lambda r: r["tokens_per_s"]) if eagle3 else None
    best_p = max(peagle, key=lambda r: r["tokens_per_s"]) if peagle else None
    summary: dict = {"all_identical_to_plain": all(r["identical_to_plain"] for r in results),
                     "plain_tokens_per_s_baseline": round(baseline, 2),
                     "plain_drift_end_over_start": round(plains[-1]["tokens_per_s"] / plain["tokens_per_s"], 3)}
    if best_e3:
        summary["eagle3_best_k"] = best_e3["k"]
        summary["eagle3_best_vs_plain"] = best_e3["speedup_vs_plain"]
    if best_p:
        summary["p_eagle_best"] = best_p["name"]
        summary["p_eagle_best_k"] = best_p["k"]
        summary["p_eagle_best_vs_plain"] = best_p["speedup_vs_plain"]
        summary["p_eagle_best_vs_plain_cpu_time"] = best_p["cpu_speedup_vs_plain"]
        if best_e3:
            summary["p_eagle_best_vs_eagle3_best"] = round(best_p["tokens_per_s"] / best_e3["tokens_per_s"], 3)
            summary["p_eagle_best_vs_eagle3_best_cpu_time"] = round(
                best_p["tokens_per_cpu_s"] / best_e3["tokens_per_cpu_s"], 3)
    for r in peagle:
        match = next((e for e in eagle3 if e["k"] == r["k"]), None)
        label = r["name"].rsplit("-k", 1)[0].replace("-", "_")
        if match and match["acceptance_length"] and r["acceptance_length"]:
            summary[f"al_ratio_{label}_over_eagle3_k{r['k']}"] = round(
                r["acceptance_length"] / match["acceptance_length"], 3)
        if best_e3:
            summary[f"tokens_per_s_ratio_{label}_k{r['k']}_over_eagle3_best"] = round(
                r["tokens_per_s"] / best_e3["tokens_per_s"], 3)
    return summary


def table(results: list[dict]) -> str:
    head = (f"{'config':<18} {'K':>2} {'tok/s':>8} {'x plain':>8} {'tok/cpu-s':>10} {'x plain':>8} {'AL':>6} "
            f"{'drafter fw/step':>16} {'drafter ms/step':>16} {'target fw/out tok':>18} {'same as plain':>14}")
    lines = [head, "-" * len(head)]
    for r in results:
        al = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
        lines.append(f"{r['name']:<18} {r['k']:>2} {r['tokens_per_s']:>8.1f} {r['speedup_vs_plain']:>8.2f} "
                     f"{r['tokens_per_cpu_s']:>10.1f} {r['cpu_speedup_vs_plain']:>8.2f} {al:>6} "
                     f"{r['drafter_forwards_per_step']:>16.2f} {r.get('drafter_ms_per_step', 0.0):>16.2f} "
                     f"{r['target_forwards_per_output_token']:>18.3f} {str(r['identical_to_plain']):>14}")
    return "\n".join(lines)


def _series(results: list[dict]) -> list[tuple[str, list[dict]]]:
    """One line per drafter (and concurrency): the config names without their K."""
    names: dict[str, list[dict]] = {}
    for r in results:
        if r["method"] != "plain":
            names.setdefault(re.sub(r"-k\d+", "", r["name"]), []).append(r)
    return [(name, sorted(rows, key=lambda r: r["k"])) for name, rows in names.items()]


def plot(results: list[dict], path: Path, *, title: str) -> None:
    """Tokens/s and AL versus K, one line per drafter, and the acceptance rate per draft position."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plains = [r for r in results if r["method"] == "plain"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for name, rows in _series(results):
        ks = [r["k"] for r in rows]
        axes[0].plot(ks, [r["tokens_per_s"] for r in rows], "o-", label=name)
        axes[1].plot(ks, [r["acceptance_length"] or 1.0 for r in rows], "o-", label=name)
        deepest = max(rows, key=lambda r: r["k"])
        rates = deepest["accepted_per_position"]
        axes[2].plot(range(1, len(rates) + 1), rates, "o-", label=f"{name} (K={deepest['k']})")
    for concurrency in sorted({r.get("concurrency", 1) for r in plains}):
        same = [r["tokens_per_s"] for r in plains if r.get("concurrency", 1) == concurrency]
        axes[0].axhline(sum(same) / len(same), color="grey", linestyle="--" if concurrency == 1 else ":",
                        label=f"plain decoding (concurrency {concurrency})")
    for ax, (xlabel, ylabel, sub) in zip(axes, (
            ("K (draft tokens per step)", "output tokens / s (wall)", "Throughput"),
            ("K (draft tokens per step)", "acceptance length", "Acceptance length (vLLM counters)"),
            ("draft position", "accepted / drafted", "Acceptance per position"))):
        ax.set(xlabel=xlabel, ylabel=ylabel, title=sub)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def portable(value):
    """A value for a committed report: this machine's paths replaced by their meaning (no absolute paths)."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and os.sep in value:
        from models.cache import CACHE_DIR

        for root, name in ((str(CACHE_DIR), "<model cache>"), (sys.prefix, "<venv>"), (str(REPO_ROOT), "<repo>")):
            value = value.replace(root, name)
    return value


def header(*, command: str, settings: dict) -> dict:
    """Where, when and how the figures were measured (the machine is named by its kind, not its paths)."""
    environment = {**cpu_engine_environment({}), **BENCH_ENV}
    return {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "date": datetime.date.today().isoformat(),
        "command": command,
        "settings": portable({"dtype": "float32", "enforce_eager": True, "greedy": True, **settings,
                              "intel_openmp_preloaded": "libiomp5" in environment.get("LD_PRELOAD", ""),
                              "environment": environment}),
    }


def write_report(report: dict, results: list[dict], out_dir: Path, name: str, *, title: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {**report, "results": [{k: v for k, v in r.items() if k not in ("token_ids", "texts")} for r in results]}
    (out_dir / f"{name}.json").write_text(json.dumps(portable(body), indent=2) + "\n")
    plot(results, out_dir / f"{name}.png", title=title)


if __name__ == "__main__":  # the child run_config starts: its vLLM engine is built under this guard
    sys.exit(child_main(sys.argv[1:]))
