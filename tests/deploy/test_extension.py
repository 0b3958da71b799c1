"""The CloudFormation extension on its own, with small hand-written templates (no synth)."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from harness.aws import cfn_types, fidelity

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
    assert fidelity.LLM_INSTANCE_TYPE.match(instance_type)


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
