"""The stack diff's classification on the real stacks (stacks/), one change at a time: on Staging (a
single-model endpoint) K, the instance type, the endpoint's name, the weights bundle, an alarm threshold;
on Dev (an inference component) K and the component's name. And the pull-request comment rendered from
those reviews: destructive changes first, counts, folding, GitHub's size limit, the failure rule and its
acknowledgement. Only the GitHub API call itself is not exercised here."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
from dataclasses import replace
from pathlib import Path

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from review import pr_comment, synthesis, verdicts
from review.verdicts import ENDPOINT, ENDPOINT_CONFIG, FAIL, INFERENCE_COMPONENT, MODEL, PASS, StackReview
from stacks.application import OFFLINE, build_app
from stacks.environments import DEV, STAGING, EnvironmentConfig
from peagle_constructs import AlarmThresholds


def _template(env: EnvironmentConfig, outdir: Path | None = None) -> dict:
    app = App(context=OFFLINE, outdir=str(outdir) if outdir else None)
    stage = build_app(app, [env], nag=False)[env.name]
    template = Template.from_stack(stage.stack).to_json()
    if outdir is not None:
        app.synth()
    return template


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Renamed(EnvironmentConfig):
    """Another endpoint and component name (both derive from the environment's, which names the Stage)."""

    @property
    def endpoint_name(self) -> str:
        return f"peagle-{self.name.lower()}-blue"

    @property
    def component_name(self) -> str | None:
        return None if not self.hosts_components else "peagle-dev-gpt-oss-20b-blue"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ComponentRenamed(EnvironmentConfig):
    @property
    def component_name(self) -> str | None:
        return "peagle-dev-gpt-oss-20b-blue"


def _renamed(env: EnvironmentConfig, kind: type = _Renamed) -> EnvironmentConfig:
    return kind(**{f.name: getattr(env, f.name) for f in dataclasses.fields(env)})


SINGLE = STAGING  # an environment served by a single-model endpoint


@pytest.fixture(scope="module")
def base() -> dict:
    return _template(SINGLE)


CHANGES = {
    "k": lambda: replace(SINGLE, model=replace(SINGLE.model, serving=replace(SINGLE.model.serving,
                                                                               num_speculative_tokens=5))),
    "instance-type": lambda: replace(SINGLE, fleet=replace(SINGLE.fleet, instance_type="ml.g6e.4xlarge")),
    "endpoint-name": lambda: _renamed(SINGLE),
    "weights-bundle": lambda: replace(SINGLE, model=replace(SINGLE.model, serving=replace(
        SINGLE.model.serving, target_model=f"s3://peagle-weights-staging/bundles/gpt-oss-20b-v2/{'c0' * 32}/target/",
        drafter_model=f"s3://peagle-weights-staging/bundles/gpt-oss-20b-v2/{'c0' * 32}/drafter/",
        bundle_manifest_sha256="c0" * 32))),  # a pinned bundle lives under its digest
    "alarm-threshold": lambda: replace(SINGLE, model=replace(SINGLE.model,
                                                             alarm_thresholds=AlarmThresholds(ttft_p90_ms=1500.0))),
}
# Dev serves an inference component: changes measured against Dev's own template.
COMPONENT_CHANGES = {
    "component-k": lambda: replace(DEV, model=replace(DEV.model, serving=replace(DEV.model.serving,
                                                                                      num_speculative_tokens=5))),
    "component-name": lambda: _renamed(DEV, _ComponentRenamed),
}


@pytest.fixture(scope="module")
def reviews(base) -> dict[str, StackReview]:
    out = {}
    for name, change in CHANGES.items():
        findings = verdicts.classify(base, _template(change()))
        out[name] = StackReview(display_name="Staging/PEagle", stack_name="Staging-PEagle", findings=findings)
    dev = _template(DEV)
    for name, change in COMPONENT_CHANGES.items():
        findings = verdicts.classify(dev, _template(change()))
        out[name] = StackReview(display_name="Dev/PEagle", stack_name="Dev-PEagle", findings=findings)
    return out


def _by_type(review: StackReview, rtype: str) -> list[verdicts.Finding]:
    return [f for f in review.findings if f.type == rtype]


def test_a_new_k_replaces_model_and_config_and_updates_the_endpoint_in_place(reviews):
    r = reviews["k"]
    assert r.verdict == PASS
    assert {f.change for f in _by_type(r, MODEL)} == {"replaced"} and {f.change for f in _by_type(r, ENDPOINT_CONFIG)} == {"replaced"}
    (endpoint,) = _by_type(r, ENDPOINT)
    assert endpoint.change == "updated" and endpoint.verdict == PASS and "blue/green" in endpoint.why


def test_a_new_k_on_a_component_replaces_its_model_and_rolls_the_component_copy_by_copy(reviews):
    r = reviews["component-k"]
    assert r.verdict == PASS
    assert {f.change for f in _by_type(r, MODEL)} == {"replaced"}
    (component,) = _by_type(r, INFERENCE_COMPONENT)
    assert component.change == "updated" and component.verdict == PASS and "copy by copy" in component.why
    assert not _by_type(r, ENDPOINT) and not _by_type(r, ENDPOINT_CONFIG)  # the fleet is untouched


def test_a_renamed_component_is_a_replacement_that_fails(reviews):
    r = reviews["component-name"]
    assert r.verdict == FAIL
    (component,) = _by_type(r, INFERENCE_COMPONENT)
    assert component.change == "replaced" and component.verdict == FAIL and "InferenceComponentName" in component.why
    assert component.advice


def test_an_instance_type_change_under_autoscaling_fails_with_the_two_step_way(reviews):
    r = reviews["instance-type"]
    assert r.verdict == FAIL
    failing = [f for f in r.findings if f.verdict == FAIL]
    assert failing and any("instance type" in f.why and f.advice for f in failing), failing


def test_a_change_of_prods_capacity_ladder_is_judged_as_an_instance_type_change():
    """Prod runs under autoscaling with a fallback ladder: reordering it or adding the ladder to a fleet that had
    none changes the instance types its variant runs on, so the diff fails it with the two-step way; a
    ladder that stays the same passes."""
    from stacks.environments import PROD

    from peagle_constructs import InstancePool

    base = _template(PROD)
    reordered = replace(PROD, fleet=replace(PROD.fleet, fallback_instances=tuple(reversed(PROD.fleet.fallback_instances))))
    no_ladder = replace(PROD, fleet=replace(PROD.fleet, fallback_instances=(), provision_timeout=None))
    longer = replace(PROD, fleet=replace(PROD.fleet, fallback_instances=(
        *PROD.fleet.fallback_instances, InstancePool(instance_type="ml.p5e.48xlarge"))))
    for changed in (reordered, longer):
        findings = verdicts.classify(base, _template(changed))
        (ladder,) = [f for f in findings if f.change.startswith("instance type")]
        assert ladder.verdict == FAIL and ladder.advice and " > " in ladder.change, ladder
    (added,) = [f for f in verdicts.classify(_template(no_ladder), base) if f.change.startswith("instance type")]
    assert added.change == ("instance type ml.g6e.2xlarge -> ml.g6e.2xlarge > ml.g6e.4xlarge > ml.g7e.2xlarge > "
                            "ml.p5.4xlarge") and added.verdict == FAIL
    same = replace(PROD, model=replace(PROD.model, serving=replace(PROD.model.serving, num_speculative_tokens=5)))
    assert not [f for f in verdicts.classify(base, _template(same)) if f.change.startswith("instance type")]


def test_a_renamed_endpoint_is_a_removal_plus_an_addition_that_is_a_replacement(reviews):
    r = reviews["endpoint-name"]
    assert r.verdict == FAIL
    (endpoint,) = _by_type(r, ENDPOINT)  # same logical id, new EndpointName: CloudFormation replaces it
    assert endpoint.change == "replaced" and endpoint.verdict == FAIL and "downtime" in endpoint.why


def test_a_new_weights_bundle_is_a_new_model_rolled_out_blue_green(reviews):
    r = reviews["weights-bundle"]
    assert r.verdict == PASS
    (model,) = _by_type(r, MODEL)
    assert model.change == "replaced" and "PrimaryContainer" in model.why
    policies = [f for f in r.findings if f.type == "AWS::IAM::ManagedPolicy"]
    assert policies and policies[0].change == "updated"  # the role may read the new prefix only


def test_an_alarm_threshold_is_an_in_place_update_with_nothing_destructive(reviews):
    r = reviews["alarm-threshold"]
    assert r.verdict == PASS
    alarms = [f for f in r.findings if f.type == "AWS::CloudWatch::Alarm"]
    assert alarms and {f.change for f in alarms} == {"updated"}
    assert not _by_type(r, MODEL) and not _by_type(r, ENDPOINT)
    assert pr_comment.destructive([r]) == []


def test_the_security_diff_is_the_cdk_clis_own(base, tmp_path):
    """`cdk diff --security-only` on the real head assembly against the base template: the new bundle's
    read grant shows as an IAM statement change."""
    head_dir = tmp_path / "head"
    _template(CHANGES["weights-bundle"](), head_dir)
    base_file = tmp_path / "base.template.json"
    base_file.write_text(json.dumps(base))
    text = synthesis.security_diff(Path.cwd(), head_dir, base_file, "Staging/PEagle")
    assert text.startswith("IAM") and "gpt-oss-20b-v2" in text and "s3:GetObject" in text


def test_the_comment_puts_destructive_changes_first_then_counts_then_folded_details(reviews):
    prod = StackReview(display_name="Prod/PEagle", stack_name="Prod-PEagle", findings=reviews["k"].findings,
                       security_diff="IAM Statement Changes\n│ + │ arn │ Allow │ s3:GetObject │")
    ordered = [reviews["endpoint-name"], prod]
    text = pr_comment.render(ordered, base="main", head="abc123", artifact_url="https://example.com/run/1")
    assert text.startswith(pr_comment.MARKER)
    assert text.index("Destructive changes") < text.index("### Per stage") < text.index("### Details")
    assert "❌" in text.split("### Per stage")[0] and "ServingEndpoint" in text.split("### Per stage")[0]
    counts = reviews["k"].counts()
    assert f"| `Prod/PEagle` | ✅ | {counts['added']} | {counts['updated']} | {counts['removed']} | {counts['replaced']} |" in text
    assert "<details><summary><code>Prod/PEagle</code>: IAM" in text
    assert "Full diff: https://example.com/run/1" in text


def test_a_huge_diff_is_folded_and_cut_under_githubs_limit(reviews):
    huge = [StackReview(display_name=f"Stage{i}/PEagle", stack_name=f"S{i}", findings=reviews["k"].findings,
                        cli_diff="~ changed line\n" * 8000) for i in range(3)]
    text = pr_comment.render(huge, base="main", head="abc", artifact_url="https://example.com/artifact")
    assert len(text) <= pr_comment.GITHUB_LIMIT
    assert "in the full diff (job artifact)" in text  # cdk diff left to the artifact first
    tiny_limit = pr_comment.render(huge, base="main", head="abc", artifact_url="https://example.com/artifact",
                                   limit=12_000)
    assert len(tiny_limit) <= 12_000 and "https://example.com/artifact" in tiny_limit


def test_the_check_fails_on_a_destructive_change_unless_acknowledged(reviews, tmp_path):
    data = {"base": "main", "reviews": [reviews["endpoint-name"].to_json(), reviews["k"].to_json()]}
    path = tmp_path / "reviews.json"
    path.write_text(json.dumps(data))
    summary = tmp_path / "summary.md"
    assert pr_comment.main(["--reviews", str(path), "--summary", str(summary)]) == 1
    assert pr_comment.main(["--reviews", str(path), "--acknowledged"]) == 0
    assert summary.read_text().startswith(pr_comment.MARKER)
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"base": "main", "reviews": [reviews["k"].to_json()]}))
    assert pr_comment.main(["--reviews", str(ok)]) == 0
    # The JSON round trip keeps every finding.
    back = StackReview.from_json(reviews["k"].to_json())
    assert back.findings == reviews["k"].findings and back.counts() == reviews["k"].counts()


def test_an_update_sagemaker_refuses_is_listed_with_the_destructive_changes(reviews):
    lines = pr_comment.destructive([reviews["instance-type"]])
    assert lines and lines[0].startswith("- ❌") and "instance type" in lines[0]


def test_the_acknowledgement_label_is_read_as_the_pull_request_has_it_now(reviews, tmp_path, monkeypatch):
    """Through the GitHub API stand-in (harness/rehearsal/github_api.py) on loopback: the comment is created,
    then updated in place; the label is looked up live, so a run whose event payload has no label passes
    once the pull request carries it."""
    from harness.rehearsal.github_api import GitHubApi

    path = tmp_path / "reviews.json"
    path.write_text(json.dumps({"base": "main", "reviews": [reviews["endpoint-name"].to_json()]}))
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 5, "labels": []}}))
    with GitHubApi(repository="o/r", token="t0k") as api:
        monkeypatch.setenv("GITHUB_API_URL", api.url)
        monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
        monkeypatch.setenv("GITHUB_TOKEN", "t0k")
        monkeypatch.setenv("PR_NUMBER", "5")
        monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
        args = ["--reviews", str(path), "--post", "--acknowledge-label", "stack-diff-acknowledged"]
        assert pr_comment.main(args) == 1
        api.set_labels(5, ["stack-diff-acknowledged"])
        assert pr_comment.main(args) == 0
        writes = [(c.method, c.path) for c in api.state.calls if c.method != "GET"]
        assert writes == [("POST", "/repos/o/r/issues/5/comments"), ("PATCH", "/repos/o/r/issues/comments/1001")]
        assert len(api.state.comments_on(5)) == 1
        # Bad credentials are an error, not a check that quietly passes or fails.
        monkeypatch.setenv("GITHUB_TOKEN", "another")
        with pytest.raises(urllib.error.HTTPError, match="401"):
            pr_comment.main(args)


def test_the_cli_diff_in_the_comment_ends_where_the_diff_ends():
    cli = ("Stack Prod/PEagle (Prod-PEagle)\nResources\n[~] AWS::SageMaker::Model PEagle/Serving/Model replace\n\n\n"
           "jsii-kernel-ab12/lib/program.js:1:5591\nWARNING synthesized offline with the placeholder account\n"
           "   Prod/PEagle\n   Acknowledge with 'Annotation::peagle:offline-account'\n\n✨  Number of stacks with differences: 1")
    assert synthesis._diff_only("some preamble\n" + cli) == (
        "Stack Prod/PEagle (Prod-PEagle)\nResources\n[~] AWS::SageMaker::Model PEagle/Serving/Model replace")
