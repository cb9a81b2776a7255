"""native's ISAs against each other on one machine, in one process: every op of the table at its default
parameters, each direction native has, float32 / float16 / bfloat16, 1 thread, into preallocated outputs.

Issue 20's floor: avx512 at least 1.6x avx2 in cache (64K) on gelu, silu, sigmoid, tanh and mish.  The
kernels of every ISA the CPU runs are in the one extension (`native_backend.kernel(..., isa=)`), so the
variants alternate within a round (rotated order) on the same arrays; a sample times enough calls to last
about 2 ms.  Printed: the median time per element of each ISA, the ratio of medians against the first
ISA given (--base), and the median of the per-round ratios, with the CPU and the load.  A variant
`avx512-int` is avx512 with its bfloat16 stores by the integer sequence instead of vcvtneps2bf16 (where the
CPU has AVX512_BF16; the same bits), to time that choice.

usage: python benchmarks/bench_isa.py [--isas avx2,avx512[,avx512-int]] [--sizes 64K,16M] [--dtypes float32]
                                      [--ops gelu,silu,...] [--directions forward,backward] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from bench_bf16_native import _params  # every op at its defaults (prelu: one weight)

from multiact import registry, set_num_threads, vocab
from multiact.cli.bench import parse_size
from multiact.cli.sysinfo import cpu
from multiact.dtypes import f32_bits_to_bf16
from multiact.optable import OPS

DIRECTIONS = ("forward", "backward", "backward_y")


def _arrays(n: int, dtype: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x ~ 3 N(0, 1) and dy ~ N(0, 1) in the storage dtype (bfloat16 as its uint16 bits, as native takes it)."""
    x32 = (rng.standard_normal(n) * 3).astype(np.float32)
    dy32 = rng.standard_normal(n).astype(np.float32)
    if dtype == "bfloat16":
        return {"x": f32_bits_to_bf16(x32), "dy": f32_bits_to_bf16(dy32), "out": np.empty(n, np.uint16)}
    return {"x": x32.astype(dtype), "dy": dy32.astype(dtype), "out": np.empty(n, dtype)}


def _time(call, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isas", default=None, help="default: every ISA this machine runs but scalar")
    ap.add_argument("--base", default=None, help="the ISA ratios are taken against (default: avx2, else the first)")
    ap.add_argument("--sizes", default="64K,16M")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--ops", default=None, help="default: every op with a native kernel")
    ap.add_argument("--directions", default=",".join(DIRECTIONS))
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    set_num_threads(1)
    nb = registry.module("native")
    info = nb.info()
    isas = a.isas.split(",") if a.isas else [i for i in info["isas"] if i != "scalar"]
    lib = nb._load()["lib"]
    cvt_default = lib.ma_get_bf16_cvt()
    if "avx512-int" in isas and not cvt_default:
        raise SystemExit("bench_isa: avx512's bfloat16 stores already use the integer sequence here: "
                         + nb.bf16_store())
    base = a.base or ("avx2" if "avx2" in isas else isas[0])
    if len(isas) < 2:
        raise SystemExit(f"bench_isa: this machine runs only {info['isas']}; nothing to compare")
    others = [i for i in isas if i != base]
    isas = [base] + others
    print(f"# CPU: {cpu()['summary']}; ISAs {', '.join(isas)} (chosen: {info['isa']}; bfloat16 stores: "
          f"{info['bf16_store']}); 1 thread, {a.rounds} rounds "
          f"interleaved; load average before: {os.getloadavg()}")
    head = "".join(f" {i + ' ns/el':>12}" for i in isas) + "".join(f" {o + '/' + base:>12} {'per round':>9}"
                                                                   for o in others)
    print(f"{'op':<11} {'dir':<10} {'dtype':<8} {'size':>5}{head}", flush=True)
    rng = np.random.default_rng(0)
    for size in a.sizes.split(","):
        n = parse_size(size)
        for dtype in vocab.dtypes(a.dtypes.split(",")):  # any spelling multiact's commands take
            arr = _arrays(n, dtype, rng)
            ops = a.ops.split(",") if a.ops else [o for o in OPS if nb.supports(OPS[o].kernel_key(_params(o)),
                                                                                 "forward", dtype)]
            for op in ops:
                p = _params(op)
                key = OPS[op].kernel_key(p)
                arr["y"] = np.empty_like(arr["x"])
                nb.kernel(key, "forward", dtype, isa=base)(arr["x"], arr["y"], p)
                for direction in a.directions.split(","):
                    if not nb.supports(key, direction, dtype):
                        continue
                    names = ("x",) if direction == "forward" else ("dy", "y" if direction == "backward_y" else "x")
                    ins = tuple(arr[k] for k in names)
                    calls = {}
                    for isa in isas:
                        k = nb.kernel(key, direction, dtype, isa=isa.removesuffix("-int"))
                        calls[isa] = (lambda k=k, a_=ins + (arr["out"],), p=p: k(*a_, p))
                    t1 = _time(calls[base], 3)
                    reps = max(1, int(2e-3 / max(t1, 1e-9)))
                    times: dict[str, list[float]] = {i: [] for i in isas}
                    for r in range(a.rounds):
                        for isa in isas[r % len(isas):] + isas[:r % len(isas)]:
                            lib.ma_set_bf16_cvt(cvt_default and not isa.endswith("-int"))
                            times[isa].append(_time(calls[isa], reps))
                    lib.ma_set_bf16_cvt(cvt_default)
                    med = {i: statistics.median(v) for i, v in times.items()}
                    cols = "".join(f" {med[i] / n * 1e9:12.3f}" for i in isas)
                    for o in others:
                        pr = statistics.median(b / t for b, t in zip(times[base], times[o], strict=True))
                        cols += f" {med[base] / med[o]:11.2f}x {pr:8.2f}x"
                    print(f"{op:<11} {direction:<10} {dtype:<8} {size:>5}{cols}", flush=True)
    print(f"# ratios: {base}'s time over the other's (above 1: the other is faster); load average after: "
          f"{os.getloadavg()}")


if __name__ == "__main__":
    main()
