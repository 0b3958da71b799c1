"""`make serve`: the serving runtime on 127.0.0.1:8080 on this machine's CPU, through the image's entrypoint.

Serves, the first the cache holds: SmolLM2-135M-Instruct with its P-EAGLE head (the benchmark's, else the
demo recipe's: ``make demo`` builds it), the toy pair (``make toy-models``), else the random pair
(built in seconds). This process becomes the server (Ctrl-C or SIGTERM stops it); every finished request
prints its JSON metrics line on stdout. Options: --port, --k (default: the K the head was trained for, else the
serving contract's), --pair {auto,real,toy,random}, --max-model-len.
"""

from __future__ import annotations

import argparse
import os
import sys

from harness.runtime import LocalRuntime, local_serving
from models.pair import ModelPair


def pick_pair(choice: str) -> tuple[str, ModelPair]:
    from models import toy_pair, real_pair, random_pair

    if choice in ("auto", "real"):
        for recipe in ("bench", "demo"):
            pair = real_pair.existing(recipe)
            if pair is not None:
                return f"SmolLM2-135M-Instruct ({recipe} head)", pair
        if choice == "real":
            raise SystemExit("serve: no real pair in the cache; run `make demo` (or `python -m models.real_pair demo`)")
    if choice in ("auto", "toy"):
        pair = toy_pair.existing_pair()
        if pair is not None:
            return "toy", pair
        if choice == "toy":
            raise SystemExit("serve: no trained toy pair in the cache; run `make toy-models` first")
    return "random", random_pair.build()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--k", type=int, default=None, help="draft tokens per step (1..32; default: the head's "
                                                             "trained K, else the serving contract's)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--pair", choices=("auto", "real", "toy", "random"), default="auto")
    args = parser.parse_args(argv)
    kind, pair = pick_pair(args.pair)
    serving = local_serving(num_speculative_tokens=args.k or pair.trained_k(), max_model_len=args.max_model_len,
                            served_model_name="peagle-local")
    runtime = LocalRuntime(target=pair.target, drafter=pair.drafter, serving=serving, port=args.port)
    env = runtime.environment()
    cmd = runtime.command(env)
    print(f"serve: {kind} pair, target {pair.target}, drafter {pair.drafter}, K={serving.num_speculative_tokens}; "
          f"{runtime.base} once /ping answers (about a minute)", file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
