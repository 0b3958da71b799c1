"""One vLLM engine (offline LLM class) on the random pair: greedy generation, printed as JSON after "E2E_RESULT ".

    python fused_e2e_worker.py spec|nospec TARGET DRAFTER K
Started by test_fused_e2e.py, which sets the environment (PEAGLE_FUSED_DRAFT, TRITON_INTERPRET,
PEAGLE_FUSED_DRAFT_STATS for the spec run). Prompts cover short, long and repeated text.
"""

from __future__ import annotations

import json
import sys

PROMPTS = (
    "The quick brown fox",
    "Speculative decoding drafts several tokens and",
    "def add(a, b):",
    "Paris is the capital of France. Berlin is the capital of",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 and then some more numbers follow",
    "Once upon a time",
)
MAX_TOKENS = 24
MAX_MODEL_LEN = 128
# One more request starts this close to max_model_len, so its last drafting steps place draft rows at and past
# the limit (their KV slots must be the padding slot); vLLM stops it at max_model_len.
NEAR_LIMIT_PROMPT_TOKENS = MAX_MODEL_LEN - 6


def main() -> int:
    mode, target, drafter, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    from models import spec_metrics
    from peagle_contract.serving import speculative_config
    from vllm import LLM, SamplingParams

    kwargs = dict(model=target, dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN, seed=0,
                  max_num_seqs=8, enable_prefix_caching=False, disable_log_stats=False)
    if mode == "spec":
        kwargs["speculative_config"] = speculative_config(drafter, num_speculative_tokens=k)
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    ids = llm.get_tokenizer().encode(" ".join(PROMPTS) * 8, add_special_tokens=False)[:NEAR_LIMIT_PROMPT_TOKENS]
    assert len(ids) == NEAR_LIMIT_PROMPT_TOKENS
    outputs = llm.generate([*PROMPTS, {"prompt_token_ids": ids}], params)
    counters = spec_metrics.from_engine(llm.get_metrics())
    metrics = {"drafts": counters.drafts, "draft_tokens": counters.draft_tokens, "accepted": counters.accepted}
    print("E2E_RESULT " + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs], "metrics": metrics}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
