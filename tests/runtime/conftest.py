"""Fixtures for the serving-runtime tests: engines on the tiny pair, started once per session."""

from __future__ import annotations

import pytest

from runtime_server import FIGURES, READY_TIMES, RuntimeServer


@pytest.fixture(scope="session")
def engines(tiny_pair, tmp_path_factory):
    """The P-EAGLE server (our entrypoint, K=4) and a no-speculation baseline, started side by side."""
    logs = tmp_path_factory.mktemp("engines")
    spec = RuntimeServer(target=tiny_pair.target, drafter=tiny_pair.drafter, k=4, log_dir=logs,
                         name="peagle-k4", count_drafter_calls=True)
    base = RuntimeServer(target=tiny_pair.target, drafter=None, log_dir=logs, name="baseline")
    try:
        spec.start()
        base.start()
        spec.wait_ready()
        base.wait_ready()
        yield {"spec": spec, "base": base}
    finally:
        for server in (spec, base):
            server.stop()


@pytest.fixture(scope="session")
def server(engines) -> RuntimeServer:
    return engines["spec"]


@pytest.fixture(scope="session")
def baseline(engines) -> RuntimeServer:
    return engines["base"]


# What each bad request got, shown at the end of the run (the issue asks for this table in the report).
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
