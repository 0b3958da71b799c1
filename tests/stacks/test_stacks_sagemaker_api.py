"""Every SageMaker property of every stage, and the constructs' own catalogue, against botocore's service model."""

from __future__ import annotations

import copy

import pytest

from peagle_constructs.components import MIN_CPU_CORES, MIN_MEMORY_MIB
from peagle_constructs.deployment import EXECUTION_TIMEOUT_MAX_S, EXECUTION_TIMEOUT_MIN_S, WAIT_MAX_S
from peagle_constructs.endpoint_config import ROUTING_STRATEGIES
from peagle_constructs.props import INFERENCE_AMI_VERSIONS, TIMEOUT_MAX_S, TIMEOUT_MIN_S
from peagle_constructs.instance_types import GPU_FAMILIES
from tests.stacks.sagemaker_judge import check_template, service_model
from tests.stacks.template_helpers import STAGES, only


@pytest.mark.parametrize("name", STAGES)
def test_every_sagemaker_property_is_valid_for_the_api(templates, name):
    assert check_template(templates[name]) == []


def _variant(template: dict) -> dict:
    return only(template, "AWS::SageMaker::EndpointConfig")[1]["Properties"]["ProductionVariants"][0]


def _component(template: dict) -> dict:
    return only(template, "AWS::SageMaker::InferenceComponent")[1]["Properties"]


def _environment(template: dict) -> dict:
    return only(template, "AWS::SageMaker::Model")[1]["Properties"]["PrimaryContainer"]["Environment"]


@pytest.mark.parametrize(("break_it", "expected"), [
    (lambda t: _variant(t).update(InstanceType="ml.g6e.3xlarge"), "'ml.g6e.3xlarge' is not in ProductionVariantInstanceType"),
    (lambda t: _variant(t).update(InferenceAmiVersion="al2-ami-sagemaker-inference-gpu-9"), "ProductionVariantInferenceAmiVersion"),
    (lambda t: _variant(t).update(ContainerStartupHealthCheckTimeoutInSeconds=30), "30 is outside 60..3600"),
    (lambda t: _variant(t).update(VolumeSizeInGB=1000), "1000 is outside 1..512"),
    (lambda t: _environment(t).update({f"X{i}": "1" for i in range(100)}), "allowed at most 100"),
    (lambda t: _environment(t).update(SM_VLLM_CHAT_TEMPLATE="x" * 1025), "1025 characters; allowed 0..1024"),
    (lambda t: _variant(t).update(RoutingConfig={"RoutingStrategy": "ROUND_ROBIN"}), "RoutingStrategy"),
    (lambda t: _variant(t).pop("VariantName"), "VariantName: required"),
    (lambda t: _variant(t)["ManagedInstanceScaling"]["ScaleInPolicy"].update(Strategy="RELEASE_ALL"),
     "'RELEASE_ALL' is not in"),
    (lambda t: _variant(t)["ManagedInstanceScaling"]["ScaleInPolicy"].update(CooldownInMinutes=2), "2 is outside 5..1440"),
    # The inference component (Dev), read as its Create and Update requests.
    (lambda t: _component(t)["Specification"]["StartupParameters"].update(ModelDataDownloadTimeoutInSeconds=7200),
     "7200 is outside 60..3600"),
    (lambda t: _component(t)["Specification"]["ComputeResourceRequirements"].update(MinMemoryRequiredInMb=64),
     "64 is outside 128.."),
    (lambda t: _component(t)["DeploymentConfig"]["RollingUpdatePolicy"]["MaximumBatchSize"].update(Type="COPIES"),
     "'COPIES' is not in InferenceComponentCapacitySizeType"),
    (lambda t: _component(t)["RuntimeConfig"].update(CopyCount=-1), "-1 is outside 0.."),
    (lambda t: _component(t).update(InferenceComponentName="peagle_dev"), "InferenceComponentName's pattern"),
])
def test_the_judge_catches_what_the_api_would_refuse(templates, break_it, expected):
    """Negative controls: each is a change CloudFormation would send and the SageMaker API would refuse."""
    template = copy.deepcopy(templates["Dev"])
    break_it(template)
    problems = check_template(template)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("break_it", "expected"), [
    (lambda v: v["InstancePools"][1].update(InstanceType="ml.g6e.3xlarge"), "'ml.g6e.3xlarge' is not in"),
    (lambda v: v["InstancePools"][3].update(Priority=6), "6 is outside 1..5"),
    (lambda v: v.update(VariantInstanceProvisionTimeoutInSeconds=120), "120 is outside 300..3600"),
    (lambda v: v["InstancePools"].extend([{"InstanceType": "ml.g6e.8xlarge", "Priority": 5},
                                          {"InstanceType": "ml.g6e.12xlarge", "Priority": 5}]), "6 items; allowed 1..5"),
])
def test_the_judge_reads_prods_capacity_ladder(templates, break_it, expected):
    """Prod's variant names its instance types as a ladder of pools; the judge reads them as the API does."""
    assert "InstanceType" not in _variant(templates["Prod"]) and len(_variant(templates["Prod"])["InstancePools"]) == 4
    template = copy.deepcopy(templates["Prod"])
    break_it(_variant(template))
    problems = check_template(template)
    assert any(expected in p for p in problems), problems


def test_the_construct_catalogue_is_the_apis():
    model = service_model()
    instance_types = set(model.shape_for("ProductionVariantInstanceType").enum)
    ours = {f"ml.{family}.{size}" for family, spec in GPU_FAMILIES.items() for size in spec.gpus_by_size}
    assert ours <= instance_types, sorted(ours - instance_types)
    assert set(INFERENCE_AMI_VERSIONS) <= set(model.shape_for("ProductionVariantInferenceAmiVersion").enum)
    assert set(ROUTING_STRATEGIES) <= set(model.shape_for("RoutingStrategy").enum)
    for shape in ("ProductionVariantContainerStartupHealthCheckTimeoutInSeconds",
                  "ProductionVariantModelDataDownloadTimeoutInSeconds"):
        meta = model.shape_for(shape).metadata
        assert (meta["min"], meta["max"]) == (TIMEOUT_MIN_S, TIMEOUT_MAX_S), shape
    # What a component may reserve, and the bounds of its rolling update and of managed instance scaling.
    compute = model.shape_for("InferenceComponentComputeResourceRequirements").members
    assert (compute["MinMemoryRequiredInMb"].metadata["min"], compute["NumberOfCpuCoresRequired"].metadata["min"],
            compute["NumberOfAcceleratorDevicesRequired"].metadata["min"]) == (MIN_MEMORY_MIB, MIN_CPU_CORES, 1)
    rolling = model.shape_for("InferenceComponentRollingUpdatePolicy").members
    assert rolling["WaitIntervalInSeconds"].metadata["max"] == WAIT_MAX_S
    assert (rolling["MaximumExecutionTimeoutInSeconds"].metadata["min"],
            rolling["MaximumExecutionTimeoutInSeconds"].metadata["max"]) == (EXECUTION_TIMEOUT_MIN_S, EXECUTION_TIMEOUT_MAX_S)
    assert {"COPY_COUNT", "CAPACITY_PERCENT"} == set(model.shape_for("InferenceComponentCapacitySizeType").enum)
    scaling = model.shape_for("ProductionVariantManagedInstanceScaling").members
    assert (scaling["MinInstanceCount"].metadata["min"], scaling["MaxInstanceCount"].metadata["min"]) == (0, 1)
