"""The `cuda` backend against the shared reference, on device arrays, plus its device-side contract.

Under the CUDA simulator (see conftest.py) the arrays are `SimDeviceArray`s.  On
a real GPU (MULTIACT_CUDA_REAL=1, scripts/gpu_check.sh) every test runs once per
array library in MULTIACT_CUDA_ARRAYS (default numba,cupy,torch, those
installed), in one process so that each kernel compiles once.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact import registry
from multiact.optable import FLOAT_DTYPES, OPS

REAL = os.environ.get("MULTIACT_CUDA_REAL") == "1"
FULL = os.environ.get("MULTIACT_TEST_FULL") == "1"
OK, WHY = registry.availability("cuda")
pytestmark = pytest.mark.skipif(not OK, reason=f"cuda: {WHY}")


class Kind:
    """One library's device arrays: made from NumPy, read back to NumPy."""

    def __init__(self, name: str):
        self.name = name
        if name == "sim":
            from multiact.backend.cuda_sim import to_device

            self._to = to_device
        elif name == "numba":
            from numba import cuda

            self._to = lambda a: cuda.to_device(a if a.flags.forc else np.ascontiguousarray(a))
        elif name == "cupy":
            import cupy

            self._to = lambda a: cupy.asarray(a, order="K")
        elif name == "torch":
            import torch

            self._to = lambda a: torch.from_numpy(a.copy(order="K")).cuda()
        else:
            raise ValueError(f"unknown array kind {name!r}")

    def to(self, a):
        return self._to(np.asarray(a))

    def host(self, a) -> np.ndarray:
        if self.name == "cupy":
            return a.get()
        if self.name == "torch":
            return a.cpu().numpy()
        return a.copy_to_host()

    def __repr__(self) -> str:
        return self.name


def _kinds() -> list[str]:
    if not REAL:
        return ["sim"]
    out = []
    for k in os.environ.get("MULTIACT_CUDA_ARRAYS", "numba,cupy,torch").split(","):
        try:
            __import__(k)
            out.append(k)
        except ImportError:
            pass
    return out


@pytest.fixture(params=_kinds(), scope="module")
def kind(request) -> Kind:
    return Kind(request.param)


def dt(a) -> np.dtype:
    """NumPy dtype of any array (torch's dtypes do not compare with NumPy's)."""
    return np.dtype(str(a.dtype).replace("torch.", ""))


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
def test_matches_reference(kind, op, params, dtype):
    failures = C.case_failures("cuda", op, params, dtype, to_kind=kind.to, from_kind=kind.host)
    assert not failures, "\n".join(failures)


# backward2 (g * dy * f''(x)) under the simulator, which runs every GPU thread as Python: one dtype per sampled key
# by default (each dtype, and prelu's weightless kernel, somewhere); every case x dtype on a GPU or with
# MULTIACT_TEST_FULL=1.
BWD2_SAMPLE = {"gelu_tanh": "float32", "mish": "float16", "softplus": "bfloat16", "swish": "float64",
               "prelu": "float32"}


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, "bfloat16"])
@pytest.mark.parametrize("op,params", CASES)
def test_backward2_matches_reference(kind, op, params, dtype):
    spec = OPS[op]
    key = spec.kernel_key(spec.validate(params)) if op != "prelu" else op
    if not (REAL or FULL) and (BWD2_SAMPLE.get(key) != dtype or (op == "swish" and params.get("beta") != -0.7)):
        pytest.skip("the simulator runs a sample of backward2's cases; all of them with MULTIACT_TEST_FULL=1")
    if dtype == "bfloat16":
        dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    failures = C.backward2_failures("cuda", op, params, dtype, to_kind=kind.to, from_kind=kind.host,
                                    n=600 if REAL or FULL else 150)
    assert not failures, "\n".join(failures)


def test_default_dispatch_and_result_kind(kind):
    x = kind.to(np.linspace(-2, 2, 9, dtype=np.float32))
    assert "-> cuda" in ma.explain("silu", x)
    y = ma.silu(x)
    assert type(y) is type(x) and tuple(y.shape) == tuple(x.shape) and dt(y) == dt(x)
    np.testing.assert_allclose(kind.host(y), ma.silu(kind.host(x), backend="numpy"), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_sizes(kind, dtype):
    rng = np.random.default_rng(7)
    for op in ("relu", "gelu", "softplus", "hardswish"):
        spec = OPS[op]
        for n in (0, 1, 31, 33, 65, 1000):
            x = (rng.standard_normal(n) * 4).astype(dtype)
            dy = rng.standard_normal(n).astype(dtype)
            got = kind.host(ma.forward(op, kind.to(x), backend="cuda"))
            v = C.compare(got, C.reference(spec, "forward", {}, dtype, x), x, spec, "forward")
            assert v.passed and got.shape == (n,), f"{op} n={n}: {v.describe()}"
            got = kind.host(ma.backward(op, kind.to(dy), kind.to(x), backend="cuda"))
            v = C.compare(got, C.reference(spec, "backward", {}, dtype, dy, x), x, spec, "backward", scale=dy)
            assert v.passed, f"{op} grad n={n}: {v.describe()}"


def _views(kind: Kind, dtype: str) -> dict:
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((9, 7)) * 3).astype(dtype)
    d = kind.to(base)
    six = kind.to((rng.standard_normal((2, 3, 2, 3, 2, 4)) * 3).astype(dtype))
    views = {
        "0-d": kind.to(np.array(0.7, dtype=dtype)),
        "strided": d[:, ::3],
        "transposed": d.T,
        "fortran": kind.to(np.asfortranarray(base)),
        "6-d": six[:, :, 1:, :, :, ::2],
    }
    if kind.name != "torch":  # torch has no negative strides
        views["negative"] = d[::-1, ::-2]
        views["6-d"] = six[:, :, ::-1, :, :, ::2]
    return views


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts_and_in_place(kind, dtype):
    """0-d, strided, transposed, Fortran, negative strides, >4 dims: equal to the contiguous result."""
    for op in ("relu", "elu", "gelu", "tanhshrink", "threshold"):
        params = C.param_cases(OPS[op])[0]
        for name, x in _views(kind, dtype).items():
            xh = kind.host(x).copy(order="C")
            want = kind.host(ma.forward(op, kind.to(xh), **params))
            got = ma.forward(op, x, **params)
            assert tuple(got.shape) == tuple(x.shape) and dt(got) == dt(x)
            np.testing.assert_array_equal(kind.host(got), want, err_msg=f"{op} {name}")
            inplace = kind.to(kind.host(x))
            res = ma.forward(op, inplace, out=inplace, **params)
            assert res is inplace
            np.testing.assert_array_equal(kind.host(inplace), want, err_msg=f"{op} {name} in place")
            dy = kind.to(np.ones_like(xh))
            gwant = kind.host(ma.backward(op, dy, kind.to(xh), **params))
            g = ma.backward(op, dy, x, out=dy, **params)
            np.testing.assert_array_equal(kind.host(g), gwant, err_msg=f"{op} {name} grad in place on dy")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_prelu_channels_and_weight_grad(kind, dtype):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 5, 4, 6)) * 2).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    spec = OPS["prelu"]
    tol = {"rtol": 2e-3, "atol": 1e-2} if dtype == "float16" else {"rtol": 1e-5, "atol": 1e-4}
    for axis in (1, 3, -1):
        w = np.linspace(-0.5, 1.5, x.shape[axis]).astype(dtype)
        shape = [1] * x.ndim
        shape[axis] = w.size
        wb = w.reshape(shape).astype(np.float64)
        for wgiven in (w, kind.to(w)):  # a host weight is uploaded; a device one is used in place
            y = kind.host(ma.prelu(kind.to(x), wgiven, axis=axis))
            assert C.compare(y, spec.forward(x.astype(np.float64), wb, axis), x, spec, "forward").passed
            g = kind.host(ma.prelu_grad(kind.to(dy), kind.to(x), wgiven, axis=axis))
            want = spec.backward(dy.astype(np.float64), x.astype(np.float64), wb, axis)
            assert C.compare(g, want, x, spec, "backward", scale=dy).passed
            wg = ma.prelu_weight_grad(kind.to(dy), kind.to(x), wgiven, axis=axis)
            assert type(wg) is type(kind.to(w)) and tuple(wg.shape) == w.shape and dt(wg) == w.dtype
            want = spec.param_grad[1](dy.astype(np.float64), x.astype(np.float64), w, axis % x.ndim)
            np.testing.assert_allclose(kind.host(wg).astype(np.float64), want, **tol)
    one = ma.prelu_weight_grad(kind.to(dy), kind.to(x), np.array([0.25], dtype=dtype))
    want = spec.param_grad[1](dy.astype(np.float64), x.astype(np.float64), np.array([0.25]), 1)
    np.testing.assert_allclose(kind.host(one).astype(np.float64), want, rtol=2e-3 if dtype == "float16" else 1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_swish_beta_grad_is_a_device_scalar(kind, dtype):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(3000) * 3).astype(dtype)
    dy = rng.standard_normal(3000).astype(dtype)
    x[:3] = [np.inf, -np.inf, 0.0]
    for beta in (1.0, 1.3, -0.7):
        got = ma.swish_beta_grad(kind.to(dy), kind.to(x), beta)
        assert tuple(got.shape) == () and dt(got) == np.dtype(dtype) and type(got) is type(kind.to(x))
        b = float(np.float32(beta)) if dtype != "float64" else beta
        want = OPS["swish"].param_grad[1](dy.astype(np.float64), x.astype(np.float64), b)
        assert np.isclose(float(kind.host(got)), want, rtol=1e-3 if dtype == "float16" else 1e-5, atol=1e-3)


def test_nan_in_nan_out_every_op(kind):
    x = np.array([np.nan, 1.0, np.nan, -1.0, np.nan], dtype=np.float32)
    for op, spec in OPS.items():
        kw = dict(C.param_cases(spec)[0])
        if op == "prelu":
            kw = {"weight": np.array([0.25], dtype=np.float32)}
        y = kind.host(ma.forward(op, kind.to(x), **kw))
        assert np.isnan(y[[0, 2, 4]]).all() and not np.isnan(y[[1, 3]]).any(), op
        g = kind.host(ma.backward(op, kind.to(np.ones_like(x)), kind.to(x), **kw))
        assert np.isnan(g[[0, 2, 4]]).all(), op


# ---- errors: checked before any write ----------------------------------------------------------------------


def test_mixed_host_and_device_is_a_type_error_naming_both(kind):
    x = kind.to(np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"dy is numpy\.ndarray, x is \S+"):
        ma.relu_grad(np.ones(4, np.float32), x)
    with pytest.raises(TypeError, match=r"x is \S+, out is numpy\.ndarray"):
        ma.relu(x, out=np.empty(4, np.float32))


def test_out_checks(kind):
    xh = np.linspace(-1, 1, 16, dtype=np.float32)
    x = kind.to(xh)
    with pytest.raises(ValueError, match="overlaps x"):
        ma.relu(x[:15], out=x[1:])
    with pytest.raises(ValueError, match="overlaps dy"):
        ma.relu_grad(x[:15], kind.to(xh[:15]), out=x[1:])
    if kind.name == "sim":
        ro = kind.to(np.zeros(16, np.float32)).readonly()
        with pytest.raises(ValueError, match="read-only"):
            ma.relu(x, out=ro)
    with pytest.raises(ValueError, match="shape"):
        ma.relu(x, out=kind.to(np.zeros(15, np.float32)))
    with pytest.raises(TypeError, match="dtype"):
        ma.relu(x, out=kind.to(np.zeros(16, np.float64)))
    np.testing.assert_array_equal(kind.host(x), xh)  # nothing was written
    ma.relu(x[::2], out=x[1::2])  # interleaved views share no element: allowed
    np.testing.assert_array_equal(kind.host(x)[1::2], np.maximum(xh[::2], 0))


def test_prelu_weight_errors(kind):
    x = kind.to(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="weight has shape"):
        ma.prelu(x, np.ones(4, np.float32))
    with pytest.raises(TypeError, match="weight has dtype"):
        ma.prelu(x, kind.to(np.ones(3, np.float64)))


# ---- numba's own simulated arrays; what the GPU compiles is what CI compiled without one ------------------


@pytest.mark.skipif(REAL, reason="numba's FakeCUDAArray exists only under the simulator")
def test_numba_simulator_arrays_are_cuda_arrays():
    """Under NUMBA_ENABLE_CUDASIM=1, `cuda.to_device` gives FakeCUDAArrays: taken as CUDA arrays, results in kind."""
    from numba import cuda

    rng = np.random.default_rng(11)
    xh = (rng.standard_normal((6, 8)) * 3).astype(np.float32)
    dyh = rng.standard_normal(xh.shape).astype(np.float32)
    x, dy = cuda.to_device(xh), cuda.to_device(dyh)
    assert "-> cuda" in ma.explain("gelu", x)
    for got, want in [
        (ma.gelu(x), ma.gelu(xh, backend="numpy")),
        (ma.gelu_grad(dy, x, approximate="tanh"), ma.gelu_grad(dyh, xh, approximate="tanh", backend="numpy")),
        (ma.elu(x[:, ::3]), ma.elu(xh[:, ::3], backend="numpy")),
        (ma.prelu(x, cuda.to_device(np.full(8, 0.25, np.float32)), axis=1),
         ma.prelu(xh, np.full(8, 0.25, np.float32), axis=1, backend="numpy")),
        (ma.swish_beta_grad(dy, x, 1.3), ma.swish_beta_grad(dyh, xh, 1.3, backend="numpy")),
    ]:
        assert type(got) is type(x)
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-6)
    res = ma.relu(x, out=x)
    assert res is x
    np.testing.assert_array_equal(x.copy_to_host(), np.maximum(xh, 0))


@pytest.mark.skipif(not REAL, reason="needs a GPU: the simulator compiles nothing")
def test_launched_kernels_are_the_ones_compiled_without_a_gpu(kind):
    """Every signature the GPU compiled is one that `builds()` (scripts/cuda_ptx_report.py, CI) compiles too."""
    from multiact.backend import cuda_backend as cb

    rng = np.random.default_rng(13)
    for dtype in FLOAT_DTYPES:
        x = kind.to((rng.standard_normal((4, 6)) * 2).astype(dtype))
        dy = kind.to(rng.standard_normal((4, 6)).astype(dtype))
        w = kind.to(np.full(6, 0.25, dtype=dtype))
        ma.relu(x), ma.relu(x[:, ::2]), ma.gelu_grad(dy, x), ma.sigmoid_grad(dy, y=x)
        ma.prelu(x, w, axis=1), ma.prelu_weight_grad(dy, x, w, axis=1), ma.swish_beta_grad(dy, x, 1.1)
        if dtype == "float32":  # bias_act's two layouts: rows (channels innermost), strided (dim=0)
            ma.bias_act(x, w, "gelu", dim=-1), ma.bias_act_grad(dy, x, w, "gelu", dim=-1)
            ma.bias_act_grad(dy, x, kind.to(np.full(4, 0.5, dtype=dtype)), "gelu", dim=0)
    builds = cb.builds()
    compiled = {(id(b.pyfunc), tuple(b.argtypes)) for b in builds}
    dispatchers = {id(d): d for d in (b.dispatcher() for b in builds)}.values()
    launched = {(id(d.py_func), tuple(sig)) for d in dispatchers for sig in d.overloads}
    assert launched, "no kernel was compiled"
    assert launched <= compiled, sorted(str(s) for _, s in launched - compiled)
