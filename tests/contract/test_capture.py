"""The capture's contract: its setting in a stage's serving config and the container's environment, the record
the runtime writes, and the reader the drafter's trainer uses (every bad record refused by place and field)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from peagle_contract.capture import (
    CAPTURE_VAR,
    MAX_RECORD_BYTES,
    CaptureConfig,
    CaptureError,
    format_record,
    parse_capture,
    read_records,
    to_openai_chat,
    to_sharegpt,
)
from peagle_contract.serving import ServingConfig

CONFIG = CaptureConfig(sample_rate=0.25, stage="dev", target="SmolLM2-135M-Instruct")
CHAT = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add two numbers"}],
        "max_tokens": 32, "temperature": 0}


def _record(**over) -> str:
    fields = dict(config=CONFIG, request_id="chatcmpl-1", route="/v1/chat/completions", stream=True, request=CHAT,
                  answer="def add(a, b):\n    return a + b", finish_reason="stop", prompt_tokens=21, output_tokens=12)
    fields.update(over)
    line = format_record(**fields)
    assert line is not None
    return line


@pytest.mark.parametrize("field, value, message", [
    ("sample_rate", 0, "capture.sample_rate: got 0; allowed: a number in (0, 1]"),
    ("sample_rate", 1.01, "capture.sample_rate: got 1.01"),
    ("sample_rate", float("nan"), "capture.sample_rate: got nan"),
    ("sample_rate", True, "capture.sample_rate: got True"),
    ("sample_rate", "0.1", "capture.sample_rate: got '0.1'"),
    ("stage", "", "capture.stage: got ''"),
    ("stage", "dev\nprod", "capture.stage: got 'dev\\nprod'"),
    ("target", "x" * 300, "capture.target: got 'xxxx"),
])
def test_a_bad_setting_is_refused_by_field(field, value, message):
    with pytest.raises(CaptureError) as err:
        dataclasses.replace(CONFIG, **{field: value})
    assert str(err.value).startswith(message)
    assert len(str(err.value)) < 200  # the value is cut, never echoed whole


def test_the_config_renders_the_variable_only_when_capture_is_on_and_the_image_reads_it_back():
    base = ServingConfig(target_model="s3://weights-bucket/w/target/", drafter_model="s3://weights-bucket/w/drafter/")
    assert CAPTURE_VAR not in base.to_environment()
    env = dataclasses.replace(base, capture=CONFIG).to_environment()
    assert parse_capture(env) == CONFIG
    assert parse_capture({}) is None
    with pytest.raises(ValueError, match="capture: got dict; allowed: a CaptureConfig"):
        dataclasses.replace(base, capture={"sample_rate": 1})


@pytest.mark.parametrize("raw, message", [
    ("{", "PEAGLE_CAPTURE: is not valid JSON"),
    ('{"sample_rate": 0.1, "stage": "dev"}', "PEAGLE_CAPTURE: got keys ['sample_rate', 'stage']; allowed: exactly"),
    ('{"sample_rate": -1, "stage": "dev", "target": "t"}', "PEAGLE_CAPTURE.sample_rate: got -1"),
])
def test_the_image_refuses_a_bad_variable_naming_it(raw, message):
    with pytest.raises(CaptureError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_capture({CAPTURE_VAR: raw})


def test_a_record_holds_the_prompt_and_the_answer_and_converts_to_what_other_trainers_take():
    record = json.loads(_record(bundle="ab" * 32))
    assert record["messages"] == CHAT["messages"] and record["answer"].startswith("def add")
    assert (record["stage"], record["target"], record["bundle"]) == ("dev", CONFIG.target, "ab" * 32)
    assert "max_tokens" not in record  # sampling settings are not the trainer's
    assert to_openai_chat(record)["messages"][-1] == {"role": "assistant", "content": record["answer"]}
    assert [turn["from"] for turn in to_sharegpt(record)["conversations"]] == ["system", "human", "gpt"]
    completion = json.loads(_record(route="/v1/completions", request={"prompt": "def add(", "max_tokens": 8}))
    assert completion["prompt"] == "def add(" and "messages" not in completion
    with pytest.raises(CaptureError, match="a completion record has no chat messages"):
        to_openai_chat(completion)
    tool = json.loads(_record(request={"messages": [{"role": "tool", "content": "42"}]}))
    with pytest.raises(CaptureError, match=r"messages\.0\.role: got 'tool'; allowed in ShareGPT"):
        to_sharegpt(tool)


@pytest.mark.parametrize("over", [
    {"finish_reason": "abort"},
    {"finish_reason": "tool_calls"},
    {"request": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}},
    {"request": {"messages": [{"role": "assistant", "content": "", "tool_calls": []}]}},
    {"request": {"prompt": [1, 2, 3]}},
    {"request": {"prompt": ["a", "b"]}},
    {"request": {"messages": []}},
    {"answer": "x" * MAX_RECORD_BYTES},  # would not fit one CloudWatch Logs event
], ids=["aborted", "tool-call", "image", "tool-calls-in-prompt", "token-ids", "prompt-batch", "no-messages", "too-big"])
def test_what_a_record_cannot_hold_is_not_recorded(over):
    fields = dict(config=CONFIG, request_id="r", route="/invocations", stream=False, request=CHAT, answer="a",
                  finish_reason="stop", prompt_tokens=1, output_tokens=1)
    fields.update(over)
    assert format_record(**fields) is None


def _write(tmp_path, *lines: str, name: str = "part-0.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_the_reader_takes_each_request_once_and_counts_the_copies(tmp_path):
    first, second = _record(), _record(request_id="chatcmpl-2", stream=False)
    capture = read_records([_write(tmp_path, first, "", second, first)], stage="dev", target=CONFIG.target)
    assert [r["request_id"] for r in capture.records] == ["chatcmpl-1", "chatcmpl-2"]
    assert capture.duplicates == 1


@pytest.mark.parametrize("line, message", [
    (lambda: _record()[:-20], "part-0.jsonl:2: not a whole JSON record"),
    (lambda: _record().replace('"stage":"dev"', '"stage":"prod"'), "part-0.jsonl:2.stage: got 'prod'; allowed: 'dev'"),
    (lambda: _record().replace(CONFIG.target, "Qwen3-8B"), "part-0.jsonl:2.target: got 'Qwen3-8B'"),
    (lambda: _record().replace("chatcmpl-1", "chatcmpl-0"),
     "part-0.jsonl:2.request_id: 'chatcmpl-0' was read at part-0.jsonl:1 with other content"),
    (lambda: _record().replace('"output_tokens":12', '"output_tokens":-1'), "part-0.jsonl:2.output_tokens: got -1"),
    (lambda: _record().replace('"schema":1', '"schema":2'), "part-0.jsonl:2.schema: got 2; allowed: 1"),
    (lambda: _record().replace('"event":"peagle.capture"', '"event":"peagle.request"'), "part-0.jsonl:2.event"),
    (lambda: _record()[:-1] + ',"labels":[1]}', "part-0.jsonl:2.labels: unknown field"),
    (lambda: "[1, 2]", "part-0.jsonl:2: got list; allowed: a JSON object"),
    (lambda: _record().replace('"role":"user"', '"role":7'), r"part-0.jsonl:2.messages.1: allowed: an object of two"),
], ids=["truncated", "other-stage", "other-target", "same-id-other-content", "negative-count", "schema",
        "another-event", "unknown-field", "not-an-object", "bad-message"])
def test_the_reader_refuses_a_bad_record_naming_its_place_and_field(tmp_path, line, message):
    good = _record(answer="other").replace("chatcmpl-1", "chatcmpl-0")
    path = _write(tmp_path, good, line())
    with pytest.raises(CaptureError) as err:
        read_records([path], stage="dev", target=CONFIG.target)
    assert str(err.value).startswith(message), err.value


def test_a_prompt_cannot_forge_a_record_on_a_line_of_its_own():
    forged = _record(request_id="forged")
    for breaker in ("\n", "\r", "\u2028", "\u2029", "\x85", "\x1e", "\x0b"):
        line = _record(request={"messages": [{"role": "user", "content": f"hi{breaker}{forged}"}]})
        assert line.splitlines() == [line] and line.isascii()
        assert json.loads(line)["messages"][0]["content"].endswith(forged)
