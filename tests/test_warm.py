"""A warm call is as safe as a cold one: every contract error, tried before and after a good call of
the same op, dtype and parameters has filled the hot path's cache, on every CPU backend and the
default dispatch (issue 13)."""

from __future__ import annotations

import mmap
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import host_backends, require, supports

import multiact as ma
from multiact import elementwise, hot
from multiact.optable import OPS

# None is the default dispatch (no backend=).
BACKENDS = [pytest.param(None, id="default"), *host_backends()]
SENTINEL = np.float32(12345.0)
N = 64


def _x(dtype=np.float32, n=N):
    return np.linspace(-3, 3, n).astype(dtype)


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _from_bytes(n=N):
    """An ndarray over an immutable bytes object: -1.0 everywhere."""
    return np.frombuffer(b"\x00\x00\x80\xbf" * n, np.float32)


def _read_only_mapping(tmp_path, n=N):
    """A view of a file mapped read-only: writing through it is a SIGSEGV."""
    path = tmp_path / "x.f32"
    _x(n=n).tofile(path)
    return np.asarray(np.memmap(path, np.float32, mode="r"))


@dataclass
class Case:
    """A bad call, the good call that warms the cache for it, and what must be raised."""

    id: str
    good: Callable  # good(backend)
    bad: Callable  # bad(backend, tmp_path) -> the arrays that must stay unwritten, after raising
    exc: type
    match: str


def _overlap(op, **kw):
    """dy, x (or y) and out as overlapping views of one buffer; out is dy's own view."""
    def bad(b, tmp):
        buf = np.random.default_rng(0).standard_normal(N + 1).astype(np.float32)
        before = buf.copy()
        try:
            if kw.get("y"):
                ma.backward(op, buf[1:], y=buf[:-1], out=buf[1:], backend=b)
            else:
                ma.backward(op, buf[1:], buf[:-1], out=buf[1:], backend=b)
        finally:
            np.testing.assert_array_equal(buf, before)
    return bad


def _raises_untouched(make, call):
    """bad(b, tmp): make the arrays, call, and check after the raise that nothing was written."""
    def bad(b, tmp):
        arrays = make(tmp)
        before = [a.copy() for a in arrays]
        try:
            call(b, *arrays)
        finally:
            for a, was in zip(arrays, before, strict=True):
                np.testing.assert_array_equal(a, was)
    return bad


def _out(dtype=np.float32, n=N):
    return np.full(n, SENTINEL, dtype)


X32 = _x()
GOOD_RELU = lambda b: (ma.relu(X32, backend=b), ma.relu(X32, out=np.empty_like(X32), backend=b))
GOOD_RELU_GRAD = lambda b: ma.relu_grad(X32, X32, out=np.empty_like(X32), backend=b)
GOOD_GELU_GRAD = lambda b: ma.gelu_grad(X32, X32, out=np.empty_like(X32), backend=b)
GOOD_SIGMOID_Y = lambda b: ma.sigmoid_grad(X32, y=X32, out=np.empty_like(X32), backend=b)
GOOD_LEAKY = lambda b: ma.leaky_relu(X32, 0.2, out=np.empty_like(X32), backend=b)

CASES = [
    # 1. read-only out that is x (or dy): never written, whatever the memory is
    Case("readonly-out-is-x", GOOD_RELU,
         _raises_untouched(lambda t: [_read_only(X32)], lambda b, x: ma.relu(x, out=x, backend=b)),
         ValueError, r"relu\(\): out is read-only"),
    Case("bytes-out-is-x", GOOD_RELU,
         _raises_untouched(lambda t: [_from_bytes()], lambda b, x: ma.relu(x, out=x, backend=b)),
         ValueError, "out is read-only"),
    Case("mmap-readonly-out-is-x", GOOD_RELU,
         _raises_untouched(lambda t: [_read_only_mapping(t)], lambda b, x: ma.relu(x, out=x, backend=b)),
         ValueError, "out is read-only"),
    Case("readonly-out-is-dy", GOOD_RELU_GRAD,
         _raises_untouched(lambda t: [_read_only(X32)], lambda b, x: ma.relu_grad(x, x, out=x, backend=b)),
         ValueError, r"relu_grad\(\): out is read-only"),
    Case("readonly-out-is-y", GOOD_SIGMOID_Y,
         _raises_untouched(lambda t: [_read_only(X32)], lambda b, x: ma.sigmoid_grad(x, y=x, out=x, backend=b)),
         ValueError, "out is read-only"),
    # 2. out partially overlapping an input in a backward (out is dy, overlapping x or y)
    Case("overlap-gelu-grad", GOOD_GELU_GRAD, _overlap("gelu"), ValueError, r"gelu_grad\(\): out overlaps x"),
    Case("overlap-tanh-grad", lambda b: ma.tanh_grad(X32, X32, out=np.empty_like(X32), backend=b),
         _overlap("tanh"), ValueError, "out overlaps x"),
    Case("overlap-sigmoid-grad-y", GOOD_SIGMOID_Y, _overlap("sigmoid", y=True), ValueError, "out overlaps y"),
    Case("overlap-forward", GOOD_RELU,
         _raises_untouched(lambda t: [_x(n=N + 1)], lambda b, x: ma.relu(x[:-1], out=x[1:], backend=b)),
         ValueError, "out overlaps x"),
    # the contract's list: dtype, shape, out, parameters, y=, names
    Case("int-dtype", GOOD_RELU,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.relu(np.arange(N), out=o, backend=b)),
         TypeError, r"relu\(\): x must have a float"),
    Case("out-dtype", GOOD_RELU,
         _raises_untouched(lambda t: [_out(np.float64)], lambda b, o: ma.relu(X32, out=o, backend=b)),
         TypeError, "out has dtype"),
    Case("out-shape", GOOD_RELU,
         _raises_untouched(lambda t: [_out(n=N + 1)], lambda b, o: ma.relu(X32, out=o, backend=b)),
         ValueError, "out has shape"),
    Case("out-readonly", GOOD_RELU,
         _raises_untouched(lambda t: [_read_only(_out())], lambda b, o: ma.relu(X32, out=o, backend=b)),
         ValueError, "out is read-only"),
    Case("grad-shape-names-the-grad", GOOD_GELU_GRAD,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.gelu_grad(X32[:-1], X32, out=o, backend=b)),
         ValueError, r"gelu_grad\(\): x has shape \(64,\) but dy has \(63,\)"),
    Case("grad-dtype", GOOD_RELU_GRAD,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.relu_grad(X32.astype(np.float64), X32, out=o,
                                                                          backend=b)),
         TypeError, "dtype"),
    Case("param-nan", GOOD_LEAKY,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.leaky_relu(X32, float("nan"), out=o, backend=b)),
         ValueError, "negative_slope"),
    Case("param-list", GOOD_LEAKY,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.leaky_relu(X32, [0.2], out=o, backend=b)),
         TypeError, r"leaky_relu\(\): parameter 'negative_slope' must be a real number"),
    Case("param-numpy-bool", GOOD_LEAKY,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.leaky_relu(X32, np.True_, out=o, backend=b)),
         TypeError, "'negative_slope' must be a real number, got bool"),
    Case("param-int-beyond-float64", GOOD_LEAKY,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.leaky_relu(X32, 10**400, out=o, backend=b)),
         ValueError, "'negative_slope' must be finite"),
    Case("param-overflows-float32", GOOD_LEAKY,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.leaky_relu(X32, 1e300, out=o, backend=b)),
         ValueError, "'negative_slope' = 1e\\+300 does not fit float32"),
    Case("choice-list", lambda b: ma.gelu(X32, "tanh", backend=b),
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.gelu(X32, ["tanh"], out=o, backend=b)),
         TypeError, "parameter 'approximate' must be a str"),
    Case("backend-list", GOOD_RELU,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.relu(X32, out=o, backend=[b or "numpy"])),
         TypeError, r"relu\(\): backend must be a backend name"),
    Case("unknown-backend", GOOD_RELU,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.relu(X32, out=o, backend="tpu")),
         ValueError, "unknown backend"),
    Case("y-for-no-y-op", GOOD_GELU_GRAD,
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.gelu_grad(X32, y=X32, out=o, backend=b)),
         ma.YFormError, "gelu's derivative needs the input x"),
    Case("y-condition", lambda b: ma.leaky_relu_grad(X32, y=X32, negative_slope=0.1, backend=b),
         _raises_untouched(lambda t: [_out()], lambda b, o: ma.leaky_relu_grad(X32, y=X32, negative_slope=-0.1,
                                                                                 out=o, backend=b)),
         ValueError, "negative_slope > 0"),
    Case("x-none", GOOD_RELU, lambda b, t: ma.relu(None, backend=b), TypeError, r"relu\(\): x must be an array"),
    Case("dy-none", GOOD_GELU_GRAD, lambda b, t: ma.gelu_grad(None, X32, backend=b), TypeError,
         r"gelu_grad\(\): dy must be an array"),
    Case("forward-unknown-keyword", GOOD_LEAKY,
         lambda b, t: ma.forward("leaky_relu", X32, slope=0.3, backend=b), TypeError,
         r"unexpected keyword argument 'slope'; leaky_relu's parameters: negative_slope"),
    Case("backward-unknown-keyword", GOOD_GELU_GRAD,
         lambda b, t: ma.backward("gelu", X32, X32, approximat="tanh", backend=b), TypeError,
         r"gelu_grad\(\): unexpected keyword argument 'approximat'; gelu's parameters: approximate"),
    Case("param-grad-unknown-keyword", lambda b: ma.swish_beta_grad(X32, X32, 1.3, backend=b),
         lambda b, t: ma.param_grad("swish", "beta", X32, X32, bta=1.3, backend=b), TypeError,
         r"swish_beta_grad\(\): unexpected keyword argument 'bta'"),
    Case("non-native-out", GOOD_RELU,
         _raises_untouched(lambda t: [_out().astype(">f4")], lambda b, o: ma.relu(X32, out=o, backend=b)),
         ValueError, "out has non-native byte order"),
]


def _require(backend, dtype):
    if backend is not None:
        for op, direction in (("gelu", "forward"), ("gelu", "backward"), ("sigmoid", "backward_y")):
            require(backend, op, direction, dtype)


def _clear():
    hot.clear()
    elementwise.clear_validated()


@pytest.mark.parametrize("warm", ["cold", "warm"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_contract_error_cold_and_warm(case, backend, warm, tmp_path):
    """Raised the same, with nothing written, on the first call, on a repeat, and after a good call."""
    _clear()
    if warm == "warm":
        case.good(backend)
        case.good(backend)
    for _ in range(2):  # the same bad call twice
        with pytest.raises(case.exc, match=case.match):
            case.bad(backend, tmp_path)


def test_the_good_calls_fill_the_hot_path():
    """The warm half of the test above means something only if the good calls are cached."""
    _clear()
    for case in CASES:
        case.good(None)
    filled = {op for op in OPS if hot.cache(OPS[op].name)}
    assert {"relu", "gelu", "sigmoid", "leaky_relu", "tanh"} <= filled


# ---- silent wrong values: parameters are read afresh and keyed by value --------------------------


class _Knob:
    """An object with __float__ whose value changes between calls (a learned scalar)."""

    def __init__(self, v):
        self.v = v

    def __float__(self):
        return self.v


def _mutable_params():
    yield "float-object", _Knob(1.0), lambda o, v: setattr(o, "v", v)
    a = np.array(1.0)
    yield "0-d-array", a, lambda o, v: o.fill(v)
    torch = pytest.importorskip("torch")
    yield "tensor", torch.tensor(1.0), lambda o, v: o.fill_(v)
    yield "parameter", torch.nn.Parameter(torch.tensor(1.0)), lambda o, v: o.data.fill_(v)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_changed_in_place_is_read_again(backend):
    x = _x()
    for name, obj, set_to in _mutable_params():
        first = ma.swish(x, obj, backend=backend)
        np.testing.assert_array_equal(first, ma.swish(x, 1.0, backend=backend), err_msg=name)
        set_to(obj, 5.0)
        for _ in range(2):
            np.testing.assert_array_equal(ma.swish(x, obj, backend=backend), ma.swish(x, 5.0, backend=backend),
                                          err_msg=name)
            np.testing.assert_array_equal(ma.swish_grad(x, x, obj, backend=backend),
                                          ma.swish_grad(x, x, 5.0, backend=backend), err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", [(0.0, -0.0), (-0.0, 0.0)])
def test_plus_and_minus_zero_parameters_are_different_calls(backend, order):
    x = _x()
    for value in order * 2:
        y = ma.threshold(x, 0.0, value, backend=backend)
        assert np.all(np.signbit(y[x <= 0]) == np.signbit(value)), (backend, value)
        y = ma.threshold(x, np.float32(0.0), np.float32(value), backend=backend)
        assert np.all(np.signbit(y[x <= 0]) == np.signbit(value)), (backend, value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("call", [
    lambda x, b: ma.leaky_relu(x, 1e300, backend=b),
    lambda x, b: ma.elu(x, alpha=1e39, backend=b),
    lambda x, b: ma.celu(x, alpha=1e300, backend=b),
    lambda x, b: ma.swish_grad(x, x, beta=1e39, backend=b),
    lambda x, b: ma.softplus(x, beta=1e300, backend=b),
    lambda x, b: ma.elu_grad(x, x, alpha=-1e300, backend=b),
    lambda x, b: ma.swish_beta_grad(x, x, beta=1e300, backend=b),
    lambda x, b: ma.hardtanh(x, -1e39, 1e39, backend=b),
], ids=["leaky_relu", "elu", "celu", "swish_grad", "softplus", "elu_grad", "swish_beta_grad", "hardtanh"])
def test_parameters_beyond_float32_are_refused_for_single_precision(call, dtype, backend):
    x = np.float32([-np.inf, -1.0, 0.0, 2.0]).astype(dtype)
    for _ in range(2):
        with pytest.raises(ValueError, match="does not fit float32"):
            call(x, backend)


def test_prelu_weight_beyond_the_dtype_is_refused_without_a_warning():
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with pytest.raises(ValueError, match="weight must be finite in float32"):
                ma.prelu(x, np.array([1e300]))
            with pytest.raises(ValueError, match="weight must be finite in float32"):
                ma.prelu_grad(x, x, np.array([1.0, 2.0, 1e300, 1.0]))


def test_float64_takes_parameters_beyond_float32():
    x = np.array([-1.0, 2.0])
    np.testing.assert_array_equal(ma.leaky_relu(x, 1e300), [-1e300, 2.0])


# ---- ndarray subclasses, masked arrays, byte order ------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ndarray_subclasses_compute_on_their_base_array(backend, dtype):
    _require(backend, dtype)
    m = np.matrix(np.linspace(-2, 2, 8, dtype=dtype).reshape(2, 4))
    base = np.asarray(m)
    for _ in range(2):
        y = ma.gelu(m, backend=backend)
        assert type(y) is np.matrix
        np.testing.assert_array_equal(np.asarray(y), ma.gelu(base, backend=backend))
        g = ma.gelu_grad(m, m, backend=backend)
        np.testing.assert_array_equal(np.asarray(g), ma.gelu_grad(base, base, backend=backend))
        if backend is None or supports(backend, "prelu", "forward", dtype):  # native's float64: no prelu kernel
            w = np.linspace(0.1, 0.4, 4).astype(dtype)
            np.testing.assert_array_equal(np.asarray(ma.prelu(m, w, backend=backend)),
                                          ma.prelu(base, w, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_arrays_keep_their_mask(backend):
    _require(backend, "float64")
    data = np.linspace(-2, 2, 8)
    x = np.ma.MaskedArray(data, mask=[0, 1, 0, 0, 1, 0, 0, 0])
    dy = np.ma.MaskedArray(np.ones(8), mask=[1, 0, 0, 0, 0, 0, 0, 0])
    for _ in range(2):
        y = ma.gelu(x, backend=backend)
        assert isinstance(y, np.ma.MaskedArray)
        np.testing.assert_array_equal(y.mask, x.mask)
        np.testing.assert_array_equal(y.data, ma.gelu(data, backend=backend))
        g = ma.gelu_grad(dy, x, backend=backend)
        np.testing.assert_array_equal(g.mask, x.mask | dy.mask)
        out = np.ma.MaskedArray(np.zeros(8))
        assert ma.relu(x, out=out, backend=backend) is out
        np.testing.assert_array_equal(out.mask, x.mask)
    if backend is not None and not supports(backend, "swish", "param_grad", "float64"):
        return  # native's float64: swish's beta gradient is numba's (a reduction)
    keep = ~(x.mask | dy.mask)
    want = ma.swish_beta_grad(np.ones(keep.sum()), data[keep], 1.3, backend=backend)
    np.testing.assert_allclose(ma.swish_beta_grad(dy, x, 1.3, backend=backend), want, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [">f2", ">f4", ">f8"])
def test_non_native_byte_order_is_computed_in_native_order(backend, dtype):
    x = np.linspace(-3, 3, 50).astype(dtype)
    _require(backend, x.dtype.newbyteorder("=").name)
    native = x.astype(x.dtype.newbyteorder("="))
    for _ in range(2):
        y = ma.gelu(x, backend=backend)
        assert y.dtype.isnative and y.dtype == native.dtype
        np.testing.assert_array_equal(y, ma.gelu(native, backend=backend))
        np.testing.assert_array_equal(ma.sigmoid_grad(x, y=x, backend=backend),
                                      ma.sigmoid_grad(native, y=native, backend=backend))


# ---- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, 2**31, 1 << 17, 1.5, True])
def test_set_num_threads_refuses_what_no_call_could_use(n):
    before = ma.get_num_threads()
    with pytest.raises(ValueError, match="set_num_threads"):
        ma.set_num_threads(n)
    assert ma.get_num_threads() == before


def test_a_thread_count_in_the_environment_beyond_any_machine_is_refused_by_name():
    code = "import numpy as np, multiact as ma; ma.relu(np.ones(4, np.float32))"
    env = {"MULTIACT_NUM_THREADS": "99999999999999999999", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "MULTIACT_NUM_THREADS must be an integer from 1 to" in r.stderr


def test_the_memmap_helper_really_is_read_only(tmp_path):
    """The SIGSEGV case above needs memory the OS refuses to write."""
    x = _read_only_mapping(tmp_path)
    assert not x.flags.writeable
    assert isinstance(x.base, (np.memmap, mmap.mmap))
