"""The traffic loop end to end on this machine: SmolLM2-135M-Instruct and its P-EAGLE head, `make bench-traffic-loop`.

    python -m bench.traffic_loop [--requests 240] [--cpu-seconds 1200] [--publish]

1. Dev's runtime on this CPU (the image's entrypoint, vLLM) with capture on, every request sampled, behind the
   loopback SageMaker front door, serving the pair's P-EAGLE head (the benchmark's when built, else the demo
   recipe's) as an inference component.
2. A traffic mix that head was not trained on, sent with the real boto3 client, half whole and half streamed:
   requests to explain standard-library functions in plain words (its training tasks asked for code; the
   functions it was trained on and HumanEval's are left out, and proven so).
3. `make train-drafter`'s command on that capture (ops.train_drafter): split, features, the head in service
   warm-started and trained, and the gate on vLLM on the held-out captured requests at the stage's K; a passing
   candidate is staged on moto's S3 (in process) beside the target, into a worktree of this commit whose Dev is
   pinned to the bundle in service (staged the same way, its manifest committed).
4. The printed pin change applied there, and the pull request's stack diff of it (review.stack_diff): what it calls
   the change, and what it does to Dev's model and inference component.
5. The staged bundle copied down as SageMaker copies it, served at /opt/ml/model under its pin (the entrypoint
   verifies every file first): what the container says it runs, the bundle's digest among it.

bench/figures/traffic_loop.json (``--publish``): al_before, al_after (each {"value", "interval"}),
tokens_per_s_ratio_c1, requests_captured, requests_held_out, train_minutes, gate, and the goals.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.reports import write_report

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".cache" / "traffic-loop"
SERVED_NAME = "smollm2-135m-instruct"
ENDPOINT, COMPONENT = "peagle-dev", "peagle-dev-smollm2-135m-instruct"
INSTRUCTION = "Explain in plain words, in two or three sentences, what this Python function does and when to use it."
GOALS = {"al_ratio": 1.2, "al_ratio_lower": 1.1, "tokens_per_s_ratio_lower": 1.0}
# Greedy, as the gate measures: a request that names no temperature is sampled at vLLM's default of 1.0, and a
# 135M target's answers at 1.0 are noise (the first run's capture: "This Fletcher uses-2\nprintpython(2Meta...");
# a drafter trained on them learns contexts the greedy gate never meets.
SAMPLING = {"temperature": 0.0}


def traffic(count: int, *, exclude: set[str]) -> list[list[dict]]:
    """Chat requests the head in service never saw the like of: explain a function (its training asked for code)."""
    from models.trainer import coding_tasks

    humaneval = {t.name for t in coding_tasks.humaneval_tasks()}
    tasks = [t for t in coding_tasks.stdlib_tasks(limit=count + len(exclude), seed=11, exclude_names=humaneval)
             if t.name not in exclude]
    if len(tasks) < count:
        raise SystemExit(f"traffic: {len(tasks)} functions left once the trained ones are out; allowed: --requests "
                         f"at most that")
    return [[{"role": "user", "content": f"{INSTRUCTION}\n```python\n{t.prompt.rstrip()}\n```"}]
            for t in tasks[:count]]


def _trained_names(recipe: str) -> set[str]:
    from models import real_pair

    return {t.name for t in _tasks(real_pair, recipe)}


def _tasks(real_pair, recipe: str):  # noqa: ANN001, ANN202 - the module, CodingTasks
    from models.trainer import coding_tasks

    data = real_pair.RECIPES[recipe].data
    held_out = {t.name for t in coding_tasks.humaneval_tasks()}
    return coding_tasks.stdlib_tasks(limit=data.tasks, seed=data.seed, exclude_names=held_out)


def _pair():
    from models import real_pair

    for recipe in ("bench", "demo"):
        pair = real_pair.existing(recipe)
        if pair is not None:
            return recipe, pair
    return "demo", real_pair.build("demo")


def capture(pair, k: int, requests: list[list[dict]], *, max_tokens: int, log) -> tuple[Path, dict]:  # noqa: ANN001
    """Serve with capture on, send ``requests`` through the front door with boto3, write the capture file."""
    from peagle_contract.capture import CaptureConfig

    from harness.front_door import FrontDoor
    from harness.runtime import LocalRuntime, local_serving
    from ops.sagemaker_client import invoke, invoke_stream, runtime_client

    serving = dataclasses.replace(
        local_serving(num_speculative_tokens=k, max_model_len=2048, max_num_seqs=8, served_model_name=SERVED_NAME),
        capture=CaptureConfig(sample_rate=1.0, stage="dev", target=SERVED_NAME))
    folder = WORK / "capture"
    key = hashlib.sha256(json.dumps([requests, max_tokens, SAMPLING, k, str(pair.drafter)]).encode()).hexdigest()
    done = WORK / "capture.done.json"
    if done.is_file() and json.loads(done.read_text()).get("key") == key:  # the same traffic, captured already
        counts = json.loads(done.read_text())["counts"]
        log(f"step: the capture of an earlier run ({counts['requests_captured']} records)")
        return folder, counts
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.monotonic()
    with LocalRuntime(target=pair.target, drafter=pair.drafter, serving=serving, log_dir=WORK / "logs",
                      name="dev-capture") as runtime:
        with FrontDoor(backend=runtime.base, endpoints={ENDPOINT: COMPONENT}) as door:
            client = runtime_client(endpoint_url=door.url, max_connections=4)

            def send(item: tuple[int, list[dict]]) -> None:
                index, messages = item
                body = {"messages": messages, "max_tokens": max_tokens, **SAMPLING}
                (invoke_stream if index % 2 else invoke)(client, ENDPOINT, body, component=COMPONENT)

            with ThreadPoolExecutor(4) as pool:
                for answered, _ in enumerate(pool.map(send, enumerate(requests)), 1):
                    if answered % 40 == 0:
                        log(f"  traffic: {answered}/{len(requests)} answered")
        lines = runtime.capture_lines()
    path = folder / "capture.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    log(f"step: {len(lines)} records captured from {len(requests)} requests in {time.monotonic() - started:.0f} s")
    counts = {"requests_sent": len(requests), "requests_captured": len(lines)}
    done.write_text(json.dumps({"key": key, "counts": counts}))
    return folder, counts


BUNDLE_PREFIX = "s3://peagle-weights-dev/bundles/smollm2-p-eagle/"


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), "-c", "user.email=bench@peagle.invalid", "-c", "user.name=bench",
                           *args], check=True, capture_output=True, text=True).stdout


def _apply(tree: Path, patch: str) -> None:
    """A patch as the command printed it, applied with git in ``tree``."""
    subprocess.run(["git", "-C", str(tree), "apply", "-"], input=patch, text=True, check=True)


def _pinned_tree(s3, pair, log) -> Path:  # noqa: ANN001
    """A worktree of this commit with Dev pinned to the bundle it serves now (its target and head, staged on moto's
    S3, the manifest committed beside the pin): the base the candidate's pin change is diffed against."""
    from ops import train_drafter
    from ops.stage_weights import MANIFESTS_DIR, Source, stage

    tree = WORK / "tree"
    if tree.exists():
        _git(REPO, "worktree", "remove", "--force", str(tree))
    _git(REPO, "worktree", "add", "--detach", "--force", str(tree), "HEAD")
    (tree / "node_modules").symlink_to(REPO / "node_modules")
    staged = stage(Source(pair.target, "smollm2", None), Source(pair.drafter, "the head in service", None),
                   BUNDLE_PREFIX, s3=s3, log=lambda line: None, record_in=tree / MANIFESTS_DIR)
    _apply(tree, train_drafter.pin_change("dev", staged["manifest_sha256"], repo=tree))
    _git(tree, "add", "-A", "stacks")
    _git(tree, "commit", "-q", "-m", "Dev pinned to the bundle it serves")
    log(f"step: Dev pinned to the bundle in service ({staged['manifest_sha256'][:12]}...) in {tree}")
    return tree


def train(pair, capture_dir: Path, k: int, *, cpu_seconds: float, log) -> tuple[int, dict, str, Path]:  # noqa: ANN001
    """`make train-drafter`'s command on the capture, staging on moto's S3 into a worktree whose Dev is pinned to
    the bundle in service; (exit code, report, stderr, the worktree)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    import boto3
    from moto import mock_aws

    from ops import train_drafter

    out, err = io.StringIO(), _Tee(log)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="peagle-weights-dev")
        tree = _pinned_tree(s3, pair, log)
        argv = ["--env", "dev", "--capture", str(capture_dir), "--served-name", SERVED_NAME, "--target",
                str(pair.target), "--drafter", str(pair.drafter), "--k", str(k), "--cpu-seconds", str(cpu_seconds),
                "--bundle", BUNDLE_PREFIX, "--work", str(WORK / "train"), "--repo", str(tree)]
        real_client = boto3.client
        boto3.client = lambda *a, **kw: s3  # the stager's client: moto's S3
        try:
            with redirect_stdout(out), redirect_stderr(err):
                code = train_drafter.main(argv)
        finally:
            boto3.client = real_client
        report = json.loads(out.getvalue() or "{}")
        if report.get("staged"):
            _copy_down(s3, report["staged"]["bundle"], WORK / "bundle")
    return code, report, err.text, tree


def stack_diff(tree: Path, patch: str, log) -> dict:  # noqa: ANN001
    """The pin change applied in the worktree, and the pull request's stack diff of it against its commit."""
    from review import stack_diff as diff

    _apply(tree, patch)
    markdown, reviews = diff.run(repo=tree, base_ref="HEAD", cache_dir=None, context={})
    (WORK / "stack_diff.md").write_text(markdown)
    dev = [r for r in reviews if r.display_name.startswith("Dev/")]
    found = [{"stack": r.display_name, "logical_id": f.logical_id, "type": f.type, "change": f.change,
              "verdict": f.verdict, "why": f.why} for r in dev for f in r.findings
             if f.type in ("AWS::SageMaker::Model", "AWS::SageMaker::InferenceComponent", "AWS::SageMaker::Endpoint")]
    log(f"step: the stack diff of the pin change: {', '.join(f['change'] + ' ' + f['logical_id'] for f in found)}")
    _git(REPO, "worktree", "remove", "--force", str(tree))
    return {"verdicts": {r.display_name: r.verdict for r in reviews}, "dev_findings": found,
            "other_stacks_changed": [r.display_name for r in reviews if r.findings and not r.display_name.startswith("Dev/")]}


def _copy_down(s3, uri: str, into: Path) -> None:  # noqa: ANN001 - an S3 client
    """The staged bundle as SageMaker copies it to /opt/ml/model: every object below its prefix."""
    from peagle_constructs.weights import S3Prefix

    where = S3Prefix.parse(uri)
    shutil.rmtree(into, ignore_errors=True)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key_prefix):
        for item in page.get("Contents", []):
            path = into / item["Key"][len(where.key_prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(where.bucket, item["Key"], str(path))


class _Tee:
    """stderr kept and passed on line by line (the command's progress)."""

    def __init__(self, log) -> None:  # noqa: ANN001
        self.log, self.text, self._line = log, "", ""

    def write(self, data: str) -> int:
        self.text += data
        self._line += data
        while "\n" in self._line:
            line, self._line = self._line.split("\n", 1)
            self.log(f"  {line}")
        return len(data)

    def flush(self) -> None:
        pass


def served_statement(pin: str, k: int) -> dict:
    """What the container says it runs once it serves the staged bundle, mounted at /opt/ml/model as SageMaker
    copies it and verified against its pin by the entrypoint before vLLM starts."""
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR
    from peagle_contract.served_config import HEADER, parse
    from peagle_contract.serving import DRAFTER_MODEL_DIR, TARGET_MODEL_DIR

    from harness.runtime import LocalRuntime, local_serving

    serving = local_serving(num_speculative_tokens=k, max_model_len=2048, served_model_name=SERVED_NAME)
    with LocalRuntime(target=Path(f"{TARGET_MODEL_DIR}/target"), drafter=Path(DRAFTER_MODEL_DIR), serving=serving,
                      log_dir=WORK / "logs", name="dev-candidate", model_mount=WORK / "bundle",
                      extra_env={MANIFEST_DIGEST_VAR: pin}) as runtime:
        import httpx

        answer = httpx.post(runtime.base + "/invocations", timeout=120,
                            json={"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 4})
    return dataclasses.asdict(parse(answer.headers.get(HEADER)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.traffic_loop", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--cpu-seconds", type=float, default=1200.0)
    parser.add_argument("--publish", action="store_true")
    args = parser.parse_args(argv)
    from models.trainer import coding_tasks

    def log(line: str) -> None:  # the process's own stderr: train() redirects sys.stderr through this
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.__stderr__, flush=True)

    started = time.time()
    recipe, pair = _pair()
    k = pair.trained_k()
    requests = traffic(args.requests, exclude=_trained_names(recipe))
    texts = [m[0]["content"] for m in requests]
    leaked = coding_tasks.leaks(texts)
    if leaked:
        raise SystemExit(f"traffic: {len(leaked)} requests hold HumanEval text ({leaked[:3]}); refusing to train")
    log(f"traffic loop: SmolLM2 with the {recipe} recipe's P-EAGLE head at K={k}, {len(requests)} requests")
    capture_dir, counts = capture(pair, k, requests, max_tokens=args.max_tokens, log=log)
    code, report, err, tree = train(pair, capture_dir, k, cpu_seconds=args.cpu_seconds, log=log)
    if not report:
        raise SystemExit(f"traffic loop: train-drafter exited {code} with no report:\n{err[-2000:]}")
    patch = err[err.index("--- a/"):] if "--- a/" in err else None
    if patch:
        diff = stack_diff(tree, patch, log)
    else:  # refused: nothing to diff
        diff = None
        _git(REPO, "worktree", "remove", "--force", str(tree))
    statement = served_statement(report["staged"]["manifest_sha256"], k) if report.get("staged") else None
    al_ratio = report["al_ratio"]
    figures = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": "python -m bench.traffic_loop " + " ".join(argv if argv is not None else sys.argv[1:]),
        "al_before": report["al_before"], "al_after": report["al_after"], "al_ratio": al_ratio,
        "tokens_per_s_ratio_c1": report["tokens_per_s_ratio_c1"],
        "requests_captured": counts["requests_captured"], "requests_held_out": report["requests_held_out"],
        "requests_training": report["requests_training"],
        "train_minutes": round(report["training"]["wall_seconds"] / 60, 2),
        "train_cpu_seconds": report["training"]["cpu_seconds"], "train_steps": report["training"]["steps"],
        "gate": report["gate"], "margin": report["margin"], "k": k, "head_in_service": f"{recipe} recipe",
        "conditional_before": report["conditional_before"], "conditional_after": report["conditional_after"],
        "outputs_identical": report["outputs_identical"], "staged": report.get("staged"),
        "pin_change": patch, "stack_diff": diff,
        "served_statement": statement,
        # The container verified the staged bytes against the new pin and says so; the drafter's path alone could not.
        "served_check": bool(statement) and statement["bundle"] == report["staged"]["manifest_sha256"]
        and statement["k"] == k,
        "exit_code": code, "notes": report["notes"],
        "goals": {
            "al_ratio": {"goal": GOALS["al_ratio"], "value": al_ratio["value"], "interval": al_ratio["interval"],
                         "met": al_ratio["value"] >= GOALS["al_ratio"]
                         and al_ratio["interval"][0] >= GOALS["al_ratio_lower"]},
            "tokens_per_s_ratio_c1": {**report["tokens_per_s_ratio_c1"], "goal_lower": GOALS["tokens_per_s_ratio_lower"],
                                      "met": report["tokens_per_s_ratio_c1"]["interval"][0]
                                      > GOALS["tokens_per_s_ratio_lower"]},
        },
        "minutes": round((time.time() - started) / 60, 1),
    }
    write_report("traffic_loop", figures, publish=args.publish)
    log(f"traffic loop: gate {report['gate']}; AL {report['al_before']['value']:.3f} -> "
        f"{report['al_after']['value']:.3f} (ratio {al_ratio['value']:.3f} {al_ratio['interval']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
