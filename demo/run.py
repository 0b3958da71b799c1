"""The whole product on this machine, in one command (`make demo`).

    python -m demo [--models real|demo|tiny] [--requests 6] [--max-tokens 96] [--k K]

1. Synthesizes every stage once (the cdk-nag packs run as validation plugins during synth) and runs
   cfn-lint on every template.
2. Deploys the Dev stage to an embedded AWS (moto's server + our CloudFormation extension) with the real
   CDK CLI and checks what each service holds (harness.deploy).
3. Starts the serving runtime on the CPU the way the image does (peagle_runtime.entrypoint, SM_VLLM_*
   variables, P-EAGLE speculative config with the Dev stage's K) on a real pretrained model,
   SmolLM2-135M-Instruct, with its P-EAGLE head (models.real_pair: the benchmark's head when built, else
   the smaller demo recipe, built on first use in about 10 minutes on 2 cores); ``--models demo`` serves
   the toy pair, ``--models tiny`` random weights.
4. Streams HumanEval coding problems (never in the heads' training data) through the SageMaker contract
   (POST /invocations, chat messages, ``stream: true``) and prints time to first token, tokens per second
   and the acceptance length (AL = 1 + accepted / drafts, from vLLM's spec-decode counters on /metrics).
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
from dataclasses import dataclass
from pathlib import Path

from harness import cdk, deploy, spec_metrics
from harness.aws import server
from harness.client import InvocationError, StreamResult, stream_invocation
from harness.ports import free_port
from harness.runtime import LocalRuntime, RuntimeStartError

REPO = cdk.REPO_ROOT
WORK = REPO / ".cache" / "demo"
DEMO_IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/peagle-runtime:demo"
DEFAULT_K = 4


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


def _log(line: str) -> None:
    print("      " + line, flush=True)


def model_pair(kind: str) -> Pair:
    from models import demo_pair, real_pair, tiny

    if kind == "real":
        pair = real_pair.existing("bench")
        if pair is not None:
            return Pair("SmolLM2-135M-Instruct + the benchmark's P-EAGLE head", pair.target, pair.drafter, True)
        if real_pair.existing("demo") is None:
            print("      building the real pair once (cached under ~/.cache/peagle/models): the target from its "
                  "wheel, its answers to 160 coding tasks, its features, one P-EAGLE head")
        pair = real_pair.build("demo", log=_log)
        return Pair("SmolLM2-135M-Instruct + the demo recipe's P-EAGLE head", pair.target, pair.drafter, True)
    if kind == "demo":
        pair = demo_pair.existing_pair()
        if pair is None:
            print("      training the demo pair once (cached under ~/.cache/peagle/models; ~6 min on 2 idle cores)")
            pair = demo_pair.build(log=lambda *a, **k: _log(" ".join(str(x) for x in a)))
        return Pair("toy pair (trained here)", pair.target, pair.drafter, False)
    pair = tiny.build()
    return Pair("tiny (random weights: expect AL near 1)", pair.target, pair.drafter, False)


def dev_k(assembly: Path) -> int:
    """K as the Dev stage deploys it: read back from the Model's SM_VLLM_SPECULATIVE_CONFIG."""
    for stack in cdk.stage_stacks(assembly, "Dev"):
        for res in stack.template().get("Resources", {}).values():
            if res.get("Type") != "AWS::SageMaker::Model":
                continue
            props = res.get("Properties", {})
            containers = [props.get("PrimaryContainer")] + list(props.get("Containers") or [])
            for container in filter(None, containers):
                raw = (container.get("Environment") or {}).get("SM_VLLM_SPECULATIVE_CONFIG")
                if isinstance(raw, str):
                    try:
                        return int(json.loads(raw)["num_speculative_tokens"])
                    except (ValueError, KeyError, TypeError):
                        pass
    return DEFAULT_K


def start_runtime(pair: Pair, *, k: int) -> LocalRuntime:
    runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, k=k, port=free_port(), log_dir=WORK,
                           name="runtime", max_num_seqs=8, max_model_len=2048 if pair.chat else 1024)
    runtime.start()
    started = time.monotonic()
    with Ticker("engine starting", lambda: "| " + runtime.last_log_line()):
        try:
            runtime.wait_ready(timeout_s=900)
        except RuntimeStartError as error:
            raise DemoError(str(error)) from None
    print(f"      /ping healthy after {time.monotonic() - started:.0f} s on {runtime.base}")
    return runtime


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
    parser.add_argument("--models", choices=("real", "demo", "tiny"), default="real",
                        help="real: SmolLM2-135M-Instruct and its P-EAGLE head (built on first use); demo: the toy "
                             "pair; tiny: random weights, instant")
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

            t = steps.start("start the serving runtime on the CPU (our entrypoint, vLLM, P-EAGLE)")
            pair = model_pair(args.models)
            k = args.k or dev_k(assembly)
            print(f"      models: {pair.kind}\n      target  {pair.target}\n      drafter {pair.drafter}")
            print(f"      K = {k} (the Dev stage's num_speculative_tokens){'' if args.k is None else ' - overridden'}")
            runtime = start_runtime(pair, k=k)
            cleanup.callback(_teardown_runtime, runtime)
            steps.done("models + engine start", t)

            t = steps.start(f"send {args.requests} streamed requests through /invocations (SageMaker contract)")
            request = {"max_tokens": args.max_tokens, "temperature": 0}
            batch = requests(pair, args.requests)
            stream_invocation(runtime.base, {**request, **batch[0][1], "max_tokens": 8})  # first-request costs
            before = spec_metrics.scrape(runtime.base)
            results = []
            for i, (label, body) in enumerate(batch, 1):
                r = stream_invocation(runtime.base, {**request, **body})
                results.append(r)
                shown = (label + r.text).replace("\n", "⏎")[:70]
                print(f"      #{i}: TTFT {r.ttft_s * 1000:6.0f} ms  {r.output_tokens:3d} tokens  "
                      f"{r.decode_tokens_per_s:6.1f} tok/s   {shown}", flush=True)
            counters = spec_metrics.scrape(runtime.base) - before
            steps.done("requests", t)
            _figures(results, counters, runtime, k)
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
        print("      runtime stopped", flush=True)
    except Exception as error:  # keep tearing down the rest
        print(f"      could not stop the runtime cleanly: {error}", file=sys.stderr)


def _teardown_stack(assembly: Path) -> None:
    try:
        deploy.destroy("dev", target="local", assembly=assembly)
    except Exception as error:
        print(f"      destroy failed ({error}); stopping the embedded AWS anyway", file=sys.stderr)
        server.stop(state_dir=deploy.STATE_DIR)


def _figures(results: list[StreamResult], counters: spec_metrics.SpecCounters, runtime: LocalRuntime, k: int) -> None:
    ttfts = sorted(r.ttft_s * 1000 for r in results)
    tokens = sum(r.output_tokens for r in results)
    wall = sum(r.e2e_s for r in results)
    print("\n      ------------------------------------------------------------")
    print(f"      TTFT          median {statistics.median(ttfts):.0f} ms   max {ttfts[-1]:.0f} ms")
    streams = [r.decode_tokens_per_s for r in results if r.output_tokens > 1] or [0.0]
    print(f"      tokens/s      {statistics.median(streams):.1f} per stream after the first "
          f"token (median);  {tokens / wall:.1f} end to end")
    if counters.drafts > 0:
        print(f"      acceptance    AL = 1 + {counters.accepted:.0f} / {counters.drafts:.0f} = "
              f"{counters.acceptance_length:.2f} tokens per target step (K = {k}; "
              f"{counters.acceptance_rate or 0:.0%} of draft tokens accepted)")
    else:
        print("      acceptance    no drafts counted on /metrics (is speculative decoding on?)")
    lines = runtime.request_lines()
    if lines:
        print(f"      request log   {len(lines)} JSON line(s) for the metric filters, e.g.:\n      {json.dumps(lines[-1])}")
    print("      ------------------------------------------------------------")
