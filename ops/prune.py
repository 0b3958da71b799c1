"""The models and endpoint configs of a stage that no endpoint uses any more: list them, and delete them when asked.

    make prune ENV=prod TARGET=aws            # list (nothing is deleted)
    make prune ENV=prod TARGET=aws DELETE=1   # delete what the list shows

CloudFormation keeps a Model or EndpointConfig that an update replaced (peagle_constructs.deployment
``retain_when_replaced``): after a rollout that SageMaker rolled back, the endpoint runs on the previous ones, and
deleting them would leave the next instance SageMaker starts nothing to load. Once no endpoint uses them they are
only clutter; this command finds them. A resource is a candidate when CloudFormation tagged it as the stage's
stack's (``aws:cloudformation:stack-name``) and nothing names it: no endpoint's current or pending endpoint config,
no config of those (a variant's model, a capacity pool's model override), no inference component. While any
endpoint of the account is being updated or rolled back nothing is deleted (its next config is not known yet).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable

STACK_TAG = "aws:cloudformation:stack-name"
BUSY = {"Creating", "Updating", "SystemUpdating", "RollingBack", "UpdateRollbackFailed"}


class PruneError(RuntimeError):
    pass


@dataclass
class Plan:
    stack: str
    unused_models: list[str] = field(default_factory=list)
    unused_configs: list[str] = field(default_factory=list)
    kept_models: list[str] = field(default_factory=list)
    kept_configs: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)  # endpoints mid-update: nothing may be deleted now

    def render(self) -> str:
        lines = [f"stage stack {self.stack}:"]
        for label, names in (("endpoint config in use", self.kept_configs), ("model in use", self.kept_models),
                             ("endpoint config unused", self.unused_configs), ("model unused", self.unused_models)):
            lines += [f"  {label:<24} {name}" for name in names]
        if self.busy:
            lines.append(f"  endpoints mid-update (nothing is deleted until they settle): {', '.join(self.busy)}")
        if not (self.unused_configs or self.unused_models):
            lines.append("  nothing unused")
        return "\n".join(lines)


def _pages(client, operation: str, key: str, **kwargs) -> Iterable[dict]:  # noqa: ANN001
    for page in client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(key, [])


def _in_use(sm) -> tuple[set[str], set[str], list[str]]:  # noqa: ANN001
    """(endpoint configs, models) some endpoint or component names, and the endpoints mid-update."""
    configs, models, busy = set(), set(), []
    for summary in _pages(sm, "list_endpoints", "Endpoints"):
        endpoint = sm.describe_endpoint(EndpointName=summary["EndpointName"])
        if endpoint["EndpointStatus"] in BUSY:
            busy.append(f"{endpoint['EndpointName']} ({endpoint['EndpointStatus']})")
        configs.add(endpoint["EndpointConfigName"])
        pending = endpoint.get("PendingDeploymentSummary", {}).get("EndpointConfigName")
        if pending:
            configs.add(pending)
    for name in sorted(configs):
        try:
            config = sm.describe_endpoint_config(EndpointConfigName=name)
        except sm.exceptions.ClientError:
            continue  # an endpoint on a config that is gone already: nothing of it to keep
        for variant in config.get("ProductionVariants", []):
            models.update(filter(None, [variant.get("ModelName")]))
            models.update(filter(None, (pool.get("ModelNameOverride") for pool in variant.get("InstancePools", []))))
    for summary in _pages(sm, "list_inference_components", "InferenceComponents"):
        component = sm.describe_inference_component(InferenceComponentName=summary["InferenceComponentName"])
        models.update(filter(None, [component.get("Specification", {}).get("ModelName")]))
    return configs, models, busy


def _stack_of(sm, arn: str) -> str | None:  # noqa: ANN001
    tags = sm.list_tags(ResourceArn=arn).get("Tags", [])
    return next((t["Value"] for t in tags if t["Key"] == STACK_TAG), None)


def plan(sm, stack: str) -> Plan:  # noqa: ANN001
    """What is unused among the stage stack's models and endpoint configs (reads only)."""
    configs_used, models_used, busy = _in_use(sm)
    out = Plan(stack=stack, busy=busy)
    for item in _pages(sm, "list_endpoint_configs", "EndpointConfigs"):
        if _stack_of(sm, item["EndpointConfigArn"]) == stack:
            name = item["EndpointConfigName"]
            (out.kept_configs if name in configs_used else out.unused_configs).append(name)
    for item in _pages(sm, "list_models", "Models"):
        if _stack_of(sm, item["ModelArn"]) == stack:
            name = item["ModelName"]
            (out.kept_models if name in models_used else out.unused_models).append(name)
    for names in (out.kept_configs, out.unused_configs, out.kept_models, out.unused_models):
        names.sort()
    return out


def delete(sm, found: Plan, *, log: Callable[[str], None] = print) -> int:  # noqa: ANN001
    """Delete the unused configs, then the unused models; refuse while an endpoint is mid-update."""
    if found.busy:
        raise PruneError(f"endpoints mid-update: {', '.join(found.busy)}; nothing deleted (run again once they settle)")
    # Read again just before deleting: an update may have started since the plan was made.
    configs_used, models_used, busy = _in_use(sm)
    if busy:
        raise PruneError(f"endpoints mid-update: {', '.join(busy)}; nothing deleted (run again once they settle)")
    deleted = 0
    for name in found.unused_configs:
        if name not in configs_used:
            sm.delete_endpoint_config(EndpointConfigName=name)
            log(f"deleted endpoint config {name}")
            deleted += 1
    for name in found.unused_models:
        if name not in models_used:
            sm.delete_model(ModelName=name)
            log(f"deleted model {name}")
            deleted += 1
    return deleted


def main(argv: list[str] | None = None) -> int:
    from ops.deploy import TARGETS, stage_of
    from stacks.serving_stack import stage_stack_name

    parser = argparse.ArgumentParser(prog="python -m ops.prune", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="dev")
    parser.add_argument("--target", default="aws", choices=TARGETS, help="aws (your credentials) or local (the "
                                                                          "embedded AWS of `make deploy`)")
    parser.add_argument("--region", default=None)
    parser.add_argument("--delete", action="store_true", help="delete what is unused (default: list only)")
    args = parser.parse_args(argv)
    import boto3

    stack = stage_stack_name(stage_of(args.env))
    if args.target == "local":
        from harness.aws import server
        from ops.deploy import STATE_DIR

        emulator = server.running(STATE_DIR)
        if emulator is None:
            print("prune: no embedded AWS is running (make deploy first)", file=sys.stderr)
            return 2
        env = emulator.client_environment({})
        sm = boto3.client("sagemaker", endpoint_url=emulator.url, region_name=emulator.region,
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key="testing")
    else:
        sm = boto3.client("sagemaker", region_name=args.region)
    found = plan(sm, stack)
    print(found.render())
    if not args.delete:
        if found.unused_configs or found.unused_models:
            print("(listed only: add DELETE=1 to delete them)")
        return 0
    try:
        print(f"deleted {delete(sm, found)} resource(s)")
    except PruneError as exc:
        print(f"prune: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
