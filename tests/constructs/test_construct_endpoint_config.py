"""PEagleEndpointConfig: LLM timeouts, routing, AMI, and the NVMe / EBS storage rules."""

from __future__ import annotations

import json

import pytest
from aws_cdk import Duration
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Template

from peagle_constructs import ConfigError, FleetProps, PEagleEndpointConfig, PEagleModel
from peagle_constructs.security import NVME_FINDINGS, acknowledged_findings
from tests.constructs.construct_helpers import one


@pytest.fixture
def model(stack, serving, image):
    return PEagleModel(stack, "Model", serving=serving, image=image)


def test_defaults_for_llm_serving(stack, model):
    PEagleEndpointConfig.for_model(stack, "Config", model=model, fleet=FleetProps(instance_type="ml.g6e.xlarge"))
    _, config = one(Template.from_stack(stack), "AWS::SageMaker::EndpointConfig")
    props = config["Properties"]
    assert "EndpointConfigName" not in props and "KmsKeyId" not in props
    (variant,) = props["ProductionVariants"]
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] >= 1200  # minutes, not the 4-minute default
    assert variant["ModelDataDownloadTimeoutInSeconds"] >= 1200
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert variant["InferenceAmiVersion"].startswith("al2")
    assert "VolumeSizeInGB" not in variant
    assert variant["ModelName"] == {"Fn::GetAtt": [next(iter(Template.from_stack(stack).find_resources(
        "AWS::SageMaker::Model"))), "ModelName"]}


def test_nvme_instance_acknowledges_the_kms_finding_with_a_reason(stack, model):
    config = PEagleEndpointConfig.for_model(stack, "Config", model=model, fleet=FleetProps(instance_type="ml.g5.2xlarge"))
    acknowledged = acknowledged_findings(config.cfn_endpoint_config)
    assert set(NVME_FINDINGS) <= set(acknowledged)
    assert all("NVMe" in acknowledged[f] for f in NVME_FINDINGS)


def test_ebs_backed_instance_takes_a_key_and_a_volume_size(stack, model):
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    config = PEagleEndpointConfig.for_model(stack, "Config", model=model, encryption_key=key,
                                           fleet=FleetProps(instance_type="ml.p3.2xlarge", volume_size_gb=200))
    _, cfn = one(Template.from_stack(stack), "AWS::SageMaker::EndpointConfig")
    assert "Fn::GetAtt" in cfn["Properties"]["KmsKeyId"]
    assert cfn["Properties"]["ProductionVariants"][0]["VolumeSizeInGB"] == 200
    assert not set(NVME_FINDINGS) & set(acknowledged_findings(config.cfn_endpoint_config))


def test_volume_size_refused_on_nvme(stack, model):
    with pytest.raises(ConfigError, match=r"^volume_size_gb: .*NVMe"):
        PEagleEndpointConfig.for_model(stack, "Config", model=model,
                                       fleet=FleetProps(instance_type="ml.g6.2xlarge", volume_size_gb=100))


@pytest.mark.parametrize("value", ["RANDOM_ISH", ""])
def test_routing_strategy_is_checked(stack, model, value):
    with pytest.raises(ConfigError, match=r"^routing_strategy: .*LEAST_OUTSTANDING_REQUESTS"):
        PEagleEndpointConfig.for_model(stack, "Config", model=model, fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                                       routing_strategy=value)


def test_timeouts_bounds_are_inclusive(stack, model):
    PEagleEndpointConfig.for_model(stack, "Low", model=model, fleet=FleetProps(
        instance_type="ml.g6e.xlarge", container_startup_health_check_timeout=Duration.seconds(60),
        model_data_download_timeout=Duration.seconds(3600)))
    with pytest.raises(ConfigError, match=r"^container_startup_health_check_timeout: got 59 s; allowed: 60..3600"):
        PEagleEndpointConfig.for_model(stack, "TooLow", model=model, fleet=FleetProps(
            instance_type="ml.g6e.xlarge", container_startup_health_check_timeout=Duration.seconds(59)))


def test_detailed_observability_is_set_explicitly(stack, model):
    from peagle_constructs import DetailedObservability

    PEagleEndpointConfig.for_model(stack, "On", model=model, fleet=FleetProps(
        instance_type="ml.g6e.xlarge", detailed_observability=DetailedObservability(publish_frequency=Duration.seconds(10))))
    PEagleEndpointConfig.for_model(stack, "Off", model=model, fleet=FleetProps(
        instance_type="ml.g6e.xlarge", detailed_observability=DetailedObservability(enabled=False)))
    configs = Template.from_stack(stack).find_resources("AWS::SageMaker::EndpointConfig")
    rendered = sorted(json.dumps(c["Properties"]["MetricsConfig"], sort_keys=True) for c in configs.values())
    assert rendered == ['{"EnableDetailedObservability": false}',
                        '{"EnableDetailedObservability": true, "MetricPublishFrequencyInSeconds": 10}']


def test_the_two_modes_are_chosen_by_classmethod_and_never_mixed(stack, model):
    from aws_cdk import aws_iam as iam

    from peagle_constructs import InstanceScaling

    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    fleet = PEagleEndpointConfig.for_components(stack, "Fleet", fleet=FleetProps(instance_type="ml.g6e.xlarge"),
                                                instance_scaling=InstanceScaling(), execution_role=role)
    (variant,) = fleet.cfn_endpoint_config.production_variants
    assert variant.model_name is None and variant.managed_instance_scaling.status == "ENABLED"
    with pytest.raises(ConfigError, match=r"^model: give a model \(PEagleEndpointConfig.for_model\)"):
        PEagleEndpointConfig(stack, "Both", fleet=FleetProps(instance_type="ml.g6e.xlarge"), model=model,
                             instance_scaling=InstanceScaling(), execution_role=role)
