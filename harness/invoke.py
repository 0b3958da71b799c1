"""`make invoke`: one streamed request through /invocations (as SageMaker sends it); prints the answer and TTFT.

Options: --url (default http://127.0.0.1:8080), --prompt, --chat (send a chat body), --max-tokens.
"""

from __future__ import annotations

import argparse
import sys

from harness.client import InvocationError, stream_invocation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.invoke", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--chat", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    body: dict = {"max_tokens": args.max_tokens, "temperature": 0}
    if args.chat:
        body["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        body["prompt"] = args.prompt
    try:
        result = stream_invocation(args.url, body, on_text=lambda piece: print(piece, end="", flush=True))
    except ConnectionError:
        print(f"invoke: nothing listens on {args.url}; start it with `make serve`", file=sys.stderr)
        return 1
    except InvocationError as error:
        print(f"invoke: {error}", file=sys.stderr)
        return 1
    print(f"\nTTFT {result.ttft_s * 1000:.1f} ms, total {result.e2e_s * 1000:.1f} ms, {result.output_tokens} tokens, "
          f"{result.decode_tokens_per_s:.1f} tok/s after the first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
