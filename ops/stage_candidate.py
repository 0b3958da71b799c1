"""Stage the drafter candidate a stage's cloud training passed, beside its pinned target: `make stage-candidate`, or

    python -m ops.stage_candidate --env dev [--candidate s3://<capture bucket>/candidates/dev/<job>/output/model/]

1. The candidate is the job output the stage's SSM parameter names (peagle_constructs.DrafterTraining publishes it
   when the gate passes), or ``--candidate``. Whoever may write that parameter could name anything, so nothing it
   says is trusted: the candidate must lie below ``candidates/<stage>/`` of this stage's capture bucket in the
   caller's own account (S3 is asked with ExpectedBucketOwner; the bucket's policy lets only the training job's
   role write there), its ``gate.json`` must say passed, and its manifest's SHA-256 must be the report's.
2. The manifest must pair the stage's pinned target (exactly the pinned manifest's target entries; the pinned
   manifest is checked against the pin first) with a drafter the serving image accepts: another target, or a head
   the image would refuse, is refused here, before anything is written.
3. The new bundle ``<prefix>/<candidate pin>/`` goes beside the pinned one: the target's files copied inside S3
   from the pinned bundle, the drafter's downloaded, hashed against the manifest and uploaded as hashed; then every
   file of the new bundle is checked as the serving container checks it (peagle_contract.bundle.verify_listing)
   before the manifest is written, last, and never over an existing one.
4. The manifest is kept as stacks/bundles/<pin>.json and the pin change printed, as `make train-drafter` does: the
   pull request's stack diff then names it a drafter change.

Exit 0 staged (or already there), 2 refused: a bad option, candidate or bundle, named.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from peagle_contract.bundle import (
    DRAFTER_DIR, MANIFEST_MAX_BYTES, MANIFEST_NAME, TARGET_DIR, BundleError, bundle_uri, digest, file_sha256,
    parse_manifest, verify_listing,
)
from peagle_contract.drafter import DrafterCheckError, check_drafter_dir
from peagle_contract.training_job import CANDIDATE_MANIFEST, GATE_REPORT, MODEL_DIR

from peagle_constructs.drafter_training import OUTPUT_PREFIX, candidate_parameter_name, job_name_prefix
from peagle_constructs.weights import S3Prefix, WeightsLayout

from ops import cdk
from ops.stage_weights import MANIFESTS_DIR, StageError, existing_manifest, record_manifest, strays_in
from ops.stages import StageNameError, find_stage
from ops.train_drafter import TrainDrafterError, pin_change
from ops.verify_bundle import listing, opener


class CandidateError(ValueError):
    pass


def _get(s3: Any, bucket: str, key: str, owner: str, limit: int = MANIFEST_MAX_BYTES) -> bytes:
    from botocore.exceptions import ClientError

    try:
        body = s3.get_object(Bucket=bucket, Key=key, ExpectedBucketOwner=owner)["Body"]
    except ClientError as exc:
        raise CandidateError(f"s3://{bucket}/{key}: could not be read ({exc.response['Error'].get('Code')})") from None
    data = body.read(limit + 1)
    if len(data) > limit:
        raise CandidateError(f"s3://{bucket}/{key}: over {limit} bytes; allowed: a report or manifest")
    return data


def candidate_location(stage: str, uri: str, bucket: str) -> S3Prefix:
    """The job output ``uri`` names, if it is one of this stage's candidates in its own capture bucket."""
    where = S3Prefix.parse(uri) if isinstance(uri, str) and uri.startswith("s3://") else None
    job = re.escape(job_name_prefix(stage))
    layout = re.compile(rf"^{re.escape(OUTPUT_PREFIX)}{re.escape(stage)}/{job}-[0-9a-f-]{{36}}/output/{MODEL_DIR}/$")
    if where is None or where.bucket != bucket or not layout.match(where.key_prefix):
        raise CandidateError(f"candidate: got {str(uri)[:120]!r}; allowed: s3://{bucket}/{OUTPUT_PREFIX}{stage}/"
                             f"{job_name_prefix(stage)}-<id>/output/{MODEL_DIR}/, a job output of this stage's "
                             "training in its own capture bucket")
    return where


def published_candidate(ssm: Any, stage: str) -> str:
    """The job output the stage's parameter names (the folder of the manifest it points to)."""
    raw = ssm.get_parameter(Name=candidate_parameter_name(stage))["Parameter"]["Value"]
    try:
        manifest = json.loads(raw)["manifest"]
    except (ValueError, KeyError, TypeError):
        raise CandidateError(f"{candidate_parameter_name(stage)}: holds {raw[:60]!r}; allowed: what the training "
                             "state machine publishes once a candidate passes (none has yet?)") from None
    if not isinstance(manifest, str) or not manifest.endswith(f"/{CANDIDATE_MANIFEST}"):
        raise CandidateError(f"{candidate_parameter_name(stage)}: manifest {str(manifest)[:80]!r}; allowed: "
                             f"s3://.../{CANDIDATE_MANIFEST}")
    return manifest[: -len(CANDIDATE_MANIFEST)]


def check_candidate(manifest: bytes, report: bytes, pinned: bytes) -> str:
    """The candidate's pin, once its report says it passed for this very manifest and the manifest pairs the pinned
    target with a drafter."""
    pin = digest(manifest)
    try:
        gate = json.loads(report)
    except ValueError:
        raise CandidateError(f"{GATE_REPORT}: not JSON") from None
    if not isinstance(gate, dict) or gate.get("gate") != "passed":
        raise CandidateError(f"{GATE_REPORT}: gate {str(gate.get('gate') if isinstance(gate, dict) else gate)[:20]!r};"
                             " allowed: 'passed' (a refused candidate is never staged)")
    if gate.get("candidate_sha256") != pin:
        raise CandidateError(f"{MANIFEST_NAME}: sha256 {pin[:12]}..., but {GATE_REPORT} passed "
                             f"{str(gate.get('candidate_sha256'))[:12]}...; allowed: the manifest the gate passed")
    files = parse_manifest(manifest, where=CANDIDATE_MANIFEST)
    target = [f for f in files if f.path.startswith(f"{TARGET_DIR}/")]
    pinned_target = [f for f in parse_manifest(pinned) if f.path.startswith(f"{TARGET_DIR}/")]
    if target != pinned_target:
        raise CandidateError(f"{CANDIDATE_MANIFEST}: lists a target of {len(target)} files that is not the pinned "
                             f"one ({len(pinned_target)} files); allowed: the stage's pinned target, file for file")
    if len(target) == len(files):
        raise CandidateError(f"{CANDIDATE_MANIFEST}: lists no {DRAFTER_DIR}/ file")
    return pin


def stage_candidate(*, env: str, candidate: str | None, s3: Any, ssm: Any, account: str, region: str,
                    repo: Path, log: Callable[[str], None]) -> dict:
    config = find_stage(env)
    stage, serving = config.name.lower(), config.model.serving
    pin = serving.bundle_manifest_sha256
    if pin is None or serving.capture is None:
        raise CandidateError(f"{config.name}: {'its weights are not pinned' if pin is None else 'no capture'}; "
                             "allowed: a stage that trains (a pinned bundle and capture on)")
    pinned = WeightsLayout.of(serving).source
    prefix = S3Prefix(bucket=pinned.bucket, key_prefix=pinned.key_prefix.rstrip("/").rsplit("/", 1)[0] + "/")
    bucket = config.capture_bucket_name(account, region)
    where = candidate_location(stage, candidate or published_candidate(ssm, stage), bucket)
    manifest = _get(s3, bucket, where.key_prefix + CANDIDATE_MANIFEST, account)
    report = _get(s3, bucket, where.key_prefix + GATE_REPORT, account)
    weights_owner = config.model.weights_account or account
    pinned_manifest = _get(s3, pinned.bucket, pinned.key_prefix + MANIFEST_NAME, weights_owner)
    if digest(pinned_manifest) != pin:
        raise CandidateError(f"{pinned.uri}{MANIFEST_NAME}: sha256 {digest(pinned_manifest)[:12]}...; allowed: the "
                             f"stage's pin {pin[:12]}...")
    new_pin = check_candidate(manifest, report, pinned_manifest)
    new = S3Prefix.parse(bundle_uri(prefix.uri, new_pin))
    result = {"manifest_sha256": new_pin, "bundle": new.uri, "existing": False, "candidate": where.uri,
              "stage": stage}
    there = existing_manifest(s3, new)
    if there is not None:
        if there != manifest:
            raise CandidateError(f"{new.uri}{MANIFEST_NAME}: exists but is not the candidate's manifest; nothing is "
                                 "written over a bundle")
        log(f"bundle {new.uri} already exists: nothing copied")
        record_manifest(manifest, new_pin, repo / MANIFESTS_DIR, log)
        return {**result, "existing": True}
    files = parse_manifest(manifest, where=CANDIDATE_MANIFEST)
    with tempfile.TemporaryDirectory(prefix="peagle-candidate-") as tmp:
        heads = {f.path: Path(tmp) / f.path for f in files if f.path.startswith(f"{DRAFTER_DIR}/")}
        for f in files:
            if f.path in heads:  # downloaded, hashed, and these very bytes uploaded
                heads[f.path].parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, where.key_prefix + f.path, str(heads[f.path]),
                                 ExtraArgs={"ExpectedBucketOwner": account})
                if heads[f.path].stat().st_size != f.size or file_sha256(heads[f.path]) != f.sha256:
                    raise CandidateError(f"{where.uri}{f.path}: not the bytes the candidate's manifest lists; "
                                         "nothing staged")
        try:
            check_drafter_dir(Path(tmp) / DRAFTER_DIR, where="candidate")
        except DrafterCheckError as exc:
            raise CandidateError(str(exc)) from None
        for index, f in enumerate(files, 1):
            key = new.key_prefix + f.path
            if f.path in heads:
                s3.upload_file(str(heads[f.path]), new.bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"})
            else:  # the pinned target, copied inside S3
                s3.copy({"Bucket": pinned.bucket, "Key": pinned.key_prefix + f.path}, new.bucket, key)
            log(f"[{index}/{len(files)}] {f.path}")
    strays = strays_in(s3, new, {f.path for f in files})
    if strays:
        raise CandidateError(f"{new.uri}: holds objects that are not part of the bundle ({', '.join(strays[:5])}); "
                             "the manifest was not written")
    verify_listing(manifest, new_pin, listing(s3, new), opener(s3, new), bundle=new.uri.rstrip("/"), where="candidate")
    from botocore.exceptions import ClientError

    try:  # last, and only if no manifest is there: a bundle is never written over
        s3.put_object(Bucket=new.bucket, Key=new.key_prefix + MANIFEST_NAME, Body=manifest,
                      ContentType="application/json", ChecksumAlgorithm="SHA256", IfNoneMatch="*")
    except ClientError as exc:
        raise CandidateError(f"{new.uri}{MANIFEST_NAME}: not written ({exc.response['Error'].get('Code')}); nothing "
                             "is written over a bundle (check it with `make verify-bundle`)") from None
    log(f"manifest written: {new.uri}{MANIFEST_NAME} (sha256 {new_pin})")
    record_manifest(manifest, new_pin, repo / MANIFESTS_DIR, log)
    return result


def main(argv: list[str] | None = None) -> int:
    import boto3

    parser = argparse.ArgumentParser(prog="python -m ops.stage_candidate", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="the stage whose training produced the candidate")
    parser.add_argument("--candidate", help="s3://<capture bucket>/candidates/<stage>/<job>/output/model/ (default: "
                                            "the one the stage's SSM parameter names)")
    parser.add_argument("--repo", type=Path, default=cdk.REPO_ROOT,
                        help="the checkout whose pin changes and that keeps the manifest (default: this one)")
    args = parser.parse_args(argv)
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    session = boto3.Session()
    s3, ssm = session.client("s3", endpoint_url=endpoint), session.client("ssm", endpoint_url=endpoint)
    account = session.client("sts", endpoint_url=endpoint).get_caller_identity()["Account"]

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        staged = stage_candidate(env=args.env, candidate=args.candidate, s3=s3, ssm=ssm, account=account,
                                 region=s3.meta.region_name, repo=args.repo, log=log)
        change = pin_change(staged["stage"], staged["manifest_sha256"], repo=args.repo)
    except (CandidateError, BundleError, StageError, StageNameError, TrainDrafterError) as exc:
        print(f"stage-candidate: error: {exc}", file=sys.stderr)
        return 2
    pin = staged["manifest_sha256"]
    print(json.dumps(staged, indent=2))
    print(f"stage-candidate: staged {staged['bundle']}\nthe change to commit: {MANIFESTS_DIR.as_posix()}/{pin}.json "
          f"(kept there) and the pin:\n{change or '(the stage is pinned to this bundle already)'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
