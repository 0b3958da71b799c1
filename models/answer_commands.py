"""The command line for a recipe's committed answers: generate them (resuming at the first missing shard) or
verify them against the recipe's task list.

    python -m models.answer_commands generate|verify [recipe]    (default: verify bench)

Apart from models/answer_shards.py (the shard format, which the recipes read) so that the recipes and the shards
do not import each other: this module reads both.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from models.answer_shards import ANSWERS_DIR, Header, ShardError, generate, target_files_sha256, tasks_sha256, verify


def recipe_header(name: str, target: Path) -> tuple[Header, list]:
    """The header and task messages of real-pair recipe ``name`` on ``target``."""
    import vllm

    from models import real_pair, smollm2

    recipe = real_pair.RECIPES[name].data
    messages = real_pair.training_messages(recipe)
    wheel = smollm2.wheel()
    header = Header(recipe=name, tasks=len(messages), tasks_sha256=tasks_sha256(messages),
                    max_tokens=recipe.max_tokens, target_wheel=smollm2.WHEEL_REQUIREMENT,
                    target_wheel_sha256=smollm2.sha256(wheel), target_files=target_files_sha256(target),
                    vllm=vllm.__version__)
    return header, messages


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, name = (args + ["bench"])[:2] if args else ("verify", "bench")
    folder = ANSWERS_DIR / name
    try:
        if command == "generate":
            from models import smollm2

            if hasattr(os, "nice"):
                os.nice(10)  # a long CPU job on a shared machine
            target = smollm2.build()
            header, messages = recipe_header(name, target)
            manifest = generate(folder, header, target, messages)
        elif command == "verify":
            from models import real_pair

            manifest = verify(folder, messages=real_pair.training_messages(real_pair.RECIPES[name].data))
        else:
            print(f"answer_commands: got {command!r}; allowed: generate, verify", file=sys.stderr)
            return 2
    except ShardError as exc:
        print(f"answer_commands: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"folder": folder.name, "shards": len(manifest["shards"]),
                      "answered": sum(s["answered"] for s in manifest["shards"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
