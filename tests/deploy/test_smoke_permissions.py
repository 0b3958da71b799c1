"""The promotion's smoke test runs as the stage's GitHub role (stacks/ci_roles.py), and moto allows everything:
so every AWS call `make smoke TARGET=aws` makes is recorded here, on the embedded AWS, and judged against that
role's policy (tests/policy_judge.py), with the resource each call names. An unknown call fails the test."""

from __future__ import annotations

import boto3
import botocore.client
import pytest
from aws_cdk import App
from aws_cdk.assertions import Template
from moto import mock_aws

from ops import smoke
from policy_judge import Place, Request, allowed
from stacks.ci_roles import CiRolesStack
from stacks.environments import ENVIRONMENTS
from stacks.serving_stack import stage_stack_name
from test_live_config import _deploy

pytestmark = [pytest.mark.usefixtures("moto_region"), pytest.mark.filterwarnings("ignore:Tried to parse AWS.CDK.Metadata")]
ACCOUNT, REGION = "123456789012", "us-east-1"
# IAM's action prefix where it is not the service's signing name.
IAM_PREFIX = {"monitoring": "cloudwatch"}


def _resource(service: str, operation: str, params: dict) -> str:
    """The ARN a call acts on, as the service's authorization reference names it."""
    arn = f"arn:aws:{service}:{REGION}:{ACCOUNT}:"
    by_operation = {
        "DescribeStackResources": lambda: f"{arn}stack/{params['StackName']}/id",
        "GetTemplate": lambda: f"{arn}stack/{params['StackName']}/id",
        "DescribeEndpoint": lambda: f"{arn}endpoint/{params['EndpointName'].lower()}",
        "DescribeEndpointConfig": lambda: f"{arn}endpoint-config/{params['EndpointConfigName'].lower()}",
        "DescribeModel": lambda: f"{arn}model/{params['ModelName'].lower()}",
        "DescribeInferenceComponent": lambda: f"{arn}inference-component/{params['InferenceComponentName'].lower()}",
        "FilterLogEvents": lambda: f"{arn}log-group:{params['logGroupName']}:log-stream:",
        "DescribeAlarms": lambda: f"{arn}alarm:{params['AlarmNamePrefix']}",
    }
    if operation not in by_operation:
        raise AssertionError(f"the smoke test calls {service}:{operation}; this test does not know its resource")
    return by_operation[operation]()


@pytest.mark.parametrize("config", ENVIRONMENTS, ids=lambda c: c.name)
def test_every_call_of_the_smoke_test_is_allowed_to_the_stages_role(stage_stacks, moto_region, monkeypatch, config):
    (stack,) = stage_stacks[config.name]
    calls: list[tuple[str, str, dict]] = []
    original = botocore.client.BaseClient._make_api_call

    def recording(client, operation, params):  # noqa: ANN001, ANN202
        signing = client.meta.service_model.signing_name
        calls.append((IAM_PREFIX.get(signing, signing), operation, params))
        return original(client, operation, params)

    # The requests themselves are judged by the engine tests; here only what they need from IAM counts.
    monkeypatch.setattr(smoke, "endpoint_checks", lambda *args, **kwargs: None)
    monkeypatch.setattr(smoke.time, "sleep", lambda seconds: None)
    with mock_aws():
        _deploy(boto3.Session(region_name=moto_region), stack)
        monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
        smoke.smoke_aws(config.endpoint_name, component=config.component_name, region=moto_region,
                        log_wait_s=0.05, stack_name=stage_stack_name(config.name))
    role = CiRolesStack(App(), "CiRoles", repository="acme/peagle", environments=[config],
                        env={"account": ACCOUNT, "region": REGION})
    (identity,) = [r["Properties"]["PolicyDocument"] for r in Template.from_stack(role).to_json()["Resources"].values()
                   if r["Type"] == "AWS::IAM::Policy" and config.name in r["Properties"]["PolicyName"]]
    place = Place(account=ACCOUNT, region=REGION)
    made = {(service, operation) for service, operation, _ in calls}
    assert {("cloudformation", "GetTemplate"), ("sagemaker", "DescribeModel"), ("logs", "FilterLogEvents")} <= made
    denied = [f"{service}:{operation} on {_resource(service, operation, params)}" for service, operation, params in calls
              if not allowed(identity, Request(service="", action=f"{service}:{operation}",
                                               resource=_resource(service, operation, params)), place, identity=True)]
    assert denied == []
    # Negative control: another stage's endpoint is not this role's to describe.
    other = next(c for c in ENVIRONMENTS if c.name != config.name)
    assert not allowed(identity, Request(service="", action="sagemaker:DescribeEndpoint",
                                         resource=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{other.endpoint_name}"),
                       place, identity=True)
