"""A stage that trains its drafter in the cloud (EnvironmentConfig.training): what turning it on adds, judged by the
scanners every stage passes, and the configs that cannot train refused at synth by name.

The committed stages train nowhere (no stage's weights are pinned yet): tests.training_config pins Dev and turns
training on, as a team would once its first bundle is staged."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from aws_cdk import App

from peagle_constructs import DrafterTrainingProps, ServingConfigError
from peagle_contract.training_job import TRAINER_COMMAND
from stacks.application import OFFLINE, build_app
from stacks.environments import DEV, ENVIRONMENTS, STAGING
from tests.stacks.template_helpers import only, resources_of
from tests.stacks.test_stacks_checkov import _checkov
from tests.stacks.test_stacks_safety import CFN_LINT, CFN_LINT_ERROR_BIT
from tests.training_config import PIN, trains, with_dev_training

REPO = Path(__file__).resolve().parents[2]


def _synth(environments, outdir: Path) -> dict[str, dict]:
    app = App(context=OFFLINE, outdir=str(outdir))
    stages = build_app(app, environments)  # the nag packs and the Control Tower rules: synth fails on a finding
    app.synth()
    return {name: json.loads((outdir / f"assembly-{name}" / stage.stack.template_file).read_text())
            for name, stage in stages.items()}


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> tuple[Path, dict[str, dict], dict[str, dict]]:
    """Dev pinned and training (weekly), and Dev pinned only: the same stage with and without training."""
    root = tmp_path_factory.mktemp("training")
    pinned_only = tuple(trains(env) if env.name == "Dev" else env for env in ENVIRONMENTS)
    pinned_only = tuple(replace(env, training=None) for env in pinned_only)
    return root / "on", _synth(with_dev_training(ENVIRONMENTS), root / "on"), _synth(pinned_only, root / "off")


def test_turning_training_on_adds_the_state_machine_and_changes_nothing_that_serves(synthesized):
    _, on, off = synthesized
    dev_on, dev_off = on["Dev"], off["Dev"]
    added = sorted(set(dev_on["Resources"]) - set(dev_off["Resources"]))
    assert added and all(lid.startswith("DrafterTraining") for lid in added), added
    assert not set(dev_off["Resources"]) - set(dev_on["Resources"])
    changed = sorted(lid for lid in dev_off["Resources"] if dev_on["Resources"][lid] != dev_off["Resources"][lid])
    kinds = {dev_on["Resources"][lid]["Type"] for lid in changed}
    # The capture bucket (a lifecycle rule for checkpoints) and its policy (the job's role may write candidates);
    # no model, endpoint config, endpoint or component is touched, so no deploy of it replaces anything.
    assert kinds == {"AWS::S3::Bucket", "AWS::S3::BucketPolicy"}, changed
    assert on["Staging"] == off["Staging"] and on["Prod"] == off["Prod"]
    assert {"DrafterTrainingStateMachine", "DrafterCandidateParameter"} <= set(dev_on["Outputs"])


def test_the_job_runs_the_training_image_not_the_serving_one(synthesized):
    outdir, on, _ = synthesized
    dev = on["Dev"]
    (_, machine) = only(dev, "AWS::StepFunctions::StateMachine")
    definition = json.dumps(machine["Properties"]["DefinitionString"])
    (_, model) = only(dev, "AWS::SageMaker::Model")
    serving_image = json.dumps(model["Properties"]["PrimaryContainer"]["Image"])
    (manifest,) = (outdir / "assembly-Dev").glob("*.assets.json")
    assets = json.loads(manifest.read_text())["dockerImages"]
    assert len(assets) == 2  # the serving image and the trainer's, each its own asset
    (trainer,) = [h for h in assets if h not in serving_image]
    assert trainer in definition and f'\\"{TRAINER_COMMAND}\\"' in definition
    context = manifest.parent / assets[trainer]["source"]["directory"]
    assert (context / "Dockerfile").read_bytes() == (REPO / "models" / "Dockerfile").read_bytes()
    assert sorted(p.name.split("-")[0] for p in (context / "wheels").iterdir()) == ["peagle_contract", "peagle_trainer"]


def test_the_training_stage_passes_cfn_lint_and_checkov(synthesized):
    outdir, _, _ = synthesized
    template = next((outdir / "assembly-Dev").glob("*.template.json"))
    proc = subprocess.run([str(CFN_LINT), "--format", "parseable", str(template)], capture_output=True, text=True,
                          timeout=300)
    assert not proc.returncode & CFN_LINT_ERROR_BIT, proc.stdout
    report = _checkov(outdir / "assembly-Dev")
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert failed == [] and report["summary"]["parsing_errors"] == 0, failed
    assert report["summary"]["passed"] >= 50 and report["summary"]["resource_count"] >= 40, report["summary"]


def test_the_stage_trains_from_its_own_capture_its_pin_and_its_k(synthesized):
    _, on, _ = synthesized
    (_, machine) = only(on["Dev"], "AWS::StepFunctions::StateMachine")
    text = json.dumps(machine["Properties"]["DefinitionString"])
    assert f'\\"bundle_sha256\\":\\"{PIN}\\"' in text and '\\"k\\":\\"7\\"' in text
    assert '\\"stage\\":\\"dev\\"' in text and '\\"target_name\\":\\"gpt-oss-20b\\"' in text
    assert f"{PIN}/" in text and "/capture/dev/" in text
    (_, rule) = only(on["Dev"], "AWS::Events::Rule")
    assert rule["Properties"]["ScheduleExpression"] == "rate(7 days)"
    assert resources_of(on["Staging"], "AWS::StepFunctions::StateMachine") == {}


@pytest.mark.parametrize(("environments", "field", "allowed"), [
    (lambda: [replace(DEV, training=DrafterTrainingProps())], "Dev.training", "weights are not pinned"),
    (lambda: [trains(STAGING)], "Staging.training", "capture is None"),
    (lambda: [trains(DEV, instance_type="ml.m5.xlarge")], "Dev.training.instance_type", "allowed"),
    (lambda: [trains(DEV, volume_size_gb=0)], "Dev.training.volume_size_gb", "allowed"),
])
def test_a_stage_that_cannot_train_is_refused_at_synth_by_name(environments, field, allowed):
    with pytest.raises(ServingConfigError) as caught:
        build_app(App(context=OFFLINE), environments(), nag=False)
    assert str(caught.value).startswith(f"{field}:") and allowed in str(caught.value)
