"""Dev's capture records, from its component's log group to `make train-drafter`'s S3 reader: the stage's real
template on moto (the subscription filter, the Firehose stream, the bucket), with the stream's processing done by
a stand-in (harness/aws/firehose_processing.py says what that cannot prove)."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from moto import mock_aws

from harness.aws import firehose_processing
from peagle_contract.capture import format_record, read_records
from peagle_contract.request_log import EVENT_NAME as REQUEST_EVENT
from stacks.environments import DEV

pytestmark = pytest.mark.usefixtures("moto_region")

CHAT = {"messages": [{"role": "user", "content": "explain zip() in one sentence"}], "max_tokens": 32}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Tried to parse AWS.CDK.Metadata")
def test_devs_records_reach_the_prefix_train_drafter_reads_and_nothing_else_does(stage_stacks, moto_region, tmp_path):
    from ops.train_drafter import capture_files

    capture = DEV.model.serving.capture
    assert capture is not None and capture.stage == "dev"
    (stack,) = stage_stacks["Dev"]
    record = format_record(config=capture, request_id="chatcmpl-7", route="/v1/chat/completions", stream=True,
                           request=CHAT, answer="zip pairs items of iterables.", finish_reason="stop",
                           prompt_tokens=12, output_tokens=7)
    request_line = json.dumps({"event": REQUEST_EVENT, "request_id": "chatcmpl-7", "ttft_ms": 12.5})
    with mock_aws():
        session = boto3.Session(region_name=moto_region)
        session.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String")
        cfn = session.client("cloudformation")
        cfn.create_stack(StackName=stack.stack_name, TemplateBody=stack.template_path.read_text(),
                         Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"])
        outputs = {o["OutputKey"]: o["OutputValue"] for o in cfn.describe_stacks(
            StackName=stack.stack_name)["Stacks"][0]["Outputs"]}
        uri = outputs["CaptureUri"]
        bucket, prefix = uri.removeprefix("s3://").split("/", 1)
        assert prefix == "capture/dev/"
        logs = session.client("logs")
        group = f"/aws/sagemaker/InferenceComponents/{DEV.component_name}"
        (subscription,) = logs.describe_subscription_filters(logGroupName=group)["subscriptionFilters"]
        assert subscription["destinationArn"].split(":")[2] == "firehose"
        logs.create_log_stream(logGroupName=group, logStreamName="copy-1")
        now = int(time.time() * 1000)  # CloudWatch Logs refuses events older than its retention
        logs.put_log_events(logGroupName=group, logStreamName="copy-1", logEvents=[
            {"timestamp": now, "message": "INFO vllm: engine started"},
            {"timestamp": now + 1, "message": request_line},
            {"timestamp": now + 2, "message": record}])
        s3 = session.client("s3")
        assert firehose_processing.process(s3, bucket, prefix)  # the stream's bucket, under the stage's prefix
        files = capture_files([uri], tmp_path, s3=s3)
        read = read_records(files, stage="dev", target=capture.target)
        assert [r["request_id"] for r in read.records] == ["chatcmpl-7"]
        assert read.records[0]["answer"] == "zip pairs items of iterables."
        # Another stage's reader refuses Dev's records by name: they cannot pass as Prod's.
        with pytest.raises(Exception, match="stage"):
            read_records(files, stage="prod", target=capture.target)
