"""native bfloat16 against native float16 and torch bfloat16: 16M elements, 1 thread, into preallocated outputs.

The issue's floor (18): native bf16 at most 1.1x native float16 on every op, forward and backward, and faster
than torch's bf16 kernels (aten's out= forms, the same work with no allocation).  Rounds interleave the three
(each round times every variant once, in a rotated order); the median per variant and the ratios of medians
are printed with the CPU and the load.

With --fresh every timed call reads and writes arrays allocated for it (inputs copied in, the output
touched first): at 16M the same kernel on the same values reads one allocation up to 30% slower than
another here (a copy of x against x itself; this VM shows no transparent huge pages), so one fixed
set of arrays per variant can decide a ratio by where its pages landed.

usage: python benchmarks/bench_bf16_native.py [--n 16777216] [--rounds 15] [--ops sigmoid,gelu,...] [--fresh]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from multiact import registry, set_num_threads
from multiact.dtypes import f32_bits_to_bf16


def _cpu() -> str:
    """The one-line CPU identity every benchmark header carries (multiact.tools.sysinfo)."""
    from multiact.tools.sysinfo import cpu

    return cpu()["summary"]


TORCH = {  # op -> (forward(x, out), backward(dy, x, y, out)) on aten's out= overloads
    "sigmoid": (lambda t, x, o: t.sigmoid(x, out=o),
                lambda t, dy, x, y, o: t.ops.aten.sigmoid_backward.grad_input(dy, y, grad_input=o)),
    "tanh": (lambda t, x, o: t.tanh(x, out=o),
             lambda t, dy, x, y, o: t.ops.aten.tanh_backward.grad_input(dy, y, grad_input=o)),
    "gelu": (lambda t, x, o: t.ops.aten.gelu.out(x, out=o),
             lambda t, dy, x, y, o: t.ops.aten.gelu_backward.grad_input(dy, x, grad_input=o)),
    "silu": (lambda t, x, o: t.ops.aten.silu.out(x, out=o),
             lambda t, dy, x, y, o: t.ops.aten.silu_backward.grad_input(dy, x, grad_input=o)),
    "leaky_relu": (lambda t, x, o: t.ops.aten.leaky_relu.out(x, 0.01, out=o),
                   lambda t, dy, x, y, o: t.ops.aten.leaky_relu_backward.grad_input(dy, x, 0.01, False,
                                                                                    grad_input=o)),
}
PARAMS = {"leaky_relu": {"negative_slope": 0.01}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", default=",".join(TORCH))
    ap.add_argument("--fresh", action="store_true", help="new arrays for every timed call (pages placed anew)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    set_num_threads(1)
    nb = registry.module("native")
    rng = np.random.default_rng(0)
    x32 = (rng.standard_normal(a.n) * 3).astype(np.float32)
    dy32 = rng.standard_normal(a.n).astype(np.float32)
    xb, dyb = f32_bits_to_bf16(x32), f32_bits_to_bf16(dy32)
    xh, dyh = x32.astype(np.float16), dy32.astype(np.float16)
    out16 = np.empty(a.n, np.uint16)
    tx = torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16)
    tdy = torch.from_numpy(dyb.view(np.int16)).view(torch.bfloat16)
    tout = torch.empty_like(tx)
    print(f"# CPU: {_cpu()}; native isa {nb.info()['isa']}; torch {torch.__version__}; n={a.n}, 1 thread, "
          f"{a.rounds} interleaved rounds; load average before: {os.getloadavg()}")
    print(f"{'op':<11} {'dir':<10} {'bf16 ms':>8} {'f16 ms':>8} {'torch ms':>9} {'bf16/f16':>9} {'bf16/torch':>11} "
          f"{'per round':>10}")
    for op in a.ops.split(","):
        p = PARAMS.get(op, {})
        tf, tb = TORCH[op]
        y_t = torch.empty_like(tx)
        tf(torch, tx, y_t)
        # torch's sigmoid / tanh backward take y: native's y-form (backward_y) is that peer, timed beside its
        # backward from x
        yb = y_t.view(torch.int16).numpy().view(np.uint16).copy()
        yh = np.empty(a.n, np.float16)
        nb.kernel(op, "forward", "float16")(xh, yh, p)
        directions = ("forward", "backward") + (("backward_y",) if nb.supports(op, "backward_y", "bfloat16") else ())
        for direction in directions:
            kb, kh = nb.kernel(op, direction, "bfloat16"), nb.kernel(op, direction, "float16")
            # variant -> (call, its arrays: inputs then output)
            if direction == "forward":
                variants = {"bf16": (lambda u, o, kb=kb, p=p: kb(u, o, p), (xb, out16)),
                            "f16": (lambda u, o, kh=kh, p=p: kh(u, o, p), (xh, out16.view(np.float16))),
                            "torch": (lambda u, o, tf=tf: tf(torch, u, o), (tx, tout))}
            else:
                # native's backward takes x (sigmoid, tanh: recomputed), backward_y takes y
                ib, ih = (yb, yh) if direction == "backward_y" else (xb, xh)
                variants = {"bf16": (lambda d, u, o, kb=kb, p=p: kb(d, u, o, p), (dyb, ib, out16)),
                            "f16": (lambda d, u, o, kh=kh, p=p: kh(d, u, o, p), (dyh, ih, out16.view(np.float16))),
                            "torch": (lambda d, u, y, o, tb=tb: tb(torch, d, u, y, o), (tdy, tx, y_t, tout))}
            names = list(variants)
            times = {k: [] for k in names}
            for call, arrays in variants.values():  # warm up
                call(*arrays)
            for r in range(a.rounds):
                order = names[r % 3:] + names[:r % 3]
                for k in order:
                    call, arrays = variants[k]
                    if a.fresh:  # copies touch every page before the clock starts
                        arrays = tuple(v.clone() if isinstance(v, torch.Tensor) else v.copy() for v in arrays)
                    t0 = time.perf_counter()
                    call(*arrays)
                    times[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            # the median of each round's own ratio: a busy machine's slow stretches hit both calls of a round
            per_round = statistics.median(b / f for b, f in zip(times["bf16"], times["f16"], strict=True))
            print(f"{op:<11} {direction:<10} {med['bf16']:8.2f} {med['f16']:8.2f} {med['torch']:9.2f} "
                  f"{med['bf16'] / med['f16']:8.2f}x {med['bf16'] / med['torch']:10.2f}x {per_round:9.2f}x", flush=True)
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
