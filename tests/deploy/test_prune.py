"""`make prune` (ops/prune.py) on the embedded AWS: what a rolled-back update leaves behind, listed and removed,
and never what an endpoint still runs on.

moto cannot update a stack, so the account is built with boto3 as CloudFormation leaves it: the stage's models
and endpoint configs tagged with its stack's name (CloudFormation's own tag), one pair from before an update.
"""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from ops import prune

STACK = "Prod-PEagle"
IMAGE = "111111111111.dkr.ecr.us-east-1.amazonaws.com/peagle:1"


def _pair(sm, name: str, stack: str = STACK) -> None:  # noqa: ANN001
    tags = [{"Key": prune.STACK_TAG, "Value": stack}]
    sm.create_model(ModelName=f"{name}-model", ExecutionRoleArn="arn:aws:iam::123456789012:role/peagle/prod/x",
                    PrimaryContainer={"Image": IMAGE}, Tags=tags)
    sm.create_endpoint_config(EndpointConfigName=f"{name}-config", Tags=tags, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": f"{name}-model", "InstanceType": "ml.g6e.2xlarge",
        "InitialInstanceCount": 1}])


@pytest.fixture
def sm(moto_region):  # noqa: ANN001
    with mock_aws():
        client = boto3.client("sagemaker", region_name=moto_region)
        _pair(client, "before")  # what the endpoint ran before the last update
        _pair(client, "after")   # what the last update deployed
        _pair(client, "elsewhere", stack="Other-Stack")  # another stack's: never this stage's to touch
        client.create_endpoint(EndpointName="peagle-prod", EndpointConfigName="after-config")
        yield client


def test_after_a_good_update_the_previous_pair_is_listed_and_deleted_on_request(sm):
    found = prune.plan(sm, STACK)
    assert (found.kept_configs, found.kept_models) == (["after-config"], ["after-model"])
    assert (found.unused_configs, found.unused_models) == (["before-config"], ["before-model"])
    assert "before-config" in found.render()
    assert prune.delete(sm, found, log=lambda line: None) == 2
    names = {m["ModelName"] for m in sm.list_models()["Models"]}
    assert names == {"after-model", "elsewhere-model"}  # the current pair and another stack's stay


def test_after_a_rolled_back_update_the_pair_the_endpoint_runs_on_is_kept(sm):
    """SageMaker rolled the endpoint back onto the previous config: CloudFormation's "current" pair is the unused
    one, and the previous pair - the one a new instance would load - must stay."""
    # moto has no UpdateEndpoint: the endpoint is made again as the rollback leaves it, on the previous config.
    sm.delete_endpoint(EndpointName="peagle-prod")
    sm.create_endpoint(EndpointName="peagle-prod", EndpointConfigName="before-config")
    found = prune.plan(sm, STACK)
    assert found.kept_configs == ["before-config"] and found.kept_models == ["before-model"]
    assert found.unused_configs == ["after-config"]
    prune.delete(sm, found, log=lambda line: None)
    sm.describe_model(ModelName="before-model")  # still there
    with pytest.raises(sm.exceptions.ClientError):
        sm.describe_model(ModelName="after-model")


def test_nothing_is_deleted_while_an_endpoint_is_mid_update(sm, monkeypatch):
    real = sm.describe_endpoint

    def updating(**kwargs):  # noqa: ANN003, ANN202
        return {**real(**kwargs), "EndpointStatus": "Updating"}

    monkeypatch.setattr(sm, "describe_endpoint", updating)
    found = prune.plan(sm, STACK)
    assert found.busy == ["peagle-prod (Updating)"]
    with pytest.raises(prune.PruneError, match="mid-update"):
        prune.delete(sm, found)
    assert len(sm.list_models()["Models"]) == 3
