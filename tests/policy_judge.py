"""Resource policies in synthesized templates, judged for what they allow, not only for what they deny.

Our own evaluator, said plainly: no AWS policy evaluator runs offline (IAM Access Analyzer and the policy
simulator are services; moto's evaluator skips service principals and knows only StringEquals). It follows
IAM's documented rules for one request: an explicit Deny wins, else an Allow, else the request is denied;
a statement applies when its principal, action, resource and every condition match. A condition operator
it does not know raises, so a policy it cannot read never passes by accident.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Request:
    service: str  # the calling service principal, e.g. cloudwatch.amazonaws.com ("" for none)
    action: str
    resource: str
    # aws:SourceArn, aws:SourceAccount, aws:SecureTransport, iam:PermissionsBoundary, a web identity's claims...
    context: Mapping[str, str] = field(default_factory=dict)
    federated: str = ""  # the identity provider of an AssumeRoleWithWebIdentity call (its ARN)


@dataclass(frozen=True)
class Place:
    """Where a template is deployed, and what its resources resolve to there."""

    account: str
    region: str
    physical: Mapping[str, str] = field(default_factory=dict)  # "LogicalId" (Ref) or "LogicalId.Attr" (GetAtt)
    partition: str = "aws"

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, inner), = value.items()
            if key == "Ref":
                pseudo = {"AWS::AccountId": self.account, "AWS::Region": self.region, "AWS::Partition": self.partition,
                          "AWS::URLSuffix": "amazonaws.com"}
                return pseudo.get(inner) or self.physical[inner]
            if key == "Fn::GetAtt":
                target = ".".join(inner) if isinstance(inner, list) else inner
                return self.physical[target]
            if key == "Fn::Join":
                separator, parts = inner
                return separator.join(str(self.resolve(p)) for p in parts)
        return {k: self.resolve(v) for k, v in value.items()}


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _principal_matches(principal: Any, request: Request) -> bool:
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        return False
    if "*" in _listed(principal.get("AWS", [])):
        return True
    if request.federated and request.federated in _listed(principal.get("Federated", [])):
        return True
    return bool(request.service) and request.service in _listed(principal.get("Service", []))


def _arn_like(pattern: str, value: str) -> bool:
    # ARN matching is per colon-separated part, each part a glob (IAM's ArnLike).
    p_parts, v_parts = pattern.split(":", 5), value.split(":", 5)
    return len(p_parts) == len(v_parts) == 6 and all(fnmatch.fnmatchcase(v, p) for p, v in zip(p_parts, v_parts))


_OPERATORS = {
    "StringEquals": lambda expected, actual: actual == expected,
    "StringEqualsIgnoreCase": lambda expected, actual: actual.lower() == str(expected).lower(),
    "StringLike": lambda expected, actual: fnmatch.fnmatchcase(actual, expected),
    "ArnEquals": lambda expected, actual: actual == expected,
    "ArnLike": _arn_like,
    "Bool": lambda expected, actual: str(actual).lower() == str(expected).lower(),
}
# The negated operators hold when the value matches none of those listed, and (IAM's rule) when the key is absent.
_NEGATED = {"ArnNotEquals": "ArnEquals", "StringNotEquals": "StringEquals", "ArnNotLike": "ArnLike",
            "StringNotLike": "StringLike"}


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], request: Request) -> bool:
    for operator, tests in conditions.items():
        base, if_exists = (operator[:-len("IfExists")], True) if operator.endswith("IfExists") else (operator, False)
        if base in _NEGATED:
            for key, expected in tests.items():
                actual = request.context.get(key)
                if actual is not None and any(_OPERATORS[_NEGATED[base]](e, actual) for e in _listed(expected)):
                    return False
            continue
        if base not in _OPERATORS:
            raise ValueError(f"the judge does not know the condition operator {operator!r}")
        for key, expected in tests.items():
            actual = request.context.get(key)
            if actual is None:
                # A key absent from the request fails the operator, except in its ...IfExists form (IAM's rule).
                if if_exists:
                    continue
                return False
            if not any(_OPERATORS[base](e, actual) for e in _listed(expected)):
                return False
    return True


def _applies(statement: Mapping[str, Any], request: Request, *, identity: bool = False) -> bool:
    # An identity policy's statements name no principal: they apply to whoever holds the policy.
    if not identity and not _principal_matches(statement.get("Principal"), request):
        return False
    if not any(fnmatch.fnmatchcase(request.action.lower(), a.lower()) for a in _listed(statement["Action"])):
        return False
    if not any(fnmatch.fnmatchcase(request.resource, r) for r in _listed(statement.get("Resource", "*"))):
        return False
    return _conditions_hold(statement.get("Condition", {}), request)


def allowed(document: Mapping[str, Any], request: Request, place: Place, *, identity: bool = False) -> bool:
    """Whether ``document`` allows ``request``: a resource or trust policy (its statements name principals), or
    with ``identity`` the policy of the caller itself (several documents: pass them joined, see :func:`joined`)."""
    statements = [place.resolve(s) for s in _listed(document["Statement"])]
    applying = [s for s in statements if _applies(s, request, identity=identity)]
    if any(s["Effect"] == "Deny" for s in applying):
        return False
    return any(s["Effect"] == "Allow" for s in applying)


def joined(*documents: Mapping[str, Any]) -> dict:
    """One document holding every statement of ``documents`` (a role's policies are judged together)."""
    return {"Statement": [s for d in documents for s in _listed(d["Statement"])]}
