"""A pin change in the stack diff, on Dev's real stack (an inference component): named a drafter change when the
committed manifests show the target's files unchanged, a target change the other way round, and a failure when a
committed manifest does not hash to its pin (an edited description of a bundle the endpoint will not serve)."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template
from peagle_contract.bundle import BundleFile, digest, render

from review import bundle_change, verdicts
from review.diff_markdown import render_markdown
from review.verdicts import FAIL, INFERENCE_COMPONENT, INFO, MODEL, StackReview
from stacks.application import OFFLINE, build_app
from stacks.environments import DEV, bundle


def _manifest(drafter: str, target: str = "t1") -> bytes:
    files = [BundleFile(f"target/{name}", 10, digest(f"{target}{name}".encode())) for name in ("config.json",
                                                                                               "model.safetensors")]
    files += [BundleFile("drafter/config.json", 5, digest(b"same config")),
              BundleFile("drafter/model.safetensors", 7, digest(drafter.encode()))]
    return render(files, {"target": {"source": "smollm2", "revision": None},
                          "drafter": {"source": f"train-drafter:{drafter}", "revision": None}})


def _template(pin: str) -> dict:
    env = replace(DEV, model=replace(DEV.model, serving=replace(DEV.model.serving, **bundle("dev", pin))))
    app = App(context=OFFLINE)
    return Template.from_stack(build_app(app, [env], nag=False)[env.name].stack).to_json()


OLD, NEW, NEW_TARGET = _manifest("d1"), _manifest("d2"), _manifest("d1", target="t2")


@pytest.fixture(scope="module")
def templates() -> dict[bytes, dict]:
    return {m: _template(digest(m)) for m in (OLD, NEW, NEW_TARGET)}


def _committed(*manifests: bytes):
    by_pin = {digest(m): m for m in manifests}
    return by_pin.get


def _findings(templates, old: bytes, new: bytes, *, base=None, head=None):
    base = base or _committed(OLD, NEW, NEW_TARGET)
    head = head or base
    return (verdicts.classify(templates[old], templates[new]),
            bundle_change.findings(templates[old], templates[new], base=base, head=head))


def test_a_new_drafter_is_named_a_drafter_change_and_the_component_rolls_in_place(templates):
    classified, (found,) = _findings(templates, OLD, NEW)
    assert (found.type, found.change, found.verdict) == (MODEL, "drafter change", INFO)
    assert "target/ the same 2 files" in found.why and "drafter/ 1 files differ (model.safetensors)" in found.why
    assert f"`{digest(OLD)[:12]}…` → `{digest(NEW)[:12]}…`" in found.why
    (component,) = [f for f in classified if f.type == INFERENCE_COMPONENT]
    assert component.change == "updated" and component.verdict == verdicts.PASS  # copy by copy, not replaced
    review = StackReview(display_name="Dev/PEagle", stack_name="Dev-PEagle", findings=classified + [found])
    assert review.verdict == verdicts.PASS
    assert "| drafter change |" in render_markdown([review], base_label="main", head_label="head")


def test_a_new_target_is_named_a_target_change(templates):
    _, (found,) = _findings(templates, OLD, NEW_TARGET)
    assert found.change == "target change" and "drafter/ the same 2 files" in found.why
    assert "target/ 2 files differ (config.json, model.safetensors)" in found.why


def test_an_edited_manifest_that_no_longer_hashes_to_its_pin_fails(templates):
    # The pull request keeps NEW's pin but commits a manifest claiming the target is unchanged and another drafter.
    forged = NEW.replace(digest(b"d2").encode(), digest(b"anything").encode())
    head = {digest(OLD): OLD, digest(NEW): forged}.get
    classified, (found,) = _findings(templates, OLD, NEW, head=head)
    assert found.verdict == FAIL and "hashes to" in found.why and "not to its pin" in found.why and found.advice
    review = StackReview(display_name="Dev/PEagle", stack_name="Dev-PEagle", findings=classified + [found])
    assert review.verdict == FAIL


def test_a_pin_without_a_committed_manifest_is_a_weights_change_not_named(templates):
    _, (found,) = _findings(templates, OLD, NEW, head=_committed(OLD))
    assert found.change == "weights change" and found.verdict == INFO and "not named here" in found.why


def test_no_pin_change_no_finding(templates):
    assert bundle_change.findings(templates[NEW], templates[NEW], base=_committed(), head=_committed()) == []


def test_the_base_manifests_are_read_as_blobs_of_its_commit_and_only_by_digest(tmp_path):
    repo = tmp_path / "repo"
    (repo / "stacks" / "bundles").mkdir(parents=True)
    (repo / "stacks" / "bundles" / f"{digest(OLD)}.json").write_bytes(OLD)
    (repo / "secret.json").write_text("not a manifest")
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "pins"], check=True)
    (repo / "stacks" / "bundles" / f"{digest(OLD)}.json").write_bytes(b"edited after the commit")
    read = bundle_change.at_commit(repo, "HEAD")
    assert read(digest(OLD)) == OLD and read(digest(NEW)) is None
    # A pin is a template's value, which a pull request writes: a path in it names nothing.
    assert read("../../secret") is None and bundle_change.committed(repo)("../../secret") is None
