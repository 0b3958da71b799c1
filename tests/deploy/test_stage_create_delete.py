"""Every stage's synthesized template, created and deleted by moto's CloudFormation with our extension.

Each service is asked what it holds (not CloudFormation's status): moto reports CREATE_COMPLETE even
for types it skips, which is what the extension exists to fix.
"""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from ops import cdk, inventory
from stacks.environments import ENVIRONMENTS
from tests.stacks.template_helpers import STAGES

# Fake credentials, the region set and the extension loaded, for every test here (conftest.py).
pytestmark = pytest.mark.usefixtures("moto_region")


def _everything(session: boto3.Session) -> dict[str, list[str]]:
    """What the services hold, account-wide: the 'nothing left behind' view."""
    sm = session.client("sagemaker")
    aas = session.client("application-autoscaling")
    return {
        "models": [m["ModelName"] for m in sm.list_models()["Models"]],
        "endpoint configs": [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]],
        "endpoints": [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]],
        "inference components": [c["InferenceComponentName"]
                                 for c in sm.list_inference_components()["InferenceComponents"]],
        "scalable targets": [t["ResourceId"] for t in aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]],
        "scaling policies": [p["PolicyName"] for p in aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]],
        "alarms": [a["AlarmName"] for a in session.client("cloudwatch").describe_alarms()["MetricAlarms"]],
        "metric filters": [f["filterName"] for f in session.client("logs").describe_metric_filters()["metricFilters"]],
        "log groups": [g["logGroupName"] for g in session.client("logs").describe_log_groups()["logGroups"]],
        "roles": [r["RoleName"] for r in session.client("iam").list_roles()["Roles"]],
        "topics": [t["TopicArn"] for t in session.client("sns").list_topics()["Topics"]],
        "subscriptions": [s["SubscriptionArn"] for s in session.client("sns").list_subscriptions()["Subscriptions"]],
    }


def _assert_components_scale_from_zero(session: boto3.Session, env) -> None:  # noqa: ANN001 - EnvironmentConfig
    """The component is in service with its copies, its scaling goes to the environment's floor, and a step
    policy wakes it, triggered by the no-capacity alarm (all as the services report them)."""
    sm, aas = session.client("sagemaker"), session.client("application-autoscaling")
    component = sm.describe_inference_component(InferenceComponentName=env.component_name)
    assert component["InferenceComponentStatus"] == "InService" and component["EndpointName"] == env.endpoint_name
    assert component["RuntimeConfig"]["DesiredCopyCount"] == env.hosting.copy_count
    config = sm.describe_endpoint_config(EndpointConfigName=sm.describe_endpoint(
        EndpointName=env.endpoint_name)["EndpointConfigName"])
    assert config["ProductionVariants"][0]["ManagedInstanceScaling"]["MinInstanceCount"] == \
        env.hosting.instance_scaling.min_instances
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker",
                                              ResourceIds=[f"inference-component/{env.component_name}"])["ScalableTargets"]
    assert target["MinCapacity"] == env.hosting.scaling.min_copies
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker",
                                             ResourceId=f"inference-component/{env.component_name}")["ScalingPolicies"]
    kinds = {p["PolicyType"]: p for p in policies}
    if env.hosting.scaling.min_copies == 0:
        step = kinds["StepScaling"]
        alarms = session.client("cloudwatch").describe_alarms(AlarmNamePrefix=env.component_name)["MetricAlarms"]
        (wake,) = [a for a in alarms if a.get("MetricName") == "NoCapacityInvocationFailures"]
        assert step["PolicyARN"] in wake["AlarmActions"]
        assert (wake["ComparisonOperator"], wake["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1.0)
    assert "TargetTrackingScaling" in kinds


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Tried to parse AWS.CDK.Metadata")
@pytest.mark.parametrize("stage", STAGES)
def test_stage_creates_every_resource_and_deletes_all(stage: str, stage_stacks, moto_region: str) -> None:
    stacks = stage_stacks[stage]
    assert [s.display_name for s in stacks] == [f"{stage}/PEagle"]
    with mock_aws():
        session = boto3.Session(region_name=moto_region)
        # The default synthesizer's templates read the bootstrap version from SSM (cdk bootstrap writes it).
        session.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String")
        before = _everything(session)
        cfn = session.client("cloudformation")
        retained: list[str] = []
        for stack in stacks:
            cfn.create_stack(StackName=stack.stack_name, TemplateBody=stack.template_path.read_text(),
                             Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"])
            status = cfn.describe_stacks(StackName=stack.stack_name)["Stacks"][0]["StackStatus"]
            assert status == "CREATE_COMPLETE", status

            template = stack.template()
            resources = inventory.stack_resources(session, stack.stack_name, template)
            rows = inventory.check(session, template, resources)
            table = inventory.render([(stack.display_name, rows)])
            assert all(row.ok for row in rows), table
            counts = {row.label: row.expected for row in rows}
            # The product's shape, per stage: one endpoint that autoscales and is watched.
            for label in ("model", "endpoint config", "endpoint InService", "scalable target", "scaling policy",
                          "metric filter", "log group"):
                assert counts[label] >= 1, f"{stage}: the template declares no {label}\n{table}"
            assert counts["alarm"] >= 2, f"{stage}: expected TTFT and error alarms at least\n{table}"
            env = next(env for env in ENVIRONMENTS if env.name == stage)
            assert counts["alarm subscription"] == sum(s.kind != "topic" for s in env.model.alarm_subscribers), table
            assert counts["inference component"] == env.hosts_components, table

            # The autoscaling target names what CloudFormation created, by its real name: the endpoint's
            # variant, or the inference component.
            held = _everything(session)
            targets = held["scalable targets"]
            scaled = held["inference components"] if env.hosts_components else held["endpoints"]
            assert targets and all(t.split("/")[1] in scaled for t in targets), (targets, scaled)
            if env.hosts_components:
                _assert_components_scale_from_zero(session, env)

            cfn.delete_stack(StackName=stack.stack_name)
            left = inventory.after_delete(session, resources)
            # Gone, except what the template retains on purpose (DeletionPolicy Retain) - and that stays.
            assert all(row.ok for row in left), inventory.render([(f"{stack.display_name} after delete", left)])
            retained += [r.physical_id for r in resources if r.retained]

        after = _everything(session)
        after["log groups"] = [g for g in after["log groups"] if g not in retained]
        assert after == before, {k: v for k, v in after.items() if v != before[k]}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Tried to parse AWS.CDK.Metadata")
def test_a_stage_that_trains_creates_its_state_machine_and_deletes_it(tmp_path, moto_region: str) -> None:
    """Dev pinned and training on a schedule (tests.training_config): moto's CloudFormation creates the state
    machine, its parameter, roles and schedule, each service holds them, and a delete leaves only what is retained
    (the capture bucket, which now also holds the candidates)."""
    from aws_cdk import App

    from stacks.application import OFFLINE, build_app
    from tests.conftest import LOCAL_IMAGE_URI
    from tests.training_config import with_dev_training

    environments = with_dev_training(ENVIRONMENTS)
    app = App(context={**OFFLINE, "imageUri": LOCAL_IMAGE_URI, "trainingImageUri": LOCAL_IMAGE_URI},
              outdir=str(tmp_path / "cdk.out"))
    build_app(app, environments, nag=False)
    app.synth()
    (stack,) = cdk.stage_stacks(tmp_path / "cdk.out", "Dev")
    with mock_aws():
        session = boto3.Session(region_name=moto_region)
        session.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String")
        cfn = session.client("cloudformation")
        cfn.create_stack(StackName=stack.stack_name, TemplateBody=stack.template_path.read_text(),
                         Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"])
        assert cfn.describe_stacks(StackName=stack.stack_name)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
        template = stack.template()
        resources = inventory.stack_resources(session, stack.stack_name, template)
        rows = inventory.check(session, template, resources)
        assert all(row.ok for row in rows), inventory.render([(stack.display_name, rows)])
        counts = {row.label: row.expected for row in rows}
        assert counts["training state machine"] == counts["candidate parameter"] == 1
        outputs = {o["OutputKey"]: o["OutputValue"] for o in cfn.describe_stacks(
            StackName=stack.stack_name)["Stacks"][0]["Outputs"]}
        machine = session.client("stepfunctions").describe_state_machine(
            stateMachineArn=outputs["DrafterTrainingStateMachine"])
        assert machine["name"] == "peagle-dev-drafter-training" and "createTrainingJob.sync" in machine["definition"]
        parameter = session.client("ssm").get_parameter(Name=outputs["DrafterCandidateParameter"])["Parameter"]
        assert parameter["Value"] == "none"  # nothing published before a candidate passes its gate
        rules = session.client("events").list_rules(NamePrefix="peagle-dev-drafter-training")["Rules"]
        assert [r["ScheduleExpression"] for r in rules] == ["rate(7 days)"]
        cfn.delete_stack(StackName=stack.stack_name)
        left = inventory.after_delete(session, resources)
        assert all(row.ok for row in left), inventory.render([(f"{stack.display_name} after delete", left)])
        assert session.client("stepfunctions").list_state_machines()["stateMachines"] == []
