"""CaptureDelivery: a container log group's capture records, delivered to S3 as JSON lines for training.

The runtime writes each capture record as one line of its stdout (``peagle_contract.capture``), which SageMaker
ships to the container's log group. Training needs them in S3 (``make train-drafter CAPTURE=s3://...`` and a
training job read a prefix), so this wires the path CloudWatch Logs offers: a subscription filter with the
contract's own pattern, a Firehose stream that undoes CloudWatch's envelope (decompression, then message
extraction: only each record's line is kept) and ends every record with a newline, and a bucket of the stage's
own, encrypted with the log group's key and emptied after the logs' retention.

What an attacker could do here, and what stops it:
- **Write training data.** Whoever can put objects under the capture prefix chooses what the next drafter learns
  and what its gate is measured on (the held-out requests come from the same prefix). The bucket policy refuses
  ``s3:PutObject`` to every principal but the stream's own role, so not even an administrator's role writes an
  object without first changing the policy (which CloudTrail records). What it cannot stop: Firehose has no
  resource policy, so a principal whose own IAM policy allows ``firehose:PutRecord`` on the stream can send it
  records, which the stream then writes. No role of the stages is granted that but the subscription's; an
  account's administrators can grant it, as they can rewrite the bucket policy.
- **Receive the traffic.** Bucket names are global: a bucket of the same name in another account would take the
  records if ours were ever gone. The stream's role may write only to a bucket its own account owns
  (``s3:ResourceAccount``).
- **Feed the stream.** Only CloudWatch Logs, for this account's log groups (``aws:SourceArn``), may assume the
  role that puts into the stream.
Records the filter lets through are checked again when read (``peagle_contract.capture.read_records``).
"""

from __future__ import annotations

from typing import Sequence

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesisfirehose as firehose
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from peagle_contract.capture import FILTER_PATTERN

from peagle_constructs import security
from peagle_constructs.errors import ConfigError
from peagle_constructs.validation import check_type

CAPTURE_PREFIX = "capture/"  # what `make train-drafter CAPTURE=s3://<bucket>/capture/<stage>/` reads
ERROR_PREFIX = "delivery-errors/"  # what Firehose could not process: never under the capture prefix
FILE_EXTENSION = ".jsonl"  # the reader takes .jsonl objects only
# Firehose buffers up to 5 minutes or 64 MiB before it writes an object: records reach S3 within minutes.
BUFFER_SECONDS, BUFFER_MIB = 300, 64


def capture_prefix(stage: str) -> str:
    """The key prefix a stage's records land under (one dated folder per day below it)."""
    return f"{CAPTURE_PREFIX}{stage}/"


class CaptureDelivery(Construct):
    """Delivers the capture records of ``log_group`` (written by a container with capture on) to a bucket.

    ``key`` encrypts the bucket and the stream (the log group's own key: the records keep one key from the
    container to S3); ``stage`` names the prefix (``capture/<stage>/``), as the records name their stage;
    ``expiration`` how long a record is kept (give the log group's retention; None keeps them until removed);
    ``bucket_name`` a fixed name (default: one CloudFormation generates)::

        CaptureDelivery(self, "Capture", log_group=monitoring.log_group, key=monitoring.key, stage="dev",
                        expiration=Duration.days(365))

    ``bucket``, ``stream`` and ``prefix`` are what a trainer reads from.
    """

    def __init__(self, scope: Construct, id: str, *, log_group: logs.ILogGroup, key: kms.IKey, stage: str,
                 expiration: Duration | None = Duration.days(365),
                 removal_policy: RemovalPolicy = RemovalPolicy.RETAIN, bucket_name: str | None = None) -> None:
        super().__init__(scope, id)
        if expiration is not None:
            check_type(expiration, "expiration", Duration, "a Duration or None")
        if not isinstance(stage, str) or not stage or "/" in stage or len(stage) > 64:
            raise ConfigError("stage", f"got {str(stage)[:40]!r}; allowed: 1-64 characters without '/', the "
                                       "stage the records name")
        self.prefix = capture_prefix(stage)
        expiry = [] if expiration is None else [s3.LifecycleRule(
            id="ExpireWithTheLogs", prefix=CAPTURE_PREFIX, expiration=expiration)]
        self.bucket = s3.Bucket(
            self, "Bucket", bucket_name=bucket_name, encryption=s3.BucketEncryption.KMS, encryption_key=key,
            bucket_key_enabled=True, enforce_ssl=True, versioned=True, removal_policy=removal_policy,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[*expiry,
                             s3.LifecycleRule(id="ExpireDeliveryErrors", prefix=ERROR_PREFIX,
                                              expiration=Duration.days(30)),
                             s3.LifecycleRule(id="NoncurrentAndUploads", noncurrent_version_expiration=Duration.days(1),
                                              abort_incomplete_multipart_upload_after=Duration.days(1))])
        # An object landing is an EventBridge event (a rule of the account's choosing can start training), set on
        # the bucket itself: CDK's event_bridge_enabled would add a Lambda function to do what CloudFormation does.
        self.bucket.node.default_child.add_property_override(
            "NotificationConfiguration.EventBridgeConfiguration.EventBridgeEnabled", True)
        self.role = iam.Role(self, "DeliveryRole", assumed_by=iam.ServicePrincipal(
            "firehose.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}),
            description="Firehose writes a stage's capture records to its bucket, nothing else")
        own_account = {"StringEquals": {"s3:ResourceAccount": Aws.ACCOUNT_ID}}
        delivery = iam.ManagedPolicy(self, "DeliveryPolicy", roles=[self.role], statements=[
            iam.PolicyStatement(actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                                resources=[self.bucket.arn_for_objects(f"{CAPTURE_PREFIX}*"),
                                           self.bucket.arn_for_objects(f"{ERROR_PREFIX}*")], conditions=own_account),
            iam.PolicyStatement(actions=["s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
                                resources=[self.bucket.bucket_arn], conditions=own_account),
            iam.PolicyStatement(actions=["kms:GenerateDataKey", "kms:Decrypt"], resources=[key.key_arn],
                                conditions={"StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}}),
        ])
        # Every writer but the stream (and those allow_writer names) is refused: the records are a drafter's
        # training data and its gate's.
        self._writers: list[str] = [self.role.role_arn]
        self._only_writers = iam.PolicyStatement(
            sid="OnlyTheStreamWritesRecords", effect=iam.Effect.DENY, principals=[iam.AnyPrincipal()],
            actions=["s3:PutObject"], resources=[self.bucket.arn_for_objects("*")],
            conditions={"ArnNotEquals": {"aws:PrincipalArn": self.role.role_arn}})
        self.bucket.add_to_resource_policy(self._only_writers)
        self.stream = firehose.CfnDeliveryStream(
            self, "Stream", delivery_stream_type="DirectPut",
            delivery_stream_encryption_configuration_input=firehose.CfnDeliveryStream.
            DeliveryStreamEncryptionConfigurationInputProperty(key_type="CUSTOMER_MANAGED_CMK", key_arn=key.key_arn),
            extended_s3_destination_configuration=firehose.CfnDeliveryStream.ExtendedS3DestinationConfigurationProperty(
                bucket_arn=self.bucket.bucket_arn, role_arn=self.role.role_arn,
                prefix=f"{self.prefix}!{{timestamp:yyyy/MM/dd}}/",
                error_output_prefix=f"{ERROR_PREFIX}{stage}/!{{firehose:error-output-type}}/!{{timestamp:yyyy/MM/dd}}/",
                file_extension=FILE_EXTENSION, compression_format="UNCOMPRESSED",
                buffering_hints=firehose.CfnDeliveryStream.BufferingHintsProperty(
                    interval_in_seconds=BUFFER_SECONDS, size_in_m_bs=BUFFER_MIB),
                encryption_configuration=firehose.CfnDeliveryStream.EncryptionConfigurationProperty(
                    kms_encryption_config=firehose.CfnDeliveryStream.KMSEncryptionConfigProperty(
                        awskms_key_arn=key.key_arn)),
                processing_configuration=firehose.CfnDeliveryStream.ProcessingConfigurationProperty(
                    enabled=True, processors=[
                        _processor("Decompression", CompressionFormat="GZIP"),
                        _processor("CloudWatchLogProcessing", DataMessageExtraction="true"),
                        _processor("AppendDelimiterToRecord")])))
        self.stream.node.add_dependency(delivery)  # Firehose checks its role can write when the stream is made
        self.subscription_role = iam.Role(self, "SubscriptionRole", assumed_by=iam.ServicePrincipal(
            "logs.amazonaws.com", conditions={"ArnLike": {"aws:SourceArn": f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:"
                                                                            f"{Aws.ACCOUNT_ID}:log-group:*"}}),
            description="CloudWatch Logs puts a stage's capture records into its Firehose stream")
        subscription = iam.ManagedPolicy(self, "SubscriptionPolicy", roles=[self.subscription_role], statements=[
            iam.PolicyStatement(actions=["firehose:PutRecord", "firehose:PutRecordBatch"],
                                resources=[self.stream.attr_arn])])
        self.filter = logs.CfnSubscriptionFilter(
            self, "Filter", log_group_name=log_group.log_group_name, filter_pattern=FILTER_PATTERN,
            destination_arn=self.stream.attr_arn, role_arn=self.subscription_role.role_arn)
        self.filter.node.add_dependency(subscription)
        stack = Stack.of(self)
        bucket_id = stack.resolve(stack.get_logical_id(self.bucket.node.default_child))
        security.acknowledge_capture_delivery(self, bucket=self.bucket, policy=delivery, object_prefixes=[
            f"<{bucket_id}.Arn>/{prefix}*" for prefix in (CAPTURE_PREFIX, ERROR_PREFIX)])

    def allow_writer(self, role: iam.IRole, *, prefixes: Sequence[str]) -> None:
        """Let ``role`` put objects below ``prefixes`` of the bucket (a trainer's output beside the records it read);
        the bucket policy then still refuses it, and every principal but the stream, the capture's own prefixes."""
        for prefix in prefixes:
            if not prefix.endswith("/") or prefix.startswith((CAPTURE_PREFIX, ERROR_PREFIX)):
                raise ConfigError("prefixes", f"got {prefix[:60]!r}; allowed: a key prefix ending in '/' outside "
                                              f"{CAPTURE_PREFIX} and {ERROR_PREFIX} (the stream's alone)")
        if len(self._writers) == 1:
            self.bucket.add_to_resource_policy(iam.PolicyStatement(
                sid="OnlyTheStreamWritesTheCapture", effect=iam.Effect.DENY, principals=[iam.AnyPrincipal()],
                actions=["s3:PutObject"], resources=[self.bucket.arn_for_objects(f"{CAPTURE_PREFIX}*"),
                                                     self.bucket.arn_for_objects(f"{ERROR_PREFIX}*")],
                conditions={"ArnNotEquals": {"aws:PrincipalArn": self.role.role_arn}}))
        self._writers.append(role.role_arn)
        self._only_writers.add_condition("ArnNotEquals", {"aws:PrincipalArn": list(self._writers)})

    @property
    def capture_uri(self) -> str:
        """Where a trainer reads this stage's records: ``s3://<bucket>/capture/<stage>/``."""
        return f"s3://{self.bucket.bucket_name}/{self.prefix}"


def _processor(kind: str, **parameters: str) -> firehose.CfnDeliveryStream.ProcessorProperty:
    return firehose.CfnDeliveryStream.ProcessorProperty(type=kind, parameters=[
        firehose.CfnDeliveryStream.ProcessorParameterProperty(parameter_name=k, parameter_value=v)
        for k, v in parameters.items()] or None)
