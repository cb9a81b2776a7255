"""Benchmark the `cuda` backend on a real GPU: every op at 2^28 elements against copy bandwidth and PyTorch.

For float32 and float16, forward and grad of every op: multiact into a
preallocated `out` (and allocating), PyTorch's own CUDA kernel (aten's
backward kernels for the grads), and a device-to-device copy of the same
bytes as the bandwidth ceiling.  Then the launch overhead of one call on 1K
elements, multiact against torch.  Times are CUDA-event medians.  Writes
gpu-bench.json and gpu-bench.md to --out.  Each op is guarded: one failure
is recorded and the run goes on.

    python scripts/gpu_bench.py --out results [--n 268435456] [--ops relu,gelu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

PARAMS = {"threshold": {"threshold": 0.1, "value": 0.0}}


def _torch_baselines(torch):
    """(forward, backward) per op: PyTorch's own CUDA kernels (the op's definition's torch spelling, through
    multiact.cli.peers); the backward None where torch has no kernel; where torch's backward starts from y
    (sigmoid, tanh) it is timed from y = op(x), as autograd does.  The ops torch has no function for are left out."""
    from multiact.cli import peers
    from multiact.optable import OPS

    base = {}
    for op in OPS:
        if op not in peers.TORCH_OPS:
            continue
        spec = OPS[op]
        kernels = peers.torch_kernels(torch, op, spec.validate(dict(PARAMS.get(op, {}))))
        fwd = kernels["fwd"][0]
        bwd = kernels["bwd"][0] if "bwd" in kernels else None
        if bwd is None and "bwd_y" in kernels:
            bwd = (lambda by, f: lambda dy, x: by(dy, f(x)))(kernels["bwd_y"][0], fwd)
        base[op] = (fwd, bwd)
    return base


def _time_ms(torch, fn, reps: int) -> float:
    """Median of `reps` CUDA-event timings after two warm-up calls (the first one compiles)."""
    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _overhead_us(torch, fn, calls: int = 2000) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "results")
    ap.add_argument("--n", type=int, default=1 << 28)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", default="")
    ap.add_argument("--dtypes", default="float32,float16")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import torch

    import multiact as ma
    from multiact import vocab
    from multiact.optable import OPS

    dev = torch.device("cuda")
    cuda_info = {b.name: b for b in ma.backends()}["cuda"]
    env = {
        "gpu": torch.cuda.get_device_name(0),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "multiact_cuda": f"{cuda_info.available}: {cuda_info.reason}",
        "numba_cuda": cuda_info.details.get("numba_cuda"),
        "n": args.n,
    }
    print(json.dumps(env), flush=True)
    base = _torch_baselines(torch)
    ops = [o for o in (args.ops.split(",") if args.ops else OPS)]
    rows, copy_bw, failures = [], {}, []
    t_start = time.time()
    for dname in vocab.dtypes(args.dtypes.split(",")):  # any spelling multiact's commands take
        dtype = getattr(torch, dname)
        item = torch.empty(0, dtype=dtype).element_size()
        x = (torch.randn(args.n, device=dev) * 3).to(dtype)
        dy = torch.randn(args.n, device=dev).to(dtype)
        out = torch.empty_like(x)
        ms = _time_ms(torch, lambda out=out, x=x: out.copy_(x), args.reps)
        copy_bw[dname] = 2 * args.n * item / ms / 1e6  # GB/s, read + write
        print(f"{dname}: device-to-device copy {copy_bw[dname]:.0f} GB/s", flush=True)
        w = torch.tensor([0.25], device=dev, dtype=dtype)
        for op in ops:
            rows += _bench_op(torch, ma, base, op, dname, x, dy, out, w, args, copy_bw[dname], failures)
        x = dy = out = None
        torch.cuda.empty_cache()

    overhead = {}
    try:
        small = torch.randn(1024, device=dev)
        o = torch.empty_like(small)
        overhead = {
            "multiact_relu_us": _overhead_us(torch, lambda: ma.relu(small)),
            "multiact_relu_out_us": _overhead_us(torch, lambda: ma.relu(small, out=o)),
            "multiact_gelu_grad_us": _overhead_us(torch, lambda: ma.gelu_grad(small, small)),
            "torch_relu_us": _overhead_us(torch, lambda: torch.relu(small)),
            "torch_gelu_backward_us": _overhead_us(torch, lambda: torch.ops.aten.gelu_backward(small, small)),
        }
    except Exception as e:
        overhead = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps({"launch_overhead_1k": overhead}), flush=True)

    result = {"env": env, "copy_GBps": copy_bw, "rows": rows, "launch_overhead_1k": overhead,
              "failures": failures, "wall_s": round(time.time() - t_start, 1)}
    with open(os.path.join(args.out, "gpu-bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "gpu-bench.md"), "w") as f:
        f.write(_markdown(result))
    print(_markdown(result))
    return 1 if failures else 0


def _bench_op(torch, ma, base, op, dname, x, dy, out, w, args, copy, failures) -> list[dict]:
    """Forward and grad of one op in one dtype: ours (out= and allocating), torch's, bandwidth."""
    item = x.element_size()
    from multiact.optable import OPS

    kw = dict(PARAMS.get(op, {}))
    array = OPS[op].defn.array_param
    if array:  # one weight (prelu's)
        kw[array] = w
    tf, tb = base.get(op, (None, None))
    cases = [
        ("forward", 2, lambda: ma.forward(op, x, out=out, **kw), lambda: ma.forward(op, x, **kw),
         None if tf is None else (lambda: tf(x))),
        ("backward", 3, lambda: ma.backward(op, dy, x, out=out, **kw), lambda: ma.backward(op, dy, x, **kw),
         None if tb is None else (lambda: tb(dy, x))),
    ]
    rows = []
    for direction, arrays, ours, ours_alloc, theirs in cases:
        row = {"op": op, "dtype": dname, "direction": direction}
        try:
            t0 = time.time()
            ours()
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.time() - t0, 3)
            row["ms"] = _time_ms(torch, ours, args.reps)
            row["ms_alloc"] = _time_ms(torch, ours_alloc, args.reps)
            row["GBps"] = arrays * args.n * item / row["ms"] / 1e6
            row["pct_copy"] = 100 * row["GBps"] / copy
            if theirs is not None:
                row["torch_ms"] = _time_ms(torch, theirs, args.reps)
                row["vs_torch"] = row["torch_ms"] / row["ms"]
        except Exception as e:  # record and go on
            row["error"] = f"{type(e).__name__}: {e}"
            failures.append(f"{op} {direction} {dname}: {traceback.format_exc(limit=3)}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _markdown(r: dict) -> str:
    env = r["env"]
    lines = [
        f"# multiact cuda backend on {env['gpu']} ({env['host']})",
        "",
        f"n = {env['n']} elements; torch {env['torch']}, numba-cuda {env['numba_cuda']}; "
        f"copy: " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in r["copy_GBps"].items()),
        "",
        "Floors (issue 4): >= 85% of copy bandwidth, and no slower than torch (vs torch >= 1).",
        "",
        "| op | dtype | direction | ms (out=) | ms (alloc) | GB/s | % copy | torch ms | vs torch | floors |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in r["rows"]:
        if "error" in row:
            lines.append(f"| {row['op']} | {row['dtype']} | {row['direction']} | error: {row['error'][:80]} |||||||")
            continue
        ok = row["pct_copy"] >= 85 and row.get("vs_torch", 1.0) >= 1.0
        tms = f"{row['torch_ms']:.3f}" if "torch_ms" in row else "n/a"
        vs = f"{row['vs_torch']:.2f}" if "vs_torch" in row else "n/a"
        lines.append(
            f"| {row['op']} | {row['dtype']} | {row['direction']} | {row['ms']:.3f} | {row['ms_alloc']:.3f} | "
            f"{row['GBps']:.0f} | {row['pct_copy']:.0f} | {tms} | {vs} | {'ok' if ok else 'MISSED'} |"
        )
    lines += ["", "Launch overhead, 1K float32 elements (us per call, host side):", ""]
    lines += [f"- {k}: {v:.1f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in r["launch_overhead_1k"].items()]
    lines += ["", f"wall time {r['wall_s']} s; failures: {len(r['failures'])}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
