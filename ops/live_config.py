"""Does the endpoint serve what the stack just deployed? The live configuration against the stack's own.

When an endpoint update fails, SageMaker rolls it back and the endpoint is InService again, on its old
configuration: a check that reads the status alone reports success. So after a deploy (`make deploy`, each
promotion stage) and in `make smoke TARGET=aws`, each endpoint's live ``EndpointConfigName`` is compared with
the endpoint config the stack holds now, and each inference component's live specification (its model, its
reservation, its startup parameters) with the component's in the stack. Both sides come from the account:
the template and physical ids from CloudFormation, the live values from SageMaker's Describe calls.

Then the container itself: what it says it runs on an answer (K, drafter, method, vLLM release; the header
of :mod:`peagle_contract.served_config`) against the environment of the model the endpoint (or component)
serves, as SageMaker describes it (:func:`container_mismatches`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from peagle_contract.served_config import ServedConfig, ServedConfigError, differences, expected_from_environment, parse
from peagle_contract.serving import ServingConfigError

ENDPOINT = "AWS::SageMaker::Endpoint"
COMPONENT = "AWS::SageMaker::InferenceComponent"
# The parts of a component's specification compared, as CloudFormation and DescribeInferenceComponent spell them.
COMPONENT_PARTS = ("ComputeResourceRequirements", "StartupParameters")


def _name(physical_id: str) -> str:
    return physical_id.rsplit("/", 1)[-1]


def _referenced(value: Any) -> str | None:
    """The logical id a property refers to (``Fn::GetAtt`` or ``Ref``), if it is a reference."""
    if isinstance(value, dict):
        if "Fn::GetAtt" in value:
            return value["Fn::GetAtt"][0]
        if "Ref" in value:
            return value["Ref"]
    return None


def _template(cfn: Any, stack_name: str) -> dict:
    body = cfn.get_template(StackName=stack_name)["TemplateBody"]
    return json.loads(body) if isinstance(body, str) else body


def mismatches(session: Any, stack_name: str) -> list[str]:
    """One line per endpoint or component that does not serve what the stack deployed, naming both."""
    cfn, sm = session.client("cloudformation"), session.client("sagemaker")
    # moto's server lists some resources of the extension's types without a logical id: those are not ours.
    physical = {r["LogicalResourceId"]: r.get("PhysicalResourceId") or ""
                for r in cfn.describe_stack_resources(StackName=stack_name)["StackResources"]
                if r.get("LogicalResourceId")}
    problems: list[str] = []
    for logical_id, body in (_template(cfn, stack_name).get("Resources") or {}).items():
        props = body.get("Properties") or {}
        if body.get("Type") == ENDPOINT:
            problems += _endpoint(sm, _name(physical[logical_id]), physical.get(_referenced(props.get("EndpointConfigName"))))
        elif body.get("Type") == COMPONENT:
            problems += _component(sm, _name(physical[logical_id]), props.get("Specification") or {}, physical)
    return problems


def _endpoint(sm: Any, name: str, deployed_config: str | None) -> list[str]:
    live = sm.describe_endpoint(EndpointName=name)
    expected = _name(deployed_config or "")
    # ARNs hold names lower-cased; the live name keeps its case.
    if live["EndpointConfigName"].lower() != expected.lower():
        return [f"endpoint {name} ({live['EndpointStatus']}) serves endpoint config {live['EndpointConfigName']!r}, "
                f"but the stack deployed {expected!r}: the update did not take (SageMaker rolled it back, or it "
                "is still in progress); the endpoint runs its previous configuration"]
    return []


def _component(sm: Any, name: str, specification: dict, physical: dict[str, str]) -> list[str]:
    live = sm.describe_inference_component(InferenceComponentName=name)
    spec = live.get("Specification") or {}
    problems = []
    model_id = _referenced(specification.get("ModelName"))
    expected_model = _name(physical.get(model_id, "")) if model_id else specification.get("ModelName")
    live_model = spec.get("ModelName")
    if str(live_model).lower() != str(expected_model).lower():
        problems.append(f"inference component {name} ({live.get('InferenceComponentStatus')}) serves model "
                        f"{live_model!r}, but the stack deployed {expected_model!r}: its rollout did not take")
    for part in COMPONENT_PARTS:
        wanted = {k: v for k, v in (specification.get(part) or {}).items() if not isinstance(v, dict)}
        got = {k: (spec.get(part) or {}).get(k) for k in wanted}
        if any(not _same(got[k], wanted[k]) for k in wanted):
            problems.append(f"inference component {name} has {part} {got}, but the stack deployed {wanted}")
    return problems


def _same(a: Any, b: Any) -> bool:
    """Equal, numbers by value (a template says 3, a Describe call 3.0)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def deployed_environment(sm: Any, endpoint: str, component: str | None = None) -> dict[str, str]:
    """The container environment of the model the endpoint's traffic reaches (its first variant's, or the
    component's), as SageMaker holds it."""
    if component:
        model = sm.describe_inference_component(InferenceComponentName=component)["Specification"]["ModelName"]
    else:
        config = sm.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"]
        model = sm.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"][0]["ModelName"]
    described = sm.describe_model(ModelName=model)
    container = described.get("PrimaryContainer") or (described.get("Containers") or [{}])[0]
    return dict(container.get("Environment") or {})


def served_mismatches(custom_attributes: str | None, environment: Mapping[str, str]) -> tuple[ServedConfig | None, list[str]]:
    """(what the container said, one line per difference from what ``environment`` asks); a missing or
    malformed statement, or an environment that is not P-EAGLE's, is one line too."""
    try:
        expected = expected_from_environment(environment)
    except ServingConfigError as exc:
        return None, [f"the deployed model's environment: {exc}"]
    try:
        served = parse(custom_attributes)
    except ServedConfigError as exc:
        return None, [str(exc)]
    return served, differences(expected=expected, served=served)


def container_mismatches(session: Any, runtime_client: Any, endpoint: str, component: str | None = None
                         ) -> tuple[ServedConfig | None, list[str]]:
    """One short request to the endpoint; what its container says it runs against the deployed model's
    environment. A request that fails is one line."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ops.sagemaker_client import invoke

    environment = deployed_environment(session.client("sagemaker"), endpoint, component)
    try:
        answer = invoke(runtime_client, endpoint, PROBE, component=component)
    except (BotoCoreError, ClientError) as exc:
        return None, [f"endpoint {endpoint} did not answer, so its container's serving config is unknown: {exc}"]
    return served_mismatches(answer.custom_attributes, environment)


# The smallest answer that reaches the engine: one generated token.
PROBE = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "temperature": 0}
