"""Log groups SageMaker writes to, made ours before it writes: a name it uses, our retention, our KMS key.

SageMaker creates an endpoint's (or component's) log group itself if it writes first - unencrypted, kept
forever - so the endpoint and each component depend on the group made here.
"""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


def encrypted_log_group(scope: Construct, id: str, name: str, *, key: kms.IKey, retention: logs.RetentionDays,
                        removal_policy: RemovalPolicy) -> logs.LogGroup:
    """The log group ``name``, encrypted with ``key``; the key lets CloudWatch Logs use it for this group only
    (Logs encrypts with a key only if the key policy lets the regional service use it)."""
    arn = f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:{name}"
    key.add_to_resource_policy(iam.PolicyStatement(
        principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
        actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
        resources=["*"],
        conditions={"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": arn}},
    ))
    return logs.LogGroup(scope, id, log_group_name=name, retention=retention, encryption_key=key,
                         removal_policy=removal_policy)
