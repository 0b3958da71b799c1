"""The pull request's synthesized templates, carried from the pull request's run to the judge as data.

    python -m review.head_artifact pack --assembly cdk.out --into stack-templates      (the pull request's job)
    python3 -m review.head_artifact unpack --download DIR --into DIR                   (the judge, before it installs anything)

``pack`` keeps, of a cloud assembly, only each stack's template and an index of our own (``index.json``:
display name, stack name, template file), flat, at the artifact's root, and the committed manifests of the
bundles those templates pin (``<sha256>.bundle.json``, from stacks/bundles/): the stack diff reads them to name a pin change.
Nothing else leaves the pull request's job: no asset, no CDK manifest, nothing the CDK CLI would follow or run.

``unpack`` runs in the judge, which holds a write token: the pull request controls every byte of the zip
(its workflow file is its own, so it can upload any zip under the expected name), so the zip is read as
hostile. It is never extracted by a tool: each member is checked (a plain file named ``index.json`` or
``<stack name>.template.json`` at the root - so no folder, path, link or device -, not encrypted, stored or
deflated, at most the sizes below both as declared and as actually inflated, names unique without regard to
case) and each must parse as strict JSON (no NaN or Infinity, no repeated key) of the right shape; the
index must list every template exactly once. A manifest member must hash to the digest its name carries, so it
can only be the manifest some pin names (the diff still checks that pin). Only then are the bytes written, under names this module
chooses, into a new folder. Any refusal names the member, what is allowed and what was found.
"""

from __future__ import annotations

import argparse
import json
import re
import stat
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

INDEX = "index.json"
FORMAT = 1
TEMPLATE_SUFFIX = ".template.json"
# CloudFormation refuses a template over 1 MB even from S3: a larger one could never deploy.
MAX_TEMPLATE_BYTES = 1 << 20
MAX_INDEX_BYTES = 64 << 10
MAX_STACKS = 30
MAX_TOTAL_BYTES = 16 << 20  # inflated, all members together
MAX_ZIP_BYTES = 16 << 20  # the file as downloaded
# CloudFormation's stack-name rule; it also makes a safe file name (no separator, no dot-dot).
STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
# A stage's stack as the CDK names it: <Stage>/<Stack> (the stage is the first part: `cdk deploy 'Dev/*'`).
DISPLAY_NAME = re.compile(r"^(?P<stage>[A-Za-z][A-Za-z0-9]{0,63})/[A-Za-z][A-Za-z0-9-]{0,63}$")
MANIFEST_SUFFIX = ".bundle.json"
MANIFEST_MEMBER = re.compile(rf"^(?P<digest>[0-9a-f]{{64}}){re.escape(MANIFEST_SUFFIX)}$")
MAX_MANIFESTS = 16  # a stage pins one bundle; base and head of three stages, with room
MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a few hundred files at ~200 bytes each
MAX_MEMBERS = MAX_STACKS + 1 + MAX_MANIFESTS
MEMBER = re.compile(rf"^(?:{re.escape(INDEX)}|[A-Za-z][A-Za-z0-9-]{{0,127}}{re.escape(TEMPLATE_SUFFIX)}|"
                    rf"[0-9a-f]{{64}}{re.escape(MANIFEST_SUFFIX)})$")


class ArtifactError(ValueError):
    """The artifact is refused: ``what`` (a member or field), what is allowed, what was found."""

    def __init__(self, what: str, allowed: str, found: str):
        super().__init__(f"{what}: allowed: {allowed}; found: {found}")


@dataclass(frozen=True)
class HeadStack:
    display_name: str  # Dev/PEagle
    stack_name: str  # Dev-PEagle
    template: str  # the file name, <stack_name>.template.json

    @property
    def stage(self) -> str:
        return self.display_name.split("/", 1)[0]


# --------------------------------------------------------------------------------------------------
# The pull request's side
# --------------------------------------------------------------------------------------------------


def pack(assembly: Path, into: Path, *, manifests: Path | None = None) -> list[HeadStack]:
    """Each stack's template of ``assembly`` and the index, into the new folder ``into``; with the committed
    bundle manifests of ``manifests`` (a folder of ``<sha256>.json``) that the templates pin and whose bytes hash
    to their name."""
    import hashlib

    from ops import cdk

    into.mkdir(parents=True)
    stacks = []
    for artifact in cdk.list_stacks(assembly):
        stack = HeadStack(artifact.display_name, artifact.stack_name, f"{artifact.stack_name}{TEMPLATE_SUFFIX}")
        (into / stack.template).write_bytes(artifact.template_path.read_bytes())  # the bytes as synthesized
        stacks.append(stack)
    _write_index(into, stacks)
    _check_index(json.loads((into / INDEX).read_text()), present={s.template for s in stacks})  # what unpack asks
    # The manifests of the bundles these templates pin, no others: what the diff can ask for (at most one a stage).
    from review.bundle_change import model_pins

    pins = sorted({pin for s in stacks for pin in model_pins(json.loads((into / s.template).read_text())).values()})
    for pin in pins[:MAX_MANIFESTS] if manifests is not None else []:
        path = manifests / f"{pin}.json"
        data = path.read_bytes() if MANIFEST_MEMBER.match(f"{pin}{MANIFEST_SUFFIX}") and path.is_file() else b""
        if hashlib.sha256(data).hexdigest() == pin and len(data) <= MAX_MANIFEST_BYTES:
            (into / f"{pin}{MANIFEST_SUFFIX}").write_bytes(data)
    return stacks


def _write_index(folder: Path, stacks: list[HeadStack]) -> None:
    (folder / INDEX).write_text(json.dumps({"format": FORMAT, "stacks": [
        {"display_name": s.display_name, "stack_name": s.stack_name, "template": s.template} for s in stacks]},
        indent=1))


# --------------------------------------------------------------------------------------------------
# The judge's side
# --------------------------------------------------------------------------------------------------


def _refuse_constant(name: str):
    raise ArtifactError("JSON", "numbers, strings, true, false, null", f"the literal {name}")


def _no_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ArtifactError("JSON object", "each key once", f"{key[:60]!r} twice")
        seen[key] = value
    return seen


def _strict_json(name: str, data: bytes) -> object:
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant, object_pairs_hook=_no_repeated_keys)
    except ArtifactError as error:
        raise ArtifactError(f"member {name!r}", "strict JSON", str(error)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactError(f"member {name!r}", "UTF-8 JSON", f"not JSON ({str(error)[:120]})") from None
    except RecursionError:
        raise ArtifactError(f"member {name!r}", "JSON nested as deep as a template is", "deeper nesting") from None


def _check_member(info: zipfile.ZipInfo) -> None:
    name = info.filename
    mode = info.external_attr >> 16  # Unix mode when the zip was made on Unix; no type bits is a plain file
    if info.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "a folder" if info.is_dir() else f"file type {oct(mode)}"
        raise ArtifactError(f"member {name[:120]!r}", "a plain file", kind)
    if not MEMBER.match(name):
        kind = "a path" if ("/" in name or "\\" in name or ".." in name) else "another name"
        raise ArtifactError(f"member {name[:120]!r}", f"a file at the zip's root named {INDEX}, "
                            f"<stack name>{TEMPLATE_SUFFIX} or <sha256>{MANIFEST_SUFFIX}", kind)
    if info.flag_bits & 0x1:
        raise ArtifactError(f"member {name!r}", "an unencrypted file", "an encrypted one")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ArtifactError(f"member {name!r}", "stored or deflated", f"compression method {info.compress_type}")
    limit = _limit(name)
    if info.file_size > limit:
        raise ArtifactError(f"member {name!r}", f"at most {limit} bytes", f"{info.file_size} bytes")


def _limit(name: str) -> int:
    return MAX_INDEX_BYTES if name == INDEX else MAX_MANIFEST_BYTES if MANIFEST_MEMBER.match(name) else \
        MAX_TEMPLATE_BYTES


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    limit = _limit(info.filename)
    try:
        with zf.open(info) as member:
            data = member.read(limit + 1)  # never trust the declared size: inflate at most one byte past it
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError) as error:
        raise ArtifactError(f"member {info.filename!r}", "a readable member", str(error)[:160]) from None
    if len(data) > limit:
        raise ArtifactError(f"member {info.filename!r}", f"at most {limit} bytes inflated", "more")
    return data


def _check_template(name: str, template: object) -> None:
    if not isinstance(template, dict) or not isinstance(template.get("Resources"), dict):
        raise ArtifactError(f"member {name!r}", "a CloudFormation template (an object with a Resources object)",
                            type(template).__name__ if not isinstance(template, dict) else "no Resources object")
    for logical_id, resource in template["Resources"].items():
        if not isinstance(resource, dict) or not isinstance(resource.get("Type"), str):
            raise ArtifactError(f"member {name!r} resource {str(logical_id)[:60]!r}", "an object with a Type string",
                                type(resource).__name__)


def _check_index(index: object, *, present: set[str]) -> list[HeadStack]:
    if not isinstance(index, dict) or set(index) != {"format", "stacks"}:
        raise ArtifactError(INDEX, "an object with exactly format and stacks",
                            sorted(index)[:5] if isinstance(index, dict) else type(index).__name__)
    if index["format"] != FORMAT:
        raise ArtifactError(f"{INDEX} format", str(FORMAT), repr(index["format"])[:20])
    entries = index["stacks"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_STACKS:
        raise ArtifactError(f"{INDEX} stacks", f"a list of 1 to {MAX_STACKS} stacks",
                            f"{len(entries)} entries" if isinstance(entries, list) else type(entries).__name__)
    stacks: list[HeadStack] = []
    for i, entry in enumerate(entries):
        where = f"{INDEX} stacks[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"display_name", "stack_name", "template"}:
            raise ArtifactError(where, "an object with display_name, stack_name and template",
                                sorted(entry)[:5] if isinstance(entry, dict) else type(entry).__name__)
        if not isinstance(entry["display_name"], str) or not DISPLAY_NAME.match(entry["display_name"]):
            raise ArtifactError(f"{where}.display_name", "<Stage>/<Stack>, letters, digits and hyphens",
                                repr(entry["display_name"])[:80])
        if not isinstance(entry["stack_name"], str) or not STACK_NAME.match(entry["stack_name"]):
            raise ArtifactError(f"{where}.stack_name", "a CloudFormation stack name", repr(entry["stack_name"])[:80])
        expected = f"{entry['stack_name']}{TEMPLATE_SUFFIX}"
        if entry["template"] != expected:
            raise ArtifactError(f"{where}.template", repr(expected), repr(entry["template"])[:80])
        stacks.append(HeadStack(entry["display_name"], entry["stack_name"], expected))
    for field in ("display_name", "stack_name"):
        names = [getattr(s, field).lower() for s in stacks]
        if len(set(names)) != len(names):
            raise ArtifactError(f"{INDEX} stacks", f"each {field} once", f"a repeated {field}")
    listed = {s.template for s in stacks}
    if listed != present:
        raise ArtifactError(INDEX, "every template member listed once, and only those",
                            f"unlisted {sorted(present - listed)[:3]}, missing {sorted(listed - present)[:3]}")
    return stacks


def _zip_in(download: Path) -> Path:
    """The one file download-artifact kept (``skip-decompress: true``): a zip, whatever GitHub named it."""
    if not download.is_dir() or download.is_symlink():
        raise ArtifactError("the download folder", "a folder", str(download))
    entries = list(download.iterdir())
    if len(entries) != 1 or entries[0].is_symlink() or not entries[0].is_file():
        raise ArtifactError("the download folder", "exactly one plain file (the artifact's zip)",
                            ", ".join(sorted(e.name for e in entries)[:5]) or "nothing")
    size = entries[0].stat().st_size
    if size > MAX_ZIP_BYTES:
        raise ArtifactError(entries[0].name, f"at most {MAX_ZIP_BYTES} bytes", f"{size} bytes")
    return entries[0]


def _check_manifests(contents: dict[str, bytes]) -> dict[str, bytes]:
    """The manifest members, out of ``contents``: each must hash to the digest in its name."""
    import hashlib

    found = {name: contents.pop(name) for name in [n for n in contents if MANIFEST_MEMBER.match(n)]}
    if len(found) > MAX_MANIFESTS:
        raise ArtifactError("manifests", f"at most {MAX_MANIFESTS} {MANIFEST_SUFFIX} members", f"{len(found)}")
    for name, data in found.items():
        if hashlib.sha256(data).hexdigest() != MANIFEST_MEMBER.match(name)["digest"]:
            raise ArtifactError(f"member {name[:24]}...{MANIFEST_SUFFIX}", "bytes whose SHA-256 is the name's digest",
                                f"sha256 {hashlib.sha256(data).hexdigest()[:12]}...")
    return found


def read_zip(path: Path) -> tuple[list[HeadStack], dict[str, bytes]]:
    """The checked index and template bytes of the zip at ``path``, the bundle manifests among them under their
    member names (ArtifactError when anything is off)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise ArtifactError(path.name, "a zip file", str(error)[:120]) from None
    with zf:
        infos = zf.infolist()
        if not 2 <= len(infos) <= MAX_MEMBERS:
            raise ArtifactError(path.name, f"2 to {MAX_MEMBERS} members", f"{len(infos)} members")
        seen: set[str] = set()
        for info in infos:
            _check_member(info)
            if info.filename.lower() in seen:
                raise ArtifactError(f"member {info.filename!r}", "each name once (case aside)", "a repeated name")
            seen.add(info.filename.lower())
        if INDEX not in seen:
            raise ArtifactError(path.name, f"a member {INDEX}", "none")
        total, contents = 0, {}
        for info in infos:
            data = _read(zf, info)
            total += len(data)
            if total > MAX_TOTAL_BYTES:
                raise ArtifactError(path.name, f"at most {MAX_TOTAL_BYTES} bytes inflated in all", "more")
            contents[info.filename] = data
    index = _strict_json(INDEX, contents.pop(INDEX))
    manifests = _check_manifests(contents)
    stacks = _check_index(index, present=set(contents))
    for name, data in contents.items():
        _check_template(name, _strict_json(name, data))
    return stacks, {**contents, **manifests}


def unpack(download: Path, into: Path) -> list[HeadStack]:
    """Check the artifact's zip in ``download`` and write its templates and a fresh index into ``into`` (new)."""
    stacks, contents = read_zip(_zip_in(download))
    into.mkdir(parents=True)
    for stack in stacks:
        (into / stack.template).write_bytes(contents[stack.template])
    for name in contents:
        if MANIFEST_MEMBER.match(name):
            (into / name).write_bytes(contents[name])
    _write_index(into, stacks)
    return stacks


def manifests_in(folder: Path):  # noqa: ANN201 - review.bundle_change.Manifests
    """The bundle manifests a folder ``unpack`` wrote, by pin (None for a pin it does not hold)."""

    def read(pin: str) -> bytes | None:
        path = folder / f"{pin}{MANIFEST_SUFFIX}"
        return path.read_bytes() if MANIFEST_MEMBER.match(path.name) and path.is_file() else None

    return read


def load(folder: Path) -> list[HeadStack]:
    """The stacks of a folder ``unpack`` (or ``pack``) wrote."""
    present = {p.name for p in folder.iterdir() if p.name != INDEX and not MANIFEST_MEMBER.match(p.name)}
    return _check_index(json.loads((folder / INDEX).read_text()), present=present)


def write_assembly(folder: Path, out: Path, *, version: str) -> Path:
    """A cloud assembly of the templates in ``folder`` that the CDK CLI reads (``cdk diff --app out``): one
    nested assembly per stage, as a synth writes it, holding nothing but stack artifacts. ``version`` is the
    manifest schema version of the base's own synth (trusted: the judge's toolchain)."""
    stacks = load(folder)
    stages: dict[str, list[HeadStack]] = {}
    for stack in stacks:
        stages.setdefault(stack.stage, []).append(stack)
    root: dict = {"version": version, "artifacts": {}}
    for stage, members in stages.items():
        directory = f"assembly-{stage}"
        root["artifacts"][directory] = {"type": "cdk:cloud-assembly",
                                        "properties": {"directoryName": directory, "displayName": stage}}
        (out / directory).mkdir(parents=True)
        artifacts = {}
        for stack in members:
            (out / directory / stack.template).write_bytes((folder / stack.template).read_bytes())
            artifacts[stack.stack_name] = {
                "type": "aws:cloudformation:stack", "environment": "aws://unknown-account/unknown-region",
                "displayName": stack.display_name,
                "properties": {"templateFile": stack.template, "stackName": stack.stack_name}}
        (out / directory / "manifest.json").write_text(json.dumps({"version": version, "artifacts": artifacts}))
    (out / "manifest.json").write_text(json.dumps(root))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m review.head_artifact", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    packing = sub.add_parser("pack", help="the pull request's templates, for upload")
    packing.add_argument("--assembly", type=Path, required=True)
    packing.add_argument("--into", type=Path, required=True)
    packing.add_argument("--manifests", type=Path, default=Path("stacks") / "bundles",
                         help="the committed bundle manifests (default: stacks/bundles)")
    unpacking = sub.add_parser("unpack", help="check a downloaded artifact's zip and write its templates")
    unpacking.add_argument("--download", type=Path, required=True, help="the folder download-artifact wrote")
    unpacking.add_argument("--into", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "pack":
        stacks = pack(args.assembly, args.into, manifests=args.manifests)
        print(f"packed {len(stacks)} template(s) into {args.into}")
        return 0
    try:
        stacks = unpack(args.download, args.into)
    except ArtifactError as error:
        print(f"::error::the pull request's artifact is refused: {error}")
        return 1
    print(f"accepted {len(stacks)} template(s): {', '.join(s.display_name for s in stacks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
