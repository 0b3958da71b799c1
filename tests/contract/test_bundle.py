"""peagle_contract.bundle.verify_bundle, the check the container runs on /opt/ml/model (and the operator command
on S3): each attack on a pinned bundle refused with the file named, what was expected and what was found."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from peagle_contract import bundle as bundle_module
from peagle_contract.bundle import (
    MANIFEST_NAME, BundleError, bundle_uri, describe, digest, hash_files, parse_manifest, render, verify_bundle,
)

FILES = {"target/config.json": b'{"architectures": ["LlamaForCausalLM"]}',
         "target/model.safetensors": os.urandom(300_000),
         "target/sub/tokenizer.json": b"{}",
         "drafter/config.json": b'{"architectures": ["Eagle3LlamaForCausalLM"]}',
         "drafter/model.safetensors": os.urandom(100_000)}


def _bundle(root: Path, files: dict[str, bytes] = FILES) -> str:
    """A bundle as SageMaker copies it, with the manifest the stager would write; returns the pin."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    manifest = render(describe({rel: root / rel for rel in files}), {"target": {"source": "test", "revision": None}})
    (root / MANIFEST_NAME).write_bytes(manifest)
    return digest(manifest)


@pytest.fixture
def bundle(tmp_path) -> tuple[Path, str]:
    root = tmp_path / "opt-ml-model"
    return root, _bundle(root)


def _refused(root: Path, pin: str) -> BundleError:
    with pytest.raises(BundleError) as err:
        verify_bundle(root, pin)
    return err.value


def test_the_pinned_bundle_verifies_and_says_what_it_hashed(bundle):
    root, pin = bundle
    verified = verify_bundle(root, pin, threads=2)
    assert (verified.files, verified.bytes, verified.threads) == (5, sum(map(len, FILES.values())), 2)
    assert verified.seconds > 0 and " MB/s, 2 threads" in verified.summary()
    assert [f.path for f in parse_manifest((root / MANIFEST_NAME).read_bytes())] == sorted(FILES)


def test_a_changed_byte_is_refused_naming_the_file_and_both_digests(bundle):
    root, pin = bundle
    weights = root / "target/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[1234] ^= 1  # same size: only the hash can tell
    weights.write_bytes(bytes(data))
    err = _refused(root, pin)
    assert err.problems == (f"target/model.safetensors: sha256 expected {_sha(FILES['target/model.safetensors'])[:12]}"
                            f"..., found {_sha(bytes(data))[:12]}...",)
    assert str(err).startswith(f"PEAGLE_BUNDLE_MANIFEST_SHA256: pins manifest {pin[:12]}..., but {root} does not "
                               "match it (1 problem): target/model.safetensors: sha256 expected")


def test_a_missing_file_and_a_resized_one_are_refused_with_the_expected_size(bundle):
    root, pin = bundle
    (root / "drafter/config.json").unlink()
    (root / "target/sub/tokenizer.json").write_bytes(b"{ }")
    err = _refused(root, pin)
    assert sorted(err.problems) == [
        f"drafter/config.json: missing; expected {len(FILES['drafter/config.json'])} bytes, sha256 "
        f"{_sha(FILES['drafter/config.json'])[:12]}...",
        "target/sub/tokenizer.json: expected 2 bytes, found 3"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("extra", ["notes.txt", "target/extra.bin", "drafter/deep/er/x.json"])
def test_an_unlisted_file_anywhere_is_refused(bundle, extra):
    root, pin = bundle
    (root / extra).parent.mkdir(parents=True, exist_ok=True)
    (root / extra).write_bytes(b"12345")
    problems = _refused(root, pin).problems
    assert problems[-1].startswith(f"{extra}: "), problems
    assert ("at the bundle root" if "/" not in extra else "not in the manifest; found a file of 5 bytes") in problems[-1]


def test_an_unlisted_folder_at_the_root_or_inside_is_refused(bundle):
    root, pin = bundle
    (root / "code").mkdir()
    (root / "target/empty").mkdir()
    assert sorted(_refused(root, pin).problems) == [
        "code: a folder at the bundle root; allowed there: manifest.json (a file), target/ and drafter/ (folders)",
        "target/empty/: a folder the manifest does not list"]


@pytest.mark.parametrize("where", ["model.py", "target/model.py", "drafter/sub/model.py"])
def test_a_model_py_anywhere_is_refused_as_code(bundle, where):
    """SageMaker's loader imports <model path>/model.py: a bundle never carries one, wherever it is."""
    root, pin = bundle
    (root / where).parent.mkdir(parents=True, exist_ok=True)
    (root / where).write_text("import os; os.system('curl evil')\n")
    problems = _refused(root, pin).problems
    assert any(p.startswith(f"{where}: a file named model.py") and "loader imports model.py" in p for p in problems)


def test_the_stager_cannot_list_a_model_py_either(tmp_path):
    with pytest.raises(BundleError, match="^target/model.py: named model.py"):
        describe({"target/model.py": _write(tmp_path / "m.py", b"")})
    with pytest.raises(BundleError, match=r"^\.\./etc/passwd: allowed: a file below target/ or drafter/"):
        describe({"../etc/passwd": _write(tmp_path / "p", b"")})


def test_a_symbolic_link_is_never_followed_out_of_the_bundle(bundle, tmp_path):
    """The link points at a file with exactly the listed bytes: following it would pass, so only 'not followed'
    refuses it. A linked folder (a root folder pointing elsewhere) is refused the same way."""
    root, pin = bundle
    outside = _write(tmp_path / "outside.json", FILES["target/config.json"])
    (root / "target/config.json").unlink()
    (root / "target/config.json").symlink_to(outside)
    (root / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    assert sorted(_refused(root, pin).problems) == [
        "elsewhere: a symbolic link at the bundle root; allowed there: manifest.json (a file), target/ and drafter/ "
        "(folders)",
        "target/config.json: a symbolic link (not followed); allowed: regular files and folders"]


def test_a_linked_model_folder_is_not_walked(bundle, tmp_path):
    root, pin = bundle
    real = tmp_path / "real-drafter"
    (root / "drafter").rename(real)
    (root / "drafter").symlink_to(real, target_is_directory=True)
    problems = _refused(root, pin).problems
    assert problems[0].startswith("drafter: a symbolic link at the bundle root")
    assert "drafter/config.json: missing" in problems[1]  # listed but not reachable without following the link


def test_a_special_file_is_refused_without_opening_it(bundle):
    root, pin = bundle
    os.mkfifo(root / "target/pipe")  # opening a FIFO for reading would block until a writer comes
    problems = _refused(root, pin).problems
    assert problems == ("target/pipe: a special file (not followed); allowed: regular files and folders",)


def test_a_manifest_that_is_not_the_pin_and_an_incomplete_bundle(bundle):
    root, pin = bundle
    other = "0" * 64
    err = _refused(root, other)
    assert f"pins manifest {other[:12]}..., but {root} has {pin[:12]}..." in str(err)
    (root / MANIFEST_NAME).unlink()
    err = _refused(root, pin)
    assert "incomplete bundle" in str(err) and err.problems[0].startswith("manifest.json: missing")


@pytest.mark.parametrize("pin", ["ABC", "a" * 63, "g" * 64, "A" * 64, None, 64])
def test_a_pin_that_is_not_64_lowercase_hex_is_refused_naming_where_it_came_from(bundle, pin):
    root, _ = bundle
    with pytest.raises(BundleError, match="^PEAGLE_BUNDLE_MANIFEST_SHA256: got .*; allowed: a SHA-256 digest, 64 "
                                          "lowercase hex"):
        verify_bundle(root, pin)


def test_every_problem_is_named_and_hostile_names_are_escaped(bundle):
    root, pin = bundle
    (root / "target/model.safetensors").write_bytes(b"x")
    (root / "drafter/evil\nname").write_bytes(b"")
    err = _refused(root, pin)
    assert "drafter/evil\\nname: not in the manifest; found a file of 0 bytes" in err.problems
    assert "target/model.safetensors: expected 300000 bytes, found 1" in err.problems
    assert "\n" not in str(err)


def test_files_are_hashed_in_parallel(tmp_path):
    """hashlib releases the GIL: two threads hash at the same time (both inside a read at once)."""
    inside, both = [0], threading.Event()
    lock = threading.Lock()

    class Slow:
        def __init__(self, data: bytes) -> None:
            self.data, self.done = data, False

        def read(self, n: int) -> bytes:
            if self.done:
                return b""
            with lock:
                inside[0] += 1
                if inside[0] == 2:
                    both.set()
            both.wait(timeout=5)
            self.done = True
            return self.data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    order = []

    def open_file(name: str):
        order.append(name)
        return Slow(name.encode())

    result = hash_files(["big", "small"], open_file, threads=2)
    assert both.is_set() and sorted(order) == ["big", "small"]
    assert result == {n: hashlib.sha256(n.encode()).hexdigest() for n in ("big", "small")}


def test_a_bundle_lives_under_its_own_digest():
    assert bundle_uri("s3://b-1/bundles/x", "ab" * 32) == f"s3://b-1/bundles/x/{'ab' * 32}/"
    assert bundle_uri("s3://b-1/bundles/x/", "ab" * 32) == f"s3://b-1/bundles/x/{'ab' * 32}/"
    with pytest.raises(BundleError, match="manifest digest"):
        bundle_uri("s3://b-1/bundles/x/", "latest")


def test_the_largest_files_are_started_first(bundle):
    """One file is one thread's work (SHA-256 is serial): starting the largest first ends the pool soonest."""
    root, pin = bundle
    opened = []
    real = bundle_module._open_inside(root)

    def recording(rel: str):
        opened.append(rel)
        return real(rel)

    found = bundle_module.scan_folder(root)
    bundle_module.verify_listing((root / MANIFEST_NAME).read_bytes(), pin, found, recording, bundle=str(root), threads=1)
    sizes = [len(FILES[rel]) for rel in opened]
    assert sorted(opened) == sorted(FILES) and sizes == sorted(sizes, reverse=True)


def test_a_pinned_manifest_cannot_lead_outside_the_bundle(tmp_path):
    """Even a manifest whose digest is pinned lists only clean paths inside target/ and drafter/."""
    import json

    root = tmp_path / "opt-ml-model"
    root.mkdir()
    manifest = json.dumps({"version": 1, "files": [{"path": "target/../../etc/passwd", "size": 1,
                                                     "sha256": "0" * 64}]}).encode()
    (root / MANIFEST_NAME).write_bytes(manifest)
    with pytest.raises(BundleError, match=r"manifest.json: files\[0\]: target/../../etc/passwd: allowed: a file below"):
        verify_bundle(root, digest(manifest))
