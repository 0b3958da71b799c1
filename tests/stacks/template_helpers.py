"""Small readers for synthesized CloudFormation templates."""

from __future__ import annotations

from stacks.environments import ENVIRONMENTS

STAGES = tuple(env.name for env in ENVIRONMENTS)


def resources_of(template: dict, type_name: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def only(template: dict, type_name: str) -> tuple[str, dict]:
    found = resources_of(template, type_name)
    assert len(found) == 1, f"expected one {type_name}, found {sorted(found)}"
    return next(iter(found.items()))
