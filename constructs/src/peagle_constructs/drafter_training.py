"""DrafterTraining: a stage's next P-EAGLE head trained on its own captured traffic, in the cloud.

A Step Functions state machine runs one SageMaker training job from the project's image on a GPU instance: the
stage's capture prefix and its pinned weights bundle in (``peagle_contract.training_job``'s channels), the gate's
report and, when the gate passed, the candidate head and its bundle's manifest out, beside the records in the
capture's bucket (``candidates/<stage>/<job>/output/model/``). It then reads the report: a passing
candidate's pin (the manifest's SHA-256) and figures are published in an SSM parameter, where an operator or a
scheduled workflow picks them up for the pull request; a refused one ends the execution failed, with both figures
in its cause. Nothing here changes what any endpoint serves: the pin reaches a
stage only through a reviewed commit and its stack diff.

Started by hand (``aws stepfunctions start-execution --state-machine-arn <DrafterTrainingStateMachine>``) or on
``schedule``. The execution's input is ignored: every input of the job is fixed by the stack, so whoever may start
an execution chooses when, never what is trained on or where it goes.

What an attacker could do here, and what stops it:
- **Train on other data, or write elsewhere.** The job's role reads only the capture prefix and the pinned bundle's
  prefix, in buckets this account owns, and writes only below its own output and checkpoint prefixes; the job runs
  with network isolation (its container reaches nothing, not even S3: SageMaker moves the channels and the
  output), so a poisoned record or a hostile tokenizer file cannot send anything anywhere.
- **Swap the weights it starts from.** The job checks the bundle channel file by file against the stage's pin
  before it loads a byte (models.trainer.training_job).
- **Forge a candidate, or train the next one on forged records.** The bucket refuses ``s3:PutObject`` to every
  principal but the stream's role and the job's (CaptureDelivery.allow_writer), and the job's role any object under
  the capture's own prefixes; the state machine reads the report only from the key of the job it ran. A published
  pin is still only a proposal: the serving container checks the bytes it names against it, and it serves nowhere
  until a reviewed commit pins it.

What no test here can show (SageMaker and Step Functions run only in an account): that the job's output lands
where SageMaker documents it (``<output path>/<job>/output/model/``, file by file with CompressionType NONE), and
that the state machine's paths and intrinsic functions evaluate as written; the request is checked against
botocore's own model of CreateTrainingJob, and the paths by what each state writes before the next reads.
"""

from __future__ import annotations

import posixpath
import re

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from peagle_contract.bundle import bundle_uri
from peagle_contract.training_job import (
    BUNDLE_CHANNEL, CANDIDATE_MANIFEST, CAPTURE_CHANNEL, CHECKPOINTS_DIR, GATE_REPORT, MODEL_DIR, ROOT,
    TRAIN_ARGUMENT, TRAINER_COMMAND, TrainingJobConfig, TrainingJobError, render_hyperparameters,
)

from peagle_constructs import security
from peagle_constructs.capture_delivery import CaptureDelivery
from peagle_constructs.errors import ConfigError
from peagle_constructs.image import ContainerImage
from peagle_constructs.instance_types import GPU_FAMILIES, InstanceType
from peagle_constructs.props import DrafterTrainingProps
from peagle_constructs.validation import check_type
from peagle_constructs.weights import S3Prefix, read_prefix_statements

OUTPUT_PREFIX = "candidates/"  # <stage>/<job>/output/model/: the report, and a passing candidate
CHECKPOINT_PREFIX = "checkpoints/"  # <stage>/<job>/: the trainer's resumable steps, for a restarted job
CHECKPOINT_DAYS = 30
LOCAL_CHECKPOINTS = f"{ROOT}/{CHECKPOINTS_DIR}"
# 1-18 characters: "peagle-<stage>-drafter-" and States.UUID()'s 36 stay within a training job name's 63.
# What whoever sets up a state machine's log delivery, and the state machine's X-Ray traces, need: actions with no
# resource-level permissions (the service authorization reference). The stacks' deploy policies name them too.
LOG_DELIVERY_ACTIONS = ("logs:CreateLogDelivery", "logs:GetLogDelivery", "logs:UpdateLogDelivery",
                        "logs:DeleteLogDelivery", "logs:ListLogDeliveries", "logs:PutResourcePolicy",
                        "logs:DescribeResourcePolicies", "logs:DescribeLogGroups")
TRACE_ACTIONS = ("xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
                 "xray:GetSamplingTargets")
_STAGE = re.compile(r"^[a-z0-9](?:-?[a-z0-9]){0,17}$")


def _as_nag_spells(stack: Stack, value: str) -> str:
    """A bucket name as cdk-nag writes it in a finding: a reference to a resource of the stack as <LogicalId>."""
    resolved = stack.resolve(value)
    return f"<{resolved['Ref']}>" if isinstance(resolved, dict) and set(resolved) == {"Ref"} else str(resolved)


def job_name_prefix(stage: str) -> str:
    """Every training job of this stage's state machine is named ``<prefix>-<uuid>``: what its policies name."""
    return f"peagle-{stage}-drafter"


def training_name(stage: str) -> str:
    """The name of the stage's state machine, its log group's last part and its schedule's rule."""
    return f"{job_name_prefix(stage)}-training"


def candidate_parameter_name(stage: str) -> str:
    """The SSM parameter the stage's last passing candidate is published in."""
    return f"/peagle/{stage}/drafter-candidate"


def _job_output(output: str, job: str, name: str) -> str:
    """The key of ``name`` among a job's outputs, as SageMaker lays them out below the output path."""
    return f"{output}{job}/output/{MODEL_DIR}/{name}"


class DrafterTraining(Construct):
    """Trains ``stage``'s next drafter on the records ``capture`` delivers, from the weights bundle at ``bundle``
    (``s3://bucket/prefix/<pin>/``, as `make stage-weights` wrote it) that ``bundle_sha256`` pins, at ``k`` draft
    tokens, on records naming ``target_name``, as ``props`` says::

        DrafterTraining(self, "DrafterTraining", image=training_image, stage="dev", key=monitoring.key,
                        capture=monitoring.capture,
                        bundle="s3://peagle-weights-dev/bundles/gpt-oss-20b-p-eagle/<pin>/", bundle_sha256="<pin>",
                        target_name="gpt-oss-20b", k=7, props=DrafterTrainingProps(schedule=Schedule.rate(...)))

    ``image`` is the trainer's image (run as the contract's ``TRAINER_COMMAND``); ``capture`` the stage's capture
    delivery (the records read, and the bucket the candidates go to); ``key`` encrypts the job's output, storage and
    checkpoints and the state machine's logs (give the capture's key, the stage's). ``weights_account`` owns the
    bundle's bucket (default: this account), ``weights_key`` encrypts it (None: S3's own keys).
    """

    def __init__(self, scope: Construct, id: str, *, image: ContainerImage, stage: str, key: kms.IKey,
                 capture: CaptureDelivery, bundle: str, bundle_sha256: str,
                 target_name: str, k: int, props: DrafterTrainingProps = DrafterTrainingProps(),
                 weights_account: str | None = None, weights_key: kms.IKey | None = None,
                 removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
                 log_retention: logs.RetentionDays = logs.RetentionDays.ONE_YEAR) -> None:
        super().__init__(scope, id)
        check_type(props, "props", DrafterTrainingProps, "a DrafterTrainingProps")
        props.validate()
        if not isinstance(stage, str) or not _STAGE.match(stage):
            raise ConfigError("stage", f"got {str(stage)[:40]!r}; allowed: 1-18 lowercase letters, digits and single "
                                       "hyphens (it names the training jobs, at most 63 characters with their id)")
        try:
            job = TrainingJobConfig(stage=stage, target_name=target_name, k=k, margin=props.margin,
                                    max_tokens=props.max_tokens, bundle_sha256=bundle_sha256,
                                    cpu_seconds=props.cpu_seconds)
        except TrainingJobError as exc:
            raise ConfigError(exc.field_name, str(exc).split(": ", 1)[1]) from None
        pinned = S3Prefix.parse(bundle) if isinstance(bundle, str) and bundle.startswith("s3://") else None
        parent = posixpath.dirname(pinned.key_prefix.rstrip("/")) if pinned is not None else ""
        if pinned is None or not pinned.bucket or not parent or \
                pinned.uri != bundle_uri(f"s3://{pinned.bucket}/{parent}/", bundle_sha256):
            raise ConfigError("bundle", f"got {str(bundle)[:80]!r}; allowed: s3://bucket/prefix/"
                                        f"{bundle_sha256[:12]}.../, the bundle bundle_sha256 names (as `make "
                                        "stage-weights` wrote it)")
        check_type(capture, "capture", CaptureDelivery, "the stage's CaptureDelivery (its records and bucket)")
        delivery, capture = capture, S3Prefix(bucket=capture.bucket.bucket_name, key_prefix=capture.prefix)
        local_nvme = GPU_FAMILIES[InstanceType.of(props.instance_type, "instance_type").family].local_nvme
        stack = Stack.of(self)
        self.stage, self.job = stage, job
        self.parameter_name = candidate_parameter_name(stage)
        output = f"{OUTPUT_PREFIX}{stage}/"
        checkpoints = f"{CHECKPOINT_PREFIX}{stage}/"

        # The candidates live beside the records they were trained on: one bucket of the stage, under its key, whose
        # policy lets only the stream write records and only this job's role write anything else.
        self.bucket = delivery.bucket
        self.bucket.add_lifecycle_rule(id="ExpireTrainingCheckpoints", prefix=checkpoints,
                                       expiration=Duration.days(CHECKPOINT_DAYS))
        prefix = job_name_prefix(stage)
        job_arn = f"arn:{Aws.PARTITION}:sagemaker:{Aws.REGION}:{Aws.ACCOUNT_ID}:training-job/{prefix}-*"
        # No source condition on the trust, as on the model's execution role: SageMaker's documentation does not
        # say it sends aws:SourceArn when it assumes a job's role, and one it does not send fails every job. Who may
        # hand the role to a job is the control: iam:PassRole, granted to this state machine alone.
        self.role = iam.Role(
            self, "JobRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"SageMaker runs {stage}'s drafter training jobs: reads its capture and pinned bundle, "
                        "writes its candidates")
        bound = image.bind(self)
        own = {"StringEquals": {"s3:ResourceAccount": Aws.ACCOUNT_ID}}
        job_log_group = (f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:"
                         "log-group:/aws/sagemaker/TrainingJobs")
        self.policy = iam.ManagedPolicy(self, "JobPolicy", roles=[self.role], statements=[
            *read_prefix_statements([capture], account=Aws.ACCOUNT_ID),
            *read_prefix_statements([pinned], account=weights_account or Aws.ACCOUNT_ID),
            iam.PolicyStatement(actions=["s3:PutObject", "s3:AbortMultipartUpload", "s3:GetObject"],
                                resources=[self.bucket.arn_for_objects(f"{output}*"),
                                           self.bucket.arn_for_objects(f"{checkpoints}*")], conditions=own),
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn], conditions={
                "StringLike": {"s3:prefix": [f"{checkpoints}*"]}, **own}),
            # The channels are read, and the output written, by S3 on the job's behalf: the key through S3 only.
            iam.PolicyStatement(actions=["kms:Decrypt", "kms:GenerateDataKey", "kms:Encrypt"],
                                resources=[key.key_arn, *([] if weights_key is None else [weights_key.key_arn])],
                                conditions={"StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}}),
            # The storage volume's encryption: SageMaker creates the grant for the job's volume, never for a person.
            *([] if local_nvme else [iam.PolicyStatement(actions=["kms:CreateGrant"], resources=[key.key_arn],
                                                         conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}})]),
            *bound.pull_statements(),
            iam.PolicyStatement(actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                                         "logs:DescribeLogStreams"],
                                resources=[job_log_group, f"{job_log_group}:log-stream:{prefix}-*"]),
            iam.PolicyStatement(actions=["cloudwatch:PutMetricData"], resources=["*"], conditions={
                "StringEquals": {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}}),
        ])
        delivery.allow_writer(self.role, prefixes=(output, checkpoints))
        self.parameter = ssm.StringParameter(
            self, "Candidate", parameter_name=self.parameter_name, string_value="none",
            description=f"{stage}'s last drafter candidate that passed its gate (JSON: its pin, figures, location); "
                        "written by the drafter training state machine")

        name = sfn.Pass(self, "Name", parameters={"job.$": f"States.Format('{prefix}-{{}}', States.UUID())"},
                        result_path="$.run")
        train = sfn.CustomState(self, "Train", state_json={
            "Type": "Task", "Resource": f"arn:{Aws.PARTITION}:states:::sagemaker:createTrainingJob.sync",
            "Parameters": self._job_request(bound.image_uri, capture, pinned, output=output, checkpoints=checkpoints,
                                            key=key, props=props, local_nvme=local_nvme),
            "ResultSelector": {"status.$": "$.TrainingJobStatus"}, "ResultPath": "$.trained"})
        reports = self.bucket.arn_for_objects(_job_output(output, f"{prefix}-*", GATE_REPORT))
        read = tasks.CallAwsService(
            self, "ReadReport", service="s3", action="getObject", iam_action="s3:GetObject", iam_resources=[reports],
            parameters={"Bucket": self.bucket.bucket_name,
                        "Key": sfn.JsonPath.format(_job_output(output, "{}", GATE_REPORT),
                                                   sfn.JsonPath.string_at("$.run.job"))},
            result_selector={"report": sfn.JsonPath.string_to_json(sfn.JsonPath.string_at("$.Body"))},
            result_path="$.gate")
        candidate = {"candidate_sha256": sfn.JsonPath.string_at("$.gate.report.candidate_sha256"),
                     "al_before": sfn.JsonPath.number_at("$.gate.report.al_before.value"),
                     "al_after": sfn.JsonPath.number_at("$.gate.report.al_after.value"),
                     "training_job": sfn.JsonPath.string_at("$.run.job"),
                     "manifest": sfn.JsonPath.format(
                         f"s3://{self.bucket.bucket_name}/{_job_output(output, '{}', CANDIDATE_MANIFEST)}",
                         sfn.JsonPath.string_at("$.run.job"))}
        publish = tasks.CallAwsService(
            self, "Publish", service="ssm", action="putParameter", iam_action="ssm:PutParameter",
            iam_resources=[self.parameter.parameter_arn],
            parameters={"Name": self.parameter_name, "Overwrite": True, "Type": "String",
                        "Value": sfn.JsonPath.json_to_string(sfn.JsonPath.object_at("$.candidate"))},
            result_path=sfn.JsonPath.DISCARD)
        shape = sfn.Pass(self, "Figures", parameters=candidate, result_path="$.candidate")
        refused = sfn.Fail(self, "Refused", error="GateRefused", cause_path=sfn.JsonPath.format(
            "the candidate's AL {} against {} in service did not pass the gate; nothing published",
            sfn.JsonPath.string_at("$.gate.report.al_after.value"),
            sfn.JsonPath.string_at("$.gate.report.al_before.value")))
        gate = sfn.Choice(self, "Gate").when(
            sfn.Condition.string_equals("$.gate.report.gate", "passed"), shape.next(publish)).otherwise(refused)
        # Fixed names, so a deploy's execution policy can name what it creates (stacks.deploy_permissions).
        self.name = training_name(stage)
        self.log_group = logs.LogGroup(self, "Logs", log_group_name=f"/aws/vendedlogs/states/{self.name}",
                                       encryption_key=key, retention=log_retention, removal_policy=removal_policy)
        # The role's one policy is written out here (a managed policy, not the inline one CDK would grow from each
        # task's grants): what the state machine may do is read in one place, and nothing is added behind it.
        machines = f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:stateMachine:*"
        self.state_machine_role = iam.Role(self, "StateMachineRole", assumed_by=iam.ServicePrincipal(
            "states.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                                                "ArnLike": {"aws:SourceArn": machines}}),
            description=f"Step Functions runs {stage}'s drafter training: one job, its report, the candidate's pin")
        self.state_machine_policy = iam.ManagedPolicy(
            self, "StateMachinePolicy", roles=[self.state_machine_role],
            statements=self._state_machine_statements(job_arn, report=reports, key=key))
        self.state_machine = sfn.StateMachine(
            self, "StateMachine", state_machine_name=self.name,
            definition_body=sfn.DefinitionBody.from_chainable(name.next(train).next(read).next(gate)),
            role=self.state_machine_role.without_policy_updates(), timeout=props.max_runtime.plus(Duration.hours(1)),
            tracing_enabled=True,
            # Without the execution data: the state's input and output hold the gate's figures, never records.
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=False))
        # Step Functions checks at creation that its role may deliver the logs.
        self.state_machine.node.add_dependency(self.state_machine_policy)
        if props.schedule is not None:
            starter = iam.Role(self, "ScheduleRole", assumed_by=iam.ServicePrincipal(
                "events.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}),
                description=f"EventBridge starts {stage}'s drafter training on its schedule, nothing else")
            iam.ManagedPolicy(self, "SchedulePolicy", roles=[starter], statements=[iam.PolicyStatement(
                actions=["states:StartExecution"], resources=[self.state_machine.state_machine_arn])])
            aws_events.Rule(self, "Schedule", rule_name=self.name, schedule=props.schedule, targets=[
                targets.SfnStateMachine(self.state_machine, role=starter.without_policy_updates())])
        # Each remaining wildcard as cdk-nag spells it (pseudo parameters and resources as <...>).
        bucket = f"<{stack.resolve(stack.get_logical_id(self.bucket.node.default_child))}.Arn>"
        here = "<AWS::Partition>:{service}:<AWS::Region>:<AWS::AccountId>"
        security.acknowledge_drafter_training(
            job_policy=self.policy, state_machine_policy=self.state_machine_policy,
            written=[f"{bucket}/{p}*" for p in (output, checkpoints)],
            read=[f"arn:<AWS::Partition>:s3:::{_as_nag_spells(stack, p.bucket)}/{p.key_prefix}*"
                  for p in (capture, pinned)],
            log_streams=f"arn:{here.format(service='logs')}:log-group:/aws/sagemaker/TrainingJobs:log-stream:"
                        f"{prefix}-*",
            jobs=f"arn:{here.format(service='sagemaker')}:training-job/{prefix}-*",
            reports=f"{bucket}/{_job_output(output, f'{prefix}-*', GATE_REPORT)}")

    def _job_request(self, image_uri: str, capture: S3Prefix, pinned: S3Prefix, *, output: str, checkpoints: str,
                     key: kms.IKey, props: DrafterTrainingProps, local_nvme: bool) -> dict:
        """CreateTrainingJob's request, as the state machine sends it (tests check it against botocore's model)."""
        def channel(name: str, where: S3Prefix) -> dict:
            return {"ChannelName": name, "InputMode": "File", "DataSource": {"S3DataSource": {
                "S3DataType": "S3Prefix", "S3Uri": where.uri, "S3DataDistributionType": "FullyReplicated"}}}

        bucket = self.bucket.bucket_name
        return {
            "TrainingJobName.$": "$.run.job",
            "RoleArn": self.role.role_arn,
            "AlgorithmSpecification": {"TrainingImage": image_uri, "TrainingInputMode": "File",
                                       "ContainerEntrypoint": [TRAINER_COMMAND],
                                       "ContainerArguments": [TRAIN_ARGUMENT]},
            "HyperParameters": render_hyperparameters(self.job),
            "InputDataConfig": [channel(CAPTURE_CHANNEL, capture), channel(BUNDLE_CHANNEL, pinned)],
            "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/{output}", "KmsKeyId": key.key_arn,
                                 "CompressionType": "NONE"},
            "CheckpointConfig": {"S3Uri.$": f"States.Format('s3://{bucket}/{checkpoints}{{}}/', $.run.job)",
                                 "LocalPath": LOCAL_CHECKPOINTS},
            # A family with local NVMe disks encrypts them in hardware, and SageMaker refuses a volume key for it.
            "ResourceConfig": {"InstanceType": props.instance_type, "InstanceCount": 1,
                               "VolumeSizeInGB": props.volume_size_gb,
                               **({} if local_nvme else {"VolumeKmsKeyId": key.key_arn})},
            "StoppingCondition": {"MaxRuntimeInSeconds": int(props.max_runtime.to_seconds())},
            "EnableNetworkIsolation": True,
            "EnableInterContainerTrafficEncryption": True,
        }

    def _state_machine_statements(self, job_arn: str, *, report: str, key: kms.IKey) -> list[iam.PolicyStatement]:
        """Start, watch and stop this stage's jobs (the .sync task watches them through Step Functions' managed
        rule), pass the job's role to SageMaker only, read a job's report, publish the candidate, and the logs and
        traces Step Functions delivers."""
        return [
            iam.PolicyStatement(actions=["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob",
                                         "sagemaker:StopTrainingJob"], resources=[job_arn]),
            iam.PolicyStatement(actions=["iam:PassRole"], resources=[self.role.role_arn],
                                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}),
            iam.PolicyStatement(actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                                resources=[f"arn:{Aws.PARTITION}:events:{Aws.REGION}:{Aws.ACCOUNT_ID}:"
                                           "rule/StepFunctionsGetEventsForSageMakerTrainingJobsRule"]),
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[report]),
            iam.PolicyStatement(actions=["kms:Decrypt"], resources=[key.key_arn], conditions={
                "StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}}),
            iam.PolicyStatement(actions=["ssm:PutParameter"], resources=[self.parameter.parameter_arn]),
            # Log delivery and X-Ray have no resource-level permissions (the service authorization reference).
            iam.PolicyStatement(actions=list(LOG_DELIVERY_ACTIONS), resources=["*"]),
            iam.PolicyStatement(actions=list(TRACE_ACTIONS), resources=["*"]),
        ]

    @property
    def state_machine_arn(self) -> str:
        return self.state_machine.state_machine_arn
