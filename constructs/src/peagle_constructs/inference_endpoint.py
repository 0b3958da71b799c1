"""The bare SageMaker Endpoint (one ``CfnEndpoint``): updated in place (blue/green or rolling), rolled back by alarms.

:class:`PEagleInferenceEndpoint` is the L2-like piece the composites are built from (a model on its own fleet,
:mod:`peagle_constructs.single_model_endpoint`; a fleet of inference components, :mod:`peagle_constructs.components`);
it creates no model, config, log group or alarm of its own.
"""

from __future__ import annotations

from typing import Sequence

from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from peagle_constructs.break_glass import break_glass, mark_break_glass
from peagle_constructs.deployment import DeploymentPolicy, RollbackAlarms
from peagle_constructs.endpoint_base import EndpointBase
from peagle_constructs.endpoint_config import PEagleEndpointConfig
from peagle_constructs.endpoint_names import check_endpoint_name
from peagle_constructs.errors import ConfigError


class PEagleInferenceEndpoint(EndpointBase):
    """A real-time endpoint with a known name (its log group and alarms are named from it).

    Keep this construct's id and place stable: its CloudFormation logical id derives from them, and a new
    logical id replaces the endpoint (downtime). RetainAllVariantProperties is on, so an update keeps the
    instance count autoscaling set: the endpoint config's ``instance_count`` is the count at creation only,
    and changing it later does not resize a running endpoint (change the autoscaling bounds instead).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint_config: PEagleEndpointConfig,
        endpoint_name: str,
        deployment: DeploymentPolicy | None = None,
        rollback_alarms: Sequence[cloudwatch.IAlarm] = (),
    ) -> None:
        super().__init__(scope, id, endpoint_name=check_endpoint_name(endpoint_name),
                         variant_name=endpoint_config.variant_name)
        # A fleet of inference components has no model of its own to shift traffic to: each component rolls
        # out by itself, with its own rollback alarms (peagle_constructs.components).
        self.hosts_components = endpoint_config.instance_scaling is not None
        if self.hosts_components and (deployment is not None or rollback_alarms):
            raise ConfigError("deployment", "not allowed on an endpoint that hosts inference components; allowed: "
                              "None (give each component its rolling DeploymentPolicy)")
        self.deployment = deployment or DeploymentPolicy.all_at_once()
        self.deployment.validate(instance_count=endpoint_config.instance_count)
        self.instance_count = endpoint_config.instance_count
        self._rollback = RollbackAlarms(rollback_alarms)
        self.cfn_endpoint = sagemaker.CfnEndpoint(
            self, "Resource",
            endpoint_name=self.endpoint_name,
            endpoint_config_name=endpoint_config.endpoint_config_name,
            retain_all_variant_properties=True,
            deployment_config=None if self.hosts_components else self._render_deployment(),
        )
        if not self.hosts_components:
            mark_break_glass(self.cfn_endpoint)  # a hotfix deployed without rollback says so on the resource

    def add_rollback_alarm(self, alarm: cloudwatch.IAlarm) -> None:
        if self.hosts_components:
            raise ConfigError("rollback_alarms", "not allowed on an endpoint that hosts inference components; "
                              "allowed: the component's own (PEagleInferenceComponent.add_rollback_alarm)")
        self._rollback.add(alarm)
        self.cfn_endpoint.deployment_config = self._render_deployment()

    @property
    def rollback_alarms(self) -> tuple[cloudwatch.IAlarm, ...]:
        return tuple(self._rollback)

    def grant_rollback_reads(self, policy: iam.ManagedPolicy) -> None:
        """Let the roles of ``policy`` (the execution roles of the models this endpoint serves) read the rollback
        alarms, as SageMaker's guardrails do when they judge a rollout; alarms added later are included."""
        self._rollback.grant_read(policy)

    def _render_deployment(self) -> sagemaker.CfnEndpoint.DeploymentConfigProperty:
        policy = self.deployment
        Size = sagemaker.CfnEndpoint.CapacitySizeProperty
        rollback = None
        if self._rollback and break_glass(self) is None:
            rollback = sagemaker.CfnEndpoint.AutoRollbackConfigProperty(alarms=[
                sagemaker.CfnEndpoint.AlarmProperty(alarm_name=alarm.alarm_name) for alarm in self._rollback
            ])
        timeout = policy.maximum_execution_seconds(self.instance_count)
        if policy.is_rolling:
            return sagemaker.CfnEndpoint.DeploymentConfigProperty(
                rolling_update_policy=sagemaker.CfnEndpoint.RollingUpdatePolicyProperty(
                    maximum_batch_size=Size(type=policy.size_unit, value=policy.size),
                    wait_interval_in_seconds=int(policy.bake.to_seconds()),
                    maximum_execution_timeout_in_seconds=timeout,
                    rollback_maximum_batch_size=(Size(type=policy.rollback_size_unit, value=policy.rollback_size)
                                                 if policy.rollback_size is not None else None),
                ),
                auto_rollback_configuration=rollback,
            )
        sized = Size(type=policy.size_unit, value=policy.size) if policy.mode in ("CANARY", "LINEAR") else None
        routing = sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
            type=policy.mode,
            wait_interval_in_seconds=int(policy.bake.to_seconds()),
            canary_size=sized if policy.mode == "CANARY" else None,
            linear_step_size=sized if policy.mode == "LINEAR" else None,
        )
        return sagemaker.CfnEndpoint.DeploymentConfigProperty(
            blue_green_update_policy=sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty(
                traffic_routing_configuration=routing,
                termination_wait_in_seconds=int(policy.termination_wait.to_seconds()),
                maximum_execution_timeout_in_seconds=timeout,
            ),
            auto_rollback_configuration=rollback,
        )
