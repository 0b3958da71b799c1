"""The distributions as a new user gets them: wheels installed into fresh virtual environments outside the
repository, nothing of the checkout on the path.

The judges are pip's own resolver and `pip check`, a real `cdk synth` (jsii, the four nag packs as
validation plugins) of the construct library's README example, and the image's console script. Two
environments, as the two kinds of user have them: the CDK side (contract + constructs, their dependencies
from the package index) and the image side (contract + runtime, which must need nothing else).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.release import DISTRIBUTIONS, REPO_ROOT, VERSION, build_wheels

pytestmark = pytest.mark.slow


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would put the checkout or our venv on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, timeout: int = 900, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_clean_env(**env), capture_output=True, text=True, timeout=timeout)


class FreshVenv:
    def __init__(self, root: Path) -> None:
        self.root = root
        proc = _run([sys.executable, "-m", "venv", str(root / "venv")], cwd=root)
        assert proc.returncode == 0, proc.stderr
        self.python = root / "venv" / "bin" / "python"

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return _run([str(self.python), "-m", "pip", *args], cwd=self.root)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return _run([str(self.python), *args], cwd=self.root, **env)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    built = build_wheels(DISTRIBUTIONS, tmp_path_factory.mktemp("wheels"))
    return {wheel.name.split("-")[0]: wheel for wheel in built}


@pytest.fixture(scope="session")
def cdk_venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]) -> FreshVenv:
    venv = FreshVenv(tmp_path_factory.mktemp("cdk-side"))
    proc = venv.pip("install", "-q", str(wheels["peagle_contract"]), str(wheels["peagle_constructs"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv


@pytest.fixture(scope="session")
def image_venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]) -> FreshVenv:
    venv = FreshVenv(tmp_path_factory.mktemp("image-side"))
    # --no-index: the runtime must need nothing but the contract (vLLM comes from the image's base).
    proc = venv.pip("install", "-q", "--no-index", str(wheels["peagle_contract"]), str(wheels["peagle_runtime"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv


def test_one_version_for_every_wheel(wheels):
    assert sorted(wheels) == ["peagle_constructs", "peagle_contract", "peagle_runtime"]
    assert {w.name.split("-")[1] for w in wheels.values()} == {VERSION}
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M), \
        "the newest CHANGELOG entry must be the VERSION being built"


def test_cdk_side_installs_cleanly_and_imports_from_the_venv(cdk_venv):
    check = cdk_venv.pip("check")
    assert check.returncode == 0, check.stdout + check.stderr
    probe = cdk_venv.run("-c", "import json, peagle_constructs, peagle_contract, importlib.metadata as m; "
                               "print(json.dumps({'file': peagle_constructs.__file__, "
                               "'versions': [m.version(d) for d in ('peagle-constructs', 'peagle-contract')], "
                               "'cdk_nag': m.version('cdk-nag')}))")
    assert probe.returncode == 0, probe.stderr
    info = json.loads(probe.stdout)
    assert Path(info["file"]).is_relative_to(cdk_venv.root), info  # not the checkout
    assert info["versions"] == [VERSION, VERSION]


def _readme_example() -> str:
    text = (REPO_ROOT / "constructs" / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the construct README has one example"
    return blocks[0]


def test_the_construct_readme_example_synthesizes_with_the_nag_packs(cdk_venv):
    example = cdk_venv.root / "example_app.py"
    example.write_text(_readme_example())
    out = cdk_venv.root / "cdk.out"
    proc = cdk_venv.run(str(example), CDK_OUTDIR=str(out), JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    # A nag finding left open fails the synth (ValidationFailed), so exit 0 means all four packs passed.
    assert proc.returncode == 0, proc.stderr[-4000:]
    (template_file,) = out.glob("*.template.json")
    resources = json.loads(template_file.read_text())["Resources"]
    types = {r["Type"] for r in resources.values()}
    assert {"AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig", "AWS::SageMaker::Endpoint",
            "AWS::SageMaker::InferenceComponent", "AWS::ApplicationAutoScaling::ScalableTarget",
            "AWS::ApplicationAutoScaling::ScalingPolicy", "AWS::CloudWatch::Alarm"} <= types
    report = json.loads((out / "validation-report.json").read_text()) if (out / "validation-report.json").exists() \
        else {"pluginReports": []}
    assert all(not plugin.get("violations") for plugin in report["pluginReports"]), report


def test_image_side_needs_only_the_contract_and_refuses_a_bad_config(image_venv):
    check = image_venv.pip("check")
    assert check.returncode == 0, check.stdout + check.stderr
    installed = image_venv.pip("list", "--format", "json")
    names = {p["name"].lower() for p in json.loads(installed.stdout)}
    assert {"peagle-contract", "peagle-runtime"} <= names and not names & {"vllm", "torch", "aws-cdk-lib"}
    probe = image_venv.run("-c", "import peagle_runtime.entrypoint, peagle_runtime.plugin, peagle_contract.drafter")
    assert probe.returncode == 0, probe.stderr
    # The console script the image's ENTRYPOINT names: with no speculative config it must stop before vLLM.
    serve = _run([str(image_venv.root / "venv" / "bin" / "peagle-serve"), "serve"], cwd=image_venv.root,
                 SM_VLLM_MODEL="org/model")
    assert serve.returncode == 2, serve.stdout + serve.stderr
    assert "SM_VLLM_SPECULATIVE_CONFIG" in serve.stderr and "is required" in serve.stderr


def test_wheels_build_in_a_fresh_venv_with_the_same_bytes(tmp_path, wheels):
    """What a CI runner has: `python -m venv` with ensurepip's setuptools (65.5 on 3.11, no bdist_wheel) and
    no `wheel`. The build must not use them (each pyproject pins its backend, built in isolation), and the
    bytes must equal this environment's build: the image asset's hash is the same on every machine."""
    venv = FreshVenv(tmp_path)
    listed = venv.pip("list", "--format=json")
    tools = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    assert "wheel" not in tools and int(tools["setuptools"].split(".")[0]) < 70, \
        f"this check needs a venv without a bdist_wheel-capable setuptools; got {tools}"
    out = tmp_path / "built"
    proc = venv.run("-c", "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
                    "from stacks.release import DISTRIBUTIONS, build_wheels;"
                    "[print(w) for w in build_wheels(DISTRIBUTIONS, Path(sys.argv[2]))]", str(REPO_ROOT), str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fresh = {Path(line).name: Path(line).read_bytes() for line in proc.stdout.split()}
    assert fresh == {w.name: w.read_bytes() for w in wheels.values()}
