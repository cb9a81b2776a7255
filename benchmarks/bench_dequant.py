"""Dequantized inputs (issue 46 item 5's floor): a matmul's int32 output dequantized (per-channel weight scale,
per-token activation scale, an int32 bias), the activation, and quantized per token, in one native pass, against
the unfused torch composition on the CPU (the floor: at least 3x faster) and against multiact's own two steps
(`Dequant.apply`, then the op's one quantized pass), one thread, in one interleaved run per case.

torch's composition is the torch_npu golden model's order on the CPU: (acc + bias).float() * weight_scale *
activation_scale[:, None], the activation in float32 (swiglu as F.silu(gate) * up), amax per row or group, divide,
clamp, cast (int8: round first).

usage: python benchmarks/bench_dequant.py [--tokens 4096] [--hidden 4096] [--rounds 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import multiact as ma
from multiact.cli.bench import time_interleaved
from multiact.cli.quant_bench import label, parse_quant, torch_composition
from multiact.cli.sysinfo import cpu

QUANTS = ("int8:token", "float8_e4m3fn:token", "float8_e4m3fn:group:128")
OPS = ("swiglu", "silu", "gelu")  # gelu: the erf form, torch's default


def _torch_act(torch, name: str, v):
    F = torch.nn.functional
    if name == "swiglu":
        h = v.shape[-1] // 2
        return F.silu(v[..., :h]) * v[..., h:]
    return getattr(F, name)(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=4096, help="outputs per token (swiglu reads twice as many)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    ma.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    info = cpu()
    print(f"# CPU: {info['summary']}; load {info.get('load_average')}; {a.threads} thread(s); "
          f"torch {torch.__version__}")
    print(f"# {a.tokens} tokens x {a.hidden} outputs; medians of {a.rounds} interleaved rounds (ms); ratios: the "
          "median of each round's own ratio [min, max]")
    print(f"{'op':8} {'quant':26} {'one pass':>9} {'two steps':>9} {'torch':>9} {'torch/one':>20} {'steps/one':>8}")
    for name in OPS:
        n = 2 * a.hidden if name == "swiglu" else a.hidden
        acc = rng.integers(-2**20, 2**20, (a.tokens, n), dtype=np.int32)
        ws = (rng.random(n, dtype=np.float32) + 0.5) * np.float32(1e-3)
        acs = (rng.random(a.tokens, dtype=np.float32) + 0.5) * np.float32(1e-2)
        bias = rng.integers(-1000, 1000, n, dtype=np.int32)
        d = ma.Dequant(ws, acs, bias)
        f = getattr(ma, name)
        tacc, tws, tacs, tb = (torch.from_numpy(t) for t in (acc, ws, acs, bias))
        for qt in QUANTS:
            q = parse_quant(qt)

            def one(f=f, q=q, acc=acc, d=d):
                return f(acc, dequant=d, quant=q, backend="native")

            def steps(f=f, q=q, acc=acc, d=d):
                return f(d.apply(acc), quant=q, backend="native")

            def composed(name=name, q=q, t=(tacc, tws, tacs, tb)):
                v = (t[0] + t[3]).float() * t[1] * t[2][:, None]
                return torch_composition(torch, _torch_act(torch, name, v), q)

            timed = time_interleaved([one, steps, composed], samples=a.rounds, budget_s=60.0)
            (s1, _), (s2, _), (s3, _) = timed
            k = min(len(s1), len(s2), len(s3))
            rt = [s3[i] / s1[i] for i in range(k)]
            rs = [s2[i] / s1[i] for i in range(k)]
            med = [statistics.median(s) * 1e3 for s in (s1, s2, s3)]
            print(f"{name:8} {label(q):26} {med[0]:9.2f} {med[1]:9.2f} {med[2]:9.2f} "
                  f"{statistics.median(rt):7.2f}x [{min(rt):.2f}, {max(rt):.2f}] {statistics.median(rs):7.2f}x")


if __name__ == "__main__":
    main()
