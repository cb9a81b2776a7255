"""The onnxruntime backend: out= through IOBinding, in place, strided arrays, thread count, selection."""

from __future__ import annotations

import numpy as np
import pytest

import multiact as ma
from multiact import reference as R

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from multiact.backend import _ort_sessions, onnxruntime_backend  # noqa: E402

B = "onnxruntime"


@pytest.fixture
def bound_outputs(monkeypatch):
    """Every output buffer bound by a session run."""
    seen = []
    real = _ort_sessions._Entry.run

    def spy(self, arrays, out):
        seen.append(out)
        return real(self, arrays, out)

    monkeypatch.setattr(_ort_sessions._Entry, "run", spy)
    return seen


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_out_is_bound_without_a_copy(bound_outputs, dtype):
    x = np.linspace(-4, 4, 1000).astype(dtype)
    out = np.full_like(x, np.nan)
    assert ma.gelu(x, out=out, backend=B) is out
    assert len(bound_outputs) == 1 and bound_outputs[0].ctypes.data == out.ctypes.data
    np.testing.assert_allclose(out, R.gelu(x.astype(np.float64), "none"), rtol=2e-3 if dtype == "float16" else 1e-6)


def test_in_place_forward_and_backward(bound_outputs):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 125)).astype(np.float32)
    want = ma.mish(x, backend=B)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    want_dx = ma.mish_grad(dy, x, backend=B)
    xi = x.copy()
    assert ma.mish(xi, out=xi, backend=B) is xi
    np.testing.assert_array_equal(xi, want)
    assert ma.mish_grad(dy, x, out=dy, backend=B) is dy
    np.testing.assert_array_equal(dy, want_dx)
    assert all(o is not None and o.base is not None for o in bound_outputs[-2:])  # the callers' own buffers


@pytest.mark.parametrize("layout", ["strided", "transposed", "mixed"])
def test_non_contiguous(layout):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((40, 30)).astype(np.float32)
    if layout == "strided":
        x, out = base[::2, ::3], np.zeros((40, 30), np.float32)[1::2, ::3]
    elif layout == "transposed":
        x, out = base.T, np.zeros((40, 30), np.float32).T
    else:
        x, out = base.T, np.zeros((30, 40), np.float32)
    guard = out.base.copy() if out.base is not None else None
    ma.softplus(x, beta=2.0, threshold=5.0, out=out, backend=B)
    np.testing.assert_allclose(out, R.softplus(x.astype(np.float64), 2.0, 5.0), rtol=1e-6)
    if layout == "strided":  # elements outside the view are untouched
        mask = np.ones(guard.shape, bool)
        mask[1::2, ::3] = False
        np.testing.assert_array_equal(out.base[mask], guard[mask])
    dy = np.ones_like(x)
    np.testing.assert_allclose(ma.softplus_grad(dy, x, beta=2.0, threshold=5.0, backend=B),
                               R.softplus_grad(dy.astype(np.float64), x.astype(np.float64), 2.0, 5.0), rtol=1e-6)


def test_empty_and_zero_dim():
    assert ma.tanh(np.zeros((0, 3), np.float32), backend=B).shape == (0, 3)
    y = ma.tanh(np.float32(0.5) * np.ones((), np.float32), backend=B)
    assert y.shape == () and abs(float(y) - np.tanh(0.5)) < 1e-7


def test_sessions_follow_the_thread_count():
    x = np.ones(100, np.float32)
    before = ma.get_num_threads()
    try:
        for n in (1, 2):
            ma.set_num_threads(n)
            ma.selu(x, backend=B)
            entry = onnxruntime_backend._runner.entry("selu", "forward", "float32", (), {})
            assert entry.sess.get_session_options().intra_op_num_threads == n
            cfg = entry.sess.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
            assert cfg == "0"
    finally:
        ma.set_num_threads(before)


def test_session_cache_keys_params():
    x = np.linspace(-3, 3, 50).astype(np.float32)
    a = ma.swish(x, beta=1.0, backend=B)
    b = ma.swish(x, beta=2.0, backend=B)
    np.testing.assert_allclose(b, R.swish(x.astype(np.float64), 2.0), rtol=1e-6)
    assert not np.array_equal(a, b)


def test_prelu_channels_and_grads():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    w = np.array([0.1, -0.2, 0.3], np.float32)
    np.testing.assert_array_equal(ma.prelu(x, w, backend=B), np.where(x > 0, x, x * w.reshape(1, 3, 1, 1)))
    dy = rng.standard_normal(x.shape).astype(np.float32)
    got = ma.param_grad("prelu", "weight", dy, x, weight=w, backend=B)
    want = R.prelu_weight_grad(dy, x, w.reshape(1, 3, 1, 1), 1).reshape(3)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got1 = ma.param_grad("prelu", "weight", dy, x, weight=np.array([0.25], np.float32), backend=B)
    np.testing.assert_allclose(got1, [want.sum()], rtol=1e-6)


def test_explicit_only_and_float64_declined():
    x = np.ones(10, np.float32)
    assert onnxruntime_backend.PRIORITY == 0
    assert "-> onnxruntime" not in ma.explain("relu", x)
    assert not onnxruntime_backend.supports("relu", "forward", "float64")
    with pytest.raises(Exception, match="float64"):
        ma.relu(np.ones(3), backend=B)
