"""What the promotion's jobs reach instead of AWS: embedded accounts, one per stage, that the real CDK CLI
deploys into, and endpoints that really answer.

- AWS's control plane: moto's server with our CloudFormation extension (harness.aws), holding one account
  per stage: a request acts in the account of its access key (moto maps a key STS issued for a role of
  account X to X). Each stage's account is bootstrapped by the real ``cdk bootstrap`` as a real account is
  (README: "Deploy to your account", step 1), with keys of a role in that account. The jobs reach it
  through ``AWS_ENDPOINT_URL``; the configure-aws-credentials stand-in assumes the role it is given there,
  so a deploy job acts in the account of the role it asked for.
- SageMaker Runtime: the front door (harness.front_door) for every stage's endpoint, in front of one local
  runtime (our entrypoint and vLLM on the CPU, the random pair). It is given the speculative config the stages'
  models are given (their K, the drafter at its container path) and sees the weights bundle the stages pin
  where SageMaker mounts a model's data, /opt/ml/model (harness/bin/model-mount), with the pin in its
  environment: its entrypoint verifies every file before vLLM starts, and what its container says it runs is
  compared with each stage's deployed model as on AWS (harness.rehearsal.weights stages the same bundle into
  each stage's bucket with the real stager). The jobs reach it through
  ``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``. ``answering`` chooses which endpoints it answers for: one left
  out is an endpoint that does not answer, so that stage's smoke test fails.
- SageMaker's log delivery: each request line the runtime prints goes to the log group of the endpoint (or
  inference component) that the front door last routed to, in that stage's account, as SageMaker ships a
  container's output. The jobs run one at a time, so the attribution is exact.
- The Docker engine: ``bin/docker`` (the CDK CLI publishes the image asset through it).

What this cannot prove: that an instance starts or a model loads on SageMaker, the rest of a stage's
serving environment (its GPU settings: fp8 KV cache, memory share, lengths; the runtime runs the CPU's),
that SageMaker copies the staged prefix (the runtime mounts a local copy of the same bundle; the random pair
stands in for GPT-OSS-20B and its drafter),
IAM's decisions (moto allows everything, and any role may be assumed from anywhere: that the accounts are
kept apart here shows where each job acted, not that it could act nowhere else - tests/ci/test_ci_roles.py
and tests/deploy/test_smoke_permissions.py judge the roles), CloudWatch Logs' filter patterns (moto treats a JSON pattern as matching
every line; the metric filter patterns are judged on real runtime output in tests/stacks), and that the
image builds.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from ops import cdk
from harness.aws import server
from harness.front_door import FrontDoor
from harness.runtime import LocalRuntime, on_this_cpu

BIN = Path(__file__).resolve().parent / "bin"
LOG_STREAM = "AllTraffic/i-rehearsal"


def log_group(endpoint: str, component: str | None) -> str:
    from peagle_constructs.sagemaker_names import container_log_group

    return container_log_group(endpoint, component)


def local_runtime(root: Path, *, bundle: Path, pin: str) -> LocalRuntime:
    """The runtime every stage's endpoint is served by: the stages' own serving config as this CPU runs it
    (harness.runtime.on_this_cpu: K, its schedule and the bundle's layout are the stages'; dtype, sizes and GPU
    flags are this machine's), with the weights ``bundle`` at /opt/ml/model under its ``pin`` (the entrypoint
    verifies every file before vLLM starts). The caller starts it once and stops it after the scenarios that
    use it."""
    from peagle_constructs.weights import WeightsLayout
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR
    from peagle_contract.serving import TARGET_MODEL_DIR, ServingConfig
    from stacks.environments import ENVIRONMENTS

    asked: dict[tuple, tuple[ServingConfig, WeightsLayout, list[str]]] = {}
    for config in ENVIRONMENTS:
        layout = WeightsLayout.of(config.model.serving)
        serving = on_this_cpu(config.model.serving, max_model_len=2048)
        rendered = tuple(sorted(layout.environment(serving).items()))  # what the container would be told
        asked.setdefault(rendered, (serving, layout, []))[2].append(config.name)
    if len(asked) != 1:
        raise RuntimeError("the stand-in SageMaker serves every stage with one runtime, but the stages ask for "
                           + "; ".join(f"{', '.join(names)}: {dict(rendered)}"
                                       for rendered, (_, _, names) in asked.items()))
    ((serving, layout, _),) = asked.values()
    target_dir, drafter_dir = layout.target_dir, layout.drafter_dir
    for container_dir in (target_dir, drafter_dir):
        # The bundle holds target/ and drafter/: what a stage's model names must be those folders of it.
        relative = Path(container_dir).relative_to(TARGET_MODEL_DIR)  # ValueError: not under the mount
        if not (bundle / relative).is_dir():
            raise RuntimeError(f"a stage's model names {container_dir}, which the weights bundle does not hold")
    return LocalRuntime(target=Path(target_dir), drafter=Path(drafter_dir), serving=serving, name="rehearsal-runtime",
                        log_dir=root, model_mount=bundle, extra_env={MANIFEST_DIGEST_VAR: pin})


# Each stage's account in the rehearsal (none is moto's default, which a key it does not know acts in).
STAGE_ACCOUNTS = {"Dev": "210000000001", "Staging": "210000000002", "Prod": "210000000003"}
# What the rehearsal itself acts as in each account (bootstrap, inspection): an administrator's role there.
ADMIN_ROLE = "rehearsal-admin"


class EmbeddedAccounts:
    """``with EmbeddedAccounts(root, runtime=..., answering={...}) as aws:`` then ``aws.job_environment()``.

    New accounts each time (moto cannot update a stack, so every promotion starts from empty accounts), one
    per stage of ``accounts``, each bootstrapped; ``runtime``: a started LocalRuntime that answers for the
    endpoints named in ``answering`` (None: no endpoint answers, for a run that must never reach one)."""

    def __init__(self, root: Path, *, runtime: LocalRuntime | None, answering: dict[str, str | None] | None = None,
                 accounts: dict[str, str] | None = None, region: str = server.DEFAULT_REGION):
        self.root, self.answering, self.region = root, answering or {}, region
        self.accounts = dict(accounts or STAGE_ACCOUNTS)  # stage -> account
        if len(set(self.accounts.values())) != len(self.accounts) or server.DEFAULT_ACCOUNT in self.accounts.values():
            raise ValueError(f"accounts: allowed: one per stage, none {server.DEFAULT_ACCOUNT}; found: {self.accounts}")
        self._sessions: dict[str, object] = {}
        self.state_dir = root / "aws"
        self.docker_log = root / "docker.jsonl"
        self.emulator: server.Emulator | None = None
        self.runtime = runtime
        self.door: FrontDoor | None = None
        self.shipped: dict[str, int] = {}  # log group -> request lines shipped there
        self._stop = threading.Event()
        self._shipper: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> "EmbeddedAccounts":
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.emulator = server.start(state_dir=self.state_dir, region=self.region, accounts_by_key=True)
        empty = self.root / "bootstrap"  # no cdk.json here: bootstrap needs no app
        empty.mkdir(parents=True, exist_ok=True)

        def bootstrap(account: str) -> None:
            cdk.run_cdk(["bootstrap", f"aws://{account}/{self.region}"], cwd=empty,
                        env=self.environment(account, cdk.cdk_env()), label=f"cdk bootstrap {account}")

        with ThreadPoolExecutor(max_workers=len(self.accounts)) as pool:  # the CLI mostly waits on moto
            list(pool.map(bootstrap, self.accounts.values()))
        if self.runtime is not None:
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
        assert self.emulator
        return {"REHEARSAL_AWS_ENDPOINT": self.emulator.url,
                "REHEARSAL_SAGEMAKER_RUNTIME_ENDPOINT": self.door.url if self.door else "",
                "REHEARSAL_DOCKER_LOG": str(self.docker_log)}

    def requests(self) -> int:
        """How many requests the embedded AWS has answered so far (its access log's lines)."""
        assert self.emulator
        return sum(1 for line in Path(self.emulator.log).read_text(errors="replace").splitlines()
                   if '] "' in line and " HTTP/1." in line)

    def path_prefix(self) -> str:
        return str(BIN)

    def _credentials(self, account: str) -> dict:
        """Keys of the rehearsal's administrator role in ``account`` (STS on the emulator: they act there)."""
        import boto3

        assert self.emulator
        if account not in self._sessions:
            unknown = self.emulator.client_environment({})
            sts = boto3.client("sts", endpoint_url=self.emulator.url, region_name=self.region,
                               aws_access_key_id=unknown["AWS_ACCESS_KEY_ID"], aws_secret_access_key="testing")
            self._sessions[account] = sts.assume_role(RoleArn=f"arn:aws:iam::{account}:role/{ADMIN_ROLE}",
                                                      RoleSessionName="rehearsal")["Credentials"]
        return self._sessions[account]

    def environment(self, account: str, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` pointed at the emulator with keys that act in ``account`` (for the CDK CLI)."""
        assert self.emulator
        keys = self._credentials(account)
        return {**self.emulator.client_environment(base), "AWS_ACCESS_KEY_ID": keys["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": keys["SecretAccessKey"], "AWS_SESSION_TOKEN": keys["SessionToken"]}

    def client(self, name: str, account: str):
        import boto3

        assert self.emulator
        keys = self._credentials(account)
        return boto3.client(name, endpoint_url=self.emulator.url, region_name=self.region,
                            aws_access_key_id=keys["AccessKeyId"], aws_secret_access_key=keys["SecretAccessKey"],
                            aws_session_token=keys["SessionToken"])

    def stacks(self) -> dict[str, dict[str, str]]:
        """Account -> CloudFormation stack name -> status, for every stack but the bootstrap one, in every
        stage's account and moto's default one (where a job that assumed no role would have acted)."""
        found = {}
        for account in [*self.accounts.values(), server.DEFAULT_ACCOUNT]:
            summaries = self.client("cloudformation", account).list_stacks()["StackSummaries"]
            found[account] = {s["StackName"]: s["StackStatus"] for s in summaries
                              if s["StackName"] != "CDKToolkit" and s["StackStatus"] != "DELETE_COMPLETE"}
        return found

    def account_of_endpoint(self, endpoint: str) -> str:
        from stacks.environments import ENVIRONMENTS

        (stage,) = [env.name for env in ENVIRONMENTS if env.endpoint_name == endpoint]
        return self.accounts[stage]

    # -- SageMaker's log delivery -----------------------------------------------------------------

    def _ship(self) -> None:
        assert self.door
        seen = len(self.runtime.request_lines())  # lines of an earlier promotion's requests stay there
        while not self._stop.wait(1.0):
            lines = self.runtime.request_lines()
            new, seen = lines[seen:], len(lines)
            if not new or self.door.last_route is None:
                continue
            group = log_group(*self.door.last_route)
            logs = self.client("logs", self.account_of_endpoint(self.door.last_route[0]))
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
