"""The traffic bench/traffic_loop.py sends: requests the head in service was not trained on, none of them holding
a function it was trained on or anything of HumanEval (the benchmark's held-out set)."""

from __future__ import annotations

from bench import traffic_loop
from models.trainer import coding_tasks


def test_the_traffic_leaves_out_the_heads_training_functions_and_humaneval():
    trained = traffic_loop._trained_names("demo")
    requests = traffic_loop.traffic(120, exclude=trained)
    texts = [messages[0]["content"] for messages in requests]
    assert len(texts) == len(set(texts)) == 120
    names = {text.split("def ", 1)[1].split("(", 1)[0] for text in texts}
    assert not names & trained
    assert not names & {t.name for t in coding_tasks.humaneval_tasks()}
    assert coding_tasks.leaks(texts) == []
    # The task differs from the head's training (code): each asks for an explanation in words.
    assert all(text.startswith(traffic_loop.INSTRUCTION) for text in texts)
    assert not any(text.startswith(coding_tasks.INSTRUCTION) for text in texts)
