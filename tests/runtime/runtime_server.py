"""Start the serving runtime the way the image does (our entrypoint, SM_VLLM_* variables) on 127.0.0.1.

Used by the engine tests and by tools.serve_local. ``start()`` returns at once; ``wait_ready()`` polls
/ping and records what it saw, so a test can check /ping was not healthy before the engine was.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
HOOKS_DIR = Path(__file__).resolve().parent / "hooks"
PYTHON = sys.executable
# name -> seconds from start to the first healthy /ping, for the end-of-run summary.
READY_TIMES: dict[str, float] = {}
# Measured figures the tests report at the end of the run (label -> text).
FIGURES: dict[str, str] = {}

CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PEAGLE_FUSED_DRAFT": "0",  # the kernel has its own tests; here vLLM's own input build runs
    "PYTHONUNBUFFERED": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RuntimeServer:
    target: Path
    drafter: Path | None  # None: no speculation (the parity baseline, started through vLLM directly)
    k: int = 4
    log_dir: Path = Path("/tmp")
    name: str = "peagle"
    max_model_len: int = 512
    count_drafter_calls: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_after_s: float | None = None
    pings_before_ready: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / f"{self.name}.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.name}.stderr"

    @property
    def drafter_calls_path(self) -> Path:
        return self.log_dir / f"{self.name}.drafter-calls"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SM_VLLM_")}
        env.update(CPU_ENV)
        env.update({
            "PEAGLE_HOST": "127.0.0.1",
            "PEAGLE_PORT": str(self.port),
            "SM_VLLM_MODEL": str(self.target),
            "SM_VLLM_DTYPE": "float32",
            "SM_VLLM_ENFORCE_EAGER": "true",
            "SM_VLLM_MAX_MODEL_LEN": str(self.max_model_len),
            "SM_VLLM_MAX_NUM_SEQS": "16",
            "SM_VLLM_SEED": "0",
        })
        if self.drafter is not None:
            env["SM_VLLM_SPECULATIVE_CONFIG"] = json.dumps({
                "method": "eagle3", "model": str(self.drafter), "num_speculative_tokens": self.k,
                "parallel_drafting": True,
            }, separators=(",", ":"))
        if self.count_drafter_calls:
            self.drafter_calls_path.unlink(missing_ok=True)
            self.drafter_calls_path.touch()
            env["PEAGLE_TEST_DRAFTER_CALLS"] = str(self.drafter_calls_path)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOKS_DIR), env.get("PYTHONPATH")]))
        return env

    def command(self) -> list[str]:
        if self.drafter is not None:
            return [PYTHON, "-m", "peagle_runtime.entrypoint", "serve"]
        # The baseline has no speculative config, which our entrypoint (P-EAGLE only) refuses by design:
        # start vLLM's own server with the same flags instead.
        return [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.target),
                "--dtype", "float32", "--enforce-eager", "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", "16", "--seed", "0", "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self) -> "RuntimeServer":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(), cwd=REPO_ROOT, env=self.environment(),
            stdout=self.stdout_path.open("wb"), stderr=self.stderr_path.open("wb"),
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout: float = 420.0) -> "RuntimeServer":
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
                try:
                    r = client.get(self.base + "/ping")
                    if r.status_code == 200:
                        self.ready_after_s = time.monotonic() - self.started_at
                        READY_TIMES[self.name] = self.ready_after_s
                        return self
                    self.pings_before_ready.append(str(r.status_code))
                except httpx.TransportError as exc:
                    self.pings_before_ready.append(type(exc).__name__)
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return "\n".join(text.splitlines()[-n:])

    def request_lines(self) -> list[str]:
        return [line for line in self.stdout_path.read_text(errors="replace").splitlines()
                if line.startswith('{"event"')]

    def drafter_calls(self) -> int:
        return self.drafter_calls_path.stat().st_size

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            return self.proc.wait(10)

    def kill_group(self) -> None:
        """SIGKILL what is left of the process group we started (server, engine core, workers)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def metric_total(text: str, name: str) -> float:
    """Sum of a Prometheus counter over its label sets."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
