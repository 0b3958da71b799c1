"""Grammar and schema inputs: bounded before anything compiles them, and asked of the engine's own compiler.

A request may carry a grammar three ways: ``structured_outputs`` (JSON schema, regex, choice, EBNF/Lark grammar,
structural tag), ``response_format`` (a JSON schema or structural tag) and the JSON schemas of ``tools``. vLLM
compiles them in the engine process, where a failure is not the client's: a schema that refers to itself
(``{"$ref": "#"}``) compiles to a grammar that admits no token, the engine ends the request with an error and the
client gets a 500 - which the error-rate alarm counts against the deploy. So:

- each input is bounded in size (:data:`GRAMMAR_MAX_CHARS`) and nesting (:data:`GRAMMAR_MAX_DEPTH`), refused by
  field name past either, before any compiler sees it;
- :class:`GrammarProbe` (in the check workers, :mod:`peagle_runtime.check_worker`) compiles the request's
  grammar with xgrammar and the model's tokenizer exactly where the engine would (vLLM's default backend picks
  xgrammar whenever vLLM's own xgrammar validation passes) and refuses one whose first step admits no token.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Mapping

from peagle_contract.serving import ENV_PREFIX

from peagle_runtime.refusals import Rejection

GRAMMAR_MAX_CHARS = 32 * 1024  # each grammar input, serialized: far above a real schema, far below a costly one
GRAMMAR_MAX_DEPTH = 32  # arrays and objects inside one input (vLLM allows 64 for a schema)
_CACHED = 64  # compiled grammars kept per worker, as the engine keeps its own


def grammar_inputs(parsed: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(field, value) of every grammar or schema the request carries."""
    found = [(name, parsed[name]) for name in ("structured_outputs", "response_format") if parsed.get(name) is not None]
    tools = parsed.get("tools")
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and function.get("parameters") is not None:
                found.append((f"tools.{index}.function.parameters", function["parameters"]))
    return found


def check_grammar_inputs(parsed: Mapping[str, Any]) -> Rejection | None:
    for field, value in grammar_inputs(parsed):
        size = len(value) if isinstance(value, str) else len(json.dumps(value, separators=(",", ":")))
        if size > GRAMMAR_MAX_CHARS:
            return Rejection(400, f"{field}: {size} characters; allowed: at most {GRAMMAR_MAX_CHARS} (grammars "
                                  "compile in the engine)", field)
        depth = _depth(value)
        if depth > GRAMMAR_MAX_DEPTH:
            return Rejection(400, f"{field}: nests {depth}+ deep; allowed: at most {GRAMMAR_MAX_DEPTH}", field)
    return None


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > GRAMMAR_MAX_DEPTH:
                break
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


class GrammarProbe:
    """The engine's grammar, compiled ahead of it: xgrammar with the served model's tokenizer (loaded on the
    first grammar request). Off (:meth:`from_environment` returns None) when the operator chose another
    structured-outputs backend, whose failures this cannot predict."""

    def __init__(self, tokenizer_dir: str) -> None:
        self.tokenizer_dir = tokenizer_dir
        self._compiler: Any = None
        self._vocab = 0
        self._broken: str | None = None
        self._verdicts: OrderedDict[tuple[str, str], str | None] = OrderedDict()

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> "GrammarProbe | None":
        backend = env.get(ENV_PREFIX + "STRUCTURED_OUTPUTS_CONFIG", "")
        if backend and "xgrammar" not in backend and '"auto"' not in backend:
            return None
        tokenizer = env.get(ENV_PREFIX + "TOKENIZER") or env.get(ENV_PREFIX + "MODEL")
        return cls(tokenizer) if tokenizer else None

    def check(self, request: Any) -> Rejection | None:
        """``request`` is vLLM's validated request model. A refusal when its grammar admits no first token."""
        from vllm.entrypoints.generate.base.protocol import structured_outputs_from_response_format
        from vllm.sampling_params import SamplingParams
        from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar
        from vllm.v1.structured_output.request import get_structured_output_key

        response_format = getattr(request, "response_format", None)
        params = structured_outputs_from_response_format(request.structured_outputs, response_format)
        if params is None:
            return None
        field = "response_format" if response_format is not None and response_format.type != "text" \
            else "structured_outputs"
        sampling = SamplingParams(structured_outputs=replace(params))
        try:
            validate_xgrammar_grammar(sampling)  # vLLM's own test of whether xgrammar takes it (else: guidance)
            kind, spec = get_structured_output_key(sampling.structured_outputs)
        except Exception:  # noqa: BLE001 - vLLM refuses it (400) or hands it to another backend: its call
            return None
        key = (str(kind), spec)
        if key not in self._verdicts:
            self._verdicts[key] = self._first_step(kind, spec)
            while len(self._verdicts) > _CACHED:
                self._verdicts.popitem(last=False)
        problem = self._verdicts[key]
        return None if problem is None else Rejection(400, f"{field}: {problem}", field)

    def _first_step(self, kind: Any, spec: str) -> str | None:
        compiler = self._load()
        if compiler is None:
            return None
        import xgrammar as xgr
        from vllm.v1.structured_output.request import StructuredOutputOptions as Kind

        try:
            if kind == Kind.JSON:
                compiled = compiler.compile_json_schema(spec, any_whitespace=True)
            elif kind == Kind.REGEX:
                compiled = compiler.compile_regex(spec)
            elif kind == Kind.GRAMMAR:
                from vllm.v1.structured_output.utils import grammar_is_likely_lark

                compiled = compiler.compile_lark(spec) if grammar_is_likely_lark(spec) else compiler.compile_grammar(spec)
            else:
                return None  # JSON objects always admit "{"; structural tags vLLM checks before the engine
        except Exception:  # noqa: BLE001 - what xgrammar cannot compile, vLLM's own validation refuses first
            return None
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, self._vocab)
        matcher.fill_next_token_bitmask(mask)
        if bool(mask.any()):
            return None
        return ("admits no output: its first step allows no token (a schema or rule that only refers to itself, "
                "such as {\"$ref\": \"#\"}, is one way); allowed: a grammar some text satisfies")

    def _load(self) -> Any:
        if self._compiler is None and self._broken is None:
            try:
                import xgrammar as xgr
                from transformers import AutoConfig, AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
                try:
                    vocab = int(AutoConfig.from_pretrained(self.tokenizer_dir).get_text_config().vocab_size)
                except Exception:  # noqa: BLE001 - a tokenizer folder without a model config
                    vocab = len(tokenizer)
                self._vocab = max(vocab, len(tokenizer))
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self._vocab)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            except Exception as exc:  # noqa: BLE001 - without it, the engine is the only judge (as before)
                self._broken = f"{type(exc).__name__}: {exc}"[:200]
                print(f"peagle-checks: grammar probe off, the tokenizer at {self.tokenizer_dir} did not load "
                      f"({self._broken})", file=sys.stderr, flush=True)
        return self._compiler

