"""The fused kernel's check at container start (peagle_runtime.kernels.start_check), on this CPU with the Triton
interpreter standing in for a device: it runs once, in a child process, before vLLM starts; a check that
agrees turns the kernel on, one that disagrees, crashes or hangs leaves it off with one log line and is never
run again, and the server starts either way.

The faults come from a test hook (tests/runtime/hooks/sitecustomize.py) in the child: ``os.abort()`` stands in for a device
fault that kills the process, a flipped token id for a miscompiled kernel. What a real device fault does to a
CUDA context, and the check's cost at real shapes, only a GPU shows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from models.cpu_engine import cpu_engine_environment
from models.random_pair import build
from peagle_runtime.kernels.start_check import fused_draft_at_start

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
HOOKS = REPO / "tests" / "runtime" / "hooks"  # the test hooks (sitecustomize.py)


@pytest.fixture(scope="module")
def pair():
    return build()


def _env(runs: Path, fault: str | None = None, **extra: str) -> dict[str, str]:
    env = {**cpu_engine_environment(), "PYTHONPATH": os.pathsep.join([str(HOOKS), str(REPO)]),
           "TRITON_INTERPRET": "1", "SM_VLLM_MAX_NUM_SEQS": "4", "SM_VLLM_MAX_MODEL_LEN": "256",
           "SM_VLLM_DTYPE": "float32", "PEAGLE_TEST_START_CHECK_RUNS": str(runs), **extra}
    env.pop("PEAGLE_FUSED_DRAFT", None)
    if fault:
        env["PEAGLE_TEST_START_CHECK_FAULT"] = fault
    return env


def _decide(pair, env: dict[str, str], *, timeout_s: float = 240) -> tuple[str, list[dict]]:
    lines: list[str] = []
    spec = {"model": str(pair.drafter), "num_speculative_tokens": 4}
    switch = fused_draft_at_start(env, spec, str(pair.target), timeout_s=timeout_s, log=lines.append)
    return switch, [json.loads(line) for line in lines]


def _runs(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def test_a_kernel_that_agrees_is_turned_on_after_one_check(pair, tmp_path):
    runs = tmp_path / "runs"
    switch, (decision,) = _decide(pair, _env(runs))
    assert switch == "1" and decision["use"] == "fused" and decision["agree"], decision
    assert decision["batches"] == 4 and decision["shapes"]["max_num_seqs"] == 4  # decode, decode, prefill, mixed
    assert _runs(runs) == 1


@pytest.mark.parametrize(("fault", "why"), [("crash", "crashed (SIGABRT)"), ("mismatch", "differs from vLLM's build"),
                                            ("hang", "ran past 60 s")])
def test_a_check_that_fails_leaves_the_kernel_off_with_one_line_and_runs_once(pair, tmp_path, fault, why):
    runs = tmp_path / "runs"
    switch, decisions = _decide(pair, _env(runs, fault), timeout_s=60)
    assert switch == "0"
    (decision,) = decisions  # one line, saying why
    assert decision["use"] == "vllm" and not decision["agree"] and why in decision["why"], decision
    assert _runs(runs) == 1  # the check ran once: no retry


def test_an_explicit_switch_or_a_machine_without_a_device_runs_nothing(pair, tmp_path):
    runs = tmp_path / "runs"
    for given in ("0", "1"):
        assert _decide(pair, {**_env(runs), "PEAGLE_FUSED_DRAFT": given}) == (given, [])
    no_device = {k: v for k, v in _env(runs).items() if k != "TRITON_INTERPRET"}
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        assert _decide(pair, no_device) == ("0", [])
    assert _runs(runs) == 0


@pytest.mark.engine
@pytest.mark.parametrize("fault", [None, "crash"], ids=["kernel-agrees", "check-crashes"])
def test_the_check_runs_before_vllm_and_the_server_serves_either_way(pair, tmp_path, fault):
    """The real entrypoint and vLLM on this CPU: the decision line comes before vLLM is started, the engine
    serves, and it drafts with the kernel only when the check agreed (the plugin's counter, written by the
    engine process, says whether the kernel ran)."""
    import httpx

    from harness.runtime import LocalRuntime, local_serving

    runs, stats = tmp_path / "runs", tmp_path / "stats.json"
    extra = {k: v for k, v in _env(runs, fault).items() if k.startswith(("PEAGLE_", "TRITON_", "PYTHONPATH"))}
    extra.update({"PEAGLE_FUSED_DRAFT": "auto", "PEAGLE_FUSED_DRAFT_STATS": str(stats)})
    runtime = LocalRuntime(target=pair.target, drafter=pair.drafter,
                           serving=local_serving(num_speculative_tokens=4, max_model_len=256, max_num_seqs=4),
                           log_dir=tmp_path, name=f"start-check-{fault}", extra_env=extra)
    with runtime:
        r = httpx.post(runtime.base + "/invocations", json={"prompt": "Once upon a time", "max_tokens": 8,
                                                            "ignore_eos": True}, timeout=300)
        assert r.status_code == 200, r.text
    log = runtime.stderr_path.read_text(errors="replace").splitlines()
    decisions = [i for i, line in enumerate(log) if '"event": "peagle.fused_draft"' in line]
    starting = next(i for i, line in enumerate(log) if line.startswith("peagle-serve: starting"))
    assert len(decisions) == 1 and decisions[0] < starting, log[:starting + 1]
    decision = json.loads(log[decisions[0]].split("peagle-serve: ", 1)[1])
    # The processes that ran the fused build: the check's child once; then, only if it agreed, the engine.
    assert _runs(runs) == (2 if fault is None else 1)
    if fault is None:
        assert decision["use"] == "fused"
        assert json.loads(stats.read_text())["calls"] > 0  # the engine drafted with the kernel
    else:
        assert decision["use"] == "vllm" and "crashed" in decision["why"]
        assert not stats.exists()  # the kernel never ran in the engine
