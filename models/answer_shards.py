"""The target's greedy answers to the training tasks, committed once: compact shards of token ids and a manifest.

Answering is the long pole of a real pair (about 27 minutes per 1,000 tasks on 2 cores), and the model cache is
not kept between machines, so the answers live in the repository (``models/answers/<recipe>/``):

- ``shard-NN.npz``: the answers to a fixed slice of the task list (:data:`SHARD_TASKS` tasks), as uint16 token
  ids (the target's vocabulary has 49,152 entries): ``task_index``, ``prompt_len``, ``answer_len`` and every
  prompt and answer end to end in ``tokens``. A prompt too long for the engine's context is left out and counted.
- ``manifest.json``: what the answers depend on - the target (its wheel and the SHA-256 of every file vLLM
  loads), the vLLM release, the task list's hash and the generation settings - and each shard's SHA-256.

:func:`generate` resumes at the first missing shard, so the answers can be built over several sittings and
committed shard by shard; it refuses to add shards to a manifest made by another target, engine or task list.
:func:`verify` is what CI runs: every shard present and hashed as the manifest says, the task list unchanged.
:func:`samples` turns complete shards into the ``samples.jsonl`` the feature step reads.

Command line for a recipe's answers: ``python -m models.answer_commands generate|verify [recipe]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from models.smollm2 import sha256 as file_sha256

ANSWERS_DIR = Path(__file__).resolve().parent / "answers"
MANIFEST = "manifest.json"
FORMAT = 1
SHARD_TASKS = 100  # one engine batch: the shard's answers come from one vllm.generate call
MAX_MODEL_LEN = 1024


class ShardError(RuntimeError):
    pass


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tasks_sha256(messages: Sequence[list[dict]]) -> str:
    """The task list's identity: its chat messages as canonical JSON (order matters: shards are slices)."""
    return sha256_bytes(json.dumps(list(messages), sort_keys=True, separators=(",", ":")).encode())


def target_files_sha256(target: Path) -> dict[str, str]:
    """SHA-256 of every file in the target folder (weights, config, tokenizer: all that shapes an answer)."""
    return {p.name: file_sha256(p) for p in sorted(target.iterdir()) if p.is_file()}


def shard_name(index: int) -> str:
    return f"shard-{index:02d}.npz"


@dataclass(frozen=True)
class Header:
    """What every shard of one manifest shares; shards are only added under an equal header."""

    recipe: str
    tasks: int
    tasks_sha256: str
    max_tokens: int
    target_wheel: str
    target_wheel_sha256: str
    target_files: dict
    vllm: str
    shard_tasks: int = SHARD_TASKS
    max_model_len: int = MAX_MODEL_LEN

    def as_json(self) -> dict:
        return {"format": FORMAT, "recipe": self.recipe,
                "tasks": {"count": self.tasks, "sha256": self.tasks_sha256,
                          "source": "the Python standard library's documented functions (models.trainer.coding_tasks), "
                                    "HumanEval held out"},
                "target": {"wheel": self.target_wheel, "wheel_sha256": self.target_wheel_sha256,
                           "files_sha256": self.target_files},
                "engine": {"vllm": self.vllm, "dtype": "float32", "temperature": 0.0, "enforce_eager": True,
                           "max_model_len": self.max_model_len, "max_num_seqs": self.shard_tasks},
                "max_tokens": self.max_tokens, "shard_tasks": self.shard_tasks}


def shard_count(tasks: int, shard_tasks: int = SHARD_TASKS) -> int:
    return -(-tasks // shard_tasks)


def read_manifest(folder: Path) -> dict | None:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_manifest(folder: Path, header: dict, shards: list[dict]) -> None:
    body = {**header, "shards": sorted(shards, key=lambda s: s["index"])}
    _write_atomic(folder / MANIFEST, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode())


def encode_shard(rows: Sequence[dict], task_indexes: Sequence[int]) -> bytes:
    """One shard's bytes: ``rows`` (prompt_ids, output_ids) of the tasks ``task_indexes``, as uint16 arrays."""
    import io

    tokens = [t for row in rows for t in (*row["prompt_ids"], *row["output_ids"])]
    if tokens and (min(tokens) < 0 or max(tokens) > np.iinfo(np.uint16).max):
        raise ShardError(f"a token id outside uint16 ({min(tokens)}..{max(tokens)}): this format holds "
                         "vocabularies of at most 65,536 entries")
    buf = io.BytesIO()
    np.savez_compressed(buf, task_index=np.asarray(task_indexes, dtype=np.int32),
                        prompt_len=np.asarray([len(r["prompt_ids"]) for r in rows], dtype=np.int32),
                        answer_len=np.asarray([len(r["output_ids"]) for r in rows], dtype=np.int32),
                        tokens=np.asarray(tokens, dtype=np.uint16))
    return buf.getvalue()


def decode_shard(path: Path) -> list[dict]:
    """The rows of one shard: ``{"task_index", "prompt_ids", "output_ids"}``."""
    with np.load(path) as z:
        index, plen, alen, tokens = z["task_index"], z["prompt_len"], z["answer_len"], z["tokens"]
    if not (len(index) == len(plen) == len(alen)) or int(plen.sum() + alen.sum()) != len(tokens):
        raise ShardError(f"{path.name}: its lengths do not add up to its tokens")
    rows, at = [], 0
    for i, p, a in zip(index.tolist(), plen.tolist(), alen.tolist()):
        rows.append({"task_index": i, "prompt_ids": tokens[at:at + p].tolist(),
                     "output_ids": tokens[at + p:at + p + a].tolist()})
        at += p + a
    return rows


def verify(folder: Path, *, messages: Sequence[list[dict]] | None = None, complete: bool = True) -> dict:
    """Check the committed answers: each listed shard present with its SHA-256, nothing else, the task list (when
    given) the one they answer; ``complete``: every shard there. Returns the manifest; ShardError names the file."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise ShardError(f"{folder.name}/{MANIFEST}: missing")
    if manifest.get("format") != FORMAT:
        raise ShardError(f"{folder.name}/{MANIFEST}: format {manifest.get('format')!r}; allowed: {FORMAT}")
    if messages is not None:
        found = tasks_sha256(messages)
        if len(messages) != manifest["tasks"]["count"] or found != manifest["tasks"]["sha256"]:
            raise ShardError(f"{folder.name}/{MANIFEST}: answers a task list with hash "
                             f"{manifest['tasks']['sha256'][:12]}... ({manifest['tasks']['count']} tasks); this "
                             f"checkout's list hashes to {found[:12]}... ({len(messages)} tasks)")
    listed = {s["name"]: s for s in manifest["shards"]}
    on_disk = {p.name for p in folder.glob("shard-*.npz")}
    for name in sorted(on_disk - set(listed)):
        raise ShardError(f"{folder.name}/{name}: not in the manifest (a shard from another run?)")
    for name, shard in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            raise ShardError(f"{folder.name}/{name}: listed in the manifest, missing on disk")
        found = file_sha256(path)
        if found != shard["sha256"]:
            raise ShardError(f"{folder.name}/{name}: SHA-256 {found[:12]}..., the manifest says {shard['sha256'][:12]}...")
    expected = shard_count(manifest["tasks"]["count"], manifest["shard_tasks"])
    if complete and len(listed) != expected:
        missing = sorted(set(range(expected)) - {s["index"] for s in manifest["shards"]})
        raise ShardError(f"{folder.name}: {len(listed)} of {expected} shards; missing {missing[:5]}"
                         f"{'...' if len(missing) > 5 else ''} (python -m models.answer_commands generate resumes)")
    return manifest


def samples(folder: Path, out: Path, *, messages: Sequence[list[dict]]) -> Path:
    """Write every shard's rows, in task order, as ``samples.jsonl`` into ``out`` (the features step's input)."""
    from models.trainer import distill

    manifest = verify(folder, messages=messages)
    out.mkdir(parents=True, exist_ok=True)
    with (out / distill.SAMPLES).open("w") as f:
        for shard in manifest["shards"]:
            for row in decode_shard(folder / shard["name"]):
                f.write(json.dumps({"prompt_ids": row["prompt_ids"], "output_ids": row["output_ids"]}) + "\n")
    return out / distill.SAMPLES


def committed(messages: Sequence[list[dict]], *, max_tokens: int, target: Path, vllm_version: str,
              log: Callable[[str], None] = print) -> Path | None:
    """The committed answers folder for exactly these tasks, answered by this target and engine (every shard
    there and hashed as its manifest says), else None. Each folder passed over is logged with why: a refusal
    costs an hour or more of answering again, so it must not pass unseen."""
    wanted = tasks_sha256(messages)
    files = target_files_sha256(target)
    for manifest_path in sorted(ANSWERS_DIR.glob(f"*/{MANIFEST}")):
        manifest = json.loads(manifest_path.read_text())
        pinned = manifest.get("target", {}).get("files_sha256", {})
        engine = manifest.get("engine", {}).get("vllm")
        why = ("its format differs" if manifest.get("format") != FORMAT else
               "its task list differs" if manifest["tasks"]["sha256"] != wanted else
               f"its max_tokens is {manifest['max_tokens']}, not {max_tokens}" if manifest["max_tokens"] != max_tokens
               else f"its vLLM is {engine}, not {vllm_version}" if engine != vllm_version else None)
        if why is None and pinned != files:
            differ = sorted(name for name in set(pinned) | set(files) if pinned.get(name) != files.get(name))
            why = f"its target differs in {', '.join(differ)}"
        if why is None:
            try:
                verify(manifest_path.parent, messages=messages)
            except ShardError as exc:  # incomplete (still being built) or damaged: the engine answers instead
                why = f"its shards fail their check ({str(exc)[:200]})"
        if why is None:
            return manifest_path.parent
        log(f"models/answers/{manifest_path.parent.name} not used: {why}")
    return None


def _check_resumable(existing: dict, header: dict, folder: Path) -> None:
    for key in ("format", "recipe", "tasks", "target", "engine", "max_tokens", "shard_tasks"):
        if existing.get(key) != header.get(key):
            raise ShardError(f"{folder.name}/{MANIFEST}: its {key!r} differs from this run's "
                             f"({json.dumps(existing.get(key))[:200]} vs {json.dumps(header.get(key))[:200]}); "
                             "answers of another target, engine or task list are never mixed: move the folder "
                             "aside to start again")


def generate(folder: Path, header: Header, target: Path, messages: Sequence[list[dict]], *,
             log: Callable[[str], None] = print) -> dict:
    """Answer every missing shard (vLLM in a child process), each written and listed as it lands."""
    from models.cpu_engine import cpu_engine_environment
    from models.trainer import distill

    header_json = header.as_json()
    existing = read_manifest(folder)
    if existing is not None:
        _check_resumable(existing, header_json, folder)
        verify(folder, messages=messages, complete=False)
    else:
        write_manifest(folder, header_json, [])
    done = {s["index"] for s in (existing or {}).get("shards", [])}
    todo = [i for i in range(shard_count(len(messages), header.shard_tasks)) if i not in done]
    if not todo:
        log(f"answers: all {len(done)} shards present in {folder.name}")
        return verify(folder, messages=messages)
    log(f"answers: {len(done)} shards present, {len(todo)} to answer (first: {shard_name(todo[0])})")
    with tempfile.TemporaryDirectory(prefix="answer-shards-") as tmp:
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps({"target": str(target), "messages": list(messages), "todo": todo,
                                       "folder": str(folder), "max_tokens": header.max_tokens,
                                       "shard_tasks": header.shard_tasks, "max_model_len": header.max_model_len}))
        # 100 answers at once need about 3 GiB of KV cache (46 KB a token on this target).
        base = {"VLLM_CPU_KVCACHE_SPACE": "4", **os.environ}
        env = {**cpu_engine_environment(base), "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
               "PEAGLE_FUSED_DRAFT": "0",
               # A niced job on a busy machine can wait minutes for one engine step: vLLM's default RPC timeout
               # killed a run here at shard 14 (measured 2026-12-03); a stalled step is not a failed one.
               "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")}
        try:
            distill.run_child(["models.answer_shards", "_child", str(request)], env=env, prefix="answers:", log=log,
                              what="generation")
        except RuntimeError as exc:
            raise ShardError(str(exc)) from None
    return verify(folder, messages=messages)


def _child(request_path: str) -> int:
    from vllm import LLM, SamplingParams

    from models.cpu_engine import exact_engine_kwargs

    request = json.loads(Path(request_path).read_text())
    folder, size = Path(request["folder"]), request["shard_tasks"]
    llm = LLM(**exact_engine_kwargs(request["target"], max_model_len=request["max_model_len"], max_num_seqs=size))
    tokenizer = llm.get_tokenizer()
    room = request["max_model_len"] - request["max_tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    for index in request["todo"]:
        started = time.time()
        lo, hi = index * size, min((index + 1) * size, len(request["messages"]))
        prompts = []
        for i in range(lo, hi):
            ids = tokenizer.apply_chat_template(request["messages"][i], add_generation_prompt=True, tokenize=True)
            ids = list(ids if isinstance(ids, list) else ids["input_ids"])  # a list or an encoding
            if len(ids) <= room:
                prompts.append((i, ids))
        results = llm.generate([{"prompt_token_ids": ids} for _, ids in prompts], params, use_tqdm=False)
        rows = [{"prompt_ids": ids, "output_ids": list(r.outputs[0].token_ids)} for (_, ids), r in zip(prompts, results)]
        data = encode_shard(rows, [i for i, _ in prompts])
        _write_atomic(folder / shard_name(index), data)
        manifest = read_manifest(folder)
        header = {k: v for k, v in manifest.items() if k != "shards"}
        seconds = round(time.time() - started, 1)
        entry = {"index": index, "name": shard_name(index), "tasks": [lo, hi], "answered": len(rows),
                 "left_out": (hi - lo) - len(rows), "answer_tokens": sum(len(r["output_ids"]) for r in rows),
                 "sha256": sha256_bytes(data), "seconds": seconds}
        write_manifest(folder, header, [s for s in manifest["shards"] if s["index"] != index] + [entry])
        print(f"answers: {shard_name(index)} tasks {lo}..{hi - 1}: {len(rows)} answered, {entry['answer_tokens']} "
              f"tokens in {seconds} s ({entry['answer_tokens'] / max(seconds, 1e-9):.0f} tok/s)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``_child REQUEST``: one shard's engine (what :func:`generate` starts); the recipes' command line is
    models.answer_commands."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["_child"] or len(args) != 2:
        print("answer_shards: python -m models.answer_shards _child REQUEST (the generation's own child); "
              "for a recipe's answers: python -m models.answer_commands generate|verify [recipe]", file=sys.stderr)
        return 2
    return _child(args[1])


if __name__ == "__main__":
    sys.exit(main())
