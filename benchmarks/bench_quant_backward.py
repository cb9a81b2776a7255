"""Backward with a quantized gradient (issue 46 item 4's floor): the native one pass (dx from bfloat16 dy and x in
float32 per block held in cache, then its amax, scale and float8 codes per row or group) against the same backward
with a bfloat16 dx (allocating, and into a preallocated array), and against torch's unfused composition (its
backward kernel on the widened inputs, then amax, divide, clamp, cast), one thread, 16M elements, in one
interleaved run per case.  The floor: the quantized call at most 1.25x the bfloat16 one.

usage: python benchmarks/bench_quant_backward.py [--rows 4096] [--n 4096] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import multiact as ma
from multiact.cli.bench import time_interleaved
from multiact.cli.quant_bench import label, parse_quant, torch_composition
from multiact.cli.sysinfo import cpu

QUANTS = ("float8_e4m3fn:token", "float8_e4m3fn:group:128")
# (op, its parameters, torch's backward kernel on float32 (dy, x))
CASES = (("silu", {}, lambda t, dy, x: t.ops.aten.silu_backward(dy, x)),
         ("gelu", {"approximate": "tanh"}, lambda t, dy, x: t.ops.aten.gelu_backward(dy, x, approximate="tanh")),
         ("tanh", {}, None))


def _calls(grad, dy, x, out, p: dict, q) -> list:
    """native quantized, bfloat16 dx allocating, bfloat16 dx into out."""
    return [lambda: grad(dy, x, **p, quant=q, backend="native"), lambda: grad(dy, x, **p, backend="native"),
            lambda: grad(dy, x, **p, out=out, backend="native")]


def _torch_call(torch, bwd, tdy, tx, q):
    return lambda: torch_composition(torch, bwd(torch, tdy.float(), tx.float()), q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    import ml_dtypes
    import torch

    from multiact.backend import native_backend

    torch.set_num_threads(1)
    ma.set_num_threads(1)
    rng = np.random.default_rng(0)
    info = cpu()
    print(f"# CPU: {info['summary']}; native isa {native_backend.info()['isa']}; load {info.get('load_average')}; "
          f"torch {torch.__version__}; {a.rows} x {a.n} bfloat16 dy and x, 1 thread")
    print("# medians of interleaved rounds (ms); ratios: the median of each round's own ratio [min, max]")
    print(f"{'op':14} {'quant':24} {'native q':>9} {'bf16 dx':>9} {'bf16 out=':>9} {'torch':>9} "
          f"{'q/bf16':>20} {'q/out=':>7} {'torch/q':>8}")
    for op, p, torch_bwd in CASES:
        x = (rng.standard_normal((a.rows, a.n)) * 3).astype(np.float32).astype(ml_dtypes.bfloat16)
        dy = rng.standard_normal((a.rows, a.n)).astype(np.float32).astype(ml_dtypes.bfloat16)
        out = np.empty_like(x)
        grad = getattr(ma, f"{op}_grad")
        tdy, tx = (torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16) for v in (dy, x))
        for qt in QUANTS:
            q = parse_quant(qt)
            fns = _calls(grad, dy, x, out, p, q)
            if torch_bwd is not None:
                fns.append(_torch_call(torch, torch_bwd, tdy, tx, q))
            timed = [s for s, _ in time_interleaved(fns, samples=a.rounds, budget_s=60.0)]
            k = min(len(s) for s in timed)
            r_b = [timed[0][i] / timed[1][i] for i in range(k)]
            r_o = [timed[0][i] / timed[2][i] for i in range(k)]
            med = [statistics.median(s) * 1e3 for s in timed]
            tcol = f"{med[3]:9.2f}" if len(med) > 3 else f"{'-':>9}"
            tr = f"{statistics.median(timed[3][i] / timed[0][i] for i in range(k)):7.2f}x" if len(med) > 3 else \
                f"{'-':>8}"
            name = op + ("(tanh)" if p.get("approximate") == "tanh" else "")
            print(f"{name:14} {label(q):24} {med[0]:9.2f} {med[1]:9.2f} {med[2]:9.2f} {tcol} "
                  f"{statistics.median(r_b):6.2f}x [{min(r_b):.2f}, {max(r_b):.2f}] {statistics.median(r_o):6.2f}x "
                  f"{tr}", flush=True)
    print("# floor: q/bf16 <= 1.25x")


if __name__ == "__main__":
    main()
