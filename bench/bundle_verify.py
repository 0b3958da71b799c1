"""How long the container's bundle check takes: peagle_contract.bundle.verify_bundle, one thread vs the pool.

    python -m bench.bundle_verify [--target FOLDER] [--synthetic-gib N] [--rounds R]

Builds a bundle in a temporary folder (``--target``: a real model folder, e.g. the SmolLM2 target in
~/.cache/peagle/models; else ``--synthetic-gib`` of random 1 GiB shards) with a drafter of random shards beside it,
then verifies it ``--rounds`` times per thread count, interleaved, warm (files in the page cache, as right after
SageMaker's download) and cold (each file's pages dropped with posix_fadvise first, so the disk is read again).
Writes bench/results/bundle_verify.json (bench/figures/ with --publish). One file is one thread's work (SHA-256 is serial), so the pool helps up to
min(cores, files of comparable size).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
from pathlib import Path

from peagle_contract.bundle import MANIFEST_NAME, default_threads, describe, digest, render, verify_bundle

BENCH = Path(__file__).resolve().parent
GIB = 1 << 30


def _random_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for _ in range(size // (64 << 20)):
            f.write(os.urandom(64 << 20))
        f.write(os.urandom(size % (64 << 20)))


def build(root: Path, target: Path | None, synthetic_gib: int, drafter_mib: int) -> str:
    if target is not None:
        shutil.copytree(target, root / "target")
    else:
        for i in range(synthetic_gib):
            _random_file(root / "target" / f"model-{i + 1:05d}-of-{synthetic_gib:05d}.safetensors", GIB)
        (root / "target" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    _random_file(root / "drafter" / "model.safetensors", drafter_mib << 20)
    (root / "drafter" / "config.json").write_text('{"architectures": ["Eagle3LlamaForCausalLM"]}\n')
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    manifest = render(describe(files), {})
    (root / MANIFEST_NAME).write_bytes(manifest)
    return digest(manifest)


def _drop_cache(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def measure(root: Path, pin: str, threads: list[int], rounds: int) -> dict:
    runs: dict[str, list[dict]] = {}
    verify_bundle(root, pin)  # warm the page cache once
    for _ in range(rounds):
        for cache in ("warm", "cold"):
            for n in threads:
                if cache == "cold":
                    _drop_cache(root)
                v = verify_bundle(root, pin, threads=n)
                runs.setdefault(f"{cache}-{n}", []).append({"seconds": v.seconds, "mb_per_s": v.mb_per_s})
                files, size = v.files, v.bytes
    return {"files": files, "bytes": size,
            "median": {k: {"seconds": round(statistics.median(r["seconds"] for r in rs), 3),
                           "mb_per_s": round(statistics.median(r["mb_per_s"] for r in rs), 1)} for k, rs in runs.items()},
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bundle_verify", description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, help="a real model folder to bundle (default: synthetic shards)")
    parser.add_argument("--synthetic-gib", type=int, default=4)
    parser.add_argument("--drafter-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="where to build it (default: a temp folder)")
    parser.add_argument("--publish", action="store_true", help="write to bench/figures/ instead of bench/results/")
    args = parser.parse_args(argv)
    threads = sorted({1, default_threads()})
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp) / "opt-ml-model"
        pin = build(root, args.target, args.synthetic_gib, args.drafter_mib)
        result = {"bundle": f"{args.target.parent.name}/{args.target.name}" if args.target
                  else f"synthetic {args.synthetic_gib} GiB",
                  "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
                  **measure(root, pin, threads, args.rounds)}
    for key, m in result["median"].items():
        print(f"{key:>8} threads: {result['files']} files, {result['bytes'] / 1e6:.0f} MB in {m['seconds']:.2f} s "
              f"({m['mb_per_s']:.0f} MB/s)")
    out = BENCH / ("figures" if args.publish else "results") / "bundle_verify.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    figures = json.loads(out.read_text()) if out.exists() else {}
    figures[result["bundle"]] = result  # one entry per bundle measured
    out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
