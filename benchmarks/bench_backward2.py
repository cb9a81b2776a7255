"""backward2 (g * dy * f''(x)) on each backend against the last one named (by default native and numba against
numpy, the float64 reference, what ran before either had these kernels): 1M elements, 1 thread, into preallocated
outputs.

Rounds interleave the backends (each round times each once, the order reversed every other round); the median per
backend and each one's ratio of medians to the last are printed with the CPU and the load.  Loops are compiled
before timing.

usage: python benchmarks/bench_backward2.py [--n 1048576] [--rounds 9] [--ops silu,gelu,...]
                                           [--dtypes float32,float64] [--backends native,numba,numpy]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import multiact as ma
from multiact import set_num_threads, vocab
from multiact.optable import KEYS

# The kernel keys timed, with their parameters (gelu_tanh: gelu with approximate="tanh")
OPS = {"silu": {}, "gelu": {}, "gelu_tanh": {"approximate": "tanh"}, "mish": {}, "sigmoid": {}, "tanh": {},
       "softplus": {}, "elu": {"alpha": 1.0}, "leaky_relu": {"negative_slope": 0.2}}


def _cpu() -> str:
    """The one-line CPU identity every benchmark header carries (multiact.cli.sysinfo)."""
    from multiact.cli.sysinfo import cpu

    return cpu()["summary"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--backends", default="native,numba,numpy")
    args = ap.parse_args()
    backends = args.backends.split(",")
    base = backends[-1]
    set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"backward2, n={args.n}, 1 thread, {args.rounds} interleaved rounds; {_cpu()}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'op':12s} {'dtype':8s} " + " ".join(f"{b + ' ms':>10s}" for b in backends) + " "
          + " ".join(f"{b + '/' + base:>13s}" for b in backends[:-1]))
    for dt in vocab.dtypes(args.dtypes.split(",")):  # any spelling multiact's commands take
        g, dy = (rng.standard_normal(args.n).astype(dt) for _ in range(2))
        x = (rng.standard_normal(args.n) * 4).astype(dt)
        out = np.empty_like(x)
        for name in args.ops.split(","):
            op, p = KEYS[name].name, OPS[name]
            times: dict[str, list[float]] = {b: [] for b in backends}
            for b in times:
                ma.backward2(op, g, dy, x, out=out, backend=b, **p)  # compile / warm
            for r in range(args.rounds):
                for b in (backends if r % 2 == 0 else backends[::-1]):
                    t = time.perf_counter()
                    ma.backward2(op, g, dy, x, out=out, backend=b, **p)
                    times[b].append(time.perf_counter() - t)
            m = {b: statistics.median(v) * 1e3 for b, v in times.items()}
            print(f"{name:12s} {dt:8s} " + " ".join(f"{m[b]:10.2f}" for b in backends) + " "
                  + " ".join(f"{m[b] / m[base]:13.2f}" for b in backends[:-1]))
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
