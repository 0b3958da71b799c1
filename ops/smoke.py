"""`make smoke`: does the endpoint really answer? Through the real boto3 sagemaker-runtime client.

    make smoke ENV=dev TARGET=local     # the local runtime behind a SageMaker front door on loopback
    make smoke ENV=dev TARGET=aws       # the deployed endpoint (credentials and region as boto3 finds them)

Checks, in order: a whole answer (InvokeEndpoint), and the serving config its container says it runs (K,
drafter, method, vLLM release: boto3's CustomAttributes) against the deployed model's environment (aws) or
the one the runtime was started with (local); a streamed answer (InvokeEndpointWithResponseStream:
text arrives; TTFT and tokens/s printed), a wrongly typed request refused as SageMaker's ModelError with the
container's 400 - and the endpoint answers again after it. For aws, first: the endpoint serves what its stack
deployed (ops.live_config: a rolled-back update looks InService too); then the request lines reached the
endpoint's log group (what the metric filters read) and none of the endpoint's alarms is in ALARM; for
local: the runtime printed a request line for each answer.

Local: uses the runtime on 127.0.0.1:8080 when one answers (`make serve`), else starts one on the best pair
the cache holds (harness.serve.pick_pair) and stops it at the end; the front door always starts and stops here.
Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Mapping

import httpx

from ops.sagemaker_client import WholeResult, invoke, invoke_stream, runtime_client

REQUEST = {"messages": [{"role": "user", "content": "Write a Python function that returns the sum of a list."}],
           "max_tokens": 48, "temperature": 0}
BAD_REQUEST = {**REQUEST, "max_tokens": "48"}  # a string where an integer belongs
SERVE_PORT = 8080


@dataclass
class Report:
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, ok, detail))
        print(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


def endpoint_checks(client, endpoint: str, report: Report, *, component: str | None = None,
                    environment: Mapping[str, str] | None = None) -> None:
    """The checks every target shares: whole, what the container runs, streamed, refused, answering again.

    ``environment``: the container environment the endpoint was given; None (a runtime started elsewhere):
    the container's statement is only read."""
    from botocore.exceptions import ClientError

    from ops.live_config import served_mismatches
    from peagle_contract.served_config import ServedConfigError, parse

    whole: WholeResult = invoke(client, endpoint, REQUEST, component=component)
    report.check("InvokeEndpoint answers", bool(whole.text) and whole.output_tokens > 0,
                 f"{whole.output_tokens} tokens in {whole.seconds * 1000:.0f} ms, variant {whole.variant}")
    if environment is None:
        try:
            said = parse(whole.custom_attributes)
            report.check("the container says what it runs", True, f"K={said.k}, drafter {said.drafter}, vLLM {said.vllm}")
        except ServedConfigError as exc:
            report.check("the container says what it runs", False, str(exc))
    else:
        said, problems = served_mismatches(whole.custom_attributes, environment)
        report.check("the container runs the serving config deployed", not problems, "; ".join(problems) or
                     f"K={said.k}, {said.method} parallel drafting, drafter {said.drafter}, vLLM {said.vllm}")
    streamed = invoke_stream(client, endpoint, REQUEST, component=component)
    report.check("InvokeEndpointWithResponseStream streams", bool(streamed.text) and streamed.events > 1,
                 f"TTFT {streamed.ttft_s * 1000:.0f} ms, {streamed.output_tokens} tokens, "
                 f"{streamed.decode_tokens_per_s:.1f} tok/s after the first, {streamed.events} text events")
    try:
        invoke(client, endpoint, BAD_REQUEST, component=component)
        report.check("a wrongly typed request is refused", False, "it was answered")
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("OriginalStatusCode")
        report.check("a wrongly typed request is refused", error.get("Code") == "ModelError" and status == 400,
                     f"{error.get('Code')}, container status {status}: {str(exc.response.get('OriginalMessage'))[:90]}")
    again = invoke(client, endpoint, {**REQUEST, "max_tokens": 8}, component=component)
    report.check("the endpoint answers after it", again.output_tokens > 0)


def _answers(base: str) -> bool:
    try:
        return httpx.get(base + "/ping", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def smoke_local(endpoint: str, *, component: str | None = None, base: str | None = None,
                request_lines=None, environment: Mapping[str, str] | None = None) -> Report:
    """``base``: a runtime already running (else the one on :8080, else one started here); ``request_lines``:
    how to read that runtime's request log, ``environment`` what it was started with, when known."""
    from harness.front_door import FrontDoor
    from harness.runtime import LocalRuntime, local_serving
    from harness.serve import pick_pair

    report = Report()
    with ExitStack() as stack:
        runtime = None
        if base is None and _answers(f"http://127.0.0.1:{SERVE_PORT}"):
            base = f"http://127.0.0.1:{SERVE_PORT}"
        if base is not None:
            print(f"using the runtime already on {base}")
        else:
            kind, pair = pick_pair("auto")
            serving = local_serving(num_speculative_tokens=pair.trained_k(), max_model_len=2048)
            runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, serving=serving, name="smoke-runtime")
            print(f"starting a runtime ({kind} pair) on {runtime.base} ...", flush=True)
            stack.callback(runtime.stop)
            runtime.start().wait_ready(timeout_s=900)
            base = runtime.base
        door = stack.enter_context(FrontDoor(backend=base, endpoints={endpoint: component}))
        print(f"SageMaker front door for {endpoint!r}{f' (component {component!r})' if component else ''} on "
              f"{door.url}; the boto3 client goes through it")
        request_lines = request_lines or (runtime.request_lines if runtime else None)
        before = len(request_lines()) if request_lines else 0
        endpoint_checks(runtime_client(endpoint_url=door.url), endpoint, report, component=component,
                        environment=environment or (runtime.environment() if runtime else None))
        if request_lines is not None:
            lines = request_lines()[before:]
            report.check("a request line per answer in the runtime's log", len(lines) >= 3,
                         f"{len(lines)} lines, e.g. ttft_ms {lines[-1].get('ttft_ms') if lines else '-'}")
    return report


def smoke_aws(endpoint: str, *, component: str | None = None, region: str | None = None,
              log_wait_s: float = 180.0, stack_name: str | None = None) -> Report:
    """``stack_name``: the stack that deployed the endpoint; its live configuration is checked against it."""
    import boto3

    from ops import live_config
    from peagle_constructs.sagemaker_names import container_log_group
    from peagle_contract.request_log import EVENT_FIELD, EVENT_NAME

    report = Report()
    if stack_name is not None:
        # An update SageMaker rolled back leaves the endpoint InService on its old configuration.
        not_served = live_config.mismatches(boto3.Session(region_name=region), stack_name)
        report.check("the endpoint serves what the stack deployed", not not_served,
                     "; ".join(not_served) or f"the endpoint config and components of {stack_name}")
    started_ms = int(time.time() * 1000)
    deployed = live_config.deployed_environment(boto3.client("sagemaker", region_name=region), endpoint, component)
    endpoint_checks(runtime_client(region=region), endpoint, report, component=component, environment=deployed)
    logs = boto3.client("logs", region_name=region)
    group = container_log_group(endpoint, component)
    deadline, found = time.time() + log_wait_s, 0
    while time.time() < deadline and found < 3:  # log delivery takes seconds to a minute
        events = logs.filter_log_events(logGroupName=group, startTime=started_ms,
                                        filterPattern=f'{{ $.{EVENT_FIELD} = "{EVENT_NAME}" }}').get("events", [])
        found = len(events)
        if found < 3:
            time.sleep(10)
    report.check("the request lines reached the log group", found >= 3, f"{found} in {group}")
    alarms = boto3.client("cloudwatch", region_name=region).describe_alarms(AlarmNamePrefix=f"{component or endpoint}-")
    firing = [a["AlarmName"] for kind in ("MetricAlarms", "CompositeAlarms") for a in alarms.get(kind, [])
              if a.get("StateValue") == "ALARM"]
    total = len(alarms.get("MetricAlarms", [])) + len(alarms.get("CompositeAlarms", []))
    report.check("no alarm of the endpoint is in ALARM", not firing and total > 0,
                 f"{total} alarms, in ALARM: {firing or 'none'}")
    return report


def main(argv: list[str] | None = None) -> int:
    from stacks.environments import ENVIRONMENTS
    from stacks.serving_stack import stage_stack_name, when_idle

    parser = argparse.ArgumentParser(prog="python -m ops.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="dev", help="the environment (dev, staging, prod)")
    parser.add_argument("--target", choices=("local", "aws"), default="local")
    parser.add_argument("--region", help="aws: the endpoint's region (default: boto3's)")
    args = parser.parse_args(argv)
    by_name = {env.name.lower(): env for env in ENVIRONMENTS}
    if args.env.lower() not in by_name:
        parser.error(f"--env: got {args.env!r}; allowed: {', '.join(by_name)}")
    env = by_name[args.env.lower()]
    endpoint, component = env.endpoint_name, env.component_name
    print(f"smoke test of {endpoint}{f' / {component}' if component else ''} ({args.target}) through boto3's "
          "sagemaker-runtime client")
    if component and env.hosting.scaling.min_copies == 0:
        print(f"{env.name} scales to zero when idle: {when_idle(env.hosting.scaling)}")
    report = (smoke_local(endpoint, component=component) if args.target == "local"
              else smoke_aws(endpoint, component=component, region=args.region,
                             stack_name=stage_stack_name(env.name)))
    failed = [name for name, ok, _ in report.checks if not ok]
    print("smoke test passed" if not failed else f"smoke test FAILED: {', '.join(failed)}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
