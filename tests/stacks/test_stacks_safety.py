"""Every stage is nag-clean under the four packs and lint-clean under cfn-lint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from peagle_constructs.security import NAG_PACKS, control_tower_rules
from tests.stacks.template_helpers import STAGES

CFN_LINT = Path(sys.executable).with_name("cfn-lint")
CFN_LINT_ERROR_BIT = 2  # cfn-lint's exit code is a bit mask: 2 errors, 4 warnings, 8 informational


@pytest.mark.parametrize("pack", NAG_PACKS, ids=lambda p: p.__name__)
@pytest.mark.parametrize("name", STAGES)
def test_nag_pack_passes(synthesized_app, name, pack):
    report = pack().validate_scope(synthesized_app.stages[name].stack)
    open_findings = [v.rule_name for v in report.violations]
    assert report.success, f"{name} {pack.__name__}: open findings {open_findings}"
    assert open_findings == []


def test_packs_are_registered_on_every_stage(synthesized_app):
    for name, stage in synthesized_app.stages.items():
        names = sorted(plugin.name for plugin in stage.policy_validation_beta1)
        expected = sorted([*(pack().name for pack in NAG_PACKS), control_tower_rules().name])
        assert names == expected and len(names) == 5 and "cdk-validator-cfnguard" in names, name


def test_every_key_limits_grants_to_aws_services_or_control_tower_fails_synth(tmp_path, monkeypatch):
    """Negative control for the Guard rules: without the CT.KMS.PR.3 statement on every key, synth stops, and
    the report names each key; with it (every other test's synth) it passes."""
    from aws_cdk import App

    from stacks.application import OFFLINE, build_app
    from stacks.environments import ENVIRONMENTS

    for module in ("single_model_endpoint", "monitoring", "components"):
        monkeypatch.setattr(f"peagle_constructs.{module}.limit_grants_to_aws_services", lambda key: key)
    app = App(outdir=str(tmp_path), context=OFFLINE)
    build_app(app, ENVIRONMENTS)
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    assert {r["pluginName"] for r in report["pluginReports"]} == {"cdk-validator-cfnguard"}  # one per stage
    failed = {(c["cloudFormationResource"]["templatePath"].split("/")[0], c["cloudFormationResource"]["logicalId"])
              for r in report["pluginReports"] for v in r["violations"] if "[CT.KMS.PR.3]" in v["description"]
              for c in v["violatingConstructs"] if "cloudFormationResource" in c}
    keys = set(_keys(tmp_path))
    assert len(keys) == len(ENVIRONMENTS) and failed == keys  # one key per stage, every one refused


def _keys(outdir):
    for template in sorted(outdir.glob("assembly-*/*.template.json")):
        for logical, resource in json.loads(template.read_text())["Resources"].items():
            if resource["Type"] == "AWS::KMS::Key":
                yield template.parent.name, logical


def test_an_unacknowledged_finding_fails_synth(tmp_path, monkeypatch):
    """Negative control: without the acknowledgements the packs must stop `cdk synth`."""
    from aws_cdk import App

    import peagle_constructs.security as security
    from stacks.application import OFFLINE, build_app
    from stacks.environments import DEV

    monkeypatch.setattr(security, "_acknowledge", lambda *args, **kwargs: None)
    app = App(outdir=str(tmp_path), context=OFFLINE)
    build_app(app, [DEV])
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = (tmp_path / "validation-report.json").read_text()
    assert "SageMakerEndpointConfigurationKMSKeyConfigured" in report and "AwsSolutions-IAM5" in report


def test_every_acknowledgement_is_needed_and_has_a_reason(monkeypatch):
    """Acknowledgements and findings match one to one: none stale, none missing, each with a reason."""
    from aws_cdk import App

    import peagle_constructs.security as security
    from stacks.application import OFFLINE, build_app
    from stacks.environments import ENVIRONMENTS

    made: set[tuple[str, str]] = set()

    def record(construct, finding, reason):  # noqa: ANN001
        assert len(reason) > 40, (finding, reason)
        made.add((construct.node.path, finding))

    monkeypatch.setattr(security, "_acknowledge", record)
    stages = build_app(App(context=OFFLINE), ENVIRONMENTS, nag=False)
    found: set[tuple[str, str]] = set()
    for stage in stages.values():
        for pack in NAG_PACKS:
            for violation in pack().validate_scope(stage.stack).violations:
                for resource in violation.violating_resources:
                    path = resource.construct_path or ""
                    found.add((path.removesuffix("/Resource"), violation.rule_name))
    normalise = {(path.removesuffix("/Resource"), finding) for path, finding in made if not finding.startswith(GUARD)}
    assert found and normalise == found


GUARD = "cdk-validator-cfnguard::"


def test_every_control_tower_acknowledgement_is_needed(monkeypatch, tmp_path):
    """The same for the Guard rules: synthesized without any acknowledgement, the Control Tower plugin fails on
    exactly the rules the security module acknowledges, on exactly those constructs."""
    from aws_cdk import App, Validations

    import peagle_constructs.security as security
    from stacks.application import OFFLINE, build_app
    from stacks.environments import ENVIRONMENTS

    made: set[tuple[str, str]] = set()
    monkeypatch.setattr(security, "_acknowledge", lambda construct, finding, reason: made.add(
        (construct.node.path, finding)))
    app = App(context=OFFLINE, outdir=str(tmp_path))
    build_app(app, ENVIRONMENTS, nag=False)
    Validations.of(app).add_plugins(security.control_tower_rules())
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    found = {(c["constructPath"].removesuffix("/Resource"), f"{GUARD}{v['ruleName']}")
             for plugin in report["pluginReports"] for v in plugin["violations"] for c in v["violatingConstructs"]}
    wanted = {(path.removesuffix("/Resource"), finding) for path, finding in made if finding.startswith(GUARD)}
    assert wanted and found == wanted, (found, wanted)


@pytest.mark.parametrize("name", STAGES)
def test_cfn_lint_has_no_errors(template_paths, name):
    proc = subprocess.run([str(CFN_LINT), "--format", "parseable", str(template_paths[name])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode & ~(2 | 4 | 8) == 0, f"cfn-lint crashed ({proc.returncode}): {proc.stderr[-2000:]}"
    assert not proc.returncode & CFN_LINT_ERROR_BIT, f"cfn-lint errors in {name}:\n{proc.stdout}"
