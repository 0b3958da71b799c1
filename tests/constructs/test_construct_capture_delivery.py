"""With capture on, the records' way from the container's log group to S3: the contract's pattern, the prefix
`make train-drafter` reads, the stage's key, and who may write training data (judged, not only listed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peagle_contract.capture import FILTER_PATTERN, CaptureConfig

from tests.constructs.construct_helpers import one, resources
from tests.policy_judge import Place, Request, allowed

ACCOUNT, REGION = "333333333333", "eu-west-1"
CAPTURE = CaptureConfig(sample_rate=0.1, stage="dev", target="llama")


def _template(stack, serving, image, *, capture=CAPTURE):  # noqa: ANN001, ANN202
    from aws_cdk import RemovalPolicy
    from aws_cdk import aws_logs as logs
    from aws_cdk.assertions import Template

    from peagle_constructs import FleetProps, ModelProps, PEagleEndpoint

    endpoint = PEagleEndpoint(stack, "Serving", model=ModelProps(serving=replace(serving, capture=capture)),
                              image=image, fleet=FleetProps(instance_type="ml.g6e.xlarge",
                                                            log_retention=logs.RetentionDays.THREE_MONTHS,
                                                            removal_policy=RemovalPolicy.DESTROY))
    return endpoint, Template.from_stack(stack)


def _place(template: dict) -> Place:
    """Each resource's Ref and Arn as a placeholder of its logical id (enough to tell them apart)."""
    physical = {}
    for lid, r in template["Resources"].items():
        arn = {"AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{lid}",
               "AWS::S3::Bucket": f"arn:aws:s3:::{lid.lower()}",
               "AWS::KinesisFirehose::DeliveryStream": f"arn:aws:firehose:{REGION}:{ACCOUNT}:deliverystream/{lid}",
               "AWS::KMS::Key": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{lid}"}.get(r["Type"], lid)
        physical[lid], physical[f"{lid}.Arn"] = lid.lower(), arn
    return Place(account=ACCOUNT, region=REGION, physical=physical)


def test_records_go_from_the_container_log_group_to_the_prefix_the_trainer_reads(stack, serving, image):
    from peagle_constructs.capture_delivery import capture_prefix

    endpoint, template = _template(stack, serving, image)
    monitoring = endpoint.monitoring
    (_, subscription), (_, stream) = one(template, "AWS::Logs::SubscriptionFilter"), one(
        template, "AWS::KinesisFirehose::DeliveryStream")
    group_id = stack.resolve(monitoring.log_group.node.default_child.logical_id)
    assert subscription["Properties"]["FilterPattern"] == FILTER_PATTERN  # the contract's own, not a copy
    assert subscription["Properties"]["LogGroupName"] == {"Ref": group_id}
    s3 = stream["Properties"]["ExtendedS3DestinationConfiguration"]
    assert s3["Prefix"].startswith(capture_prefix("dev")) and s3["FileExtension"] == ".jsonl"
    assert not s3["ErrorOutputPrefix"].startswith("capture/")  # what failed is never read as training data
    assert s3["CompressionFormat"] == "UNCOMPRESSED"
    steps = [p["Type"] for p in s3["ProcessingConfiguration"]["Processors"]]
    assert steps == ["Decompression", "CloudWatchLogProcessing", "AppendDelimiterToRecord"]
    assert monitoring.capture.capture_uri.endswith("/capture/dev/")


def test_the_records_keep_the_log_groups_key_and_expire_with_its_retention(stack, serving, image):
    endpoint, template = _template(stack, serving, image)
    key = {"Fn::GetAtt": [stack.resolve(endpoint.monitoring.key.node.default_child.logical_id), "Arn"]}
    (_, bucket), (_, stream) = one(template, "AWS::S3::Bucket"), one(template, "AWS::KinesisFirehose::DeliveryStream")
    rule = bucket["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert rule["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}
    assert stream["Properties"]["DeliveryStreamEncryptionConfigurationInput"]["KeyARN"] == key
    expiry = [r for r in bucket["Properties"]["LifecycleConfiguration"]["Rules"] if r.get("Prefix") == "capture/"]
    assert [r["ExpirationInDays"] for r in expiry] == [90]  # THREE_MONTHS, the log group's
    # A destroyed stack keeps its records (they expire by the rule above), even on a fleet that deletes the rest.
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"


def test_no_principal_but_the_streams_role_may_write_training_data(stack, serving, image):
    """The attack: put crafted records under the prefix, so the next drafter (and its gate) learns from them."""
    _, template = _template(stack, serving, image)
    document = template.to_json()
    place = _place(document)
    (_, policy) = one(template, "AWS::S3::BucketPolicy")
    (role_id,) = [lid for lid in resources(template, "AWS::IAM::Role") if "CaptureDeliveryRole" in lid]
    (bucket_id,) = resources(template, "AWS::S3::Bucket")
    key = f"arn:aws:s3:::{bucket_id.lower()}/capture/dev/2026/12/07/forged.jsonl"
    bucket_policy = policy["Properties"]["PolicyDocument"]
    # The bucket policy alone allows nothing, so "not denied" is what a caller's own IAM policy could then allow.
    everything = {"Statement": [*bucket_policy["Statement"], {"Effect": "Allow", "Principal": {"AWS": "*"},
                                                                "Action": "s3:*", "Resource": "*"}]}

    def may_put(principal: str) -> bool:
        return allowed(everything, Request(service="", action="s3:PutObject", resource=key, context={
            "aws:PrincipalArn": principal, "aws:SecureTransport": "true"}), place)

    assert may_put(f"arn:aws:iam::{ACCOUNT}:role/{role_id}")
    for intruder in (f"arn:aws:iam::{ACCOUNT}:role/Admin", f"arn:aws:iam::{ACCOUNT}:root",
                     f"arn:aws:iam::444444444444:role/{role_id}"):
        assert not may_put(intruder), intruder
    # Negative control: without the bucket policy's deny, the same administrator's put would pass.
    opened = {"Statement": [s for s in everything["Statement"] if s.get("Sid") != "OnlyTheStreamWritesRecords"]}
    assert allowed(opened, Request(service="", action="s3:PutObject", resource=key, context={
        "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/Admin", "aws:SecureTransport": "true"}), place)


def test_the_stream_writes_only_to_a_bucket_its_own_account_owns(stack, serving, image):
    """The attack: a bucket of the same (global) name in another account takes the records if ours is gone."""
    _, template = _template(stack, serving, image)
    place = _place(template.to_json())
    (policy,) = [p for lid, p in resources(template, "AWS::IAM::ManagedPolicy").items() if "CaptureDelivery" in lid]
    document = policy["Properties"]["PolicyDocument"]
    (bucket_id,) = resources(template, "AWS::S3::Bucket")
    key = f"arn:aws:s3:::{bucket_id.lower()}/capture/dev/x.jsonl"
    ours = Request(service="", action="s3:PutObject", resource=key, context={"s3:ResourceAccount": ACCOUNT})
    theirs = Request(service="", action="s3:PutObject", resource=key, context={"s3:ResourceAccount": "444444444444"})
    assert allowed(document, ours, place, identity=True)
    assert not allowed(document, theirs, place, identity=True)
    # Nothing else: no read of the records, no delete, no object outside the two prefixes.
    for action, resource in (("s3:GetObject", key), ("s3:DeleteObject", key),
                             ("s3:PutObject", f"arn:aws:s3:::{bucket_id.lower()}/bundles/x")):
        assert not allowed(document, Request(service="", action=action, resource=resource, context={
            "s3:ResourceAccount": ACCOUNT}), place, identity=True), (action, resource)


def test_only_cloudwatch_logs_of_this_account_may_feed_the_stream(stack, serving, image):
    _, template = _template(stack, serving, image)
    place = _place(template.to_json())
    (trust,) = [r["Properties"]["AssumeRolePolicyDocument"] for lid, r in resources(template, "AWS::IAM::Role").items()
                if "CaptureSubscriptionRole" in lid]
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/Endpoints/x"
    assume = lambda service, source: Request(service=service, action="sts:AssumeRole", resource="*",  # noqa: E731
                                             context={"aws:SourceArn": source})
    assert allowed(trust, assume("logs.amazonaws.com", group), place)
    assert not allowed(trust, assume("logs.amazonaws.com", group.replace(ACCOUNT, "444444444444")), place)
    assert not allowed(trust, assume("firehose.amazonaws.com", group), place)


def test_without_capture_nothing_is_delivered(stack, serving, image):
    endpoint, template = _template(stack, serving, image, capture=None)
    assert endpoint.monitoring.capture is None
    for kind in ("AWS::S3::Bucket", "AWS::KinesisFirehose::DeliveryStream", "AWS::Logs::SubscriptionFilter"):
        assert resources(template, kind) == {}, kind


def test_the_delivery_passes_every_pack_with_only_its_named_acknowledgements(stack, serving, image):
    from peagle_constructs import NAG_PACKS
    from peagle_constructs.security import acknowledged_findings

    endpoint, _ = _template(stack, serving, image)
    for pack in NAG_PACKS:
        report = pack().validate_scope(stack)
        assert report.success, (pack.__name__, [v.rule_name for v in report.violations])
    found = acknowledged_findings(endpoint.monitoring.capture.bucket)
    assert all(len(reason) > 60 for reason in found.values()) and "AwsSolutions-S1" in found


@pytest.mark.parametrize("stage", ["", "a/b", "x" * 65, 7])
def test_a_bad_stage_is_refused_by_name(stack, stage):
    from aws_cdk import RemovalPolicy
    from aws_cdk import aws_kms as kms
    from aws_cdk import aws_logs as logs

    from peagle_constructs import CaptureDelivery, ConfigError

    key = kms.Key(stack, "Key")
    group = logs.LogGroup(stack, "Group", removal_policy=RemovalPolicy.DESTROY)
    with pytest.raises(ConfigError, match=r"stage.*allowed: 1-64 characters"):
        CaptureDelivery(stack, "Capture", log_group=group, key=key, stage=stage)


@pytest.mark.parametrize("prefix", ["capture/dev/", "delivery-errors/", "candidates/dev"])
def test_another_writer_is_never_let_into_the_captures_own_prefixes(stack, prefix):
    from aws_cdk import RemovalPolicy
    from aws_cdk import aws_iam as iam
    from aws_cdk import aws_kms as kms
    from aws_cdk import aws_logs as logs

    from peagle_constructs import CaptureDelivery, ConfigError

    group = logs.LogGroup(stack, "Group", removal_policy=RemovalPolicy.DESTROY)
    capture = CaptureDelivery(stack, "Capture", log_group=group, key=kms.Key(stack, "Key"), stage="dev")
    role = iam.Role(stack, "Trainer", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    with pytest.raises(ConfigError, match=r"prefixes: got .*allowed: a key prefix ending in '/' outside capture/"):
        capture.allow_writer(role, prefixes=[prefix])
