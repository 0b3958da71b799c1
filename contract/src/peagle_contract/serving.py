"""The serving contract between the CDK side and the serving image.

One typed config (:class:`ServingConfig`) renders the container environment (``SM_VLLM_*`` by the vLLM
DLC rule, plus the few plain variables vLLM itself reads). The image's entrypoint turns that environment
back into vLLM arguments with :func:`environment_to_argv` and checks it with :func:`check_environment`,
so both sides share one set of rules and limits. Standard library only: the image imports this module
without the CDK.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from peagle_contract.bundle import DRAFTER_DIR, MANIFEST_DIGEST_VAR, TARGET_DIR, BundleError, check_digest
from peagle_contract.capture import CAPTURE_VAR, CaptureConfig

ENV_PREFIX = "SM_VLLM_"
SPECULATIVE_CONFIG_VAR = "SM_VLLM_SPECULATIVE_CONFIG"

# Where SageMaker puts the weights inside the container: the model's one ModelDataSource lands in
# /opt/ml/model (CloudFormation's AWS::SageMaker::Model has no AdditionalModelDataSources), so target and
# drafter travel as one bundle. The defaults here are the bundle with the drafter inside the target's
# prefix; the constructs pass the folders of the layout they deploy.
TARGET_MODEL_DIR = "/opt/ml/model"
DRAFTER_MODEL_DIR = f"{TARGET_MODEL_DIR}/drafter"

# P-EAGLE is vLLM's eagle3 method with parallel drafting; Model Runner V2 refuses parallel drafting.
SPEC_METHOD = "eagle3"
DYNAMIC_K_KEY = "num_speculative_tokens_per_batch_size"
MODEL_RUNNER_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}

K_MIN, K_MAX = 1, 32
# A schedule is a handful of load bands; more is a mistake (and an environment value has a size limit).
K_SCHEDULE_MAX_RANGES = 16
TP_ALLOWED = (1, 2, 4, 8)
MAX_MODEL_LEN_MIN, MAX_MODEL_LEN_MAX = 256, 1_048_576
DTYPES = ("auto", "bfloat16", "float16", "float32")

# Flags the serving config owns: an extra argument may not set them a second time.
_OWNED_FLAGS = frozenset(
    {"model", "speculative_config", "tensor_parallel_size", "max_model_len", "dtype", "port", "host",
     "gpu_memory_utilization", "max_num_seqs", "served_model_name"}
)
# SageMaker strips unknown headers, so a server that wants an API key rejects every request.
FORBIDDEN_FLAGS = frozenset({"api_key"})
# vLLM's boolean flags take `--no-<flag>` (argparse BooleanOptionalAction), except these store-true ones,
# whose off state is their default (tests/runtime/test_entrypoint.py checks this list against vLLM's parser).
FLAGS_WITHOUT_NO_FORM = frozenset({"headless", "grpc", "data_parallel_multi_port_external_lb", "disable_log_stats",
                                   "aggregate_engine_logging"})
NO_PREFIX = "no_"

# Request fields (and the headers vLLM reads for them) that pull an operator's lever rather than describe a
# generation: the image refuses each by name unless the serving config enables it (``request_capabilities``).
# Which levers vLLM honours moves with its flags; this list is ours, so a flag of the day opens nothing.
REQUEST_CAPABILITIES: Mapping[str, str] = {
    "chat_template": "a Jinja template from the client, rendered inside the server (also as "
                     "chat_template_kwargs.chat_template; vLLM wants --trust-request-chat-template as well)",
    "kv_transfer_params": "directs the KV-cache connector (remote prefill hosts and blocks): disaggregated "
                          "serving's plumbing",
    "ec_transfer_params": "directs the encoder-cache connector, as kv_transfer_params does the KV cache",
    "priority": "scheduling priority over other clients' requests (also the X-Vllm-Priority header)",
    "session_id": "server-side session state across requests (also the X-Session-ID header and "
                  "vllm_xargs.session_id)",
    "data_parallel_rank": "picks the engine rank that serves the request (the X-data-parallel-rank header)",
    "vllm_xargs": "free-form arguments for the server's logits processors and plugins",
    "prompt_embeds": "raw tensors the server deserializes with torch",
    "mm_processor_kwargs": "settings of the server's multimodal preprocessing",
    "media_io_kwargs": "settings of the server's media loaders",
    "mm_payload": "pre-processed multimodal inputs handed to the engine",
    "return_mm_kwargs": "asks for the engine's multimodal inputs back",
    "routed_experts_prompt_start": "asks for the MoE router's internal choices back",
}
REQUEST_CAPABILITIES_VAR = "PEAGLE_REQUEST_CAPABILITIES"


def check_request_capabilities(names: object, where: str = "request_capabilities") -> frozenset[str]:
    """The capability names, each one of :data:`REQUEST_CAPABILITIES`; ServingConfigError naming the first other."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):  # type: ignore[union-attr]
        raise ServingConfigError(where, "allowed: a set of capability names, e.g. {'priority'}")
    for name in names:  # type: ignore[union-attr]
        if name not in REQUEST_CAPABILITIES:
            raise ServingConfigError(where, f"got {name[:40]!r}; allowed: any of {sorted(REQUEST_CAPABILITIES)}")
    return frozenset(names)  # type: ignore[arg-type]


def parse_request_capabilities(env: Mapping[str, str]) -> frozenset[str]:
    """What the container's environment enables (:data:`REQUEST_CAPABILITIES_VAR`, comma-separated); none when unset."""
    raw = env.get(REQUEST_CAPABILITIES_VAR, "")
    return check_request_capabilities([n.strip() for n in raw.split(",") if n.strip()], REQUEST_CAPABILITIES_VAR)


# SageMaker's limits on a container's Environment (CreateModel: EnvironmentMap, EnvironmentKey/Value).
ENV_MAX_ENTRIES = 100
ENV_MAX_KEY_CHARS = 1024
ENV_MAX_VALUE_CHARS = 1024

_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?$")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[\w.\-]{1,96}$")
_FLAG_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_ENV_KEY = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class ServingConfigError(ValueError):
    """A serving setting is out of range. The message names the field and what is allowed."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name


def is_s3_uri(value: str) -> bool:
    return bool(_S3_URI.match(value))


def is_hf_id(value: str) -> bool:
    return bool(_HF_ID.match(value)) and not value.startswith(("s3:", "/"))


def check_pinned_bundle(target_model: str, drafter_model: str, pin: str) -> None:
    """A pin names one content-addressed bundle, so both models must be its two folders:
    ``s3://<bucket>/<prefix>/<pin>/target/`` and ``.../drafter/`` (what the stager writes and the container
    verifies; a hub id or another prefix would leave the container no bundle to check)."""
    target = target_model.rstrip("/")
    if not (is_s3_uri(target_model) and target.endswith(f"/{pin}/{TARGET_DIR}")):
        raise ServingConfigError(
            "target_model", f"got {target_model!r}; allowed with bundle_manifest_sha256 set: the target folder of the "
                            f"bundle it pins, an S3 prefix ending in /{pin[:12]}.../{TARGET_DIR}/ (`stage-weights` "
                            "prints it)")
    drafter = f"{target[:-len(TARGET_DIR)]}{DRAFTER_DIR}/"
    if drafter_model.rstrip("/") + "/" != drafter:
        raise ServingConfigError(
            "drafter_model", f"got {drafter_model!r}; allowed with bundle_manifest_sha256 set: {drafter!r}, the "
                             "drafter folder of the same bundle")


@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """What the serving image runs: a target model verified against a P-EAGLE drafter head.

    ``target_model`` and ``drafter_model`` are S3 prefixes (``s3://bucket/prefix/``, uncompressed
    weights, so the model can run with network isolation) or, with network isolation off, Hugging Face
    ids. ``extra_args`` holds further vLLM flags by their argument name with ``_``: True renders a bare flag
    (``SM_VLLM_ENABLE_PREFIX_CACHING=true`` -> ``--enable-prefix-caching``) and False turns the flag off
    (``SM_VLLM_NO_ENABLE_PREFIX_CACHING=true`` -> ``--no-enable-prefix-caching``: the DLC rule drops a
    ``false`` value, which would leave a flag vLLM turns on by default on).
    """

    target_model: str
    drafter_model: str
    num_speculative_tokens: int = 7
    parallel_drafting: bool = True
    tensor_parallel_size: int = 1
    max_model_len: int = 8192
    max_num_seqs: int = 64
    gpu_memory_utilization: float = 0.90
    dtype: str = "auto"
    served_model_name: str | None = None
    extra_args: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    # The SHA-256 of the weights bundle's manifest (peagle_contract.bundle): the image refuses another bundle,
    # and a new pin is a new model in a stack diff. None: no pin.
    bundle_manifest_sha256: str | None = None
    # Plain environment variables for vLLM itself (e.g. a kernel switch a model card asks for); SM_VLLM_*
    # flags go through extra_args, and the variables this project owns cannot be set here.
    extra_environment: Mapping[str, str] = field(default_factory=dict)
    # Operator levers a request may pull (names of REQUEST_CAPABILITIES); every other one is refused by name.
    request_capabilities: frozenset[str] = frozenset()
    # K by load: vLLM's ``num_speculative_tokens_per_batch_size``, ((first, last, K), ...) over the batch sizes
    # a step schedules, from 1 up. With parallel drafting vLLM 0.32 serves only K = num_speculative_tokens
    # or 0 (no drafting) in a range (see check_k_schedule); None: K is fixed.
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    # A sample of the requests served, recorded for the drafter's trainer (peagle_contract.capture); None: none.
    capture: CaptureConfig | None = None

    def __post_init__(self) -> None:
        self.validate()

    # -- validation ---------------------------------------------------------------------------------
    def validate(self) -> None:
        for name in ("target_model", "drafter_model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not (is_s3_uri(value) or is_hf_id(value)):
                raise ServingConfigError(
                    name,
                    f"got {value!r}; allowed: an S3 prefix 's3://bucket/prefix/' holding uncompressed weights, "
                    "or a Hugging Face id 'org/name' (only with network isolation off)",
                )
        check_num_speculative_tokens(self.num_speculative_tokens, "num_speculative_tokens")
        if self.num_speculative_tokens_per_batch_size is not None:
            check_k_schedule(self.num_speculative_tokens_per_batch_size, self.num_speculative_tokens,
                             DYNAMIC_K_KEY)
        if self.parallel_drafting is not True:
            raise ServingConfigError(
                "parallel_drafting",
                "must be true: a P-EAGLE drafter head predicts all K tokens in one pass and was trained "
                "for parallel drafting (sequential drafting with it accepts almost nothing)",
            )
        if self.tensor_parallel_size not in TP_ALLOWED:
            raise ServingConfigError(
                "tensor_parallel_size", f"got {self.tensor_parallel_size!r}; allowed: one of {TP_ALLOWED}"
            )
        if not (isinstance(self.max_model_len, int) and MAX_MODEL_LEN_MIN <= self.max_model_len <= MAX_MODEL_LEN_MAX):
            raise ServingConfigError(
                "max_model_len",
                f"got {self.max_model_len!r}; allowed: an integer in {MAX_MODEL_LEN_MIN}..{MAX_MODEL_LEN_MAX}",
            )
        if not (isinstance(self.max_num_seqs, int) and 1 <= self.max_num_seqs <= 4096):
            raise ServingConfigError("max_num_seqs", f"got {self.max_num_seqs!r}; allowed: an integer in 1..4096")
        if not (isinstance(self.gpu_memory_utilization, (int, float)) and 0.1 <= self.gpu_memory_utilization <= 0.98):
            raise ServingConfigError(
                "gpu_memory_utilization", f"got {self.gpu_memory_utilization!r}; allowed: a number in 0.1..0.98"
            )
        if self.dtype not in DTYPES:
            raise ServingConfigError("dtype", f"got {self.dtype!r}; allowed: one of {DTYPES}")
        if self.bundle_manifest_sha256 is not None:
            try:
                check_digest(self.bundle_manifest_sha256, "bundle_manifest_sha256")
            except BundleError as exc:
                raise ServingConfigError("bundle_manifest_sha256", str(exc).split(": ", 1)[1]) from None
            check_pinned_bundle(self.target_model, self.drafter_model, self.bundle_manifest_sha256)
        if self.served_model_name is not None and not re.match(r"^[\w.\-/]{1,128}$", self.served_model_name):
            raise ServingConfigError(
                "served_model_name", f"got {self.served_model_name!r}; allowed: 1-128 of letters, digits, . _ - /"
            )
        for key, value in self.extra_args.items():
            where = f"extra_args[{key!r}]"
            if not isinstance(key, str) or not _FLAG_NAME.match(key):
                raise ServingConfigError(where, "allowed: a vLLM argument name in snake_case, e.g. 'enable_prefix_caching'")
            flag = key.removeprefix(NO_PREFIX)
            if flag in FORBIDDEN_FLAGS:
                raise ServingConfigError(where, "not allowed: SageMaker strips the Authorization header, so every request would fail")
            if flag in _OWNED_FLAGS:
                raise ServingConfigError(where, f"not allowed: set it through the ServingConfig field '{flag}'")
            if not isinstance(value, (str, int, float, bool)):
                raise ServingConfigError(where, f"got {type(value).__name__}; allowed: str, int, float or bool")
            if key.startswith(NO_PREFIX) and (flag in self.extra_args or value is not True):
                raise ServingConfigError(where, f"got {value!r}; allowed: True only, and not beside {flag!r} "
                                                f"(turn a flag off with {{{flag!r}: False}})")
            check_single_line(str(value), where)
            if len(render_value(value)) > ENV_MAX_VALUE_CHARS:
                raise ServingConfigError(where, f"renders {len(render_value(value))} characters; allowed: at most "
                                                f"{ENV_MAX_VALUE_CHARS} (SageMaker's limit on an environment value)")
        for key, value in self.extra_environment.items():
            where = f"extra_environment[{key!r}]"
            if not isinstance(key, str) or not _ENV_KEY.match(key):
                raise ServingConfigError(where, "allowed: an environment variable name (letters, digits, _)")
            if key.startswith((ENV_PREFIX, "PEAGLE_")) or key in MODEL_RUNNER_ENV or key == MANIFEST_DIGEST_VAR:
                raise ServingConfigError(where, f"not allowed: {ENV_PREFIX}* flags go through extra_args, and "
                                                f"PEAGLE_* and {sorted(MODEL_RUNNER_ENV)} are set by this project")
            if not isinstance(value, str):
                raise ServingConfigError(where, f"got {type(value).__name__}; allowed: a string")
            check_single_line(value, where)
        check_request_capabilities(self.request_capabilities)
        if self.capture is not None and not isinstance(self.capture, CaptureConfig):
            raise ServingConfigError("capture", f"got {type(self.capture).__name__}; allowed: a CaptureConfig or None")
        rendered = (len(self._arguments()) + len(MODEL_RUNNER_ENV) + (self.bundle_manifest_sha256 is not None)
                    + len(self.extra_environment) + bool(self.request_capabilities) + (self.capture is not None))
        if rendered > ENV_MAX_ENTRIES:
            raise ServingConfigError("extra_args", f"renders {rendered} environment variables; allowed: at most "
                                                   f"{ENV_MAX_ENTRIES} in all (SageMaker's limit on a container)")

    @property
    def weights_in_s3(self) -> bool:
        """True when both models come from S3 (the precondition for network isolation)."""
        return is_s3_uri(self.target_model) and is_s3_uri(self.drafter_model)

    # -- rendering ----------------------------------------------------------------------------------
    def speculative_config(self, *, drafter_dir: str = DRAFTER_MODEL_DIR) -> dict:
        drafter = drafter_dir if is_s3_uri(self.drafter_model) else self.drafter_model
        return speculative_config(drafter, num_speculative_tokens=self.num_speculative_tokens,
                                  k_schedule=self.num_speculative_tokens_per_batch_size)

    def to_environment(
        self, *, target_dir: str = TARGET_MODEL_DIR, drafter_dir: str = DRAFTER_MODEL_DIR
    ) -> dict[str, str]:
        """The container environment, by the DLC rule (``SM_VLLM_X_Y`` -> ``--x-y``).

        ``target_dir`` / ``drafter_dir`` say where S3 weights appear in the container; the defaults are the
        bundle with the drafter inside the target's prefix. The CDK constructs pass the folders of the
        bundle layout they deploy (e.g. /opt/ml/model/target and /opt/ml/model/drafter).
        """
        target = target_dir if is_s3_uri(self.target_model) else self.target_model
        env = {ENV_PREFIX + key.upper(): render_value(value)
               for key, value in self._arguments(target=target, drafter_dir=drafter_dir).items()}
        env.update(self.extra_environment)
        env.update(MODEL_RUNNER_ENV)
        if self.bundle_manifest_sha256 is not None:
            env[MANIFEST_DIGEST_VAR] = self.bundle_manifest_sha256
        if self.request_capabilities:  # absent means none: a config without levers renders as it always did
            env[REQUEST_CAPABILITIES_VAR] = ",".join(sorted(self.request_capabilities))
        if self.capture is not None:  # absent means off, as before capture existed
            env[CAPTURE_VAR] = self.capture.render()
        check_environment_limits(env, "serving")
        return env

    def _arguments(self, *, target: str = TARGET_MODEL_DIR, drafter_dir: str = DRAFTER_MODEL_DIR
                   ) -> dict[str, str | int | float | bool]:
        """vLLM's arguments by name, before the DLC rule: a flag turned off (``False``) becomes ``no_<flag>``."""
        args: dict[str, str | int | float | bool] = {
            "model": target,
            "speculative_config": minified_json(self.speculative_config(drafter_dir=drafter_dir)),
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "dtype": self.dtype,
        }
        if self.served_model_name:
            args["served_model_name"] = self.served_model_name
        for key, value in self.extra_args.items():
            if value is False and key not in FLAGS_WITHOUT_NO_FORM:
                # The DLC rule drops `false`, which would leave a flag vLLM turns on by default turned on.
                args[NO_PREFIX + key] = True
            else:
                args[key] = value
        return args


# -- rules shared by both sides ---------------------------------------------------------------------


def speculative_config(drafter: str, *, num_speculative_tokens: int,
                       k_schedule: Sequence[Sequence[int]] | None = None) -> dict:
    """P-EAGLE as vLLM's ``--speculative-config`` takes it: the eagle3 method with parallel drafting.

    ``drafter`` is the head's folder as the server sees it (or a hub id). Always name the method: vLLM's
    guess from the folder name falls back to a plain draft model. K is not checked here: a ServingConfig
    checked it when it was made, and the image checks what it is given (:func:`parse_speculative_config`).
    ``k_schedule``: K by batch size (vLLM's ``num_speculative_tokens_per_batch_size``), absent when None.
    """
    spec = {"method": SPEC_METHOD, "model": str(drafter), "num_speculative_tokens": num_speculative_tokens,
            "parallel_drafting": True}
    if k_schedule is not None:
        spec[DYNAMIC_K_KEY] = [list(entry) for entry in k_schedule]
    return spec


def check_k_schedule(schedule: object, num_speculative_tokens: int, where: str) -> None:
    """K by batch size, checked as vLLM 0.32 checks it and by what it can serve with parallel drafting.

    vLLM's rules (``vllm/v1/spec_decode/dynamic/utils.py``): a non-empty list of (first, last, K) with
    positive inclusive batch-size ranges, first <= last, K >= 0, the ranges in ascending order without
    overlap and the first starting at 1 (every load has a K). vLLM sorts an unsorted list; here it is an
    error, so the config reads as it runs. Ours: a K between 1 and num_speculative_tokens makes vLLM 0.32's
    parallel-drafting proposer return drafts shaped for the full K and the engine dies on the first such
    step (bench/figures/vllm_features.json: gpu_model_runner.py _copy_draft_token_ids_to_cpu), so each
    range either drafts the full K or turns drafting off (0). The K a head was trained for bounds
    num_speculative_tokens, so it bounds every K here too.
    """
    allowed = (f"a list of [first, last, K] batch-size ranges, ascending from 1 without overlap, each K "
               f"0 or {num_speculative_tokens} (num_speculative_tokens)")
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ServingConfigError(where, f"got {_short(schedule)}; allowed: {allowed}")
    if len(schedule) > K_SCHEDULE_MAX_RANGES:
        raise ServingConfigError(where, f"got {len(schedule)} ranges; allowed: at most {K_SCHEDULE_MAX_RANGES}")
    previous_last = 0
    for index, entry in enumerate(schedule):
        at = f"{where}[{index}]"
        if (not isinstance(entry, (list, tuple)) or len(entry) != 3
                or any(isinstance(v, bool) or not isinstance(v, int) for v in entry)):
            raise ServingConfigError(at, f"got {_short(entry)}; allowed: three integers [first, last, K]")
        first, last, k = entry
        if not 1 <= first <= last:
            raise ServingConfigError(at, f"got the range {first}..{last}; allowed: 1 <= first <= last")
        if first != previous_last + 1:
            expected = "start at 1 (every batch size needs a K)" if index == 0 else \
                f"start at {previous_last + 1}, right after the range before (ascending, no overlap, no gap)"
            raise ServingConfigError(at, f"starts at {first}; allowed: {expected}")
        if k not in (0, num_speculative_tokens):
            raise ServingConfigError(at, f"got K={k}; allowed: 0 (no drafting at this load) or "
                                         f"{num_speculative_tokens} (num_speculative_tokens): vLLM 0.32's parallel "
                                         "drafting fails on any K in between")
        previous_last = last


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def minified_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


def render_value(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check_environment_limits(env: Mapping[str, str], where: str) -> None:
    """SageMaker's limits on a container environment: entries, key and value lengths, key characters."""
    if len(env) > ENV_MAX_ENTRIES:
        raise ServingConfigError(where, f"renders {len(env)} environment variables; allowed: at most {ENV_MAX_ENTRIES}")
    for key, value in env.items():
        if not _ENV_KEY.match(key) or len(key) > ENV_MAX_KEY_CHARS:
            raise ServingConfigError(f"{where}[{key!r}]", f"allowed: a name of letters, digits and _ (at most "
                                                          f"{ENV_MAX_KEY_CHARS} characters, not starting with a digit)")
        if len(value) > ENV_MAX_VALUE_CHARS:
            raise ServingConfigError(f"{where}[{key!r}]", f"is {len(value)} characters; allowed: at most "
                                                          f"{ENV_MAX_VALUE_CHARS} (SageMaker's limit on a value)")


def check_single_line(value: str, where: str) -> None:
    if "\n" in value or "\r" in value:
        raise ServingConfigError(where, "must be a single line (minify JSON values)")


def check_num_speculative_tokens(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not K_MIN <= value <= K_MAX:
        raise ServingConfigError(where, f"got {value!r}; allowed: an integer in {K_MIN}..{K_MAX}")


def environment_to_argv(env: Mapping[str, str]) -> list[str]:
    """The DLC rule: each ``SM_VLLM_X_Y=v`` becomes ``--x-y v``; ``true`` a bare flag, ``false`` nothing.

    Variables are taken in sorted order so the command line is the same on every start.
    """
    argv: list[str] = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX:
            continue
        value = env[name]
        check_single_line(value, name)
        flag = "--" + name[len(ENV_PREFIX):].lower().replace("_", "-")
        lowered = value.strip().lower()
        if lowered == "true":
            argv.append(flag)
        elif lowered == "false":
            continue
        else:
            argv.extend([flag, value])
    return argv


def parse_speculative_config(raw: str, where: str = SPECULATIVE_CONFIG_VAR) -> dict:
    """Parse and check a P-EAGLE speculative config; raise :class:`ServingConfigError` naming the key."""
    check_single_line(raw, where)
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ServingConfigError(where, f"is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(spec, dict):
        raise ServingConfigError(where, "must be a JSON object")
    if spec.get("method") != SPEC_METHOD:
        raise ServingConfigError(
            f"{where}.method", f"got {spec.get('method')!r}; allowed: {SPEC_METHOD!r} (P-EAGLE is eagle3 with parallel_drafting)"
        )
    if spec.get("parallel_drafting") is not True:
        raise ServingConfigError(f"{where}.parallel_drafting", f"got {spec.get('parallel_drafting')!r}; allowed: true")
    check_num_speculative_tokens(spec.get("num_speculative_tokens"), f"{where}.num_speculative_tokens")
    if spec.get(DYNAMIC_K_KEY) is not None:
        check_k_schedule(spec[DYNAMIC_K_KEY], spec["num_speculative_tokens"], f"{where}.{DYNAMIC_K_KEY}")
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        raise ServingConfigError(f"{where}.model", "must name the drafter: a directory in the container or a model id")
    return spec


def check_environment(env: Mapping[str, str]) -> dict:
    """Check the serving environment before vLLM starts; return the parsed speculative config.

    Raises :class:`ServingConfigError` on a multi-line value, a forbidden flag, or a speculative config
    that is not P-EAGLE.
    """
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        check_single_line(value, name)
        key = name[len(ENV_PREFIX):].lower()
        if key in FORBIDDEN_FLAGS:
            raise ServingConfigError(name, "not allowed: SageMaker strips the Authorization header, so every request would fail")
    raw = env.get(SPECULATIVE_CONFIG_VAR)
    if raw is None:
        example = minified_json({"method": SPEC_METHOD, "model": DRAFTER_MODEL_DIR, "num_speculative_tokens": 7,
                                 "parallel_drafting": True})
        raise ServingConfigError(SPECULATIVE_CONFIG_VAR, f"is required: a P-EAGLE config such as {example}")
    return parse_speculative_config(raw)
