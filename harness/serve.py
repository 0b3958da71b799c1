"""`make serve`: the serving runtime on 127.0.0.1:8080 on this machine's CPU, through the image's entrypoint.

Serves the trained demo pair when the cache holds it (``make demo-models``), otherwise the tiny random pair
(built in seconds). This process becomes the server (Ctrl-C or SIGTERM stops it); every finished request
prints its JSON metrics line on stdout. Options: --port, --k, --pair {auto,demo,tiny}, --max-model-len.
"""

from __future__ import annotations

import argparse
import os
import sys

from harness.runtime import LocalRuntime
from models.pair import ModelPair


def pick_pair(choice: str) -> tuple[str, ModelPair]:
    from models import demo_pair, tiny

    if choice in ("auto", "demo"):
        pair = demo_pair.existing_pair()
        if pair is not None:
            return "demo", pair
        if choice == "demo":
            raise SystemExit("serve: no trained demo pair in the cache; run `make demo-models` first")
    return "tiny", tiny.build()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (1..32)")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--pair", choices=("auto", "demo", "tiny"), default="auto")
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
