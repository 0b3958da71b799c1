"""Running the real CDK CLI (pinned in package.json) quietly, and reading the cloud assemblies it writes.

``python -m ops.cdk synth [--output cdk.out]`` is `make synth`: every stage, nag packs and all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]

# Telemetry and notices, and the end-of-life banner jsii prints on an old Node (a process started outside
# `make`, without the pinned Node first on PATH): noise in logs and CI.
QUIET_CDK_ENV = {
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "CDK_DISABLE_CLI_TELEMETRY": "true",
    "AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED": "true",
}


class CdkError(RuntimeError):
    pass


def cdk_command(cwd: Path = REPO_ROOT) -> list[str]:
    """The pinned CLI of the repository ``cwd`` (npx --no-install never downloads another one)."""
    local = cwd / "node_modules" / ".bin" / "cdk"
    if not local.exists():
        local = REPO_ROOT / "node_modules" / ".bin" / "cdk"
    if local.exists():
        return [str(local), "--no-notices"]
    return ["npx", "--no-install", "cdk", "--no-notices"]


def cdk_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(QUIET_CDK_ENV)
    # The app command in cdk.json is the venv's python; make `python3 app.py` variants find it too. The
    # Node.js package.json pins runs the CLI and the app's jsii (the CLI's `#!/usr/bin/env node`).
    for folder in (str(Path(sys.executable).parent), str(REPO_ROOT / "node_modules" / ".bin")):
        if folder not in env.get("PATH", "").split(os.pathsep):
            env["PATH"] = folder + os.pathsep + env.get("PATH", "")
    return env


def run_cdk(args: Sequence[str], *, cwd: Path = REPO_ROOT, env: Mapping[str, str] | None = None,
            label: str | None = None, check: bool = True, echo: bool = False) -> subprocess.CompletedProcess:
    """Run ``cdk <args>``; show a ticking progress line on a terminal while it runs (synth takes ~10-30 s)."""
    cmd = cdk_command(cwd) + list(args)
    started = time.monotonic()
    done = threading.Event()
    ticker = None
    if label and sys.stderr.isatty() and not echo:
        def tick() -> None:
            while not done.wait(1.0):
                sys.stderr.write(f"\r  ... {label} ({time.monotonic() - started:4.0f} s)")
                sys.stderr.flush()
            sys.stderr.write("\r" + " " * (len(label) + 20) + "\r")
        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
    try:
        if echo:
            proc = subprocess.run(cmd, cwd=cwd, env=dict(env or cdk_env()), text=True)
        else:
            proc = subprocess.run(cmd, cwd=cwd, env=dict(env or cdk_env()), text=True, capture_output=True)
    finally:
        done.set()
        if ticker:
            ticker.join()
    if check and proc.returncode != 0:
        tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()[-40:])
        raise CdkError(f"`cdk {' '.join(args)}` failed with exit code {proc.returncode}:\n{tail}")
    return proc


def synth(out_dir: Path, *, cwd: Path = REPO_ROOT, context: Mapping[str, str] | None = None,
          env: Mapping[str, str] | None = None, label: str | None = "synthesizing", check: bool = True,
          app: str | None = None) -> subprocess.CompletedProcess:
    """``cdk synth`` into ``out_dir`` (never the shared cdk.out: other commands may be reading it)."""
    args = ["synth", "--quiet", "--output", str(out_dir)]
    if app:
        args += ["--app", app]
    for key, value in (context or {}).items():
        args += ["--context", f"{key}={value}"]
    return run_cdk(args, cwd=cwd, env=env, label=label, check=check)


@dataclass(frozen=True)
class StackArtifact:
    """One stack of a cloud assembly."""

    artifact_id: str  # e.g. DevPEagleEED5C4A0
    display_name: str  # construct path: Dev/PEagle (what `cdk deploy 'Dev/*'` matches)
    stack_name: str  # CloudFormation name: Dev-PEagle
    stage: str  # Dev
    template_path: Path
    account: str | None
    region: str | None

    def template(self) -> dict:
        return json.loads(self.template_path.read_text())

    def template_sha256(self) -> str:
        """The SHA-256 of the template file as the synth wrote it (the pull-request comment and the promotion's
        summary both record it, so a reviewer can match what was reviewed with what is deployed)."""
        return hashlib.sha256(self.template_path.read_bytes()).hexdigest()


def _stacks_in(assembly_dir: Path, stage: str) -> list[StackArtifact]:
    manifest = json.loads((assembly_dir / "manifest.json").read_text())
    found: list[StackArtifact] = []
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        kind = artifact.get("type")
        props = artifact.get("properties") or {}
        if kind == "cdk:cloud-assembly":
            nested_stage = props.get("displayName") or artifact_id
            found += _stacks_in(assembly_dir / props["directoryName"], nested_stage)
        elif kind == "aws:cloudformation:stack":
            account = region = None
            env = artifact.get("environment", "")
            if env.startswith("aws://"):
                account, region = env[len("aws://"):].split("/", 1)
                account = None if account.startswith("unknown") else account
                region = None if region.startswith("unknown") else region
            found.append(StackArtifact(
                artifact_id=artifact_id,
                display_name=artifact.get("displayName", artifact_id),
                stack_name=props.get("stackName", artifact_id),
                stage=stage,
                template_path=assembly_dir / props["templateFile"],
                account=account,
                region=region,
            ))
    return found


def list_stacks(assembly_dir: Path) -> list[StackArtifact]:
    """Every stack in the assembly, nested stage assemblies included, in manifest order."""
    if not (assembly_dir / "manifest.json").exists():
        raise CdkError(f"{assembly_dir} is not a cloud assembly (no manifest.json); did synth run?")
    return _stacks_in(assembly_dir, "")


def stage_stacks(assembly_dir: Path, stage: str) -> list[StackArtifact]:
    stacks = [s for s in list_stacks(assembly_dir) if s.stage.lower() == stage.lower()]
    if not stacks:
        stages = sorted({s.stage for s in list_stacks(assembly_dir)})
        raise CdkError(f"no stage {stage!r} in {assembly_dir}; stages found: {stages}")
    return stacks


def stage_environment(assembly_dir: Path, stage: str) -> tuple[str, str]:
    """The account and region every stack of ``stage`` deploys to, as the assembly's manifest says
    (``environment: aws://ACCOUNT/REGION``): a deploy goes where the synthesized assembly says, not where a
    variable beside it says. CdkError when a stack has no concrete account or region, or the stage's stacks
    disagree."""
    stacks = stage_stacks(assembly_dir, stage)
    places = {(s.account, s.region) for s in stacks}
    unplaced = [f"{s.display_name} (aws://{s.account or 'unknown'}/{s.region or 'unknown'})" for s in stacks
                if not re.fullmatch(r"\d{12}", s.account or "") or not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", s.region or "")]
    if unplaced:
        raise CdkError(f"stage {stage} in {assembly_dir}: environment: allowed: aws://<12 digits>/<region>; found: "
                       f"{', '.join(unplaced)} (synthesized without -c account.<Stage> and -c region?)")
    if len(places) != 1:
        raise CdkError(f"stage {stage} in {assembly_dir}: allowed: one account and region for all its stacks; found: "
                       + ", ".join(sorted(f"{a}/{r}" for a, r in places)))
    ((account, region),) = places
    return str(account), str(region)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ops.cdk", description="`make synth`: every stage")
    parser.add_argument("command", choices=("synth",))
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "cdk.out")
    args = parser.parse_args(argv)
    # For review and CI: an account the CLI cannot resolve gets the placeholder (and a warning), never silently.
    proc = synth(args.output, context={"offline": "true"}, label="cdk synth", check=False)
    sys.stdout.write(proc.stdout or "")
    sys.stderr.write(proc.stderr or "")
    if proc.returncode == 0:
        print(f"synthesized {len(list_stacks(args.output))} stack(s) into {args.output}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
