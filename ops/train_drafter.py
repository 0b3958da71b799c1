"""Train a stage's next P-EAGLE head on its own captured traffic, gate it, and stage it: `make train-drafter`, or

    python -m ops.train_drafter --env dev --capture captures/dev [--capture s3://bucket/prefix/] \\
        [--target DIR --drafter DIR | --pair auto] [--k K] [--margin 1.05] [--cpu-seconds S] \\
        [--bundle s3://bucket/prefix/] [--work DIR]

1. The capture: JSON-lines files in a local folder (what `make capture-export` writes) or below an S3 prefix. An
   S3 object is copied to a file named by the digest of its key (a key is whoever wrote the prefix's to choose:
   never a path here); any other file or object there is refused by name, not skipped.
2. models.trainer.traffic_training does the rest, each step kept in ``--work`` and resumed: the records read for
   this stage and its served target, split by conversation, the target's features, the served head
   (``--drafter``) warm-started and trained with the benchmark's P-EAGLE recipe at the stage's K, and the gate on
   vLLM on the held-out requests.
3. A candidate the gate refuses: both figures on stderr, exit 1, nothing staged. One it passes: with ``--bundle``,
   staged beside the target as a new content-addressed bundle (ops.stage_weights: nothing written over), its
   manifest kept as stacks/bundles/<digest>.json, and the change to commit printed: that file and the stage's pin in
   stacks/environments.py as a patch `git apply` takes. The stack diff then reads both manifests and names the
   change a drafter change (review.bundle_change).

stdout is the gate's report (JSON); progress goes to stderr. Exit 0 passed, 1 refused by the gate, 2 a bad input
(a capture record, an option, a bundle) named with what is allowed.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from peagle_contract.bundle import BundleError, check_digest
from peagle_contract.capture import CaptureError

from ops import cdk
from ops.stage_weights import MANIFESTS_DIR, StageError
from ops.stages import StageNameError, find_stage

CAPTURE_SUFFIX = ".jsonl"
# What a run copies down from S3 at most: a capture is text (records of at most 250,000 bytes), and whoever can
# write the prefix could otherwise fill the disk before a single record is read.
MAX_CAPTURE_BYTES = 8 << 30
ENVIRONMENTS_FILE = Path("stacks") / "environments.py"
DEFAULT_MARGIN = 1.05
# PINNED_BUNDLES is one line in stacks/environments.py: the stage's entry in it, a digest or None.
_PIN_ENTRY = r'("{stage}"\s*:\s*)(None|"[0-9a-f]{{64}}")'


class TrainDrafterError(ValueError):
    pass


def _local_capture(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise TrainDrafterError(f"--capture: {str(folder)[:200]!r} is not a folder; allowed: a folder of "
                                f"{CAPTURE_SUFFIX} files (make capture-export OUT=...) or s3://bucket/prefix/")
    files, others = [], []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):  # capture-export's .partial folder, editor files
            continue
        (files if path.is_file() and path.suffix == CAPTURE_SUFFIX else others).append(path.name)
    if others:
        raise TrainDrafterError(f"--capture: {folder} holds {len(others)} entries that are not capture files "
                                f"({', '.join(n[:60] for n in others[:5])}); allowed: {CAPTURE_SUFFIX} files only")
    if not files:
        raise TrainDrafterError(f"--capture: {folder} holds no {CAPTURE_SUFFIX} file")
    return [folder / name for name in files]


def _s3_capture(uri: str, into: Path, s3: Any, max_bytes: int = MAX_CAPTURE_BYTES) -> list[Path]:
    from peagle_constructs.weights import S3Prefix

    where = S3Prefix.parse(uri)
    if not where.bucket:
        raise TrainDrafterError(f"--capture: got {uri[:200]!r}; allowed: s3://bucket/prefix/")
    listed = [o for page in s3.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key_prefix)
              for o in page.get("Contents", [])]
    keys = [o["Key"] for o in listed]
    others = [k for k in keys if not k.endswith(CAPTURE_SUFFIX)]
    if others:
        raise TrainDrafterError(f"--capture: {uri} holds {len(others)} objects that are not capture files "
                                f"({', '.join(ascii(k[:60]) for k in others[:5])}); allowed: {CAPTURE_SUFFIX} "
                                "objects only")
    if not keys:
        raise TrainDrafterError(f"--capture: no {CAPTURE_SUFFIX} object below {uri}")
    size = sum(int(o.get("Size", 0)) for o in listed)
    if size > max_bytes:
        raise TrainDrafterError(f"--capture: {uri} holds {size} bytes in {len(keys)} objects; allowed: at most "
                                f"{max_bytes} (narrow the prefix to the days to train on)")
    into.mkdir(parents=True, exist_ok=True)
    paths = []
    for key in sorted(keys):
        # The key names nothing here: the file is named by its digest, inside ``into`` whatever the key holds.
        path = into / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}{CAPTURE_SUFFIX}"
        s3.download_file(where.bucket, key, str(path))
        paths.append(path)
    return paths


def _s3_client():  # noqa: ANN202 - a boto3 S3 client
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))


def capture_files(sources: Sequence[str], work: Path, *, s3: Any = None) -> list[Path]:
    """Every capture file the ``sources`` (folders or S3 prefixes) hold, as local paths."""
    files: list[Path] = []
    for index, source in enumerate(sources):
        if source.startswith("s3://"):
            s3 = s3 or _s3_client()
            files += _s3_capture(source, work / "capture" / f"s3-{index}", s3)
        else:
            files += _local_capture(Path(source))
    return files


def pin_change(stage: str, pin: str, *, repo: Path = cdk.REPO_ROOT) -> str:
    """The patch that pins ``stage`` to ``pin`` in stacks/environments.py ("" when it is pinned to it already)."""
    check_digest(pin, "pin")
    path = repo / ENVIRONMENTS_FILE
    before = path.read_text()
    lines = [line for line in before.splitlines(keepends=True) if line.startswith("PINNED_BUNDLES")]
    entry = re.compile(_PIN_ENTRY.format(stage=re.escape(stage)))
    if len(lines) != 1 or not entry.search(lines[0]):
        raise TrainDrafterError(f"{ENVIRONMENTS_FILE}: no one PINNED_BUNDLES line with a {stage!r} entry to change; "
                                f"pin it by hand: PINNED_BUNDLES[{stage!r}] = {pin!r}")
    after = before.replace(lines[0], entry.sub(lambda m: f'{m.group(1)}"{pin}"', lines[0]), 1)
    name = ENVIRONMENTS_FILE.as_posix()
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{name}", tofile=f"b/{name}"))


def stage_candidate(*, target: Path, candidate: Path, bundle: str, log: Callable[[str], None],
                    record_in: Path | None = None) -> dict:
    """The candidate beside the target in a new bundle below ``bundle`` (nothing written over), its manifest kept
    in ``record_in`` for the pull request."""
    from ops.stage_weights import Source, stage

    s3 = _s3_client()
    return stage(Source(folder=target.resolve(), origin=str(target), revision=None),
                 Source(folder=candidate.resolve(), origin=f"train-drafter:{candidate.name}", revision=None),
                 bundle, s3=s3, log=log, record_in=record_in)


def _models(args: argparse.Namespace) -> tuple[Path, Path]:
    if (args.target is None) != (args.drafter is None):
        raise TrainDrafterError("--target and --drafter: give both (the target and the head in service) or neither "
                                "(the pair `make serve` serves, --pair)")
    if args.target is not None:
        for flag, folder in (("--target", args.target), ("--drafter", args.drafter)):
            if not (folder / "config.json").is_file():
                raise TrainDrafterError(f"{flag}: {str(folder)[:200]!r} holds no config.json; allowed: a model "
                                        "folder as vLLM loads it")
        return args.target, args.drafter
    from harness.serve import pick_pair

    _, pair = pick_pair(args.pair)
    return pair.target, pair.drafter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.train_drafter", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="the stage whose traffic it is (its K, its pin)")
    parser.add_argument("--capture", required=True, action="append",
                        help="a folder of .jsonl capture files or s3://bucket/prefix/ (repeatable)")
    parser.add_argument("--target", type=Path, help="the target model folder (default: the pair `make serve` serves)")
    parser.add_argument("--drafter", type=Path, help="the P-EAGLE head the stage serves now, a folder")
    parser.add_argument("--pair", choices=("auto", "real", "toy", "random"), default="auto",
                        help="without --target/--drafter: which local pair (as `make serve` picks)")
    parser.add_argument("--served-name", help="the target name the records carry (default: the stage's capture "
                                              "config's)")
    parser.add_argument("--k", type=int, help="draft tokens per step to train and gate at (default: the stage's)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help=f"the AL ratio the interval's lower bound must reach (default {DEFAULT_MARGIN})")
    parser.add_argument("--cpu-seconds", type=float, help="the training budget (default: the benchmark recipe's)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per held-out answer in the gate")
    parser.add_argument("--bundle", help="s3://bucket/prefix/ to stage a passing candidate below (default: not staged)")
    parser.add_argument("--repo", type=Path, default=cdk.REPO_ROOT,
                        help="the checkout whose pin changes and that keeps the manifest (default: this one)")
    parser.add_argument("--work", type=Path, help="where each step is kept (default .cache/train-drafter/<env>)")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    from models.trainer import traffic_training

    try:
        config = find_stage(args.env)
        stage = config.name.lower()
        capture = config.model.serving.capture
        served = args.served_name or (capture.target if capture is not None else None)
        if not served:
            raise TrainDrafterError(f"{config.name}.model.serving.capture: none, so no target name to read records "
                                    "for; turn capture on for the stage (docs/capture.md) or pass --served-name")
        k = args.k if args.k is not None else config.model.serving.num_speculative_tokens
        if not isinstance(k, int) or not 1 <= k <= 32:
            raise TrainDrafterError(f"--k: got {k!r}; allowed: 1 to 32 (a per-batch-size schedule: give the K to "
                                    "train for)")
        if not args.margin >= 1:
            raise TrainDrafterError(f"--margin: got {args.margin:g}; allowed: a number >= 1")
        if not 1 <= args.max_tokens <= 4096:
            raise TrainDrafterError(f"--max-tokens: got {args.max_tokens}; allowed: 1 to 4096")
        if args.bundle is not None and not args.bundle.startswith("s3://"):
            raise TrainDrafterError(f"--bundle: got {args.bundle[:200]!r}; allowed: s3://bucket/prefix/")
        work = args.work or cdk.REPO_ROOT / ".cache" / "train-drafter" / stage
        target, drafter = _models(args)
        files = capture_files(args.capture, work)
        log(f"train-drafter: {config.name} at K={k}, {len(files)} capture files, target {target}, in service "
            f"{drafter}, steps kept in {work}")
        report = traffic_training.run(capture=files, stage=stage, target_name=served, target=target,
                                      in_service=drafter, work=work, k=k, margin=args.margin,
                                      cpu_seconds=args.cpu_seconds, max_tokens=args.max_tokens, log=log)
        staged = None
        if report["gate"] == "passed" and args.bundle:
            staged = stage_candidate(target=target, candidate=Path(report["candidate"]), bundle=args.bundle, log=log,
                                     record_in=args.repo / MANIFESTS_DIR)
            report["staged"] = {k2: staged[k2] for k2 in ("manifest_sha256", "bundle", "existing")}
    except (TrainDrafterError, StageNameError, CaptureError, BundleError, StageError) as exc:
        print(f"train-drafter: error: {exc}; nothing staged", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    if report["gate"] != "passed":
        print(f"train-drafter: the candidate is not staged: AL {report['al_after']['value']:.3f} against "
              f"{report['al_before']['value']:.3f} in service at K={k}; the lower bound of their ratio "
              f"{report['al_ratio']['interval'][0]:.3f} must reach {args.margin:g}"
              + ("" if report["outputs_identical"] else "; and its greedy output differs from the head in service's"),
              file=sys.stderr)
        return 1
    if staged is None:
        print(f"train-drafter: the candidate passed ({report['candidate']}); not staged (no --bundle)",
              file=sys.stderr)
        return 0
    pin = staged["manifest_sha256"]
    print(f"train-drafter: staged {staged['bundle']}\ncheck it: make verify-bundle BUNDLE={args.bundle} SHA256={pin}"
          f"\nthe change to commit: {MANIFESTS_DIR.as_posix()}/{pin}.json (kept there) and the pin:\n"
          f"{pin_change(stage, pin, repo=args.repo) or '(the stage is pinned to this bundle already)'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
