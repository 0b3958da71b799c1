"""Readers for templates of the construct tests."""

from __future__ import annotations

import json


def resources(template, type_name: str) -> dict[str, dict]:  # noqa: ANN001 - aws_cdk.assertions.Template
    return template.find_resources(type_name)


def one(template, type_name: str) -> tuple[str, dict]:  # noqa: ANN001
    found = resources(template, type_name)
    assert len(found) == 1, f"expected one {type_name}, found {sorted(found)}"
    return next(iter(found.items()))


def statements(policy: dict) -> list[dict]:
    return policy["Properties"]["PolicyDocument"]["Statement"]


def as_text(value: object) -> str:
    return json.dumps(value, sort_keys=True)


# The alarms every endpoint (and component) gets: those a deployment rolls back on (signals no client can move
# at will), those that only notify (client-movable ones among them).
ROLLBACK = {"TimePerOutputTokenP90", "Invocation5XXErrorRate"}
NOTIFY_ONLY = {"TimeToFirstTokenP90", "InvocationModelErrorRate", "AcceptanceRate", "ModelLatencyP99",
               "VllmTimeToFirstTokenP90", "VllmInterTokenLatencyP90", "VllmAcceptanceRate"}
