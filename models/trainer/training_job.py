"""The drafter's SageMaker training job: the contract of peagle_contract.training_job around
models.trainer.traffic_training.run, the trainer `make train-drafter` runs locally.

    peagle-train train        # what SageMaker runs (the image's command), in the contract's ROOT
    PEAGLE_TRAINING_ROOT=<folder> python -m models.trainer.training_job   # a folder laid out like it (tests)

1. The hyperparameters are parsed before any other input is read: a job asked for something the contract does not
   allow reads nothing.
2. The bundle channel is checked file by file against the ``bundle_sha256`` hyperparameter before anything is
   loaded from it: the channel is whatever the prefix held when the job started, the pin is what the stage serves.
3. The capture channel is every ``.jsonl`` file below it, in Firehose's dated folders; anything else there is
   refused by name, not skipped (whoever writes the prefix chooses it).
4. traffic_training runs with its steps kept in ``checkpoints/``, which SageMaker syncs to S3, so a restarted job
   resumes at the first step not done.
5. ``model/gate.json`` is the gate's report whichever way it went (a refusal is the job's answer, not its failure:
   exit 0). Only a passed gate adds the candidate head in ``model/drafter/`` and ``model/manifest.json``, the
   manifest of the bundle pairing the pinned target with it; its digest is the report's ``candidate_sha256``.

The manifest is the one ``ops.stage_weights.stage`` writes for the bundle's ``target/`` and this ``drafter/`` with
the origins it states: the target's entries and origin are the pinned manifest's (its files were all hashed by the
check in 2, so they are not hashed again), the drafter's origin is ``train-drafter:<candidate>`` as
``ops.train_drafter`` names a trained head. A pinned manifest that says nothing of the target's origin was not
written by the stager, and is refused: no staging could reproduce this one.

Bad input (a hyperparameter, the bundle, a capture file or record) writes one line naming the field to
``output/failure`` (SageMaker's FailureReason), leaves ``model/`` empty and exits 2. Progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from peagle_contract import training_job as contract
from peagle_contract.bundle import (
    DRAFTER_DIR, FILE, FOLDER, MANIFEST_NAME, TARGET_DIR, BundleError, describe, digest, display_path, parse_manifest,
    render, scan_folder, verify_bundle,
)
from peagle_contract.capture import CaptureError
from peagle_contract.training_job import TrainingJobError

ROOT_VAR = "PEAGLE_TRAINING_ROOT"
CAPTURE_SUFFIX = ".jsonl"
# How ops.train_drafter names a trained head's origin in a manifest: one spelling for the same recipe's output.
DRAFTER_ORIGIN = "train-drafter:"


def _log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] training-job: {line}", file=sys.stderr, flush=True)


def read_config(root: Path) -> contract.TrainingJobConfig:
    path = root / contract.HYPERPARAMETERS_FILE
    try:
        with path.open("rb") as f:
            raw = f.read(contract.MAX_HYPERPARAMETERS_BYTES + 1)  # parse_hyperparameters refuses one byte more
    except OSError as exc:
        raise TrainingJobError(contract.HYPERPARAMETERS_FILE, f"could not be read ({exc.strerror or exc})") from None
    return contract.parse_hyperparameters(raw)


def pinned_manifest(bundle: Path, pin: str) -> bytes:
    """The bundle's manifest, once every file of the bundle matches the pin (BundleError naming each that does not)."""
    verified = verify_bundle(bundle, pin, where=contract.HP_BUNDLE_SHA256)
    _log(f"bundle {pin[:12]}... verified: {verified.summary()}")
    manifest = (bundle / MANIFEST_NAME).read_bytes()
    if digest(manifest) != pin:  # read again after the check: the bytes used are the bytes checked
        raise BundleError(f"{contract.HP_BUNDLE_SHA256}: {MANIFEST_NAME} changed while the bundle was checked")
    return manifest


def capture_files(channel: Path) -> list[Path]:
    """Every capture file below the channel, in Firehose's dated folders; anything else refused by name."""
    name = contract.CAPTURE_CHANNEL
    if not channel.is_dir():
        raise TrainingJobError(name, f"no channel at {contract.CHANNELS_DIR}/{name}/; allowed: the stage's capture "
                                     "prefix as a channel")
    entries = scan_folder(channel)  # follows no link: a link could name any file of the container
    others = sorted(e.path for e in entries if e.kind != FOLDER and not (e.kind == FILE and
                                                                          e.path.endswith(CAPTURE_SUFFIX)))
    if others:
        shown = ", ".join(display_path(p)[:60] for p in others[:5])
        raise TrainingJobError(name, f"holds {len(others)} entries that are not capture files ({shown}); allowed: "
                                     f"{CAPTURE_SUFFIX} files in folders only")
    files = sorted(e.path for e in entries if e.kind == FILE)
    if not files:
        raise TrainingJobError(name, f"holds no {CAPTURE_SUFFIX} file; allowed: a prefix Firehose delivered to")
    return [channel / path for path in files]


def _target_source(manifest: bytes) -> dict:
    sources = json.loads(manifest).get("sources")
    target = sources.get(TARGET_DIR) if isinstance(sources, dict) else None
    if not (isinstance(target, dict) and set(target) == {"source", "revision"} and isinstance(target["source"], str)
            and (target["revision"] is None or isinstance(target["revision"], str))):
        raise BundleError(f"{contract.HP_BUNDLE_SHA256}: {MANIFEST_NAME}: sources.{TARGET_DIR}: allowed: the "
                          "target's source and revision, as `stage-weights` writes them (the candidate's manifest "
                          "names the same origin)")
    return target


def candidate_manifest(pinned: bytes, drafter: Path, drafter_origin: str) -> bytes:
    """The manifest of the pinned target beside the head in ``drafter`` (the folder whose bytes go up)."""
    target_files = [f for f in parse_manifest(pinned) if f.path.startswith(f"{TARGET_DIR}/")]
    drafter_files = describe({f"{DRAFTER_DIR}/{p.relative_to(drafter).as_posix()}": p
                              for p in sorted(drafter.rglob("*")) if p.is_file()})
    return render(target_files + drafter_files, {TARGET_DIR: _target_source(pinned),
                                                 DRAFTER_DIR: {"source": drafter_origin, "revision": None}})


def _copy_head(candidate: Path, into: Path) -> None:
    # What ops.stage_weights.plan uploads of a folder: its files, no dot files.
    for path in sorted(candidate.rglob("*")):
        rel = path.relative_to(candidate)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts):
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, into / rel)


def train(root: Path) -> dict:
    """The whole job on the folder ``root``; the gate's report as written to ``model/gate.json``."""
    config = read_config(root)
    channels = root / contract.CHANNELS_DIR
    bundle = channels / contract.BUNDLE_CHANNEL
    pinned = pinned_manifest(bundle, config.bundle_sha256)
    _target_source(pinned)  # refused now, not after hours of training
    capture = capture_files(channels / contract.CAPTURE_CHANNEL)
    _log(f"{config.stage} at K={config.k}, margin {config.margin:g}, {len(capture)} capture files")

    from models.trainer import traffic_training  # torch and vLLM: only once the input is known good
    from models.trainer.gate import PASSED

    report = traffic_training.run(capture=capture, stage=config.stage, target_name=config.target_name,
                                  target=bundle / TARGET_DIR, in_service=bundle / DRAFTER_DIR,
                                  work=root / contract.CHECKPOINTS_DIR, k=config.k, margin=config.margin,
                                  cpu_seconds=config.cpu_seconds, max_tokens=config.max_tokens, log=_log)
    candidate = Path(report.pop("candidate"))  # a path of this container means nothing to whoever reads the report
    model = root / contract.MODEL_DIR
    model.mkdir(parents=True, exist_ok=True)
    report["candidate_sha256"] = None
    if report["gate"] == PASSED:
        _copy_head(candidate, model / DRAFTER_DIR)
        manifest = candidate_manifest(pinned, model / DRAFTER_DIR, DRAFTER_ORIGIN + candidate.name)
        (model / contract.CANDIDATE_MANIFEST).write_bytes(manifest)
        report["candidate_sha256"] = digest(manifest)
    # Last: the state machine reads it, so it is there only with what it names.
    (model / contract.GATE_REPORT).write_text(json.dumps(report, indent=2) + "\n")
    _log(f"gate {report['gate']}; candidate_sha256 {report['candidate_sha256']}")
    return report


def _fail(root: Path, reason: str) -> None:
    line = " ".join(reason.split())  # one line, whatever the message held
    if len(line) > contract.MAX_FAILURE_CHARS:
        line = line[:contract.MAX_FAILURE_CHARS - 3] + "..."
    path = root / contract.FAILURE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line)
    _log(f"failed: {line}")


def _empty(folder: Path) -> None:
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(os.environ.get(ROOT_VAR, contract.ROOT))
    if argv not in ([], [contract.TRAIN_ARGUMENT]):
        _fail(root, f"arguments: got {len(argv)} ({display_path(' '.join(argv))[:60]}); allowed: none or "
                    f"{contract.TRAIN_ARGUMENT!r}")
        return 2
    try:
        train(root)
    except Exception as exc:
        _empty(root / contract.MODEL_DIR)  # a head without its manifest is no output: nothing half written stays
        if isinstance(exc, (TrainingJobError, CaptureError, BundleError)):
            _fail(root, str(exc))
            return 2
        # SageMaker shows the reason; the traceback (which may quote input) stays in the job's log.
        _fail(root, f"internal error: {type(exc).__name__} (the job's log has the traceback)")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
