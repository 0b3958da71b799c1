"""Put a target and its P-EAGLE drafter into an S3 bundle named by its content: `make stage-weights`, or

    python -m ops.stage_weights --target openai/gpt-oss-20b --drafter amazon/GPT-OSS-20B-P-EAGLE \\
        --bundle s3://my-weights/bundles/gpt-oss-20b-p-eagle/ [--target-revision REV] [--drafter-revision REV]

1. Each model is a local folder or a Hugging Face id (downloaded through huggingface_hub at a pinned
   revision: the commit the revision resolves to is recorded; the token comes from the usual place).
2. The drafter is checked before anything is uploaded (peagle_contract.drafter, as the image checks it: a
   ``mask_hidden`` tensor, a mask-token id under a key vLLM reads, an EAGLE-3 architecture, a sane trained K); a
   bad one is refused with what is missing, and nothing is uploaded.
3. Every file is hashed here first and the manifest rendered (peagle_contract.bundle); the bundle is
   ``<bundle>/<manifest sha256>/``: ``target/``, ``drafter/``, then ``manifest.json`` last, written only if no
   manifest is there (a bundle exists when its manifest does, and is never written over: then nothing is
   uploaded). Resuming an incomplete one, a file is skipped only when S3's own SHA-256 checksum of the object
   (computed by S3 from the bytes it stored) is the local file's; user metadata, which any writer sets, is
   never read. An object there that is not part of the bundle stops the stager before the manifest.
4. It prints the digest to pin and the serving config's line for it, and keeps the manifest in the checkout
   (stacks/bundles/<digest>.json, committed with the pin: the stack diff reads it); `make verify-bundle` checks
   the result.

Any S3 endpoint boto3 accepts works (``AWS_ENDPOINT_URL`` or ``--endpoint-url``); credentials and region as
boto3 finds them.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from peagle_contract.bundle import (
    DRAFTER_DIR, MANIFEST_NAME, TARGET_DIR, BundleError, BundleFile, bundle_uri, describe, digest, display_path, render,
)
from peagle_contract.drafter import DrafterCheckError, check_drafter_dir

from peagle_constructs.weights import S3Prefix

from ops.cdk import REPO_ROOT

# Where a checkout keeps the manifest of each bundle a stage pins, as staged (<pin>.json): what the stack diff reads
# to say whether a pin change swaps the drafter or the target (review.bundle_change). Relative to the repository.
MANIFESTS_DIR = Path("stacks") / "bundles"

# Files from this size on go up in parts of this size. S3's SHA-256 of a multipart object is composite (the
# SHA-256 of the parts' SHA-256s, then "-<parts>"), so deciding "already there" needs the same part size here.
PART_SIZE = 64 * 1024 * 1024


class StageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Source:
    folder: Path
    origin: str  # what the user named: a hub id or a local path
    revision: str | None  # the commit a hub revision resolved to; None for a local folder


def resolve(name: str, *, revision: str | None, role: str, download_dir: Path | None = None) -> Source:
    """A local folder as it is, or a hub id downloaded at ``revision`` (default: main) into the hub cache."""
    path = Path(name).expanduser()
    if path.is_dir():
        return Source(folder=path.resolve(), origin=str(path), revision=None)
    if path.exists() or name.startswith(("/", "./", "../", "~")):
        raise StageError(f"--{role}: {name} is not a folder; allowed: a model folder or a Hugging Face id 'org/name'")
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError:
        raise StageError(f"--{role}: {name!r} looks like a Hugging Face id; install huggingface_hub to download it "
                         "(pip install huggingface_hub) or pass a local folder") from None
    commit = HfApi().model_info(name, revision=revision or "main").sha
    folder = snapshot_download(name, revision=commit, cache_dir=download_dir)
    return Source(folder=Path(folder), origin=name, revision=commit)


def check_drafter(folder: Path) -> dict:
    """What the drafter states, or StageError naming what is missing (nothing has been uploaded yet)."""
    try:
        info = check_drafter_dir(folder, where="--drafter")
    except DrafterCheckError as exc:
        raise StageError(str(exc)) from None
    return {"mask_token_id": info.mask_token_id, "trained_k": info.trained[1] if info.trained else None,
            "architectures": list(info.architectures)}


def plan(target: Source, drafter: Source) -> dict[str, Path]:
    """Each bundle path and the local file that goes there (hub cache markers and other dot files left out)."""
    out: dict[str, Path] = {}
    for source, folder in ((target, TARGET_DIR), (drafter, DRAFTER_DIR)):
        found = {f"{folder}/{path.relative_to(source.folder).as_posix()}": path
                 for path in sorted(source.folder.rglob("*"))
                 if path.is_file() and not any(p.startswith(".") for p in path.relative_to(source.folder).parts)}
        if not found:
            raise StageError(f"{source.origin}: no files to upload")
        out.update(found)
    return out


def manifest_of(target: Source, drafter: Source, files: dict[str, Path],
                threads: int | None = None) -> tuple[list[BundleFile], bytes]:
    """Every file of the bundle hashed, and the manifest that names them and where the models came from."""
    try:
        listed = describe(files, threads)
    except BundleError as exc:
        raise StageError(str(exc)) from None
    sources = {"target": {"source": target.origin, "revision": target.revision},
               "drafter": {"source": drafter.origin, "revision": drafter.revision}}
    return listed, render(listed, sources)


def s3_sha256(path: Path, size: int, sha256: str, part_size: int = PART_SIZE) -> str:
    """The ChecksumSHA256 S3 reports for ``path`` (whose SHA-256 is ``sha256``) as this stager uploads it: the
    SHA-256 in base64 for a single PutObject, else the composite over parts of ``part_size`` (as s3transfer adjusts
    it to S3's part limits)."""
    from s3transfer.utils import ChunksizeAdjuster

    if size < part_size:
        return base64.b64encode(bytes.fromhex(sha256)).decode()
    chunk = ChunksizeAdjuster().adjust_chunksize(part_size, size)
    parts = []
    with path.open("rb") as f:
        while block := f.read(chunk):
            parts.append(hashlib.sha256(block).digest())
    return f"{base64.b64encode(hashlib.sha256(b''.join(parts)).digest()).decode()}-{len(parts)}"


def _same_in_s3(head: dict, path: Path, f: BundleFile, part_size: int) -> bool:
    got = head.get("ChecksumSHA256")
    if not got or head.get("ContentLength") != f.size:
        return False  # no checksum (a plain PutObject from someone else) is not evidence: upload again
    want_digest, _, want_parts = s3_sha256(path, f.size, f.sha256, part_size).partition("-")
    got_digest, _, got_parts = got.partition("-")
    # moto 5.2.5 reports a composite checksum without its "-<parts>" suffix (S3 adds it); equal SHA-256s of the
    # part SHA-256s mean equal parts either way.
    return got_digest == want_digest and got_parts in ("", want_parts)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def _missing(exc) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def existing_manifest(s3, where: S3Prefix) -> bytes | None:
    from botocore.exceptions import ClientError

    try:
        return s3.get_object(Bucket=where.bucket, Key=where.key_prefix + MANIFEST_NAME)["Body"].read()
    except ClientError as exc:
        if _missing(exc):
            return None
        raise


def _head(s3, bucket: str, key: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        return s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if _missing(exc):
            return None
        raise


def stage(target: Source, drafter: Source, bundle: str, *, s3=None, log: Callable[[str], None] = print,
          part_size: int = PART_SIZE, threads: int | None = None, record_in: Path | None = None) -> dict:
    """Upload both models and the manifest under ``<bundle>/<manifest digest>/``; return what was done
    ({"manifest_sha256", "bundle", "target_model", "drafter_model", "uploaded", "skipped", "existing", ...}).
    ``record_in``: a folder the manifest is also written to as ``<digest>.json`` once the bundle holds it."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    given = S3Prefix.parse(bundle)
    if not bundle.startswith("s3://") or not given.bucket or not given.key_prefix:
        raise StageError(f"--bundle: got {bundle[:200]!r}; allowed: 's3://bucket/prefix/' (not the bucket root: "
                         "SageMaker copies everything below the prefix)")
    drafter_info = check_drafter(drafter.folder)
    files = plan(target, drafter)
    started = time.monotonic()
    listed, manifest = manifest_of(target, drafter, files, threads)
    log(f"hashed {len(listed)} files, {_human(sum(f.size for f in listed))}, in {time.monotonic() - started:.1f} s")
    pin = digest(manifest)
    where = S3Prefix.parse(bundle_uri(given.uri, pin))
    result = {"manifest_sha256": pin, "bundle": where.uri,
              "target_model": f"{where.uri}{TARGET_DIR}/", "drafter_model": f"{where.uri}{DRAFTER_DIR}/",
              "files": len(listed), "bytes": sum(f.size for f in listed), "uploaded": 0, "skipped": 0,
              "existing": False, "drafter": drafter_info}
    s3 = s3 or boto3.client("s3")
    there = existing_manifest(s3, where)
    if there is not None:
        if there != manifest:  # the key names this content: other bytes there were written by someone else
            raise StageError(f"{where.uri}{MANIFEST_NAME} exists but is not this bundle's manifest (sha256 "
                             f"{digest(there)[:12]}..., expected {pin[:12]}...); allowed: nothing is written over an "
                             "existing bundle: find out who wrote it (`make verify-bundle` names what differs)")
        log(f"bundle {where.uri} already exists (its manifest is there): nothing uploaded")
        record_manifest(manifest, pin, record_in, log)
        return {**result, "existing": True, "seconds": round(time.monotonic() - started, 1)}

    config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size)
    for index, f in enumerate(listed, 1):
        key, path = where.key_prefix + f.path, files[f.path]
        head = _head(s3, where.bucket, key)
        if head is not None and _same_in_s3(head, path, f, part_size):
            result["skipped"] += 1
            log(f"[{index}/{len(listed)}] {f.path}: {_human(f.size)}, already there (S3's SHA-256 matches), skipped")
            continue
        state = "replacing an object whose S3 SHA-256 differs" if head is not None else "uploading"
        log(f"[{index}/{len(listed)}] {f.path}: {_human(f.size)}, {state} ...")
        s3.upload_file(str(path), where.bucket, key, Config=config, Callback=_Progress(f.path, f.size, part_size, log),
                       ExtraArgs={"ChecksumAlgorithm": "SHA256"})
        result["uploaded"] += 1
    strays = strays_in(s3, where, {f.path for f in listed} | {MANIFEST_NAME})  # a manifest there: the put says so
    if strays:
        raise StageError(f"{where.uri}: holds {len(strays)} objects that are not part of this bundle "
                         f"({', '.join(strays[:5])}); allowed: only the bundle's files (remove them; the manifest "
                         "was not written)")
    try:  # last, and only if no manifest is there: a bundle is never written over
        s3.put_object(Bucket=where.bucket, Key=where.key_prefix + MANIFEST_NAME, Body=manifest,
                      ContentType="application/json", ChecksumAlgorithm="SHA256", IfNoneMatch="*")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
            raise
        raise StageError(f"{where.uri}{MANIFEST_NAME}: written by someone else while staging; nothing written over "
                         "it (check the bundle with `make verify-bundle`)") from None
    log(f"manifest written: {where.uri}{MANIFEST_NAME} (sha256 {pin})")
    record_manifest(manifest, pin, record_in, log)
    return {**result, "seconds": round(time.monotonic() - started, 1)}


def record_manifest(manifest: bytes, pin: str, folder: Path | None, log: Callable[[str], None]) -> None:
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{pin}.json").write_bytes(manifest)
    log(f"manifest kept for the pull request: {folder / f'{pin}.json'}")


def strays_in(s3, where: S3Prefix, paths: set[str]) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key_prefix)
    keys = (o["Key"][len(where.key_prefix):] for page in pages for o in page.get("Contents", []))
    return sorted(display_path(k) for k in keys if k not in paths)


class _Progress:
    """boto3's transfer callback: a line per quarter of a file that goes up in parts."""

    def __init__(self, name: str, size: int, part_size: int, log: Callable[[str], None]) -> None:
        self.name, self.size, self.log, self.sent, self.next = name, size, log, 0, 0.25
        self.multipart = size >= part_size

    def __call__(self, chunk: int) -> None:
        self.sent += chunk
        if self.multipart and self.sent / self.size >= self.next:
            self.log(f"      {self.name}: {self.sent / self.size:.0%} of {_human(self.size)}")
            self.next += 0.25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.stage_weights", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target model: a Hugging Face id or a local folder")
    parser.add_argument("--drafter", required=True, help="its P-EAGLE head: a Hugging Face id or a local folder")
    parser.add_argument("--bundle", required=True,
                        help="s3://bucket/prefix/ the environment's bundle prefix (the digest folder goes below it)")
    parser.add_argument("--target-revision", help="hub revision (branch, tag or commit) of the target")
    parser.add_argument("--drafter-revision", help="hub revision of the drafter")
    parser.add_argument("--manifests", type=Path, default=REPO_ROOT / MANIFESTS_DIR,
                        help="where the manifest is kept to commit beside the pin (default: stacks/bundles)")
    parser.add_argument("--endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL"),
                        help="another S3 endpoint (default: $AWS_ENDPOINT_URL, else AWS)")
    args = parser.parse_args(argv)
    import boto3

    try:
        # The drafter first: it is small, and a bad one should cost no download of the target.
        drafter = resolve(args.drafter, revision=args.drafter_revision, role="drafter")
        check_drafter(drafter.folder)
        target = resolve(args.target, revision=args.target_revision, role="target")
        # Progress on stderr; stdout is the result alone (JSON), for scripts.
        result = stage(target, drafter, args.bundle, s3=boto3.client("s3", endpoint_url=args.endpoint_url),
                       log=lambda line: print(line, file=sys.stderr, flush=True),
                       record_in=args.manifests)
    except StageError as exc:
        print(f"stage-weights: error: {exc}; no manifest written (a bundle is incomplete until it has one)",
              file=sys.stderr)
        return 2
    pin = result["manifest_sha256"]
    print(f"pin it: bundle_manifest_sha256={pin!r}, and commit {MANIFESTS_DIR.as_posix()}/{pin}.json beside the pin\n"
          f"check it: make verify-bundle BUNDLE={args.bundle} SHA256={pin}\n"
          f"config: ServingConfig(target_model={result['target_model']!r}, drafter_model={result['drafter_model']!r}, "
          f"bundle_manifest_sha256={pin!r}, ...)", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
