#!/usr/bin/env python3
"""The cuda backend's float32 -> float8 conversion (the very functions its quantizing kernels compile,
`cuda_backend.e4m3fn_bits` / `e5m2_bits`, run here on NumPy uint32 arrays) against ml_dtypes through
`ma.quantize` with a static scale of 1 (clip to +-qmax, then ml_dtypes' round-to-nearest-even cast: the
contract's satfinite codes), on every float32 bit pattern (2^32, in chunks), each taken as a kernel sees it: the
quotient x / 1 (a NaN comes out quiet).  Prints the count of patterns and of mismatches per format.

    python scripts/cuda_quant_bits_check.py [--step 1] [--chunk 22]

--step k checks every k-th pattern only (tests/cuda/test_cuda_quant.py checks every 256th and the specials).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import multiact as ma
from multiact.backend import cuda_backend as cb

FORMATS = (("float8_e4m3fn", cb.e4m3fn_bits), ("float8_e5m2", cb.e5m2_bits))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=22, help="log2 of the patterns per chunk")
    args = ap.parse_args()
    per = (1 << args.chunk) * args.step
    bad = {name: 0 for name, _ in FORMATS}
    first: dict[str, list[int]] = {name: [] for name, _ in FORMATS}
    count, started = 0, time.perf_counter()
    for lo in range(0, 1 << 32, per):
        u = np.arange(lo, min(lo + per, 1 << 32), args.step, dtype=np.uint64).astype(np.uint32)
        with np.errstate(invalid="ignore"):
            r = u.view(np.float32) / np.float32(1)
        for name, fn in FORMATS:
            want = ma.quantize(r, ma.Quant(name, "tensor", scale=1.0))[0].view(np.uint8)
            diff = np.nonzero(fn(r.view(np.uint32)).astype(np.uint8) != want)[0]
            bad[name] += diff.size
            first[name] += [int(v) for v in u[diff[:8 - len(first[name])]]]
        count += u.size
    secs = time.perf_counter() - started
    for name, _ in FORMATS:
        print(f"{name}: {count} float32 patterns (step {args.step}), {bad[name]} mismatches"
              + (f" (first: {', '.join(hex(v) for v in first[name])})" if first[name] else ""))
    print(f"{secs:.0f} s")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
