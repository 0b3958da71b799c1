"""The SageMaker Endpoint: updated in place (blue/green) and rolled back by alarms."""

from __future__ import annotations

import re
from typing import Sequence

from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import Stack
from constructs import Construct

from peagle_constructs.deployment import MAX_ROLLBACK_ALARMS, DeploymentPolicy
from peagle_constructs.endpoint_config import PEagleEndpointConfig
from peagle_constructs.errors import ConfigError

_ENDPOINT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def check_endpoint_name(name: object, field_name: str = "endpoint_name") -> str:
    if not isinstance(name, str) or not _ENDPOINT_NAME.match(name):
        raise ConfigError(field_name, f"got {name!r}; allowed: 1-63 letters, digits and hyphens, "
                          "starting and ending with a letter or digit")
    return name


class PEagleInferenceEndpoint(Construct):
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
        super().__init__(scope, id)
        self.endpoint_name = check_endpoint_name(endpoint_name)
        self.deployment = deployment or DeploymentPolicy.all_at_once()
        self.deployment.validate(instance_count=endpoint_config.instance_count)
        self.variant_name = endpoint_config.variant_name
        self.instance_count = endpoint_config.instance_count
        self._rollback_alarms: list[cloudwatch.IAlarm] = []
        for alarm in rollback_alarms:
            self._add(alarm)
        self.cfn_endpoint = sagemaker.CfnEndpoint(
            self, "Resource",
            endpoint_name=self.endpoint_name,
            endpoint_config_name=endpoint_config.endpoint_config_name,
            retain_all_variant_properties=True,
            deployment_config=self._render_deployment(),
        )
        # SageMaker lower-cases endpoint names in ARNs.
        self.endpoint_arn = Stack.of(self).format_arn(
            service="sagemaker", resource="endpoint", resource_name=self.endpoint_name.lower()
        )

    def add_rollback_alarm(self, alarm: cloudwatch.IAlarm) -> None:
        self._add(alarm)
        self.cfn_endpoint.deployment_config = self._render_deployment()

    def _add(self, alarm: cloudwatch.IAlarm) -> None:
        if len(self._rollback_alarms) >= MAX_ROLLBACK_ALARMS:
            raise ConfigError("rollback_alarms", f"got a {len(self._rollback_alarms) + 1}th alarm; allowed: at most "
                              f"{MAX_ROLLBACK_ALARMS} (SageMaker's AutoRollbackConfig)")
        self._rollback_alarms.append(alarm)

    @property
    def rollback_alarms(self) -> tuple[cloudwatch.IAlarm, ...]:
        return tuple(self._rollback_alarms)

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"],
            resource_arns=[self.endpoint_arn],
        )

    def _render_deployment(self) -> sagemaker.CfnEndpoint.DeploymentConfigProperty:
        policy = self.deployment
        Size = sagemaker.CfnEndpoint.CapacitySizeProperty
        rollback = None
        if self._rollback_alarms:
            rollback = sagemaker.CfnEndpoint.AutoRollbackConfigProperty(alarms=[
                sagemaker.CfnEndpoint.AlarmProperty(alarm_name=alarm.alarm_name) for alarm in self._rollback_alarms
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
