"""What the promotion's jobs reach instead of AWS: an embedded account that the real CDK CLI deploys into,
and endpoints that really answer.

- AWS's control plane: moto's server with our CloudFormation extension (harness.aws), bootstrapped once by
  the real ``cdk bootstrap`` as a real account is (README: "Deploy to your account", step 1). The jobs reach
  it through ``AWS_ENDPOINT_URL``, set by the configure-aws-credentials stand-in.
- SageMaker Runtime: the front door (harness.front_door) for every stage's endpoint, in front of one local
  runtime (our entrypoint and vLLM on the CPU, the tiny pair). It is given the speculative config the stages'
  models are given (their K, the drafter at its container path) and sees the pair where SageMaker mounts a
  model's data, /opt/ml/model (harness/bin/model-mount), so what its container says it runs is compared
  with each stage's deployed model as on AWS. The jobs reach it through
  ``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``. ``answering`` chooses which endpoints it answers for: one left
  out is an endpoint that does not answer, so that stage's smoke test fails.
- SageMaker's log delivery: each request line the runtime prints goes to the log group of the endpoint (or
  inference component) that the front door last routed to, as SageMaker ships a container's output. The
  jobs run one at a time, so the attribution is exact.
- The Docker engine: ``bin/docker`` (the CDK CLI publishes the image asset through it).

What this cannot prove: that an instance starts or a model loads on SageMaker, the rest of a stage's
serving environment (its GPU settings: fp8 KV cache, memory share, lengths; the runtime runs the CPU's),
that the stages' weights are the ones staged (the tiny pair stands in for GPT-OSS-20B and its drafter),
IAM's decisions (moto allows everything; tests/deploy/test_smoke_permissions.py judges the smoke test's
calls against the stages' roles), CloudWatch Logs' filter patterns (moto treats a JSON pattern as matching
every line; the metric filter patterns are judged on real runtime output in tests/stacks), and that the
image builds.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

from harness import cdk
from harness.aws import server
from harness.front_door import FrontDoor
from harness.runtime import LocalRuntime

BIN = Path(__file__).resolve().parent / "bin"
LOG_STREAM = "AllTraffic/i-rehearsal"


def log_group(endpoint: str, component: str | None) -> str:
    from peagle_constructs.sagemaker_names import container_log_group

    return container_log_group(endpoint, component)


def local_runtime(root: Path) -> LocalRuntime:
    """The runtime every stage's endpoint is served by (the tiny pair: seconds to build), given the stages'
    speculative config; the caller starts it once and stops it after the scenarios that use it."""
    from models import tiny
    from peagle_constructs.weights import WeightsLayout
    from peagle_contract.serving import SPECULATIVE_CONFIG_VAR, TARGET_MODEL_DIR, parse_speculative_config
    from stacks.environments import ENVIRONMENTS

    asked = {}
    for config in ENVIRONMENTS:
        layout = WeightsLayout.of(config.model.serving)
        env = layout.environment(config.model.serving)
        asked.setdefault((env[SPECULATIVE_CONFIG_VAR], layout.target_dir), []).append(config.name)
    if len(asked) != 1:
        raise RuntimeError("the stand-in SageMaker serves every stage with one runtime, but the stages ask for "
                           + "; ".join(f"{', '.join(names)}: {spec} (target {target})" for (spec, target), names in asked.items()))
    ((spec_json, target_dir),) = asked
    spec = parse_speculative_config(spec_json)
    pair = tiny.build()
    mount = root / "opt-ml-model"  # what SageMaker copies from the model's ModelDataSource
    for container_dir, local in ((target_dir, pair.target), (spec["model"], pair.drafter)):
        relative = Path(container_dir).relative_to(TARGET_MODEL_DIR)  # ValueError: not under the mount
        if relative == Path("."):
            raise RuntimeError(f"the stand-in mounts target and drafter side by side; a stage puts one at {container_dir}")
        shutil.rmtree(mount / relative, ignore_errors=True)
        shutil.copytree(local, mount / relative)  # copied, as SageMaker copies it: no link leads elsewhere
    runtime = LocalRuntime(target=Path(target_dir), drafter=Path(spec["model"]), k=spec["num_speculative_tokens"],
                           max_model_len=2048, name="rehearsal-runtime", log_dir=root, model_mount=mount)
    assert runtime.speculative_config() == spec, (runtime.speculative_config(), spec)
    return runtime


class EmbeddedAccount:
    """``with EmbeddedAccount(root, runtime=..., answering={...}) as account:`` then ``account.job_environment()``.

    A new account each time (moto cannot update a stack, so every promotion starts from an empty account);
    ``runtime``: a started LocalRuntime that answers for the endpoints named in ``answering``."""

    def __init__(self, root: Path, *, runtime: LocalRuntime, answering: dict[str, str | None],
                 account: str = server.DEFAULT_ACCOUNT, region: str = server.DEFAULT_REGION):
        self.root, self.answering, self.account, self.region = root, answering, account, region
        self.state_dir = root / "aws"
        self.docker_log = root / "docker.jsonl"
        self.emulator: server.Emulator | None = None
        self.runtime = runtime
        self.door: FrontDoor | None = None
        self.shipped: dict[str, int] = {}  # log group -> request lines shipped there
        self._stop = threading.Event()
        self._shipper: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> "EmbeddedAccount":
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        self.emulator = server.start(state_dir=self.state_dir, account=self.account, region=self.region)
        empty = self.root / "bootstrap"  # no cdk.json here: bootstrap needs no app
        empty.mkdir(parents=True, exist_ok=True)
        cdk.run_cdk(["bootstrap", f"aws://{self.account}/{self.region}"], cwd=empty,
                    env=self.emulator.client_environment(cdk.cdk_env()), label="cdk bootstrap")
        self.door = FrontDoor(backend=self.runtime.base, endpoints=self.answering).__enter__()
        self._shipper = threading.Thread(target=self._ship, daemon=True)
        self._shipper.start()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._shipper:
            self._shipper.join(timeout=5)
        if self.door:
            self.door.__exit__()
        server.stop(state_dir=self.state_dir)

    # -- what the jobs get ------------------------------------------------------------------------

    def job_environment(self) -> dict[str, str]:
        """``--env`` values for act: the stand-ins read them (configure-aws-credentials, bin/docker)."""
        assert self.emulator and self.door
        return {"REHEARSAL_AWS_ENDPOINT": self.emulator.url,
                "REHEARSAL_AWS_ACCESS_KEY_ID": self.emulator.client_environment({})["AWS_ACCESS_KEY_ID"],
                "REHEARSAL_SAGEMAKER_RUNTIME_ENDPOINT": self.door.url,
                "REHEARSAL_DOCKER_LOG": str(self.docker_log)}

    def path_prefix(self) -> str:
        return str(BIN)

    def session(self):
        import boto3

        assert self.emulator
        env = self.emulator.client_environment({})
        return boto3.Session(aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key="testing",
                             aws_session_token="testing", region_name=self.region)

    def client(self, name: str):
        assert self.emulator
        return self.session().client(name, endpoint_url=self.emulator.url)

    def stacks(self) -> dict[str, str]:
        """CloudFormation stack name -> status, for every stack but the bootstrap one."""
        found = self.client("cloudformation").list_stacks()["StackSummaries"]
        return {s["StackName"]: s["StackStatus"] for s in found
                if s["StackName"] != "CDKToolkit" and s["StackStatus"] != "DELETE_COMPLETE"}

    # -- SageMaker's log delivery -----------------------------------------------------------------

    def _ship(self) -> None:
        assert self.door
        logs = self.client("logs")
        seen = len(self.runtime.request_lines())  # lines of an earlier account's requests stay there
        while not self._stop.wait(1.0):
            lines = self.runtime.request_lines()
            new, seen = lines[seen:], len(lines)
            if not new or self.door.last_route is None:
                continue
            group = log_group(*self.door.last_route)
            try:
                logs.create_log_stream(logGroupName=group, logStreamName=LOG_STREAM)
            except logs.exceptions.ResourceAlreadyExistsException:
                pass
            except logs.exceptions.ResourceNotFoundException:
                continue  # the stage's stack (which creates the group) is not deployed: nothing receives them
            now = int(time.time() * 1000)
            logs.put_log_events(logGroupName=group, logStreamName=LOG_STREAM,
                                logEvents=[{"timestamp": now, "message": json.dumps(line)} for line in new])
            self.shipped[group] = self.shipped.get(group, 0) + len(new)
