"""`make serve`: the serving runtime on 127.0.0.1:8080 on this machine's CPU, through the image's entrypoint.

Uses the trained demo pair when tools.demo_models has one cached (``make demo-models``), otherwise the
tiny random pair (built in seconds). The process becomes the server (Ctrl-C or SIGTERM stops it). Every
finished request prints its JSON metrics line on stdout. Options: --port, --k, --pair {auto,demo,tiny}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tools import tiny_models

CPU_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1"}


def pick_pair(choice: str):
    if choice in ("auto", "demo"):
        try:
            from tools import demo_models
        except ImportError:
            demo_models = None
        pair = demo_models.existing_pair() if demo_models is not None else None
        if pair is not None:
            return "demo", pair
        if choice == "demo":
            raise SystemExit("serve_local: no trained demo pair in the cache; run `make demo-models` first")
    return "tiny", tiny_models.build()


def environment(pair, *, port: int, k: int, max_model_len: int) -> dict[str, str]:
    env = {**CPU_DEFAULTS, **os.environ}
    env.update({
        "PEAGLE_HOST": "127.0.0.1",
        "PEAGLE_PORT": str(port),
        "SM_VLLM_MODEL": str(pair.target),
        "SM_VLLM_SPECULATIVE_CONFIG": json.dumps(pair.speculative_config(k=k), separators=(",", ":")),
        "SM_VLLM_DTYPE": "float32",
        "SM_VLLM_ENFORCE_EAGER": "true",  # torch.compile would double the start time on a CPU
        "SM_VLLM_MAX_MODEL_LEN": str(max_model_len),
        "SM_VLLM_SERVED_MODEL_NAME": "peagle-local",
    })
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (1..32)")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--pair", choices=("auto", "demo", "tiny"), default="auto")
    args = parser.parse_args(argv)
    kind, pair = pick_pair(args.pair)
    print(f"serve_local: {kind} pair, target {pair.target}, drafter {pair.drafter}, K={args.k}; "
          f"http://127.0.0.1:{args.port} once /ping answers (about a minute)", file=sys.stderr, flush=True)
    os.environ.clear()
    os.environ.update(environment(pair, port=args.port, k=args.k, max_model_len=args.max_model_len))
    from peagle_runtime.entrypoint import main as serve

    return serve(["serve"])


if __name__ == "__main__":
    sys.exit(main())
