"""How the target and drafter weights reach the container.

CloudFormation's AWS::SageMaker::Model has one ModelDataSource and no AdditionalModelDataSources, so both
models travel through ONE uncompressed S3 prefix that lands in /opt/ml/model. Lay the weights out as a
bundle (``s3://bucket/bundles/<name>/target/`` and ``.../drafter/``, or the drafter inside the target's
prefix); the shared prefix is what SageMaker copies, so it must not be the bucket root.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Sequence

from aws_cdk import Aws
from aws_cdk import aws_iam as iam

from peagle_contract.serving import TARGET_MODEL_DIR, ServingConfig, is_s3_uri

from peagle_constructs.errors import ConfigError


@dataclass(frozen=True)
class S3Prefix:
    bucket: str
    key_prefix: str  # always ends with "/" (or is "" for the bucket root)

    @classmethod
    def parse(cls, uri: str) -> "S3Prefix":
        rest = uri[len("s3://"):]
        bucket, _, key = rest.partition("/")
        key = key.strip("/")
        return cls(bucket=bucket, key_prefix=f"{key}/" if key else "")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key_prefix}"


@dataclass(frozen=True)
class WeightsLayout:
    """The one ModelDataSource prefix (None when no weights come from S3) and the container paths."""

    source: S3Prefix | None
    target_dir: str
    drafter_dir: str
    prefixes: tuple[S3Prefix, ...]  # what the execution role may read: exactly what SageMaker copies

    def environment(self, serving: ServingConfig) -> dict[str, str]:
        """The serving config's container environment with the weights where this layout puts them."""
        return serving.to_environment(target_dir=self.target_dir, drafter_dir=self.drafter_dir)

    @classmethod
    def of(cls, serving: ServingConfig) -> "WeightsLayout":
        s3 = {name: S3Prefix.parse(uri) for name, uri in
              (("target_model", serving.target_model), ("drafter_model", serving.drafter_model)) if is_s3_uri(uri)}
        if not s3:
            return cls(source=None, target_dir=TARGET_MODEL_DIR, drafter_dir=TARGET_MODEL_DIR, prefixes=())
        if len(s3) == 1:
            (name, only), = s3.items()
            dirs = {n: TARGET_MODEL_DIR for n in ("target_model", "drafter_model")}
            return cls(source=only, target_dir=dirs["target_model"], drafter_dir=dirs["drafter_model"], prefixes=(only,))
        target, drafter = s3["target_model"], s3["drafter_model"]
        if target.bucket != drafter.bucket:
            raise ConfigError(
                "drafter_model",
                f"got bucket {drafter.bucket!r} but target_model is in {target.bucket!r}; allowed: the same bucket "
                "under one shared prefix (CloudFormation gives a SageMaker model a single ModelDataSource)",
            )
        common = posixpath.commonpath([target.key_prefix.rstrip("/"), drafter.key_prefix.rstrip("/")]) \
            if target.key_prefix and drafter.key_prefix else ""
        if not common:
            raise ConfigError(
                "drafter_model",
                f"got {drafter.uri!r} and target_model {target.uri!r}, which share no prefix below the bucket root; "
                "allowed: both under one bundle prefix, e.g. s3://bucket/bundles/<name>/target/ and .../drafter/",
            )
        source = S3Prefix(bucket=target.bucket, key_prefix=f"{common}/")

        def inside(p: S3Prefix) -> str:
            rel = p.key_prefix[len(source.key_prefix):].strip("/")
            return f"{TARGET_MODEL_DIR}/{rel}" if rel else TARGET_MODEL_DIR

        if target.key_prefix == drafter.key_prefix:
            raise ConfigError("drafter_model", f"got the same prefix as target_model ({target.uri!r}); allowed: its own folder")
        # SageMaker copies - and the role may read - everything below the shared prefix: two models in two
        # bundles (bundles/a/target/, bundles/b/drafter/) would share bundles/ and copy every bundle there.
        for name, p in (("target_model", target), ("drafter_model", drafter)):
            depth = len(p.key_prefix[len(source.key_prefix):].strip("/").split("/"))
            if depth > 1:
                raise ConfigError(
                    name,
                    f"got {p.uri!r}, {depth} folders below the prefix it shares with the other model "
                    f"({source.uri!r}), which SageMaker would copy whole; allowed: target and drafter in one "
                    "bundle, each one folder below it (s3://bucket/bundles/<name>/target/ and .../drafter/) or "
                    "the drafter inside the target's prefix",
                )
        return cls(source=source, target_dir=inside(target), drafter_dir=inside(drafter), prefixes=(source,))


def read_prefix_statements(prefixes: Sequence[S3Prefix], *, account: str) -> list[iam.PolicyStatement]:
    """Read (and list) below each of ``prefixes`` and nothing else, in buckets ``account`` owns: a bucket of the
    same name in another account would match the ARN, so s3:ResourceAccount pins the owner."""
    owner = {"StringEquals": {"s3:ResourceAccount": account}}
    statements: list[iam.PolicyStatement] = []
    for prefix in prefixes:
        bucket_arn = f"arn:{Aws.PARTITION}:s3:::{prefix.bucket}"
        statements.append(iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/{prefix.key_prefix}*"],
                                              conditions=owner))
        statements.append(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{prefix.key_prefix}*"]}, **owner}))
    return statements
