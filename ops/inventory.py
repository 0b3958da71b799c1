"""What a stack's template says should exist, and what the account really holds: the deploy check.

The check asks each service's own API (SageMaker, Application Auto Scaling, CloudWatch, CloudWatch Logs, SNS,
Step Functions, SSM)
rather than trusting CloudFormation's CREATE_COMPLETE: moto reports that status for resource types it
silently skipped, and that is exactly the failure this table is meant to show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The rows of the table: label, CloudFormation type. Order is the order printed.
CHECKED_TYPES: tuple[tuple[str, str], ...] = (
    ("model", "AWS::SageMaker::Model"),
    ("endpoint config", "AWS::SageMaker::EndpointConfig"),
    ("endpoint InService", "AWS::SageMaker::Endpoint"),
    ("inference component", "AWS::SageMaker::InferenceComponent"),
    ("scalable target", "AWS::ApplicationAutoScaling::ScalableTarget"),
    ("scaling policy", "AWS::ApplicationAutoScaling::ScalingPolicy"),
    ("alarm", "AWS::CloudWatch::Alarm"),
    ("metric filter", "AWS::Logs::MetricFilter"),
    ("log group", "AWS::Logs::LogGroup"),
    ("alarm subscription", "AWS::SNS::Subscription"),
    ("training state machine", "AWS::StepFunctions::StateMachine"),
    ("candidate parameter", "AWS::SSM::Parameter"),
)
_LABEL = dict((t, label) for label, t in CHECKED_TYPES)


@dataclass(frozen=True)
class Resource:
    logical_id: str
    type: str
    physical_id: str
    retained: bool = False  # DeletionPolicy Retain: deleting the stack must leave it in place

RETAIN_POLICIES = frozenset({"Retain", "RetainExceptOnCreate"})


@dataclass(frozen=True)
class Row:
    label: str
    expected: int
    found: int

    @property
    def ok(self) -> bool:
        return self.expected == self.found


def expected_counts(template: dict) -> dict[str, int]:
    """Checked resources per type in a synthesized template (resources behind a Condition included)."""
    counts = {t: 0 for _, t in CHECKED_TYPES}
    for body in (template.get("Resources") or {}).values():
        if body.get("Type") in counts:
            counts[body["Type"]] += 1
    return counts


def stack_resources(session: Any, stack_name: str, template: dict | None = None) -> list[Resource]:
    """The checked resources CloudFormation recorded for the stack (``template`` adds DeletionPolicy)."""
    declared = (template or {}).get("Resources") or {}
    cfn = session.client("cloudformation")
    out = []
    for r in cfn.describe_stack_resources(StackName=stack_name)["StackResources"]:
        if r.get("ResourceType") in _LABEL and r.get("PhysicalResourceId"):
            retained = (declared.get(r["LogicalResourceId"]) or {}).get("DeletionPolicy") in RETAIN_POLICIES
            out.append(Resource(r["LogicalResourceId"], r["ResourceType"], r["PhysicalResourceId"], retained))
    return out


def _name_from_arn(value: str) -> str:
    return value.rsplit("/", 1)[-1]


def _missing(error: Exception) -> bool:
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
    return code in {"ValidationException", "ResourceNotFoundException", "ResourceNotFound", "NotFound",
                    "ParameterNotFound", "StateMachineDoesNotExist"}


def _exists(session: Any, resource: Resource, *, in_service: bool = True) -> bool:
    """True when the service itself holds the resource (and, with ``in_service``, an endpoint or inference
    component is InService)."""
    t, pid = resource.type, resource.physical_id
    try:
        if t == "AWS::SageMaker::Model":
            session.client("sagemaker").describe_model(ModelName=_name_from_arn(pid))
            return True
        if t == "AWS::SageMaker::EndpointConfig":
            session.client("sagemaker").describe_endpoint_config(EndpointConfigName=_name_from_arn(pid))
            return True
        if t == "AWS::SageMaker::Endpoint":
            desc = session.client("sagemaker").describe_endpoint(EndpointName=_name_from_arn(pid))
            return desc["EndpointStatus"] == "InService" or not in_service
        if t == "AWS::SageMaker::InferenceComponent":  # the physical id is the component's ARN
            desc = session.client("sagemaker").describe_inference_component(InferenceComponentName=_name_from_arn(pid))
            return desc["InferenceComponentStatus"] == "InService" or not in_service
        if t == "AWS::ApplicationAutoScaling::ScalableTarget":
            resource_id, dimension, namespace = pid.split("|")
            found = session.client("application-autoscaling").describe_scalable_targets(
                ServiceNamespace=namespace, ResourceIds=[resource_id], ScalableDimension=dimension)
            return bool(found["ScalableTargets"])
        if t == "AWS::ApplicationAutoScaling::ScalingPolicy":
            namespace = pid.split(":resource/", 1)[1].split("/", 1)[0]
            policies = session.client("application-autoscaling").describe_scaling_policies(ServiceNamespace=namespace)
            return any(p["PolicyARN"] == pid for p in policies["ScalingPolicies"])
        if t == "AWS::CloudWatch::Alarm":
            alarms = session.client("cloudwatch").describe_alarms(AlarmNames=[pid])
            return bool(alarms["MetricAlarms"] or alarms.get("CompositeAlarms"))
        if t == "AWS::Logs::MetricFilter":
            filters = session.client("logs").describe_metric_filters(filterNamePrefix=pid)["metricFilters"]
            return any(f["filterName"] == pid for f in filters)
        if t == "AWS::Logs::LogGroup":
            groups = session.client("logs").describe_log_groups(logGroupNamePrefix=pid)["logGroups"]
            return any(g["logGroupName"] == pid for g in groups)
        if t == "AWS::SNS::Subscription":
            session.client("sns").get_subscription_attributes(SubscriptionArn=pid)
            return True
        if t == "AWS::StepFunctions::StateMachine":  # the physical id is the state machine's ARN
            session.client("stepfunctions").describe_state_machine(stateMachineArn=pid)
            return True
        if t == "AWS::SSM::Parameter":
            session.client("ssm").get_parameter(Name=pid)
            return True
    except Exception as error:  # botocore ClientError, but keep this module free of a botocore import
        if _missing(error):
            return False
        raise
    raise ValueError(f"no check for resource type {t}")


def check(session: Any, template: dict, resources: list[Resource]) -> list[Row]:
    """One row per checked type: how many the template declares vs how many the services hold."""
    expected = expected_counts(template)
    found = {t: 0 for _, t in CHECKED_TYPES}
    for resource in resources:
        if _exists(session, resource):
            found[resource.type] += 1
    return [Row(label, expected[t], found[t]) for label, t in CHECKED_TYPES]


def after_delete(session: Any, resources: list[Resource]) -> list[Row]:
    """Rows for what is left of recorded resources after deletion.

    Expected: only what the template retains on purpose (DeletionPolicy Retain, e.g. Prod's log group
    and key); anything else still there was left behind.
    """
    expected = {t: 0 for _, t in CHECKED_TYPES}
    found = {t: 0 for _, t in CHECKED_TYPES}
    for resource in resources:
        expected[resource.type] += resource.retained
        if _exists(session, resource, in_service=False):
            found[resource.type] += 1
    return [Row("endpoint" if t == "AWS::SageMaker::Endpoint" else label, expected[t], found[t])
            for label, t in CHECKED_TYPES]


def left_behind(rows: list[Row]) -> int:
    return sum(max(0, r.found - r.expected) for r in rows)


def save(path: Path, resources: list[Resource]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.__dict__ for r in resources], indent=1))


def load(path: Path) -> list[Resource]:
    return [Resource(**r) for r in json.loads(path.read_text())] if path.exists() else []


def render(title_rows: list[tuple[str, list[Row]]], *, markdown: bool = False) -> str:
    """A compact table: an expected / found column per stack, one line per resource kind."""
    labels = [row.label for row in title_rows[0][1]]
    if markdown:
        lines = ["| resource | " + " | ".join(f"{t} (expected / found)" for t, _ in title_rows) + " |",
                 "|---" * (1 + len(title_rows)) + "|"]
        for i, label in enumerate(labels):
            cells = [f"{rows[i].expected} / {rows[i].found}{'' if rows[i].ok else ' ✗'}" for _, rows in title_rows]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
    width = max(len(label) for label in labels) + 2
    col = max(24, *(len(t) + 2 for t, _ in title_rows))
    lines = [f"{'':<{width}}" + "".join(f"{t:>{col}}" for t, _ in title_rows),
             f"{'':<{width}}" + "".join(f"{'expected / found':>{col}}" for _ in title_rows)]
    for i, label in enumerate(labels):
        cells = "".join(
            f"{f'{rows[i].expected:>3} / {rows[i].found:<3}' + ('  ok' if rows[i].ok else '  !!'):>{col}}"
            for _, rows in title_rows
        )
        lines.append(f"{label:<{width}}{cells}")
    return "\n".join(lines)
