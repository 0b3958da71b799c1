"""The whole product on this machine, in one command (`make demo`).

    python -m tools.demo [--models demo|tiny] [--requests 6] [--max-tokens 96] [--keep-going]

1. Synthesizes every stage once (the cdk-nag packs run as validation plugins during synth) and runs
   cfn-lint on every template.
2. Deploys the Dev stage to an embedded AWS (moto's server + our CloudFormation extension) with the real
   CDK CLI and checks what each service holds (tools.local_deploy).
3. Starts the serving runtime on the CPU the way the image does (peagle_runtime.entrypoint, SM_VLLM_*
   variables, P-EAGLE speculative config with the Dev stage's K) on the trained demo pair (tools.demo_models;
   trained on first use: ~6 min alone on 2 cores, ~17 min here under load) or the tiny random pair.
4. Streams requests through the SageMaker contract (POST /invocations, ``stream: true``) and prints time to
   first token, tokens per second and the acceptance length (AL = 1 + accepted / drafts, from vLLM's
   spec-decode counters on /metrics).
5. Tears everything down - runtime, stacks, emulator - also on failure and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tools import local_deploy
from tools.local_aws import cdk_cli, server

REPO = cdk_cli.REPO_ROOT
WORK = REPO / ".cache" / "demo"
STAGES = ("Dev", "Staging", "Prod")
DEMO_IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/peagle-runtime:demo"
DEFAULT_K = 4

# vLLM on this CPU (see the shared notes): a small KV cache, fp32 + eager for a quick, exact start.
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}


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


def synth_and_validate(assembly: Path, app_dir: Path = REPO) -> list[dict]:
    """Synthesize every stage (nag runs as a validation plugin) and cfn-lint each template."""
    with Ticker("cdk synth (all stages, cdk-nag validation)"):
        proc = cdk_cli.synth(assembly, cwd=app_dir, context={"imageUri": DEMO_IMAGE_URI}, label=None, check=False)
    nag = _nag_summary(assembly)
    if proc.returncode != 0:
        tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()[-25:])
        raise DemoError(f"cdk synth failed (exit {proc.returncode}); nag findings: {nag or 'see below'}\n{tail}")
    rows = []
    stacks = cdk_cli.list_stacks(assembly)
    missing = [stage for stage in STAGES if not any(s.stage == stage for s in stacks)]
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
    for stack in cdk_cli.list_stacks(assembly):
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


def model_pair(kind: str) -> Pair:
    if kind == "demo":
        try:
            from tools import demo_models
        except ImportError:
            print("      tools.demo_models is not there: using the tiny random pair")
            kind = "tiny"
        else:
            pair = demo_models.existing_pair()
            if pair is None:
                print("      training the demo pair once (cached under .cache/models; ~6 min on 2 idle cores)")
                pair = demo_models.build(log=lambda *a, **k: print("      " + " ".join(str(x) for x in a), flush=True))
            return Pair("demo (trained)", pair.target, pair.drafter)
    from tools import tiny_models

    pair = tiny_models.build()
    return Pair("tiny (random weights: expect AL near 1)", pair.target, pair.drafter)


def dev_k(assembly: Path) -> int:
    """K as the Dev stage deploys it: read back from the Model's SM_VLLM_SPECULATIVE_CONFIG."""
    for stack in cdk_cli.stage_stacks(assembly, "Dev"):
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


class Runtime:
    """Our entrypoint (as in the image) on 127.0.0.1, in its own process group."""

    def __init__(self, pair: Pair, *, k: int, port: int) -> None:
        self.pair, self.k, self.port = pair, k, port
        self.proc: subprocess.Popen | None = None
        self.stdout = WORK / "runtime.stdout"
        self.stderr = WORK / "runtime.stderr"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SM_VLLM_")}
        env.update(CPU_ENV)
        env.update({
            "PEAGLE_HOST": "127.0.0.1",
            "PEAGLE_PORT": str(self.port),
            "SM_VLLM_MODEL": str(self.pair.target),
            "SM_VLLM_SPECULATIVE_CONFIG": json.dumps({
                "method": "eagle3", "model": str(self.pair.drafter), "num_speculative_tokens": self.k,
                "parallel_drafting": True}, separators=(",", ":")),
            "SM_VLLM_DTYPE": "float32",
            "SM_VLLM_ENFORCE_EAGER": "true",
            "SM_VLLM_MAX_MODEL_LEN": "1024",
            "SM_VLLM_MAX_NUM_SEQS": "8",
            "SM_VLLM_SERVED_MODEL_NAME": "peagle",
            "VLLM_USE_V2_MODEL_RUNNER": "0",
        })
        WORK.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peagle_runtime.entrypoint", "serve"], cwd=REPO, env=env,
            stdout=self.stdout.open("wb"), stderr=self.stderr.open("wb"), start_new_session=True)

    def last_log_line(self) -> str:
        try:
            lines = self.stderr.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [line for line in lines if line.strip() and "warn" not in line.lower() and "Triton" not in line]
        return ("| " + useful[-1].split("] ")[-1][:60]) if useful else ""

    def wait_ready(self, timeout_s: float = 900.0) -> float:
        import httpx

        assert self.proc is not None
        started = time.monotonic()
        with Ticker("engine starting", self.last_log_line), httpx.Client(timeout=3.0) as client:
            while time.monotonic() - started < timeout_s:
                if self.proc.poll() is not None:
                    tail = "\n".join(self.stderr.read_text(errors="replace").splitlines()[-30:])
                    raise DemoError(f"the runtime exited with code {self.proc.returncode}:\n{tail}")
                try:
                    if client.get(self.base + "/ping").status_code == 200:
                        return time.monotonic() - started
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
        raise DemoError(f"the runtime did not answer /ping within {timeout_s:.0f} s; see {self.stderr}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # what SageMaker sends; SIGKILL 30 s later, like SageMaker
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the engine core and workers, if any are left
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)

    def request_lines(self) -> list[dict]:
        from peagle_contract.request_log import parse_line

        text = self.stdout.read_text(errors="replace") if self.stdout.exists() else ""
        return [rec for rec in map(parse_line, text.splitlines()) if rec]


# --------------------------------------------------------------------------------------------------
# 4. requests and figures
# --------------------------------------------------------------------------------------------------


def spec_counters(base: str) -> dict[str, float]:
    import httpx

    text = httpx.get(base + "/metrics", timeout=10).text
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric = line.split("{", 1)[0].split(" ", 1)[0]
        metric = metric.removesuffix("_total")
        if metric in names:
            totals[names[metric]] += float(line.rsplit(" ", 1)[1])
    return totals


@dataclass
class StreamResult:
    ttft_s: float
    e2e_s: float
    tokens: int
    text: str

    @property
    def decode_tps(self) -> float:
        return (self.tokens - 1) / (self.e2e_s - self.ttft_s) if self.tokens > 1 and self.e2e_s > self.ttft_s else 0.0


def stream_invocation(base: str, prompt: str, *, max_tokens: int) -> StreamResult:
    """One request the way SageMaker's InvokeEndpointWithResponseStream delivers it: POST /invocations."""
    import httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.monotonic()
    ttft = None
    pieces: list[str] = []
    tokens = 0
    with httpx.stream("POST", base + "/invocations", json=body, timeout=300) as response:
        if response.status_code != 200:
            raise DemoError(f"/invocations answered {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    if ttft is None:
                        ttft = time.monotonic() - started
                    pieces.append(choice["text"])
            if event.get("usage"):
                tokens = int(event["usage"].get("completion_tokens") or 0)
    e2e = time.monotonic() - started
    return StreamResult(ttft if ttft is not None else e2e, e2e, tokens, "".join(pieces))


def prompts(count: int) -> list[str]:
    try:
        from tools.trainer.corpus import held_out_prompts
    except ImportError:
        base = ["def add_one(x):\n", "count by 1: 300 301 302", "total = 0\nfor i in range(", "12 x 1 = "]
        return [base[i % len(base)] for i in range(count)]
    return held_out_prompts(count)


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", choices=("demo", "tiny"), default="demo",
                        help="demo: the trained pair (trained on first use); tiny: random weights, instant")
    parser.add_argument("--requests", type=int, default=6, help="streamed requests to send (1-64)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per request (8-512)")
    parser.add_argument("--app-dir", type=Path, default=REPO, help="directory of the CDK app (default: this repo)")
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
    runtime: Runtime | None = None
    deployed = False
    outcome = 1
    with ExitStack() as cleanup:
        try:
            t = steps.start("synthesize every stage and validate it (cdk-nag packs in synth, cfn-lint per template)")
            rows = synth_and_validate(assembly, args.app_dir)
            for row in rows:
                print(f"      {row['stack']:<16} {row['resources']:>3} resources   nag: {row['nag']:<20} "
                      f"cfn-lint: {row['lint']}")
            steps.done("synth + validation", t)

            t = steps.start("deploy Dev on the embedded AWS (moto + our CloudFormation extension, real CDK CLI)")
            cleanup.callback(_teardown_stack, assembly, args.app_dir)
            deployed = True
            result = local_deploy.deploy("dev", target="local", assembly=assembly, app_dir=args.app_dir)
            if not result.ok:
                raise DemoError("the deploy check found missing resources (table above)")
            steps.done("deploy + check", t)

            t = steps.start("start the serving runtime on the CPU (our entrypoint, vLLM, P-EAGLE)")
            pair = model_pair(args.models)
            k = args.k or dev_k(assembly)
            runtime = Runtime(pair, k=k, port=server.free_port())
            cleanup.callback(_teardown_runtime, runtime)
            print(f"      models: {pair.kind}\n      target  {pair.target}\n      drafter {pair.drafter}")
            print(f"      K = {k} (the Dev stage's num_speculative_tokens){'' if args.k is None else ' - overridden'}")
            runtime.start()
            ready = runtime.wait_ready()
            print(f"      /ping healthy after {ready:.0f} s on {runtime.base}")
            steps.done("models + engine start", t)

            t = steps.start(f"send {args.requests} streamed requests through /invocations (SageMaker contract)")
            stream_invocation(runtime.base, "warm up", max_tokens=8)  # first-request costs out of the figures
            before = spec_counters(runtime.base)
            results = []
            for i, prompt in enumerate(prompts(args.requests), 1):
                r = stream_invocation(runtime.base, prompt, max_tokens=args.max_tokens)
                results.append(r)
                shown = (prompt + r.text).replace("\n", "⏎")[:70]
                print(f"      #{i}: TTFT {r.ttft_s * 1000:6.0f} ms  {r.tokens:3d} tokens  "
                      f"{r.decode_tps:6.1f} tok/s   {shown}", flush=True)
            after = spec_counters(runtime.base)
            steps.done("requests", t)
            _figures(results, before, after, runtime, k)
            outcome = 0
        except KeyboardInterrupt:
            print("\ninterrupted: tearing down", flush=True)
            outcome = 130
        except (DemoError, local_deploy.DeployError, cdk_cli.CdkError, RuntimeError) as error:
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


def _teardown_runtime(runtime: Runtime) -> None:
    try:
        runtime.stop()
        print("      runtime stopped", flush=True)
    except Exception as error:  # keep tearing down the rest
        print(f"      could not stop the runtime cleanly: {error}", file=sys.stderr)


def _teardown_stack(assembly: Path, app_dir: Path) -> None:
    try:
        local_deploy.destroy("dev", target="local", assembly=assembly, app_dir=app_dir)
    except Exception as error:
        print(f"      destroy failed ({error}); stopping the embedded AWS anyway", file=sys.stderr)
        server.stop(state_dir=local_deploy.STATE_DIR)


def _figures(results: list[StreamResult], before: dict, after: dict, runtime: Runtime, k: int) -> None:
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted"] - before["accepted"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    ttfts = sorted(r.ttft_s * 1000 for r in results)
    tokens = sum(r.tokens for r in results)
    wall = sum(r.e2e_s for r in results)
    print("\n      ------------------------------------------------------------")
    print(f"      TTFT          median {statistics.median(ttfts):.0f} ms   max {ttfts[-1]:.0f} ms")
    streams = [r.decode_tps for r in results if r.tokens > 1] or [0.0]
    print(f"      tokens/s      {statistics.median(streams):.1f} per stream after the first "
          f"token (median);  {tokens / wall:.1f} end to end")
    if drafts > 0:
        print(f"      acceptance    AL = 1 + {accepted:.0f} / {drafts:.0f} = {1 + accepted / drafts:.2f} tokens per "
              f"target step (K = {k}; {accepted / max(draft_tokens, 1):.0%} of draft tokens accepted)")
    else:
        print("      acceptance    no drafts counted on /metrics (is speculative decoding on?)")
    lines = runtime.request_lines()
    if lines:
        print(f"      request log   {len(lines)} JSON line(s) for the metric filters, e.g.:\n      {json.dumps(lines[-1])}")
    print("      ------------------------------------------------------------")


if __name__ == "__main__":
    sys.exit(main())
