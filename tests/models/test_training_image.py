"""models/Dockerfile, the drafter's training image, cannot be built here (no Docker engine): check what a build,
SageMaker's training contract and the state machine rely on, and that the trainer never moves the serving image."""

from __future__ import annotations

import json
import re
import shlex
import zipfile
from pathlib import Path

from peagle_contract.training_job import TRAIN_ARGUMENT, TRAINER_COMMAND
from stacks.image_context import SERVING, TRAINING, WHEELS, image_context, sources_digest
from stacks.release import VERSION

ROOT = Path(__file__).resolve().parents[2]


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [(line.split(" ", 1)[0].upper(), line.split(" ", 1)[1].strip()) for line in map(str.strip, text.splitlines())
            if line and not line.startswith("#")]


def test_same_base_as_the_serving_image_so_the_gate_measures_the_vllm_that_serves():
    froms = {spec.name: [r for w, r in _instructions(spec.dockerfile) if w == "FROM"] for spec in (SERVING, TRAINING)}
    assert froms["training"] == froms["serving"] and len(froms["training"]) == 1


def test_sagemaker_runs_the_trainers_command_with_train():
    instr = dict((w, r) for w, r in _instructions(TRAINING.dockerfile) if w in ("ENTRYPOINT", "CMD"))
    assert json.loads(instr["ENTRYPOINT"]) == [TRAINER_COMMAND] and json.loads(instr["CMD"]) == [TRAIN_ARGUMENT]
    pyproject = (ROOT / "models" / "pyproject.toml").read_text()
    assert f'{TRAINER_COMMAND} = "models.trainer.training_job:main"' in pyproject


def test_the_context_holds_the_dockerfile_and_the_trainers_and_contracts_wheels_only():
    context = image_context(spec=TRAINING)
    assert sorted(p.name for p in context.iterdir()) == ["Dockerfile", WHEELS]
    assert (context / "Dockerfile").read_bytes() == TRAINING.dockerfile.read_bytes()
    for word, rest in _instructions(TRAINING.dockerfile):
        if word == "COPY":
            *sources, _ = shlex.split(rest)
            assert all((context / s).exists() for s in sources), rest
    wheels = sorted(p.name for p in (context / WHEELS).iterdir())
    assert wheels == [f"peagle_contract-{VERSION}-py3-none-any.whl", f"peagle_trainer-{VERSION}-py3-none-any.whl"]
    with zipfile.ZipFile(context / WHEELS / wheels[1]) as wheel:
        names = wheel.namelist()
        entry_points = wheel.read(f"peagle_trainer-{VERSION}.dist-info/entry_points.txt").decode()
    assert "models/trainer/training_job.py" in names and "models/trainer/traffic_training.py" in names
    assert not [n for n in names if n.startswith(("models/answers", "tests", "ops", "harness", "bench"))], names
    assert f"{TRAINER_COMMAND} = models.trainer.training_job:main" in entry_points


def test_the_trainer_is_no_input_of_the_serving_image():
    """A new serving image is a new model: a trainer change must not redeploy every endpoint. The serving context's
    digest and bytes come from the contract and the runtime only (tests/runtime/test_image.py checks its wheels)."""
    assert SERVING.distributions == (ROOT / "contract", ROOT / "runtime")
    assert ROOT / "models" in TRAINING.distributions
    assert image_context(spec=SERVING).name.startswith("serving-")
    digest = sources_digest(TRAINING.distributions, TRAINING.dockerfile)
    assert image_context(spec=TRAINING).name == f"training-{digest}"
