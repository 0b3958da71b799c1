"""Copy a stage's traffic capture out of its log group into a local folder, as the JSON lines the trainer reads.

    python -m ops.capture_export --env Dev --out captures/dev [--hours 24] [--region us-east-1]
    make capture-export ENV=Dev OUT=captures/dev

The records are the container's capture lines (peagle_contract.capture) in the log group SageMaker writes the
container's output to: the endpoint's, or the inference component's. CloudWatch Logs selects them with the
capture's filter pattern. Each line is also checked here, because the pattern is the server's to apply: a log
line that is not a record is left out and counted. Every record is then read back as the trainer will read it,
for this stage and target. A record of another stage or target, or a cut or malformed one, is refused with
its place, and nothing is written.

What the caller needs: ``logs:FilterLogEvents`` on that one log group. CloudWatch Logs decrypts with the stage's
key on the caller's behalf, because the key lets the service use it for that group.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from peagle_contract.capture import FILTER_PATTERN, CaptureError, is_record_line, read_records
from peagle_constructs.sagemaker_names import container_log_group

from ops.stages import StageNameError, find_stage


class ExportError(RuntimeError):
    pass


def export(logs: Any, *, log_group: str, out_dir: Path, stage: str, target: str, start_ms: int,
           end_ms: int) -> dict:
    """Write the capture records of ``log_group`` between ``start_ms`` and ``end_ms`` to one file in ``out_dir``,
    after checking each one; raise :class:`CaptureError` (and write nothing) when one is refused."""
    lines: list[str] = []
    not_records = 0
    kwargs = {"logGroupName": log_group, "filterPattern": FILTER_PATTERN, "startTime": start_ms, "endTime": end_ms}
    for page in logs.get_paginator("filter_log_events").paginate(**kwargs):
        for event in page.get("events", []):
            message = event.get("message", "").rstrip("\n")
            if is_record_line(message):
                lines.append(message)
            else:
                not_records += 1
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{log_group.strip('/').replace('/', '-')}-{start_ms}-{end_ms}.jsonl"
    partial = out_dir / ".partial" / final.name  # moved into place once every record was read back
    partial.parent.mkdir(exist_ok=True)
    partial.write_text("".join(line + "\n" for line in lines))
    try:
        capture = read_records([partial], stage=stage, target=target)
    except CaptureError:
        partial.unlink()
        raise
    finally:
        if partial.exists():
            os.replace(partial, final)
        partial.parent.rmdir()
    return {"file": str(final), "records": len(capture.records), "duplicates": capture.duplicates,
            "log_lines_not_records": not_records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.capture_export", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--out", required=True, type=Path, help="the folder the capture file is written to")
    parser.add_argument("--hours", type=float, default=24.0, help="how far back to read (default 24)")
    parser.add_argument("--region", default=None)
    args = parser.parse_args(argv)
    try:
        config = find_stage(args.env)
        capture = config.model.serving.capture
        if capture is None:
            raise ExportError(f"{config.name}.model.serving.capture: none; this stage records nothing (turn capture "
                              "on in its serving config first, docs/capture.md)")
        if not 0 < args.hours <= 24 * 366:
            raise ExportError(f"--hours: got {args.hours:g}; allowed: more than 0, at most 8784 (a year)")
        import boto3

        end_ms = int(time.time() * 1000)
        result = export(boto3.client("logs", region_name=args.region),
                        log_group=container_log_group(config.endpoint_name, config.component_name), out_dir=args.out,
                        stage=capture.stage, target=capture.target, start_ms=end_ms - int(args.hours * 3_600_000),
                        end_ms=end_ms)
    except (ExportError, StageNameError, CaptureError) as exc:
        print(f"capture-export: {exc}", file=sys.stderr)
        return 2
    print(f"capture-export: {result['records']} records -> {result['file']} ({result['duplicates']} delivered twice, "
          f"{result['log_lines_not_records']} log lines that were not records, left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
