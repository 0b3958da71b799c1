"""Put a target and its P-EAGLE drafter into the S3 bundle the stacks deploy: `make stage-weights`, or

    python -m harness.stage_weights --target openai/gpt-oss-20b --drafter amazon/GPT-OSS-20B-P-EAGLE \\
        --bundle s3://my-weights/bundles/gpt-oss-20b-p-eagle/ [--target-revision REV] [--drafter-revision REV]

1. Each model is a local folder or a Hugging Face id (downloaded through huggingface_hub at a pinned
   revision: the commit the revision resolves to is recorded; the token comes from the usual place).
2. The drafter is checked before anything is uploaded (peagle_contract.drafter, as the image checks it: a
   ``mask_hidden`` tensor, a mask-token id under a key vLLM reads, an EAGLE-3 architecture, a sane trained K); a bad one is refused
   with what is missing, and nothing is uploaded.
3. Files go to ``<bundle>/target/`` and ``<bundle>/drafter/`` - multipart for large files, a SHA-256
   checksum on every upload, the file's whole SHA-256 in its metadata; a file already there with the same
   SHA-256 and size is skipped. Progress is printed per file.
4. ``manifest.json`` (peagle_contract.bundle) is written last; its SHA-256 is printed: pin it in the
   environment (``bundle_manifest_sha256``) and the image refuses any other bundle.

Any S3 endpoint boto3 accepts works (``AWS_ENDPOINT_URL`` or ``--endpoint-url``); credentials and region as
boto3 finds them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from peagle_contract.bundle import DRAFTER_DIR, MANIFEST_NAME, TARGET_DIR, BundleFile, digest, file_sha256, render
from peagle_contract.drafter import DrafterCheckError, check_drafter_dir

from peagle_constructs.weights import S3Prefix

METADATA_KEY = "sha256"  # x-amz-meta-sha256: the whole file's digest (a multipart ETag is not one)
MULTIPART_THRESHOLD = 64 * 1024 * 1024


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


def _files(source: Source, prefix: str) -> list[tuple[Path, str]]:
    out = []
    for path in sorted(source.folder.rglob("*")):
        rel = path.relative_to(source.folder)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts):  # hub cache markers, .git
            out.append((path, f"{prefix}/{rel.as_posix()}"))
    if not out:
        raise StageError(f"{source.origin}: no files to upload")
    return out


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def stage(target: Source, drafter: Source, bundle: str, *, s3=None, log: Callable[[str], None] = print) -> dict:
    """Upload both models and the manifest; return {"manifest_sha256", "target_model", "drafter_model", ...}."""
    import boto3
    from boto3.s3.transfer import TransferConfig

    prefix = S3Prefix.parse(bundle)
    if not bundle.startswith("s3://") or not prefix.bucket or not prefix.key_prefix:
        raise StageError(f"--bundle: got {bundle!r}; allowed: 's3://bucket/prefix/' (not the bucket root: SageMaker "
                         "copies everything below the prefix)")
    drafter_info = check_drafter(drafter.folder)
    plan = _files(target, TARGET_DIR) + _files(drafter, DRAFTER_DIR)
    s3 = s3 or boto3.client("s3")
    config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD)
    files: list[BundleFile] = []
    uploaded = skipped = 0
    started = time.monotonic()
    for index, (path, rel) in enumerate(plan, 1):
        size = path.stat().st_size
        sha = file_sha256(path)
        key = prefix.key_prefix + rel
        files.append(BundleFile(path=rel, size=size, sha256=sha))
        if _already_there(s3, prefix.bucket, key, size=size, sha=sha):
            skipped += 1
            log(f"[{index}/{len(plan)}] {rel}: {_human(size)}, already there (same SHA-256), skipped")
            continue
        log(f"[{index}/{len(plan)}] {rel}: {_human(size)} ...")
        progress = _Progress(rel, size, log)
        s3.upload_file(str(path), prefix.bucket, key, Config=config, Callback=progress,
                       ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {METADATA_KEY: sha}})
        uploaded += 1
    sources = {"target": {"source": target.origin, "revision": target.revision},
               "drafter": {"source": drafter.origin, "revision": drafter.revision}}
    manifest = render(files, sources)
    # Last: a bundle without its manifest is incomplete by definition.
    s3.put_object(Bucket=prefix.bucket, Key=prefix.key_prefix + MANIFEST_NAME, Body=manifest,
                  ContentType="application/json", ChecksumAlgorithm="SHA256")
    result = {"manifest_sha256": digest(manifest), "bundle": prefix.uri,
              "target_model": f"{prefix.uri}{TARGET_DIR}/", "drafter_model": f"{prefix.uri}{DRAFTER_DIR}/",
              "files": len(files), "bytes": sum(f.size for f in files), "uploaded": uploaded, "skipped": skipped,
              "drafter": drafter_info, "seconds": round(time.monotonic() - started, 1)}
    log(f"manifest written: {prefix.uri}{MANIFEST_NAME} (sha256 {result['manifest_sha256']})")
    return result


def _already_there(s3, bucket: str, key: str, *, size: int, sha: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return head.get("ContentLength") == size and head.get("Metadata", {}).get(METADATA_KEY) == sha


class _Progress:
    """boto3's transfer callback: a line per quarter of a large file."""

    def __init__(self, name: str, size: int, log: Callable[[str], None]) -> None:
        self.name, self.size, self.log, self.sent, self.next = name, size, log, 0, 0.25

    def __call__(self, chunk: int) -> None:
        self.sent += chunk
        if self.size >= MULTIPART_THRESHOLD and self.sent / self.size >= self.next:
            self.log(f"      {self.name}: {self.sent / self.size:.0%} of {_human(self.size)}")
            self.next += 0.25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.stage_weights", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target model: a Hugging Face id or a local folder")
    parser.add_argument("--drafter", required=True, help="its P-EAGLE head: a Hugging Face id or a local folder")
    parser.add_argument("--bundle", required=True, help="s3://bucket/prefix/ the environment's bundle")
    parser.add_argument("--target-revision", help="hub revision (branch, tag or commit) of the target")
    parser.add_argument("--drafter-revision", help="hub revision of the drafter")
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
                       log=lambda line: print(line, file=sys.stderr, flush=True))
    except StageError as exc:
        print(f"stage-weights: error: {exc}; nothing uploaded", file=sys.stderr)
        return 2
    print(f"pin it: ServingConfig(target_model={result['target_model']!r}, drafter_model={result['drafter_model']!r}, "
          f"bundle_manifest_sha256={result['manifest_sha256']!r}, ...)", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
