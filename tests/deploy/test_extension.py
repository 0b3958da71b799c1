"""The CloudFormation extension on its own, with small hand-written templates (no synth)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from harness.aws import cfn_types, moto_patches
from ops import inventory

# Fake credentials, us-east-1 and the extension loaded, for every test here (conftest.py).
pytestmark = pytest.mark.usefixtures("moto_region")


def _endpoint_template(instance_type: str, *, with_policy_target: bool = True) -> dict:
    target_id = {"Ref": "Target"} if with_policy_target else "endpoint/nope/variant/AllTraffic|sagemaker:variant:DesiredInstanceCount|sagemaker"
    return {"Resources": {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}}},
        "Model": {"Type": "AWS::SageMaker::Model", "Properties": {
            "ExecutionRoleArn": {"Fn::GetAtt": ["Role", "Arn"]}, "PrimaryContainer": {"Image": "123.dkr.ecr.us-east-1.amazonaws.com/x:1"}}},
        "Config": {"Type": "AWS::SageMaker::EndpointConfig", "Properties": {"ProductionVariants": [{
            "VariantName": "AllTraffic", "ModelName": {"Fn::GetAtt": ["Model", "ModelName"]},
            "InitialInstanceCount": 1, "InstanceType": instance_type}]}},
        "Endpoint": {"Type": "AWS::SageMaker::Endpoint", "Properties": {
            "EndpointName": "peagle-unit", "EndpointConfigName": {"Fn::GetAtt": ["Config", "EndpointConfigName"]}}},
        "Target": {"Type": "AWS::ApplicationAutoScaling::ScalableTarget", "Properties": {
            "ServiceNamespace": "sagemaker", "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
            "ResourceId": {"Fn::Join": ["", ["endpoint/", {"Fn::GetAtt": ["Endpoint", "EndpointName"]}, "/variant/AllTraffic"]]},
            "MinCapacity": 1, "MaxCapacity": 3, "RoleARN": {"Fn::GetAtt": ["Role", "Arn"]}}},
        "Policy": {"Type": "AWS::ApplicationAutoScaling::ScalingPolicy", "DependsOn": ["Target"], "Properties": {
            "PolicyName": "concurrency", "PolicyType": "TargetTrackingScaling", "ScalingTargetId": target_id,
            "TargetTrackingScalingPolicyConfiguration": {"TargetValue": 4.0, "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"}}}},
        "Alarm": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "Namespace": "PEagle/Serving", "MetricName": "TimeToFirstToken", "ExtendedStatistic": "p90",
            "Period": 60, "EvaluationPeriods": 3, "Threshold": 2000, "ComparisonOperator": "GreaterThanThreshold",
            "Dimensions": [{"Name": "EndpointName", "Value": {"Fn::GetAtt": ["Endpoint", "EndpointName"]}}]}},
        "Group": {"Type": "AWS::Logs::LogGroup", "Properties": {"LogGroupName": "/aws/sagemaker/Endpoints/peagle-unit"}},
        "Filter": {"Type": "AWS::Logs::MetricFilter", "Properties": {
            "LogGroupName": {"Ref": "Group"}, "FilterPattern": '{ $.event = "peagle.request" }',
            "MetricTransformations": [{"MetricName": "TimeToFirstToken", "MetricNamespace": "PEagle/Serving",
                                       "MetricValue": "$.ttft_ms", "Unit": "Milliseconds"}]}},
    }, "Outputs": {"TargetRef": {"Value": {"Ref": "Target"}}, "PolicyRef": {"Value": {"Ref": "Policy"}},
                   "AlarmArn": {"Value": {"Fn::GetAtt": ["Alarm", "Arn"]}}}}


def test_extension_types_are_created_with_real_reference_formats_and_deleted() -> None:
    with mock_aws():
        cfn = boto3.client("cloudformation")
        cfn.create_stack(StackName="unit", TemplateBody=json.dumps(_endpoint_template("ml.g6.2xlarge")),
                         Capabilities=["CAPABILITY_IAM"])
        stack = cfn.describe_stacks(StackName="unit")["Stacks"][0]
        assert stack["StackStatus"] == "CREATE_COMPLETE"
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
        # CloudFormation's own formats: target Ref "resource|dimension|namespace", policy Ref its ARN.
        assert outputs["TargetRef"] == "endpoint/peagle-unit/variant/AllTraffic|sagemaker:variant:DesiredInstanceCount|sagemaker"
        assert outputs["PolicyRef"].startswith("arn:aws:autoscaling:us-east-1:") and outputs["PolicyRef"].endswith("policyName/concurrency")
        assert outputs["AlarmArn"].startswith("arn:aws:cloudwatch:us-east-1:")

        # The endpoint keeps its EndpointName, as on AWS (moto alone would generate one).
        assert boto3.client("sagemaker").describe_endpoint(EndpointName="peagle-unit")["EndpointStatus"] == "InService"
        aas = boto3.client("application-autoscaling")
        (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
        assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == ("endpoint/peagle-unit/variant/AllTraffic", 1, 3)
        (policy,) = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
        assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 4.0
        (alarm,) = boto3.client("cloudwatch").describe_alarms()["MetricAlarms"]
        assert (alarm["ExtendedStatistic"], alarm["Threshold"], alarm["Dimensions"]) == (
            "p90", 2000.0, [{"Name": "EndpointName", "Value": "peagle-unit"}])
        (flt,) = boto3.client("logs").describe_metric_filters()["metricFilters"]
        assert flt["logGroupName"] == "/aws/sagemaker/Endpoints/peagle-unit"
        assert flt["metricTransformations"][0]["metricName"] == "TimeToFirstToken"
        assert flt["metricTransformations"][0]["metricValue"] == "$.ttft_ms"

        cfn.delete_stack(StackName="unit")
        assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
        assert aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
        assert boto3.client("cloudwatch").describe_alarms()["MetricAlarms"] == []
        assert boto3.client("logs").describe_metric_filters()["metricFilters"] == []


def test_policy_on_an_unregistered_target_fails_the_stack() -> None:
    with mock_aws():
        cfn = boto3.client("cloudformation")
        template = _endpoint_template("ml.g6.2xlarge", with_policy_target=False)
        with pytest.raises(Exception, match="no scalable target"):
            cfn.create_stack(StackName="bad", TemplateBody=json.dumps(template), Capabilities=["CAPABILITY_IAM"])


@pytest.mark.parametrize("instance_type", ["ml.g5.12xlarge", "ml.g6e.xlarge", "ml.p5.48xlarge", "ml.inf2.24xlarge"])
def test_current_gpu_instance_types_are_accepted(instance_type: str) -> None:
    assert moto_patches.LLM_INSTANCE_TYPE.match(instance_type)


@pytest.mark.parametrize("instance_type", ["ml.g6.2xlage", "ml.g6.2xlarge ", "g6.2xlarge", "ml.zz9.xlarge"])
def test_typos_are_still_refused(instance_type: str) -> None:
    with mock_aws():
        cfn = boto3.client("cloudformation")
        with pytest.raises(Exception, match="instanceType|InstanceType"):
            cfn.create_stack(StackName="typo", TemplateBody=json.dumps(_endpoint_template(instance_type)),
                             Capabilities=["CAPABILITY_IAM"])


def test_a_model_moto_would_not_map_is_refused_where_it_is_defined() -> None:
    # moto maps only direct CloudFormationModel subclasses: one deriving from the shared mixin alone would
    # be skipped silently, exactly the failure the extension exists to remove.
    with pytest.raises(TypeError, match="Hidden: name CloudFormationModel as a direct base"):
        class Hidden(cfn_types._ExtensionType):
            CFN_TYPE = "AWS::Test::Hidden"
            NAME_PROPERTY = ""
            GETATT: dict[str, str] = {}
            REF = "name"


COMPONENT = "peagle-unit-gpt-oss-20b"
IC_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"


def _component_template(*, endpoint_name: str = "peagle-unit", dimension: str = IC_DIMENSION) -> dict:
    """Model, a model-less endpoint config that scales its instances, endpoint, one inference component with
    copy-count autoscaling (target tracking + a step policy that wakes it from zero) and the wake-up alarm:
    the shape the Dev stack synthesizes."""
    return {"Resources": {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}}},
        "Model": {"Type": "AWS::SageMaker::Model", "Properties": {
            "ExecutionRoleArn": {"Fn::GetAtt": ["Role", "Arn"]}, "PrimaryContainer": {"Image": "123.dkr.ecr.us-east-1.amazonaws.com/x:1"}}},
        "Config": {"Type": "AWS::SageMaker::EndpointConfig", "Properties": {
            "ExecutionRoleArn": {"Fn::GetAtt": ["Role", "Arn"]},
            "ProductionVariants": [{
                "VariantName": "AllTraffic", "InstanceType": "ml.g6e.xlarge", "InitialInstanceCount": 1,
                "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 2},
                "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
                "InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-3-1"}]}},
        "Endpoint": {"Type": "AWS::SageMaker::Endpoint", "Properties": {
            "EndpointName": "peagle-unit", "EndpointConfigName": {"Fn::GetAtt": ["Config", "EndpointConfigName"]}}},
        "Component": {"Type": "AWS::SageMaker::InferenceComponent", "DependsOn": ["Endpoint"], "Properties": {
            "InferenceComponentName": COMPONENT, "EndpointName": endpoint_name, "VariantName": "AllTraffic",
            "Specification": {
                "ModelName": {"Fn::GetAtt": ["Model", "ModelName"]},
                "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": 1, "MinMemoryRequiredInMb": 16384,
                                                "NumberOfCpuCoresRequired": 2},
                "StartupParameters": {"ContainerStartupHealthCheckTimeoutInSeconds": 1800,
                                      "ModelDataDownloadTimeoutInSeconds": 1800},
                "Container": {"ContainerMetricsConfig": {"MetricsEndpoints": [
                    {"MetricsEndpointPath": "/metrics", "MetricPublishFrequencyInSeconds": 60}]}}},
            "RuntimeConfig": {"CopyCount": 1},
            "DeploymentConfig": {
                "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 120},
                "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "peagle-unit-ttft"}]}},
            "Tags": [{"Key": "env", "Value": "unit"}]}},
        "Target": {"Type": "AWS::ApplicationAutoScaling::ScalableTarget", "DependsOn": ["Component"], "Properties": {
            "ServiceNamespace": "sagemaker", "ScalableDimension": dimension,
            "ResourceId": f"inference-component/{COMPONENT}", "MinCapacity": 0, "MaxCapacity": 2}},
        "Tracking": {"Type": "AWS::ApplicationAutoScaling::ScalingPolicy", "Properties": {
            "PolicyName": "per-copy-concurrency", "PolicyType": "TargetTrackingScaling", "ScalingTargetId": {"Ref": "Target"},
            "TargetTrackingScalingPolicyConfiguration": {"TargetValue": 16.0, "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"}}}},
        "WakeUp": {"Type": "AWS::ApplicationAutoScaling::ScalingPolicy", "Properties": {
            "PolicyName": "wake-up", "PolicyType": "StepScaling", "ScalingTargetId": {"Ref": "Target"},
            "StepScalingPolicyConfiguration": {"AdjustmentType": "ChangeInCapacity", "Cooldown": 600,
                                               "MetricAggregationType": "Maximum",
                                               "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}}},
        "NoCapacity": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "AlarmName": f"{COMPONENT}-NoCapacityWakeUp", "Namespace": "AWS/SageMaker",
            "MetricName": "NoCapacityInvocationFailures", "Statistic": "Sum", "Period": 60, "EvaluationPeriods": 1,
            "DatapointsToAlarm": 1, "Threshold": 1, "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "TreatMissingData": "notBreaching", "AlarmActions": [{"Ref": "WakeUp"}],
            "Dimensions": [{"Name": "InferenceComponentName", "Value": COMPONENT}]}},
    }, "Outputs": {"ComponentRef": {"Value": {"Ref": "Component"}},
                   "ComponentStatus": {"Value": {"Fn::GetAtt": ["Component", "InferenceComponentStatus"]}},
                   "WakeUpRef": {"Value": {"Ref": "WakeUp"}}}}


def test_an_inference_component_and_its_copy_autoscaling_are_created_and_deleted() -> None:
    with mock_aws():
        session = boto3.Session()
        cfn = session.client("cloudformation")
        template = _component_template()
        cfn.create_stack(StackName="ic", TemplateBody=json.dumps(template), Capabilities=["CAPABILITY_IAM"])
        stack = cfn.describe_stacks(StackName="ic")["Stacks"][0]
        assert stack["StackStatus"] == "CREATE_COMPLETE"
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
        assert outputs["ComponentRef"] == f"arn:aws:sagemaker:us-east-1:123456789012:inference-component/{COMPONENT}"
        assert outputs["ComponentStatus"] == "InService"

        sm = session.client("sagemaker")
        config_name = sm.describe_endpoint(EndpointName="peagle-unit")["EndpointConfigName"]
        config = sm.describe_endpoint_config(EndpointConfigName=config_name)
        assert config["ExecutionRoleArn"].startswith("arn:aws:iam::123456789012:role/")
        (variant,) = config["ProductionVariants"]
        assert "ModelName" not in variant
        assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 2}

        ic = sm.describe_inference_component(InferenceComponentName=COMPONENT)
        assert (ic["InferenceComponentStatus"], ic["EndpointName"], ic["VariantName"]) == ("InService", "peagle-unit", "AllTraffic")
        assert ic["InferenceComponentArn"] == outputs["ComponentRef"]
        assert ic["EndpointArn"].endswith(":endpoint/peagle-unit")
        assert ic["RuntimeConfig"] == {"DesiredCopyCount": 1, "CurrentCopyCount": 1}
        spec = ic["Specification"]
        assert spec["ModelName"] == sm.list_models()["Models"][0]["ModelName"]
        assert spec["ComputeResourceRequirements"] == {
            "NumberOfAcceleratorDevicesRequired": 1.0, "MinMemoryRequiredInMb": 16384, "NumberOfCpuCoresRequired": 2.0}
        assert spec["StartupParameters"]["ContainerStartupHealthCheckTimeoutInSeconds"] == 1800
        assert spec["Container"]["ContainerMetricsConfig"]["MetricsEndpoints"] == [
            {"MetricsEndpointPath": "/metrics", "MetricPublishFrequencyInSeconds": 60}]
        assert ic["LastDeploymentConfig"]["AutoRollbackConfiguration"] == {"Alarms": [{"AlarmName": "peagle-unit-ttft"}]}
        listed = sm.list_inference_components(EndpointNameEquals="peagle-unit")["InferenceComponents"]
        assert [c["InferenceComponentName"] for c in listed] == [COMPONENT]
        assert sm.list_inference_components(EndpointNameEquals="other")["InferenceComponents"] == []

        aas = session.client("application-autoscaling")
        (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ScalableDimension=IC_DIMENSION)["ScalableTargets"]
        assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (f"inference-component/{COMPONENT}", 0, 2)
        policies = {p["PolicyName"]: p for p in aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]}
        assert set(policies) == {"per-copy-concurrency", "wake-up"}
        assert policies["per-copy-concurrency"]["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"][
            "PredefinedMetricType"] == "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"
        step = policies["wake-up"]["StepScalingPolicyConfiguration"]
        assert step["StepAdjustments"] == [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}]
        assert (step["AdjustmentType"], step["Cooldown"]) == ("ChangeInCapacity", 600)
        (alarm,) = session.client("cloudwatch").describe_alarms()["MetricAlarms"]
        assert alarm["AlarmActions"] == [outputs["WakeUpRef"]] == [policies["wake-up"]["PolicyARN"]]
        assert alarm["Dimensions"] == [{"Name": "InferenceComponentName", "Value": COMPONENT}]

        # The deploy check sees the component through SageMaker's own API, by the ARN CloudFormation records.
        resources = inventory.stack_resources(session, "ic", template)
        rows = {r.label: r for r in inventory.check(session, template, resources)}
        assert (rows["inference component"].expected, rows["inference component"].found) == (1, 1)
        assert all(r.ok for r in rows.values()), inventory.render([("ic", list(rows.values()))])

        # The endpoint is not deleted under its component; the stack deletion takes the component first.
        with pytest.raises(ClientError, match=f"still hosts inference components \\['{COMPONENT}'\\]"):
            sm.delete_endpoint(EndpointName="peagle-unit")
        cfn.delete_stack(StackName="ic")
        assert sm.list_inference_components()["InferenceComponents"] == []
        assert sm.list_endpoints()["Endpoints"] == [] and sm.list_endpoint_configs()["EndpointConfigs"] == []
        assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
        assert aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
        assert session.client("cloudwatch").describe_alarms()["MetricAlarms"] == []
        left = inventory.after_delete(session, resources)
        assert inventory.left_behind(left) == 0 and all(r.ok for r in left), inventory.render([("ic after delete", left)])
        with pytest.raises(ClientError, match="Could not find inference component"):
            sm.describe_inference_component(InferenceComponentName=COMPONENT)


def test_an_inference_component_on_a_missing_endpoint_fails_the_stack_naming_it() -> None:
    with mock_aws():
        cfn = boto3.client("cloudformation")
        template = _component_template(endpoint_name="peagle-nope")
        with pytest.raises(Exception, match="could not find endpoint 'peagle-nope'"):
            cfn.create_stack(StackName="bad-ic", TemplateBody=json.dumps(template), Capabilities=["CAPABILITY_IAM"])
        assert boto3.client("sagemaker").list_inference_components()["InferenceComponents"] == []


@pytest.mark.parametrize(("dimension", "resource_id"), [
    ("sagemaker:inference-component:DesiredCopyCount", "endpoint/peagle-unit/variant/AllTraffic"),
    ("sagemaker:inference-component:DesiredCopyCount", "inference-component/"),
    ("sagemaker:variant:DesiredInstanceCount", f"inference-component/{COMPONENT}"),
    ("sagemaker:inference-component:DesiredCopies", f"inference-component/{COMPONENT}"),
])
def test_a_scalable_target_with_a_wrong_dimension_still_fails(dimension: str, resource_id: str) -> None:
    with mock_aws():
        template = _component_template(dimension=dimension)
        template["Resources"]["Target"]["Properties"]["ResourceId"] = resource_id
        with pytest.raises(Exception, match="Unsupported service namespace|scalable dimension"):
            boto3.client("cloudformation").create_stack(StackName="bad-target", TemplateBody=json.dumps(template),
                                                        Capabilities=["CAPABILITY_IAM"])


def test_the_inference_component_api_refuses_what_the_service_refuses() -> None:
    with mock_aws():
        sm = boto3.client("sagemaker")
        role = "arn:aws:iam::123456789012:role/sm"
        sm.create_model(ModelName="m", ExecutionRoleArn=role, PrimaryContainer={"Image": "123.dkr.ecr.us-east-1.amazonaws.com/x:1"})
        fleet = {"VariantName": "AllTraffic", "InstanceType": "ml.g6e.xlarge", "InitialInstanceCount": 1}
        # A variant with no model is a fleet for components, which needs the config's role.
        with pytest.raises(ClientError, match="ExecutionRoleArn is required"):
            sm.create_endpoint_config(EndpointConfigName="fleet", ProductionVariants=[fleet])
        sm.create_endpoint_config(EndpointConfigName="fleet", ProductionVariants=[fleet], ExecutionRoleArn=role)
        assert sm.describe_endpoint_config(EndpointConfigName="fleet")["ExecutionRoleArn"] == role
        sm.create_endpoint(EndpointName="fleet", EndpointConfigName="fleet")
        sm.create_endpoint_config(EndpointConfigName="single", ProductionVariants=[{**fleet, "ModelName": "m"}])
        sm.create_endpoint(EndpointName="single", EndpointConfigName="single")

        def create(**overrides):
            args = {"InferenceComponentName": "ic", "EndpointName": "fleet", "VariantName": "AllTraffic",
                    "Specification": {"ModelName": "m", "ComputeResourceRequirements": {"MinMemoryRequiredInMb": 1024}},
                    "RuntimeConfig": {"CopyCount": 2}}
            return sm.create_inference_component(**{**args, **overrides})

        with pytest.raises(ClientError, match="no variant 'Blue'"):
            create(VariantName="Blue")
        with pytest.raises(ClientError, match="CopyCount 0 at creation"):
            create(RuntimeConfig={"CopyCount": 0})
        with pytest.raises(ClientError, match="serves model 'm'"):
            create(EndpointName="single")
        with pytest.raises(ClientError, match="could not find model 'gone'"):
            create(Specification={"ModelName": "gone", "ComputeResourceRequirements": {"MinMemoryRequiredInMb": 1024}})
        arn = create()["InferenceComponentArn"]
        assert arn.endswith(":inference-component/ic")
        assert sm.describe_inference_component(InferenceComponentName="ic")["RuntimeConfig"]["DesiredCopyCount"] == 2
        with pytest.raises(ClientError, match="already exists"):
            create()
        sm.delete_inference_component(InferenceComponentName="ic")
        assert sm.list_inference_components()["InferenceComponents"] == []
        sm.delete_endpoint(EndpointName="fleet")  # nothing hosted on it any more
