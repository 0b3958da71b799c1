"""Where the serving image comes from, and which one ECR repository the execution role may pull from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from aws_cdk import Aws, IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

from peagle_constructs.errors import ConfigError

_ECR_URI = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9]+(?:[._/-][a-z0-9]+)*)(?::[\w][\w.-]{0,127}|@sha256:[0-9a-f]{64})$"
)

# Build-context entries that belong in no image (and would churn the asset hash): VCS, environments, caches.
DEFAULT_ASSET_EXCLUDES: tuple[str, ...] = (
    ".git", "**/.venv", "**/node_modules", "cdk.out", "cdk.out.*", "**/.cache", "**/__pycache__", "**/*.pyc",
    "**/*.egg-info", "**/.pytest_cache",
)


@dataclass(frozen=True)
class BoundImage:
    image_uri: str
    repository_arn: str  # the only repository the execution role may pull from

    def pull_statements(self) -> list[iam.PolicyStatement]:
        """What a SageMaker execution role needs to pull this image, and no other repository."""
        return [iam.PolicyStatement(
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            resources=[self.repository_arn]),
            # GetAuthorizationToken has no resource-level permission: it only lets the agent log in to ECR.
            iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"])]


class ContainerImage:
    """The serving image: built from a Dockerfile as a CDK asset, or an existing ECR image."""

    @staticmethod
    def from_asset(
        directory: str,
        *,
        file: str | None = None,
        exclude: Sequence[str] = DEFAULT_ASSET_EXCLUDES,
        build_args: Mapping[str, str] | None = None,
        ignore_mode: IgnoreMode = IgnoreMode.GLOB,
    ) -> "ContainerImage":
        """Build ``file`` (relative to ``directory``, the build context) as a CDK Docker image asset.

        ``exclude`` keeps files out of the context and the asset hash; with ``ignore_mode=IgnoreMode.DOCKER``
        it reads like a .dockerignore (so an allow-list ``*``, ``!path`` works).
        """
        return _AssetImage(directory=directory, file=file, exclude=tuple(exclude), build_args=dict(build_args or {}),
                           ignore_mode=ignore_mode)

    @staticmethod
    def from_uri(uri: str) -> "ContainerImage":
        """An ECR image by URI (``<account>.dkr.ecr.<region>.amazonaws.com/<repo>:<tag>`` or ``@sha256:``)."""
        match = _ECR_URI.match(uri) if isinstance(uri, str) else None
        if not match:
            raise ConfigError(
                "image",
                f"got {uri!r}; allowed: an ECR image URI '<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>' "
                "(or '@sha256:<digest>'); SageMaker pulls only from ECR",
            )
        return _UriImage(uri=uri, account=match["account"], region=match["region"], repository=match["repository"])

    def bind(self, scope: Construct) -> BoundImage:  # pragma: no cover - abstract
        raise NotImplementedError


class _AssetImage(ContainerImage):
    def __init__(self, *, directory: str, file: str | None, exclude: tuple[str, ...], build_args: dict[str, str],
                 ignore_mode: IgnoreMode) -> None:
        self._props = dict(directory=directory, file=file, exclude=list(exclude), build_args=build_args or None,
                           ignore_mode=ignore_mode)
        self._assets: dict[str, ecr_assets.DockerImageAsset] = {}

    def bind(self, scope: Construct) -> BoundImage:
        # One asset per binding scope: two models in one stack each own their asset node, same hash, one push.
        asset = self._assets.get(scope.node.path)
        if asset is None:
            asset = ecr_assets.DockerImageAsset(
                scope, "ImageAsset", platform=ecr_assets.Platform.LINUX_AMD64, **self._props
            )
            self._assets[scope.node.path] = asset
        return BoundImage(image_uri=asset.image_uri, repository_arn=asset.repository.repository_arn)


class _UriImage(ContainerImage):
    def __init__(self, *, uri: str, account: str, region: str, repository: str) -> None:
        self.uri, self.account, self.region, self.repository = uri, account, region, repository

    def bind(self, scope: Construct) -> BoundImage:
        arn = f"arn:{Aws.PARTITION}:ecr:{self.region}:{self.account}:repository/{self.repository}"
        return BoundImage(image_uri=self.uri, repository_arn=arn)
