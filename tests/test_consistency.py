"""The shared suite: every op x direction x dtype x backend against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_backends, require, supports

import multiact as ma
from multiact import consistency as C
from multiact.optable import FLOAT_DTYPES, OPS

BACKENDS = host_backends()
CASES = [
    pytest.param(op, params, id=f"{op}[{C.case_id(params)}]")
    for op in OPS
    for params in C.param_cases(OPS[op])
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,params", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_reference(backend, op, params, dtype):
    for direction in C.directions(OPS[op], params):
        require(backend, op, direction, dtype)
    failures = C.case_failures(backend, op, params, dtype)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_nan_out(backend, op, dtype):
    require(backend, op, "forward", dtype)
    spec = OPS[op]
    params = C.param_cases(spec)[0]
    x = np.array([np.nan, 1.0, np.nan, -1.0, np.nan], dtype=dtype)
    kw = {k: v for k, v in params.items()}
    if op == "prelu":
        kw = {"weight": np.array([0.25], dtype=dtype)}
    y = ma.forward(op, x, backend=backend, **kw)
    assert np.isnan(y[[0, 2, 4]]).all() and not np.isnan(y[[1, 3]]).any()
    g = ma.backward(op, np.ones_like(x), x, backend=backend, **kw)
    assert np.isnan(g[[0, 2, 4]]).all()


SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4096 * 3 + 5, 70_001]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sizes_around_tiles(backend, dtype):
    """Sizes around every plausible vector width and block, for every op, forward and backward."""
    require(backend, "relu", "forward", dtype)
    rng = np.random.default_rng(7)
    for op, spec in OPS.items():
        params = C.param_cases(spec)[0]
        if op == "prelu":
            continue  # its own test, with channels
        # Past 64K elements CPU backends switch to their threaded loops: a few ops cover that path
        # (it is one loop factory for all ops), so the numba backend compiles it only for those.
        for n in SIZES if op in ("relu", "gelu", "silu", "mish", "softplus") else SIZES[:-1]:
            x = (rng.standard_normal(n) * 4).astype(dtype)
            dy = rng.standard_normal(n).astype(dtype)
            want = C.reference(spec, "forward", params, dtype, x)
            v = C.compare(ma.forward(op, x, backend=backend, **params), want, x, spec, "forward", params=params)
            assert v.passed, f"{op} n={n}: {v.describe()}"
            want = C.reference(spec, "backward", params, dtype, dy, x)
            got = ma.backward(op, dy, x, backend=backend, **params)
            v = C.compare(got, want, x, spec, "backward", scale=dy, params=params)
            assert v.passed, f"{op} grad n={n}: {v.describe()}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_layouts_and_in_place(backend, dtype):
    """0-d, strided, transposed and Fortran inputs; out=x in place equals out of place."""
    require(backend, "relu", "forward", dtype)
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((37, 29)) * 3).astype(dtype)
    views = {
        "0-d": np.array(0.7, dtype=dtype),
        "strided": base[:, ::3],
        "transposed": base.T,
        "fortran": np.asfortranarray(base),
        "negative": base[::-1, ::-2],
    }
    for op, spec in OPS.items():
        if op == "prelu" or not supports(backend, op, "forward", dtype):  # native's float64: some ops
            continue
        params = C.param_cases(spec)[0]
        for name, x in views.items():
            want = ma.forward(op, np.ascontiguousarray(x), backend=backend, **params)
            got = ma.forward(op, x, backend=backend, **params)
            assert got.shape == x.shape and got.dtype == x.dtype
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {name}")
            inplace = x.copy()
            res = ma.forward(op, inplace, out=inplace, backend=backend, **params)
            assert res is inplace
            np.testing.assert_array_equal(inplace, want, err_msg=f"{op} {name} in place")
            dy = np.ones_like(x)
            gwant = ma.backward(op, np.ascontiguousarray(dy), np.ascontiguousarray(x), backend=backend, **params)
            g = ma.backward(op, dy, x, out=dy, backend=backend, **params)
            np.testing.assert_array_equal(g, gwant, err_msg=f"{op} {name} grad in place on dy")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_prelu_channels_and_weight_grad(backend, dtype):
    require(backend, "prelu", "param_grad", dtype)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 5, 4, 6)) * 2).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    spec = OPS["prelu"]
    for axis in (1, 3, -1):
        w = np.linspace(-0.5, 1.5, x.shape[axis]).astype(dtype)
        shape = [1] * x.ndim
        shape[axis] = w.size
        wb = w.reshape(shape).astype(np.float64)
        y = ma.prelu(x, w, axis=axis, backend=backend)
        v = C.compare(y, spec.forward(x.astype(np.float64), wb, axis), x, spec, "forward")
        assert v.passed, v.describe()
        g = ma.prelu_grad(dy, x, w, axis=axis, backend=backend)
        v = C.compare(g, spec.backward(dy.astype(np.float64), x.astype(np.float64), wb, axis), x, spec,
                      "backward", scale=dy)
        assert v.passed, v.describe()
        wg = ma.prelu_weight_grad(dy, x, w, axis=axis, backend=backend)
        want = spec.param_grad[1](dy.astype(np.float64), x.astype(np.float64), w, axis % x.ndim)
        assert wg.shape == w.shape and wg.dtype == w.dtype
        np.testing.assert_allclose(wg.astype(np.float64), want, rtol=2e-3 if dtype == "float16" else 1e-5,
                                   atol=1e-2 if dtype == "float16" else 1e-4)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_swish_beta_grad(backend, dtype):
    require(backend, "swish", "param_grad", dtype)
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(5000) * 3).astype(dtype)
    dy = rng.standard_normal(5000).astype(dtype)
    for beta in (1.0, 1.3, -0.7):
        got = ma.swish_beta_grad(dy, x, beta, backend=backend)
        b = float(np.float32(beta)) if dtype != "float64" else beta
        want = OPS["swish"].param_grad[1](dy.astype(np.float64), x.astype(np.float64), b)
        assert np.isclose(float(got), want, rtol=1e-3 if dtype == "float16" else 1e-5, atol=1e-3)
