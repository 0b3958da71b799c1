"""Inference components: a fleet that scales itself (to zero), models on it, their scaling, rollout and alarms."""

from __future__ import annotations

import pytest
from aws_cdk import Duration
from aws_cdk.assertions import Template

from peagle_constructs import (
    AlarmThresholds, ComputeRequirements, ConfigError, CopyScaling, DeploymentPolicy, FleetProps, InstanceScaling,
    ModelProps, PEagleComponentEndpoint, ScaleIn,
)
from tests import policy_judge
from tests.constructs.construct_helpers import one, resources

NAME = "fleet"


@pytest.fixture
def fleet(stack) -> PEagleComponentEndpoint:
    return PEagleComponentEndpoint(stack, "Fleet", endpoint_name=NAME, fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                                   instance_scaling=InstanceScaling(min_instances=0, max_instances=2))


@pytest.fixture
def template(stack, fleet, serving, image) -> Template:
    fleet.add_component("Chat", model=ModelProps(serving=serving), image=image, scaling=CopyScaling(min_copies=0),
                        deployment=DeploymentPolicy.rolling(copies=1, bake=Duration.minutes(5)))
    return Template.from_stack(stack)


def _by_type(template, type_name: str) -> list[dict]:
    return [r["Properties"] for r in resources(template, type_name).values()]


def test_the_fleet_scales_its_instances_to_zero_and_names_no_model(template):
    _, config = one(template, "AWS::SageMaker::EndpointConfig")
    (variant,) = config["Properties"]["ProductionVariants"]
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 2}
    assert "ModelName" not in variant and variant["InitialInstanceCount"] == 1
    assert "Fn::GetAtt" in config["Properties"]["ExecutionRoleArn"]
    _, endpoint = one(template, "AWS::SageMaker::Endpoint")
    assert "DeploymentConfig" not in endpoint["Properties"]  # each component rolls out by itself


def test_a_component_reserves_its_share_starts_with_llm_timeouts_and_exposes_vllms_metrics(template):
    _, component = one(template, "AWS::SageMaker::InferenceComponent")
    props = component["Properties"]
    assert props["InferenceComponentName"] == f"{NAME}-chat" and props["EndpointName"] == NAME
    spec = props["Specification"]
    # ml.g6e.xlarge: 1 GPU, 4 vCPUs, 32 GiB; a copy takes its GPU and the share of the rest less a fifth.
    assert spec["ComputeResourceRequirements"] == {
        "NumberOfAcceleratorDevicesRequired": 1, "MinMemoryRequiredInMb": int(32 * 1024 * 0.8),
        "NumberOfCpuCoresRequired": 3}
    assert spec["StartupParameters"] == {"ContainerStartupHealthCheckTimeoutInSeconds": 1800,
                                         "ModelDataDownloadTimeoutInSeconds": 1800}
    assert spec["Container"]["ContainerMetricsConfig"]["MetricsEndpoints"] == [
        {"MetricsEndpointPath": "/metrics", "MetricPublishFrequencyInSeconds": 60}]
    assert "Fn::GetAtt" in spec["ModelName"] and props["RuntimeConfig"] == {"CopyCount": 1}
    assert set(component["DependsOn"]) >= {next(iter(resources(template, "AWS::SageMaker::Endpoint")))}


def test_the_rolling_update_moves_one_copy_at_a_time_and_rolls_back_on_the_components_alarms(template):
    _, component = one(template, "AWS::SageMaker::InferenceComponent")
    deployment = component["Properties"]["DeploymentConfig"]
    policy = deployment["RollingUpdatePolicy"]
    assert policy["MaximumBatchSize"] == {"Type": "COPY_COUNT", "Value": 1} and policy["WaitIntervalInSeconds"] == 300
    assert 600 <= policy["MaximumExecutionTimeoutInSeconds"] <= 28800
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    names = {alarms[a["AlarmName"]["Ref"]]["Properties"]["AlarmName"]
             for a in deployment["AutoRollbackConfiguration"]["Alarms"]}
    assert names == {f"{NAME}-chat-{what}" for what in ("TimePerOutputTokenP90", "Invocation5XXErrorRate")}


def test_copies_track_concurrency_and_scale_in_to_zero(template):
    (target,) = _by_type(template, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert target["ResourceId"] == f"inference-component/{NAME}-chat"
    assert target["ScalableDimension"] == "sagemaker:inference-component:DesiredCopyCount"
    assert (target["MinCapacity"], target["MaxCapacity"]) == (0, 2)  # one copy per instance, two instances at most
    tracking = [p for p in _by_type(template, "AWS::ApplicationAutoScaling::ScalingPolicy")
                if p["PolicyType"] == "TargetTrackingScaling"]
    (config,) = [p["TargetTrackingScalingPolicyConfiguration"] for p in tracking]
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == \
        "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"
    assert config["TargetValue"] == 16


def test_the_first_failed_request_wakes_a_component_from_zero(template):
    steps = {lid: r for lid, r in resources(template, "AWS::ApplicationAutoScaling::ScalingPolicy").items()
             if r["Properties"]["PolicyType"] == "StepScaling"}
    ((step_id, step),) = steps.items()
    config = step["Properties"]["StepScalingPolicyConfiguration"]
    assert config["AdjustmentType"] == "ChangeInCapacity" and config["MetricAggregationType"] == "Maximum"
    assert config["StepAdjustments"] == [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]
    assert config["Cooldown"] == 600  # one burst of failures adds one copy while it loads
    (alarm,) = [a for a in _by_type(template, "AWS::CloudWatch::Alarm")
                if a.get("MetricName") == "NoCapacityInvocationFailures"]
    # One failed request in a minute must fire it: >= 1, never > 1 (which waits for a second failure).
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
    assert (alarm["Statistic"], alarm["Period"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == \
        ("Sum", 60, 1, 1)
    assert alarm["Namespace"] == "AWS/SageMaker"
    assert alarm["Dimensions"] == [{"Name": "InferenceComponentName", "Value": f"{NAME}-chat"}]
    assert alarm["AlarmActions"] == [{"Ref": step_id}]


def test_no_wake_up_policy_where_copies_keep_a_floor(stack, fleet, serving, image):
    fleet.add_component("Chat", model=ModelProps(serving=serving), image=image, scaling=CopyScaling(min_copies=1))
    template = Template.from_stack(stack)
    (target,) = _by_type(template, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert target["MinCapacity"] == 1
    assert [p["PolicyType"] for p in _by_type(template, "AWS::ApplicationAutoScaling::ScalingPolicy")] == \
        ["TargetTrackingScaling"]


def test_each_component_has_its_own_log_group_metrics_and_alarms(template):
    groups = {g["LogGroupName"] for g in _by_type(template, "AWS::Logs::LogGroup")}
    assert groups == {f"/aws/sagemaker/Endpoints/{NAME}", f"/aws/sagemaker/InferenceComponents/{NAME}-chat"}
    assert all("KmsKeyId" in g for g in _by_type(template, "AWS::Logs::LogGroup"))
    filters = _by_type(template, "AWS::Logs::MetricFilter")
    assert filters and {f["LogGroupName"]["Ref"] for f in filters} == {
        lid for lid, g in resources(template, "AWS::Logs::LogGroup").items()
        if g["Properties"]["LogGroupName"].startswith("/aws/sagemaker/InferenceComponents/")}
    alarms = _by_type(template, "AWS::CloudWatch::Alarm")
    assert all(a["AlarmName"].startswith(f"{NAME}-chat-") for a in alarms)
    error_rate = next(a for a in alarms if a["AlarmName"].endswith("Invocation5XXErrorRate"))
    dims = [m["MetricStat"]["Metric"]["Dimensions"] for m in error_rate["Metrics"] if "MetricStat" in m]
    assert dims and all(d == [{"Name": "InferenceComponentName", "Value": f"{NAME}-chat"}] for d in dims)
    assert resources(template, "AWS::CloudWatch::Dashboard")


def test_the_components_alarms_may_notify_its_topic(template):
    _, topic_policy = one(template, "AWS::SNS::TopicPolicy")
    document = topic_policy["Properties"]["PolicyDocument"]
    topic_id = next(iter(resources(template, "AWS::SNS::Topic")))
    place = policy_judge.Place(account="333333333333", region="eu-west-1",
                               physical={topic_id: "arn:aws:sns:eu-west-1:333333333333:alarms"})

    def publish(alarm: str) -> policy_judge.Request:
        return policy_judge.Request(service="cloudwatch.amazonaws.com", action="sns:Publish",
                                    resource="arn:aws:sns:eu-west-1:333333333333:alarms",
                                    context={"aws:SourceArn": f"arn:aws:cloudwatch:eu-west-1:333333333333:alarm:{alarm}",
                                             "aws:SourceAccount": "333333333333", "aws:SecureTransport": "true"})

    assert policy_judge.allowed(document, publish(f"{NAME}-chat-TimeToFirstTokenP90"), place)
    assert not policy_judge.allowed(document, publish(f"{NAME}-other-TimeToFirstTokenP90"), place)


def test_one_key_encrypts_the_fleet_and_its_components_and_cloudwatch_may_use_it_for_their_alarms(template):
    ((key_id, key),) = resources(template, "AWS::KMS::Key").items()
    assert all(g["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]} for g in _by_type(template, "AWS::Logs::LogGroup"))
    assert all(t["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]} for t in _by_type(template, "AWS::SNS::Topic"))
    place = policy_judge.Place(account="333333333333", region="eu-west-1",
                               physical={f"{key_id}.Arn": "arn:aws:kms:eu-west-1:333333333333:key/k"})

    def use(alarm: str) -> policy_judge.Request:
        return policy_judge.Request(service="cloudwatch.amazonaws.com", action="kms:GenerateDataKey",
                                    resource="arn:aws:kms:eu-west-1:333333333333:key/k",
                                    context={"aws:SourceArn": f"arn:aws:cloudwatch:eu-west-1:333333333333:alarm:{alarm}",
                                             "aws:SourceAccount": "333333333333"})

    document = key["Properties"]["KeyPolicy"]
    assert policy_judge.allowed(document, use(f"{NAME}-chat-TimeToFirstTokenP90"), place)
    assert not policy_judge.allowed(document, use("another-TimeToFirstTokenP90"), place)


def test_a_components_promql_alarms_select_its_own_series(template):
    promql = {a["AlarmName"]: a["EvaluationCriteria"]["PromQLCriteria"]["Query"]
              for a in _by_type(template, "AWS::CloudWatch::Alarm") if "EvaluationCriteria" in a}
    assert set(promql) == {f"{NAME}-chat-{n}" for n in ("VllmTimeToFirstTokenP90", "VllmInterTokenLatencyP90",
                                                        "VllmAcceptanceRate")}
    selector = f'"aws.sagemaker.endpoint.name"="{NAME}","aws.sagemaker.inference_component.name"="{NAME}-chat"'
    assert all(query.count(selector) == query.count("{") for query in promql.values()), promql


def test_no_promql_alarms_where_the_fleet_publishes_no_detailed_observability(stack, serving, image):
    from peagle_constructs import DetailedObservability

    quiet = PEagleComponentEndpoint(stack, "Quiet", endpoint_name="quiet", fleet=FleetProps(
        instance_type="ml.g6e.xlarge", detailed_observability=DetailedObservability(enabled=False)))
    quiet.add_component("Chat", model=ModelProps(serving=serving), image=image)
    alarms = _by_type(Template.from_stack(stack), "AWS::CloudWatch::Alarm")
    assert alarms and not [a for a in alarms if "EvaluationCriteria" in a]


@pytest.mark.parametrize(("scale_in", "rendered"), [
    (ScaleIn.idle_release(), {"Strategy": "IDLE_RELEASE"}),
    (ScaleIn.consolidation(cooldown=Duration.minutes(30), max_step=2),
     {"Strategy": "CONSOLIDATION", "CooldownInMinutes": 30, "MaximumStepSize": 2}),
])
def test_the_fleet_says_how_it_gives_instances_back(stack, scale_in, rendered):
    PEagleComponentEndpoint(stack, "Fleet", endpoint_name=NAME, fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                            instance_scaling=InstanceScaling(min_instances=0, scale_in=scale_in))
    (config,) = _by_type(Template.from_stack(stack), "AWS::SageMaker::EndpointConfig")
    assert config["ProductionVariants"][0]["ManagedInstanceScaling"]["ScaleInPolicy"] == rendered


@pytest.mark.parametrize(("scale_in", "field", "allowed"), [
    (ScaleIn(strategy="IDLE_RELEASE", cooldown=Duration.minutes(10)), "instance_scaling.scale_in", "consolidation's"),
    (ScaleIn.consolidation(cooldown=Duration.minutes(1)), "instance_scaling.scale_in.cooldown", "300..86400 s"),
    (ScaleIn.consolidation(max_step=0), "instance_scaling.scale_in.max_step", "1..100"),
    (ScaleIn(strategy="RELEASE_ALL"), "instance_scaling.scale_in.strategy", "IDLE_RELEASE"),
    ("IDLE_RELEASE", "instance_scaling.scale_in", "ScaleIn.idle_release()"),
])
def test_a_bad_scale_in_policy_fails_at_synth(stack, scale_in, field, allowed):
    with pytest.raises(ConfigError) as caught:
        PEagleComponentEndpoint(stack, "Fleet", endpoint_name=NAME, fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                                instance_scaling=InstanceScaling(scale_in=scale_in))
    assert caught.value.field_name == field and allowed in str(caught.value), str(caught.value)


def test_two_models_share_the_fleet(stack, fleet, serving, image):
    fleet.add_component("Chat", model=ModelProps(serving=serving), image=image)
    fleet.add_component("Code", model=ModelProps(serving=serving), image=image, compute=ComputeRequirements(memory_mib=8192))
    template = Template.from_stack(stack)
    names = sorted(c["InferenceComponentName"] for c in _by_type(template, "AWS::SageMaker::InferenceComponent"))
    assert names == [f"{NAME}-chat", f"{NAME}-code"]
    with pytest.raises(ConfigError, match="^component_name: .*already on this endpoint"):
        fleet.add_component("Again", component_name=f"{NAME}-chat", model=ModelProps(serving=serving), image=image)


@pytest.mark.parametrize(("props", "field", "allowed"), [
    # Copies above what the fleet's accelerators hold: 2 instances x 1 GPU.
    ({"copy_count": 3}, "copy_count", "1..2"),
    ({"scaling": CopyScaling(max_copies=3)}, "scaling.max_copies", "at most 2"),
    ({"scaling": CopyScaling(min_copies=3, max_copies=2)}, "scaling.min_copies", "min_copies <= max_copies"),
    # Reservations one ml.g6e.xlarge cannot hold.
    ({"compute": ComputeRequirements(accelerators=2)}, "compute.accelerators", "1..1"),
    ({"compute": ComputeRequirements(memory_mib=64 * 1024)}, "compute.memory_mib", "128..32768"),
    ({"compute": ComputeRequirements(cpu_cores=8)}, "compute.cpu_cores", "0.25..4"),
    ({"deployment": DeploymentPolicy.canary(percent=10)}, "deployment.mode", "rolling"),
    ({"deployment": DeploymentPolicy.rolling(instances=1)}, "deployment.size_unit", "copies="),
    ({"deployment": DeploymentPolicy.rolling(percent=80)}, "deployment.percent", "5..50"),
    ({"component_name": "bad_name"}, "component_name", "letters, digits and hyphens"),
])
def test_bad_components_fail_at_construction(fleet, serving, image, props, field, allowed):
    with pytest.raises(ConfigError) as caught:
        fleet.add_component("Chat", model=ModelProps(serving=serving), image=image, **props)
    assert caught.value.field_name == field and allowed in str(caught.value), str(caught.value)


@pytest.mark.parametrize(("props", "field", "allowed"), [
    ({"instance_scaling": InstanceScaling(min_instances=3, max_instances=2)}, "instance_scaling.min_instances",
     "min_instances <= max_instances"),
    ({"instance_scaling": InstanceScaling(min_instances=0), "allow_scale_to_zero": False},
     "instance_scaling.min_instances", "floor above zero"),
    ({"fleet": FleetProps(instance_type="ml.g6e.xlarge", instance_count=3)}, "instance_count", "1..2"),
])
def test_bad_fleets_fail_at_construction(stack, props, field, allowed):
    with pytest.raises(ConfigError) as caught:
        PEagleComponentEndpoint(stack, "Fleet", endpoint_name=NAME, **{
            "fleet": FleetProps(instance_type="ml.g6e.xlarge"), **props})
    assert caught.value.field_name == field and allowed in str(caught.value), str(caught.value)


def test_a_floor_of_zero_copies_is_refused_where_the_fleet_keeps_one(stack, serving, image):
    fleet = PEagleComponentEndpoint(stack, "Fleet", endpoint_name=NAME, fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                                    allow_scale_to_zero=False)
    with pytest.raises(ConfigError, match="^scaling.min_copies: got 0, and this environment keeps a floor"):
        fleet.add_component("Chat", model=ModelProps(serving=serving), image=image, scaling=CopyScaling(min_copies=0))


def test_alarm_thresholds_apply_per_component(stack, fleet, serving, image):
    fleet.add_component("Chat", model=ModelProps(serving=serving, alarm_thresholds=AlarmThresholds(ttft_p90_ms=900.0)),
                        image=image)
    alarms = _by_type(Template.from_stack(stack), "AWS::CloudWatch::Alarm")
    (ttft,) = [a for a in alarms if a["AlarmName"] == f"{NAME}-chat-TimeToFirstTokenP90"]
    assert ttft["Threshold"] == 900.0


def test_every_catalogued_size_knows_its_vcpus_and_memory():
    from peagle_constructs import GPU_FAMILIES

    for family, spec in GPU_FAMILIES.items():
        assert set(spec.gpus_by_size) <= set(spec.host_by_size), family  # the g families share one ladder
        for size, gpus in spec.gpus_by_size.items():
            vcpus, memory_gib = spec.host_by_size[size]
            assert vcpus >= 4 * gpus and memory_gib >= 16, (family, size)  # every GPU size has 4+ vCPUs per GPU


def test_the_component_name_clients_send_is_an_output_only_on_request(stack, fleet, serving, image):
    """Clients must send InferenceComponentName; the name is an attribute, and a stack output when asked for
    (none by default, so no existing stack's template changes)."""
    asked = fleet.add_component("Chat", model=ModelProps(serving=serving), image=image)
    fleet.add_component("Code", model=ModelProps(serving=serving), image=image)
    assert asked.component_name == asked.inference_component_name == f"{NAME}-chat"
    asked.add_name_output(export_name="FleetChatComponent")
    (output,) = Template.from_stack(stack).to_json()["Outputs"].values()
    assert output["Value"] == f"{NAME}-chat" and output["Export"] == {"Name": "FleetChatComponent"}
    assert "InferenceComponentName" in output["Description"] and NAME in output["Description"]
