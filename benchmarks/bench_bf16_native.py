"""native bfloat16 against native float16 and torch bfloat16: 16M elements, 1 thread, into preallocated outputs.

The issue's floor (18): native bf16 at most 1.1x native float16 on every op, forward and backward, and faster
than torch's bf16 kernels (multiact.cli.peers' torch table: aten's out= forms where torch has them, else the
allocating call, marked "alloc").  Every op of the table with a native bf16 kernel, at its default parameters
(prelu: one weight, 0.25), forward, backward and the y-form where there is one.  Rounds interleave the three
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
from collections.abc import Callable

import numpy as np

from multiact import consistency as C
from multiact import registry, set_num_threads
from multiact.cli import peers
from multiact.dtypes import bf16_dtype, f32_bits_to_bf16
from multiact.optable import OPS


def _cpu() -> str:
    """The one-line CPU identity every benchmark header carries (multiact.cli.sysinfo)."""
    from multiact.cli.sysinfo import cpu

    return cpu()["summary"]


def _params(op: str) -> dict:
    array = OPS[op].defn.array_param
    if array:  # one weight (prelu's), on a 1-D x
        return {array: np.array([0.25], np.float32), "axis": 0}
    return OPS[op].validate(C.param_cases(OPS[op])[0])  # the defaults, or the first case (threshold has none)


notes: dict[tuple[str, str], str] = {}  # rows whose torch call allocates (no out= form) or starts from y


def _binders(nb, op: str, direction: str, p: dict, bf16: dict, f16: dict) -> dict[str, Callable]:
    """variant -> binder(arrays) -> the zero-argument call; arrays: inputs then the output."""
    key = OPS[op].kernel_key(p)
    kb, kh = nb.kernel(key, direction, "bfloat16"), nb.kernel(key, direction, "float16")
    second = "y" if direction == "backward_y" else "x"
    names = ("x",) if direction == "forward" else ("dy", second)
    out = {"bf16": (lambda *a: (lambda: kb(*a, p)), tuple(bf16[n] for n in names) + (bf16["out"],)),
           "f16": (lambda *a: (lambda: kh(*a, p)), tuple(f16[n] for n in names) + (f16["out"],))}
    bt = bf16_dtype()

    def torch_bind(*a):
        bound = peers.make("torch", op, direction, p, tuple(v.view(bt) for v in a[:-1]), a[-1].view(bt), 1)
        if isinstance(bound, str):
            raise LookupError(bound)
        said = [bound.note] if bound.note else []
        notes[(op, direction)] = ", ".join(said + (["torch allocates"] if bound.into is None else []))
        return bound.into or bound.alloc

    try:
        torch_bind(*out["bf16"][1])
        out["torch"] = (torch_bind, out["bf16"][1])
    except LookupError as e:
        print(f"# {op} {direction}: {e}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", default=None, help="default: every op with a native bfloat16 kernel")
    ap.add_argument("--fresh", action="store_true", help="new arrays for every timed call (pages placed anew)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    set_num_threads(1)
    nb = registry.module("native")
    ops = a.ops.split(",") if a.ops else [o for o in OPS if nb.supports(OPS[o].kernel_key(_params(o)), "forward",
                                                                          "bfloat16")]
    rng = np.random.default_rng(0)
    x32 = (rng.standard_normal(a.n) * 3).astype(np.float32)
    dy32 = rng.standard_normal(a.n).astype(np.float32)
    bf16 = {"x": f32_bits_to_bf16(x32), "dy": f32_bits_to_bf16(dy32), "out": np.empty(a.n, np.uint16)}
    f16 = {"x": x32.astype(np.float16), "dy": dy32.astype(np.float16), "out": np.empty(a.n, np.float16)}
    print(f"# CPU: {_cpu()}; native isa {nb.info()['isa']}; torch {torch.__version__}; n={a.n}, 1 thread, "
          f"{a.rounds} interleaved rounds{', fresh arrays per call' if a.fresh else ''}; load average before: "
          f"{os.getloadavg()}")
    print(f"{'op':<11} {'dir':<10} {'bf16 ms':>8} {'f16 ms':>8} {'torch ms':>9} {'bf16/torch':>11} {'bf16/f16':>9} "
          f"{'per round':>10}")
    for op in ops:
        p = _params(op)
        key = OPS[op].kernel_key(p)
        # y as the forward gives it, the same way for both dtypes (float32, then rounded once)
        y32 = np.empty_like(x32)
        nb.kernel(key, "forward", "float32")(x32, y32, p)
        bf16["y"], f16["y"] = f32_bits_to_bf16(y32), y32.astype(np.float16)
        for direction in ("forward", "backward", "backward_y"):
            if not nb.supports(key, direction, "bfloat16"):
                continue
            variants = _binders(nb, op, direction, p, bf16, f16)
            names = list(variants)
            times: dict[str, list[float]] = {k: [] for k in names}
            for bind, arrays in variants.values():  # warm up
                bind(*arrays)()
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for k in order:
                    bind, arrays = variants[k]
                    if a.fresh:  # copies touch every page before the clock starts
                        arrays = tuple(v.copy() for v in arrays)
                    call = bind(*arrays)
                    t0 = time.perf_counter()
                    call()
                    times[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            # the median of each round's own ratio: a busy machine's slow stretches hit both calls of a round
            per_round = statistics.median(b / f for b, f in zip(times["bf16"], times["f16"], strict=True))
            tm = med.get("torch")
            torch_cols = f"{tm:9.2f} {med['bf16'] / tm:10.2f}x" if tm else f"{'-':>9} {'-':>11}"
            note = notes.get((op, direction)) if tm else ""
            print(f"{op:<11} {direction:<10} {med['bf16']:8.2f} {med['f16']:8.2f} {torch_cols} "
                  f"{med['bf16'] / med['f16']:8.2f}x {per_round:9.2f}x" + (f"  ({note})" if note else ""), flush=True)
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
