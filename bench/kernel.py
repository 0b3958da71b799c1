"""GPU benchmark: the fused parallel-draft input kernel vs the upstream-style sequence of launches.

    python3 -m bench.kernel                 # on a CUDA machine (an H200 for the issue's goal); torch + triton only
    python3 -m bench.kernel --smoke         # here, on the CPU: Triton interpreter, tiny shapes, timings meaningless

Decode-shaped batches: every request verified K drafts (K+1 input rows) and a random number of them was
rejected; bf16 hidden rows, block size 16. Both sides write into preallocated buffers (as vLLM's proposer
does) and get the host-side max_query_len, so neither syncs. Each timed iteration is bracketed by CUDA events
on the stream, so gaps between the staged sequence's launches count (they are real decode-step latency);
the figure is the median over --iters iterations after --warmup. Outputs of both sides are compared bit for
bit on every shape. Goal from issue 5: fused >= 3x faster at decode shapes on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.kernel", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU + Triton interpreter, tiny shapes (a run check, not a benchmark)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ks", type=int, nargs="+", default=[3, 7, 16])
    p.add_argument("--hiddens", type=int, nargs="+", default=[2880, 4096, 5120])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kernel.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.batches, args.ks, args.hiddens = [1, 4], [3, 7], [64, 160]
        args.iters, args.warmup = 3, 1
        if args.out == REPO / "bench" / "results" / "kernel.json":
            args.out = REPO / "bench" / "results" / "kernel-cpu-smoke.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.smoke and not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("--smoke on a CPU needs TRITON_INTERPRET=1 before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"  # before the first `import triton` (in the kernel modules)
    elif not torch.cuda.is_available():
        sys.exit("bench/kernel.py needs a CUDA GPU; use --smoke for a CPU run check")
    try:
        import peagle_runtime  # noqa: F401
    except ImportError:  # a bare GPU machine: use the checkout's runtime package without installing it
        sys.path.insert(0, str(REPO / "runtime"))
    import triton

    from peagle_runtime.kernels.draft_io import DraftInputs, DraftSpec
    from peagle_runtime.kernels.fused import build_draft_inputs_fused
    from bench.staged_baseline import build_draft_inputs_staged
    from peagle_runtime.kernels.synthetic import make_batch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    rows = []
    for hidden in args.hiddens:
        for k in args.ks:
            for b in args.batches:
                spec = DraftSpec(num_slots=k, mask_token_id=128_000, block_size=16, max_model_len=8192)
                g = torch.Generator().manual_seed(b * 1000 + k)
                rejected = torch.randint(0, k + 1, (b,), generator=g).tolist()
                firsts = torch.randint(100, 4000, (b,), generator=g).tolist()
                batch = make_batch(query_lens=[k + 1] * b, num_rejected=rejected, first_positions=firsts,
                                   spec=spec, hidden_size=hidden, dtype=dtype, device=device,
                                   vocab_size=128_000, seed=b + k + hidden)
                outs = {}
                for name in ("fused", "staged"):
                    out = DraftInputs.empty(batch, spec)
                    out.hidden_states.normal_()  # the proposer's buffers hold old rows: same junk both sides
                    outs[name] = out
                outs["staged"].hidden_states.copy_(outs["fused"].hidden_states)
                runs = {
                    "fused": lambda: build_draft_inputs_fused(batch=batch, spec=spec, max_query_len=k + 1,
                                                              out=outs["fused"]),
                    "staged": lambda: build_draft_inputs_staged(batch=batch, spec=spec, max_query_len=k + 1,
                                                                out=outs["staged"]),
                }
                times = {name: _time(fn, args.iters, args.warmup, device) for name, fn in runs.items()}
                identical = all(
                    _same_bits(a, outs["staged"].fields()[field]) for field, a in outs["fused"].fields().items()
                )
                med_f, med_s = statistics.median(times["fused"]), statistics.median(times["staged"])
                rows.append({"batch": b, "k": k, "hidden": hidden, "fused_us": round(med_f, 2),
                             "staged_us": round(med_s, 2), "speedup": round(med_s / med_f, 2),
                             "identical": identical, "input_rows": batch.num_input_rows,
                             "output_rows": batch.num_output_rows(spec)})
                print(_fmt(rows[-1]), flush=True)

    env = {"device": torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'cpu'})",
           "mode": "gpu" if device == "cuda" else "cpu-smoke (TRITON_INTERPRET=1: timings are NOT performance figures)",
           "torch": torch.__version__, "triton": triton.__version__, "dtype": args.dtype,
           "iters": args.iters, "warmup": args.warmup, "statistic": "median per iteration, microseconds"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(f"\n{env['mode']} on {env['device']}; all identical: {all(r['identical'] for r in rows)}; "
          f"wrote {args.out}")
    return 0 if all(r["identical"] for r in rows) else 1


def _time(fn, iters: int, warmup: int, device: str) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    out = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1000.0)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
    return out


def _same_bits(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _fmt(r: dict) -> str:
    return (f"B={r['batch']:>4} K={r['k']:>2} H={r['hidden']:>5}  fused {r['fused_us']:>10.1f} us  "
            f"staged {r['staged_us']:>10.1f} us  x{r['speedup']:<6} identical={r['identical']}")


if __name__ == "__main__":
    sys.exit(main())
