"""float64 accuracy of a backend over a dense sweep: 2^22 inputs per op, case and direction, judged against the
float64 reference in float64 ULP of the reference, by the rules of `multiact check --dense` (multiact/cli/accuracy.py)
with float64's eps and smallest normal:

- forward: |got - ref| / ulp(ref), less the op's declared cancellation fwd_atol * eps |x|;
- backward (dy = 1), backward2 (g = dy = 1): less a floor of 2 eps (backward2: the suite's 8 eps) for |x| < 10,
  where derivatives cross zero away from a kink; plain ULP in the tails |x| >= 10;
- from the output (y-form, on the rounded forward): 2 eps |y| more.
Results below DBL_MIN are left out (counted, zeros included); NaN, +-inf and overflow must match exactly.

The float64 reference is the contract, but not exact: where it rounds an intermediate it carries that error (mish's
softplus before sech^2, a subnormal e^x times x).  Each row's worst input is therefore also judged against mpmath
at 60 digits (the smooth ops' formulas below, derivatives by mp.diff): "ref err" is the reference's own error there,
"got err" the backend's, both in ulp of the exact value.

Inputs: 2^20 bit patterns evenly spaced over [2^-40, 800] on each sign (every binade of the tails and of the
neighbourhood of 0) and 2^21 points evenly spaced on [-40, 40].  Run once per ISA (MULTIACT_NATIVE_ISA) on the
native backend, and for numba as the peer (libm):

    MULTIACT_NATIVE_ISA=avx2 python scripts/accuracy_f64.py --backend native --out results/...
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS

EPS = float(np.finfo(np.float64).eps)
TINY = float(np.finfo(np.float64).tiny)
BOUND = 4.0


def _mp_forms():
    """The smooth ops as mpmath functions of (x, parameters), for the worst inputs' exact values."""
    import mpmath as mp

    sig = lambda z: 1 / (1 + mp.exp(-z))  # noqa: E731
    sp = lambda z: mp.log1p(mp.exp(z))  # noqa: E731
    k = mp.sqrt(2 / mp.pi)
    return mp, {
        "elu": lambda x, p: x if x > 0 else p["alpha"] * mp.expm1(x),
        "selu": lambda x, p: p["scale"] * (x if x > 0 else p["alpha"] * mp.expm1(x)),
        "celu": lambda x, p: x if x > 0 else p["alpha"] * mp.expm1(x / p["alpha"]),
        "sigmoid": lambda x, p: sig(x),
        "logsigmoid": lambda x, p: -sp(-x),
        "tanh": lambda x, p: mp.tanh(x),
        "softplus": lambda x, p: x if x * p["beta"] > p["threshold"] else sp(p["beta"] * x) / p["beta"],
        "silu": lambda x, p: x * sig(x),
        "swish": lambda x, p: x * sig(p["beta"] * x),
        "fast_gelu": lambda x, p: x * sig(mp.mpf(1.702) * x),
        "gelu": lambda x, p: (x * sig(2 * k * (x + mp.mpf(0.044715) * x**3)) if p["approximate"] == "tanh"
                              else x * mp.erfc(-x / mp.sqrt(2)) / 2),
        "mish": lambda x, p: x * mp.tanh(sp(x)),
        "tanhshrink": lambda x, p: x - mp.tanh(x),
    }


def exact_errors(op, d, p, x, got, ref) -> tuple[float, float] | None:
    """(the reference's error, the backend's) in ulp of the exact value at x (None without an mpmath form)."""
    try:
        mp, forms = _mp_forms()
    except ImportError:
        return None
    if op not in forms or d == "backward_y" or not np.isfinite(x):
        return None
    mp.mp.dps = 60
    f = lambda t: forms[op](t, {k: (mp.mpf(v) if isinstance(v, float) else v) for k, v in p.items()})  # noqa: E731
    t = float(f(mp.mpf(x)) if d == "forward" else mp.diff(f, mp.mpf(x), 1 if d == "backward" else 2))
    sp = float(np.spacing(abs(t))) if t != 0 else TINY
    return abs(ref - t) / sp, abs(got - t) / sp


def points() -> np.ndarray:
    lo, hi = np.array([2.0**-40, 800.0]).view(np.uint64)
    bits = np.linspace(int(lo), int(hi), 1 << 20).astype(np.uint64)
    pos = bits.view(np.float64)
    return np.concatenate([pos, -pos, np.linspace(-40, 40, 1 << 21), C.specials(np.float64)])


def ulps(got: np.ndarray, ref: np.ndarray, floor: np.ndarray) -> np.ndarray:
    sp = np.spacing(np.abs(ref))
    return np.maximum(np.abs(got - ref) - floor, 0.0) / sp


def judge(got, ref, floor) -> tuple[float, int, int, int, int]:
    """(max ulp, points over BOUND, special misses, results below DBL_MIN left out, the worst point's index)."""
    with np.errstate(all="ignore"):
        special = ~np.isfinite(ref)
        miss = int(np.sum(special & ~((got == ref) | (np.isnan(got) & np.isnan(ref)))))
        miss += int(np.sum(~special & ~np.isfinite(got)))
        normal = ~special & (np.abs(ref) >= TINY)
        u = np.zeros(got.shape)
        u[normal] = ulps(got[normal], ref[normal], floor[normal] if np.ndim(floor) else floor)
    return float(u.max(initial=0.0)), int(np.sum(u > BOUND)), miss, int(np.sum(~special & ~normal)), int(u.argmax())


def served(backend: str, spec, p, direction: str) -> bool:
    """Whether the backend computes this row in float64 itself (native: where it has the kernel; elsewhere the
    call would fall through to another backend)."""
    if backend != "native":
        return True
    from multiact.backend import native_backend

    return native_backend.supports(spec.kernel_key(p), direction, "float64")


def rows(backend: str, ops: list[str] | None):
    x = points()
    for op, spec in OPS.items():
        if (ops and op not in ops) or spec.defn.array_param:  # a weight per channel: not an elementwise sweep
            continue
        for params in C.param_cases(spec):
            p = C._rounded(spec, params, np.float64)
            dirs = ["forward", "backward"] + (["backward_y"] if "backward_y" in C.directions(spec, params) else [])
            dirs += ["backward2"] if spec.backward2 is not None else []
            for d in dirs:
                if not served(backend, spec, p, d):
                    continue
                yield (op, C.case_id(params), d,
                       *measure(spec, op, d, params, p, x, backend))


def measure(spec, op, d, params, p, x, backend):
    one = np.ones_like(x)
    small = np.abs(x) < 10
    with np.errstate(all="ignore"):
        if d == "forward":
            got = ma.forward(op, x, backend=backend, **params)
            ref = spec.forward(x, **p)
            floor = spec.tol.fwd_atol * EPS * np.where(np.isfinite(x), np.abs(x), 0.0)
        elif d == "backward":
            got = ma.backward(op, one, x, backend=backend, **params)
            ref = spec.backward(one, x, **p)
            floor = np.where(small, 2 * EPS, 0.0)
        elif d == "backward_y":
            y = np.asarray(spec.forward(x, **p), dtype=np.float64)
            got = ma.backward(op, one, y=y, backend=backend, **params)
            ref = spec.backward_y(one, y, **p)
            floor = np.where(small, 2 * EPS, 0.0) + 2 * EPS * np.where(np.isfinite(y), np.abs(y), 0.0)
        else:
            got = ma.backward2(op, one, one, x, backend=backend, **params)
            ref = spec.backward2(one, one, x, **p)
            floor = np.where(small, C.BWD2_ATOL * EPS, 0.0)
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    mx, over, miss, sub, i = judge(got, ref, floor)
    exact = exact_errors(op, d, p, float(x[i]), float(got[i]), float(ref[i])) if mx > BOUND else None
    return mx, over, miss, sub, float(x[i]), exact


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="native")
    ap.add_argument("--op", help="comma list (default: every op the backend has float64 kernels of)")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    from multiact.cli import sysinfo

    head = [f"# float64 dense sweep (scripts/accuracy_f64.py), backend {a.backend}"
            f" (MULTIACT_NATIVE_ISA={os.environ.get('MULTIACT_NATIVE_ISA', 'auto')}), {len(points())} inputs per row,"
            f" bound {BOUND:g} ulp", f"# {sysinfo.describe(sysinfo.identity())}",
            f"{'op':12s} {'case':28s} {'direction':10s} {'max ulp':>8s} {'>4 ulp':>7s} {'special':>7s} {'<DBL_MIN':>9s}"
            f"  worst x: {'x':>23s} {'ref err':>8s} {'got err':>8s}"]
    out, worst, worst_exact, t0 = list(head), 0.0, 0.0, time.time()
    print("\n".join(head), flush=True)
    for op, case, d, mx, over, miss, sub, wx, exact in rows(a.backend, a.op.split(",") if a.op else None):
        line = f"{op:12s} {case:28s} {d:10s} {mx:8.2f} {over:7d} {miss:7d} {sub:9d}"
        if mx > BOUND:
            line += f"  worst x: {wx!r:>23s}" + (f" {exact[0]:8.1f} {exact[1]:8.1f}" if exact else "")
            exact_got = exact[1] if exact else mx
        else:
            exact_got = mx
        print(line, flush=True)
        out.append(line)
        worst = max(worst, mx if not miss else np.inf)
        worst_exact = max(worst_exact, exact_got if not miss else np.inf)
    out.append(f"# worst {worst:.2f} ulp from the reference; at each row's worst input, {worst_exact:.2f} ulp from "
               f"the exact value; {time.time() - t0:.0f} s")
    print(out[-1])
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(out) + "\n")
    return 0 if worst_exact <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
