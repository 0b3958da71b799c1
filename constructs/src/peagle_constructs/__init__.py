"""CDK constructs for serving P-EAGLE (parallel speculative decoding with vLLM) on Amazon SageMaker.

Most users take :class:`PEagleEndpoint` (one model on its fleet) or :class:`PEagleComponentEndpoint` (inference
components: models sharing a fleet that can scale to zero); each piece they are built from is usable alone.
"""

from peagle_contract.capture import CaptureConfig
from peagle_contract.serving import ServingConfig, ServingConfigError

from peagle_constructs.alarm_thresholds import AlarmThresholds
from peagle_constructs.autoscaling import (
    ComponentAutoscaling, EndpointAutoscaling, ScalingMetric, check_floor_above_zero,
)
from peagle_constructs.capture_delivery import CaptureDelivery
from peagle_constructs.drafter_training import DrafterTraining
from peagle_constructs.components import ComputeRequirements, CopyScaling, PEagleComponentEndpoint, PEagleInferenceComponent
from peagle_constructs.deployment import DeploymentPolicy
from peagle_constructs.endpoint_base import EndpointBase
from peagle_constructs.endpoint_config import InstanceScaling, PEagleEndpointConfig, ScaleIn
from peagle_constructs.endpoint_names import check_endpoint_name
from peagle_constructs.errors import ConfigError
from peagle_constructs.image import ContainerImage
from peagle_constructs.inference_endpoint import PEagleInferenceEndpoint
from peagle_constructs.instance_types import GPU_FAMILIES, InstanceType
from peagle_constructs.invocation import invoke_arguments
from peagle_constructs.model import PEagleModel
from peagle_constructs.monitoring import EndpointMonitoring
from peagle_constructs.native_metrics import DetailedObservability, VllmMetricNames
from peagle_constructs.notifications import AlarmSubscriber, AlarmTopic
from peagle_constructs.props import DrafterTrainingProps, FleetProps, InstancePool, ModelProps
from peagle_constructs.security import NAG_PACKS, add_nag_packs
from peagle_constructs.single_model_endpoint import AutoscalingOptions, PEagleEndpoint

__all__ = [
    "add_nag_packs", "AlarmSubscriber", "AlarmThresholds", "AlarmTopic", "AutoscalingOptions", "CaptureConfig",
    "CaptureDelivery",
    "DrafterTraining", "DrafterTrainingProps",
    "check_endpoint_name", "check_floor_above_zero", "ComponentAutoscaling", "ComputeRequirements",
    "ConfigError", "ContainerImage", "CopyScaling", "DeploymentPolicy", "DetailedObservability",
    "EndpointAutoscaling", "EndpointBase", "EndpointMonitoring", "FleetProps", "GPU_FAMILIES", "InstancePool",
    "InstanceScaling", "InstanceType", "invoke_arguments", "ModelProps", "NAG_PACKS", "PEagleComponentEndpoint",
    "PEagleEndpoint", "PEagleEndpointConfig", "PEagleInferenceComponent", "PEagleInferenceEndpoint",
    "PEagleModel", "ScaleIn", "ScalingMetric", "ServingConfig", "ServingConfigError", "VllmMetricNames",
]
