"""SageMaker properties in a template, checked against the SageMaker service model that ships in botocore.

The judge is AWS's own API description (the shapes boto3 validates requests with): enums, numeric
ranges, string lengths and patterns, list lengths and required members. CloudFormation passes a
resource's properties to the API under the same names, so each resource is read as its Create request
(the Endpoint and the InferenceComponent also as their Update request: DeploymentConfig, and the
endpoint's RetainAllVariantProperties, live there).
Values CloudFormation resolves at deploy time (Ref, Fn::*) are skipped; everything literal is checked.
"""

from __future__ import annotations

import regex  # the API's patterns are Java regular expressions (with \p{...} classes), which re cannot read
from functools import lru_cache
from typing import Any

REQUESTS = {
    "AWS::SageMaker::Model": ("CreateModelInput",),
    "AWS::SageMaker::EndpointConfig": ("CreateEndpointConfigInput",),
    "AWS::SageMaker::Endpoint": ("CreateEndpointInput", "UpdateEndpointInput"),
    "AWS::SageMaker::InferenceComponent": ("CreateInferenceComponentInput", "UpdateInferenceComponentInput"),
}
# CloudFormation-only properties with no API member of that name.
CFN_ONLY = {"AWS::SageMaker::Endpoint": {"ExcludeRetainedVariantProperties"}}


@lru_cache(maxsize=1)
def service_model():
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def _intrinsic(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)).startswith(("Ref", "Fn::"))


def check_value(value: Any, shape, path: str) -> list[str]:
    if _intrinsic(value):
        return []
    problems: list[str] = []
    kind = shape.type_name
    meta = shape.metadata
    if kind == "structure":
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({shape.name}), got {value!r}"]
        for name in shape.required_members:
            if name not in value:
                problems.append(f"{path}.{name}: required by {shape.name}")
        for name, inner in value.items():
            member = shape.members.get(name)
            if member is None:
                problems.append(f"{path}.{name}: not a member of {shape.name} ({sorted(shape.members)})")
            else:
                problems += check_value(inner, member, f"{path}.{name}")
    elif kind == "list":
        if not isinstance(value, list):
            return [f"{path}: expected a list ({shape.name}), got {value!r}"]
        if "min" in meta and len(value) < meta["min"] or "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} items; allowed {meta.get('min', 0)}..{meta.get('max', '')}")
        for i, item in enumerate(value):
            problems += check_value(item, shape.member, f"{path}[{i}]")
    elif kind == "map":
        if not isinstance(value, dict):
            return [f"{path}: expected a map ({shape.name}), got {value!r}"]
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} entries; allowed at most {meta['max']}")
        for key, inner in value.items():
            problems += check_value(key, shape.key, f"{path}<key {key!r}>")
            problems += check_value(inner, shape.value, f"{path}[{key!r}]")
    elif kind == "string":
        if not isinstance(value, str):
            return [f"{path}: expected a string ({shape.name}), got {value!r}"]
        if shape.enum and value not in shape.enum:
            problems.append(f"{path}: {value!r} is not in {shape.name} (the API's enum)")
        if "min" in meta and len(value) < meta["min"] or "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} characters; allowed {meta.get('min', 0)}..{meta.get('max', '')}")
        if "pattern" in meta and not regex.fullmatch(meta["pattern"], value, regex.S):
            problems.append(f"{path}: {value[:80]!r} does not match {shape.name}'s pattern {meta['pattern']!r}")
    elif kind in ("integer", "long", "float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [f"{path}: expected a number ({shape.name}), got {value!r}"]
        if "min" in meta and value < meta["min"] or "max" in meta and value > meta["max"]:
            problems.append(f"{path}: {value} is outside {meta.get('min', '')}..{meta.get('max', '')} ({shape.name})")
    elif kind == "boolean":
        if not isinstance(value, bool):
            problems.append(f"{path}: expected a boolean ({shape.name}), got {value!r}")
    return problems


def check_template(template: dict) -> list[str]:
    """Every problem with the template's SageMaker resources, against the API; empty when all is valid."""
    model = service_model()
    problems: list[str] = []
    for logical_id, resource in template.get("Resources", {}).items():
        requests = REQUESTS.get(resource["Type"])
        if not requests:
            continue
        shapes = [model.shape_for(name) for name in requests]
        members = {name: shape.members[name] for shape in shapes for name in shape.members}
        for name, value in (resource.get("Properties") or {}).items():
            if name in CFN_ONLY.get(resource["Type"], ()):
                continue
            if name not in members:
                problems.append(f"{logical_id}.{name}: no {'/'.join(requests)} member of that name")
                continue
            problems += check_value(value, members[name], f"{logical_id}.{name}")
    return problems
