"""The whole product on this machine, in one command (`make demo`).

    python -m demo [--models real|toy|random] [--requests 6] [--max-tokens 96] [--k K]

1. Synthesizes every stage once (the cdk-nag packs run as validation plugins during synth) and runs
   cfn-lint on every template.
2. Deploys the Dev stage to an embedded AWS (moto's server + our CloudFormation extension) with the real
   CDK CLI and checks what each service holds (ops.deploy).
3. Starts the serving runtime on the CPU the way the image does (peagle_runtime.entrypoint, SM_VLLM_*
   variables, P-EAGLE speculative config) on a real pretrained model, SmolLM2-135M-Instruct, with its P-EAGLE
   head (models.real_pair: the benchmark's head when built, else the smaller demo recipe, built on first use
   in about 10 minutes on 2 cores), and beside it vLLM's own server with plain decoding on the same target.
   K is the one measured fastest on this machine for that head (when the pair was built, or by the committed
   benchmark, bench/figures/real_spec.json), else the Dev stage's; ``--k`` overrides, and the Dev stage
   itself keeps the K its GPU preset wants. ``--models toy`` serves the toy pair, ``--models random`` random
   weights.
4. Streams HumanEval coding problems (never in the heads' training data) through the SageMaker contract
   (POST /invocations, chat messages, ``stream: true``) to both servers and prints them side by side: time to
   first token, tokens per second, whether the greedy text is the same, the acceptance length (AL = 1 +
   accepted / drafts, from vLLM's spec-decode counters on /metrics) and the acceptance per draft position.
5. Tears everything down - runtime, stacks, emulator - also on failure and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from peagle_contract.serving import ServingConfig

from harness.aws import server
from harness.client import InvocationError, StreamResult, stream_invocation
from harness.ports import free_port
from harness.runtime import LocalRuntime, RuntimeStartError, on_this_cpu
from models import spec_metrics
from ops import cdk, deploy

REPO = cdk.REPO_ROOT
WORK = REPO / ".cache" / "demo"
DEMO_IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/peagle-runtime:demo"


class DemoError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------------


class Steps:
    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0
        self.t0 = time.monotonic()
        self.timings: list[tuple[str, float]] = []

    def start(self, title: str) -> float:
        self.n += 1
        print(f"\n[{self.n}/{self.total}] {title}", flush=True)
        return time.monotonic()

    def done(self, title: str, started: float) -> None:
        took = time.monotonic() - started
        self.timings.append((title, took))
        print(f"      {title}: {took:.1f} s", flush=True)


class Ticker:
    """A one-line 'still working' indicator for waits that print nothing (engine start, training)."""

    def __init__(self, label: str, status=lambda: "") -> None:
        self.label, self.status = label, status
        self.done = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.tty = sys.stdout.isatty()

    def _run(self) -> None:
        last_print = 0.0
        while not self.done.wait(1.0):
            elapsed = time.monotonic() - self.started
            line = f"      ... {self.label} {elapsed:4.0f} s {self.status()}"[:110]
            if self.tty:
                sys.stdout.write("\r" + line.ljust(110))
                sys.stdout.flush()
            elif elapsed - last_print >= 15:  # logs and CI: a line every 15 s
                print(line, flush=True)
                last_print = elapsed

    def __enter__(self) -> "Ticker":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        if self.tty:
            sys.stdout.write("\r" + " " * 110 + "\r")
            sys.stdout.flush()


# --------------------------------------------------------------------------------------------------
# 1. synth + validate
# --------------------------------------------------------------------------------------------------


def synth_and_validate(assembly: Path) -> list[dict]:
    """Synthesize every stage (nag runs as a validation plugin) and cfn-lint each template."""
    from stacks.environments import ENVIRONMENTS

    with Ticker("cdk synth (all stages, cdk-nag validation)"):
        proc = cdk.synth(assembly, context={"imageUri": DEMO_IMAGE_URI, "offline": "true"}, label=None, check=False)
    nag = _nag_summary(assembly)
    if proc.returncode != 0:
        tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()[-25:])
        raise DemoError(f"cdk synth failed (exit {proc.returncode}); nag findings: {nag or 'see below'}\n{tail}")
    rows = []
    stacks = cdk.list_stacks(assembly)
    missing = [env.name for env in ENVIRONMENTS if not any(s.stage == env.name for s in stacks)]
    if missing:
        raise DemoError(f"the app has no stage {missing}; stages: {sorted({s.stage for s in stacks})}")
    # One cfn-lint run for every template (it starts slowly); its exit status is a bit mask:
    # 2 = errors, 4 = warnings, 8 = informational, 1 = cfn-lint itself failed.
    lint_cmd = [str(Path(sys.executable).parent / "cfn-lint"), "--format", "parseable"]
    lint = subprocess.run(lint_cmd + [str(s.template_path) for s in stacks], capture_output=True, text=True)
    findings = [line for line in lint.stdout.splitlines() if line.strip()]
    if lint.returncode & 3:
        raise DemoError(f"cfn-lint found errors (exit {lint.returncode}):\n"
                        + "\n".join((findings or lint.stderr.splitlines())[:20]))
    for stack in stacks:
        mine = [f for f in findings if f.startswith(str(stack.template_path))]
        rows.append({
            "stack": stack.display_name,
            "resources": len(stack.template().get("Resources", {})),
            "lint": "clean" if not mine else f"{len(mine)} warning(s)",
            "nag": nag.get(stack.stage, "pass"),
        })
    return rows


def _nag_summary(assembly: Path) -> dict[str, str]:
    """Per stage: open findings from the validation report (synth fails on any), else the number of
    findings acknowledged with a reason in the stack metadata."""
    out: dict[str, str] = {}
    report_path = assembly / "validation-report.json"
    if report_path.exists():
        for plugin in json.loads(report_path.read_text()).get("pluginReports", []):
            for violation in plugin.get("violations", []):
                for res in violation.get("violatingConstructs", []) or violation.get("violatingResources", []):
                    path = (res.get("constructPath", "") if isinstance(res, dict) else str(res)).lstrip("/")
                    stage = path.split("/")[0] if path else "?"
                    out[stage] = out.get(stage, "FAIL:") + f" {violation.get('ruleName')}"
    for stack in cdk.list_stacks(assembly):
        if stack.stage in out:
            continue
        metadata = stack.template_path.with_name(f"{stack.artifact_id}.metadata.json")
        acknowledged = 0
        if metadata.exists():
            for entries in json.loads(metadata.read_text()).values():
                acknowledged += sum(len(e.get("data") or {}) for e in entries if e.get("type") == "aws:cdk:acknowledged-rules")
        out[stack.stage] = f"pass ({acknowledged} acknowledged)"
    return out


# --------------------------------------------------------------------------------------------------
# 3. models and runtime
# --------------------------------------------------------------------------------------------------


@dataclass
class Pair:
    kind: str
    target: Path
    drafter: Path
    chat: bool  # an instruct model: requests go as chat messages
    serve_k: dict | None = None  # the real pair's K measured fastest on this machine when its head was built
    bench_k: dict | None = None  # else the committed benchmark's fastest K for this very head


def _log(line: str) -> None:
    print("      " + line, flush=True)


def model_pair(kind: str) -> Pair:
    from models import toy_pair, real_pair, random_pair

    if kind == "real":
        pair = real_pair.existing("bench")
        if pair is not None:
            return Pair("SmolLM2-135M-Instruct + the benchmark's P-EAGLE head", pair.target, pair.drafter, True,
                        pair.report().get("serve_k"))
        if real_pair.existing("demo") is None:
            print("      building the real pair once (cached under ~/.cache/peagle/models): the target from its "
                  "wheel, its answers to 160 coding tasks, its features, one P-EAGLE head and vLLM's measure "
                  "of its acceptance")
        pair = real_pair.build("demo", log=_log)
        return Pair("SmolLM2-135M-Instruct + the demo recipe's P-EAGLE head", pair.target, pair.drafter, True,
                    pair.report().get("serve_k"), benchmark_k(pair.drafter))
    if kind == "toy":
        pair = toy_pair.existing_pair()
        if pair is None:
            print("      training the toy pair once (cached under ~/.cache/peagle/models; ~6 min on 2 idle cores)")
            pair = toy_pair.build(log=lambda *a, **k: _log(" ".join(str(x) for x in a)))
        return Pair("toy pair (trained here)", pair.target, pair.drafter, False)
    pair = random_pair.build()
    return Pair("random weights (untrained: expect AL near 1)", pair.target, pair.drafter, False)


def dev_serving() -> ServingConfig:
    """The Dev stage's serving config: the typed object its stack renders into the model's environment."""
    from stacks.environments import ENVIRONMENTS

    return next(config.model.serving for config in ENVIRONMENTS if config.name == "Dev")


BENCH_REPORT = REPO / "bench" / "figures" / "real_spec.json"


def benchmark_k(drafter: Path) -> dict | None:
    """The committed benchmark's fastest P-EAGLE configuration at concurrency 1, when it measured this very head
    (the same cache entry, so the same weights); else None."""
    try:
        report = json.loads(BENCH_REPORT.read_text())
    except (OSError, ValueError):
        return None
    best = report.get("final", {}).get("concurrency_1", {}).get("p-eagle")
    if not best or report.get("head_entries", {}).get(best.get("head")) != drafter.resolve().name:
        return None
    return {"k": int(best["k"]), "speedup_vs_plain": best["speedup_vs_plain"],
            "ci90": best["speedup_vs_plain_90ci"], "date": report.get("date"), "rounds": best["rounds"]}


def choose_k(pair: Pair, dev: ServingConfig, override: int | None) -> tuple[int, str]:
    """(K to serve, why): --k if given; else the K measured fastest on this machine for this head (when the
    pair was built, or by the committed benchmark); else the Dev stage's. The Dev stage itself keeps the K
    its GPU preset wants."""
    dev_k = dev.num_speculative_tokens
    if override is not None:
        return override, f"--k {override} (the Dev stage deploys K = {dev_k})"
    if pair.serve_k:
        speeds = ", ".join(f"{name.upper()} {tps:.1f}" for name, tps in pair.serve_k["tokens_per_s"].items())
        return int(pair.serve_k["k"]), (
            f"the fastest K on this machine, measured when the head was built (tok/s on held-out prompts: plain "
            f"{pair.serve_k['plain_tokens_per_s']:.1f}, {speeds}); the Dev stage deploys K = {dev_k}, what its GPU "
            "preset wants")
    if pair.bench_k:
        b = pair.bench_k
        return int(b["k"]), (
            f"the fastest K for this head in the committed benchmark (bench/figures/real_spec.json, {b['date']}: "
            f"{b['speedup_vs_plain']:.2f}x plain decoding at concurrency 1, 90% interval {b['ci90'][0]:.2f}-"
            f"{b['ci90'][1]:.2f} over {b['rounds']} rounds); the Dev stage deploys K = {dev_k}, what its GPU preset "
            "wants")
    return dev_k, "the Dev stage's num_speculative_tokens"


def start_runtimes(pair: Pair, dev: ServingConfig, *, k: int) -> tuple[LocalRuntime, LocalRuntime]:
    """Our entrypoint with P-EAGLE and vLLM's own server with plain decoding, same target and flags, started
    side by side (each request then goes to both): the Dev stage's serving config as this CPU runs it
    (harness.runtime.on_this_cpu), at K = ``k`` with a fixed K (a K by load is the stage's, for its GPUs)."""
    serving = on_this_cpu(replace(dev, num_speculative_tokens=k, num_speculative_tokens_per_batch_size=None),
                          max_num_seqs=8, max_model_len=2048 if pair.chat else 1024)
    runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, serving=serving, port=free_port(), log_dir=WORK,
                           name="runtime")
    plain = LocalRuntime(target=pair.target, drafter=None, serving=serving, port=free_port(), log_dir=WORK,
                         name="plain")
    started = time.monotonic()
    runtime.start()
    try:
        plain.start()
        with Ticker("engines starting", lambda: "| " + runtime.last_log_line()):
            runtime.wait_ready(timeout_s=900)
            plain.wait_ready(timeout_s=900)
    except RuntimeStartError as error:
        for r in (runtime, plain):
            _teardown_runtime(r)
        raise DemoError(str(error)) from None
    print(f"      /ping healthy after {time.monotonic() - started:.0f} s: P-EAGLE on {runtime.base}, "
          f"plain decoding on {plain.base}")
    return runtime, plain


def requests(pair: Pair, count: int) -> list[tuple[str, dict]]:
    """(what to show, the request body part): HumanEval problems as chat for an instruct model, else the toy
    corpus's held-out prompts."""
    if pair.chat:
        from models.trainer.coding_tasks import chat_messages, humaneval_tasks

        tasks = humaneval_tasks()
        picked = [tasks[i * len(tasks) // count] for i in range(count)]
        return [(task.source + ": ", {"messages": chat_messages(task)}) for task in picked]
    from models.trainer.corpus import held_out_prompts

    return [(prompt, {"prompt": prompt}) for prompt in held_out_prompts(count)]


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", choices=("real", "toy", "random"), default="real",
                        help="real: SmolLM2-135M-Instruct and its P-EAGLE head (built on first use); toy: the toy "
                             "pair (trained here, high acceptance); random: random weights, instant")
    parser.add_argument("--requests", type=int, default=6, help="streamed requests to send (1-64)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per request (8-512)")
    parser.add_argument("--k", type=int, default=None, help="draft tokens per step (default: the Dev stage's K)")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 64:
        parser.error(f"--requests: got {args.requests}; allowed: 1..64")
    if not 8 <= args.max_tokens <= 512:
        parser.error(f"--max-tokens: got {args.max_tokens}; allowed: 8..512")
    if args.k is not None and not 1 <= args.k <= 32:
        parser.error(f"--k: got {args.k}; allowed: 1..32")

    # Ctrl-C and SIGTERM (CI cancelling, `kill`) both tear down. SIGINT is set explicitly: a shell that
    # starts us in the background hands it down ignored, and Python then keeps ignoring it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    steps = Steps(total=5)
    WORK.mkdir(parents=True, exist_ok=True)
    assembly = WORK / "cdk.out"
    deployed = False
    outcome = 1
    with ExitStack() as cleanup:
        try:
            t = steps.start("synthesize every stage and validate it (cdk-nag packs in synth, cfn-lint per template)")
            rows = synth_and_validate(assembly)
            for row in rows:
                print(f"      {row['stack']:<16} {row['resources']:>3} resources   nag: {row['nag']:<20} "
                      f"cfn-lint: {row['lint']}")
            steps.done("synth + validation", t)

            t = steps.start("deploy Dev on the embedded AWS (moto + our CloudFormation extension, real CDK CLI)")
            cleanup.callback(_teardown_stack, assembly)
            deployed = True
            result = deploy.deploy("dev", target="local", assembly=assembly)
            if not result.ok:
                raise DemoError("the deploy check found missing resources (table above)")
            steps.done("deploy + check", t)

            t = steps.start("start the serving runtime on the CPU (our entrypoint, vLLM, P-EAGLE) beside plain decoding")
            pair = model_pair(args.models)
            dev = dev_serving()
            k, why = choose_k(pair, dev, args.k)
            print(f"      models: {pair.kind}\n      target  {pair.target}\n      drafter {pair.drafter}")
            print(f"      K = {k}: {why}")
            runtime, plain = start_runtimes(pair, dev, k=k)
            cleanup.callback(_teardown_runtime, runtime)
            cleanup.callback(_teardown_runtime, plain)
            steps.done("models + engine start", t)

            t = steps.start(f"send {args.requests} streamed requests through /invocations (SageMaker contract) to "
                            "P-EAGLE and to plain decoding")
            results, baseline, counters = side_by_side(runtime, plain, requests(pair, args.requests),
                                                       {"max_tokens": args.max_tokens, "temperature": 0})
            steps.done("requests", t)
            _figures(results, baseline, counters, runtime, k)
            outcome = 0
        except KeyboardInterrupt:
            print("\ninterrupted: tearing down", flush=True)
            outcome = 130
        except (DemoError, InvocationError, deploy.DeployError, cdk.CdkError, server.EmulatorError) as error:
            print(f"\nerror: {error}\ntearing down", file=sys.stderr, flush=True)
            outcome = 1
        finally:
            t = time.monotonic()
            print(f"\n[{steps.total}/{steps.total}] tear down (runtime, Dev stacks, embedded AWS)", flush=True)
    # ExitStack ran the callbacks (runtime first, then the stack) on the way out.
    if deployed:
        steps.timings.append(("tear down", time.monotonic() - t))
    total = time.monotonic() - steps.t0
    print("\n" + "  ".join(f"{name}: {took:.0f} s" for name, took in steps.timings))
    print(f"demo {'finished' if outcome == 0 else 'FAILED' if outcome == 1 else 'interrupted'} in {total:.0f} s")
    return outcome


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _teardown_runtime(runtime: LocalRuntime) -> None:
    try:
        runtime.stop()
        print(f"      {runtime.name} stopped", flush=True)
    except Exception as error:  # keep tearing down the rest
        print(f"      could not stop the runtime cleanly: {error}", file=sys.stderr)


def _teardown_stack(assembly: Path) -> None:
    try:
        deploy.destroy("dev", target="local", assembly=assembly)
    except Exception as error:
        print(f"      destroy failed ({error}); stopping the embedded AWS anyway", file=sys.stderr)
        server.stop(state_dir=deploy.STATE_DIR)


def side_by_side(runtime: LocalRuntime, plain: LocalRuntime, batch: list[tuple[str, dict]], request: dict
                 ) -> tuple[list[StreamResult], list[StreamResult], spec_metrics.SpecCounters]:
    """Each request to both servers, one after the other (who goes first alternates, so neither always meets
    the warmer cache); returns P-EAGLE's results, plain decoding's, and P-EAGLE's counters over the run."""
    for server in (runtime, plain):  # first-request costs stay out of the figures
        stream_invocation(server.base, {**request, **batch[0][1], "max_tokens": 8})
    before = spec_metrics.scrape(runtime.base)
    results, baseline = [], []
    for i, (label, body) in enumerate(batch, 1):
        order = (runtime, plain) if i % 2 else (plain, runtime)
        got = {server.name: stream_invocation(server.base, {**request, **body}) for server in order}
        r, b = got[runtime.name], got[plain.name]
        results.append(r)
        baseline.append(b)
        same = "same text" if r.text == b.text else "TEXT DIFFERS"
        shown = (label + r.text).replace("\n", "⏎")[:44]
        print(f"      #{i}: P-EAGLE {r.decode_tokens_per_s:6.1f} tok/s  plain {b.decode_tokens_per_s:6.1f} tok/s  "
              f"({_ratio(r.decode_tokens_per_s, b.decode_tokens_per_s)})  {r.output_tokens:3d} tokens, {same}   "
              f"{shown}", flush=True)
    return results, baseline, spec_metrics.scrape(runtime.base) - before


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def _figures(results: list[StreamResult], baseline: list[StreamResult], counters: spec_metrics.SpecCounters,
             runtime: LocalRuntime, k: int) -> None:
    print("\n      ------------------------------------------------------------")
    print(f"      {'':<28}{'P-EAGLE':>12}{'plain':>12}")
    ttft = [statistics.median(r.ttft_s * 1000 for r in rs) for rs in (results, baseline)]
    print(f"      {'TTFT, median (ms)':<28}{ttft[0]:>12.0f}{ttft[1]:>12.0f}")
    streams = [statistics.median([r.decode_tokens_per_s for r in rs if r.output_tokens > 1] or [0.0])
               for rs in (results, baseline)]
    print(f"      {'tokens/s per stream, median':<28}{streams[0]:>12.1f}{streams[1]:>12.1f}   "
          f"P-EAGLE / plain {_ratio(*streams)}")
    ends = [sum(r.output_tokens for r in rs) / sum(r.e2e_s for r in rs) for rs in (results, baseline)]
    print(f"      {'tokens/s end to end':<28}{ends[0]:>12.1f}{ends[1]:>12.1f}   P-EAGLE / plain {_ratio(*ends)}")
    same = sum(r.text == b.text for r, b in zip(results, baseline))
    print(f"      greedy output identical to plain decoding: {same} of {len(results)} requests")
    if counters.drafts > 0:
        print(f"      acceptance    AL = 1 + {counters.accepted:.0f} / {counters.drafts:.0f} = "
              f"{counters.acceptance_length:.2f} tokens per target step (K = {k}; "
              f"{counters.acceptance_rate or 0:.0%} of draft tokens accepted)")
        print("      per position  " + "  ".join(f"{i}: {rate:.0%}" for i, rate in
                                                  enumerate(counters.per_position_rates(), 1)))
    else:
        print("      acceptance    no drafts counted on /metrics (is speculative decoding on?)")
    verdict = "faster" if streams[0] > streams[1] else "NOT faster"
    print(f"      P-EAGLE is {verdict} than plain decoding here ({_ratio(*streams)} per stream)")
    lines = runtime.request_lines()
    if lines:
        print(f"      request log   {len(lines)} JSON line(s) for the metric filters, e.g.:\n      {json.dumps(lines[-1])}")
    print("      ------------------------------------------------------------")
