"""A capture as the trainer's data: the split keeps every conversation on one side and proves the held-out requests
absent from training; the samples are the target tokenizer's own ids."""

from __future__ import annotations

import json

import pytest
from peagle_contract.capture import CaptureConfig, CaptureError, format_record

from models.trainer import capture_samples
from models.trainer.capture_samples import leaks, split

CONFIG = CaptureConfig(sample_rate=1.0, stage="dev", target="t")


def _chat(rid: str, *turns: str, answer: str = "ok", system: str | None = None, finish: str = "stop") -> dict:
    """A chat record whose user turns are ``turns``; earlier turns' answers are "answer to <turn>"."""
    messages = [{"role": "system", "content": system}] if system else []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(turns) - 1:
            messages.append({"role": "assistant", "content": f"answer to {turn}"})
    line = format_record(config=CONFIG, request_id=rid, route="/v1/chat/completions", stream=False,
                         request={"messages": messages}, answer=answer, finish_reason=finish, prompt_tokens=1,
                         output_tokens=1)
    return json.loads(line)


def _capture(n: int) -> list[dict]:
    return [_chat(f"r{i}", f"write function number {i}", answer=f"def f{i}(): return {i}") for i in range(n)]


def test_a_conversation_and_a_repeated_prompt_stay_on_one_side(tmp_path):
    records = _capture(40)
    # Turn 2 of conversation 3 carries turn 1's prompt and answer; prompt 5 is sent again under a new id.
    records.append(_chat("r3-turn2", "write function number 3", "now test it", answer="assert f3() == 3"))
    records.append(_chat("r5-again", "write function number 5", answer="def f5(): return 5"))
    parts = split(records, held_out_share=0.25)
    side = {r["request_id"]: "held" for r in parts.held_out} | {r["request_id"]: "train" for r in parts.training}
    assert side["r3"] == side["r3-turn2"] and side["r5"] == side["r5-again"]
    assert leaks(parts.training, parts.held_out) == set() and parts.left_out_for_leaks == ()
    assert len(parts.held_out) >= 10 and parts.conversations == 40
    # Negative control: a split by request puts turn 1 out and turn 2 (which holds it) in training; the check sees it.
    by_request_held = [r for r in records if r["request_id"] == "r3"]
    by_request_training = [r for r in records if r["request_id"] != "r3"]
    assert "r3-turn2" in leaks(by_request_training, by_request_held)


def test_a_training_request_that_quotes_a_held_out_one_is_left_out_and_counted():
    records = _capture(40)
    # A quoting request lands on either side (its root is its own); take a quote of a held-out prompt for which it
    # would be trained on.
    for held in split(records, held_out_share=0.25).held_out:
        quoting = _chat("quoting", f"a colleague asked: {held['messages'][-1]['content']}. Do it again")
        parts = split([*records, quoting], held_out_share=0.25)
        if held in parts.held_out and parts.left_out_for_leaks:
            break
    else:
        pytest.fail("no quote of a held-out prompt landed in training")
    assert parts.left_out_for_leaks == ("quoting",)
    assert "quoting" not in {r["request_id"] for r in parts.training + parts.held_out}
    assert parts.report()["training_left_out_for_leaks"] == 1


@pytest.mark.parametrize("n, message", [
    (1, "1 requests in 1 conversations give 0 to hold out and 1 to train on; allowed: at least 8 held out"),
    (20, "20 requests in 20 conversations give 4 to hold out and 16 to train on; allowed: at least 8 held out"),
])
def test_a_capture_too_small_to_hold_out_is_refused_with_the_counts(n, message):
    with pytest.raises(CaptureError, match=message):
        split(_capture(n), held_out_share=0.2)


def test_samples_are_the_target_tokenizers_own_ids(untrained, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(untrained.target)
    chat = _chat("c", "add two numbers", answer="def add(a, b): return a + b", finish="stop")
    cut = _chat("l", "add two numbers", answer="def add(a, b):", finish="length")
    completion = json.loads(format_record(config=CONFIG, request_id="p", route="/v1/completions", stream=True,
                                          request={"prompt": "def add("}, answer="a, b)", finish_reason="length",
                                          prompt_tokens=1, output_tokens=1))
    path = capture_samples.write_samples([chat, cut, completion], tokenizer, tmp_path / "samples.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    expected = tokenizer.apply_chat_template(chat["messages"], add_generation_prompt=True, tokenize=True)
    assert rows[0]["prompt_ids"] == list(expected if isinstance(expected, list) else expected["input_ids"])
    assert rows[0]["output_ids"][-1] == tokenizer.eos_token_id  # it ended by stop: the target emitted its end
    assert tokenizer.decode(rows[0]["output_ids"][:-1]) == chat["answer"]
    assert tokenizer.decode(rows[1]["output_ids"]) == cut["answer"]  # cut by length: no end token
    assert tokenizer.decode(rows[2]["prompt_ids"], skip_special_tokens=True) == "def add("
