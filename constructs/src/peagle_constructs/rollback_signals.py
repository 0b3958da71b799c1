"""Which alarms roll a deployment back, which only page, and why: the one list both the alarms and the docs follow.

SageMaker's guardrails take "CloudWatch alarms ... configured to monitor metrics on an endpoint" by name
(AutoRollbackConfig, at most 10); they do not say PromQL alarms qualify, so the rollback set is metric alarms
only - and only on signals that a healthy fleet never trips and that no client can move at will, since any
client could otherwise roll back any deploy (:data:`ROLLBACK_SIGNALS` says why each one qualifies,
:data:`PAGE_ONLY_SIGNALS` why the others only page):

- the 5XX error rate: no client input answers 5xx (the image refuses it with a 4xx naming the field);
- time per output token, on the engine's clock (vLLM's decode time per token, not the pace a client reads at),
  against a threshold above the step time of plain decoding at the batch limit, so a client that defeats the
  drafter (``temperature: 2``, random prompts) slows its own tokens to at most that step time and no further.

Time to first token grows with the prompt a client sends and the queue a burst of clients makes; the model
error rate counts every non-2xx, 4xx included (botocore's ModelError: "returned 4xx or 5xx error code"); the
acceptance rate falls with sampling temperature and random prompts: each pages, none rolls back. The PromQL
alarms carry the same signals from vLLM's side and notify only. A deploy without any rollback (a hotfix during
an incident) is :mod:`peagle_constructs.break_glass`: the stack diff flags it.
"""

from __future__ import annotations

# The metric alarms that roll a deployment back, and why no client can move them at will.
ROLLBACK_SIGNALS = {
    "Invocation5XXErrorRate": "no client input answers 5xx: the image refuses what it cannot serve with a 4xx "
                              "naming the field, and a drain refuses new requests only on an instance SageMaker is "
                              "already taking out of service",
    "TimePerOutputTokenP90": "the engine's own decode time per token (vLLM's per-request metrics), which a slow "
                             "reader cannot stretch; its threshold sits above plain decoding's step time at the "
                             "batch limit, so a client that defeats the drafter cannot reach it",
}
# The metric alarms that page without rolling back, and the client's lever on each.
PAGE_ONLY_SIGNALS = {
    "TimeToFirstTokenP90": "grows with the prompt a client sends (prefill) and with the queue a burst makes",
    "InvocationModelErrorRate": "counts every non-2xx answer, 4xx included: any client sending bad requests "
                                "moves it",
    "AcceptanceRate": "falls with sampling temperature and with prompts unlike the drafter's training data: a "
                      "client at temperature 2 drives it down at will",
    "ModelLatencyP99": "grows with the tokens a client asks for",
}
