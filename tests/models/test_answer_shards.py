"""The committed answers (models/answers, models/answer_shards.py): what CI checks of them without answering anything.

- the manifest: every shard listed is there with its SHA-256, nothing unlisted, the task list unchanged;
- HumanEval held out: no HumanEval prompt or canonical solution in any committed prompt or answer, decoded with the
  target's own tokenizer (slow: the target is built from its wheel), and each row's prompt is its task's;
- the format refuses what it cannot hold, and a run never mixes answers of another target, engine or task list.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from models import answer_shards
from models.answer_shards import ShardError

BENCH = answer_shards.ANSWERS_DIR / "bench"


@pytest.fixture(scope="module")
def messages():
    from models import real_pair

    return real_pair.training_messages(real_pair.RECIPES["bench"].data)


def test_the_committed_manifest_matches_its_shards_and_this_checkouts_task_list(messages):
    manifest = answer_shards.verify(BENCH, messages=messages, complete=False)
    assert manifest["tasks"]["count"] == len(messages) == 2400
    assert manifest["shards"], "no shard committed yet"
    for shard in manifest["shards"]:
        rows = answer_shards.decode_shard(BENCH / shard["name"])
        assert len(rows) == shard["answered"] and shard["answered"] + shard["left_out"] == 100
        lo, hi = shard["tasks"]
        assert all(lo <= row["task_index"] < hi for row in rows)
        assert sum(len(row["output_ids"]) for row in rows) == shard["answer_tokens"]


@pytest.mark.parametrize("damage", ["a changed byte", "a missing shard", "an unlisted shard", "another task list"])
def test_damaged_answers_are_refused_naming_the_file(tmp_path, messages, damage):
    folder = tmp_path / "bench"
    shutil.copytree(BENCH, folder)
    first = json.loads((folder / answer_shards.MANIFEST).read_text())["shards"][0]["name"]
    tasks = messages
    if damage == "a changed byte":
        data = bytearray((folder / first).read_bytes())
        data[len(data) // 2] ^= 1
        (folder / first).write_bytes(bytes(data))
    elif damage == "a missing shard":
        (folder / first).unlink()
    elif damage == "an unlisted shard":
        shutil.copy(folder / first, folder / "shard-99.npz")
    else:
        tasks = list(reversed(messages))
    with pytest.raises(ShardError) as caught:
        answer_shards.verify(folder, messages=tasks, complete=False)
    named = {"a changed byte": first, "a missing shard": first, "an unlisted shard": "shard-99.npz",
             "another task list": "manifest.json"}[damage]
    assert named in str(caught.value)


def test_a_shard_round_trips_and_refuses_ids_past_uint16(tmp_path):
    rows = [{"prompt_ids": [1, 2, 3], "output_ids": [65535, 7]}, {"prompt_ids": [9], "output_ids": []}]
    path = tmp_path / "s.npz"
    path.write_bytes(answer_shards.encode_shard(rows, [4, 8]))
    assert answer_shards.decode_shard(path) == [{"task_index": 4, **rows[0]}, {"task_index": 8, **rows[1]}]
    with pytest.raises(ShardError, match="uint16"):
        answer_shards.encode_shard([{"prompt_ids": [65536], "output_ids": []}], [0])


def test_a_resumed_run_never_mixes_answers_of_another_target_or_engine(tmp_path):
    manifest = json.loads((BENCH / answer_shards.MANIFEST).read_text())
    header = {k: v for k, v in manifest.items() if k != "shards"}
    other = json.loads(json.dumps(header))
    other["engine"]["vllm"] = "0.99.0"
    with pytest.raises(ShardError, match="'engine' differs"):
        answer_shards._check_resumable(manifest, other, tmp_path)
    answer_shards._check_resumable(manifest, header, tmp_path)  # the control: an equal header resumes


@pytest.mark.slow
def test_humaneval_is_held_out_of_every_committed_prompt_and_answer(messages):
    """Decoded with the target's own tokenizer: each row's prompt is its task's, and no HumanEval prompt or
    canonical solution occurs anywhere (the target could have reproduced one)."""
    from transformers import AutoTokenizer

    from models import smollm2
    from models.trainer import coding_tasks

    tokenizer = AutoTokenizer.from_pretrained(smollm2.build())
    manifest = answer_shards.verify(BENCH, messages=messages, complete=False)
    texts = []
    for shard in manifest["shards"]:
        for row in answer_shards.decode_shard(BENCH / shard["name"]):
            expected = tokenizer.apply_chat_template(messages[row["task_index"]], add_generation_prompt=True,
                                                     tokenize=True)
            expected = list(expected if isinstance(expected, list) else expected["input_ids"])
            assert row["prompt_ids"] == expected, f"{shard['name']}: task {row['task_index']}'s prompt differs"
            texts.append(tokenizer.decode(row["prompt_ids"] + row["output_ids"]))
    assert len(texts) == sum(s["answered"] for s in manifest["shards"])
    assert coding_tasks.leaks(texts) == []
    # The control: the same check finds a HumanEval prompt planted in the decoded texts.
    planted = coding_tasks.humaneval_tasks()[3]
    assert coding_tasks.leaks(texts[:5] + [planted.prompt]) == [f"{planted.source} prompt"]


def test_answers_are_stored_compactly():
    sizes = [p.stat().st_size for p in BENCH.glob("shard-*.npz")]
    tokens = sum(int(np.load(p)["tokens"].size) for p in BENCH.glob("shard-*.npz"))
    assert sum(sizes) < 2.5 * tokens  # uint16, compressed: under 2.5 bytes a token


def _target(folder: Path, tokenizer_config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 8}\n')
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    return folder


def test_committed_answers_serve_the_target_they_pin_and_a_refusal_names_the_file(tmp_path, messages,
                                                                                 monkeypatch):
    # The committed answers, pinned to a stand-in target; then a target that differs in one file.
    answers = tmp_path / "answers"
    shutil.copytree(BENCH, answers / "bench")
    target = _target(tmp_path / "target", {"bos_token": "<s>", "local_files_only": False})
    manifest = json.loads((answers / "bench" / answer_shards.MANIFEST).read_text())
    manifest["target"]["files_sha256"] = answer_shards.target_files_sha256(target)
    (answers / "bench" / answer_shards.MANIFEST).write_text(json.dumps(manifest, indent=1))
    monkeypatch.setattr(answer_shards, "ANSWERS_DIR", answers)
    said: list[str] = []
    found = answer_shards.committed(messages, max_tokens=manifest["max_tokens"], target=target,
                                    vllm_version=manifest["engine"]["vllm"], log=said.append)
    assert found == answers / "bench" and said == []

    other = _target(tmp_path / "offline-target", {"bos_token": "<s>", "local_files_only": True})
    assert answer_shards.committed(messages, max_tokens=manifest["max_tokens"], target=other,
                                   vllm_version=manifest["engine"]["vllm"], log=said.append) is None
    assert said == ["models/answers/bench not used: its target differs in tokenizer_config.json"]
    assert answer_shards.committed(messages, max_tokens=manifest["max_tokens"], target=target,
                                   vllm_version="0.99.0", log=said.append) is None
    assert "its vLLM is 0.32.0, not 0.99.0" in said[-1]


def test_the_targets_tokenizer_config_does_not_record_how_its_builder_was_run(tmp_path):
    # save_pretrained records local_files_only as the loader ran (true under HF_HUB_OFFLINE=1): settled, an
    # offline build and an online one write the same bytes, the bytes the committed answers pin.
    from models import smollm2

    built = {}
    for offline in (True, False):
        path = tmp_path / f"offline-{offline}.json"
        path.write_text(json.dumps({"bos_token": "<s>", "is_local": True, "local_files_only": offline}, indent=2))
        smollm2.settle_tokenizer_config(path)
        built[offline] = path.read_bytes()
    assert built[True] == built[False] and json.loads(built[True])["local_files_only"] is False
    untouched = tmp_path / "no-record.json"
    untouched.write_text(json.dumps({"bos_token": "<s>"}))
    smollm2.settle_tokenizer_config(untouched)
    assert "local_files_only" not in json.loads(untouched.read_text())
