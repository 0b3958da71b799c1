"""The pull request's templates as the judge receives them: a zip whose every byte the pull request chose.

A good artifact (packed from an assembly, zipped as upload-artifact zips a folder) is accepted byte for byte;
each hostile one - a path that climbs out, an absolute path, a folder, a symbolic link, an encrypted or
oddly compressed member, a member bigger than allowed (declared, or hidden behind a header that lies),
too many members, a name repeated in another case, something that is not JSON or not a template, an index
that leaves a template out or names another - is refused with a message naming the member, what is
allowed and what was found, and nothing is written anywhere (inside or outside the target folder).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from pathlib import Path

import pytest

from review import head_artifact
from review.head_artifact import ArtifactError

TEMPLATE = {"Resources": {"Endpoint": {"Type": "AWS::SageMaker::Endpoint", "Properties": {"EndpointName": "e"}}}}


def _assembly(root: Path) -> Path:
    """A cloud assembly shaped as the app's synth writes it: a nested assembly per stage."""
    root.mkdir()
    artifacts = {}
    for stage in ("Dev", "Prod"):
        directory = root / f"assembly-{stage}"
        directory.mkdir()
        (directory / f"{stage}PEagle1234.template.json").write_text(json.dumps(TEMPLATE, indent=1))
        (directory / f"{stage}PEagle1234.assets.json").write_text("{}")
        (directory / "manifest.json").write_text(json.dumps({"version": "55.0.0", "artifacts": {
            f"{stage}PEagle1234": {"type": "aws:cloudformation:stack", "environment": "aws://111111111111/us-east-1",
                                   "displayName": f"{stage}/PEagle", "properties": {
                                       "templateFile": f"{stage}PEagle1234.template.json", "stackName": f"{stage}-PEagle"}}}}))
        artifacts[f"assembly-{stage}"] = {"type": "cdk:cloud-assembly",
                                          "properties": {"directoryName": f"assembly-{stage}", "displayName": stage}}
    (root / "manifest.json").write_text(json.dumps({"version": "55.0.0", "artifacts": artifacts}))
    (root / "asset.abc").mkdir()
    (root / "asset.abc" / "Dockerfile").write_text("FROM scratch\n")
    return root


def _zip_folder(folder: Path, download: Path) -> Path:
    """The artifact as GitHub keeps it: the folder's files at the zip's root."""
    download.mkdir()
    target = download / "stack-templates.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.iterdir()):
            zf.write(path, path.name)
    return target


def _good_members(tmp_path: Path) -> dict[str, bytes]:
    packed = tmp_path / "packed"
    head_artifact.pack(_assembly(tmp_path / "cdk.out"), packed)
    return {p.name: p.read_bytes() for p in packed.iterdir()}


def _hostile(tmp_path: Path, members: dict[str, bytes] | list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    download = tmp_path / "download"
    download.mkdir()
    items = list(members.items()) if isinstance(members, dict) else members
    with zipfile.ZipFile(download / "stack-templates.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in items:
            zf.writestr(name, data)
    return download


def _patch(zipped: Path, name: str, *, central: int, local: int, value: int, size: str) -> None:
    """Overwrite a field of ``name``'s central-directory entry and local header (offsets from each record's
    start), as a hand-made zip can have it: zipfile always writes honest ones."""
    data, encoded = bytearray(zipped.read_bytes()), name.encode()
    for signature, offset, name_at in ((b"PK\x01\x02", central, 46), (b"PK\x03\x04", local, 30)):
        at = 0
        while (at := data.find(signature, at)) != -1:
            if data[at + name_at:at + name_at + len(encoded)] == encoded:
                struct.pack_into(size, data, at + offset, value)
            at += 4
    zipped.write_bytes(bytes(data))


def _refused(tmp_path: Path, download: Path, *fragments: str) -> str:
    into = tmp_path / "out" / "head-templates"
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(ArtifactError) as caught:
        head_artifact.unpack(download, into)
    message = str(caught.value)
    assert "allowed:" in message and "found:" in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, anywhere
    return message


def test_a_packed_assembly_travels_byte_for_byte(tmp_path):
    assembly = _assembly(tmp_path / "cdk.out")
    packed = tmp_path / "packed"
    stacks = head_artifact.pack(assembly, packed)
    assert sorted(p.name for p in packed.iterdir()) == ["Dev-PEagle.template.json", "Prod-PEagle.template.json",
                                                        "index.json"]  # no asset, no CDK manifest
    download = tmp_path / "download"
    _zip_folder(packed, download)
    into = tmp_path / "head"
    assert head_artifact.unpack(download, into) == stacks
    for stage in ("Dev", "Prod"):
        original = (assembly / f"assembly-{stage}" / f"{stage}PEagle1234.template.json").read_bytes()
        assert (into / f"{stage}-PEagle.template.json").read_bytes() == original
    # The CLI's assembly is written from the checked templates only, with the version the caller trusts.
    from ops import cdk

    out = head_artifact.write_assembly(into, tmp_path / "cli", version="55.0.0")
    listed = {s.display_name: s for s in cdk.list_stacks(out)}
    assert sorted(listed) == ["Dev/PEagle", "Prod/PEagle"]
    assert listed["Prod/PEagle"].stage == "Prod" and listed["Prod/PEagle"].stack_name == "Prod-PEagle"
    assert listed["Dev/PEagle"].template_sha256() == hashlib.sha256(
        (assembly / "assembly-Dev" / "DevPEagle1234.template.json").read_bytes()).hexdigest()


# ABSOLUTE: a member named by an absolute path, made at run time from the test's own folder (so the test can
# also look there for what an extraction would have written).
ABSOLUTE = "<absolute>"


@pytest.mark.parametrize("name", ["../Dev-PEagle.template.json", ABSOLUTE,
                                  "sub/Dev-PEagle.template.json", "..\\Dev-PEagle.template.json",
                                  "../../../../escaped.template.json"])
def test_a_member_with_a_path_is_refused(tmp_path, name):
    members = _good_members(tmp_path)
    if name == ABSOLUTE:
        name = str(tmp_path / "outside" / "Dev-PEagle.template.json")
    members[name] = members.pop("Dev-PEagle.template.json")
    message = _refused(tmp_path, _hostile(tmp_path, members), "a path", "a file at the zip's root")
    # Nothing escaped: not beside or above the test's folder (wherever a traversal would land), not at the
    # absolute name.
    assert not any((folder / "escaped.template.json").exists() for folder in tmp_path.parents)
    assert not (tmp_path / "outside").exists()
    assert repr(name)[1:40] in message


def test_a_symbolic_link_or_a_folder_is_refused(tmp_path):
    members = _good_members(tmp_path)
    link = zipfile.ZipInfo("Dev-PEagle.template.json")
    link.external_attr = (0o120777 << 16)  # a symbolic link, as `zip -y` stores one: the data is its target
    # Its target leaves the folder the zip is read into (a link would let the judge read another file).
    target = str(tmp_path / "outside" / "secret").encode()
    items = [(link, target)] + [(n, d) for n, d in members.items() if n != "Dev-PEagle.template.json"]
    _refused(tmp_path, _hostile(tmp_path, items), "a plain file", "a symbolic link")
    folder = tmp_path / "second"
    folder.mkdir()
    _refused(folder, _hostile(folder, [("Dev-PEagle.template.json/", b"")] + list(members.items())), "a folder")


def test_an_encrypted_or_oddly_compressed_member_is_refused(tmp_path):
    download = _hostile(tmp_path, _good_members(tmp_path))
    # The general-purpose flags' bit 0: "encrypted" (the flags sit at offset 8 centrally, 6 locally).
    _patch(download / "stack-templates.zip", "Dev-PEagle.template.json", central=8, local=6, value=0x1, size="<H")
    _refused(tmp_path, download, "unencrypted")
    folder = tmp_path / "bz"
    folder.mkdir()
    members = _good_members(folder)
    download = folder / "download"
    download.mkdir()
    with zipfile.ZipFile(download / "a.zip", "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data, compress_type=zipfile.ZIP_BZIP2 if name == "index.json" else zipfile.ZIP_DEFLATED)
    _refused(folder, download, "stored or deflated", "compression method 12")


def test_an_oversized_member_is_refused_as_declared_and_as_inflated(tmp_path):
    members = _good_members(tmp_path)
    big = json.dumps({"Resources": {}, "Padding": "x" * (head_artifact.MAX_TEMPLATE_BYTES + 10)}).encode()
    members["Dev-PEagle.template.json"] = big  # deflates to a few kilobytes: a small zip, a big file
    download = _hostile(tmp_path, members)
    assert (download / "stack-templates.zip").stat().st_size < 100_000
    _refused(tmp_path, download, f"at most {head_artifact.MAX_TEMPLATE_BYTES} bytes",
             f"{len(big)} bytes")
    # The same bomb behind a central directory that claims 100 bytes: inflating stops one byte past the limit
    # would do, but the header's size is what zipfile stops at - and then the CRC does not match.
    liar = tmp_path / "liar"
    liar.mkdir()
    zipped = _hostile(liar, members) / "stack-templates.zip"
    _patch(zipped, "Dev-PEagle.template.json", central=24, local=22, value=100, size="<I")  # uncompressed size
    _refused(liar, zipped.parent, "a readable member")


def test_too_many_members_or_a_name_repeated_in_another_case_is_refused(tmp_path):
    members = _good_members(tmp_path)
    for i in range(head_artifact.MAX_MEMBERS):
        members[f"Extra{i}.template.json"] = json.dumps(TEMPLATE).encode()
    _refused(tmp_path, _hostile(tmp_path, members), f"2 to {head_artifact.MAX_MEMBERS} members")
    again = tmp_path / "case"
    again.mkdir()
    members = _good_members(again)
    members["dev-peagle.template.json"] = members["Dev-PEagle.template.json"]
    _refused(again, _hostile(again, members), "each name once", "'dev-peagle.template.json'")


@pytest.mark.parametrize("content, fragment", [
    (b"import os\nos.system('curl attacker')\n", "not JSON"),
    (b"\xff\xfe{}", "UTF-8 JSON"),
    (b'{"Resources": {}, "Limit": NaN}', "the literal NaN"),
    (b'{"Resources": {"A": {"Type": "AWS::SNS::Topic"}, "A": {"Type": "AWS::IAM::Role"}}}', "'A' twice"),
    (b'[{"Resources": {}}]', "list"),
    (b'{"Resources": {"A": "AWS::IAM::Role"}}', "an object with a Type string"),
    (b"[" * 200_000 + b"]" * 200_000, "deeper nesting"),
])
def test_a_member_that_is_not_a_template_is_refused(tmp_path, content, fragment):
    members = _good_members(tmp_path)
    members["Dev-PEagle.template.json"] = content
    _refused(tmp_path, _hostile(tmp_path, members), "'Dev-PEagle.template.json'", fragment)


def _index(members: dict[str, bytes]) -> dict:
    return json.loads(members["index.json"])


@pytest.mark.parametrize("change, fragment", [
    (lambda m, i: m.update({"Other-Stack.template.json": json.dumps(TEMPLATE).encode()}), "unlisted ['Other-Stack"),
    (lambda m, i: m.pop("Prod-PEagle.template.json"), "missing ['Prod-PEagle"),
    (lambda m, i: i["stacks"][0].update(template="Prod-PEagle.template.json"), "'Dev-PEagle.template.json'"),
    (lambda m, i: i["stacks"][0].update(display_name="Dev/../PEagle"), "display_name"),
    (lambda m, i: i["stacks"][1].update(display_name="Dev/PEagle"), "each display_name once"),
    (lambda m, i: i["stacks"][0].update(stack_name="../Dev"), "stack_name"),
    (lambda m, i: i.update(format=2), "format"),
    (lambda m, i: i.update(extra=True), "exactly format and stacks"),
])
def test_an_index_that_does_not_match_the_templates_is_refused(tmp_path, change, fragment):
    members = _good_members(tmp_path)
    index = _index(members)
    change(members, index)
    members["index.json"] = json.dumps(index).encode()
    _refused(tmp_path, _hostile(tmp_path, members), fragment)


def test_the_download_folder_must_hold_exactly_one_zip(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ArtifactError, match="exactly one plain file"):
        head_artifact.unpack(empty, tmp_path / "a")
    download = _hostile(tmp_path, _good_members(tmp_path))
    (download / "second.zip").write_bytes(b"")
    with pytest.raises(ArtifactError, match="exactly one plain file"):
        head_artifact.unpack(download, tmp_path / "b")
    (download / "second.zip").unlink()
    (download / "stack-templates.zip").rename(tmp_path / "real.zip")
    (download / "link.zip").symlink_to(tmp_path / "real.zip")
    with pytest.raises(ArtifactError, match="exactly one plain file"):
        head_artifact.unpack(download, tmp_path / "c")
    (download / "link.zip").unlink()
    (download / "not-a.zip").write_text("print('hello')")
    with pytest.raises(ArtifactError, match="a zip file"):
        head_artifact.unpack(download, tmp_path / "d")


def test_the_command_line_says_why_it_refuses(tmp_path, capsys):
    members = _good_members(tmp_path)
    members["../escape.template.json"] = members.pop("Dev-PEagle.template.json")
    download = _hostile(tmp_path, members)
    assert head_artifact.main(["unpack", "--download", str(download), "--into", str(tmp_path / "h")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("::error::the pull request's artifact is refused: member '../escape.template.json'")


def _manifests(tmp_path: Path) -> tuple[Path, bytes, str]:
    from peagle_contract.bundle import BundleFile, render

    folder = tmp_path / "repo-bundles"
    folder.mkdir()
    manifest = render([BundleFile("drafter/model.safetensors", 3, "ab" * 32)], {"drafter": {"source": "x"}})
    digest = hashlib.sha256(manifest).hexdigest()
    (folder / f"{digest}.json").write_bytes(manifest)
    (folder / f"{'0' * 64}.json").write_bytes(b"edited: hashes to another digest")  # never packed
    (folder / f"{'d' * 64}.json").write_bytes(b"pinned, but edited: never packed")
    (folder / "notes.json").write_text("{}")
    return folder, manifest, digest


def test_the_committed_manifests_travel_and_are_read_by_pin(tmp_path):
    folder, manifest, digest = _manifests(tmp_path)
    packed = tmp_path / "packed"
    assembly = _assembly(tmp_path / "cdk.out")
    # Dev's model pins the bundle (and Prod one with no committed manifest): only what a template pins travels.
    from peagle_contract.bundle import MANIFEST_DIGEST_VAR

    for stage, pin in (("Dev", digest), ("Prod", "d" * 64)):
        path = assembly / f"assembly-{stage}" / f"{stage}PEagle1234.template.json"
        template = json.loads(path.read_text())
        template["Resources"]["Model"] = {"Type": "AWS::SageMaker::Model", "Properties": {
            "PrimaryContainer": {"Environment": {MANIFEST_DIGEST_VAR: pin}}}}
        path.write_text(json.dumps(template, indent=1))
    head_artifact.pack(assembly, packed, manifests=folder)
    assert sorted(p.name for p in packed.iterdir()) == [
        f"{digest}.bundle.json", "Dev-PEagle.template.json", "Prod-PEagle.template.json", "index.json"]
    download = tmp_path / "download"
    _zip_folder(packed, download)
    into = tmp_path / "head"
    stacks = head_artifact.unpack(download, into)
    assert [s.display_name for s in head_artifact.load(into)] == [s.display_name for s in stacks]
    read = head_artifact.manifests_in(into)
    assert read(digest) == manifest and read("0" * 64) is None and read("../../index") is None


def test_a_manifest_member_that_does_not_hash_to_its_name_is_refused(tmp_path):
    # The pull request's job can upload any zip: a manifest under a pin's name must be that pin's manifest.
    members = _good_members(tmp_path)
    members[f"{'c' * 64}.bundle.json"] = b'{"files": [], "version": 1}'
    _refused(tmp_path, _hostile(tmp_path, members), "bytes whose SHA-256 is the name's digest")
    big = tmp_path / "big"
    big.mkdir()
    members = _good_members(big)
    data = b" " * (head_artifact.MAX_MANIFEST_BYTES + 1)
    members[f"{hashlib.sha256(data).hexdigest()}.bundle.json"] = data
    _refused(big, _hostile(big, members), f"at most {head_artifact.MAX_MANIFEST_BYTES} bytes")
