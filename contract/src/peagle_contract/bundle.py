"""The weights bundle: its manifest, where it lives, and the one check of a bundle against its pin.

A bundle is ``manifest.json`` beside ``target/`` and ``drafter/`` (SageMaker copies it to /opt/ml/model). The
manifest lists every file's path, size and SHA-256 and where the models came from; its own SHA-256
(:func:`digest`) names the bundle's content, and the stager writes the bundle under that name
(:func:`bundle_uri`), manifest last and never over an existing one. An environment pins the digest: the
constructs render it as :data:`MANIFEST_DIGEST_VAR` (a weights change is a model change in a stack diff).

:func:`verify_listing` is the check, wherever the bundle is: the container runs it on its folder
(:func:`verify_bundle`), the operator command on an S3 listing. The manifest must have the pinned digest, every
file it lists must be there with its size and SHA-256, and nothing else may be: no unlisted file or folder, no
symbolic link or special file (the names are whoever wrote the prefix: nothing is followed), nothing at the root
but the manifest and the two model folders, and no ``model.py`` anywhere. Files are hashed by a thread pool
(hashlib releases the GIL while it hashes, so threads use every core). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Mapping, Sequence

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
MANIFEST_DIGEST_VAR = "PEAGLE_BUNDLE_MANIFEST_SHA256"
TARGET_DIR, DRAFTER_DIR = "target", "drafter"
MODEL_DIRS = (TARGET_DIR, DRAFTER_DIR)
# SageMaker's loader (model_hosting_container_standards) imports <SAGEMAKER_MODEL_PATH>/model.py at start, and
# SageMaker's default model path is the bundle root. The image points the loader elsewhere; a bundle holding the
# name anywhere is refused too, so no folder of it can become a loader's path later. No checkpoint needs one.
FORBIDDEN_NAME = "model.py"
# A manifest lists a few hundred files (~200 bytes each); more than this is not one of ours.
MANIFEST_MAX_BYTES = 16 << 20
HASH_BLOCK = 4 << 20
MAX_THREADS = 32
_SHOWN_PROBLEMS = 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

# What a walk of a bundle found at one path.
FILE, FOLDER, LINK, SPECIAL = "file", "folder", "symbolic link", "special file"


class BundleError(ValueError):
    """A bundle or a pin is not what it must be. ``problems``: one line per bad file (file, expected, found)."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


@dataclass(frozen=True)
class BundleFile:
    path: str  # relative to the bundle, e.g. "target/config.json"
    size: int
    sha256: str


@dataclass(frozen=True)
class Entry:
    """One thing found in a bundle: its path relative to the root ("/"-separated, as found), kind and size."""

    path: str
    kind: str
    size: int = 0


@dataclass(frozen=True)
class Verified:
    """What a verification covered and how long it took."""

    files: int
    bytes: int
    seconds: float
    threads: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        return (f"{self.files} files, {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s "
                f"({self.mb_per_s:.0f} MB/s, {self.threads} threads)")


def check_digest(value: object, where: str) -> str:
    if not isinstance(value, str) or not _SHA256.match(value):
        shown = value[:70] if isinstance(value, str) else type(value).__name__
        raise BundleError(f"{where}: got {shown!r}; allowed: a SHA-256 digest, 64 lowercase hex characters "
                          "(the one `stage-weights` prints)")
    return value


def digest(manifest: bytes) -> str:
    return hashlib.sha256(manifest).hexdigest()


def bundle_uri(prefix: str, manifest_digest: str) -> str:
    """Where the stager writes a bundle: its manifest's digest appended to the prefix it was given."""
    return f"{prefix.rstrip('/')}/{check_digest(manifest_digest, 'manifest digest')}/"


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a file of a bundle, or None: a clean relative path inside a model folder."""
    parts = path.split("/")
    if parts[-1] == FORBIDDEN_NAME:
        return (f"named {FORBIDDEN_NAME}; allowed: no such name anywhere in a bundle (SageMaker's loader imports "
                f"{FORBIDDEN_NAME} at start: code in the weights)")
    if len(path) > 1024 or not path.isprintable():
        return "allowed: a path of at most 1024 printable characters"
    if parts[0] not in MODEL_DIRS or len(parts) < 2 or any(p in ("", ".", "..") for p in parts):
        return f"allowed: a file below {TARGET_DIR}/ or {DRAFTER_DIR}/ (no empty, '.' or '..' parts)"
    return None


def _check_paths(paths: Iterable[str]) -> None:
    for path in paths:
        if (problem := path_problem(path)) is not None:
            raise BundleError(f"{display_path(path)}: {problem}")


def render(files: Sequence[BundleFile], sources: Mapping[str, Mapping[str, str | None]]) -> bytes:
    """The manifest's bytes: canonical JSON (sorted keys, sorted files), so equal content gives an equal digest."""
    _check_paths(f.path for f in files)
    body = {"version": MANIFEST_VERSION,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in sorted(files, key=lambda f: f.path)],
            "sources": {k: dict(v) for k, v in sorted(sources.items())}}
    return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()


def parse_manifest(manifest: bytes, where: str = MANIFEST_NAME) -> list[BundleFile]:
    """The files a manifest lists. A pinned manifest is trusted only for what :func:`render` could write."""
    try:
        body = json.loads(manifest)
    except (ValueError, UnicodeDecodeError):
        raise BundleError(f"{where}: not JSON; allowed: a manifest `stage-weights` wrote") from None
    if not isinstance(body, dict) or body.get("version") != MANIFEST_VERSION or not isinstance(body.get("files"), list):
        raise BundleError(f"{where}: allowed: a version {MANIFEST_VERSION} manifest with a list of files")
    files: dict[str, BundleFile] = {}
    for index, item in enumerate(body["files"]):
        at = f"{where}: files[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise BundleError(f"{at}: allowed: an object with path, size and sha256")
        if (problem := path_problem(item["path"])) is not None:
            raise BundleError(f"{at}: {display_path(item['path'])}: {problem}")
        size = item.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BundleError(f"{at}: size: allowed: a whole number of bytes")
        check_digest(item.get("sha256"), f"{at}: sha256")
        if item["path"] in files:
            raise BundleError(f"{at}: {display_path(item['path'])} is listed twice")
        files[item["path"]] = BundleFile(path=item["path"], size=size, sha256=item["sha256"])
    return list(files.values())


def default_threads() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_THREADS, cpus))


def stream_sha256(stream: BinaryIO) -> str:
    """The SHA-256 of what ``stream`` reads (closed afterwards)."""
    h = hashlib.sha256()
    with stream:
        while block := stream.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return stream_sha256(Path(path).open("rb", buffering=0))


def hash_files(names: Sequence[str], open_file: Callable[[str], BinaryIO], threads: int | None = None
               ) -> dict[str, str | OSError]:
    """Each name's SHA-256 (or the OSError reading it), ``threads`` at a time, in the order given: give the
    largest first, so the last file started is a small one (one file is one thread's work: SHA-256 is serial)."""

    def one(name: str) -> str | OSError:
        try:
            return stream_sha256(open_file(name))
        except OSError as exc:
            return exc

    threads = threads or default_threads()
    if threads == 1:
        return {name: one(name) for name in names}
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sha256") as pool:
        return dict(zip(names, pool.map(one, names)))


def describe(files: Mapping[str, Path], threads: int | None = None) -> list[BundleFile]:
    """The manifest's entries for local files: ``files`` maps each bundle path to the file that goes there (a
    link is read through: a hub cache is links). Hashed like a verification; raises BundleError naming the file."""
    _check_paths(files)
    sizes = {rel: Path(local).stat().st_size for rel, local in files.items()}
    order = sorted(files, key=lambda rel: (-sizes[rel], rel))
    hashes = hash_files(order, lambda rel: Path(files[rel]).open("rb", buffering=0), threads)
    out = []
    for rel in sorted(files):
        if isinstance(hashes[rel], OSError):
            raise BundleError(f"{files[rel]}: could not be read ({hashes[rel].strerror or hashes[rel]})")
        out.append(BundleFile(path=rel, size=sizes[rel], sha256=hashes[rel]))
    return out


def display_path(path: str) -> str:
    """A found name as an error shows it: the writer chose it, so escaped and cut short."""
    shown = path if path.isprintable() else ascii(path)[1:-1]
    return shown if len(shown) <= 120 else shown[:117] + "..."


def verify_listing(manifest: bytes | None, expected: str, found: Iterable[Entry],
                   open_file: Callable[[str], BinaryIO], *, bundle: str, where: str = MANIFEST_DIGEST_VAR,
                   threads: int | None = None, started: float | None = None) -> Verified:
    """Check a bundle against its pin, wherever it is: ``manifest`` its manifest's bytes (None: none there),
    ``found`` everything in it, ``open_file`` opens one listed file by its path. Raises :class:`BundleError`
    naming every bad file, what was expected and what was found."""
    started = time.monotonic() if started is None else started
    check_digest(expected, where)
    pinned = f"{where}: pins manifest {expected[:12]}..., but {bundle}"
    if manifest is None:
        raise BundleError(f"{pinned} has no {MANIFEST_NAME} (an incomplete bundle: the stager writes its manifest "
                          "last), or the manifest is not a plain file",
                          [f"{MANIFEST_NAME}: missing (an incomplete bundle: the stager writes its manifest last)"])
    if (got := digest(manifest)) != expected:
        raise BundleError(f"{pinned} has {got[:12]}...; allowed: the bundle the environment was deployed for "
                          "(restage it or update the pin)",
                          [f"{MANIFEST_NAME}: sha256 expected {expected[:12]}..., found {got[:12]}..."])
    listed = {f.path: f for f in parse_manifest(manifest, where=f"{bundle}/{MANIFEST_NAME}")}
    folders = {path.rsplit("/", i)[0] for path in listed for i in range(1, path.count("/") + 1)}
    problems: list[str] = []
    present: dict[str, Entry] = {}
    for entry in sorted(found, key=lambda e: e.path):
        path, shown = entry.path, display_path(entry.path)
        if path.rsplit("/", 1)[-1] == FORBIDDEN_NAME:
            problems.append(f"{shown}: a {entry.kind} {path_problem(path)}")
        elif "/" not in path:
            if (path, entry.kind) not in ((MANIFEST_NAME, FILE), (TARGET_DIR, FOLDER), (DRAFTER_DIR, FOLDER)):
                problems.append(f"{shown}: a {entry.kind} at the bundle root; allowed there: {MANIFEST_NAME} (a file), "
                                f"{TARGET_DIR}/ and {DRAFTER_DIR}/ (folders)")
        elif entry.kind in (LINK, SPECIAL):
            problems.append(f"{shown}: a {entry.kind} (not followed); allowed: regular files and folders")
        elif entry.kind == FOLDER:
            if path not in folders:
                problems.append(f"{shown}/: a folder the manifest does not list")
        elif path not in listed:
            problems.append(f"{shown}: not in the manifest; found a file of {entry.size} bytes")
        else:
            present[path] = entry
    reported = {e.path for e in found} - set(present)
    to_hash: list[BundleFile] = []
    for path, f in listed.items():
        entry = present.get(path)
        if entry is None:
            if path not in reported:
                problems.append(f"{path}: missing; expected {f.size} bytes, sha256 {f.sha256[:12]}...")
        elif entry.size != f.size:
            problems.append(f"{path}: expected {f.size} bytes, found {entry.size}")
        else:
            to_hash.append(f)
    to_hash.sort(key=lambda f: (-f.size, f.path))
    threads = threads or default_threads()
    hashes = hash_files([f.path for f in to_hash], open_file, threads)
    for f in to_hash:
        got = hashes[f.path]
        if isinstance(got, OSError):
            problems.append(f"{f.path}: could not be read ({got.strerror or type(got).__name__}); "
                            f"expected {f.size} bytes, sha256 {f.sha256[:12]}...")
        elif got != f.sha256:
            problems.append(f"{f.path}: sha256 expected {f.sha256[:12]}..., found {got[:12]}...")
    if problems:
        more = f"; and {len(problems) - _SHOWN_PROBLEMS} more" if len(problems) > _SHOWN_PROBLEMS else ""
        raise BundleError(f"{pinned} does not match it ({len(problems)} problem{'s' * (len(problems) > 1)}): "
                          + "; ".join(problems[:_SHOWN_PROBLEMS]) + more, problems)
    return Verified(files=len(listed), bytes=sum(f.size for f in listed.values()),
                    seconds=time.monotonic() - started, threads=threads)


def scan_folder(root: Path) -> list[Entry]:
    """Everything below ``root``, following no symbolic link below it (a link could name /etc or another bundle)."""
    found: list[Entry] = []
    pending = [("", Path(root))]
    while pending:
        rel, folder = pending.pop()
        with os.scandir(folder) as entries:
            for e in entries:
                path = rel + e.name
                if e.is_symlink():
                    found.append(Entry(path, LINK))
                elif e.is_dir(follow_symlinks=False):
                    found.append(Entry(path, FOLDER))
                    pending.append((path + "/", Path(e.path)))
                elif e.is_file(follow_symlinks=False):
                    found.append(Entry(path, FILE, e.stat(follow_symlinks=False).st_size))
                else:
                    found.append(Entry(path, SPECIAL))
    return found


def _open_inside(root: Path) -> Callable[[str], BinaryIO]:
    """Open a file below ``root`` for reading without following a link in its last part, and only a regular file
    (non-blocking, so a FIFO put there after the walk cannot hang the start)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)

    def open_file(rel: str) -> BinaryIO:
        fd = os.open(Path(root, rel), flags)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{rel} is not a regular file")
        return os.fdopen(fd, "rb", buffering=0)

    return open_file


def verify_bundle(root: Path | str, expected: str, *, threads: int | None = None,
                  where: str = MANIFEST_DIGEST_VAR) -> Verified:
    """Check the bundle in the folder ``root`` against the pin ``expected`` (:func:`verify_listing`)."""
    started = time.monotonic()
    check_digest(expected, where)
    root = Path(root)
    if not root.is_dir():
        raise BundleError(f"{where}: pins manifest {expected[:12]}..., but {root} is not a folder (no bundle there)")
    found = scan_folder(root)
    open_file = _open_inside(root)
    manifest = None
    if any(e.path == MANIFEST_NAME and e.kind == FILE for e in found):
        with open_file(MANIFEST_NAME) as f:
            manifest = f.read(MANIFEST_MAX_BYTES + 1)
    return verify_listing(manifest, expected, found, open_file, bundle=str(root), where=where, threads=threads,
                          started=started)
