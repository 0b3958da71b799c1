"""Pull-request stack diffs on scenario commits in a temporary git repository.

The repository holds a small two-stage app with the serving stack's shape (scenario_app/), so each
scenario is a commit to scenario.json. The base is synthesized once (cached by commit, as `make diff`
does); each scenario costs one synth of the working tree plus one offline `cdk diff` per stack.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from review import stack_diff, verdicts
from ops import cdk

SCENARIO_APP = Path(__file__).parent / "scenario_app"
STACKS = ["Dev/PEagle", "Prod/PEagle"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def scenario_repo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    repo = tmp_path_factory.mktemp("scenario-repo")
    shutil.copy(SCENARIO_APP / "app.py", repo / "app.py")
    shutil.copy(SCENARIO_APP / "scenario.json", repo / "scenario.json")
    (repo / "cdk.json").write_text(json.dumps({"app": "python3 app.py"}))
    (repo / ".gitignore").write_text("cdk.out/\n.cache/\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "add", "-A")
    _git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "base")
    return {"repo": repo, "base": _git(repo, "rev-parse", "HEAD"), "cache": tmp_path_factory.mktemp("base-cache")}


def _scenario(ctx: dict, message: str, **changes) -> Path:
    """Check out the base, apply ``changes`` to scenario.json and commit them as a scenario commit."""
    repo = ctx["repo"]
    _git(repo, "checkout", "-q", "--detach", ctx["base"])
    data = json.loads((repo / "scenario.json").read_text())
    data.update(changes)
    (repo / "scenario.json").write_text(json.dumps(data))
    _git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-am", message)
    return repo


def _run(ctx: dict) -> tuple[str, list[verdicts.StackReview]]:
    return stack_diff.run(repo=ctx["repo"], base_ref=ctx["base"], cache_dir=ctx["cache"], context={})


def _by_id(review: verdicts.StackReview) -> dict[str, list[verdicts.Finding]]:
    out: dict[str, list[verdicts.Finding]] = {}
    for f in review.findings:
        out.setdefault(f.logical_id, []).append(f)
    return out


@pytest.mark.slow
def test_changing_k_replaces_model_and_config_and_updates_endpoint_in_place(scenario_repo: dict) -> None:
    _scenario(scenario_repo, "K 7 -> 5", k=5)
    markdown, reviews = _run(scenario_repo)
    assert [r.display_name for r in reviews] == STACKS
    for r in reviews:
        assert r.verdict == verdicts.PASS, markdown
        found = _by_id(r)
        assert [(f.change, f.verdict) for f in found["Model"]] == [("replaced", verdicts.PASS)]
        assert [(f.change, f.verdict) for f in found["EndpointConfig"]] == [("replaced", verdicts.PASS)]
        assert "via replaced Model" in found["EndpointConfig"][0].why
        # The endpoint follows the new config by an in-place (blue/green) update, never a replacement.
        assert [(f.change, f.verdict) for f in found["Endpoint"]] == [("updated", verdicts.PASS)]
        assert "EndpointConfigName" in found["Endpoint"][0].why
        # The CLI's rendering is there for humans and agrees: the Model needs replacement.
        assert "AWS::SageMaker::Model" in r.cli_diff and "replace" in r.cli_diff.lower()
    assert markdown.count("<details><summary>cdk diff</summary>") == 2
    assert "All 2 stack(s) can roll out as they are." in markdown


@pytest.mark.slow
def test_renaming_the_endpoint_construct_replaces_it_and_fails(scenario_repo: dict) -> None:
    _scenario(scenario_repo, "rename endpoint construct", endpoint_id="ServingEndpoint")
    markdown, reviews = _run(scenario_repo)
    for r in reviews:
        assert r.verdict == verdicts.FAIL, markdown
        found = _by_id(r)
        (removed,) = found["Endpoint"]
        assert (removed.change, removed.verdict) == ("removed", verdicts.FAIL)
        assert "ServingEndpoint" in removed.why and "downtime" in removed.why
        assert 'override_logical_id("Endpoint")' in removed.advice
    assert "need a different rollout" in markdown and "How to roll out `Endpoint`" in markdown


@pytest.mark.slow
def test_changing_instance_type_under_autoscaling_fails_with_two_step_advice(scenario_repo: dict) -> None:
    repo = _scenario(scenario_repo, "bigger GPUs", instance_type="ml.g6.12xlarge")
    out_md = repo / "diff.md"
    # Through the command line, as `make diff` runs it: exit code 1 on a failing stack.
    proc = subprocess.run(
        [sys.executable, "-m", "review.stack_diff", "--base", scenario_repo["base"], "--repo", str(repo),
         "--cache-dir", str(scenario_repo["cache"]), "--output", str(out_md)],
        cwd=cdk.REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    markdown = out_md.read_text()
    assert "cached assembly" in proc.stderr  # the base was synthesized once for all scenarios
    assert markdown.count("| instance type ml.g6.2xlarge -> ml.g6.12xlarge |") == 2
    assert "two steps" in markdown and "remove autoscaling from variant `AllTraffic`" in markdown
    assert "registered with Application Auto Scaling" in markdown


def _template(instance_type: str, *, scaled: bool) -> dict:
    resources = {
        "Config": {"Type": verdicts.ENDPOINT_CONFIG, "Properties": {"ProductionVariants": [
            {"VariantName": "AllTraffic", "InstanceType": instance_type, "ModelName": "m"}]}},
        "Endpoint": {"Type": verdicts.ENDPOINT, "Properties": {
            "EndpointName": "peagle-dev", "EndpointConfigName": {"Fn::GetAtt": ["Config", "EndpointConfigName"]}}},
    }
    if scaled:  # the literal-name form of the target id (no reference to the endpoint resource)
        resources["Target"] = {"Type": verdicts.SCALABLE_TARGET, "Properties": {
            "ServiceNamespace": "sagemaker", "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
            "ResourceId": "endpoint/peagle-dev/variant/AllTraffic", "MinCapacity": 1, "MaxCapacity": 2}}
    return {"Resources": resources}


def test_instance_type_change_without_autoscaling_passes() -> None:
    findings = verdicts.classify(_template("ml.g6.2xlarge", scaled=False), _template("ml.g6.12xlarge", scaled=False))
    assert [f.verdict for f in findings if f.change.startswith("instance type")] == [verdicts.PASS]
    assert all(f.verdict != verdicts.FAIL for f in findings)


def test_instance_type_change_with_a_literal_target_id_fails() -> None:
    findings = verdicts.classify(_template("ml.g6.2xlarge", scaled=True), _template("ml.g6.12xlarge", scaled=True))
    (fail,) = [f for f in findings if f.verdict == verdicts.FAIL]
    assert fail.change == "instance type ml.g6.2xlarge -> ml.g6.12xlarge" and "Target" in fail.why


def test_endpoint_name_change_is_a_replacement() -> None:
    base, head = _template("ml.g6.2xlarge", scaled=False), _template("ml.g6.2xlarge", scaled=False)
    head["Resources"]["Endpoint"]["Properties"]["EndpointName"] = "peagle-dev-2"
    (endpoint,) = [f for f in verdicts.classify(base, head) if f.logical_id == "Endpoint"]
    assert (endpoint.change, endpoint.verdict) == ("replaced", verdicts.FAIL)
    assert "EndpointName changed" in endpoint.why


def test_removed_inference_component_fails() -> None:
    base = _template("ml.g6.2xlarge", scaled=False)
    base["Resources"]["Component"] = {"Type": verdicts.INFERENCE_COMPONENT, "Properties": {
        "EndpointName": "peagle-dev", "Specification": {"ModelName": "m"}}}
    (component,) = [f for f in verdicts.classify(base, _template("ml.g6.2xlarge", scaled=False))
                    if f.logical_id == "Component"]
    assert component.verdict == verdicts.FAIL and "model copies" in component.advice


def _registry_schema(type_name: str) -> dict:
    """CloudFormation's resource schema as cfn-lint ships it (AWS's registry, not ours)."""
    import cfnlint

    schemas = Path(cfnlint.__file__).parent / "data" / "schemas"
    index = json.loads((schemas / "providers" / "us-east-1.json").read_text())
    return json.loads((schemas / "resources" / f"{index[type_name]}.json").read_text())


def _create_only(type_name: str) -> set[str]:
    return {p.split("/")[2] for p in _registry_schema(type_name).get("createOnlyProperties", []) if p.count("/") == 2}


# Types whose registry schema lists no create-only property although the resource reference says "Update
# requires: Replacement" (the handler replaces): our table follows the reference there, with no judge.
UNJUDGED = {"AWS::KMS::Key"}


def test_only_the_known_types_lack_a_registry_judge():
    lacking = {t for t in verdicts.REPLACEMENT_PROPERTIES if not _create_only(t)} - {verdicts.INFERENCE_COMPONENT}
    assert lacking == UNJUDGED


@pytest.mark.parametrize("type_name", sorted(set(verdicts.REPLACEMENT_PROPERTIES) - UNJUDGED))
def test_replacement_properties_are_cloudformations_create_only_properties(type_name):
    schema = _registry_schema(type_name)
    create_only = _create_only(type_name)
    ours = verdicts.REPLACEMENT_PROPERTIES[type_name]
    if ours == "*":  # every property but tags, as the schema says for each writable property
        writable = set(schema["properties"]) - {p.split("/")[2] for p in schema.get("readOnlyProperties", [])}
        assert writable - {"Tags"} <= create_only | {"Tags"}, sorted(writable - create_only)
    elif type_name == verdicts.INFERENCE_COMPONENT:
        # The schema names none; the API judges instead: none of these can be changed by an update.
        import botocore.session

        update = botocore.session.get_session().get_service_model("sagemaker").shape_for("UpdateInferenceComponentInput")
        # (InferenceComponentName is in the update only to say which component: it names, it does not change.)
        assert not create_only and not (set(ours) - {"InferenceComponentName"}) & set(update.members)
        assert set(ours) <= set(schema["properties"])
    else:
        assert set(ours) == create_only, (sorted(ours), sorted(create_only))


@pytest.mark.slow
def test_the_judge_diffs_the_pull_requests_templates_without_running_its_code(scenario_repo: dict, tmp_path) -> None:
    """--head-templates: the head synthesized elsewhere (the pull request's run), carried as its artifact (packed,
    zipped, checked, unpacked) and diffed against the base synthesized from the checkout, which is the base's
    code: the same findings as a synth of the head, and each head template's SHA-256 in the reviews."""
    import hashlib
    import zipfile

    from review import head_artifact

    repo = _scenario(scenario_repo, "K 7 -> 4", k=4)
    synthesized_dir = tmp_path / "head-synth"
    _, synthesized = stack_diff.run(repo=repo, base_ref=scenario_repo["base"], cache_dir=scenario_repo["cache"],
                                    context={}, keep_head=synthesized_dir)
    head_artifact.pack(synthesized_dir, tmp_path / "packed")
    (tmp_path / "download").mkdir()
    with zipfile.ZipFile(tmp_path / "download" / "stack-templates.zip", "w") as zf:
        for path in (tmp_path / "packed").iterdir():
            zf.write(path, path.name)
    head_artifact.unpack(tmp_path / "download", tmp_path / "templates")
    _git(repo, "checkout", "-q", "--detach", scenario_repo["base"])  # the judge's checkout: the base only
    markdown, judged = stack_diff.run(repo=repo, base_ref="HEAD", cache_dir=scenario_repo["cache"], context={},
                                      head_templates=tmp_path / "templates")

    def shape(reviews):
        return [(r.display_name, r.verdict, sorted((f.logical_id, f.change, f.verdict) for f in r.findings))
                for r in reviews]

    assert shape(judged) == shape(synthesized) and judged[0].findings, markdown
    for r in judged:
        written = next(s for s in cdk.list_stacks(synthesized_dir) if s.display_name == r.display_name)
        assert r.template_sha256 == hashlib.sha256(written.template_path.read_bytes()).hexdigest()
        assert "AWS::SageMaker::Model" in r.cli_diff  # the CLI read the assembly written from the templates
