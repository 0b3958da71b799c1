"""The drafter's training job: what the stack's state machine hands a SageMaker training job, and what it reads back.

This module is the single source of truth for that contract, as :mod:`peagle_contract.serving` is for the serving
container's environment. The CDK side renders the hyperparameters with :func:`render_hyperparameters` and names the
channels and outputs from here; the trainer's entry point (models.trainer.training_job) parses them back with
:func:`parse_hyperparameters` before it reads a byte of input. Standard library only.

SageMaker's training contract (the paths below, under ``/opt/ml``): the job's image is run with its channels
downloaded to ``input/data/<channel>/`` and its hyperparameters, each a string, in
``input/config/hyperparameters.json``; what the job leaves in ``model/`` is uploaded to the job's output path
(uncompressed, so file by file); a reason written to ``output/failure`` becomes the job's FailureReason.

The channels:

- :data:`CAPTURE_CHANNEL`: the stage's capture prefix (the JSON-lines files Firehose writes, in dated folders);
- :data:`BUNDLE_CHANNEL`: the stage's pinned weights bundle (``target/``, ``drafter/``, ``manifest.json``), checked
  file by file against :data:`HP_BUNDLE_SHA256` before it is loaded: the job trusts the pin, not the prefix.

The outputs, in ``model/``: :data:`GATE_REPORT` always (the gate's figures, whichever way it went); only when the
gate passed, the candidate head in ``drafter/`` and :data:`CANDIDATE_MANIFEST`, the manifest of the bundle that
pairs the pinned target with it. That manifest's SHA-256 is the candidate's pin. Staging the bundle means
writing exactly those bytes beside the pinned target's files: ``ops.stage_weights.stage`` with the target and this
head and the origins the manifest records gives the same digest (``make stage-weights`` on the command line records
origins as typed, so it gives another one unless they match). Whatever stages it, the serving container checks
every file against the pin.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from peagle_contract.capture import NAME_ALLOWED, NAME_PATTERN
from peagle_contract.capture import short_repr as _short
from peagle_contract.serving import ServingConfigError

ROOT = "/opt/ml"
# The training image's command (the peagle-trainer distribution's console script); the state machine names it.
TRAINER_COMMAND = "peagle-train"
HYPERPARAMETERS_FILE = "input/config/hyperparameters.json"
CHANNELS_DIR = "input/data"
MODEL_DIR = "model"
FAILURE_FILE = "output/failure"
# Where the trainer keeps its resumable steps; the state machine's CheckpointConfig syncs it to S3 (its LocalPath).
CHECKPOINTS_DIR = "checkpoints"
TRAIN_ARGUMENT = "train"  # what SageMaker runs a training image with (the state machine passes it too)
CAPTURE_CHANNEL = "capture"
BUNDLE_CHANNEL = "bundle"
CHANNELS = (CAPTURE_CHANNEL, BUNDLE_CHANNEL)
GATE_REPORT = "gate.json"
CANDIDATE_MANIFEST = "manifest.json"
REPORT_FIELDS = ("gate", "candidate_sha256")  # what the state machine reads from GATE_REPORT
# SageMaker keeps at most this many characters of output/failure as the job's FailureReason.
MAX_FAILURE_CHARS = 1024

HP_STAGE = "stage"
HP_TARGET_NAME = "target_name"
HP_K = "k"
HP_MARGIN = "margin"
HP_CPU_SECONDS = "cpu_seconds"
HP_MAX_TOKENS = "max_tokens"
HP_BUNDLE_SHA256 = "bundle_sha256"
_REQUIRED = (HP_STAGE, HP_TARGET_NAME, HP_K, HP_MARGIN, HP_MAX_TOKENS, HP_BUNDLE_SHA256)
_KEYS = frozenset({*_REQUIRED, HP_CPU_SECONDS})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
MAX_HYPERPARAMETERS_BYTES = 64 << 10


class TrainingJobError(ServingConfigError):
    """A hyperparameter or channel is not what this contract allows: ``<field>: <message>``, as every config
    error of the contract reads."""


@dataclass(frozen=True, kw_only=True)
class TrainingJobConfig:
    """One training run: the stage and target name its capture records carry, the K to train and gate at, the
    AL ratio the gate's interval must reach, the CPU (or GPU) seconds the recipe may spend (None: the recipe's),
    the tokens per held-out answer, and the pinned bundle the target and the head in service come from."""

    stage: str
    target_name: str
    k: int
    margin: float
    max_tokens: int
    bundle_sha256: str
    cpu_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in (HP_STAGE, HP_TARGET_NAME):
            value = getattr(self, name)
            if not isinstance(value, str) or not NAME_PATTERN.match(value):  # as the records name them
                raise TrainingJobError(name, f"got {_short(value)}; allowed: {NAME_ALLOWED}")
        _integer(HP_K, self.k, 1, 32)
        _integer(HP_MAX_TOKENS, self.max_tokens, 1, 4096)
        _number(HP_MARGIN, self.margin, 1.0, 10.0)
        if self.cpu_seconds is not None:
            _number(HP_CPU_SECONDS, self.cpu_seconds, 1.0, 7 * 24 * 3600.0)
        if not isinstance(self.bundle_sha256, str) or not _SHA256.match(self.bundle_sha256):
            raise TrainingJobError(HP_BUNDLE_SHA256, f"got {_short(self.bundle_sha256)}; allowed: a SHA-256 digest, "
                                                     "64 lowercase hex characters (the stage's pin)")


def _integer(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TrainingJobError(name, f"got {_short(value)}; allowed: a whole number from {low} to {high}")


def _number(name: str, value: object, low: float, high: float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if not ok or not low <= value <= high:
        raise TrainingJobError(name, f"got {_short(value)}; allowed: a number from {low:g} to {high:g}")


def render_hyperparameters(config: TrainingJobConfig) -> dict[str, str]:
    """The job's HyperParameters (SageMaker takes strings only), which :func:`parse_hyperparameters` reads back."""
    values = {HP_STAGE: config.stage, HP_TARGET_NAME: config.target_name, HP_K: str(config.k),
              HP_MARGIN: repr(float(config.margin)), HP_MAX_TOKENS: str(config.max_tokens),
              HP_BUNDLE_SHA256: config.bundle_sha256}
    if config.cpu_seconds is not None:
        values[HP_CPU_SECONDS] = repr(float(config.cpu_seconds))
    return values


def parse_hyperparameters(raw: bytes | str) -> TrainingJobConfig:
    """The run ``hyperparameters.json`` asks for. Only what :func:`render_hyperparameters` writes is accepted:
    every key known, every value a string of the kind written (no coercion of ``"7.0"`` to a K, no ``"nan"``)."""
    if len(raw) > MAX_HYPERPARAMETERS_BYTES:
        raise TrainingJobError(HYPERPARAMETERS_FILE, f"holds {len(raw)} bytes; allowed: at most "
                                                     f"{MAX_HYPERPARAMETERS_BYTES}")
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrainingJobError(HYPERPARAMETERS_FILE, f"is not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(obj, dict):
        raise TrainingJobError(HYPERPARAMETERS_FILE, f"got a JSON {type(obj).__name__}; allowed: an object")
    unknown = sorted(set(obj) - _KEYS)
    missing = [k for k in _REQUIRED if k not in obj]
    if unknown or missing:
        raise TrainingJobError(HYPERPARAMETERS_FILE, f"unknown keys {_short(unknown, 80)}, missing {missing}; "
                                                     f"allowed: {sorted(_KEYS)} ({HP_CPU_SECONDS} optional)")
    for key, value in obj.items():
        if not isinstance(value, str):
            raise TrainingJobError(key, f"got a JSON {type(value).__name__}; allowed: a string, as SageMaker passes "
                                        "every hyperparameter")

    def whole(key: str) -> int:
        if not obj[key].isascii() or not obj[key].isdigit():
            raise TrainingJobError(key, f"got {_short(obj[key])}; allowed: a whole number in decimal digits")
        return int(obj[key])

    def number(key: str) -> float:
        if not _NUMBER.match(obj[key]):
            raise TrainingJobError(key, f"got {_short(obj[key])}; allowed: a decimal number such as 1.05")
        return float(obj[key])

    return TrainingJobConfig(stage=obj[HP_STAGE], target_name=obj[HP_TARGET_NAME], k=whole(HP_K),
                             margin=number(HP_MARGIN), max_tokens=whole(HP_MAX_TOKENS),
                             bundle_sha256=obj[HP_BUNDLE_SHA256],
                             cpu_seconds=number(HP_CPU_SECONDS) if HP_CPU_SECONDS in obj else None)
