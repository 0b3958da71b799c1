"""Drafter latency versus K: one P-EAGLE pass over K rows vs K sequential EAGLE passes (torch only).

    python3 -m bench.drafter_vs_k            # on a CUDA machine: Llama-8B-shaped 4-layer drafter, bf16
    python3 -m bench.drafter_vs_k --smoke    # here, on the CPU: tiny fp32 drafter, a run check only

The drafter is Llama-shaped (RMSNorm, RoPE, grouped-query attention over a KV cache, SwiGLU MLP, LM head)
with random weights: timing only. Each request has a context of --context tokens already in the drafter's KV
cache. "parallel" runs one forward over K new rows per request (causal among themselves) and samples all K
greedily; "sequential" runs K forwards of one row, feeding each argmax back as the next input, as EAGLE does.
Timed per draft step (CUDA events on a GPU, wall clock on the CPU), median of --iters.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DrafterShape:
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    layers: int = 4
    vocab: int = 32000

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class Drafter(torch.nn.Module):
    def __init__(self, shape: DrafterShape, *, max_len: int, batch: int, device, dtype) -> None:
        super().__init__()
        s = self.shape = shape
        mk = lambda *size: torch.nn.Parameter(torch.randn(*size, device=device, dtype=dtype) * 0.02,  # noqa: E731
                                               requires_grad=False)
        self.embed = mk(s.vocab, s.hidden)
        self.layers = [dict(
            norm1=torch.ones(s.hidden, device=device, dtype=dtype),
            qkv=mk((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
            o=mk(s.hidden, s.heads * s.head_dim),
            norm2=torch.ones(s.hidden, device=device, dtype=dtype),
            gate_up=mk(2 * s.intermediate, s.hidden),
            down=mk(s.hidden, s.intermediate),
        ) for _ in range(s.layers)]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = mk(s.vocab, s.hidden)
        # KV cache per layer: [batch, kv_heads, max_len, head_dim]
        self.k_cache = [torch.randn(batch, s.kv_heads, max_len, s.head_dim, device=device, dtype=dtype)
                        for _ in range(s.layers)]
        self.v_cache = [torch.randn_like(c) for c in self.k_cache]
        inv = 1.0 / (10000 ** (torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim))
        self.inv_freq = inv

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        ang = pos[:, None].float() * self.inv_freq[None, :]  # [T, d/2]
        cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]  # [T, 1, d/2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """tokens [B, T] at positions start..start+T-1; returns greedy next tokens [B, T]."""
        s, (b, t) = self.shape, tokens.shape
        pos = torch.arange(start, start + t, device=tokens.device)
        x = self.embed[tokens]
        for i, layer in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,), layer["norm1"])
            q, k, v = (h @ layer["qkv"].T).split([s.heads * s.head_dim, s.kv_heads * s.head_dim,
                                                  s.kv_heads * s.head_dim], dim=-1)
            q = self._rope(q.view(b, t, s.heads, s.head_dim), pos).transpose(1, 2)
            k = self._rope(k.view(b, t, s.kv_heads, s.head_dim), pos).transpose(1, 2)
            self.k_cache[i][:, :, start:start + t] = k
            self.v_cache[i][:, :, start:start + t] = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            keys, values = self.k_cache[i][:, :, :start + t], self.v_cache[i][:, :, :start + t]
            # causal among the new rows, full view of the context
            mask = torch.ones(t, start + t, dtype=torch.bool, device=tokens.device).tril(diagonal=start)
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, t, -1) @ layer["o"].T
            h = F.rms_norm(x, (s.hidden,), layer["norm2"])
            gate, up = (h @ layer["gate_up"].T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"].T
        return (F.rms_norm(x, (s.hidden,), self.norm) @ self.lm_head.T).argmax(-1)


def parallel_step(model: Drafter, first: torch.Tensor, k: int, context: int, mask_token: int) -> torch.Tensor:
    tokens = torch.cat([first[:, None], torch.full((first.shape[0], k - 1), mask_token, device=first.device,
                                                   dtype=first.dtype)], dim=1)
    return model(tokens, context)


def sequential_step(model: Drafter, first: torch.Tensor, k: int, context: int) -> torch.Tensor:
    out, tok = [], first[:, None]
    for i in range(k):
        tok = model(tok, context + i)
        out.append(tok)
    return torch.cat(out, dim=1)


def timed(fn, iters: int, warmup: int, cuda: bool) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.drafter_vs_k", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny fp32 drafter: a run check, not a benchmark")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 5, 7, 10, 16])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        sys.exit("bench/drafter_vs_k.py needs a CUDA GPU; use --smoke for a CPU run check")
    if args.smoke:
        shape, dtype, device = DrafterShape(hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=512), \
            torch.float32, "cpu"
        args.batches, args.ks, args.context, args.iters, args.warmup = [1, 4], [1, 4, 8], 64, 5, 1
        torch.set_num_threads(1)
    else:
        shape, dtype, device = DrafterShape(), torch.bfloat16, "cuda"
    out_path = args.out or REPO / "bench" / "results" / ("drafter_vs_k-cpu-smoke.json" if args.smoke
                                                         else "drafter_vs_k.json")
    torch.manual_seed(0)
    rows = []
    for b in args.batches:
        model = Drafter(shape, max_len=args.context + max(args.ks) + 1, batch=b, device=device, dtype=dtype)
        first = torch.randint(0, shape.vocab, (b,), device=device)
        for k in args.ks:
            par = timed(lambda: parallel_step(model, first, k, args.context, shape.vocab - 1), args.iters, args.warmup, cuda)
            seq = timed(lambda: sequential_step(model, first, k, args.context), args.iters, args.warmup, cuda)
            rows.append({"batch": b, "k": k, "parallel_us": round(par, 1), "sequential_us": round(seq, 1),
                         "sequential_over_parallel": round(seq / par, 2)})
            r = rows[-1]
            print(f"B={b:>3} K={k:>2}  parallel {r['parallel_us']:>10.1f} us  sequential {r['sequential_us']:>10.1f} us"
                  f"  x{r['sequential_over_parallel']}", flush=True)
        model = None  # frees the last batch size's weights before the next one is built
    env = {"mode": "gpu" if cuda else "cpu-smoke (tiny drafter on the CPU: NOT a performance figure for a GPU)",
           "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or 'cpu'}, 1 thread)",
           "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."), "shape": asdict(shape),
           "context": args.context, "iters": args.iters, "statistic": "median per draft step, microseconds"}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(f"\n{env['mode']} on {env['device']}; wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
