"""Security in one place: the cdk-nag packs we hold every stack to, and every acknowledged finding.

cdk-nag 3 is a policy-validation plugin (``Validations.of(app).add_plugins``), not an Aspect. Each
acknowledgement names ONE finding (``RuleId[FindingId]``; v3 has no prefix matching) on the construct
that raises it, with the reason it is acceptable. Nothing else in the library or the stacks acknowledges
findings: read this file to review what the stacks are allowed to break and why.
"""

from __future__ import annotations

from typing import Callable, Sequence

from aws_cdk import Acknowledgment, Validations
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NagPack, NIST80053R5Checks, PCIDSS321Checks
from constructs import IConstruct

from peagle_constructs.sagemaker_names import ENDPOINT_LOG_GROUP_PREFIX

NAG_PACKS: tuple[Callable[..., NagPack], ...] = (
    AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks, PCIDSS321Checks,
)


def add_nag_packs(scope: IConstruct) -> list[NagPack]:
    """Register every pack on ``scope``, a Stage or App: ``cdk synth`` then fails on any open finding.

    CDK runs a plugin on the stacks of the Stage it is registered on (not on nested Stages).
    """
    packs = [pack(scope) for pack in NAG_PACKS]
    Validations.of(scope).add_plugins(*packs)
    return packs


def _acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=finding, reason=reason))


def _resource_finding(rule: str, resource: str) -> str:
    return f"{rule}[Resource::{resource}]"


# -- the model's execution role ---------------------------------------------------------------------

_ECR_TOKEN = ("ecr:GetAuthorizationToken has no resource-level permissions (AWS service authorization "
              "reference); it only issues a registry login, pulls stay limited to the image's one repository")
_PUT_METRIC = ("cloudwatch:PutMetricData (in SageMaker's list of execution-role permissions for hosting) has no "
               "resource-level permissions; a condition pins it to the /aws/sagemaker/Endpoints namespace")
_WEIGHTS = ("read-only access below the exact weight prefix SageMaker copies into /opt/ml/model; object keys are "
            "not known at synth time, so the objects are named by prefix")
_ANY_ENDPOINT_LOGS = ("no log group was given to the model, so it may write to SageMaker endpoint log groups "
                      "(/aws/sagemaker/Endpoints/*) only; pass log_group to narrow it to one")


def acknowledge_execution_policy(policy: IConstruct, *, weight_prefixes: Sequence[tuple[str, str]],
                                 log_group_given: bool) -> None:
    """The model execution policy's remaining wildcards, each one named.

    ``weight_prefixes`` are the (bucket, key prefix) pairs the policy reads weights from.
    """
    rule = "AwsSolutions-IAM5"  # the only pack with a wildcard rule; the others pass this policy as is
    _acknowledge(policy, _resource_finding(rule, "*"), f"{_ECR_TOKEN}; {_PUT_METRIC}")
    for bucket, key_prefix in weight_prefixes:
        _acknowledge(policy, _resource_finding(rule, f"arn:<AWS::Partition>:s3:::{bucket}/{key_prefix}*"), _WEIGHTS)
    # With a log group given, its ARN is a GetAtt (no wildcard visible at synth): nothing to acknowledge.
    if not log_group_given:
        _acknowledge(policy, _resource_finding(
            rule, f"arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{ENDPOINT_LOG_GROUP_PREFIX}*"),
            _ANY_ENDPOINT_LOGS)


def acknowledge_fleet_policy(policy: IConstruct) -> None:
    """A fleet of inference components: its role's own policy (fleet logs, metrics) has one wildcard."""
    _acknowledge(policy, _resource_finding("AwsSolutions-IAM5", "*"), _PUT_METRIC.replace(
        "the /aws/sagemaker/Endpoints namespace", "SageMaker's endpoint and inference-component namespaces"))


# -- the endpoint config on local-NVMe instances ----------------------------------------------------

_NVME = ("{instance_type} has local NVMe instance storage, encrypted at rest by the instance hardware; SageMaker "
         "rejects a KmsKeyId for such instance types (CreateEndpointConfig fails), so no customer key can be set")
NVME_FINDINGS: tuple[str, ...] = (
    "HIPAA.Security-SageMakerEndpointConfigurationKMSKeyConfigured",
    "NIST.800.53.R5-SageMakerEndpointConfigurationKMSKeyConfigured",
    "PCI.DSS.321-SageMakerEndpointConfigurationKMSKeyConfigured",
)


def acknowledge_nvme_endpoint_config(endpoint_config: IConstruct, *, instance_type: str) -> None:
    for finding in NVME_FINDINGS:
        _acknowledge(endpoint_config, finding, _NVME.format(instance_type=instance_type))


def acknowledged_findings(construct: IConstruct) -> dict[str, str]:
    """The findings acknowledged directly on ``construct``: finding id -> reason (for tests and reviews)."""
    found: dict[str, str] = {}
    for entry in construct.node.metadata:
        if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY and isinstance(entry.data, dict):
            for key, reason in entry.data.items():
                found[key.split("::", 1)[-1]] = reason
    return found
