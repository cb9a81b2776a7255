"""Quantized outputs (issue 45's speed floors): the native one pass (activation, amax, scale and float8 codes per
row or group while the block is in cache) against the same op with a bfloat16 output and against the unfused torch
composition, bfloat16 input, 16M output elements, one thread.

Floors: native with float8_e4m3fn output per token and per group of 128 at most 1.25x the native op with a
bfloat16 output; at least 3x faster than torch's five steps on the CPU (the op in float32 on the widened input,
amax per row or group, divide, clamp, cast to torch.float8_e4m3fn).  The numba and numpy backends' quantized calls
are timed too (numba: its `quantized` where it has one, else the two passes; numpy: the two passes).

Each round times every variant of a case once, in a rotated order; printed: the median per variant (ms), the
ratios of medians, and the median of each round's own ratio for the floors (a busy machine's slow stretch hits
both calls of a round), with the CPU (vendor, family, model) and the load.  "bf16 out" is the allocating call
(as the quantized call allocates its codes and scales); "bf16 out=" writes a preallocated array.

--clock cpu times each call by the process's CPU time (time.process_time) instead of the wall clock: one thread, so
a busy machine's preemption leaves the figures alone (page faults and the kernel's work for them still count).

usage: python benchmarks/bench_quant.py [--rows 4096] [--n 4096] [--rounds 7] [--slow-rounds 2] [--no-slow]
       [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

import multiact as ma


def _cpu() -> str:
    from multiact.cli.sysinfo import cpu

    return cpu()["summary"]


def _act(op: str, x, q, backend: str, p: dict):
    """ma.<op>(x) on the backend, quantized with q where it is given."""
    f = getattr(ma, op)
    return f(x, **p, backend=backend) if q is None else f(x, **p, quant=q, backend=backend)


def _torch_silu(xt):
    import torch.nn.functional as F

    return F.silu(xt.float())


def _torch_gelu_tanh(xt):
    import torch.nn.functional as F

    return F.gelu(xt.float(), approximate="tanh")


def _torch_swiglu(xt):
    import torch.nn.functional as F

    h = xt.shape[-1] // 2
    return F.silu(xt[..., :h].float()) * xt[..., h:].float()


# (op, its parameters, input columns per output column, the op in torch on the widened input): the three
CASES = (("silu", {}, 1, _torch_silu), ("gelu", {"approximate": "tanh"}, 1, _torch_gelu_tanh),
         ("swiglu", {}, 2, _torch_swiglu))


def _torch_composition(act: Callable, group: int | None) -> Callable:
    """The unfused torch code a user writes: the op in float32, amax per row or group, divide, clamp, cast."""
    import torch

    def run(xt):
        y = act(xt)
        yg = y if group is None else y.view(*y.shape[:-1], y.shape[-1] // group, group)
        amax = yg.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(amax == 0, torch.ones_like(amax), amax / 448.0)
        codes = (yg / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return codes.view(y.shape), scale.squeeze(-1)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096, help="output elements per row (swiglu's input: twice)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--slow-rounds", type=int, default=2, help="rounds for numba and numpy (slow)")
    ap.add_argument("--no-slow", action="store_true", help="leave numba and numpy out")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    a = ap.parse_args()
    global _clock
    _clock = time.process_time if a.clock == "cpu" else time.perf_counter
    import ml_dtypes
    import torch

    torch.set_num_threads(1)
    ma.set_num_threads(1)
    rng = np.random.default_rng(0)
    grans = [("token", ma.Quant("float8_e4m3fn", "token"), None),
             ("group128", ma.Quant("float8_e4m3fn", "group", group_size=128), 128)]
    from multiact.backend import native_backend

    print(f"# CPU: {_cpu()}; native isa {native_backend.info()['isa']}; torch {torch.__version__}; "
          f"{a.rows} x {a.n} = {a.rows * a.n} output elements, bfloat16 input, 1 thread, {a.rounds} interleaved "
          f"rounds ({a.slow_rounds} for numba/numpy), {a.clock} clock; load average before: {os.getloadavg()}")
    print("# native q: the one pass; bf16 out / bf16 out=: the same op with a bfloat16 result (allocating / into a "
          "preallocated array); torch: the unfused composition; numba q, numpy q: those backends' quantized calls")
    head = (f"{'op':<12} {'gran':<9} {'native q':>9} {'bf16 out':>9} {'bf16 out=':>10} {'torch':>8} {'numba q':>8} "
            f"{'numpy q':>8} {'q/bf16':>7} {'q/out=':>7} {'torch/q':>8} {'numba/q':>8} {'numpy/q':>8}")
    print(head)
    for op, p, cols, torch_act in CASES:
        width = cols * a.n
        x = (rng.standard_normal((a.rows, width)) * 2).astype(np.float32).astype(ml_dtypes.bfloat16)
        xt = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
        out = np.empty((a.rows, a.n), ml_dtypes.bfloat16)
        for gname, q, group in grans:
            fused, slow = _variants(op, p, q, x, out)
            tc = _torch_composition(torch_act, group)
            fused["torch"] = lambda tc=tc, xt=xt: tc(xt)
            times = _time(fused, a.rounds)
            if not a.no_slow:
                times.update(_time(slow, a.slow_rounds))
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            cell = {k: f"{med[k]:.1f}" if k in med else "-" for k in ("numba q", "numpy q")}
            ratio = {k: f"{med[k] / med['native q']:.1f}x" if k in med else "-" for k in ("numba q", "numpy q")}
            print(f"{op:<12} {gname:<9} {med['native q']:9.1f} {med['bf16 out']:9.1f} {med['bf16 out=']:10.1f} "
                  f"{med['torch']:8.1f} {cell['numba q']:>8} {cell['numpy q']:>8} "
                  f"{_per_round(times, 'native q', 'bf16 out'):6.2f}x "
                  f"{_per_round(times, 'native q', 'bf16 out='):6.2f}x "
                  f"{_per_round(times, 'torch', 'native q'):7.1f}x {ratio['numba q']:>8} {ratio['numpy q']:>8}",
                  flush=True)
    print(f"# load average after: {os.getloadavg()}")
    print("# floors: q/bf16 (and q/out=) <= 1.25x; torch/q >= 3x")


def _variants(op: str, p: dict, q, x, out) -> tuple[dict, dict]:
    """({native q, bf16 out, bf16 out=}, {numba q, numpy q}): zero-argument calls."""
    fused = {"native q": lambda: _act(op, x, q, "native", p),
             "bf16 out": lambda: _act(op, x, None, "native", p),
             "bf16 out=": lambda: getattr(ma, op)(x, **p, out=out, backend="native")}
    slow = {"numba q": lambda: _act(op, x, q, "numba", p),
            "numpy q": lambda: _act(op, x, q, "numpy", p)}
    return fused, slow


def _per_round(times: dict[str, list[float]], k1: str, k2: str) -> float:
    """The median of each round's own ratio k1 / k2."""
    return statistics.median(t1 / t2 for t1, t2 in zip(times[k1], times[k2], strict=False))


_clock = time.perf_counter


def _time(variants: dict[str, Callable], rounds: int) -> dict[str, list[float]]:
    names = list(variants)
    for f in variants.values():  # warm up (and compile)
        f()
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = _clock()
            variants[k]()
            times[k].append(_clock() - t0)
    return times


if __name__ == "__main__":
    main()
