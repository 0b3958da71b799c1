"""Fixtures for the serving-runtime tests: engines on the random pair, started once per session."""

from __future__ import annotations

import pytest

from runtime_server import FIGURES, READY_TIMES, RuntimeServer

from harness.runtime import local_serving


@pytest.fixture(scope="session")
def server(untrained, tmp_path_factory):
    """The P-EAGLE server on the random pair (our entrypoint, K=4): the serving path, fast."""
    srv = RuntimeServer(target=untrained.target, drafter=untrained.drafter, serving=local_serving(num_speculative_tokens=4),
                        log_dir=tmp_path_factory.mktemp("engines"), name="peagle-k4", count_drafter_calls=True,
                        nice=10)
    try:
        yield srv.start().wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def demo_engines(tmp_path_factory):
    """P-EAGLE (K=4) on the trained toy pair and a no-speculation baseline on its target, side by side.

    The pair is built once per machine (minutes; cached by content in models.cache), in its own process: the
    builder pins torch's threads and determinism for reproducible weights, which this process must not inherit."""
    import subprocess
    import sys

    from models import toy_pair

    if toy_pair.existing_pair() is None:
        subprocess.run([sys.executable, "-m", "models.toy_pair"], check=True, capture_output=True)
    pair = toy_pair.existing_pair()
    assert pair is not None
    logs = tmp_path_factory.mktemp("demo-engines")
    spec = RuntimeServer(target=pair.target, drafter=pair.drafter, serving=local_serving(num_speculative_tokens=4),
                         log_dir=logs, name="demo-peagle-k4")
    base = RuntimeServer(target=pair.target, drafter=None, log_dir=logs, name="demo-baseline")
    try:
        spec.start()
        base.start()
        spec.wait_ready()
        base.wait_ready()
        yield {"spec": spec, "base": base}
    finally:
        for srv in (spec, base):
            srv.stop()


# What each bad request got, shown at the end of the run (a table of refusals a reviewer reads).
_BAD_REQUEST_TABLE: list[tuple[str, int, str]] = []


@pytest.fixture(scope="session")
def bad_request_table() -> list[tuple[str, int, str]]:
    return _BAD_REQUEST_TABLE


def pytest_terminal_summary(terminalreporter):
    if READY_TIMES:
        terminalreporter.section("engine start: process start to first healthy /ping")
        for name, seconds in READY_TIMES.items():
            terminalreporter.write_line(f"{name:30s} {seconds:6.1f} s")
    if FIGURES:
        terminalreporter.section("runtime figures")
        for label, text in FIGURES.items():
            terminalreporter.write_line(f"{label:30s} {text}")
    if _BAD_REQUEST_TABLE:
        terminalreporter.section("bad requests: what each got")
        for name, status, message in _BAD_REQUEST_TABLE:
            terminalreporter.write_line(f"{name:30s} {status}  {message}")
