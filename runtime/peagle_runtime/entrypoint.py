"""The image's entrypoint: SageMaker's environment -> a checked vLLM OpenAI server command -> exec.

SageMaker runs ``docker run IMAGE serve``. We turn ``SM_VLLM_*`` variables into vLLM arguments with the
shared contract (:func:`peagle_contract.serving.environment_to_argv`, the DLC rule), check them with the
same contract plus what only the container can see (the drafter's files), and replace this process with
vLLM's own OpenAI server, so SIGTERM from SageMaker reaches uvicorn directly.

Every problem found here ends the process with exit status 2 and one line naming the variable and what
is allowed, before vLLM spends minutes loading a model. First of all, a pinned weights bundle is verified file
by file (peagle_contract.bundle); pinned or not, the SageMaker loader never sees the bundle as its script path.

Local runs: ``PEAGLE_HOST`` / ``PEAGLE_PORT`` move the listener (SageMaker always gets 0.0.0.0:8080);
arguments after ``serve`` are passed on to vLLM (e.g. ``--enforce-eager``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from peagle_contract.bundle import MANIFEST_DIGEST_VAR, BundleError, verify_bundle
from peagle_contract.capture import parse_capture
from peagle_contract.drafter import DrafterCheckError, check_drafter_dir
from peagle_contract.served_config import UNPINNED, VERIFIED_BUNDLE_VAR
from peagle_contract.serving import (
    ENV_PREFIX,
    FORBIDDEN_FLAGS,
    MODEL_RUNNER_ENV,
    SPECULATIVE_CONFIG_VAR,
    TARGET_MODEL_DIR,
    ServingConfigError,
    check_environment,
    environment_to_argv,
    parse_request_capabilities,
)

from peagle_runtime.check_pool import workers_from_environment
from peagle_runtime.plugin import ENV_SWITCH as FUSED_DRAFT_VAR
from peagle_runtime.plugin import switch_value as fused_draft_switch
from peagle_runtime.shutdown import ENGINE_MARGIN_S, drain_budget_from_environment

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
# in-flight request at once, a positive timeout ("drain") lets requests run but never aborts the ones still
# running at its deadline (their streams hang until SIGKILL). vLLM drains here, with a timeout longer than the
# middleware's drain budget (peagle_runtime.shutdown): the middleware ends what is still open when its budget runs
# out, which aborts those requests in the engine, so vLLM's drain completes and the process exits before SIGKILL
# (its timeout is the budget plus shutdown.ENGINE_MARGIN_S).
# vLLM's SageMaker router (model_hosting_container_standards) imports <SAGEMAKER_MODEL_PATH>/<CUSTOM_SCRIPT_FILENAME>
# at start when that file exists; the defaults are /opt/ml/model/ and model.py, and /opt/ml/model is the weights
# bundle. vLLM's server gets a folder of the image instead, which the Dockerfile makes empty and read-only and
# SageMaker never writes (the bundle lands in /opt/ml/model only): no file of any bundle is imported, pinned or not.
LOADER_PATH_VAR, LOADER_SCRIPT_VAR = "SAGEMAKER_MODEL_PATH", "CUSTOM_SCRIPT_FILENAME"
LOADER_SCRIPT = "model.py"
NO_CUSTOM_CODE_DIR = "/opt/peagle/no-custom-code/"


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


def _log(line: str) -> None:
    print(f"peagle-serve: {line}", file=sys.stderr, flush=True)


def verify_weights(env: Mapping[str, str], model_dir: str | Path = TARGET_MODEL_DIR) -> str:
    """The bundle in ``model_dir`` must be exactly the pinned one (every file's size and SHA-256, nothing else),
    before anything reads it; one line says what was hashed and how fast. Returns the digest verified, or
    UNPINNED (said, not checked)."""
    if MANIFEST_DIGEST_VAR not in env:
        _log(f"{MANIFEST_DIGEST_VAR} not set: the weights in {model_dir} are not verified")
        return UNPINNED
    try:
        verified = verify_bundle(Path(model_dir), env[MANIFEST_DIGEST_VAR])
    except BundleError as exc:
        raise EntrypointError(str(exc)) from None
    _log(f"bundle {model_dir} verified against {MANIFEST_DIGEST_VAR} ({env[MANIFEST_DIGEST_VAR][:12]}...): "
         + verified.summary())
    return env[MANIFEST_DIGEST_VAR]


def loader_environment(loader_dir: str = NO_CUSTOM_CODE_DIR) -> dict[str, str]:
    """The SageMaker loader's variables for vLLM's server: a script path that holds nothing (checked here, so the
    guarantee does not rest on the image alone)."""
    folder = Path(loader_dir)
    if folder.is_dir() and any(folder.iterdir()):
        raise EntrypointError(f"{LOADER_PATH_VAR}: {loader_dir} must be empty (the SageMaker loader imports "
                              f"{LOADER_SCRIPT} from it); found {sorted(p.name for p in folder.iterdir())[:5]}")
    return {LOADER_PATH_VAR: loader_dir, LOADER_SCRIPT_VAR: LOADER_SCRIPT}


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~"))


def build_command(env: Mapping[str, str], extra_args: Sequence[str] = (), *,
                  model_dir: str | Path = TARGET_MODEL_DIR,
                  python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The vLLM server command line and its environment, after every check. Raises EntrypointError."""
    verified = verify_weights(env, model_dir)  # the pinned bundle, exactly, before anything reads it
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
        drain_s = drain_budget_from_environment(env)  # the middleware's knobs: refused here, not at the first request
        workers_from_environment(env)
        parse_request_capabilities(env)
        parse_capture(env)
    except (ValueError, ServingConfigError) as exc:
        raise EntrypointError(str(exc)) from None

    argv = environment_to_argv(env)
    argv += ["--host", host, "--port", str(port), "--middleware", MIDDLEWARE]
    given = {_flag_key(a) for a in argv + list(extra_args)}
    if _SPEC_METRICS_FLAG not in given:
        argv += ["--" + _SPEC_METRICS_FLAG.replace("_", "-"), "summary"]
    if "shutdown_timeout" not in given:
        argv += ["--shutdown-timeout", str(drain_s + ENGINE_MARGIN_S)]
    if "enable_per_request_metrics" not in given and "disable_log_stats" not in given:
        argv.append("--enable-per-request-metrics")  # the engine's own TTFT for whole-body responses
    argv += list(extra_args)

    child_env = dict(env)
    child_env.update(MODEL_RUNNER_ENV)  # parallel drafting needs the V1 model runner
    child_env.update(loader_environment())
    # What the container's statement says it verified: set here whatever the model environment held.
    child_env[VERIFIED_BUNDLE_VAR] = verified
    # The fused kernel's "auto": proven once here, in a child process, before vLLM starts (never in the engine).
    # Imported here: the kernels package needs torch, which the image's base brings and a config check does not.
    from peagle_runtime.kernels.start_check import fused_draft_at_start

    child_env[FUSED_DRAFT_VAR] = fused_draft_at_start(child_env, spec, target, log=_log)
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
