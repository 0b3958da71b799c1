"""The SageMaker Model: the serving image, the P-EAGLE environment, the weights, a least-privilege role."""

from __future__ import annotations

import re
from typing import Mapping

from aws_cdk import Aws, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from peagle_contract.serving import ServingConfig, ServingConfigError, check_environment_limits, is_s3_uri

from peagle_constructs import security
from peagle_constructs.deployment import retain_when_replaced
from peagle_constructs.errors import ConfigError
from peagle_constructs.image import BoundImage, ContainerImage
from peagle_constructs.sagemaker_names import ENDPOINT_LOG_GROUP_PREFIX, ENDPOINT_METRICS_NAMESPACE
from peagle_constructs.validation import is_unresolved
from peagle_constructs.weights import WeightsLayout, read_prefix_statements

_ACCOUNT = re.compile(r"^\d{12}$")


class PEagleModel(Construct):
    """A SageMaker Model serving ``serving`` from ``image``; no physical name (CloudFormation replaces it).

    The execution role may read exactly the weight prefix SageMaker copies, pull from exactly the image's
    repository, write to exactly ``log_group`` (or, when none is given, to endpoint log groups), and decrypt
    with exactly ``weights_key`` when the weights are encrypted with a customer key. ``role``: an existing
    role to grant that to (a fleet's shared one) instead of a role of the model's own. Bucket names are global:
    the weights are read only from a bucket ``weights_account`` owns (default: the stack's own account).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        serving: ServingConfig,
        image: ContainerImage,
        network_isolation: bool = True,
        log_group: logs.ILogGroup | None = None,
        weights_key: kms.IKey | None = None,
        environment: Mapping[str, str] | None = None,
        role: iam.IRole | None = None,
        weights_account: str | None = None,
    ) -> None:
        super().__init__(scope, id)
        if not isinstance(serving, ServingConfig):
            raise ConfigError("serving", f"got {type(serving).__name__}; allowed: a peagle_contract ServingConfig")
        if network_isolation and not serving.weights_in_s3:
            field, value = next((n, v) for n, v in (("target_model", serving.target_model),
                                                    ("drafter_model", serving.drafter_model)) if not is_s3_uri(v))
            raise ConfigError(
                f"serving.{field}",
                f"got {value!r}, a Hugging Face id, with network_isolation=True; allowed: an S3 prefix "
                "'s3://bucket/prefix/' of uncompressed weights, or network_isolation=False to download from the hub",
            )
        for key in environment or {}:
            if key.startswith("SM_VLLM_"):
                raise ConfigError(f"environment[{key!r}]", "not allowed: vLLM flags belong in ServingConfig.extra_args")

        self.serving = serving
        self.layout = WeightsLayout.of(serving)
        self.weights_account = weights_account if weights_account is not None else Stack.of(self).account
        if not is_unresolved(self.weights_account) and not _ACCOUNT.match(str(self.weights_account)):
            raise ConfigError("weights_account", f"got {str(weights_account)[:40]!r}; allowed: the 12-digit id of the "
                              "account that owns the weights bucket (default: the stack's account)")
        self.environment: dict[str, str] = {
            **self.layout.environment(serving),
            **(environment or {}),
        }
        try:
            check_environment_limits(self.environment, "environment")
        except ServingConfigError as exc:
            raise ConfigError(exc.field_name, str(exc).split(": ", 1)[1]) from None

        # A fleet of inference components hosts every model with its endpoint config's one role: the fleet
        # passes it, and each model's policy below adds what that model needs.
        self.role = role or iam.Role(
            self, "ExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="P-EAGLE model execution role: exact weights, image repository and log group only",
        )
        self.image: BoundImage = image.bind(self)
        self.policy = iam.ManagedPolicy(
            self, "ExecutionPolicy", roles=[self.role], statements=self._statements(log_group, weights_key)
        )

        container: dict = {"image": self.image.image_uri, "mode": "SingleModel", "environment": self.environment}
        if self.layout.source is not None:
            container["model_data_source"] = sagemaker.CfnModel.ModelDataSourceProperty(
                s3_data_source=sagemaker.CfnModel.S3DataSourceProperty(
                    s3_uri=self.layout.source.uri, s3_data_type="S3Prefix", compression_type="None"
                )
            )
        self.cfn_model = sagemaker.CfnModel(
            self, "Resource",
            execution_role_arn=self.role.role_arn,
            enable_network_isolation=network_isolation,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(**container),
        )
        # SageMaker checks image and weights access at CreateModel: the policy must be attached first.
        self.cfn_model.node.add_dependency(self.policy)
        retain_when_replaced(self.cfn_model)
        self.model_name: str = self.cfn_model.attr_model_name
        security.acknowledge_execution_policy(
            self.policy, weight_prefixes=[(p.bucket, p.key_prefix) for p in self.layout.prefixes],
            log_group_given=log_group is not None)

    def _statements(self, log_group: logs.ILogGroup | None, weights_key: kms.IKey | None) -> list[iam.PolicyStatement]:
        statements = read_prefix_statements(self.layout.prefixes, account=self.weights_account)
        statements += self.image.pull_statements()
        log_group_arn = (log_group.log_group_arn if log_group is not None else
                         f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:{ENDPOINT_LOG_GROUP_PREFIX}*")
        # The four actions SageMaker lists for a hosting execution role. The group exists before the endpoint
        # (CloudFormation creates it first), so CreateLogGroup can only meet that group: kept because AWS does
        # not document that the hosting agent tolerates being refused it.
        statements.append(iam.PolicyStatement(
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[log_group_arn],
        ))
        statements.append(iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": ENDPOINT_METRICS_NAMESPACE}},
        ))
        if weights_key is not None:
            statements.append(iam.PolicyStatement(actions=["kms:Decrypt"], resources=[weights_key.key_arn]))
        return statements
