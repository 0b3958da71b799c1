"""The engine tests' server: harness.runtime.LocalRuntime (the image's entrypoint on 127.0.0.1, vLLM on the
CPU) plus what only tests need: counting drafter passes and the figures reported at the end of the run."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from peagle_contract.serving import ServingConfig

from harness.runtime import LocalRuntime, local_serving

HOOKS_DIR = Path(__file__).resolve().parent / "hooks"
# name -> seconds from start to the first healthy /ping, for the end-of-run summary.
READY_TIMES: dict[str, float] = {}
# Measured figures the tests report at the end of the run (label -> text).
FIGURES: dict[str, str] = {}


@dataclass
class RuntimeServer(LocalRuntime):
    """``count_drafter_calls``: every forward pass of vLLM's EAGLE-3 drafter appends a byte to a file
    (hooks/sitecustomize.py), so a test reads the number of drafter passes as that file's size."""

    serving: ServingConfig = field(default_factory=lambda: local_serving(max_model_len=512))
    count_drafter_calls: bool = False
    # CPU niceness of the server's processes once ready (0: as started). A client measuring latency on the
    # same 2 cores needs the engine to yield to it, as it would on another machine.
    nice: int = 0

    def __post_init__(self) -> None:
        # vLLM's own input build: the kernel has its own tests; INFO logs show what the engine decided.
        env = {"PEAGLE_FUSED_DRAFT": "0", "VLLM_LOGGING_LEVEL": "INFO", **self.extra_env}
        if self.count_drafter_calls:
            env["PEAGLE_TEST_DRAFTER_CALLS"] = str(self.drafter_calls_path)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOKS_DIR), os.environ.get("PYTHONPATH")]))
        self.extra_env = env

    @property
    def drafter_calls_path(self) -> Path:
        return self.log_dir / f"{self.name}.drafter-calls"

    def start(self) -> "RuntimeServer":
        if self.count_drafter_calls:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.drafter_calls_path.write_bytes(b"")
        super().start()
        return self

    def wait_ready(self, timeout_s: float = 420.0) -> "RuntimeServer":
        super().wait_ready(timeout_s)
        READY_TIMES[self.name] = self.ready_after_s or 0.0
        if self.nice and self.proc is not None:
            os.setpriority(os.PRIO_PGRP, self.proc.pid, self.nice)  # the server and its engine core
            # With autogroup scheduling (on here: /proc/sys/kernel/sched_autogroup_enabled), a thread's nice only
            # weighs against threads of its own session, and the server runs in a session of its own: its
            # session shared the CPUs equally with the client's, and the engine's workers busy-poll (vLLM's shm
            # queue spins for 1 s after each read). The session is lowered too, or the client waits for a CPU
            # (tens of ms, once 1 s: the first text late at the client, a "dropped" stream ended before it left).
            autogroup = Path(f"/proc/{self.proc.pid}/autogroup")
            if autogroup.exists():
                autogroup.write_text(str(self.nice))
        return self

    def drafter_calls(self) -> int:
        return self.drafter_calls_path.stat().st_size


def read_response_head(sock: socket.socket) -> bytes:
    """Read from ``sock`` until the end of an HTTP response's head (or the connection's end), then close it."""
    response = b""
    try:
        while b"\r\n\r\n" not in response:
            part = sock.recv(65536)
            if not part:
                break
            response += part
    finally:
        sock.close()
    return response
