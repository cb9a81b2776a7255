"""Bad input: a clear exception naming the argument, and `out` left untouched."""

from __future__ import annotations

import numpy as np
import pytest

import multiact as ma

SENTINEL = 12345.0


def _out(shape=(8,), dtype=np.float32):
    return np.full(shape, SENTINEL, dtype=dtype)


def _untouched(out):
    return bool(np.all(out == SENTINEL))


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda o: ma.relu(np.arange(8), out=o), TypeError, "x must have a float"),
        (lambda o: ma.relu(np.ones(8, dtype=object), out=o), TypeError, "x must have a float"),
        (lambda o: ma.relu(np.ones(8, np.float32), out=o.astype(np.float64)), TypeError, "out has dtype"),
        (lambda o: ma.relu(np.ones(9, np.float32), out=o), ValueError, "out has shape"),
        (lambda o: ma.relu_grad(np.ones(7, np.float32), np.ones(8, np.float32), out=o), ValueError, "shape"),
        (lambda o: ma.relu_grad(np.ones(8, np.float64), np.ones(8, np.float32), out=o), TypeError, "dtype"),
        (lambda o: ma.leaky_relu(np.ones(8, np.float32), float("nan"), out=o), ValueError, "negative_slope"),
        (lambda o: ma.leaky_relu(np.ones(8, np.float32), float("inf"), out=o), ValueError, "finite"),
        (lambda o: ma.leaky_relu(np.ones(8, np.float32), "0.1", out=o), TypeError, "negative_slope"),
        (lambda o: ma.celu(np.ones(8, np.float32), 0.0, out=o), ValueError, "alpha"),
        (lambda o: ma.softplus(np.ones(8, np.float32), beta=-1.0, out=o), ValueError, "beta"),
        (lambda o: ma.softshrink(np.ones(8, np.float32), -0.5, out=o), ValueError, "lambd"),
        (lambda o: ma.hardtanh(np.ones(8, np.float32), 1.0, -1.0, out=o), ValueError, "min_val"),
        (lambda o: ma.gelu(np.ones(8, np.float32), "erf", out=o), ValueError, "approximate"),
        (lambda o: ma.gelu_grad(np.ones(8, np.float32), y=np.ones(8, np.float32), out=o), TypeError,
         "gelu_grad.*y= is not supported: gelu's derivative needs the input x"),
        (lambda o: ma.backward("gelu", np.ones(8, np.float32), y=np.ones(8, np.float32), out=o), ValueError, "y="),
        (lambda o: ma.leaky_relu_grad(np.ones(8, np.float32), y=np.ones(8, np.float32), negative_slope=-0.1, out=o),
         ValueError, "negative_slope > 0"),
        (lambda o: ma.elu_grad(np.ones(8, np.float32), np.ones(8, np.float32), y=np.ones(8, np.float32), out=o),
         ValueError, "not both"),
        (lambda o: ma.sigmoid_grad(np.ones(8, np.float32), out=o), TypeError, "needs the input x"),
        (lambda o: ma.forward("gelu_fast", np.ones(8, np.float32), out=o), ValueError, "unknown op"),
        (lambda o: ma.relu(np.ones(8, np.float32), backend="tpu", out=o), ValueError, "unknown backend"),
        (lambda o: ma.threshold(np.ones(8, np.float32), 0.5, out=o), TypeError, "value"),
        (lambda o: ma.prelu(np.ones((2, 4), np.float32), np.ones(3, np.float32), out=o.reshape(2, 4)),
         ValueError, "weight"),
        (lambda o: ma.prelu(np.ones((2, 4), np.float32), np.ones(4, np.float32), axis=5, out=o.reshape(2, 4)),
         ValueError, "axis"),
    ],
)
def test_bad_input_raises_and_writes_nothing(call, exc, match):
    out = _out()
    with pytest.raises(exc, match=match):
        call(out)
    assert _untouched(out)


def test_out_must_be_an_array():
    with pytest.raises(TypeError, match="out must be an array"):
        ma.relu(np.float32(1.0), out=np.float32(0.0))
    with pytest.raises(TypeError, match="out must be an array"):
        ma.relu([1.0, 2.0], out=[0.0, 0.0])


def test_read_only_out():
    out = _out()
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        ma.relu(np.ones(8, np.float32), out=out)


def test_partially_overlapping_out_is_refused():
    x = np.arange(9, dtype=np.float32) - 4
    before = x.copy()
    with pytest.raises(ValueError, match="out overlaps x"):
        ma.relu(x[:-1], out=x[1:])
    np.testing.assert_array_equal(x, before)
    with pytest.raises(ValueError, match="out overlaps dy"):
        ma.relu_grad(x[1:], np.ones(8, np.float32), out=x[:-1])


def test_same_memory_through_another_view_is_in_place():
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    want = ma.relu(x)
    ma.relu(x, out=x.view())
    np.testing.assert_array_equal(x, want)


def test_unavailable_backend_names_the_reason():
    unavailable = [b for b in ma.backends() if not b.available]
    if not unavailable:
        pytest.skip("every backend is available here")
    b = unavailable[0]
    out = _out()
    with pytest.raises(ma.BackendError, match=b.name) as e:
        ma.relu(np.ones(8, np.float32), backend=b.name, out=out)
    assert b.reason in str(e.value)
    assert _untouched(out)


def test_scalars_and_lists_are_accepted_as_numpy_would():
    assert ma.relu(-1.5) == 0.0 and np.asarray(ma.relu(-1.5)).dtype == np.float64
    np.testing.assert_array_equal(ma.relu([-1.0, 2.0]), [0.0, 2.0])
    with pytest.raises(TypeError, match="x must have a float"):
        ma.relu([1, 2])
    with pytest.raises(TypeError, match="x must be an array"):
        ma.relu("1.0")


def test_parameters_that_vanish_in_float32_are_refused():
    """float16/float32 kernels compute in float32: a nonzero (or > 0) parameter must stay so there."""
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    with pytest.raises(ValueError, match="alpha"):
        ma.celu(x, alpha=1e-300)
    with pytest.raises(ValueError, match="beta"):
        ma.softplus(x, beta=1e-300)
    with pytest.raises(ValueError, match="y= is only supported when negative_slope > 0, in float32"):
        ma.leaky_relu_grad(np.ones_like(x), y=x, negative_slope=1e-300)
    # float64 computes in float64: the same slope is positive there
    np.testing.assert_array_equal(ma.leaky_relu_grad(np.ones(3), y=np.ones(3), negative_slope=1e-300), 1.0)
