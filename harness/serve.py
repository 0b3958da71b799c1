"""`make serve`: the serving runtime on 127.0.0.1:8080 on this machine's CPU, through the image's entrypoint.

Serves, the first the cache holds: SmolLM2-135M-Instruct with its P-EAGLE head (the benchmark's, else the
demo recipe's: ``make demo`` builds it), the toy pair (``make toy-models``), else the tiny random pair
(built in seconds). This process becomes the server (Ctrl-C or SIGTERM stops it); every finished request
prints its JSON metrics line on stdout. Options: --port, --k, --pair {auto,real,demo,tiny}, --max-model-len.
"""

from __future__ import annotations

import argparse
import os
import sys

from harness.runtime import LocalRuntime
from models.pair import ModelPair


def pick_pair(choice: str) -> tuple[str, ModelPair]:
    from models import toy_pair, real_pair, tiny

    if choice in ("auto", "real"):
        for recipe in ("bench", "demo"):
            pair = real_pair.existing(recipe)
            if pair is not None:
                return f"SmolLM2-135M-Instruct ({recipe} head)", pair
        if choice == "real":
            raise SystemExit("serve: no real pair in the cache; run `make demo` (or `python -m models.real_pair demo`)")
    if choice in ("auto", "demo"):
        pair = toy_pair.existing_pair()
        if pair is not None:
            return "demo", pair
        if choice == "demo":
            raise SystemExit("serve: no trained toy pair in the cache; run `make toy-models` first")
    return "tiny", tiny.build()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (1..32)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--pair", choices=("auto", "real", "demo", "tiny"), default="auto")
    args = parser.parse_args(argv)
    kind, pair = pick_pair(args.pair)
    runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, k=args.k, port=args.port,
                           max_model_len=args.max_model_len, served_model_name="peagle-local")
    env = runtime.environment()
    cmd = runtime.command(env)
    print(f"serve: {kind} pair, target {pair.target}, drafter {pair.drafter}, K={args.k}; "
          f"{runtime.base} once /ping answers (about a minute)", file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
