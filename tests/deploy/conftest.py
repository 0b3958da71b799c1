"""One synthesized cloud assembly for the whole deploy test session (synth costs ~10-30 s here), and the
in-process moto environment the extension tests share.

If a root tests/conftest.py provides a session fixture with the synthesized app's assembly directory
(``synthesized_assembly`` or ``cloud_assembly_dir``), it is reused; otherwise the real CLI synthesizes
the app once into a temporary directory, with ``imageUri`` set as on the embedded AWS.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tools.local_aws as local_aws
from tools.local_aws import cdk_cli

REPO = cdk_cli.REPO_ROOT
STAGES = ("Dev", "Staging", "Prod")
IMAGE_URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/peagle-runtime:test"
MOTO_REGION = "us-east-1"


@pytest.fixture
def moto_region(monkeypatch: pytest.MonkeyPatch) -> str:
    """Fake credentials only, the default region set, our extension loaded into moto; returns the region.

    Every ``AWS_*`` variable of the caller is dropped first, so no real credential or endpoint can reach
    boto3 inside ``mock_aws()``.
    """
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", MOTO_REGION)
    local_aws.register()
    return MOTO_REGION


@pytest.fixture(scope="session")
def deploy_assembly(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    for name in ("synthesized_assembly", "cloud_assembly_dir"):
        try:
            shared = request.getfixturevalue(name)
        except pytest.FixtureLookupError:
            continue
        path = Path(getattr(shared, "outdir", shared))
        if (path / "manifest.json").exists():
            return path
    if not (REPO / "app.py").exists():
        pytest.skip("app.py is not there yet: nothing to deploy")
    out = tmp_path_factory.mktemp("deploy-assembly")
    # A failing nag pack makes synth exit 1 but still writes the templates; the nag tests own that verdict.
    proc = cdk_cli.synth(out, cwd=REPO, context={"imageUri": IMAGE_URI}, label=None, check=False)
    if not (out / "manifest.json").exists():
        pytest.fail(f"cdk synth wrote no cloud assembly (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return out


@pytest.fixture(scope="session")
def stage_stacks(deploy_assembly: Path) -> dict[str, list[cdk_cli.StackArtifact]]:
    return {stage: cdk_cli.stage_stacks(deploy_assembly, stage) for stage in STAGES}
