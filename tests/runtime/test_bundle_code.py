"""No code from a weights bundle runs: vLLM's SageMaker router (model_hosting_container_standards) imports
<SAGEMAKER_MODEL_PATH>/<CUSTOM_SCRIPT_FILENAME> at start, by default /opt/ml/model/model.py - the bundle root.
The judge is the installed package's own loader, run in a fresh interpreter (it caches its loader per process)
with exactly the environment our entrypoint hands vLLM; a model.py that would write a marker file sits in the
bundle root. A negative control runs the same loader on SageMaker's default path and sees the marker written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from peagle_contract.serving import ServingConfig, TARGET_MODEL_DIR

from peagle_runtime import entrypoint
from peagle_runtime.entrypoint import EntrypointError, build_command, loader_environment

ROOT = Path(__file__).resolve().parents[2]
# The package's own start-up path, as vLLM's sagemaker_standards_bootstrap calls it.
STANDARDS_BOOTSTRAP = ("from fastapi import FastAPI\n"
                       "import model_hosting_container_standards.sagemaker as standards\n"
                       "standards.bootstrap(FastAPI())\n")
# vLLM's own call (vllm/entrypoints/launchers/app.py builds the server's app through it): seconds of imports.
VLLM_BOOTSTRAP = ("from fastapi import FastAPI\n"
                  "from vllm.entrypoints.serve.sagemaker.api_router import sagemaker_standards_bootstrap\n"
                  "sagemaker_standards_bootstrap(FastAPI())\n")


def _hostile_bundle(tmp_path: Path) -> tuple[Path, Path]:
    bundle, marker = tmp_path / "opt-ml-model", tmp_path / "imported"
    bundle.mkdir()
    (bundle / "model.py").write_text(f"open({str(marker)!r}, 'w').write('bundle code ran')\n")
    return bundle, marker


def _entrypoint_env(untrained, bundle: Path) -> dict[str, str]:
    """What build_command hands vLLM for an unpinned Dev stage whose bundle is ``bundle``."""
    cfg = ServingConfig(target_model="s3://bucket/models/target/", drafter_model="s3://bucket/models/drafter/",
                        num_speculative_tokens=4)
    env = cfg.to_environment(target_dir=str(untrained.target), drafter_dir=str(untrained.drafter))
    _, child_env = build_command(env, model_dir=bundle)
    return child_env


def _start_loader(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_the_loaders_variables_are_the_ones_the_package_reads():
    from model_hosting_container_standards.sagemaker.config import SageMakerDefaults, SageMakerEnvVars

    assert entrypoint.LOADER_PATH_VAR == SageMakerEnvVars.SAGEMAKER_MODEL_PATH
    assert entrypoint.LOADER_SCRIPT_VAR == SageMakerEnvVars.CUSTOM_SCRIPT_FILENAME
    # Left alone, the loader would look in the bundle root for exactly that file.
    assert SageMakerDefaults.SCRIPT_PATH.rstrip("/") == TARGET_MODEL_DIR
    assert SageMakerDefaults.SCRIPT_FILENAME == entrypoint.LOADER_SCRIPT
    assert not entrypoint.NO_CUSTOM_CODE_DIR.startswith(TARGET_MODEL_DIR)


def test_a_bundles_model_py_is_never_imported_by_the_routers_loader(untrained, tmp_path):
    bundle, marker = _hostile_bundle(tmp_path)
    env = _entrypoint_env(untrained, bundle)
    _start_loader(STANDARDS_BOOTSTRAP, env, cwd=bundle)
    assert not marker.exists()

    # Negative control: the same loader, with SageMaker's default script path standing in for /opt/ml/model.
    control = {k: v for k, v in env.items() if k not in (entrypoint.LOADER_PATH_VAR, entrypoint.LOADER_SCRIPT_VAR)}
    _start_loader(STANDARDS_BOOTSTRAP, {**control, entrypoint.LOADER_PATH_VAR: f"{bundle}/"}, cwd=tmp_path)
    assert marker.read_text() == "bundle code ran"


def test_an_operators_loader_variables_are_overridden(untrained, tmp_path):
    """A model environment naming the bundle as the loader's path (or another script) does not reach vLLM."""
    bundle, marker = _hostile_bundle(tmp_path)
    cfg = ServingConfig(target_model="s3://bucket/models/target/", drafter_model="s3://bucket/models/drafter/",
                        num_speculative_tokens=4)
    env = {**cfg.to_environment(target_dir=str(untrained.target), drafter_dir=str(untrained.drafter)),
           entrypoint.LOADER_PATH_VAR: f"{bundle}/", entrypoint.LOADER_SCRIPT_VAR: "model.py"}
    _, child_env = build_command(env, model_dir=bundle)
    _start_loader(STANDARDS_BOOTSTRAP, child_env, cwd=tmp_path)
    assert not marker.exists()


@pytest.mark.slow
def test_vllms_own_bootstrap_with_the_entrypoints_environment_imports_nothing(untrained, tmp_path):
    bundle, marker = _hostile_bundle(tmp_path)
    _start_loader(VLLM_BOOTSTRAP, _entrypoint_env(untrained, bundle), cwd=bundle)
    assert not marker.exists()


def test_a_loader_path_that_holds_anything_stops_the_start(tmp_path):
    (tmp_path / "model.py").write_text("")
    with pytest.raises(EntrypointError, match=r"^SAGEMAKER_MODEL_PATH: .* must be empty .*found \['model.py'\]"):
        loader_environment(str(tmp_path))
    assert loader_environment(str(tmp_path / "absent")) == {"SAGEMAKER_MODEL_PATH": str(tmp_path / "absent"),
                                                             "CUSTOM_SCRIPT_FILENAME": "model.py"}


def test_the_image_makes_the_loaders_folder_empty_and_read_only():
    dockerfile = re.sub(r"\\\n", " ", (ROOT / "runtime" / "Dockerfile").read_text())
    folder = entrypoint.NO_CUSTOM_CODE_DIR.rstrip("/")
    assert f"mkdir -p {folder} && chmod 0555 {folder}" in dockerfile
    # Nothing is put there: no COPY or ADD names it.
    assert not [line for line in dockerfile.splitlines() if line.startswith(("COPY", "ADD")) and "/opt/peagle" in line]
