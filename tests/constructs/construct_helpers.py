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


# The alarms every endpoint (and component) gets: those a deployment rolls back on, those that only notify.
ROLLBACK = {"TimeToFirstTokenP90", "TimePerOutputTokenP90", "Invocation5XXErrorRate", "InvocationModelErrorRate",
            "AcceptanceRate"}
NOTIFY_ONLY = {"ModelLatencyP99", "VllmTimeToFirstTokenP90", "VllmInterTokenLatencyP90", "VllmAcceptanceRate"}
