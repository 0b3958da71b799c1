"""A capture (peagle_contract.capture) as the trainer's data: split into training and held-out requests, proven
apart, and written as the samples the feature step reads (``{"prompt_ids", "output_ids"}`` per line).

The split is by conversation, not by request. Two requests of one chat (turn 2 repeats turn 1's prompt and answer)
or the same prompt sent twice would otherwise land on both sides, and the held-out figures would measure answers
the head had trained on. A conversation is named by its root: the system messages and the first user message of
a chat, or the whole prompt of a completion. The held-out share of roots is taken in the order of their SHA-256,
so the split depends on the capture alone. After the split, every held-out prompt and answer is looked for in the
training texts (whitespace-normalised); a training request that holds one is left out of training and counted,
never silently.

Token ids are rebuilt with the target's tokenizer: the chat template with the generation prompt for a chat, the
tokenizer's own special tokens for a completion, the answer's text encoded without them, plus the end-of-sequence
token when the answer ended by ``stop``. Rebuilt ids can differ from the ids the engine generated where a text has
several tokenizations; the features are the target's own on the rebuilt ids, so training stays self-consistent.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from peagle_contract.capture import CaptureError

MIN_SOLUTION_CHARS = 40  # shorter answers ("return a + b") turn up in any code by chance: not looked for


def conversation_root(record: dict) -> str:
    """The SHA-256 that names the conversation a request belongs to."""
    if "messages" in record:
        messages = record["messages"]
        first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages) - 1)
        root = {"messages": messages[:first_user + 1]}
    else:
        root = {"prompt": record["prompt"]}
    return hashlib.sha256(json.dumps(root, sort_keys=True).encode()).hexdigest()


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _prompt_text(record: dict) -> str:
    return "\n".join(m["content"] for m in record["messages"]) if "messages" in record else record["prompt"]


@dataclass(frozen=True)
class Split:
    training: tuple[dict, ...]
    held_out: tuple[dict, ...]
    conversations: int  # distinct roots in the capture
    left_out_for_leaks: tuple[str, ...]  # request ids of training requests holding held-out text

    def report(self) -> dict:
        return {"requests_training": len(self.training), "requests_held_out": len(self.held_out),
                "conversations": self.conversations, "training_left_out_for_leaks": len(self.left_out_for_leaks)}


def split(records: Sequence[dict], *, held_out_share: float = 0.2, min_held_out: int = 8,
          min_training: int = 16) -> Split:
    """Training and held-out requests, by conversation; :class:`CaptureError` when the capture is too small to hold
    ``min_held_out`` requests out and still train on ``min_training``."""
    if not 0 < held_out_share < 1:
        raise CaptureError("held_out_share", f"got {held_out_share!r}; allowed: a number in (0, 1)")
    by_root: dict[str, list[dict]] = {}
    for record in records:
        by_root.setdefault(conversation_root(record), []).append(record)
    roots = sorted(by_root)
    held_roots = set(roots[:math.ceil(held_out_share * len(roots))]) if len(roots) > 1 else set()
    held = [r for root in roots if root in held_roots for r in by_root[root]]
    training = [r for root in roots if root not in held_roots for r in by_root[root]]
    leaking = leaks(training, held)
    training = [r for r in training if r["request_id"] not in leaking]
    if len(held) < min_held_out or len(training) < min_training:
        raise CaptureError("capture", f"{len(records)} requests in {len(roots)} conversations give {len(held)} to hold "
                                      f"out and {len(training)} to train on; allowed: at least {min_held_out} held out "
                                      f"and {min_training} to train on (capture longer, or a higher sample rate)")
    return Split(tuple(training), tuple(held), len(roots), tuple(sorted(leaking)))


def leaks(training: Sequence[dict], held_out: Sequence[dict]) -> set[str]:
    """Request ids of the training requests whose prompt or answer holds a held-out prompt, or a held-out answer
    of at least :data:`MIN_SOLUTION_CHARS` characters (whitespace-normalised). Empty means held out."""
    needles = set()
    for record in held_out:
        needles.add(_normalised(_prompt_text(record)))
        answer = _normalised(record["answer"])
        if len(answer) >= MIN_SOLUTION_CHARS:
            needles.add(answer)
    needles.discard("")
    found = set()
    for record in training:
        text = _normalised(_prompt_text(record) + "\n" + record["answer"])
        if any(needle in text for needle in needles):
            found.add(record["request_id"])
    return found


def sample(record: dict, tokenizer) -> dict:  # noqa: ANN001 - a transformers tokenizer
    """One record as the trainer's sample: the prompt's and the answer's token ids, rebuilt (see above)."""
    if "messages" in record:
        prompt = tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True, tokenize=True)
        prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])  # a list or an encoding
    else:
        prompt = list(tokenizer(record["prompt"])["input_ids"])
    answer = list(tokenizer(record["answer"], add_special_tokens=False)["input_ids"])
    if record["finish_reason"] == "stop" and tokenizer.eos_token_id is not None:
        answer.append(int(tokenizer.eos_token_id))
    return {"prompt_ids": [int(t) for t in prompt], "output_ids": [int(t) for t in answer]}


def write_samples(records: Sequence[dict], tokenizer, path: Path) -> Path:  # noqa: ANN001
    """``path`` as the feature step reads it (models.trainer.distill.read_samples): one sample per record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        for record in records:
            out.write(json.dumps(sample(record, tokenizer)) + "\n")
    return path
