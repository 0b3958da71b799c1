"""What a CloudFormation template change means for a SageMaker endpoint: the findings and verdicts of a stack diff.

``classify(base_template, head_template)`` judges one stack from its two templates (None when the stack is
absent on that side); ``StackReview`` carries one stack's findings and the CLI's text, to JSON and back.

The verdict is computed here from the two templates (logical ids, types, properties), not from the
CLI's text: the CLI output is for humans and changes format between versions.
- Model and EndpointConfig replacements are expected (every serving change replaces them; the endpoint
  then moves to the new config with a blue/green update): pass.
- Replacing or removing an Endpoint or an InferenceComponent means downtime: fail. Updating a component
  in place (a new model, a new K) rolls its copies batch by batch, rolled back by its alarms: pass.
- Changing a production variant's instance type, or renaming the variant, while Application Auto
  Scaling has that variant registered makes SageMaker refuse the update: fail, with the two-step way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, INFO = "pass", "fail", "info"

ENDPOINT = "AWS::SageMaker::Endpoint"
ENDPOINT_CONFIG = "AWS::SageMaker::EndpointConfig"
MODEL = "AWS::SageMaker::Model"
INFERENCE_COMPONENT = "AWS::SageMaker::InferenceComponent"
SCALABLE_TARGET = "AWS::ApplicationAutoScaling::ScalableTarget"

# Properties whose change makes CloudFormation replace the resource ("Update requires: Replacement" in
# the resource reference). "*" = every property but Tags. Types not listed are only replaced when their
# logical id or type changes.
REPLACEMENT_PROPERTIES: dict[str, frozenset[str] | str] = {
    MODEL: "*",
    ENDPOINT_CONFIG: "*",
    ENDPOINT: frozenset({"EndpointName"}),
    # The registry schema lists none, but UpdateInferenceComponent (botocore's model) can change neither the
    # name nor where the component runs: a component renamed or moved is a new component.
    INFERENCE_COMPONENT: frozenset({"InferenceComponentName", "EndpointName", "EndpointArn", "VariantName"}),
    SCALABLE_TARGET: frozenset({"ResourceId", "ScalableDimension", "ServiceNamespace"}),
    "AWS::ApplicationAutoScaling::ScalingPolicy": frozenset(
        {"PolicyName", "ResourceId", "ScalableDimension", "ServiceNamespace", "ScalingTargetId"}),
    "AWS::CloudWatch::Alarm": frozenset({"AlarmName"}),
    "AWS::Logs::LogGroup": frozenset({"LogGroupName"}),
    "AWS::Logs::MetricFilter": frozenset({"FilterName", "LogGroupName"}),
    "AWS::IAM::Role": frozenset({"RoleName", "Path"}),
    "AWS::SNS::Topic": frozenset({"TopicName", "FifoTopic"}),
    "AWS::KMS::Key": frozenset({"KeySpec", "KeyUsage", "MultiRegion"}),
}
IGNORED_TYPES = frozenset({"AWS::CDK::Metadata"})


@dataclass(frozen=True)
class Finding:
    verdict: str  # pass | fail | info
    logical_id: str
    type: str
    change: str  # added | removed | replaced | updated | ...
    why: str
    advice: str = ""
    asset_only: bool = False  # the only difference is a content hash of an asset (an image, a file)


@dataclass
class StackReview:
    display_name: str
    stack_name: str
    findings: list[Finding] = field(default_factory=list)
    cli_diff: str = ""
    new_stack: bool = False
    removed_stack: bool = False
    security_diff: str = ""  # `cdk diff --security-only`: IAM statement and security-group changes
    template_sha256: str = ""  # of the head's template file ("" when the stack is removed)

    @property
    def verdict(self) -> str:
        return FAIL if any(f.verdict == FAIL for f in self.findings) else PASS

    def counts(self) -> dict[str, int]:
        """Resources added / updated / removed / replaced (variant findings are not resources)."""
        out = {"added": 0, "updated": 0, "removed": 0, "replaced": 0}
        for f in self.findings:
            if f.change in out and f.type != "stack":
                out[f.change] += 1
        return out

    def to_json(self) -> dict:
        from dataclasses import asdict

        return {"display_name": self.display_name, "stack_name": self.stack_name, "new_stack": self.new_stack,
                "removed_stack": self.removed_stack, "verdict": self.verdict, "counts": self.counts(),
                "findings": [asdict(f) for f in self.findings], "cli_diff": self.cli_diff,
                "security_diff": self.security_diff, "template_sha256": self.template_sha256}

    @classmethod
    def from_json(cls, data: dict) -> "StackReview":
        return cls(display_name=data["display_name"], stack_name=data["stack_name"],
                   findings=[Finding(**f) for f in data["findings"]], cli_diff=data.get("cli_diff", ""),
                   new_stack=data.get("new_stack", False), removed_stack=data.get("removed_stack", False),
                   security_diff=data.get("security_diff", ""), template_sha256=data.get("template_sha256", ""))


def _resources(template: dict) -> dict[str, dict]:
    return {k: v for k, v in (template.get("Resources") or {}).items() if v.get("Type") not in IGNORED_TYPES}


def _references(value: Any) -> set[str]:
    """Logical ids a property value depends on (Ref, Fn::GetAtt, Fn::Sub ${X} / ${X.Attr})."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner)
            elif key == "Fn::GetAtt":
                target = inner[0] if isinstance(inner, list) else str(inner).split(".")[0]
                found.add(target)
            elif key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) else inner
                found.update(m.split(".")[0] for m in re.findall(r"\$\{([^!}][^}]*)\}", str(text)))
                if isinstance(inner, list) and len(inner) > 1:
                    found.update(_references(inner[1]))
            else:
                found.update(_references(inner))
    elif isinstance(value, list):
        for inner in value:
            found.update(_references(inner))
    return found


def _render(value: Any) -> str:
    """A property value as text, with references as ${Id} / ${Id.Attr} (enough to read ids out of it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)) or value is None:
        return json.dumps(value)
    if isinstance(value, list):
        return ",".join(_render(v) for v in value)
    if isinstance(value, dict) and len(value) == 1:
        (key, inner), = value.items()
        if key == "Ref":
            return f"${{{inner}}}"
        if key == "Fn::GetAtt":
            return "${" + (".".join(inner) if isinstance(inner, list) else str(inner)) + "}"
        if key == "Fn::Join":
            sep, parts = inner
            return sep.join(_render(p) for p in parts)
        if key == "Fn::Sub":
            return inner[0] if isinstance(inner, list) else inner
    return json.dumps(value, sort_keys=True)


def _changed_properties(old: dict, new: dict) -> set[str]:
    old_p, new_p = old.get("Properties") or {}, new.get("Properties") or {}
    return {k for k in set(old_p) | set(new_p) if old_p.get(k) != new_p.get(k)}


def _replaced(base: dict[str, dict], head: dict[str, dict]) -> dict[str, str]:
    """Logical ids present in both templates that CloudFormation would replace, with the reason.

    A replacement ripples: a property that references a replaced resource gets a new value too (a
    Model's name, a role's ARN), so we iterate until nothing new is replaced.
    """
    replaced: dict[str, str] = {}
    common = [lid for lid in base if lid in head]
    for lid in common:
        if base[lid]["Type"] != head[lid]["Type"]:
            replaced[lid] = f"type changed from {base[lid]['Type']}"
    changed = True
    while changed:
        changed = False
        for lid in common:
            if lid in replaced:
                continue
            rule = REPLACEMENT_PROPERTIES.get(head[lid]["Type"])
            if rule is None:
                continue
            new_props = head[lid].get("Properties") or {}
            old_props = base[lid].get("Properties") or {}
            props = (set(new_props) | set(old_props)) - {"Tags"} if rule == "*" else set(rule)
            literal = sorted(p for p in props if old_props.get(p) != new_props.get(p))
            rippled = sorted(p for p in props if _references(new_props.get(p)) & (set(replaced) | _gone(base, head)))
            if literal or rippled:
                names = sorted(set(literal) | set(rippled))
                via = sorted(_references({p: new_props.get(p) for p in rippled}) & set(replaced))
                replaced[lid] = f"{', '.join(names)} changed" + (f" (via replaced {', '.join(via)})" if via else "")
                changed = True
    return replaced


def _gone(base: dict[str, dict], head: dict[str, dict]) -> set[str]:
    return {lid for lid in base if lid not in head}


def _endpoint_config_of(endpoint: dict) -> str | None:
    refs = _references((endpoint.get("Properties") or {}).get("EndpointConfigName"))
    return next(iter(sorted(refs)), None)


def _variants(resources: dict[str, dict], config_id: str | None) -> dict[str, dict]:
    if config_id is None or config_id not in resources:
        return {}
    variants = (resources[config_id].get("Properties") or {}).get("ProductionVariants") or []
    return {str(v.get("VariantName")): v for v in variants}


_TARGET_ID = re.compile(r"^endpoint/(?P<endpoint>[^/]+)/variant/(?P<variant>[^/]+)$")


def _scaled_variants(resources: dict[str, dict]) -> dict[tuple[str, str], str]:
    """(endpoint logical id, variant name) -> scalable target logical id, for SageMaker variant targets."""
    by_name = {
        str((r.get("Properties") or {}).get("EndpointName")): lid
        for lid, r in resources.items() if r["Type"] == ENDPOINT and isinstance((r.get("Properties") or {}).get("EndpointName"), str)
    }
    scaled: dict[tuple[str, str], str] = {}
    for lid, r in resources.items():
        if r["Type"] != SCALABLE_TARGET:
            continue
        props = r.get("Properties") or {}
        if props.get("ServiceNamespace") != "sagemaker":
            continue
        match = _TARGET_ID.match(_render(props.get("ResourceId")))
        if not match:
            continue
        name = match["endpoint"]
        ref = re.fullmatch(r"\$\{([^.}]+)(?:\.EndpointName)?\}", name)
        endpoint_id = ref.group(1) if ref else by_name.get(name)
        if endpoint_id:
            scaled[(endpoint_id, match["variant"])] = lid
    return scaled


ADVICE_ENDPOINT = (
    "Keep the endpoint's logical id stable: if the construct was renamed or moved, restore its id, or pin the "
    "old one with `endpoint.node.default_child.override_logical_id(\"{old}\")` (our L3 exposes the CfnEndpoint). "
    "If a new endpoint is really wanted, add it beside the old one under a new name in one change, move callers "
    "to it, then delete the old endpoint in a later change. Note that CloudFormation cannot replace a resource "
    "that has a fixed physical name (EndpointName) without changing the name: such an update fails after the "
    "new Model/EndpointConfig were created."
)
ADVICE_COMPONENT = (
    "Replacing an inference component drops its model copies until the new one is in service. Create the new "
    "component beside the old one (new construct id and name) on the same endpoint, check it serves, then "
    "remove the old component in a follow-up change."
)
ADVICE_INSTANCE_TYPE = (
    "SageMaker refuses UpdateEndpoint when a variant registered with Application Auto Scaling changes its "
    "instance type, so CloudFormation would fail mid-update and roll back. Roll it out in two steps:\n"
    "1. First change: remove autoscaling from variant `{variant}` (drop the ScalableTarget `{target}` and its "
    "scaling policies; Application Auto Scaling deregisters the variant) and set the variant's initial instance "
    "count to the count it runs at now, so capacity holds. Deploy.\n"
    "2. Second change: set the new instance type ({old} -> {new}); the endpoint does a blue/green update on the "
    "new fleet with the rollback alarms armed. Once it is InService, add autoscaling back (in this change or a "
    "third one) and deploy.\n"
    "Alternative without a window at a fixed size: add a second variant with the new instance type (weight 0), "
    "register autoscaling on it, shift traffic by variant weights, then remove the old variant."
)
ADVICE_VARIANT_NAME = (
    "The scalable target's id names the variant (`endpoint/<name>/variant/{old}`): renaming it while autoscaling "
    "is registered fails the endpoint update. Keep the variant name, or remove autoscaling first, rename in a "
    "second change, then register autoscaling on the new name."
)
ADVICE_BREAK_GLASS = (
    "A deploy without automatic rollback (the `peagle:break-glass` context, for a hotfix during an incident; "
    "docs/serving.md). The alarms still page, but nothing undoes a bad rollout. Merge only as the incident's "
    "fix, past a reviewer who read this, and remove the context in the next change."
)


def _rollback_dropped(old: dict | None, new: dict) -> bool:
    """A rollout (an endpoint's or a component's) that rolls back on nothing where it did before, or that is
    tagged break-glass."""
    config = (new.get("Properties") or {}).get("DeploymentConfig")
    if not isinstance(config, dict) or config.get("AutoRollbackConfiguration"):
        return False
    before = ((old or {}).get("Properties") or {}).get("DeploymentConfig")
    return bool(isinstance(before, dict) and before.get("AutoRollbackConfiguration")) \
        or _tag(new, "peagle:break-glass", "") != ""


def _tag(resource: dict, key: str, missing: str) -> str:
    tags = (resource.get("Properties") or {}).get("Tags") or []
    return next((str(t.get("Value")) for t in tags if isinstance(t, dict) and t.get("Key") == key), missing)


def classify(base_template: dict | None, head_template: dict | None) -> list[Finding]:
    """Findings for one stack, from its base and head templates (None when the stack is absent)."""
    base = _resources(base_template or {})
    head = _resources(head_template or {})
    replaced = _replaced(base, head)
    findings: list[Finding] = []

    for lid in sorted(set(base) | set(head)):
        old, new = base.get(lid), head.get(lid)
        rtype = (new or old)["Type"]
        if old is None:
            change, why = "added", "new resource"
        elif new is None:
            change, why = "removed", "deleted from the template"
        elif lid in replaced:
            change, why = "replaced", replaced[lid]
        else:
            props = sorted(_changed_properties(old, new))
            # Same template text, new value: a property naming a replaced resource (Ref / GetAtt).
            moved = set(replaced) | _gone(base, head)
            rippled = sorted(k for k, v in (new.get("Properties") or {}).items()
                             if k not in props and _references(v) & moved)
            if not props and not rippled:
                continue
            parts = [f"{', '.join(props)} changed"] if props else []
            parts += [f"{p} follows replaced {', '.join(sorted(_references(new['Properties'][p]) & moved))}"
                      for p in rippled]
            change, why = "updated", "; ".join(parts) + " (in place)"

        asset_only = change in ("replaced", "updated") and _without_hashes(old) == _without_hashes(new)
        verdict, advice = INFO, ""
        if rtype in (MODEL, ENDPOINT_CONFIG) and change in ("replaced", "added", "removed"):
            verdict = PASS
            why = (f"expected: {why}; every serving change makes a new "
                   f"{'Model' if rtype == MODEL else 'EndpointConfig'} and the endpoint moves to it by blue/green update")
        elif rtype == ENDPOINT:
            if change in ("replaced", "removed"):
                successor = _renamed_endpoint(lid, base, head) if change == "removed" else None
                verdict, advice = FAIL, ADVICE_ENDPOINT.format(old=lid)
                why = ("the endpoint would be deleted"
                       + (f" and created again as `{successor}` (logical id changed)" if successor else "")
                       + (f" and created again: {why}" if change == "replaced" else "")
                       + " - downtime")
            elif change == "added" and (predecessor := _renamed_endpoint(lid, head, base)):
                why = f"takes the place of the deleted endpoint `{predecessor}` (see above)"
            else:
                verdict = PASS
                why = (f"updated in place (blue/green, no downtime): {why.removesuffix(' (in place)')}"
                       if change == "updated" else why)
        elif rtype == INFERENCE_COMPONENT and change in ("replaced", "removed"):
            verdict, advice = FAIL, ADVICE_COMPONENT
            why = f"the inference component would be {'replaced' if change == 'replaced' else 'deleted'}: {why}"
        elif rtype == INFERENCE_COMPONENT and change == "updated":
            rolling = ((new.get("Properties") or {}).get("DeploymentConfig") or {}).get("RollingUpdatePolicy")
            if rolling:
                verdict = PASS
                why = f"updated in place, copy by copy (rolling update, no downtime): {why.removesuffix(' (in place)')}"
        findings.append(Finding(verdict, lid, rtype, change, why, advice, asset_only=asset_only))
        if rtype in (ENDPOINT, INFERENCE_COMPONENT) and new is not None and _rollback_dropped(old, new):
            findings.append(Finding(FAIL, lid, rtype, "BREAK-GLASS: automatic rollback off", (
                "🚨 BREAK-GLASS: this rollout has no AutoRollbackConfiguration; reason: "
                + _tag(new, "peagle:break-glass", "(none given)")), ADVICE_BREAK_GLASS))

    findings += _variant_findings(base, head)
    # An endpoint update that SageMaker will refuse is not a pass, whatever its properties say.
    failing = {f.logical_id for f in findings if f.verdict == FAIL}
    return [Finding(INFO, f.logical_id, f.type, f.change, f.why, f.advice, f.asset_only)
            if f.verdict == PASS and f.logical_id in failing else f for f in findings]


_CONTENT_HASH = re.compile(r"[0-9a-f]{64}")


def _without_hashes(resource: dict | None) -> str:
    """The resource with every 64-hex content hash masked: equal for a change that is only a new asset hash."""
    return _CONTENT_HASH.sub("<hash>", json.dumps(resource, sort_keys=True))


def _renamed_endpoint(lid: str, here: dict[str, dict], there: dict[str, dict]) -> str | None:
    """The endpoint in ``there`` that takes the place of ``lid`` (an endpoint only in ``here``), if any."""
    if lid in there:
        return None
    candidates = [o for o, r in there.items() if r["Type"] == ENDPOINT and o not in here]
    return candidates[0] if candidates else None


def _instance_ladder(variant: dict) -> str:
    """The variant's instance type, or its capacity fallback ladder in the order SageMaker tries it
    (``a > b > c``). A change of the ladder changes the instance types the variant runs on, so it is judged
    as an instance-type change: SageMaker does not say that a variant under autoscaling may change it."""
    pools = variant.get("InstancePools")
    if not pools:
        return str(variant.get("InstanceType"))
    return " > ".join(str(pool.get("InstanceType")) for pool in sorted(pools, key=lambda pool: pool.get("Priority", 0)))


def _variant_findings(base: dict[str, dict], head: dict[str, dict]) -> list[Finding]:
    findings = []
    scaled = _scaled_variants(base)  # what is registered now, in the deployed (base) stack
    for endpoint_id in sorted(lid for lid, r in head.items() if r["Type"] == ENDPOINT and lid in base):
        old_variants = _variants(base, _endpoint_config_of(base[endpoint_id]))
        new_variants = _variants(head, _endpoint_config_of(head[endpoint_id]))
        for name, old in old_variants.items():
            target = scaled.get((endpoint_id, name))
            new = new_variants.get(name)
            if new is None:
                if target and len(old_variants) == 1 and len(new_variants) == 1:
                    (new_name,) = new_variants
                    findings.append(Finding(
                        FAIL, endpoint_id, ENDPOINT, f"variant renamed {name} -> {new_name}",
                        f"variant `{name}` is registered with Application Auto Scaling (target {target})",
                        ADVICE_VARIANT_NAME.format(old=name)))
                continue
            old_type, new_type = _instance_ladder(old), _instance_ladder(new)
            if old_type == new_type:
                continue
            if target:
                findings.append(Finding(
                    FAIL, endpoint_id, ENDPOINT, f"instance type {old_type} -> {new_type}",
                    f"variant `{name}` changes instance type while registered with Application Auto Scaling "
                    f"(target {target})",
                    ADVICE_INSTANCE_TYPE.format(variant=name, target=target, old=old_type, new=new_type)))
            else:
                findings.append(Finding(
                    PASS, endpoint_id, ENDPOINT, f"instance type {old_type} -> {new_type}",
                    f"variant `{name}` has no autoscaling registered: a blue/green update moves it to the new fleet"))
    return findings

