"""Security in one place: the policy packs we hold every stack to, and every acknowledged finding.

The packs are CDK policy-validation plugins (``Validations.of(app).add_plugins``), run at synth: the four
cdk-nag packs and AWS Control Tower's proactive controls as CloudFormation Guard rules (cdk-validator-
cfnguard; the Guard binary and the rules ship inside its package, nothing is downloaded at synth). Each
acknowledgement names ONE finding (nag: ``RuleId[FindingId]``, no prefix matching; Guard:
``cdk-validator-cfnguard::<rule>``) on the construct that raises it, with the reason it is acceptable.
Nothing else in the library or the stacks acknowledges findings: read this file to review what the stacks
are allowed to break and why. (Only the capture bucket needs Control Tower acknowledgements.)
"""

from __future__ import annotations

from typing import Callable, Sequence

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NagPack, NIST80053R5Checks, PCIDSS321Checks
from cdklabs.cdk_validator_cfnguard import CfnGuardValidator
from constructs import IConstruct

from peagle_constructs.sagemaker_names import ENDPOINT_LOG_GROUP_PREFIX

NAG_PACKS: tuple[Callable[..., NagPack], ...] = (
    AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks, PCIDSS321Checks,
)


# checkov (run on the synthesized templates in `make test`, not a synth plugin): the checks it may skip, each
# with its reason, passed as --skip-check (every resource). None is needed today: a finding on one resource is
# acknowledged on that resource (its template metadata, `_acknowledge_checkov`).
CHECKOV_ACKNOWLEDGED: dict[str, str] = {}
CHECKOV_ACCESS_LOGS = "CKV_AWS_18"  # an S3 bucket without server access logging


def control_tower_rules() -> CfnGuardValidator:
    """AWS Control Tower's proactive controls (CT.*), judged by CloudFormation Guard on each template."""
    return CfnGuardValidator(control_tower_rules_enabled=True)


def add_nag_packs(scope: IConstruct) -> list:
    """Register every pack on ``scope``, a Stage or App - the four cdk-nag packs and AWS Control Tower's
    Guard rules: ``cdk synth`` then fails on any open finding.

    CDK runs a plugin on the stacks of the Stage it is registered on (not on nested Stages).
    """
    plugins = [*(pack(scope) for pack in NAG_PACKS), control_tower_rules()]
    Validations.of(scope).add_plugins(*plugins)
    return plugins


def _acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=finding, reason=reason))


def _acknowledge_checkov(construct: IConstruct, check: str, reason: str) -> None:
    """checkov skips ``check`` on this one resource (its template metadata), with the reason beside it."""
    resource = construct.node.default_child
    resource.add_metadata("checkov", {"skip": [{"id": check, "comment": reason}]})


def _resource_finding(rule: str, resource: str) -> str:
    return f"{rule}[Resource::{resource}]"


# -- KMS keys ----------------------------------------------------------------------------------------


def limit_grants_to_aws_services(key: kms.Key) -> kms.Key:
    """AWS Control Tower's CT.KMS.PR.3 on ``key``: every principal is denied ``kms:CreateGrant`` unless the
    grant is for an AWS resource or asked by an AWS service (``BoolIfExists``: both flags false denies).
    SageMaker's storage-volume encryption creates its grants on the caller's behalf (the grant is for an AWS
    resource), so it keeps working; a grant made directly by a user or role, which would hand the key on
    outside its key policy, is refused. Every key of this library passes through here."""
    key.add_to_resource_policy(iam.PolicyStatement(
        sid="GrantsOnlyForAwsResources", effect=iam.Effect.DENY, principals=[iam.AnyPrincipal()],
        actions=["kms:CreateGrant"], resources=["*"],
        conditions={"BoolIfExists": {"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"}},
    ))
    return key


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


# -- the capture's way into S3 ------------------------------------------------------------------------


_CAPTURE_ACCESS_LOGS = ("the capture bucket's reads and writes are recorded by CloudTrail's S3 data events (the "
                        "account's trail); S3 server access logs would need a second bucket, which cannot use a KMS "
                        "key and would hold request records of user traffic outside the stage's key")
_CAPTURE_REPLICATION = ("capture records are training data kept only for the stage's log retention; a replica would "
                        "keep user traffic in a second place past it, and a lost record costs only a training sample")
_CAPTURE_OBJECT_LOCK = ("capture records must expire with the stage's retention, and Object Lock exists to keep objects "
                        "from deletion; integrity comes from the bucket policy (only the stream's role may put "
                        "objects) and versioning")
_CAPTURE_OBJECTS = ("Firehose writes dated objects below the capture and error prefixes; their keys are not known at "
                    "synth, so the role names the prefixes (in a bucket of its own account only)")


def acknowledge_capture_delivery(delivery: IConstruct, *, bucket: IConstruct, policy: IConstruct,
                                 object_prefixes: Sequence[str]) -> None:
    """The capture bucket's findings (access logs, replication) and the delivery role's prefixes, each named."""
    _acknowledge(bucket, "AwsSolutions-S1", _CAPTURE_ACCESS_LOGS)
    _acknowledge(bucket, "cdk-validator-cfnguard::s3_bucket_logging_enabled_check", _CAPTURE_ACCESS_LOGS)
    _acknowledge_checkov(bucket, CHECKOV_ACCESS_LOGS, _CAPTURE_ACCESS_LOGS)
    _acknowledge(bucket, "cdk-validator-cfnguard::s3_bucket_object_lock_enabled_check", _CAPTURE_OBJECT_LOCK)
    for pack in ("HIPAA.Security", "NIST.800.53.R5", "PCI.DSS.321"):
        _acknowledge(bucket, f"{pack}-S3BucketLoggingEnabled", _CAPTURE_ACCESS_LOGS)
        _acknowledge(bucket, f"{pack}-S3BucketReplicationEnabled", _CAPTURE_REPLICATION)
    for prefix in object_prefixes:
        _acknowledge(policy, _resource_finding("AwsSolutions-IAM5", prefix), _CAPTURE_OBJECTS)


# -- the drafter's training in the cloud --------------------------------------------------------------


def acknowledge_drafter_training(*, job_policy: IConstruct, state_machine_policy: IConstruct, written: Sequence[str],
                                 read: Sequence[str], log_streams: str, jobs: str, reports: str) -> None:
    """The training job's and its state machine's remaining wildcards, each named, as cdk-nag spells them: the
    capture bucket's prefixes the job writes (``written``) and reads with the pinned bundle's (``read``), its log
    streams, the stage's training jobs and their gate reports. The bucket is the capture's, whose own findings
    acknowledge_capture_delivery names."""
    rule = "AwsSolutions-IAM5"
    for prefix in written:
        _acknowledge(job_policy, _resource_finding(rule, prefix), _CANDIDATE_OBJECTS)
    for prefix in read:
        _acknowledge(job_policy, _resource_finding(rule, prefix), _TRAINING_READS)
    _acknowledge(job_policy, _resource_finding(rule, "*"), _TRAINING_ANY)
    _acknowledge(job_policy, _resource_finding(rule, log_streams), _TRAINING_LOG_STREAMS)
    _acknowledge(state_machine_policy, _resource_finding(rule, "*"), _STATE_MACHINE_DELIVERY)
    _acknowledge(state_machine_policy, _resource_finding(rule, jobs), _TRAINING_JOBS)
    _acknowledge(state_machine_policy, _resource_finding(rule, reports), _TRAINING_REPORTS)


_CANDIDATE_OBJECTS = ("SageMaker writes each job's output and checkpoints below <prefix>/<job name>/, names not known "
                      "at synth; the role names its two prefixes, in a bucket of its own account only")
_TRAINING_READS = ("SageMaker copies the capture prefix and the pinned bundle's prefix into the job's channels; their "
                   "object keys are not known at synth, so the role reads by prefix (buckets of the stated account "
                   "only), and the job checks the bundle against its pin")
_TRAINING_ANY = (f"{_ECR_TOKEN}; cloudwatch:PutMetricData (in SageMaker's list of execution-role permissions for "
                 "training) has no resource-level permissions; a condition pins it to /aws/sagemaker/TrainingJobs")
_TRAINING_LOG_STREAMS = ("SageMaker names a job's log streams <job name>/algo-<n>-<time>; the role writes only streams of "
                         "this stage's jobs, in SageMaker's training log group")
_STATE_MACHINE_DELIVERY = ("CloudWatch Logs' log-delivery actions and X-Ray's trace actions have no resource-level "
                           "permissions (service authorization reference); Step Functions needs them to deliver the "
                           "state machine's logs and traces")
_TRAINING_JOBS = ("each execution names its job <stage prefix>-<uuid>, unknown at synth; the state machine may start, "
                  "describe and stop only jobs of that prefix")
_TRAINING_REPORTS = ("the state machine reads one object of each of its jobs, the gate report SageMaker uploads at "
                     "<job name>/output/model/gate.json; the job name is known only when it runs")
