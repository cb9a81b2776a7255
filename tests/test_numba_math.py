"""The float32 device functions of multiact/backend/numba_math.py: accuracy sweeps, edge values, vectorisation."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from multiact.backend import numba_backend as nb  # noqa: E402
from multiact.backend import numba_math as nm  # noqa: E402

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _f64(f):
    return lambda x: np.asarray(f(x), dtype=np.float64)


# name -> (float64 reference, ulp bound asserted, sweep range)
PRIMITIVES = {
    "exp": (np.exp, 1.0, (-110.0, 90.0)),
    "expm1": (np.expm1, 1.5, (-30.0, 90.0)),
    "log1p": (np.log1p, 1.0, (-1.0, 1e4)),
    "tanh": (np.tanh, 1.5, (-12.0, 12.0)),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), 2.5, (-110.0, 40.0)),
    "softplus0": (lambda z: np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z))), 1.5, (-110.0, 40.0)),
    "sech2": (lambda x: 1.0 / np.cosh(x) ** 2, 2.0, (-60.0, 60.0)),
    "erfc": (_f64(_erfc), 2.0, (-5.0, 10.5)),
    "ncdf": (lambda x: 0.5 * _f64(_erfc)(-x / math.sqrt(2.0)), 2.5, (-15.0, 6.0)),
    "npdf": (lambda x: np.exp(-x * x / 2) / math.sqrt(2 * math.pi), 2.0, (-15.0, 15.0)),
}

EDGES = np.array(
    [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-45, -1e-45, 1e-38, -1e-38, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan],
    dtype=np.float32,
)


def _apply(name: str, x: np.ndarray) -> np.ndarray:
    return _loop(name)(x)


_LOOPS: dict = {}


def _loop(name: str):
    if name not in _LOOPS:
        f = getattr(nm.cpu(), name)

        @numba.njit(error_model="numpy", fastmath={"contract"})  # as the backend's float32 loops
        def run(x):
            out = np.empty_like(x)
            for i in range(x.size):
                out[i] = f(x[i])
            return out

        _LOOPS[name] = run
    return _LOOPS[name]


def _ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of float32 spacing at ref (the subnormal spacing at least)."""
    with np.errstate(all="ignore"):
        r32 = ref.astype(np.float32)
        sp = np.maximum(np.spacing(np.abs(r32)).astype(np.float64), 2.0**-149)
        err = np.abs(got.astype(np.float64) - ref) / sp
    return np.where(np.isfinite(r32), err, 0.0)


@pytest.mark.parametrize("name", list(PRIMITIVES))
def test_accuracy_sweep(name):
    ref, bound, (lo, hi) = PRIMITIVES[name]
    rng = np.random.default_rng(7)
    x = np.concatenate([
        np.linspace(lo, hi, 150_001), np.linspace(-2.0, 2.0, 40_001), rng.uniform(lo, hi, 20_000),
    ]).astype(np.float32)
    x = x[(x >= lo) & (x <= hi)]
    with np.errstate(all="ignore"):
        r = ref(x.astype(np.float64))
    err = _ulps(_apply(name, x), r)
    i = int(np.argmax(err))
    assert err[i] <= bound, f"{name}({x[i]!r}): {err[i]:.2f} ulp > {bound}"


@pytest.mark.parametrize("name", list(PRIMITIVES))
def test_edge_values(name):
    ref, bound, _ = PRIMITIVES[name]
    with np.errstate(all="ignore"):
        r = ref(EDGES.astype(np.float64))
        r32 = r.astype(np.float32)
    got = _apply(name, EDGES)
    assert np.array_equal(np.isnan(got), np.isnan(r32)), (EDGES, got, r32)
    inf = np.isinf(r32)
    assert np.array_equal(got[inf], r32[inf]), (EDGES[inf], got[inf])
    assert (_ulps(got, r)[~inf] <= bound).all(), (EDGES, got, r32)


def test_log1p_domain():
    x = np.array([-1.0, -1.5, -np.inf, 1e-30, 2.0**-126 / 3], dtype=np.float32)
    got = _apply("log1p", x)
    assert got[0] == -np.inf and np.isnan(got[1]) and np.isnan(got[2])
    assert got[3] == x[3] and got[4] == x[4]


def test_subnormal_results_within_one_step():
    """2^k is applied in two halves, so a subnormal result is rounded once, not twice."""
    x = np.linspace(-103.9, -87.4, 20_001).astype(np.float32)  # exp(x) is subnormal here
    err = _ulps(_apply("exp", x), np.exp(x.astype(np.float64)))
    assert err.max() <= 1.0


def test_python_and_compiled_agree():
    """The uncompiled functions (NumPy bit casts) are the same formulas as the compiled ones."""
    x = np.array([-90.0, -3.3, -0.7, -1e-3, 0.0, 2e-5, 0.4, 1.0, 5.5, 30.0], dtype=np.float32)
    py = nm.python()
    for name in ("exp", "expm1", "log1p", "tanh", "sigmoid", "erfc", "ncdf"):
        f = getattr(py, name)
        with np.errstate(all="ignore"):
            want = np.array([f(v) for v in x], dtype=np.float32)
        assert np.array_equal(want, _apply(name, x), equal_nan=True), name


def test_build_swaps_bitcasts():
    """`build` compiles with whatever bit casts it is given (the CUDA side swaps in libdevice's)."""
    calls = []

    def tracing_i32_as_f32(i):
        calls.append(int(i))
        return np.array(i, dtype=np.int32).view(np.float32)[()]

    ns = nm.build(lambda f: f, {"_i32_as_f32": tracing_i32_as_f32})
    assert ns.exp(np.float32(1.0)) == np.float32(math.e)
    assert calls and set(ns.__dict__) == set(nm.names())


@pytest.mark.parametrize("op", ["sigmoid", "gelu", "gelu_tanh", "silu"])
def test_float32_loop_is_vectorised(op):
    """numba >= 0.62 has no SVML: only arithmetic-only math keeps these loops in SIMD registers."""
    pair = nb._loops((op, "forward", "float32"))
    loop = nb._make_loop(pair.scalar, pair.arity, False, pair.tag, cache=False)  # cached code can't be inspected
    x = np.linspace(-4, 4, 64, dtype=np.float32)
    loop(*nb._inputs((x,)), np.empty_like(x), 0.0, 0.0)  # the signature the backend calls: read-only inputs
    sig = loop.signatures[0]
    ir = loop.inspect_llvm(sig)
    asm = loop.inspect_asm(sig)
    assert re.search(r"<(8|16) x float>", ir), f"{op}: no <8 x float> / <16 x float> in the LLVM IR"
    assert re.search(r"%[yz]mm\d", asm), f"{op}: no ymm/zmm register in the machine code"


def test_numba_compiles_the_shared_formula_table():
    """One source of truth: every numba loop's scalar is a formula of formulas.py (the cuda backend's too)."""
    from multiact.backend import formulas

    for dtype in ("float32", "float64"):
        for (op, direction), name in formulas.TABLE.items():
            if direction == "param_grad":
                continue
            code = nb._loops((op, direction, dtype)).scalar.py_func.__code__
            want = getattr(formulas, name).__code__
            where = (code.co_filename, code.co_firstlineno, code.co_code)
            assert where == (want.co_filename, want.co_firstlineno, want.co_code), (op, direction, dtype)
