"""Check a staged bundle from an operator's machine before pinning it: `make verify-bundle`, or

    python -m ops.verify_bundle --bundle s3://my-weights/bundles/gpt-oss-20b-p-eagle/ --sha256 <digest>

``--bundle`` is the prefix given to `make stage-weights`; the bundle is ``<bundle>/<digest>/``. The check is the
container's own (peagle_contract.bundle.verify_listing) on S3's listing and bytes: the manifest's digest, every
listed file's size and SHA-256, nothing unlisted, nothing at the root but the manifest and the model folders.
Each object is streamed and hashed as it arrives, ``--threads`` at a time: nothing lands on disk (a bundle is
tens of GB; a copy would need that much free space and a second pass to read it back).

Exit status: 0 verified (one line: files, bytes, seconds, rate), 1 the bundle is not the pinned one (one line per
bad file), 2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import BinaryIO, Callable

from peagle_contract.bundle import (
    FILE, FOLDER, MANIFEST_MAX_BYTES, MANIFEST_NAME, BundleError, Entry, bundle_uri, check_digest, verify_listing,
)

from peagle_constructs.weights import S3Prefix

# Each S3 GET streams at a rate of its own, well below a host's link: several at once fill it.
DEFAULT_THREADS = 8


class _Body:
    """An object's body whose read errors are OSErrors, which the check reports per file."""

    def __init__(self, body) -> None:
        self.body = body

    def read(self, n: int = -1) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.body.read(n)
        except (BotoCoreError, ClientError) as exc:
            raise OSError(f"reading from S3 failed: {type(exc).__name__}") from exc

    def __enter__(self) -> "_Body":
        return self

    def __exit__(self, *exc) -> None:
        self.body.close()


def listing(s3, where: S3Prefix) -> list[Entry]:
    """Everything below the bundle's prefix, as paths relative to it (a key ending in "/" is a folder marker)."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key_prefix)
    found = []
    for page in pages:
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(where.key_prefix):]
            if rel.endswith("/"):
                found.append(Entry(rel.rstrip("/"), FOLDER))
            elif rel:
                found.append(Entry(rel, FILE, obj["Size"]))
    return found


def opener(s3, where: S3Prefix) -> Callable[[str], BinaryIO]:
    def open_file(rel: str) -> BinaryIO:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return _Body(s3.get_object(Bucket=where.bucket, Key=where.key_prefix + rel)["Body"])
        except (BotoCoreError, ClientError) as exc:
            raise OSError(f"GET failed: {type(exc).__name__}") from exc

    return open_file


def verify(s3, bundle: str, expected: str, *, threads: int = DEFAULT_THREADS):
    """Verify ``<bundle>/<expected>/`` in S3; returns peagle_contract.bundle.Verified, raises BundleError."""
    where = S3Prefix.parse(bundle_uri(bundle, expected))
    found = listing(s3, where)
    open_file = opener(s3, where)
    manifest = None
    if any(e.path == MANIFEST_NAME and e.kind == FILE for e in found):
        with open_file(MANIFEST_NAME) as body:
            manifest = body.read(MANIFEST_MAX_BYTES + 1)
    return verify_listing(manifest, expected, found, open_file, bundle=where.uri.rstrip("/"), where="SHA256",
                          threads=threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.verify_bundle", description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True, help="s3://bucket/prefix/, the prefix given to stage-weights")
    parser.add_argument("--sha256", required=True, help="the manifest digest stage-weights printed (the pin)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="objects hashed at once")
    parser.add_argument("--endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL"),
                        help="another S3 endpoint (default: $AWS_ENDPOINT_URL, else AWS)")
    args = parser.parse_args(argv)  # argparse exits 2 on its own usage errors
    usage = None
    prefix = S3Prefix.parse(args.bundle) if args.bundle.startswith("s3://") else None
    if prefix is None or not prefix.bucket or not prefix.key_prefix:
        usage = f"BUNDLE: got {args.bundle[:200]!r}; allowed: 's3://bucket/prefix/', the prefix given to stage-weights"
    elif not 1 <= args.threads <= 256:
        usage = f"--threads: got {args.threads}; allowed: 1..256"
    else:
        try:
            check_digest(args.sha256, "SHA256")
        except BundleError as exc:
            usage = str(exc)
    if usage:
        print(f"verify-bundle: error: {usage}", file=sys.stderr)
        return 2
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = boto3.client("s3", endpoint_url=args.endpoint_url, config=Config(max_pool_connections=args.threads + 2))
    try:
        verified = verify(s3, args.bundle, args.sha256, threads=args.threads)
    except BundleError as exc:
        print(f"verify-bundle: NOT VERIFIED: {bundle_uri(args.bundle, args.sha256)} is not the bundle SHA256 pins "
              f"({len(exc.problems)} problems):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    except (BotoCoreError, ClientError) as exc:  # no such bucket, no credentials, access denied
        print(f"verify-bundle: error: BUNDLE: could not list {args.bundle[:200]}: {exc}", file=sys.stderr)
        return 2
    print(f"verified {bundle_uri(args.bundle, args.sha256)}: {verified.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
