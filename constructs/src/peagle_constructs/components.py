"""Inference components: P-EAGLE models that share a fleet, and a fleet that costs nothing when idle.

SageMaker scales an endpoint to zero instances only when it hosts inference components. Here the fleet
(:class:`PEagleComponentEndpoint`) is an endpoint whose variant names no model and scales its instances
itself (managed instance scaling, minimum 0 allowed); each model on it is a :class:`PEagleInferenceComponent`
with its compute reservation, startup timeouts, vLLM's /metrics for detailed observability, a copy count,
copy autoscaling that can go to zero and come back, a rolling update rolled back by its own alarms, and its
own monitoring (request-line metrics, alarms, dashboard), as a single-model endpoint has.

A copy reserves accelerators, host memory and CPU cores on one instance. Left to the defaults, a copy takes
``tensor_parallel_size`` GPUs and the same share of the instance's memory and cores, less
:data:`HOST_HEADROOM` left to SageMaker's agents and the OS (AWS does not say how much they need).

Waking up: with no copy, a request fails at once (SageMaker answers it with a ValidationError, "Inference
Component has no capacity to process this request") and counts in ``NoCapacityInvocationFailures``; the
wake-up alarm adds a copy, the fleet starts an instance for it when it has none, and the model loads:
for a 20B model, about 10-15 minutes until requests are served again. Clients retry until then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from aws_cdk import CfnOutput, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from peagle_constructs import security
from peagle_constructs.autoscaling import ComponentAutoscaling, check_floor_above_zero
from peagle_constructs.break_glass import break_glass, mark_break_glass
from peagle_constructs.deployment import DeploymentPolicy, RollbackAlarms
from peagle_constructs.endpoint_base import EndpointBase
from peagle_constructs.endpoint_config import InstanceScaling, PEagleEndpointConfig
from peagle_constructs.endpoint_names import check_component_name, endpoint_name_for
from peagle_constructs.errors import ConfigError
from peagle_constructs.image import ContainerImage
from peagle_constructs.inference_endpoint import PEagleInferenceEndpoint
from peagle_constructs.instance_types import InstanceType
from peagle_constructs.log_groups import encrypted_log_group
from peagle_constructs.model import PEagleModel
from peagle_constructs.monitoring import EndpointMonitoring
from peagle_constructs.props import FleetProps, ModelProps
from peagle_constructs.sagemaker_names import (
    COMPONENT_METRICS_NAMESPACE, DEFAULT_VARIANT_NAME, ENDPOINT_LOG_GROUP_PREFIX, ENDPOINT_METRICS_NAMESPACE,
)
from peagle_constructs.security import limit_grants_to_aws_services
from peagle_constructs.validation import check_int, check_number, check_order, check_type, is_unresolved

# The share of each copy's slice of host memory and cores that the defaults leave unreserved.
HOST_HEADROOM = 0.2
# vLLM serves its Prometheus metrics here, on the port SageMaker sends requests to (8080).
VLLM_METRICS_PATH = "/metrics"
# The least a copy may reserve (CreateInferenceComponent's limits).
MIN_MEMORY_MIB, MIN_CPU_CORES = 128, 0.25


@dataclass(frozen=True, kw_only=True)
class ComputeRequirements:
    """What one copy reserves on an instance; None: derived from the serving config and the instance type."""

    accelerators: int | None = None  # GPUs; default: the serving config's tensor_parallel_size
    memory_mib: int | None = None  # host memory; default: the copy's share, less HOST_HEADROOM
    cpu_cores: float | None = None  # default: the copy's share of the vCPUs, less HOST_HEADROOM

    def resolve(self, *, tensor_parallel_size: int, instance: InstanceType) -> "ComputeRequirements":
        """The reservation with every default filled in, checked against what ``instance`` holds."""
        gpus = instance.gpu_count
        if self.accelerators is None and tensor_parallel_size > gpus:
            raise ConfigError("serving.tensor_parallel_size", f"got {tensor_parallel_size} but {instance.name} has "
                              f"{gpus} GPU(s); allowed: at most that many")
        accelerators = tensor_parallel_size if self.accelerators is None else self.accelerators
        check_int(accelerators, "compute.accelerators", 1, gpus, allowed=f"1..{gpus} (the GPUs of one {instance.name})")
        if accelerators < tensor_parallel_size:
            raise ConfigError("compute.accelerators", f"got {accelerators}, but serving.tensor_parallel_size is "
                              f"{tensor_parallel_size}; allowed: at least that many (vLLM shards over them)")
        share = accelerators / gpus * (1 - HOST_HEADROOM)
        memory = int(instance.memory_mib * share) if self.memory_mib is None else self.memory_mib
        check_int(memory, "compute.memory_mib", MIN_MEMORY_MIB, instance.memory_mib,
                  allowed=f"{MIN_MEMORY_MIB}..{instance.memory_mib} MiB (the memory of one {instance.name})")
        cores = max(1.0, float(math.floor(instance.vcpus * share))) if self.cpu_cores is None else self.cpu_cores
        check_number(cores, "compute.cpu_cores", low=MIN_CPU_CORES, high=instance.vcpus,
                     allowed=f"{MIN_CPU_CORES}..{instance.vcpus} (the vCPUs of one {instance.name})")
        return ComputeRequirements(accelerators=accelerators, memory_mib=memory, cpu_cores=float(cores))

    def copies_per_instance(self, instance: InstanceType) -> int:
        """How many copies of a resolved reservation one instance holds."""
        assert self.accelerators and self.memory_mib and self.cpu_cores, "resolve() first"
        return min(instance.gpu_count // self.accelerators, instance.memory_mib // self.memory_mib,
                   int(instance.vcpus // self.cpu_cores))

    def render(self) -> sagemaker.CfnInferenceComponent.InferenceComponentComputeResourceRequirementsProperty:
        return sagemaker.CfnInferenceComponent.InferenceComponentComputeResourceRequirementsProperty(
            number_of_accelerator_devices_required=self.accelerators, min_memory_required_in_mb=self.memory_mib,
            number_of_cpu_cores_required=self.cpu_cores)


@dataclass(frozen=True, kw_only=True)
class CopyScaling:
    """Copy-count autoscaling of a component. ``max_copies`` None: as many as the fleet at its largest holds."""

    min_copies: int = 1
    max_copies: int | None = None
    target_concurrent_requests_per_copy: float = 16.0
    scale_in_cooldown: Duration = Duration.minutes(15)
    scale_out_cooldown: Duration = Duration.minutes(2)
    wake_up_cooldown: Duration = Duration.minutes(10)


class PEagleComponentEndpoint(EndpointBase):
    """A SageMaker endpoint whose fleet hosts P-EAGLE inference components; add them with :meth:`add_component`.

    The fleet (``fleet``, :class:`FleetProps`) scales its instances between ``instance_scaling``'s bounds
    (minimum 0: an idle fleet has no instance at all); ``fleet.instance_count`` is the fleet at creation.
    ``allow_scale_to_zero`` False makes a component with no copy floor an error (an environment that must
    answer its first request at once). One KMS key (rotation on) encrypts the volume (EBS-backed families
    only), the endpoint's log group and each component's log group and alarm topic; one role hosts every
    component (the endpoint config's execution role), each model adding what it needs.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        fleet: FleetProps,
        instance_scaling: InstanceScaling = InstanceScaling(),
        allow_scale_to_zero: bool = True,
        endpoint_name: str | None = None,
    ) -> None:
        check_type(fleet, "fleet", FleetProps, "a FleetProps")
        if fleet.fallback_instances:
            # A copy's reservation is checked against one instance type; a ladder would need it per pool.
            raise ConfigError("fallback_instances", "not supported on a fleet of inference components; allowed: ()")
        check_type(instance_scaling, "instance_scaling", InstanceScaling, "an InstanceScaling")
        if not allow_scale_to_zero:
            check_floor_above_zero(instance_scaling.min_instances, "instance_scaling.min_instances")
        super().__init__(scope, id, endpoint_name=endpoint_name_for(scope, id, endpoint_name),
                         variant_name=DEFAULT_VARIANT_NAME)
        self.fleet = fleet
        self.instance_type = fleet.instance
        self.instance_scaling = instance_scaling
        self.allow_scale_to_zero = allow_scale_to_zero

        self.key = limit_grants_to_aws_services(kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=fleet.removal_policy,
            description=f"P-EAGLE endpoint {self.endpoint_name}: storage volume, logs and its components' logs "
                        "and alarm topics"))
        self.role = iam.Role(
            self, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="P-EAGLE fleet execution role: each component's weights, image and log group, the fleet's logs",
        )
        # Whatever SageMaker logs for the fleet itself lands in a group that is ours (encrypted, retained).
        self.log_group = encrypted_log_group(self, "LogGroup", f"{ENDPOINT_LOG_GROUP_PREFIX}{self.endpoint_name}",
                                             key=self.key, retention=fleet.log_retention,
                                             removal_policy=fleet.removal_policy)
        self.policy = iam.ManagedPolicy(self, "ExecutionPolicy", roles=[self.role], statements=[
            iam.PolicyStatement(actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                                         "logs:DescribeLogStreams"], resources=[self.log_group.log_group_arn]),
            iam.PolicyStatement(actions=["cloudwatch:PutMetricData"], resources=["*"], conditions={"StringEquals": {
                "cloudwatch:namespace": [ENDPOINT_METRICS_NAMESPACE, COMPONENT_METRICS_NAMESPACE]}}),
        ])
        security.acknowledge_fleet_policy(self.policy)
        self.endpoint_config = PEagleEndpointConfig.for_components(
            self, "EndpointConfig", fleet=fleet, variant_name=self.variant_name, instance_scaling=instance_scaling,
            execution_role=self.role, encryption_key=self.key if fleet.volume_encrypted else None,
        )
        self.endpoint_config.cfn_endpoint_config.node.add_dependency(self.policy)
        self.endpoint = PEagleInferenceEndpoint(self, "Endpoint", endpoint_config=self.endpoint_config,
                                                endpoint_name=self.endpoint_name)
        self.endpoint.cfn_endpoint.node.add_dependency(self.log_group)
        self.components: dict[str, PEagleInferenceComponent] = {}  # by component name

    @property
    def cfn_endpoint(self) -> sagemaker.CfnEndpoint:
        return self.endpoint.cfn_endpoint

    def add_component(self, id: str, *, model: ModelProps, image: ContainerImage, component_name: str | None = None,
                      copy_count: int = 1, compute: ComputeRequirements = ComputeRequirements(),
                      scaling: CopyScaling | None = CopyScaling(), deployment: DeploymentPolicy | None = None,
                      weights_key: kms.IKey | None = None) -> "PEagleInferenceComponent":
        """A :class:`PEagleInferenceComponent` on this fleet."""
        return PEagleInferenceComponent(
            self, id, endpoint=self, model=model, image=image, component_name=component_name, copy_count=copy_count,
            compute=compute, scaling=scaling, deployment=deployment, weights_key=weights_key)


class PEagleInferenceComponent(Construct):
    """One P-EAGLE model on a :class:`PEagleComponentEndpoint`'s fleet.

    ``copy_count`` copies at creation (the autoscaling then owns the count); ``compute`` what each copy
    reserves; ``scaling`` the copy autoscaling (None: a fixed count); ``deployment`` a rolling policy
    (``DeploymentPolicy.rolling(copies=...)``, default one copy at a time, 10 minutes' bake), rolled back by
    the component's 5xx-rate and engine-clock TPOT alarms (the signals no client moves at will; the others page,
    peagle_constructs.rollback_signals). ``component_name`` defaults to
    ``<endpoint name>-<id>``, lower-cased: clients name it in every request (``InferenceComponentName``;
    :func:`peagle_constructs.invoke_arguments` builds the boto3 call, :meth:`add_name_output` makes it a stack
    output).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint: PEagleComponentEndpoint,
        model: ModelProps,
        image: ContainerImage,
        component_name: str | None = None,
        copy_count: int = 1,
        compute: ComputeRequirements = ComputeRequirements(),
        scaling: CopyScaling | None = CopyScaling(),
        deployment: DeploymentPolicy | None = None,
        weights_key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_type(model, "model", ModelProps, "a ModelProps")
        model.check_on(endpoint.fleet.instance_type)
        serving = model.serving
        self.endpoint = endpoint
        self.component_name = self.inference_component_name = name = _component_name(endpoint, id, component_name)
        self.compute = compute.resolve(tensor_parallel_size=serving.tensor_parallel_size,
                                       instance=endpoint.instance_type)
        max_copies = _check_copies(endpoint, self.compute, copy_count, scaling)
        self.copy_count = copy_count
        self.deployment = deployment or DeploymentPolicy.rolling(copies=1)
        check_type(self.deployment, "deployment", DeploymentPolicy, "DeploymentPolicy.rolling(copies=...)")
        self.deployment.validate(instance_count=max(copy_count, 1), copies=True)

        self.monitoring = EndpointMonitoring(
            self, "Monitoring", endpoint_name=endpoint.endpoint_name, variant_name=endpoint.variant_name,
            component_name=name, model=model, fleet=endpoint.fleet,
            # The fleet's one key encrypts the component's logs and alarm topic too.
            encryption_key=endpoint.key,
        )
        self.model = PEagleModel(
            self, "Model", serving=serving, image=image, network_isolation=model.network_isolation,
            log_group=self.monitoring.log_group, weights_key=weights_key, environment=model.environment,
            role=endpoint.role, weights_account=model.weights_account,
        )
        self._rollback = RollbackAlarms(self.monitoring.rollback_alarms)
        # The fleet's role runs the copies, so it is the role SageMaker's guardrails judge this rollout as.
        self._rollback.grant_read(self.model.policy)
        self.cfn_inference_component = sagemaker.CfnInferenceComponent(
            self, "Resource",
            inference_component_name=name,
            endpoint_name=endpoint.endpoint_name,
            variant_name=endpoint.variant_name,
            specification=self._render_specification(),
            runtime_config=sagemaker.CfnInferenceComponent.InferenceComponentRuntimeConfigProperty(copy_count=copy_count),
            deployment_config=self._render_deployment(),
        )
        mark_break_glass(self.cfn_inference_component)  # a hotfix deployed without rollback says so on the resource
        # The endpoint must be InService and the model's log group in place before a copy starts.
        self.cfn_inference_component.node.add_dependency(endpoint.cfn_endpoint)
        self.cfn_inference_component.node.add_dependency(self.monitoring.log_group)

        self.autoscaling: ComponentAutoscaling | None = None
        if scaling is not None:
            self.autoscaling = ComponentAutoscaling(
                self, "Autoscaling", component_name=name, min_copies=scaling.min_copies, max_copies=max_copies,
                allow_zero=endpoint.allow_scale_to_zero,
                target_concurrent_requests_per_copy=scaling.target_concurrent_requests_per_copy,
                scale_in_cooldown=scaling.scale_in_cooldown, scale_out_cooldown=scaling.scale_out_cooldown,
                wake_up_cooldown=scaling.wake_up_cooldown,
            )
            self.autoscaling.scalable_target.node.add_dependency(self.cfn_inference_component)
        endpoint.components[name] = self

    def add_name_output(self, id: str = "InferenceComponentName", *,
                        export_name: str | None = None) -> CfnOutput:
        """The component's name as a stack output (in this component's scope), for the clients that must send
        it as ``InferenceComponentName`` in every request (:func:`peagle_constructs.invoke_arguments`). Only
        on request: an output added by default would change every existing stack's template."""
        return CfnOutput(self, id, value=self.component_name, export_name=export_name,
                         description=f"name it in every request to endpoint {self.endpoint.endpoint_name} "
                                     "(InferenceComponentName)")

    def add_rollback_alarm(self, alarm: cloudwatch.IAlarm) -> None:
        self._rollback.add(alarm)
        self.cfn_inference_component.deployment_config = self._render_deployment()

    @property
    def rollback_alarms(self) -> tuple[cloudwatch.IAlarm, ...]:
        return tuple(self._rollback)

    @property
    def alarms(self) -> Mapping[str, cloudwatch.IAlarm]:
        return self.monitoring.alarms

    @property
    def log_group(self) -> logs.LogGroup:
        return self.monitoring.log_group

    def _render_specification(self) -> sagemaker.CfnInferenceComponent.InferenceComponentSpecificationProperty:
        fleet = self.endpoint.fleet
        startup, download = fleet.startup_seconds()
        Spec = sagemaker.CfnInferenceComponent
        return Spec.InferenceComponentSpecificationProperty(
            model_name=self.model.model_name,
            compute_resource_requirements=self.compute.render(),
            startup_parameters=Spec.InferenceComponentStartupParametersProperty(
                container_startup_health_check_timeout_in_seconds=startup,
                model_data_download_timeout_in_seconds=download),
            container=Spec.InferenceComponentContainerSpecificationProperty(
                container_metrics_config=Spec.ContainerMetricsConfigProperty(metrics_endpoints=[
                    Spec.MetricsEndpointProperty(
                        metrics_endpoint_path=VLLM_METRICS_PATH,
                        metric_publish_frequency_in_seconds=int(
                            fleet.detailed_observability.publish_frequency.to_seconds()))])),
        )

    def _render_deployment(self) -> sagemaker.CfnInferenceComponent.InferenceComponentDeploymentConfigProperty:
        policy = self.deployment
        Size = sagemaker.CfnInferenceComponent.InferenceComponentCapacitySizeProperty
        return sagemaker.CfnInferenceComponent.InferenceComponentDeploymentConfigProperty(
            rolling_update_policy=sagemaker.CfnInferenceComponent.InferenceComponentRollingUpdatePolicyProperty(
                maximum_batch_size=Size(type=policy.size_unit, value=policy.size),
                wait_interval_in_seconds=int(policy.bake.to_seconds()),
                maximum_execution_timeout_in_seconds=policy.maximum_execution_seconds(max(self.copy_count, 1)),
                rollback_maximum_batch_size=(Size(type=policy.rollback_size_unit, value=policy.rollback_size)
                                             if policy.rollback_size is not None else None),
            ),
            auto_rollback_configuration=sagemaker.CfnInferenceComponent.AutoRollbackConfigurationProperty(alarms=[
                sagemaker.CfnInferenceComponent.AlarmProperty(alarm_name=alarm.alarm_name)
                for alarm in self._rollback]) if self._rollback and break_glass(self) is None else None,
        )


def _component_name(endpoint: PEagleComponentEndpoint, id: str, given: str | None) -> str:
    """``given`` checked, or ``<endpoint name>-<id>`` lower-cased; unique on the fleet."""
    name = check_component_name(given if given is not None
                                else f"{endpoint.endpoint_name}-{id}".lower()[:63].rstrip("-"))
    if name in endpoint.components:
        raise ConfigError("component_name", f"got {name!r}, already on this endpoint; allowed: a name of its own")
    return name


def _check_copies(endpoint: PEagleComponentEndpoint, compute: ComputeRequirements, copy_count: object,
                  scaling: CopyScaling | None) -> int | None:
    """The copy count and copy scaling checked against what the fleet holds at its largest; returns the copy
    scaling's maximum (None: no copy scaling)."""
    instance, most_instances = endpoint.instance_type, endpoint.instance_scaling.max_instances
    per_instance = compute.copies_per_instance(instance)
    if per_instance < 1:
        raise ConfigError("compute", f"one copy reserves {compute.accelerators} GPU(s), {compute.memory_mib} MiB "
                          f"and {compute.cpu_cores:g} cores, more than one {instance.name} holds "
                          f"({instance.gpu_count} GPU(s), {instance.memory_mib} MiB, {instance.vcpus} vCPUs); "
                          "allowed: a reservation that fits one instance")
    capacity = per_instance * most_instances
    held = f"{per_instance} per {instance.name} x at most {most_instances} instances"
    # SageMaker creates a component with at least one copy; its autoscaling may take it to zero afterwards.
    check_int(copy_count, "copy_count", 1, capacity, allowed=f"1..{capacity} ({held}); a component starts with "
              "a copy and scales in to zero by itself")
    if scaling is None:
        return None
    check_type(scaling, "scaling", CopyScaling, "a CopyScaling, or None for a fixed count")
    check_int(scaling.min_copies, "scaling.min_copies", 0, 100)
    max_copies = capacity if scaling.max_copies is None else scaling.max_copies
    check_order(scaling.min_copies, max_copies, "scaling.min_copies", "scaling.max_copies")
    check_int(max_copies, "scaling.max_copies", 1, capacity,
              allowed=f"at most {capacity}, the copies the fleet holds at its largest ({held})")
    known = not any(is_unresolved(v) for v in (scaling.min_copies, copy_count, max_copies))
    if known and not scaling.min_copies <= copy_count <= max_copies:
        raise ConfigError("copy_count", f"got {copy_count}; allowed: within scaling.min_copies..max_copies "
                          f"({scaling.min_copies}..{max_copies})")
    return max_copies
