"""What the serving container says it runs, on every answer: the contract between the image and the deploy checks.

SageMaker routes nothing but /ping and /invocations to a container, and hands a client one header of the
container's answer verbatim: ``X-Amzn-SageMaker-Custom-Attributes`` (boto3's ``CustomAttributes`` of
InvokeEndpoint and InvokeEndpointWithResponseStream; at most 1024 visible US-ASCII characters). The image's
middleware sets it on every generation answer from the configuration the engine was built with (not from the
environment it was given): K, the drafter as the server loaded it, the method, parallel drafting and the vLLM
release. `make deploy TARGET=aws`, `make smoke` and the promotion's smoke tests read it back and compare it with
the model environment the stack deployed (:func:`expected_from_environment`). Standard library only.

``bundle`` is the weights bundle the container verified before vLLM started (the manifest's SHA-256, or
``unpinned``): with a bundle every drafter is mounted at the same path, so the drafter's path cannot tell one head
from the next; the digest can. The entrypoint sets :data:`VERIFIED_BUNDLE_VAR` for the server after verifying, and
always (a model environment that sets it is overwritten), and the statement reads that.

The value is ``peagle.k=7;peagle.method=eagle3;...``: attributes this project owns start with ``peagle.``; each
value is percent-encoded, so a path may hold any character.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping
from urllib.parse import quote, unquote

from peagle_contract.bundle import MANIFEST_DIGEST_VAR
from peagle_contract.serving import DYNAMIC_K_KEY, SPECULATIVE_CONFIG_VAR, parse_speculative_config

HEADER = "X-Amzn-SageMaker-Custom-Attributes"
# SageMaker's limit on the header (botocore's CustomAttributes shape: max 1024).
MAX_CHARS = 1024
# The vLLM release the image is built with; its fused-draft plugin patches this release only.
VLLM_RELEASE = "0.32.0"
PREFIX = "peagle."
_SAFE = "/:@-._~+"
# Set by the entrypoint for vLLM's server: the digest of the bundle it verified, else UNPINNED.
VERIFIED_BUNDLE_VAR = "PEAGLE_VERIFIED_BUNDLE"
UNPINNED = "unpinned"


class ServedConfigError(ValueError):
    """The container's statement is missing or malformed; the message names the attribute."""


def release(version: str) -> str:
    """A vLLM version without its local build label (``0.32.0+cpu`` -> ``0.32.0``): the label names the platform
    a wheel was built for, not another release."""
    return version.split("+", 1)[0]


@dataclass(frozen=True, kw_only=True)
class ServedConfig:
    k: int
    drafter: str
    method: str
    parallel_drafting: bool
    vllm: str
    # K by load as the engine schedules it: "fixed", or "first-last:K" ranges ("1-2:7,3-64:0").
    k_by_load: str = "fixed"
    bundle: str = UNPINNED  # the manifest digest the container verified its weights against

    def render(self) -> str:
        parts = [f"{PREFIX}{f.name}={quote(_text(getattr(self, f.name)), safe=_SAFE)}" for f in fields(self)]
        value = ";".join(parts)
        if len(value) > MAX_CHARS:
            raise ServedConfigError(f"{HEADER}: renders {len(value)} characters; allowed: at most {MAX_CHARS} "
                                    "(SageMaker's limit on the header)")
        return value


def k_by_load(schedule) -> str:
    """vLLM's ``num_speculative_tokens_per_batch_size`` as the statement says it ("fixed" when there is none)."""
    if not schedule:
        return "fixed"
    return ",".join(f"{int(first)}-{int(last)}:{int(k)}" for first, last, k in schedule)


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def parse(value: str | None) -> ServedConfig:
    """The container's statement from the header's value; attributes that are not ours are left alone."""
    if not value:
        raise ServedConfigError(f"{HEADER}: absent; the container did not say what it runs (an image without "
                                "peagle_runtime's middleware, or a request that did not reach the engine)")
    ours = {}
    for part in value.split(";"):
        key, sep, raw = part.strip().partition("=")
        if sep and key.startswith(PREFIX):
            ours[key[len(PREFIX):]] = unquote(raw)
    missing = [f.name for f in fields(ServedConfig) if f.name not in ours]
    if missing:
        raise ServedConfigError(f"{HEADER}: no {', '.join(PREFIX + m for m in missing)} in {value[:200]!r}")
    if not ours["k"].isdigit():
        raise ServedConfigError(f"{HEADER}: {PREFIX}k got {ours['k']!r}; allowed: a positive integer")
    if ours["parallel_drafting"] not in ("true", "false"):
        raise ServedConfigError(f"{HEADER}: {PREFIX}parallel_drafting got {ours['parallel_drafting']!r}; "
                                "allowed: true or false")
    return ServedConfig(k=int(ours["k"]), drafter=ours["drafter"], method=ours["method"],
                        parallel_drafting=ours["parallel_drafting"] == "true", vllm=ours["vllm"],
                        k_by_load=ours["k_by_load"], bundle=ours["bundle"])


def expected_from_environment(env: Mapping[str, str]) -> ServedConfig:
    """What a container given this model environment must say it runs (the release's vLLM)."""
    spec = parse_speculative_config(env.get(SPECULATIVE_CONFIG_VAR) or "", SPECULATIVE_CONFIG_VAR)
    return ServedConfig(k=spec["num_speculative_tokens"], drafter=spec["model"], method=spec["method"],
                        parallel_drafting=spec["parallel_drafting"], vllm=VLLM_RELEASE,
                        k_by_load=k_by_load(spec.get(DYNAMIC_K_KEY)), bundle=env.get(MANIFEST_DIGEST_VAR) or UNPINNED)


def differences(*, expected: ServedConfig, served: ServedConfig) -> list[str]:
    """One line per attribute that differs, naming both values; vLLM by release."""
    lines = []
    for f in fields(ServedConfig):
        want, got = getattr(expected, f.name), getattr(served, f.name)
        if f.name == "vllm":
            want, got = release(want), release(got)
        if want != got:
            lines.append(f"{f.name}: the container runs {got!r}, the stack deployed {want!r}")
    return lines
