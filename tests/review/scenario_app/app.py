"""A two-stage CDK app with the serving stack's shape, driven by scenario.json (stack-diff tests only).

It stands in for the product's app so the stack-diff scenarios (change K, rename the endpoint construct,
change the instance type) are commits to one small JSON file. Same resource types and wiring as the
real stack: Model -> EndpointConfig -> Endpoint, variant autoscaling, TTFT metric filter and alarm.
"""

import json
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct
from peagle_contract import ServingConfig

SCENARIO = json.loads((Path(__file__).parent / "scenario.json").read_text())
VARIANT = "AllTraffic"


class ServingStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, env_name: str, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        serving = ServingConfig(target_model="s3://peagle-models/target/", drafter_model="s3://peagle-models/drafter/",
                                num_speculative_tokens=SCENARIO["k"])
        role = iam.Role(self, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        model = sagemaker.CfnModel(self, "Model", execution_role_arn=role.role_arn,
                                   primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                                       image="123456789012.dkr.ecr.us-east-1.amazonaws.com/peagle-runtime:1",
                                       environment=serving.to_environment()))
        config = sagemaker.CfnEndpointConfig(self, "EndpointConfig", production_variants=[
            sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                variant_name=VARIANT, model_name=model.attr_model_name, initial_instance_count=1,
                instance_type=SCENARIO["instance_type"], initial_variant_weight=1)])
        name = f"peagle-{env_name}"
        endpoint = sagemaker.CfnEndpoint(self, SCENARIO["endpoint_id"], endpoint_name=name,
                                         endpoint_config_name=config.attr_endpoint_config_name)
        target = appscaling.ScalableTarget(
            self, "Scaling", service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=f"endpoint/{endpoint.attr_endpoint_name}/variant/{VARIANT}",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount", min_capacity=1, max_capacity=4)
        target.scale_to_track_metric("Concurrency", target_value=4, predefined_metric=(
            appscaling.PredefinedMetric.SAGEMAKER_VARIANT_CONCURRENT_REQUESTS_PER_MODEL_HIGH_RESOLUTION))
        group = logs.LogGroup(self, "EndpointLogs", log_group_name=f"/aws/sagemaker/Endpoints/{name}",
                              removal_policy=cdk.RemovalPolicy.DESTROY)
        logs.MetricFilter(self, "TtftFilter", log_group=group, metric_namespace="PEagle/Serving",
                          metric_name="TimeToFirstToken", metric_value="$.ttft_ms",
                          filter_pattern=logs.FilterPattern.literal('{ $.event = "peagle.request" }'))
        cloudwatch.Alarm(self, "TtftAlarm", threshold=2000, evaluation_periods=3, metric=cloudwatch.Metric(
            namespace="PEagle/Serving", metric_name="TimeToFirstToken", statistic="p90"))


app = cdk.App()
for stage_name in ("Dev", "Prod"):
    stage = cdk.Stage(app, stage_name, env=cdk.Environment(account="123456789012", region="us-east-1"))
    ServingStack(stage, "PEagle", env_name=stage_name.lower())
app.synth()
