"""What a capture stream does to what CloudWatch Logs sends it, done here for moto, which does none of it.

A stand-in at the edge, and only that. moto's CloudWatch Logs sends every new event of a subscribed group (it
applies no JSON pattern) to moto's Firehose, which writes each batch to S3 as it came: CloudWatch's gzipped
envelope, under the stream's prefix taken literally. This applies what the real services would: the subscription's
pattern (the contract's own test of a record line, which the pattern mirrors), Firehose's decompression, message
extraction and newline per record, and the ``.jsonl`` extension. What it cannot prove: that CloudWatch Logs applies
``FILTER_PATTERN`` as written, that Firehose's processors behave as their documentation says, its buffering, its
object names. Every other step (the filter on the right group, the stream into the right bucket and prefix,
the reader) is the real template on moto.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

from peagle_contract.capture import is_record_line


def process(s3: Any, bucket: str, prefix: str) -> list[str]:
    """Turn each object moto's Firehose wrote below ``prefix`` into the object the real stream would write (its
    record lines, one per line, ``<key>.jsonl``); the raw object is removed. Returns the keys written."""
    written = []
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    for key in [o["Key"] for o in listed if not o["Key"].endswith(".jsonl")]:
        envelope = json.loads(gzip.decompress(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
        if envelope.get("messageType") != "DATA_MESSAGE":
            continue  # CloudWatch's control messages carry no events; Firehose's extraction drops them
        lines = [e["message"] for e in envelope["logEvents"] if is_record_line(e["message"])]
        if lines:
            s3.put_object(Bucket=bucket, Key=f"{key}.jsonl", Body="".join(f"{line}\n" for line in lines).encode())
            written.append(f"{key}.jsonl")
        s3.delete_object(Bucket=bucket, Key=key)
    return written
