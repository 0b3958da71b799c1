"""The image's entrypoint: SageMaker's environment -> a checked vLLM OpenAI server command -> exec.

SageMaker runs ``docker run IMAGE serve``. We turn ``SM_VLLM_*`` variables into vLLM arguments with the
shared contract (:func:`peagle_contract.serving.environment_to_argv`, the DLC rule), check them with the
same contract plus what only the container can see (the drafter's files), and replace this process with
vLLM's own OpenAI server, so SIGTERM from SageMaker reaches uvicorn directly.

Every problem found here ends the process with exit status 2 and one line naming the variable and what
is allowed, before vLLM spends minutes loading a model.

Local runs: ``PEAGLE_HOST`` / ``PEAGLE_PORT`` move the listener (SageMaker always gets 0.0.0.0:8080);
arguments after ``serve`` are passed on to vLLM (e.g. ``--enforce-eager``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from peagle_contract.bundle import MANIFEST_DIGEST_VAR, BundleError, check_bundle
from peagle_contract.drafter import DrafterCheckError, check_drafter_dir
from peagle_contract.serving import (
    ENV_PREFIX,
    FORBIDDEN_FLAGS,
    MODEL_RUNNER_ENV,
    SPECULATIVE_CONFIG_VAR,
    TARGET_MODEL_DIR,
    ServingConfigError,
    check_environment,
    environment_to_argv,
)

from peagle_runtime.plugin import switch_value as fused_draft_switch

SAGEMAKER_PORT = 8080
DEFAULT_HOST = "0.0.0.0"
HOST_VAR, PORT_VAR = "PEAGLE_HOST", "PEAGLE_PORT"
MODEL_VAR = ENV_PREFIX + "MODEL"
MIDDLEWARE = "peagle_runtime.request_metrics.RequestMetricsMiddleware"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# The entrypoint decides these; setting them through SM_VLLM_* or extra arguments is refused.
_LISTENER_FLAGS = frozenset({"port", "host", "uds"})
# Per-request draft/accept counts ride on vLLM's response metrics; on unless the operator chose a level.
_SPEC_METRICS_FLAG = "per_request_spec_decode_metrics"
# SageMaker sends SIGTERM and SIGKILLs 30 s later. vLLM 0.32's two shutdown modes: 0 ("abort") aborts every
# in-flight request and stops the engine at once - the aborts' final events reach the server only when the
# engine sends them before it is killed, a race (a stream that loses it is ended by the middleware,
# shutdown.SHUTDOWN_GRACE_S later); a positive timeout ("drain") lets requests run but never aborts
# the ones still running at the deadline, and their streams hang until SIGKILL (both measured in
# tests/runtime/test_shutdown.py). SageMaker stops an instance after traffic has moved away, so abort.
SHUTDOWN_TIMEOUT_S = 0


class EntrypointError(ValueError):
    pass


def _flag_key(arg: str) -> str | None:
    if not arg.startswith("--"):
        return None
    return arg[2:].split("=", 1)[0].replace("-", "_").lower()


def default_model(env: Mapping[str, str], model_dir: str | Path = TARGET_MODEL_DIR) -> dict[str, str]:
    """``SM_VLLM_MODEL`` defaults to SageMaker's model directory when that directory holds files."""
    if env.get(MODEL_VAR):
        return dict(env)
    d = Path(model_dir)
    if d.is_dir() and any(d.iterdir()):
        return {**env, MODEL_VAR: str(d)}
    raise EntrypointError(
        f"{MODEL_VAR}: not set and {d} is empty or missing; allowed: a model directory in the container "
        f"(SageMaker's ModelDataSource lands in {TARGET_MODEL_DIR}) or a Hugging Face id"
    )


def _check_listener(env: Mapping[str, str]) -> tuple[str, int]:
    for key in _LISTENER_FLAGS:
        name = ENV_PREFIX + key.upper()
        if name in env:
            raise EntrypointError(
                f"{name}: not allowed: SageMaker talks to port {SAGEMAKER_PORT} on all interfaces; "
                f"for local runs set {HOST_VAR} / {PORT_VAR}"
            )
    host = env.get(HOST_VAR, DEFAULT_HOST) or DEFAULT_HOST
    raw_port = env.get(PORT_VAR, str(SAGEMAKER_PORT))
    try:
        port = int(raw_port)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise EntrypointError(f"{PORT_VAR}: got {raw_port!r}; allowed: an integer in 1..65535")
    return host, port


def _check_extra_args(extra: Sequence[str]) -> None:
    for arg in extra:
        key = _flag_key(arg)
        if key in FORBIDDEN_FLAGS:
            raise EntrypointError(f"argument {arg}: not allowed: SageMaker strips the Authorization header, "
                                  "so every request would fail")
        if key in _LISTENER_FLAGS:
            raise EntrypointError(f"argument {arg}: not allowed: the entrypoint owns the listener; "
                                  f"set {HOST_VAR} / {PORT_VAR} for local runs")
        if "\n" in arg or "\r" in arg:
            raise EntrypointError(f"argument {arg[:40]!r}: must be a single line")


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~"))


def build_command(env: Mapping[str, str], extra_args: Sequence[str] = (), *,
                  model_dir: str | Path = TARGET_MODEL_DIR,
                  python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The vLLM server command line and its environment, after every check. Raises EntrypointError."""
    if env.get(MANIFEST_DIGEST_VAR):
        try:  # the weights must be the bundle the environment pinned, before anything reads them
            check_bundle(Path(model_dir), env[MANIFEST_DIGEST_VAR])
        except BundleError as exc:
            raise EntrypointError(str(exc)) from None
    env = default_model(env, model_dir)
    try:
        spec = check_environment(env)
    except ServingConfigError as exc:
        raise EntrypointError(str(exc)) from None
    drafter = spec["model"]
    if _looks_local(drafter) or Path(drafter).is_dir():
        try:
            info = check_drafter_dir(Path(drafter).expanduser(), where=f"{SPECULATIVE_CONFIG_VAR}.model")
            info.check_k(spec["num_speculative_tokens"], where=f"{SPECULATIVE_CONFIG_VAR}.num_speculative_tokens")
        except DrafterCheckError as exc:
            raise EntrypointError(str(exc)) from None
    target = env[MODEL_VAR]
    if _looks_local(target) and not Path(target).expanduser().is_dir():
        raise EntrypointError(f"{MODEL_VAR}: directory {target} does not exist")
    host, port = _check_listener(env)
    _check_extra_args(extra_args)
    try:
        fused_draft_switch(env)  # vLLM would only load the plugin (and fail) after minutes of start-up
    except ValueError as exc:
        raise EntrypointError(str(exc)) from None

    argv = environment_to_argv(env)
    argv += ["--host", host, "--port", str(port), "--middleware", MIDDLEWARE]
    given = {_flag_key(a) for a in argv + list(extra_args)}
    if _SPEC_METRICS_FLAG not in given:
        argv += ["--" + _SPEC_METRICS_FLAG.replace("_", "-"), "summary"]
    if "shutdown_timeout" not in given:
        argv += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    if "enable_per_request_metrics" not in given and "disable_log_stats" not in given:
        argv.append("--enable-per-request-metrics")  # the engine's own TTFT for whole-body responses
    argv += list(extra_args)

    child_env = dict(env)
    child_env.update(MODEL_RUNNER_ENV)  # parallel drafting needs the V1 model runner
    return [python, "-m", SERVER_MODULE, *argv], child_env


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "serve":  # SageMaker's `docker run IMAGE serve`
        args = args[1:]
    try:
        cmd, env = build_command(os.environ, args)
    except EntrypointError as exc:
        print(f"peagle-serve: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print("peagle-serve: starting " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
