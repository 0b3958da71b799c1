"""The serving runtime on this machine's CPU, started the way the image starts it.

One piece of code for every local start: `make serve`, `make demo`, the engine tests and the CPU benchmark.
:func:`models.cpu_engine.cpu_engine_environment` is what vLLM needs on this CPU (any engine);
:class:`LocalRuntime` runs our entrypoint (``peagle_runtime.entrypoint``) on 127.0.0.1 with the ``SM_VLLM_*``
variables SageMaker would pass, rendered from a :class:`ServingConfig` by the contract's own
``to_environment`` (the road every stage's config takes to its container), so the local server checks its
settings, builds vLLM's command line and loads the request middleware exactly as the container does.

    serving = on_this_cpu(stage.model.serving, max_model_len=2048)   # a stage's config, or:
    serving = local_serving(num_speculative_tokens=4)                 # a config for a pair of this machine
    runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, serving=serving, log_dir=Path("logs"))
    with runtime:                      # start, wait for /ping, stop (SIGTERM, then the process group)
        ...runtime.base...             # http://127.0.0.1:<port>

What a CPU run cannot take from a stage's config, and so replaces (:func:`on_this_cpu`): the dtype (fp32, so
greedy output is exact), the sizes (this machine's memory), tensor parallelism (one CPU), the GPU flags and
variables of ``extra_args`` / ``extra_environment`` (fp8 KV cache, CUDA graphs), and the weights: the folders
given stand where SageMaker mounts the S3 prefixes, so a stage's pin is the caller's to give for its own bundle.
K, its schedule by load, the drafter's place in the bundle and the request capabilities stay the stage's.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from peagle_contract.capture import is_record_line
from peagle_contract.request_log import parse_line
from peagle_contract.serving import SPECULATIVE_CONFIG_VAR, ServingConfig, environment_to_argv

from harness.ports import free_port
from models.cpu_engine import cpu_engine_environment

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_MOUNT = Path(__file__).resolve().parent / "bin" / "model-mount"
# A local config names its weights by a bundle prefix no bucket holds: LocalRuntime's folders stand in its place.
LOCAL_BUNDLE = "s3://weights-on-this-machine/bundle/"


def on_this_cpu(serving: ServingConfig, *, max_model_len: int = 1024, max_num_seqs: int = 16,
                seed: int = 0) -> ServingConfig:
    """``serving`` as this CPU runs it: fp32 and eager (exact greedy tokens, a quick start), one device, the
    given sizes, no GPU flags or variables, no pin (the weights are the caller's folders), and no capture (its
    records would name the stage's target for another model's answers: a caller that wants them sets its own);
    the rest as given."""
    return dataclasses.replace(serving, dtype="float32", tensor_parallel_size=1, max_model_len=max_model_len,
                               max_num_seqs=max_num_seqs, extra_args={"enforce_eager": True, "seed": seed},
                               extra_environment={}, bundle_manifest_sha256=None, capture=None)


def local_serving(*, num_speculative_tokens: int | None = None,
                  num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None,
                  max_model_len: int = 1024, max_num_seqs: int = 16, seed: int = 0,
                  served_model_name: str | None = None,
                  request_capabilities: frozenset[str] = frozenset()) -> ServingConfig:
    """A config for a pair on this machine with no stage behind it: K as given, else the contract's default."""
    chosen = {} if num_speculative_tokens is None else {"num_speculative_tokens": num_speculative_tokens}
    return on_this_cpu(ServingConfig(target_model=f"{LOCAL_BUNDLE}target/", drafter_model=f"{LOCAL_BUNDLE}drafter/",
                                     num_speculative_tokens_per_batch_size=num_speculative_tokens_per_batch_size,
                                     served_model_name=served_model_name, request_capabilities=request_capabilities,
                                     **chosen),
                       max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed)


class RuntimeStartError(RuntimeError):
    """The local runtime did not start, or stopped."""


@dataclass
class LocalRuntime:
    """Our entrypoint on 127.0.0.1 with a target and a P-EAGLE drafter, fp32 and eager (exact, quick start).

    ``drafter=None`` starts plain decoding instead, through vLLM's own server with the same flags (our
    entrypoint serves P-EAGLE only, by design): the baseline that greedy parity is measured against.
    ``extra_env`` is applied last (test hooks, a kernel switch). Output goes to ``<log_dir>/<name>.stdout``
    (the per-request JSON lines) and ``.stderr`` (vLLM's log).
    """

    target: Path
    drafter: Path | None
    # What the container is told to serve (rendered by ServingConfig.to_environment, the folders above standing
    # where SageMaker mounts its weights); plain decoding takes the same flags without the speculative config.
    serving: ServingConfig = field(default_factory=local_serving)
    log_dir: Path = REPO_ROOT / ".cache" / "runtime"
    name: str = "peagle"
    port: int = field(default_factory=free_port)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # False: the same command line the entrypoint builds, less our request middleware (to measure its cost).
    middleware: bool = True
    # A folder shown to the server at /opt/ml/model, where SageMaker mounts a model's data (harness/bin/model-mount:
    # a mount namespace of the server's own); ``target`` and ``drafter`` are then the container's paths.
    model_mount: Path | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)
    started_at: float = field(default=0.0, init=False)
    ready_after_s: float | None = field(default=None, init=False)
    # What /ping answered while the engine loaded (status codes or transport errors), in order.
    pings_before_ready: list[str] = field(default_factory=list, init=False)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / f"{self.name}.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.name}.stderr"

    def speculative_config(self) -> dict | None:
        return None if self.drafter is None else self.serving.speculative_config(drafter_dir=str(self.drafter))

    def environment(self) -> dict[str, str]:
        """The container environment SageMaker would pass, plus the local listener and the CPU settings."""
        rendered = self.serving.to_environment(target_dir=str(self.target), drafter_dir=str(self.drafter or ""))
        if self.drafter is None:
            del rendered[SPECULATIVE_CONFIG_VAR]
        env = {k: v for k, v in cpu_engine_environment().items() if not k.startswith("SM_VLLM_")}
        env.update({"PEAGLE_HOST": "127.0.0.1", "PEAGLE_PORT": str(self.port), **rendered, **self.extra_env})
        return env

    def command(self, env: Mapping[str, str] | None = None) -> list[str]:
        if self.model_mount is not None:
            return [str(MODEL_MOUNT), str(self.model_mount), *self._server_command(env)]
        return self._server_command(env)

    def _server_command(self, env: Mapping[str, str] | None = None) -> list[str]:
        env = self.environment() if env is None else env
        if self.drafter is not None and self.middleware:
            return [sys.executable, "-m", "peagle_runtime.entrypoint", "serve"]
        if self.drafter is not None:
            from peagle_runtime.entrypoint import MIDDLEWARE, build_command

            cmd, _ = build_command(env)
            at = cmd.index("--middleware")
            assert cmd[at + 1] == MIDDLEWARE
            return cmd[:at] + cmd[at + 2:]
        # Plain decoding: the same SM_VLLM_* flags by the same rule, given to vLLM's server directly.
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *environment_to_argv(env),
                "--host", "127.0.0.1", "--port", str(self.port)]

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> "LocalRuntime":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(env), cwd=REPO_ROOT, env=env,
            stdout=self.stdout_path.open("wb"), stderr=self.stderr_path.open("wb"),
            start_new_session=True,  # its own process group: the engine core and workers stop with it
        )
        return self

    def wait_ready(self, timeout_s: float = 600.0) -> "LocalRuntime":
        """Poll /ping until it answers 200; raise with the log's tail if the process exits or time runs out."""
        import httpx

        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeStartError(f"{self.name} exited with code {self.proc.returncode}:\n{self.tail()}")
                try:
                    r = client.get(self.base + "/ping")
                    if r.status_code == 200:
                        self.ready_after_s = time.monotonic() - self.started_at
                        return self
                    self.pings_before_ready.append(str(r.status_code))
                except httpx.TransportError as exc:
                    self.pings_before_ready.append(type(exc).__name__)
                time.sleep(0.5)
        self.stop()
        raise RuntimeStartError(f"{self.name} did not answer /ping within {timeout_s:.0f} s:\n{self.tail()}")

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM (what SageMaker sends), up to ``grace_s`` to exit, then SIGKILL whatever is left of the group.

        Returns the server's exit code, or None when it was never started.
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()
        return self.proc.wait(10)

    def kill_group(self) -> None:
        """SIGKILL what is left of the process group (server, engine core, workers)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "LocalRuntime":
        try:
            return self.start().wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- output ---------------------------------------------------------------------------------------
    def tail(self, lines: int = 40) -> str:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def last_log_line(self) -> str:
        """vLLM's latest log line, short, warnings left out: a progress hint while the engine loads."""
        useful = [line for line in self.tail(200).splitlines()
                  if line.strip() and "warn" not in line.lower() and "Triton" not in line]
        return useful[-1].split("] ")[-1][:60] if useful else ""

    def capture_lines(self) -> list[str]:
        """The capture records the server printed so far, as it wrote them (peagle_contract.capture)."""
        text = self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""
        return [line for line in text.splitlines() if is_record_line(line)]

    def request_lines(self) -> list[dict]:
        """The per-request records the server printed so far (the lines CloudWatch's metric filters read)."""
        text = self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""
        return [rec for rec in map(parse_line, text.splitlines()) if rec]

