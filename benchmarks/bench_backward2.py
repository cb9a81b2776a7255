"""backward2 (g * dy * f''(x)) on numba against the numpy backend (the float64 reference, what ran before numba
had these kernels): 1M elements, 1 thread, into preallocated outputs.

Rounds interleave the two backends (each round times both once, in alternating order); the median per backend and
the ratio numba / numpy of medians are printed with the CPU and the load.  Loops are compiled before timing.

usage: python benchmarks/bench_backward2.py [--n 1048576] [--rounds 9] [--ops silu,gelu,...] [--dtypes float32,float64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import multiact as ma
from multiact import set_num_threads

OPS = {"silu": {}, "gelu": {}, "gelu_tanh": {"approximate": "tanh"}, "mish": {}, "sigmoid": {}, "tanh": {},
       "softplus": {}, "elu": {"alpha": 1.0}, "leaky_relu": {"negative_slope": 0.2}}


def _cpu() -> str:
    """The one-line CPU identity every benchmark header carries (multiact.tools.sysinfo)."""
    from multiact.tools.sysinfo import cpu

    return cpu()["summary"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default="float32,float64")
    args = ap.parse_args()
    set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"backward2, n={args.n}, 1 thread, {args.rounds} interleaved rounds; {_cpu()}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'op':12s} {'dtype':8s} {'numba ms':>9s} {'numpy ms':>9s} {'numba/numpy':>12s}")
    for dt in args.dtypes.split(","):
        g, dy = (rng.standard_normal(args.n).astype(dt) for _ in range(2))
        x = (rng.standard_normal(args.n) * 4).astype(dt)
        out = np.empty_like(x)
        for name in args.ops.split(","):
            op, p = ("gelu", OPS[name]) if name == "gelu_tanh" else (name, OPS[name])
            times: dict[str, list[float]] = {"numba": [], "numpy": []}
            for b in times:
                ma.backward2(op, g, dy, x, out=out, backend=b, **p)  # compile / warm
            for r in range(args.rounds):
                for b in (("numba", "numpy") if r % 2 == 0 else ("numpy", "numba")):
                    t = time.perf_counter()
                    ma.backward2(op, g, dy, x, out=out, backend=b, **p)
                    times[b].append(time.perf_counter() - t)
            m = {b: statistics.median(v) * 1e3 for b, v in times.items()}
            print(f"{name:12s} {dt:8s} {m['numba']:9.2f} {m['numpy']:9.2f} {m['numba'] / m['numpy']:12.2f}")
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
