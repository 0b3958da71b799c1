"""What a weights pin change swaps: the drafter, the target, or both, read from the manifests the pins name.

A stage's pin (the manifest's SHA-256, rendered as PEAGLE_BUNDLE_MANIFEST_SHA256 in each model's environment) names
the whole bundle, so a template alone cannot tell a new drafter from a new target. The manifest can: it lists every
file of ``target/`` and ``drafter/`` with its SHA-256. The staged manifests are committed beside the pins
(stacks/bundles/<pin>.json, written by `make train-drafter` and `make stage-weights`), and each is believed only when
its own SHA-256 is the pin: the container verifies its bundle against the same pin, so a manifest that hashes to it
is the one the endpoint will serve, and an edited one is a failure, not a description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from peagle_contract.bundle import MANIFEST_DIGEST_VAR, MODEL_DIRS, BundleError, check_digest, digest, parse_manifest

from ops.stage_weights import MANIFESTS_DIR as BUNDLES_DIR
from review.verdicts import FAIL, INFO, MODEL, Finding

ADVICE_TAMPERED = ("Commit the manifest exactly as the stager wrote it (`make verify-bundle` reads it from S3); "
                   "whoever edited it described a bundle the endpoint will not serve.")

Manifests = Callable[[str], bytes | None]  # a pin -> the committed manifest's bytes, None when none is committed


def none(pin: str) -> None:
    """No manifests at all (a side whose tree is not here)."""
    return None


def _is_digest(pin: str) -> bool:
    # A pin comes from a template, which a pull request writes: it names a file here only as a digest (the
    # contract's own check of one).
    try:
        check_digest(pin, "pin")
    except BundleError:
        return False
    return True


def _pins(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == MANIFEST_DIGEST_VAR and isinstance(item, str):
                yield item
            else:
                yield from _pins(item)
    elif isinstance(value, list):
        for item in value:
            yield from _pins(item)


def model_pins(template: dict | None) -> dict[str, str]:
    """Each model's pinned bundle in a template: {logical id: manifest digest}."""
    resources = (template or {}).get("Resources") or {}
    return {lid: pin for lid, r in resources.items() if r.get("Type") == MODEL
            for pin in list(_pins(r.get("Properties") or {}))[:1]}


def _parts(manifest: bytes, pin: str) -> dict[str, dict[str, str]]:
    files = parse_manifest(manifest, where=f"{BUNDLES_DIR.as_posix()}/{pin}.json")
    return {part: {f.path.split("/", 1)[1]: f.sha256 for f in files if f.path.split("/", 1)[0] == part}
            for part in MODEL_DIRS}


def _changed(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))


def _part_line(part: str, changed: list[str], files: int) -> str:
    if not changed:
        return f"{part}/ the same {files} files"
    shown = ", ".join(changed[:4]) + (", …" if len(changed) > 4 else "")
    return f"{part}/ {len(changed)} files differ ({shown})"


def describe(old_pin: str | None, new_pin: str, *, base: Manifests, head: Manifests) -> tuple[str, str, str]:
    """(verdict, change, why) for one model whose pin moved from ``old_pin`` to ``new_pin``."""
    short = lambda pin: f"`{pin[:12]}…`" if pin else "no pin"  # noqa: E731
    moved = f"bundle {short(old_pin)} → {short(new_pin)}"
    sides = {}
    for side, pin, read in (("base", old_pin, base), ("head", new_pin, head)):
        if pin is None:
            continue
        manifest = read(pin)
        if manifest is None:
            return INFO, "weights change", (f"{moved}: no manifest at {BUNDLES_DIR.as_posix()}/{pin[:12]}….json on "
                                            f"the {side} side, so what changed in the bundle is not named here")
        if digest(manifest) != pin:
            return FAIL, "weights change", (f"{moved}: the committed manifest {BUNDLES_DIR.as_posix()}/{pin}.json "
                                            f"({side}) hashes to `{digest(manifest)[:12]}…`, not to its pin")
        try:
            sides[side] = _parts(manifest, pin)
        except BundleError as exc:
            return FAIL, "weights change", f"{moved}: {exc}"
    if "base" not in sides:
        head_parts = sides["head"]
        return INFO, "weights pinned", (f"{moved}: target/ {len(head_parts['target'])} files, drafter/ "
                                        f"{len(head_parts['drafter'])} files, as the committed manifest lists them")
    changed = {part: _changed(sides["base"][part], sides["head"][part]) for part in MODEL_DIRS}
    what = [part for part in MODEL_DIRS if changed[part]]
    change = {("drafter",): "drafter change", ("target",): "target change"}.get(tuple(what), "weights change")
    detail = "; ".join(_part_line(part, changed[part], len(sides["head"][part])) for part in MODEL_DIRS)
    return INFO, change, f"{moved}: {detail}"


def findings(base_template: dict | None, head_template: dict | None, *, base: Manifests,
             head: Manifests) -> list[Finding]:
    """One finding per model whose pinned bundle differs between the two templates."""
    before, after = model_pins(base_template), model_pins(head_template)
    # A pin change replaces the model; its logical id stays. A model new on the head compares with the one
    # pin the base had, if it had exactly one (a renamed model).
    only = next(iter(set(before.values()))) if len(set(before.values())) == 1 else None
    out = []
    for lid, pin in sorted(after.items()):
        old = before.get(lid, only)
        if old != pin:
            verdict, change, why = describe(old, pin, base=base, head=head)
            out.append(Finding(verdict, lid, MODEL, change, why, ADVICE_TAMPERED if verdict == FAIL else ""))
    return out


def committed(root: Path) -> Manifests:
    """The manifests committed in a checkout (or a worktree) at ``root``."""

    def read(pin: str) -> bytes | None:
        path = root / BUNDLES_DIR / f"{pin}.json"
        return path.read_bytes() if _is_digest(pin) and path.is_file() else None

    return read


def at_commit(repo: Path, ref: str) -> Manifests:
    """The manifests committed at ``ref`` in ``repo``, read as blobs (nothing of that commit runs)."""
    import subprocess

    def read(pin: str) -> bytes | None:
        if not _is_digest(pin):
            return None
        done = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:{BUNDLES_DIR.as_posix()}/{pin}.json"],
                              capture_output=True)
        return done.stdout if done.returncode == 0 else None

    return read
