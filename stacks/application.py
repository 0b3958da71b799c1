"""Build the whole app (all stages, nag packs) - shared by app.py, the tests and the benchmark."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from aws_cdk import App, IgnoreMode

from peagle_constructs import ConfigError, ContainerImage, add_nag_packs

from stacks.environments import ENVIRONMENTS, EnvironmentConfig, check_unique_names
from stacks.stage import PEagleStage

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = "runtime/Dockerfile"
# Accounts and regions that let `cdk synth` run offline; real deploys pass -c account=... or CDK_DEFAULT_*.
OFFLINE_ACCOUNT = "111111111111"
OFFLINE_REGION = "us-east-1"


def serving_image(app: App) -> ContainerImage:
    """The image every stage runs: `-c imageUri=<ecr uri>` or the runtime/ Dockerfile built as an asset."""
    uri = app.node.try_get_context("imageUri")
    if uri:
        return ContainerImage.from_uri(str(uri))
    if not (REPO_ROOT / DOCKERFILE).is_file():
        raise ConfigError("image", f"{DOCKERFILE} is missing under {REPO_ROOT}; allowed: that Dockerfile, or "
                          "-c imageUri=<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>")
    # The repository root is the build context: the Dockerfile installs ./constructs and ./runtime. Its own
    # <Dockerfile>.dockerignore (an allow-list) also decides what enters the asset, so edits to the stacks,
    # tests or docs do not make a new image.
    ignore_file = REPO_ROOT / f"{DOCKERFILE}.dockerignore"
    exclude = context_excludes(REPO_ROOT, ignore_file) if ignore_file.is_file() else None
    if exclude is None:
        return ContainerImage.from_asset(str(REPO_ROOT), file=DOCKERFILE)
    return ContainerImage.from_asset(str(REPO_ROOT), file=DOCKERFILE, exclude=exclude, ignore_mode=IgnoreMode.GIT)


def context_excludes(root: Path, ignore_file: Path) -> list[str] | None:
    """Turn a ``*`` + ``!path`` allow-list into .gitignore-style excludes of everything beside the allowed paths.

    CDK given the allow-list itself (IgnoreMode.DOCKER) cannot prune any folder, since a later ``!`` might
    re-include something inside, so it walks the whole root, .venv and node_modules included (about 20 s
    here). Naming the siblings of each allowed path lets it skip them unread. None when the file is not
    such an allow-list.
    """
    lines = [ln.strip() for ln in ignore_file.read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines or lines[0] != "*":
        return None
    allowed = [ln[1:].removesuffix("/**").strip("/") for ln in lines[1:] if ln.startswith("!")]
    allowed += [DOCKERFILE, f"{DOCKERFILE}.dockerignore"]  # `docker build -f` needs them in the staged context
    if any(ch in path for path in allowed for ch in "*?["):
        return None
    extra = [ln for ln in lines[1:] if not ln.startswith("!")]
    excludes: list[str] = []

    def visit(rel_dir: str, targets: list[list[str]]) -> None:
        if any(not t for t in targets):
            return  # this whole folder is allowed
        keep = {t[0] for t in targets}
        folder = root / rel_dir if rel_dir else root
        for entry in sorted(p.name for p in folder.iterdir()):
            rel = f"{rel_dir}/{entry}" if rel_dir else entry
            if entry not in keep:
                excludes.append(f"/{rel}")  # anchored (.gitignore rules): constructs/README.md is not /README.md
            elif (folder / entry).is_dir():
                visit(rel, [t[1:] for t in targets if t[0] == entry])

    visit("", [path.split("/") for path in allowed])
    return excludes + extra


def builtin_cloudformation_validation() -> bool:
    """Off unless CDK_VALIDATION=true: it doubles the synth time and cfn-lint covers it in the tests."""
    return os.environ.get("CDK_VALIDATION", "false").lower() == "true"


def _account_region(app: App, config: EnvironmentConfig) -> tuple[str, str]:
    account = (config.account or app.node.try_get_context("account") or os.environ.get("CDK_DEFAULT_ACCOUNT")
               or OFFLINE_ACCOUNT)
    region = (config.region or app.node.try_get_context("region") or os.environ.get("CDK_DEFAULT_REGION")
              or OFFLINE_REGION)
    return str(account), str(region)


def build_app(app: App, environments: Iterable[EnvironmentConfig] = ENVIRONMENTS, *,
              nag: bool = True) -> dict[str, PEagleStage]:
    environments = tuple(environments)
    check_unique_names(environments)
    image = serving_image(app)
    stages = {}
    for config in environments:
        account, region = _account_region(app, config)
        stage = PEagleStage(app, config=config, image=image, account=account, region=region)
        if nag:
            # Plugins run per Stage on that Stage's own stacks: registered on the App they would see none.
            add_nag_packs(stage)
        stages[config.name] = stage
    return stages
