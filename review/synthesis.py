"""Both sides of a stack diff as cloud assemblies, and the CDK CLI's offline diff between them.

The base is synthesized in a temporary ``git worktree`` (cached by commit); the head is the working tree
synthesized, or templates that review.head_artifact checked, written as an assembly. ``cdk diff
--template`` and ``--security-only`` render the change without credentials.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ops import cdk


class DiffError(RuntimeError):
    pass


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DiffError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _app_env(tree: Path) -> dict[str, str]:
    """Environment for synthesizing the app in ``tree`` with this venv: ``tree``'s own packages first.

    The venv has the distributions installed editable from the working tree; on the base side the base's
    own contract and construct library must win, or the base synth would silently use the new ones.
    """
    env = cdk.cdk_env()
    paths = [str(tree / "contract" / "src"), str(tree / "constructs" / "src"), str(tree / "runtime"), str(tree)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    # Offline: never look for credentials or reach instance metadata.
    for key in [k for k in env if k.startswith("AWS_")]:
        del env[key]
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def _synth_tree(tree: Path, out: Path, *, context: dict[str, str], label: str) -> None:
    app = f"{sys.executable} app.py"  # the tree's cdk.json may name a venv that only the main checkout has
    proc = cdk.synth(out, cwd=tree, context=context, env=_app_env(tree), label=label, check=False, app=app)
    if not (out / "manifest.json").exists():
        tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()[-30:])
        raise DiffError(f"synth of {tree} wrote no cloud assembly (exit {proc.returncode}):\n{tail}")
    # A failing nag pack exits 1 after writing every template: the diff is still meaningful.


@dataclass(frozen=True)
class Side:
    label: str
    assembly: Path


def _toolchain() -> list[str]:
    """What else decides a synthesized template besides the commit: the CDK library versions."""
    from importlib import metadata

    versions = []
    for dist in ("aws-cdk-lib", "constructs", "cdk-nag"):
        try:
            versions.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist}==none")
    return versions


def synth_base(repo: Path, ref: str, *, cache_dir: Path | None, context: dict[str, str]) -> Side:
    try:
        sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except DiffError:
        raise DiffError(f"--base: {ref!r} is not a commit in {repo}; allowed: a branch, tag or commit "
                        "(e.g. main, HEAD~1; origin/main needs a fetched remote)") from None
    key = hashlib.sha256(json.dumps([sha, sorted(context.items()), sys.executable, _toolchain()]).encode()).hexdigest()[:16]
    label = f"`{ref}` ({sha[:8]})"
    if cache_dir is not None and (cache_dir / key / "manifest.json").exists():
        print(f"==> base {ref} ({sha[:8]}): cached assembly {cache_dir / key}", file=sys.stderr)
        return Side(label, cache_dir / key)
    out = (cache_dir / key) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="stack-diff-base-"))
    if out.exists():
        shutil.rmtree(out)
    worktree = Path(tempfile.mkdtemp(prefix="stack-diff-worktree-"))
    started = time.monotonic()
    print(f"==> synthesizing base {ref} ({sha[:8]}) in a temporary worktree", file=sys.stderr)
    _git(repo, "worktree", "add", "--detach", "--force", str(worktree), sha)
    try:
        # The base tree needs the CLI: link this checkout's node_modules rather than installing again.
        if (repo / "node_modules").exists() and not (worktree / "node_modules").exists():
            (worktree / "node_modules").symlink_to(repo / "node_modules")
        if (worktree / "app.py").exists():
            _synth_tree(worktree, out, context=context, label=f"synth {ref}")
        else:  # the base predates the app: every stack is new
            out.mkdir(parents=True, exist_ok=True)
            (out / "manifest.json").write_text(json.dumps({"version": "0.0.0", "artifacts": {}}))
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        _git(repo, "worktree", "remove", "--force", str(worktree))
        shutil.rmtree(worktree, ignore_errors=True)
    print(f"    done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return Side(label, out)


def synth_head(repo: Path, out: Path, *, context: dict[str, str]) -> Side:
    started = time.monotonic()
    print("==> synthesizing the working tree", file=sys.stderr)
    _synth_tree(repo, out, context=context, label="synth working tree")
    print(f"    done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return Side("working tree", out)


def cli_diff(repo: Path, head: Path, base_template: Path | None, display_name: str) -> str:
    """The CDK CLI's own rendering of the change, offline (``--template``: no credentials, no change set)."""
    with tempfile.TemporaryDirectory() as tmp:
        if base_template is None:  # a new stack: diff against an empty template
            base_template = Path(tmp) / "empty.template.json"
            base_template.write_text('{"Resources": {}}')
        proc = cdk.run_cdk(
            ["diff", "--no-color", "--app", str(head), "--template", str(base_template), display_name],
            cwd=repo, env=_app_env(repo), check=False)
    text = ((proc.stdout or "") + (proc.stderr or "")).strip()
    if proc.returncode not in (0, 1):
        raise DiffError(f"cdk diff {display_name} failed (exit {proc.returncode}):\n{text[-2000:]}")
    return _diff_only(text)


# After the diff the CLI reports the assembly's annotations (a synth warning with the jsii frame that
# raised it, e.g. `<jsii temp dir>/lib/program.js:1:5591`) and its summary: not part of the change.
_AFTER_DIFF = re.compile(r"^(✨|NOTICES|(WARNING|ERROR|INFO) |\S+\.js:\d+:\d+$)")


def _diff_only(text: str) -> str:
    """The CLI's diff of one stack: from its ``Stack`` header to the first line of what the CLI adds after it."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Stack ")), 0)
    kept = []
    for line in lines[start:]:
        if _AFTER_DIFF.match(line):
            break
        kept.append(line)
    return "\n".join(kept).rstrip()


def security_diff(repo: Path, head: Path, base_template: Path | None, display_name: str) -> str:
    """``cdk diff --security-only``: the IAM statement, policy and security-group changes, as the CLI shows them."""
    with tempfile.TemporaryDirectory() as tmp:
        if base_template is None:
            base_template = Path(tmp) / "empty.template.json"
            base_template.write_text('{"Resources": {}}')
        proc = cdk.run_cdk(["diff", "--no-color", "--security-only", "--app", str(head), "--template",
                            str(base_template), display_name], cwd=repo, env=_app_env(repo), check=False)
    text = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode not in (0, 1):
        raise DiffError(f"cdk diff --security-only {display_name} failed (exit {proc.returncode}):\n{text[-2000:]}")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("IAM Statement Changes", "IAM Policy Changes",
                                                                       "Security Group Changes"))), None)
    return "\n".join(lines[start:]).strip() if start is not None else ""


def read_head(templates: Path, out: Path, *, base: Side) -> Side:
    """The head as a cloud assembly the CLI reads, from templates review.head_artifact checked: written here,
    with the base synth's own manifest version, so nothing of the pull request's but template JSON is read."""
    from review import head_artifact

    version = json.loads((base.assembly / "manifest.json").read_text())["version"]
    try:
        head_artifact.write_assembly(templates, out, version=version)
    except (head_artifact.ArtifactError, OSError, ValueError) as error:
        raise DiffError(f"--head-templates {templates}: {error}") from None
    return Side("the pull request's templates", out)
