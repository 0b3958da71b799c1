"""The traffic capture on the request path: which requests are sampled, and their record once the answer ended.

What a record holds and which requests are never recorded is :mod:`peagle_contract.capture`'s to say. This module
decides per request, before vLLM sees it, whether it is sampled (and parses its body only then, and only a body
short enough that its record could fit: a large body is never parsed on the event loop), and writes the record
when the request's line is written. Nothing here can fail a request: a record that cannot be written is counted
on stderr and the answer goes out as it would have.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Callable, Mapping

from peagle_contract.bundle import MANIFEST_DIGEST_VAR
from peagle_contract.capture import MAX_RECORD_BYTES, CaptureConfig, format_record, parse_capture


class Sampled:
    """A request the capture took: its body as the client sent it, parsed. The response measure fills in the
    answer (:class:`peagle_runtime.response_measure.ResponseMeasure` reads choice 0 while it is sampled)."""

    def __init__(self, request: dict) -> None:
        self.request = request


class Capturer:
    """``config``'s share of requests, recorded through ``emit`` (the container's stdout, as the request lines)."""

    def __init__(self, config: CaptureConfig, *, emit: Callable[[str], None], bundle: str | None = None,
                 draw: Callable[[], float] = random.random) -> None:
        self.config, self.emit, self.bundle, self.draw = config, emit, bundle, draw
        self.failures = 0

    @classmethod
    def from_environment(cls, env: Mapping[str, str], *, emit: Callable[[str], None]) -> "Capturer | None":
        """None when the environment asks for no capture (the entrypoint checked the value before vLLM started)."""
        config = parse_capture(env)
        return None if config is None else cls(config, emit=emit, bundle=env.get(MANIFEST_DIGEST_VAR))

    def take(self, body: bytes) -> Sampled | None:
        """The request, when it is sampled and its record could be written: one choice, no echoed prompt."""
        if len(body) > MAX_RECORD_BYTES or self.draw() >= self.config.sample_rate:
            return None
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None  # the checks passed it, so this does not happen; and if it did, the request goes on
        if not isinstance(request, dict) or request.get("n", 1) != 1 or request.get("echo") is True:
            return None
        return Sampled(request)

    def write(self, sampled: Sampled, *, request_id: str, route: str, stream: bool, status: int, answer: str | None,
              finish_reason: str | None, prompt_tokens: int, output_tokens: int) -> None:
        """The record of a request that completed (status 200) with one answer; nothing for any other."""
        if status != 200 or answer is None or finish_reason is None:
            return
        try:
            line = format_record(config=self.config, request_id=request_id, route=route, stream=stream,
                                 request=sampled.request, answer=answer, finish_reason=finish_reason,
                                 prompt_tokens=prompt_tokens, output_tokens=output_tokens, bundle=self.bundle)
            if line is not None:
                self.emit(line)
        except Exception as exc:  # noqa: BLE001 - a capture fault must never reach the client
            self.failures += 1
            print(f"peagle-serve: capture: a record was not written ({type(exc).__name__}); "
                  f"{self.failures} so far", file=sys.stderr, flush=True)
