"""Deploy or destroy one environment's Stage: on an embedded AWS (default) or a real account.

    python -m ops.deploy deploy  --env dev [--target local|aws] [--image-uri URI]
    python -m ops.deploy destroy --env dev [--target local|aws]

``--target local`` starts moto's server on 127.0.0.1 with our CloudFormation extension (pid and port in
.cache/local_aws/emulator.json), bootstraps it and deploys ``<Stage>/*`` with the real CDK CLI, then asks
each service what exists and prints expected vs found. The image is a given URI (``-c imageUri=...``):
there is no Docker engine to build the runtime image. ``destroy`` deletes the stacks, checks that nothing
the deploy recorded is left, and stops the emulator by its pid.

``--target aws`` runs the same Stage against the account of your current AWS credentials: no emulator,
no imageUri (cdk builds and pushes runtime/'s DockerImageAsset), same check afterwards, then one short request:
what the container says it runs (K, drafter, vLLM release) against the deployed model's environment (on the
embedded AWS no container answers: `make smoke` and the promotion's smoke tests read it there). The account
must have been bootstrapped once (``npx cdk bootstrap aws://ACCOUNT/REGION``).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.aws import server
from ops import cdk, inventory, live_config

TARGETS = ("local", "aws")
STATE_DIR = cdk.REPO_ROOT / ".cache" / "local_aws"


class DeployError(RuntimeError):
    pass


def stage_names() -> dict[str, str]:
    """``--env`` value -> Stage id, from the app's environments (stacks.environments is the one list)."""
    from stacks.environments import ENVIRONMENTS

    return {config.name.lower(): config.name for config in ENVIRONMENTS}


def stage_of(env: str) -> str:
    stages = stage_names()
    try:
        return stages[env.lower()]
    except KeyError:
        raise DeployError(f"--env: got {env!r}; allowed: {', '.join(stages)}") from None


def default_image_uri(account: str, region: str) -> str:
    # Never pulled on the embedded AWS; shaped like the ECR URI a real deploy would use.
    return f"{account}.dkr.ecr.{region}.amazonaws.com/peagle-runtime:local"


def _step(message: str) -> float:
    print(f"==> {message}", flush=True)
    return time.monotonic()


def _done(started: float, what: str = "done") -> None:
    print(f"    {what} in {time.monotonic() - started:.1f} s", flush=True)


@dataclass
class DeployResult:
    stage: str
    rows: dict[str, list[inventory.Row]]  # stack display name -> rows
    # Endpoints and components that do not serve what the stack deployed (ops.live_config).
    not_served: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(row.ok for rows in self.rows.values() for row in rows) and not self.not_served


def _assembly_dir(env: str, target: str) -> Path:
    return STATE_DIR / f"assembly-{target}-{env.lower()}"


def _resources_file(env: str, target: str) -> Path:
    return STATE_DIR / f"{target}-{env.lower()}.resources.json"


def _session(environment: dict[str, str] | None, region: str | None = None):
    import boto3

    if environment is None:  # a real account: the user's credentials, in the stack's region
        return boto3.Session(region_name=region) if region else boto3.Session()
    return boto3.Session(
        aws_access_key_id=environment["AWS_ACCESS_KEY_ID"], aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=environment["AWS_SESSION_TOKEN"], region_name=environment["AWS_REGION"],
    )


def _endpoint_url(environment: dict[str, str] | None) -> str | None:
    return environment["AWS_ENDPOINT_URL"] if environment else None


class _EndpointSession:
    """A boto3 session whose clients all talk to one endpoint (the emulator), or AWS when none."""

    def __init__(self, environment: dict[str, str] | None, region: str | None = None) -> None:
        self._session = _session(environment, region)
        self._url = _endpoint_url(environment)

    def client(self, name: str):
        return self._session.client(name, endpoint_url=self._url) if self._url else self._session.client(name)


def synth_stage(env: str, target: str, *, image_uri: str | None) -> list[cdk.StackArtifact]:
    out = _assembly_dir(env, target)
    context = {"imageUri": image_uri} if image_uri else {}
    if target == "local":  # the embedded AWS takes the placeholder account; a real deploy needs the real one
        context["offline"] = "true"
    started = _step(f"synthesizing the app{' with imageUri=' + image_uri if image_uri else ''} -> {out}")
    cdk.synth(out, cwd=cdk.REPO_ROOT, context=context, label="cdk synth")
    _done(started)
    return cdk.stage_stacks(out, stage_of(env))


def deploy(env: str, *, target: str = "local", image_uri: str | None = None,
           require_approval: str | None = None, assembly: Path | None = None) -> DeployResult:
    """Deploy ``<Stage>/*``. ``assembly``: an already synthesized cloud assembly to deploy as it is
    (the demo synthesizes once for validation and deployment); otherwise synthesize here."""
    stage = stage_of(env)
    if target not in TARGETS:
        raise DeployError(f"--target: got {target!r}; allowed: {', '.join(TARGETS)}")
    if target == "aws":
        if assembly is None:
            stacks = synth_stage(env, target, image_uri=image_uri)
            assembly = _assembly_dir(env, target)
        else:
            stacks = cdk.stage_stacks(assembly, stage)
    else:
        # moto never pulls the image, so the placeholder URI need not name the stage's account.
        if assembly is None:
            stacks = synth_stage(env, target, image_uri=image_uri or default_image_uri(
                server.DEFAULT_ACCOUNT, server.DEFAULT_REGION))
            assembly = _assembly_dir(env, target)
        else:
            stacks = cdk.stage_stacks(assembly, stage)
        account = stacks[0].account or server.DEFAULT_ACCOUNT
        region = stacks[0].region or server.DEFAULT_REGION
        started = _step(f"starting the embedded AWS (moto + extension) for {account}/{region}")
        emulator = server.start(state_dir=STATE_DIR, account=account, region=region)
        _done(started, f"pid {emulator.pid}, {emulator.url}, log {emulator.log}")
    try:
        return _deploy_into(env, target=target, stacks=stacks, assembly=assembly,
                            environment=None if target == "aws" else emulator.client_environment(cdk.cdk_env()),
                            account=stacks[0].account, region=stacks[0].region, require_approval=require_approval)
    except BaseException:
        if target == "local":  # nothing half-deployed stays running; the log keeps what happened
            pid = server.stop(state_dir=STATE_DIR)
            print(f"==> deploy failed: stopped the embedded AWS (pid {pid}); its log: {STATE_DIR / 'moto_server.log'}",
                  file=sys.stderr)
        raise


def _deploy_into(env: str, *, target: str, stacks: list[cdk.StackArtifact], assembly: Path,
                 environment: dict[str, str] | None, account: str | None, region: str | None,
                 require_approval: str | None) -> DeployResult:
    stage = stage_of(env)
    if target == "local":
        account = account or server.DEFAULT_ACCOUNT
        region = region or server.DEFAULT_REGION
        started = _step("cdk bootstrap (the real CLI; creates the staging bucket, roles and the SSM version parameter)")
        cdk.run_cdk(["bootstrap", "--app", str(assembly), f"aws://{account}/{region}"],
                        cwd=cdk.REPO_ROOT, env=environment, label="cdk bootstrap")
        _done(started)
        approval = require_approval or "never"
    else:
        approval = require_approval or "broadening"
    started = _step(f"cdk deploy '{stage}/*' ({len(stacks)} stack(s): {', '.join(s.display_name for s in stacks)})")
    cdk.run_cdk(["deploy", "--app", str(assembly), f"{stage}/*", "--require-approval", approval],
                    cwd=cdk.REPO_ROOT, env=environment or cdk.cdk_env(), label="cdk deploy",
                    echo=(target == "aws"))  # a real deploy takes minutes: show CloudFormation's events
    _done(started)
    started = _step("checking what each service holds (expected from the templates vs found)")
    session = _EndpointSession(environment, region)
    rows: dict[str, list[inventory.Row]] = {}
    recorded: list[inventory.Resource] = []
    for stack in stacks:
        resources = inventory.stack_resources(session, stack.stack_name, stack.template())
        recorded += resources
        rows[stack.display_name] = inventory.check(session, stack.template(), resources)
    inventory.save(_resources_file(env, target), recorded)
    _done(started)
    started = _step("checking that each endpoint serves what the stack deployed (live configuration vs the stack's)")
    not_served = [line for stack in stacks for line in live_config.mismatches(session, stack.stack_name)]
    _done(started)
    if target == "aws" and not not_served:
        not_served += _container_check(env, region)
    result = DeployResult(stage=stage, rows=rows, not_served=not_served)
    print(inventory.render(list(rows.items())))
    for line in not_served:
        print(f"NOT SERVED: {line}")
    print(f"{'OK' if result.ok else 'MISMATCH'}: {stage} deployed to {'the embedded AWS' if target == 'local' else 'AWS'}")
    return result


def _container_check(env: str, region: str | None) -> list[str]:
    import boto3

    from ops.sagemaker_client import runtime_client
    from stacks.environments import ENVIRONMENTS

    config = next(c for c in ENVIRONMENTS if c.name.lower() == env.lower())
    started = _step(f"asking {config.endpoint_name}'s container what it runs (one request; K, drafter, vLLM release)")
    _, problems = live_config.container_mismatches(boto3.Session(region_name=region), runtime_client(region=region),
                                                      config.endpoint_name, config.component_name)
    _done(started, "the deployed serving config" if not problems else "MISMATCH")
    return [f"{config.endpoint_name}'s container: {line}" for line in problems]


def destroy(env: str, *, target: str = "local",
            stop_emulator: bool = True, assembly: Path | None = None) -> list[inventory.Row]:
    stage = stage_of(env)
    if target not in TARGETS:
        raise DeployError(f"--target: got {target!r}; allowed: {', '.join(TARGETS)}")
    recorded = inventory.load(_resources_file(env, target))
    rows: list[inventory.Row] = []
    if target == "local":
        emulator = server.running(STATE_DIR)
        if emulator is None:
            print("==> no embedded AWS is running: nothing to destroy")
            server.stop(state_dir=STATE_DIR)  # clears a stale state file
            _resources_file(env, target).unlink(missing_ok=True)
            return rows
        environment: dict[str, str] | None = emulator.client_environment(cdk.cdk_env())
    else:
        environment = None
    try:
        assembly = assembly or _assembly_dir(env, target)
        if not (assembly / "manifest.json").exists():
            synth_stage(env, target, image_uri=default_image_uri(server.DEFAULT_ACCOUNT, server.DEFAULT_REGION)
                        if target == "local" else None)
        started = _step(f"cdk destroy '{stage}/*'")
        cdk.run_cdk(["destroy", "--app", str(assembly), f"{stage}/*", "--force"], cwd=cdk.REPO_ROOT,
                        env=environment or cdk.cdk_env(), label="cdk destroy", echo=(target == "aws"))
        _done(started)
        if recorded:
            rows = inventory.after_delete(_EndpointSession(environment), recorded)
            print(inventory.render([(f"{stage} after destroy", rows)]))
            left = inventory.left_behind(rows)
            kept = sum(r.expected for r in rows)
            print(("OK: nothing left behind" + (f" ({kept} kept by DeletionPolicy Retain)" if kept else ""))
                  if left == 0 and all(r.ok for r in rows) else f"LEFT BEHIND: {left} resource(s)")
        _resources_file(env, target).unlink(missing_ok=True)
    finally:
        if target == "local" and stop_emulator:
            pid = server.stop(state_dir=STATE_DIR)
            if pid:
                print(f"==> stopped the embedded AWS (pid {pid})")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("deploy", "destroy"))
    parser.add_argument("--env", default="dev", help=f"one of {', '.join(stage_names())}")
    parser.add_argument("--target", default="local", help="local (embedded AWS, default) or aws (your credentials)")
    parser.add_argument("--image-uri", default=None,
                        help="image to deploy instead of building runtime/ (default on local: a placeholder ECR URI)")
    parser.add_argument("--require-approval", default=None, choices=("never", "any-change", "broadening"),
                        help="passed to cdk deploy (default: never on local, broadening on aws)")
    args = parser.parse_args(argv)
    try:
        if args.action == "deploy":
            result = deploy(args.env, target=args.target, image_uri=args.image_uri,
                            require_approval=args.require_approval)
            return 0 if result.ok else 1
        rows = destroy(args.env, target=args.target)
        return 0 if all(r.ok for r in rows) else 1
    except (DeployError, cdk.CdkError, server.EmulatorError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
