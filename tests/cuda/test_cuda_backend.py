"""The `cuda` backend against the shared reference, on device arrays, plus its device-side contract.

Runs under the CUDA simulator (see conftest.py) with `SimDeviceArray`s, or on a
real GPU with Numba device arrays when MULTIACT_CUDA_REAL=1.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact import registry
from multiact.ops import FLOAT_DTYPES, OPS

REAL = os.environ.get("MULTIACT_CUDA_REAL") == "1"
OK, WHY = registry.availability("cuda")
pytestmark = pytest.mark.skipif(not OK, reason=f"cuda: {WHY}")

if REAL:
    from numba import cuda as _cuda

    def to_dev(a):
        return _cuda.to_device(np.asarray(a) if np.asarray(a).flags.forc else np.ascontiguousarray(a))
else:
    from multiact.backends.cuda_sim import to_device as to_dev


def host(a):
    return a.copy_to_host()


CASES = [
    pytest.param(op, params, id=f"{op}[{C.case_id(params)}]")
    for op in OPS
    for params in C.param_cases(OPS[op])
]


def test_available_and_info():
    info = {b.name: b for b in ma.backends()}["cuda"]
    assert info.available
    if not REAL:
        assert "simulator" in info.reason and "CPU emulation" in info.reason
        assert info.details["simulator"] is True
    assert info.devices and "compute capability" in info.devices[0]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,params", CASES)
def test_matches_reference(op, params, dtype):
    spec = OPS[op]
    failures = []
    for direction in C.directions(spec, params):
        v = C.run_case("cuda", op, direction, dtype, params, to_kind=to_dev, from_kind=host)
        if not v.passed:
            failures.append(f"{direction}: {v.describe()}")
    assert not failures, "\n".join(failures)


def test_default_dispatch_and_result_kind():
    x = to_dev(np.linspace(-2, 2, 9, dtype=np.float32))
    assert "-> cuda" in ma.explain("silu", x)
    y = ma.silu(x)
    assert type(y) is type(x) and y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_allclose(host(y), ma.silu(host(x), backend="numpy"), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_sizes(dtype):
    rng = np.random.default_rng(7)
    for op in ("relu", "gelu", "softplus", "hardswish"):
        spec = OPS[op]
        for n in (0, 1, 31, 33, 65, 1000):
            x = (rng.standard_normal(n) * 4).astype(dtype)
            dy = rng.standard_normal(n).astype(dtype)
            got = host(ma.forward(op, to_dev(x), backend="cuda"))
            v = C.compare(got, C.reference(spec, "forward", {}, dtype, x), x, spec, "forward")
            assert v.passed and got.shape == (n,), f"{op} n={n}: {v.describe()}"
            got = host(ma.backward(op, to_dev(dy), to_dev(x), backend="cuda"))
            v = C.compare(got, C.reference(spec, "backward", {}, dtype, dy, x), x, spec, "backward", scale=dy)
            assert v.passed, f"{op} grad n={n}: {v.describe()}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts_and_in_place(dtype):
    """0-d, strided, transposed, Fortran, negative strides, and >4 dims: equal to the contiguous result."""
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((9, 7)) * 3).astype(dtype)
    d = to_dev(base)
    views = {
        "0-d": to_dev(np.array(0.7, dtype=dtype)),
        "strided": d[:, ::3],
        "transposed": d.T,
        "fortran": to_dev(np.asfortranarray(base)),
        "negative": d[::-1, ::-2],
        "6-d": to_dev((rng.standard_normal((2, 3, 2, 3, 2, 4)) * 3).astype(dtype))[:, :, ::-1, :, :, ::2],
    }
    for op in ("relu", "elu", "gelu", "tanhshrink", "threshold"):
        params = C.param_cases(OPS[op])[0]
        for name, x in views.items():
            xh = host(x).copy(order="C")
            want = host(ma.forward(op, to_dev(xh), **params))
            got = ma.forward(op, x, **params)
            assert got.shape == x.shape and got.dtype == x.dtype
            np.testing.assert_array_equal(host(got), want, err_msg=f"{op} {name}")
            inplace = to_dev(host(x))
            res = ma.forward(op, inplace, out=inplace, **params)
            assert res is inplace
            np.testing.assert_array_equal(host(inplace), want, err_msg=f"{op} {name} in place")
            dy = to_dev(np.ones_like(xh))
            gwant = host(ma.backward(op, dy, to_dev(xh), **params))
            g = ma.backward(op, dy, x, out=dy, **params)
            np.testing.assert_array_equal(host(g), gwant, err_msg=f"{op} {name} grad in place on dy")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_prelu_channels_and_weight_grad(dtype):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 5, 4, 6)) * 2).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    spec = OPS["prelu"]
    for axis in (1, 3, -1):
        w = np.linspace(-0.5, 1.5, x.shape[axis]).astype(dtype)
        shape = [1] * x.ndim
        shape[axis] = w.size
        wb = w.reshape(shape).astype(np.float64)
        for wgiven in (w, to_dev(w)):  # a host weight is uploaded; a device one is used in place
            y = host(ma.prelu(to_dev(x), wgiven, axis=axis))
            assert C.compare(y, spec.forward(x.astype(np.float64), wb, axis), x, spec, "forward").passed
            g = host(ma.prelu_grad(to_dev(dy), to_dev(x), wgiven, axis=axis))
            want = spec.backward(dy.astype(np.float64), x.astype(np.float64), wb, axis)
            assert C.compare(g, want, x, spec, "backward", scale=dy).passed
            wg = ma.prelu_weight_grad(to_dev(dy), to_dev(x), wgiven, axis=axis)
            assert type(wg) is type(to_dev(w)) and wg.shape == w.shape and wg.dtype == w.dtype
            want = spec.param_grad[1](dy.astype(np.float64), x.astype(np.float64), w, axis % x.ndim)
            np.testing.assert_allclose(host(wg).astype(np.float64), want, rtol=2e-3 if dtype == "float16" else 1e-5,
                                       atol=1e-2 if dtype == "float16" else 1e-4)
    one = ma.prelu_weight_grad(to_dev(dy), to_dev(x), np.array([0.25], dtype=dtype))
    want = spec.param_grad[1](dy.astype(np.float64), x.astype(np.float64), np.array([0.25]), 1)
    np.testing.assert_allclose(host(one).astype(np.float64), want, rtol=2e-3 if dtype == "float16" else 1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_swish_beta_grad_is_a_device_scalar(dtype):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(3000) * 3).astype(dtype)
    dy = rng.standard_normal(3000).astype(dtype)
    x[:3] = [np.inf, -np.inf, 0.0]
    for beta in (1.0, 1.3, -0.7):
        got = ma.swish_beta_grad(to_dev(dy), to_dev(x), beta)
        assert got.shape == () and got.dtype == np.dtype(dtype) and hasattr(got, "__cuda_array_interface__")
        b = float(np.float32(beta)) if dtype != "float64" else beta
        want = OPS["swish"].param_grad[1](dy.astype(np.float64), x.astype(np.float64), b)
        assert np.isclose(float(host(got)), want, rtol=1e-3 if dtype == "float16" else 1e-5, atol=1e-3)


def test_nan_in_nan_out_every_op():
    x = np.array([np.nan, 1.0, np.nan, -1.0, np.nan], dtype=np.float32)
    for op, spec in OPS.items():
        kw = dict(C.param_cases(spec)[0])
        if op == "prelu":
            kw = {"weight": np.array([0.25], dtype=np.float32)}
        y = host(ma.forward(op, to_dev(x), **kw))
        assert np.isnan(y[[0, 2, 4]]).all() and not np.isnan(y[[1, 3]]).any(), op
        g = host(ma.backward(op, to_dev(np.ones_like(x)), to_dev(x), **kw))
        assert np.isnan(g[[0, 2, 4]]).all(), op


# ---- errors: checked before any write ----------------------------------------------------------------------


def test_mixed_host_and_device_is_a_type_error_naming_both():
    x = to_dev(np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"dy is numpy\.ndarray.*x is .*SimDeviceArray|dy is numpy.*x is numba"):
        ma.relu_grad(np.ones(4, np.float32), x)
    with pytest.raises(TypeError, match="out is numpy.ndarray"):
        ma.relu(x, out=np.empty(4, np.float32))


def test_out_checks():
    xh = np.linspace(-1, 1, 16, dtype=np.float32)
    x = to_dev(xh)
    with pytest.raises(ValueError, match="overlaps x"):
        ma.relu(x[:15], out=x[1:])
    with pytest.raises(ValueError, match="overlaps dy"):
        ma.relu_grad(x[:15], to_dev(xh[:15]), out=x[1:])
    if not REAL:
        ro = to_dev(np.zeros(16, np.float32)).readonly()
        with pytest.raises(ValueError, match="read-only"):
            ma.relu(x, out=ro)
    with pytest.raises(ValueError, match="shape"):
        ma.relu(x, out=to_dev(np.zeros(15, np.float32)))
    with pytest.raises(TypeError, match="dtype"):
        ma.relu(x, out=to_dev(np.zeros(16, np.float64)))
    np.testing.assert_array_equal(host(x), xh)  # nothing was written
    # disjoint interleaved views do not overlap: allowed
    ma.relu(x[::2], out=x[1::2])
    np.testing.assert_array_equal(host(x)[1::2], np.maximum(xh[::2], 0))


def test_prelu_weight_errors():
    x = to_dev(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="weight has shape"):
        ma.prelu(x, np.ones(4, np.float32))
    with pytest.raises(TypeError, match="weight has dtype"):
        ma.prelu(x, to_dev(np.ones(3, np.float64)))
