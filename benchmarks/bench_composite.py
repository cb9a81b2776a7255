"""The gated family and bias_act against their unfused PyTorch equivalents, in one run.

    python benchmarks/bench_composite.py [--threads 1,2] [--quick] [--samples N] [--json F]

Rows (float32 and float16, out= preallocated, implementations interleaved by
`multiact.cli.bench.time_interleaved`, medians of the samples, ratios in one run):
- swiglu / geglu / reglu forward at [8192, 2*4096] and at 16M outputs: `ma.<op>(x, out=y)` on each host
  backend that has the kernel, against `torch.mul(F.silu(a), b, out=y)` (a, b the halves, views),
  and `ma.silu(a_contiguous, out=y)` with a read of b (the three streams the fused op moves);
- swiglu forward + backward against torch autograd of `F.silu(a) * b` (backward into preallocated
  grads where multiact can: `ma.swiglu_grad(dy, x, out=dx)`);
- bias_act forward (relu, leaky_relu, gelu, gelu tanh, silu, sigmoid) at 16M, NCHW (dim=1, H*W = 64*64),
  transformer (dim=-1, hidden 4096) and short-row (dim=1, H*W = 2*2) shapes, against `ma.<act>(x)` alone
  (printed as bias_act's time over the activation's), and forward + backward (dx and db) against torch's
  `F.<act>(x + b.view(...))` with autograd (printed as torch's time over multiact's).
Prints the CPU first, as every figure of this project must.
"""

from __future__ import annotations

import argparse
import json
import sys
from statistics import median

import numpy as np

import multiact as ma
from multiact.cli import sysinfo
from multiact.cli.bench import host_backends, time_interleaved


def _med(samples):
    return median(samples[0])


def _torch():
    try:
        import torch
        import torch.nn.functional as F  # noqa: N812
    except ImportError:
        return None, None
    return torch, F


_TORCH_ACT = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}
SAMPLES = 5  # samples per implementation in the bias_act rows (--samples)
# The activations the bias_act rows time (--quick: the first two)
BIAS_ACTS = (("relu", {}), ("leaky_relu", {"negative_slope": 0.2}), ("gelu", {}), ("gelu", {"approximate": "tanh"}),
             ("silu", {}), ("sigmoid", {}))


def gated_rows(shape, dtype, threads, backends, quick):
    torch, F = _torch()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    d = shape[-1] // 2
    y = np.empty(shape[:-1] + (d,), dtype)
    rows = []
    for op in ("swiglu",) if quick else ("swiglu", "geglu", "reglu"):
        rows += _gated_op(op, x, y, d, dtype, threads, backends, torch, F, rng, shape)
    return rows


def _gated_op(op, x, y, d, dtype, threads, backends, torch, F, rng, shape):  # noqa: N803 - F is torch's
    """One op's rows (each op a call of its own, so that the timed closures bind its arrays)."""
    rows = []
    fn = getattr(ma, op)
    impls = {f"ma.{op}[{b}]": (lambda b=b: fn(x, out=y, backend=b)) for b in backends
             if ma.registry.module(b).supports(f"gated:{_TORCH_ACT[op]}", "forward", np.dtype(dtype).name)}
    a_c = np.ascontiguousarray(x[..., :d])
    b_c = np.ascontiguousarray(x[..., d:])
    act = getattr(ma, _TORCH_ACT[op])
    impls[f"ma.{_TORCH_ACT[op]}(a)+read(b)"] = lambda: (act(a_c, out=y), b_c.sum(dtype=np.float32))
    if torch is not None:
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        ta, tb = tx[..., :d], tx[..., d:]
        tf = getattr(F, _TORCH_ACT[op])
        impls[f"torch mul({_TORCH_ACT[op]}(a), b)"] = lambda: torch.mul(tf(ta), tb, out=ty)
    names = list(impls)
    times = time_interleaved([impls[n] for n in names], samples=5, budget_s=6.0)
    base = next((t for n, t in zip(names, times, strict=True) if n.startswith("torch")), None)
    for n, t in zip(names, times, strict=True):
        rows.append({"case": f"{op} fwd {shape} {np.dtype(dtype).name} t={threads}", "impl": n,
                     "ms": _med(t) * 1e3, "vs_torch": None if base is None else _med(base) / _med(t)})
    if op != "swiglu" or torch is None:
        return rows
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = np.empty_like(x)
    tdy = torch.from_numpy(dy)

    def torch_fb():
        t = torch.from_numpy(x).requires_grad_()
        out = F.silu(t[..., :d]) * t[..., d:]
        out.backward(tdy)

    fb = {f"ma.swiglu fwd+bwd[{b}]": (lambda b=b: (ma.swiglu(x, out=y, backend=b),
                                                  ma.swiglu_grad(dy, x, out=dx, backend=b)))
          for b in backends if ma.registry.module(b).supports("gated:silu", "backward", np.dtype(dtype).name)}
    fb["torch autograd silu(a)*b"] = torch_fb
    names = list(fb)
    times = time_interleaved([fb[n] for n in names], samples=SAMPLES, budget_s=6.0)
    base = times[-1]
    for n, t in zip(names, times, strict=True):
        rows.append({"case": f"swiglu fwd+bwd {shape} {np.dtype(dtype).name} t={threads}", "impl": n,
                     "ms": _med(t) * 1e3, "vs_torch": _med(base) / _med(t)})
    return rows


def bias_rows(shape, dim, dtype, threads, backends, quick):
    torch, F = _torch()
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(dtype)
    c = shape[dim]
    b = rng.standard_normal(c).astype(dtype)
    y = np.empty_like(x)
    rows = []
    acts = BIAS_ACTS[:2] if quick else BIAS_ACTS
    view = [1] * len(shape)
    view[dim] = c
    for act, kw in acts:
        rows += _bias_one(act, kw, x, b, y, shape, dim, dtype, threads, backends, torch, F, rng, view)
    return rows


def _bias_one(act, kw, x, b, y, shape, dim, dtype, threads, backends, torch, F, rng, view):  # noqa: N803
    rows = []
    label = act + ("(tanh)" if kw.get("approximate") == "tanh" else "")
    spec = ma.ops()[act]
    key = "bias_act:" + spec.kernel_key(spec.validate(kw))
    impls = {f"ma.bias_act[{be}]": (lambda be=be: ma.bias_act(x, b, act, dim=dim, out=y, backend=be, **kw))
             for be in backends if ma.registry.module(be).supports(key, "forward", np.dtype(dtype).name)}
    f = getattr(ma, act)
    impls[f"ma.{label}(x) alone"] = lambda: f(x, out=y, **kw)
    names = list(impls)
    times = time_interleaved([impls[n] for n in names], samples=SAMPLES, budget_s=5.0)
    alone = times[-1]
    for n, t in zip(names, times, strict=True):
        rows.append({"case": f"bias_act {label} fwd {shape} dim={dim} {np.dtype(dtype).name} t={threads}",
                     "impl": n, "ms": _med(t) * 1e3, "x_act_alone": _med(t) / _med(alone)})
    if torch is None:
        return rows
    dy = rng.standard_normal(shape).astype(dtype)
    dx, db = np.empty_like(x), np.empty_like(b)
    tf = getattr(F, act)
    tdy = torch.from_numpy(dy)

    def torch_fb():
        tx = torch.from_numpy(x).requires_grad_()
        tb = torch.from_numpy(b).requires_grad_()
        out = tf(tx + tb.view(view), **kw)
        out.backward(tdy)

    fb = {f"ma.bias_act fwd+bwd[{be}]": (lambda be=be: (
        ma.bias_act(x, b, act, dim=dim, out=y, backend=be, **kw),
        ma.bias_act_grad(dy, x, b, act, dim=dim, out=(dx, db), backend=be, **kw)))
        for be in backends if ma.registry.module(be).supports(key, "backward", np.dtype(dtype).name)}
    fb["torch autograd act(x + b)"] = torch_fb
    names = list(fb)
    times = time_interleaved([fb[n] for n in names], samples=SAMPLES, budget_s=6.0)
    base = times[-1]
    for n, t in zip(names, times, strict=True):
        rows.append({"case": f"bias_act {label} fwd+bwd {shape} dim={dim} {np.dtype(dtype).name} t={threads}",
                     "impl": n, "ms": _med(t) * 1e3, "vs_torch": _med(base) / _med(t)})
    return rows


def main(argv=None) -> int:
    global SAMPLES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--quick", action="store_true", help="swiglu and relu/leaky_relu only, float32")
    ap.add_argument("--json")
    ap.add_argument("--only", choices=("gated", "bias_act"), default=None)
    ap.add_argument("--backends", help="comma-separated multiact backends to time (default: every host backend)")
    ap.add_argument("--samples", type=int, default=SAMPLES, help="samples per implementation (bias_act rows)")
    args = ap.parse_args(argv)
    SAMPLES = args.samples
    torch, _ = _torch()
    backends, _ = host_backends(args.backends.split(",") if args.backends else None)
    cpu = sysinfo.cpu()
    print("# CPU:", cpu["summary"], "| load average", cpu.get("load_average"))
    rows = []
    dtypes = (np.float32,) if args.quick else (np.float32, np.float16)
    for threads in (int(t) for t in args.threads.split(",")):
        ma.set_num_threads(threads)
        if torch is not None:
            torch.set_num_threads(threads)
        for dtype in dtypes:
            if args.only in (None, "gated"):
                shapes = ((8192, 2 * 4096),) if args.quick else ((8192, 2 * 4096), (4096, 2 * 4096))
                for shape in shapes:
                    rows += gated_rows(shape, dtype, threads, backends, args.quick)
            if args.only in (None, "bias_act"):
                for shape, dim in (((64, 64, 64, 64), 1), ((4096, 4096), -1), ((65536, 64, 2, 2), 1)):
                    rows += bias_rows(shape, dim, dtype, threads, backends, args.quick)
    width = max(len(r["impl"]) for r in rows)
    case = None
    for r in rows:
        if r["case"] != case:
            case = r["case"]
            print(f"\n{case}")
        ratio = r.get("vs_torch", r.get("x_act_alone"))
        what = "vs torch" if "vs_torch" in r else "time / act alone"
        print(f"  {r['impl']:<{width}}  {r['ms']:9.3f} ms" + ("" if ratio is None else f"  {what} {ratio:5.2f}x"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": sysinfo.cpu(), "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
