"""What a stage's deploy may create and what the roles it creates may ever do, in each stage's account.

CDK's bootstrap hands CloudFormation an execution role that is administrator unless told otherwise, and the
pipeline's deploy role may use it: whoever deploys one stage could then do anything in its account. Each
account is bootstrapped instead with :data:`EXECUTION_POLICY_NAMES` (``cdk bootstrap
--cloudformation-execution-policies``), which allows exactly what the resource handlers of our stacks'
resource types call (cfn-lint's copy of CloudFormation's registry schemas lists them; the tests judge every one),
scoped to the stage's names, and :data:`BOUNDARY_NAME`, the permissions boundary every role a stage creates
carries: the execution policy lets CloudFormation create and change roles only under the stage's IAM path and only
with that boundary, and never remove it or edit either policy.

Names are scoped where the stacks fix them (the endpoint, its component, alarms and log groups are named
``peagle-<stage>...``; roles and managed policies live under the IAM path ``/peagle/<stage>/``). Kinds whose
names CloudFormation generates (models, endpoint configs, KMS keys, SNS topics, dashboards, scaling targets) are
scoped to the account and region: one account per stage (stacks.isolation) makes that the stage's own.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import jsii
from aws_cdk import Aspects, IAspect, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

from peagle_constructs.drafter_training import (
    LOG_DELIVERY_ACTIONS, TRACE_ACTIONS, candidate_parameter_name, job_name_prefix, training_name,
)
from peagle_constructs.weights import WeightsLayout

from stacks.environments import EnvironmentConfig

# Five managed policies (IAM; serving; observability; capture delivery; drafter training): with three stages in one
# account one policy would pass IAM's 6,144-character limit.
EXECUTION_POLICY_NAMES = ("peagle-cfn-execution-iam", "peagle-cfn-execution-serving",
                          "peagle-cfn-execution-observability", "peagle-cfn-execution-capture",
                          "peagle-cfn-execution-training")
BOUNDARY_NAME = "peagle-workload-boundary"
CDK_QUALIFIER = "hnb659fds"  # the CDK bootstrap's default qualifier
# Passed to by the stacks: SageMaker runs models as their execution role; with capture on, Firehose writes the
# records as its delivery role and CloudWatch Logs puts them into the stream as the subscription's.
PASSED_TO = ("sagemaker.amazonaws.com",)
CAPTURE_PASSED_TO = ("firehose.amazonaws.com", "logs.amazonaws.com")
# With training on, Step Functions runs the state machine as its role and EventBridge starts it as the schedule's.
TRAINING_PASSED_TO = ("states.amazonaws.com", "events.amazonaws.com")
SCALING_SERVICE = "sagemaker.application-autoscaling.amazonaws.com"
SCALING_LINKED_ROLE = f"aws-service-role/{SCALING_SERVICE}/AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"


def iam_path(env: EnvironmentConfig) -> str:
    """The IAM path of every role and managed policy a stage creates: what the execution policy may touch."""
    return f"/peagle/{env.name.lower()}/"


def boundary_arn(scope: Construct) -> str:
    return Stack.of(scope).format_arn(service="iam", region="", resource="policy", resource_name=BOUNDARY_NAME)


@jsii.implements(IAspect)
class _StageIam:
    """Puts every role and managed policy of a stage under its IAM path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, (iam.CfnRole, iam.CfnManagedPolicy)):
            node.path = self.path


def apply_to_stage(stack: Stack, env: EnvironmentConfig) -> None:
    """The stage's roles under its IAM path, each bounded by the account's workload boundary."""
    Aspects.of(stack).add(_StageIam(iam_path(env)))
    iam.PermissionsBoundary.of(stack).apply(iam.ManagedPolicy.from_managed_policy_arn(
        stack, "WorkloadBoundary", boundary_arn(stack)))


def _arn(stack: Stack, service: str, resource: str, name: str, *, colon: bool = False, region: bool = True) -> str:
    from aws_cdk import ArnFormat

    return stack.format_arn(service=service, resource=resource, resource_name=name, region=None if region else "",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME if colon else ArnFormat.SLASH_RESOURCE_NAME)


def _log_groups(stack: Stack, names: Sequence[str]) -> list[str]:
    """The stages' endpoint and component log groups (and their streams, ``:*``)."""
    return [_arn(stack, "logs", "log-group", f"/aws/sagemaker/{kind}/{n}{tail}", colon=True)
            for n in names for kind in ("Endpoints", "InferenceComponents") for tail in ("", ":*", "-*")]


def _capturing(envs: Sequence[EnvironmentConfig]) -> list[EnvironmentConfig]:
    return [env for env in envs if env.model.serving.capture is not None]


def _capture_buckets(stack: Stack, envs: Sequence[EnvironmentConfig], tail: str = "") -> list[str]:
    """The capture buckets of ``envs`` as ARNs (and ``tail`` below them)."""
    return [f"arn:{stack.partition}:s3:::{env.capture_bucket_name(stack.account, stack.region)}{tail}" for env in envs]


def _training(envs: Sequence[EnvironmentConfig]) -> list[EnvironmentConfig]:
    return [env for env in envs if env.training is not None]


def _names(envs: Sequence[EnvironmentConfig]) -> list[str]:
    return [env.endpoint_name for env in envs]  # peagle-<stage>: the endpoint, its component, alarms, log groups


def execution_statements(stack: Stack, envs: Sequence[EnvironmentConfig]) -> dict[str, list[iam.PolicyStatement]]:
    """CloudFormation's permissions when it deploys the stages ``envs`` (all in ``stack``'s account), by the name
    of the managed policy that holds them."""
    roles = [_arn(stack, "iam", "role", f"{iam_path(env).strip('/')}/*", region=False) for env in envs]
    policies = [_arn(stack, "iam", "policy", f"{iam_path(env).strip('/')}/*", region=False) for env in envs]
    boundary = {"iam:PermissionsBoundary": boundary_arn(stack)}
    names = _names(envs)
    endpoints = [_arn(stack, "sagemaker", "endpoint", n) for n in names]
    components = [_arn(stack, "sagemaker", "inference-component", f"{n}-*") for n in names]
    alarms = [_arn(stack, "cloudwatch", "alarm", f"{n}-*", colon=True) for n in names]
    log_groups = _log_groups(stack, names)
    guarded = [_arn(stack, "iam", "policy", name, region=False) for name in (BOUNDARY_NAME, *EXECUTION_POLICY_NAMES)]
    identities = [
        iam.PolicyStatement(
            sid="RolesOnlyWithTheBoundary",
            actions=["iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:PutRolePermissionsBoundary"],
            resources=roles, conditions={"StringEquals": boundary}),
        iam.PolicyStatement(
            sid="AttachOnlyTheStagesPolicies", actions=["iam:AttachRolePolicy", "iam:DetachRolePolicy"],
            resources=roles, conditions={"StringEquals": boundary, "ArnLike": {"iam:PolicyARN": policies}}),
        iam.PolicyStatement(
            sid="TheStagesRoles",
            actions=["iam:GetRole", "iam:GetRolePolicy", "iam:ListAttachedRolePolicies", "iam:ListRolePolicies",
                     "iam:TagRole", "iam:UntagRole", "iam:UpdateRole", "iam:UpdateRoleDescription",
                     "iam:UpdateAssumeRolePolicy", "iam:DeleteRole"],
            resources=roles),
        iam.PolicyStatement(
            sid="TheStagesManagedPolicies",
            actions=["iam:CreatePolicy", "iam:CreatePolicyVersion", "iam:DeletePolicy", "iam:DeletePolicyVersion",
                     "iam:GetPolicy", "iam:GetPolicyVersion", "iam:ListPolicyVersions", "iam:ListEntitiesForPolicy"],
            resources=policies),
        iam.PolicyStatement(
            sid="PassTheStagesRolesToSageMaker", actions=["iam:PassRole"], resources=roles,
            conditions={"StringEquals": {"iam:PassedToService": list(PASSED_TO)}}),
        iam.PolicyStatement(
            sid="ScalingLinkedRole", actions=["iam:CreateServiceLinkedRole", "iam:PassRole"],
            resources=[_arn(stack, "iam", "role", SCALING_LINKED_ROLE, region=False)]),
        # Never: a role without its boundary, or a boundary or execution policy rewritten by a deploy.
        iam.PolicyStatement(
            sid="NeverRemoveTheBoundary", effect=iam.Effect.DENY, actions=["iam:DeleteRolePermissionsBoundary"],
            resources=["*"]),
        iam.PolicyStatement(
            sid="NeverRewriteTheGuards", effect=iam.Effect.DENY,
            actions=["iam:CreatePolicyVersion", "iam:DeletePolicy", "iam:DeletePolicyVersion",
                     "iam:SetDefaultPolicyVersion"],
            resources=guarded),
    ]
    services = [
        iam.PolicyStatement(
            sid="TheStagesEndpoints",
            actions=["sagemaker:CreateEndpoint", "sagemaker:UpdateEndpoint", "sagemaker:DeleteEndpoint",
                     "sagemaker:DescribeEndpoint", "sagemaker:CreateInferenceComponent",
                     "sagemaker:UpdateInferenceComponent", "sagemaker:UpdateInferenceComponentRuntimeConfig",
                     "sagemaker:DeleteInferenceComponent", "sagemaker:DescribeInferenceComponent",
                     "sagemaker:AddTags", "sagemaker:DeleteTags", "sagemaker:ListTags"],
            resources=[*endpoints, *components]),
        iam.PolicyStatement(
            sid="ModelsAndEndpointConfigs",
            actions=["sagemaker:CreateModel", "sagemaker:DeleteModel", "sagemaker:DescribeModel",
                     "sagemaker:CreateEndpointConfig", "sagemaker:DeleteEndpointConfig",
                     "sagemaker:DescribeEndpointConfig", "sagemaker:AddTags", "sagemaker:DeleteTags",
                     "sagemaker:ListTags"],
            resources=[_arn(stack, "sagemaker", "model", "*"), _arn(stack, "sagemaker", "endpoint-config", "*")]),
        iam.PolicyStatement(
            sid="Scaling",
            actions=["application-autoscaling:RegisterScalableTarget", "application-autoscaling:DeregisterScalableTarget",
                     "application-autoscaling:DescribeScalableTargets", "application-autoscaling:PutScalingPolicy",
                     "application-autoscaling:DeleteScalingPolicy", "application-autoscaling:DescribeScalingPolicies",
                     "application-autoscaling:PutScheduledAction", "application-autoscaling:DeleteScheduledAction",
                     "application-autoscaling:DescribeScheduledActions", "application-autoscaling:TagResource",
                     "application-autoscaling:UntagResource", "application-autoscaling:ListTagsForResource"],
            resources=["*"]),
        iam.PolicyStatement(
            sid="BootstrapVersion", actions=["ssm:GetParameters"],
            resources=[_arn(stack, "ssm", "parameter", f"cdk-bootstrap/{CDK_QUALIFIER}/version")]),
    ]
    observability = [
        iam.PolicyStatement(
            sid="TheStagesAlarms",
            actions=["cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:DescribeAlarms",
                     "cloudwatch:TagResource", "cloudwatch:UntagResource", "cloudwatch:ListTagsForResource"],
            # TargetTracking-*: the alarms Application Auto Scaling makes for a target-tracking policy.
            resources=[*alarms, _arn(stack, "cloudwatch", "alarm", "TargetTracking-*", colon=True)]),
        iam.PolicyStatement(
            sid="Dashboards",
            actions=["cloudwatch:PutDashboard", "cloudwatch:GetDashboard", "cloudwatch:DeleteDashboards",
                     "cloudwatch:TagResource", "cloudwatch:UntagResource", "cloudwatch:ListTagsForResource"],
            resources=[_arn(stack, "cloudwatch", "dashboard", "*", region=False)]),
        iam.PolicyStatement(sid="ScalingReadsMetrics", actions=["cloudwatch:GetMetricData"], resources=["*"]),
        iam.PolicyStatement(
            sid="TheStagesLogGroups",
            actions=["logs:CreateLogGroup", "logs:DeleteLogGroup", "logs:PutRetentionPolicy",
                     "logs:DeleteRetentionPolicy", "logs:AssociateKmsKey", "logs:DisassociateKmsKey",
                     "logs:TagResource", "logs:UntagResource", "logs:ListTagsForResource", "logs:PutMetricFilter",
                     "logs:DeleteMetricFilter", "logs:DescribeMetricFilters", "logs:PutLogGroupDeletionProtection",
                     "logs:GetDataProtectionPolicy", "logs:PutDataProtectionPolicy", "logs:DeleteDataProtectionPolicy",
                     "logs:DescribeIndexPolicies", "logs:PutIndexPolicy", "logs:DeleteIndexPolicy",
                     "logs:PutBearerTokenAuthentication"],
            resources=log_groups),
        iam.PolicyStatement(
            sid="LogListings",
            actions=["logs:DescribeLogGroups", "logs:DescribeResourcePolicies", "logs:DescribeMetricFilters"],
            resources=["*"]),
        iam.PolicyStatement(sid="CreateKeys", actions=["kms:CreateKey"], resources=["*"]),
        iam.PolicyStatement(
            sid="TheAccountsKeys",
            actions=["kms:DescribeKey", "kms:EnableKey", "kms:DisableKey", "kms:EnableKeyRotation",
                     "kms:DisableKeyRotation", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:ListResourceTags",
                     "kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:TagResource", "kms:UntagResource",
                     "kms:UpdateKeyDescription"],
            resources=[_arn(stack, "kms", "key", "*")]),
        iam.PolicyStatement(
            sid="AlarmTopics",
            actions=["sns:CreateTopic", "sns:DeleteTopic", "sns:GetTopicAttributes", "sns:SetTopicAttributes",
                     "sns:ListSubscriptionsByTopic", "sns:ListTagsForResource", "sns:TagResource",
                     "sns:UntagResource", "sns:Subscribe", "sns:Unsubscribe", "sns:GetSubscriptionAttributes",
                     "sns:SetSubscriptionAttributes", "sns:GetDataProtectionPolicy", "sns:PutDataProtectionPolicy"],
            resources=[stack.format_arn(service="sns", resource="*")]),
    ]
    return dict(zip(EXECUTION_POLICY_NAMES, (identities, services, observability, _capture_statements(stack, envs),
                                             _training_statements(stack, envs))))


def _capture_statements(stack: Stack, envs: Sequence[EnvironmentConfig]) -> list[iam.PolicyStatement]:
    """What deploying a stage's capture delivery (peagle_constructs.capture_delivery) takes: its bucket and the
    bucket's policy, its Firehose stream (whose encryption with the stage's key is a grant Firehose makes), the
    subscription filter on the stage's log group, and passing the two roles to the two services. For stages none
    of which captures, one statement refusing Firehose (IAM takes no policy without a statement)."""
    capturing = _capturing(envs)
    if not capturing:
        return [iam.PolicyStatement(sid="NoStageCaptures", effect=iam.Effect.DENY, actions=["firehose:*"],
                                    resources=["*"])]
    roles = [_arn(stack, "iam", "role", f"{iam_path(env).strip('/')}/*", region=False) for env in capturing]
    return [
        iam.PolicyStatement(
            sid="TheStagesCaptureBuckets",
            actions=["s3:CreateBucket", "s3:DeleteBucket", "s3:ListBucket", "s3:GetBucket*", "s3:Get*Configuration",
                     "s3:ListTagsForResource", "s3:PutEncryptionConfiguration", "s3:PutBucketVersioning",
                     "s3:PutLifecycleConfiguration", "s3:DeleteBucketLifecycle", "s3:PutBucketPublicAccessBlock",
                     "s3:PutBucketOwnershipControls", "s3:PutBucketNotification", "s3:PutBucketTagging",
                     "s3:TagResource", "s3:UntagResource", "s3:PutBucketPolicy", "s3:DeleteBucketPolicy"],
            resources=_capture_buckets(stack, capturing)),
        iam.PolicyStatement(
            sid="TheAccountsDeliveryStreams",
            actions=["firehose:CreateDeliveryStream", "firehose:DeleteDeliveryStream", "firehose:DescribeDeliveryStream",
                     "firehose:UpdateDestination", "firehose:StartDeliveryStreamEncryption",
                     "firehose:StopDeliveryStreamEncryption", "firehose:TagDeliveryStream",
                     "firehose:UntagDeliveryStream", "firehose:ListTagsForDeliveryStream"],
            resources=[_arn(stack, "firehose", "deliverystream", "*")]),
        iam.PolicyStatement(
            sid="StreamEncryptionGrants", actions=["kms:CreateGrant", "kms:RevokeGrant"],
            resources=[_arn(stack, "kms", "key", "*")],
            conditions={"StringEquals": {"kms:ViaService": f"firehose.{stack.region}.amazonaws.com"}}),
        iam.PolicyStatement(
            sid="TheStagesSubscriptions",
            actions=["logs:PutSubscriptionFilter", "logs:DeleteSubscriptionFilter", "logs:DescribeSubscriptionFilters"],
            resources=_log_groups(stack, _names(capturing))),
        iam.PolicyStatement(
            sid="PassTheCaptureRoles", actions=["iam:PassRole", "iam:GetRole"], resources=roles,
            conditions={"StringEqualsIfExists": {"iam:PassedToService": list(CAPTURE_PASSED_TO)}}),
    ]


def _training_statements(stack: Stack, envs: Sequence[EnvironmentConfig]) -> list[iam.PolicyStatement]:
    """What deploying a stage's drafter training (peagle_constructs.drafter_training) takes: its state machine, the
    log group it logs to and the log delivery Step Functions sets up for the caller, the candidate's parameter, the
    schedule's rule, and passing the two roles to the two services. For stages none of which trains, one statement
    refusing Step Functions."""
    training = _training(envs)
    if not training:
        return [iam.PolicyStatement(sid="NoStageTrains", effect=iam.Effect.DENY, actions=["states:*"],
                                    resources=["*"])]
    names = [training_name(env.name.lower()) for env in training]
    roles = [_arn(stack, "iam", "role", f"{iam_path(env).strip('/')}/*", region=False) for env in training]
    return [
        iam.PolicyStatement(
            sid="TheStagesTrainingStateMachines",
            actions=["states:CreateStateMachine", "states:UpdateStateMachine", "states:DeleteStateMachine",
                     "states:DescribeStateMachine", "states:TagResource", "states:UntagResource",
                     "states:ListTagsForResource"],
            resources=[_arn(stack, "states", "stateMachine", n, colon=True) for n in names]),
        # Step Functions' documentation: whoever creates a state machine that logs to CloudWatch Logs sets up the
        # log delivery; these actions have no resource-level permissions.
        iam.PolicyStatement(
            sid="StateMachineLogDelivery",
            actions=list(LOG_DELIVERY_ACTIONS),
            resources=["*"]),
        iam.PolicyStatement(
            sid="TheStagesTrainingLogGroups",
            actions=["logs:CreateLogGroup", "logs:DeleteLogGroup", "logs:PutRetentionPolicy",
                     "logs:DeleteRetentionPolicy", "logs:AssociateKmsKey", "logs:DisassociateKmsKey",
                     "logs:TagResource", "logs:UntagResource", "logs:ListTagsForResource",
                     "logs:PutLogGroupDeletionProtection", "logs:GetDataProtectionPolicy",
                     "logs:PutDataProtectionPolicy", "logs:DeleteDataProtectionPolicy", "logs:DescribeIndexPolicies",
                     "logs:PutIndexPolicy", "logs:DeleteIndexPolicy", "logs:PutBearerTokenAuthentication"],
            resources=[_arn(stack, "logs", "log-group", f"/aws/vendedlogs/states/{n}{tail}", colon=True)
                       for n in names for tail in ("", ":*")]),
        iam.PolicyStatement(
            sid="TheStagesCandidateParameters",
            actions=["ssm:PutParameter", "ssm:DeleteParameter", "ssm:GetParameters", "ssm:AddTagsToResource",
                     "ssm:RemoveTagsFromResource", "ssm:ListTagsForResource"],
            resources=[_arn(stack, "ssm", "parameter", candidate_parameter_name(env.name.lower()).lstrip("/"))
                       for env in training]),
        iam.PolicyStatement(
            sid="TheStagesTrainingSchedules",
            actions=["events:PutRule", "events:DeleteRule", "events:DescribeRule", "events:PutTargets",
                     "events:RemoveTargets", "events:ListTargetsByRule", "events:TagResource", "events:UntagResource",
                     "events:ListTagsForResource"],
            resources=[_arn(stack, "events", "rule", n) for n in names]),
        iam.PolicyStatement(
            sid="PassTheTrainingRoles", actions=["iam:PassRole"], resources=roles,
            conditions={"StringEquals": {"iam:PassedToService": list(TRAINING_PASSED_TO)}}),
    ]


def _training_boundary(stack: Stack, envs: Sequence[EnvironmentConfig]) -> list[iam.PolicyStatement]:
    """The most the training roles of ``envs`` may do: the state machine's (this stage's training jobs, their
    role passed to SageMaker, the rule Step Functions watches jobs through, the gate report, the candidate's
    parameter, logs and traces), the job's (the capture bucket read and written, the key through S3, storage
    grants, its logs) and the schedule's (start the state machine)."""
    training = _training(envs)
    if not training:
        return []
    stages = [env.name.lower() for env in training]
    roles = [_arn(stack, "iam", "role", f"{iam_path(env).strip('/')}/*", region=False) for env in training]
    job_logs = _arn(stack, "logs", "log-group", "/aws/sagemaker/TrainingJobs", colon=True)
    return [
        iam.PolicyStatement(
            sid="RunTheStagesTrainingJobs",
            actions=["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
            resources=[_arn(stack, "sagemaker", "training-job", f"{job_name_prefix(s)}-*") for s in stages]),
        iam.PolicyStatement(sid="PassTrainingJobRoles", actions=["iam:PassRole"], resources=roles,
                            conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}),
        iam.PolicyStatement(sid="WatchTrainingJobs",
                            actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                            resources=[_arn(stack, "events", "rule",
                                            "StepFunctionsGetEventsForSageMakerTrainingJobsRule")]),
        iam.PolicyStatement(sid="ReadTheCapture", actions=["s3:GetObject", "s3:ListBucket"],
                            resources=[*_capture_buckets(stack, training),
                                       *_capture_buckets(stack, training, "/*")]),
        iam.PolicyStatement(sid="EncryptTrainingOutput", actions=["kms:Encrypt"],
                            resources=[_arn(stack, "kms", "key", "*")],
                            conditions={"StringEquals": {"kms:ViaService": f"s3.{stack.region}.amazonaws.com"}}),
        # A grant SageMaker makes for the job's volume only (key policies refuse others: peagle_constructs.security).
        iam.PolicyStatement(sid="TrainingVolumeGrants", actions=["kms:CreateGrant"],
                            resources=[_arn(stack, "kms", "key", "*")],
                            conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}}),
        iam.PolicyStatement(sid="PublishCandidates", actions=["ssm:PutParameter"],
                            resources=[_arn(stack, "ssm", "parameter", candidate_parameter_name(s).lstrip("/"))
                                       for s in stages]),
        iam.PolicyStatement(sid="StateMachineLogsAndTraces",
                            actions=[*LOG_DELIVERY_ACTIONS, *TRACE_ACTIONS],
                            resources=["*"]),
        iam.PolicyStatement(sid="WriteTrainingLogs",
                            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                                     "logs:DescribeLogStreams"],
                            resources=[job_logs,
                                       *(f"{job_logs}:log-stream:{job_name_prefix(s)}-*" for s in stages)]),
        iam.PolicyStatement(sid="StartTraining", actions=["states:StartExecution"],
                            resources=[_arn(stack, "states", "stateMachine", training_name(s), colon=True)
                                       for s in stages]),
    ]


def boundary_statements(stack: Stack, envs: Sequence[EnvironmentConfig]) -> list[iam.PolicyStatement]:
    """The most any role of the stages ``envs`` may do (what a SageMaker execution role of ours needs)."""
    names = _names(envs)
    statements = []
    weights = sorted({(p.bucket, p.key_prefix) for env in envs for p in WeightsLayout.of(env.model.serving).prefixes})
    if weights:
        # The bundle prefix, not the pin: a new pin must not need a new boundary (the model's own policy names it).
        statements.append(iam.PolicyStatement(
            sid="ReadWeights", actions=["s3:GetObject"],
            resources=[f"arn:{stack.partition}:s3:::{bucket}/{_bundle_root(prefix)}*" for bucket, prefix in weights]))
        statements.append(iam.PolicyStatement(
            sid="ListWeights", actions=["s3:ListBucket"],
            resources=sorted({f"arn:{stack.partition}:s3:::{bucket}" for bucket, _ in weights})))
    statements += [
        iam.PolicyStatement(sid="PullImages", actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                                       "ecr:BatchCheckLayerAvailability"],
                            resources=[f"arn:{stack.partition}:ecr:*:*:repository/*"]),
        iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
        iam.PolicyStatement(
            sid="WriteTheStagesLogs",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=_log_groups(stack, names)),
        iam.PolicyStatement(sid="PublishMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"]),
        iam.PolicyStatement(sid="ReadRollbackAlarms", actions=["cloudwatch:DescribeAlarms"],
                            resources=[_arn(stack, "cloudwatch", "alarm", f"{n}-*", colon=True) for n in names]),
    ]
    capturing = _capturing(envs)
    if capturing:  # the capture delivery's two roles (peagle_constructs.capture_delivery)
        statements += [
            iam.PolicyStatement(sid="DeliverCaptureRecords", actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                                resources=_capture_buckets(stack, capturing, "/*")),
            iam.PolicyStatement(sid="CaptureBucketUploads",
                                actions=["s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
                                resources=_capture_buckets(stack, capturing)),
            iam.PolicyStatement(sid="EncryptCaptureRecords", actions=["kms:GenerateDataKey", "kms:Decrypt"],
                                resources=[_arn(stack, "kms", "key", "*")],
                                conditions={"StringEquals": {"kms:ViaService": f"s3.{stack.region}.amazonaws.com"}}),
            iam.PolicyStatement(sid="FeedCaptureStreams", actions=["firehose:PutRecord", "firehose:PutRecordBatch"],
                                resources=[_arn(stack, "firehose", "deliverystream", "*")]),
        ]
    statements += _training_boundary(stack, envs)
    keys = sorted({env.weights_key_arn for env in envs if env.weights_key_arn})
    if keys:
        statements.append(iam.PolicyStatement(sid="DecryptWeights", actions=["kms:Decrypt"], resources=keys))
    return statements


def _bundle_root(key_prefix: str) -> str:
    """The prefix given to `make stage-weights` (a pinned bundle sits one folder below it, named by its digest)."""
    parts = key_prefix.rstrip("/").split("/")
    if len(parts[-1]) == 64 and all(c in "0123456789abcdef" for c in parts[-1]):
        parts = parts[:-1]
    return "/".join(parts) + "/"


def stage_names(envs: Iterable[EnvironmentConfig]) -> str:
    return "-".join(env.name for env in envs)
