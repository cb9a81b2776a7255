"""The shared float32 formulas on libm stay within tolerance when libdevice errs by its documented worst case.

The simulator evaluates libm correctly rounded, which is kinder than a GPU:
libdevice documents expf/tanhf/erff at 2 ulp, expm1f/log1pf at 1 ulp and erfcf
at 4 ulp.  Here every libm result is pushed by a random number of ulps within
those bounds (plain Python, no simulator), so a formulation that only passes
with exact libm fails here first.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from multiact import consistency as C
from multiact.backend import formulas as F
from multiact.optable import OPS

BOUNDS = {"exp": 2, "expm1": 1, "log1p": 1, "tanh": 2, "erf": 2, "erfc": 4}


def _libm_with_error(rng: np.random.Generator) -> dict:
    def wrap(fn, k):
        def g(v):
            try:
                r = np.float32(fn(float(v)))
            except OverflowError:
                return np.float32(np.inf)
            if not np.isfinite(r) or r == 0:
                return r
            steps = int(rng.integers(-k, k + 1))
            toward = np.float32(np.inf if steps > 0 else -np.inf)
            for _ in range(abs(steps)):
                r = np.nextafter(r, toward)
            return r

        return g

    fns = {f"_{name}": wrap(getattr(math, name), k) for name, k in BOUNDS.items()}
    fns["_cosh"] = wrap(math.cosh, 0)  # float64 only
    return fns


@pytest.mark.parametrize("seed", [1, 2])
def test_float32_formulas_under_libdevice_error_bounds(seed):
    rng = np.random.default_rng(seed)
    f32 = F.build(lambda f: f, np.float32, F.libm(lambda f: f, np.float32, _libm_with_error(rng)))
    f64 = F.python(np.float64)
    t = np.float32
    failures = []
    with np.errstate(all="ignore"):
        for op, spec in OPS.items():
            if op == "prelu":
                continue
            for params in C.param_cases(spec):
                p = spec.validate(params)
                x = C.sample_x(spec, params, "float32", n=300, seed=seed)
                dy = np.random.default_rng(seed).standard_normal(x.size).astype(np.float32)
                a, b = F.scalar_params(op, p, "float32")
                for direction in C.directions(spec, params):
                    ns = f64 if (op, direction) in F.WIDE else f32
                    f = getattr(ns, F.formula_name(op, direction, p))
                    cast = np.float64 if ns is f64 else t
                    if direction == "forward":
                        args, ref_in, scale, xx = [(cast(v),) for v in x], (x,), None, x
                    else:
                        xx = x
                        if direction == "backward_y":
                            xx = np.asarray(C.reference(spec, "forward", params, "float32", x)).astype(np.float32)
                        args, ref_in = [(cast(g), cast(v)) for g, v in zip(dy, xx, strict=True)], (dy, xx)
                        scale = dy if direction == "backward" else dy.astype(np.float64) * xx
                    got = np.array([f(*arg, a, b) for arg in args]).astype(np.float32)
                    ref = C.reference(spec, direction, params, "float32", *ref_in)
                    v = C.compare(got, ref, xx, spec, direction, scale=scale, params=params)
                    if not v.passed:
                        failures.append(f"{op} {C.case_id(params)} {direction}: {v.describe()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("compute", ["float32", "float64"])
def test_cuda_compiles_the_shared_formula_table(compute):
    """One source of truth: the cuda backend's device functions are the formulas the numba backend compiles,
    inlined into each kernel at numba's IR level (so a kernel compiles without a driver, scripts/cuda_ptx_report.py)."""
    from multiact.backend import cuda_backend

    ns = cuda_backend._formulas(compute)
    for name in set(F.TABLE.values()):
        dev = getattr(ns, name)
        py = dev.py_func  # a real GPU's dispatcher and the simulator's kernel both keep it
        assert py.__code__ is getattr(F, name).__code__, name
