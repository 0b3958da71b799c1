"""The container's statement of what it runs, from the engine's own configuration (peagle_contract.served_config).

vLLM's server keeps the configuration its engine was built with in ``app.state.vllm_config`` (set when the app
state is initialised, before the first request), and Starlette puts the app in every request's scope. The
statement is read from there, not from the environment the entrypoint was given: what a deploy check compares is
what the engine loaded.
"""

from __future__ import annotations

import os
from typing import Any

from peagle_contract.served_config import (
    HEADER, UNPINNED, VERIFIED_BUNDLE_VAR, ServedConfig, ServedConfigError, k_by_load,
)

_HEADER = HEADER.lower().encode("latin-1")


def from_vllm_config(vllm_config: Any, vllm_version: str, bundle: str = UNPINNED) -> ServedConfig | None:
    """None when the engine runs without speculative decoding (then it is not P-EAGLE, and says nothing).
    ``bundle``: the digest the entrypoint verified the weights against (its VERIFIED_BUNDLE_VAR)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return None
    method = getattr(spec, "method", None)
    return ServedConfig(k=int(spec.num_speculative_tokens), drafter=str(spec.model),
                        method=str(getattr(method, "value", method)),
                        parallel_drafting=bool(getattr(spec, "parallel_drafting", False)), vllm=vllm_version,
                        k_by_load=k_by_load(getattr(spec, "num_speculative_tokens_per_batch_size", None)),
                        bundle=bundle)


class Statement:
    """The header, computed on the first request that can see the app state, then the same for the process."""

    def __init__(self) -> None:
        self._header: tuple[bytes, bytes] | None = None

    def header(self, scope: dict) -> tuple[bytes, bytes] | None:
        if self._header is None:
            config = getattr(getattr(scope.get("app"), "state", None), "vllm_config", None)
            if config is None:
                return None
            import vllm

            served = from_vllm_config(config, str(getattr(vllm, "__version__", "unknown")),
                                      os.environ.get(VERIFIED_BUNDLE_VAR, UNPINNED))
            if served is None:
                return None
            try:
                self._header = (_HEADER, served.render().encode("ascii"))
            except ServedConfigError:
                return None  # a drafter path too long for SageMaker's header: the deploy check says it is absent
        return self._header

    def stamping(self, scope: dict, send):  # noqa: ANN001, ANN201 - ASGI send
        """``send`` with the header added to the response's start; ``send`` itself when there is none."""
        header = self.header(scope)
        if header is None:
            return send

        async def stamped(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        return stamped
