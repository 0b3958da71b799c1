"""moto's server on loopback with our CloudFormation extension loaded, run as its own process.

``python -m harness.aws.server --port 4566`` is ``moto_server`` plus :func:`harness.aws.register`:
the plain ``moto_server`` script cannot load an extension, so we import ours and then hand over to
moto's own ``main``. :func:`start` / :func:`stop` manage that process through a state file (pid, port,
account) so that ``destroy`` in another shell stops exactly the process ``deploy`` started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.ports import free_port

DEFAULT_STATE_DIR = Path(".cache/local_aws")
DEFAULT_ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-1"
_MODULE = "harness.aws.server"


class EmulatorError(RuntimeError):
    pass


@dataclass(frozen=True)
class Emulator:
    pid: int
    port: int
    account: str
    region: str
    log: str

    @property
    def url(self) -> str:
        # "localhost", not "127.0.0.1": the CDK CLI's S3 client then reaches the staging bucket in path
        # style and moto's CloudFormation recognises the template URL (see NOTES.md).
        return f"http://localhost:{self.port}"

    def client_environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) pointed at this emulator with fake keys.

        Profile and SSO settings are dropped so the user's real credentials are never read by accident.
        """
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_", "AWS_WEB_IDENTITY"))}
        env.update({
            "AWS_ENDPOINT_URL": self.url,
            # The CDK CLI caches "access key -> account" in ~/.cdk/cache: one key id per emulated account,
            # or a second emulator for another account would be taken for the first one's.
            "AWS_ACCESS_KEY_ID": f"LOCALAWS{self.account}",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        })
        return env


def _state_file(state_dir: Path) -> Path:
    return state_dir / "emulator.json"


def _is_ours(pid: int) -> bool:
    """True when ``pid`` is alive and is this launcher (a recycled pid must never be signalled)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _MODULE.encode() in cmdline


def running(state_dir: Path = DEFAULT_STATE_DIR) -> Emulator | None:
    path = _state_file(state_dir)
    if not path.exists():
        return None
    emulator = Emulator(**json.loads(path.read_text()))
    return emulator if _is_ours(emulator.pid) and _answers(emulator.port) else None


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _wait_ready(emulator: Emulator, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmulatorError(f"the embedded AWS exited with code {proc.returncode}; see {emulator.log}")
        if _answers(emulator.port):
            return
        time.sleep(0.3)
    raise EmulatorError(f"the embedded AWS did not answer on port {emulator.port} within {timeout_s:.0f} s; see {emulator.log}")


def start(*, state_dir: Path = DEFAULT_STATE_DIR, port: int | None = None, account: str = DEFAULT_ACCOUNT,
          region: str = DEFAULT_REGION, timeout_s: float = 60.0, accounts_by_key: bool = False) -> Emulator:
    """Start the emulator (or return the one already running from this state dir).

    ``accounts_by_key``: several accounts in one emulator, each request acting in the account of its access
    key as moto maps it (``moto.iam.models.get_account_id_from``): a key STS issued for a role ARN of account
    X acts in X; any other key in moto's default account, which ``account`` must then be. Otherwise every
    request acts in ``account`` (moto's MOTO_ACCOUNT_ID overrides the keys)."""
    if accounts_by_key and account != DEFAULT_ACCOUNT:
        raise EmulatorError(f"account: allowed with accounts_by_key: {DEFAULT_ACCOUNT} (moto's default, what an "
                            f"unknown key acts in); found: {account}")
    existing = running(state_dir)
    if existing is None:
        stop(state_dir=state_dir)  # a stale state file, or a launcher that stopped answering
    else:
        if existing.account != account or existing.region != region:
            raise EmulatorError(
                f"an embedded AWS for {existing.account}/{existing.region} is already running (pid {existing.pid}); "
                f"stop it first (make destroy) to deploy into {account}/{region}"
            )
        return existing
    state_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = state_dir / "moto_server.log"
    env = {**os.environ, "MOTO_ACCOUNT_ID": account, "AWS_DEFAULT_REGION": region, "PYTHONUNBUFFERED": "1"}
    if accounts_by_key:
        del env["MOTO_ACCOUNT_ID"]
    repo_root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root), env.get("PYTHONPATH", "")) if p)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", _MODULE, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=repo_root, start_new_session=True,
        )
    emulator = Emulator(pid=proc.pid, port=port, account=account, region=region, log=str(log))
    _state_file(state_dir).write_text(json.dumps(asdict(emulator)))
    try:
        _wait_ready(emulator, proc, timeout_s)
    except BaseException:
        stop(state_dir=state_dir)
        raise
    return emulator


def stop(*, state_dir: Path = DEFAULT_STATE_DIR, timeout_s: float = 10.0) -> int | None:
    """Stop the emulator recorded in ``state_dir`` by its pid; return that pid, or None if none ran."""
    path = _state_file(state_dir)
    if not path.exists():
        return None
    emulator = Emulator(**json.loads(path.read_text()))
    stopped = None
    if _is_ours(emulator.pid):
        os.kill(emulator.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _is_ours(emulator.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                os.waitpid(emulator.pid, os.WNOHANG)  # reap it when it is our own child
            except ChildProcessError:
                pass
        if _is_ours(emulator.pid):
            os.kill(emulator.pid, signal.SIGKILL)
        stopped = emulator.pid
    path.unlink(missing_ok=True)
    return stopped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="moto_server on loopback with the P-EAGLE CloudFormation extension")
    parser.add_argument("--port", type=int, default=4566)
    args = parser.parse_args(argv)

    from moto import server as moto_server

    from harness.aws import register

    register()
    moto_server.main(["--host", "127.0.0.1", "--port", str(args.port)])


if __name__ == "__main__":
    main()
