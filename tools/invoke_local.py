"""`make invoke`: one streamed request through /invocations (as SageMaker sends it); print the answer and TTFT.

Options: --url (default http://127.0.0.1:8080), --prompt, --chat (send a chat body), --max-tokens.
Time to first token is measured here, at the client: request sent -> first event carrying output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import httpx


def invoke(url: str, body: dict, out=sys.stdout) -> dict:
    sent = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    with httpx.Client(timeout=300) as client, client.stream("POST", url.rstrip("/") + "/invocations", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"invoke_local: HTTP {r.status_code}: {r.text}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece:
                    first = first or time.perf_counter()
                    pieces.append(piece)
                    out.write(piece)
                    out.flush()
    done = time.perf_counter()
    out.write("\n")
    ttft = ((first or done) - sent) * 1000
    return {"ttft_ms": round(ttft, 1), "e2e_ms": round((done - sent) * 1000, 1), "chunks": len(pieces)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--chat", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    body: dict = {"max_tokens": args.max_tokens, "temperature": 0, "stream": True}
    if args.chat:
        body["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        body["prompt"] = args.prompt
    try:
        stats = invoke(args.url, body)
    except httpx.ConnectError:
        print(f"invoke_local: nothing listens on {args.url}; start it with `make serve`", file=sys.stderr)
        return 1
    print(f"TTFT {stats['ttft_ms']} ms, total {stats['e2e_ms']} ms, {stats['chunks']} chunks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
