"""The weights the rehearsal's stages serve, staged and pinned as a user does it (README: "Deploy to your account").

The random pair stands in for GPT-OSS-20B and its drafter. :func:`local_bundle` lays it out as a bundle (the
manifest the stager renders, beside ``target/`` and ``drafter/``); its digest is pinned on the seeded main for every
stage (:func:`pin_edit`: the commit a team makes after `make stage-weights`), so the promotion's real-account synth
finds Staging and Prod pinned. :func:`stage` puts the same bundle into each stage account's own bucket with the real
stager, which must arrive at the same digest. The runtime every endpoint is served by mounts the local bundle at
/opt/ml/model with the pin in its environment, so its entrypoint verifies every file before vLLM starts, as a
SageMaker container does.

What this cannot prove: that SageMaker copies the prefix the model names (the runtime mounts the local copy).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ops.stage_weights import Source, manifest_of, plan, stage as stage_bundle

ENVIRONMENTS_PY = Path("stacks") / "environments.py"
UNPINNED = 'PINNED_BUNDLES: dict[str, str | None] = {"dev": None, "staging": None, "prod": None}'


def sources() -> tuple[Source, Source]:
    """The random pair as the stager's sources, named by role rather than by path: the digest is then the same on
    every machine (the manifest records each source's name)."""
    from models import random_pair

    pair = random_pair.build()
    return (Source(folder=pair.target, origin="models.random_pair target", revision=None),
            Source(folder=pair.drafter, origin="models.random_pair drafter", revision=None))


def local_bundle(folder: Path) -> str:
    """Write the random pair into ``folder`` as the stager lays out a bundle; return its digest (the pin)."""
    from peagle_contract.bundle import MANIFEST_NAME, digest

    target, drafter = sources()
    files = plan(target, drafter)
    _, manifest = manifest_of(target, drafter, files)
    shutil.rmtree(folder, ignore_errors=True)
    for relative, path in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, folder / relative)  # copied, as SageMaker copies: no link leads out of the bundle
    (folder / MANIFEST_NAME).write_bytes(manifest)
    return digest(manifest)


def pin_edit(pin: str):  # noqa: ANN201 - an edit for Scratch.commit
    """The seeded main's commit that pins every stage to ``pin`` (what a team commits after staging)."""
    def edit(work: Path) -> None:
        path = work / ENVIRONMENTS_PY
        text = path.read_text()
        if UNPINNED not in text:
            raise AssertionError(f"the pin edit no longer applies: {UNPINNED!r} is not in {ENVIRONMENTS_PY}")
        path.write_text(text.replace(UNPINNED, "PINNED_BUNDLES: dict[str, str | None] = "
                                               f'{{"dev": "{pin}", "staging": "{pin}", "prod": "{pin}"}}'))
    return edit


def stage(aws, pin: str, *, log=lambda line: None) -> dict[str, str]:  # noqa: ANN001 - EmbeddedAccounts
    """Stage the random pair into each stage's bucket, in that stage's account, with the real stager; the bundle
    URI by stage. Raises unless the stager arrives at ``pin``."""
    from peagle_constructs.weights import S3Prefix
    from stacks.environments import BUNDLE_PREFIXES

    target, drafter = sources()
    staged = {}
    for stage_name, account in aws.accounts.items():
        prefix = BUNDLE_PREFIXES[stage_name.lower()]
        s3 = aws.client("s3", account)
        s3.create_bucket(Bucket=S3Prefix.parse(prefix).bucket)
        result = stage_bundle(target, drafter, prefix, s3=s3, log=log)
        if result["manifest_sha256"] != pin:
            raise RuntimeError(f"{stage_name}: the stager's bundle has digest {result['manifest_sha256'][:12]}..., "
                               f"the pinned one {pin[:12]}...")
        staged[stage_name] = result["bundle"]
    return staged
