"""ma.bias_act beyond the shared suite (tests/test_bias_act.py): numba's parallel loop against its serial one,
in place and strided views on numba and onnxruntime, ma.to_onnx("bias_act") models, and Dask arrays.

Every kernel here is one the suite already compiles or a cheap one (relu, linear), so that the file stays
short on a warm numba cache."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import supports

import multiact as ma

RNG = np.random.default_rng(16)


def _data(shape, dtype, c_dim=1):
    x = RNG.standard_normal(shape).astype(dtype)
    dy = RNG.standard_normal(shape).astype(dtype)
    c = shape[c_dim]
    return x, dy, RNG.standard_normal(c).astype(dtype), (RNG.uniform(0.5, 1.5, c)).astype(dtype)


def _close(got, want, dtype):
    tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}[np.dtype(dtype).type]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol)


needs_numba = pytest.mark.skipif(not supports("numba", "bias_act:relu", "forward", "float32"),
                                 reason="numba backend not available")
needs_ort = pytest.mark.skipif(not supports("onnxruntime", "bias_act:relu", "forward", "float32"),
                               reason="onnxruntime backend not available")


# ---- numba: threads, in place, strided -------------------------------------------------------------------


@needs_numba
def test_numba_parallel_loop_equals_the_serial_one(monkeypatch):
    """dx bit for bit (the parallel loop calls the serial loop per tile), db and dscale within float64 rounding
    (per-tile partials summed in a fixed order)."""
    from multiact.backend import numba_backend as nb

    x, dy, b, s = _data((8, 48, 512), np.float32)  # 196608 elements: above the parallel threshold
    p = {"gain": math.sqrt(2), "clamp": 1.5, "sum_db": True, "sum_dscale": True}
    kern = nb.kernel("bias_act:relu", "backward", "float32")
    fwd = nb.kernel("bias_act:relu", "forward", "float32")
    results = {}
    for threads in (1, 2):
        monkeypatch.setattr(nb, "_threads", lambda t=threads: t)
        dx, y = np.empty_like(x), np.empty_like(x)
        sums = kern(dy, x, b, s, dx, None, None, p)
        fwd(x, b, s, y, {"gain": p["gain"], "clamp": p["clamp"]})
        results[threads] = dx, sums, y
    (dx1, s1, y1), (dx2, s2, y2) = results[1], results[2]
    assert dx1.tobytes() == dx2.tobytes() and y1.tobytes() == y2.tobytes()
    np.testing.assert_allclose(s1, s2, rtol=1e-12, atol=1e-9)
    want_dx, want_db, want_ds = ma.bias_act_grad(dy, x, b, "relu", scale=s, gain=p["gain"], clamp=1.5,
                                                 backend="numpy")
    _close(dx1, want_dx, np.float32)
    _close(s1[0].astype(np.float32), want_db, np.float32)
    _close(s1[1].astype(np.float32), want_ds, np.float32)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_numba_in_place_and_strided(dtype):
    x, dy, b, s = _data((3, 5, 7), dtype, c_dim=2)
    kw = {"dim": -1, "gain": 2.0, "clamp": 3.0}
    want = ma.bias_act(x, b, "relu", scale=s, backend="numpy", **kw)
    xx = x.copy()
    assert ma.bias_act(xx, b, "relu", scale=s, out=xx, backend="numba", **kw) is xx
    _close(xx, want, dtype)
    gx, gb, gs = ma.bias_act_grad(dy, x, b, "relu", scale=s, backend="numpy", **kw)
    for alias in ("x", "dy"):
        xx, dd = x.copy(), dy.copy()
        dst = xx if alias == "x" else dd
        got = ma.bias_act_grad(dd, xx, b, "relu", scale=s, out=(dst, np.empty_like(b), np.empty_like(s)),
                               backend="numba", **kw)
        assert got[0] is dst
        for g, w in zip(got, (gx, gb, gs), strict=True):
            _close(g, w, dtype)
    # strided views: x a transposed view, b a strided 1-D view, out a non-contiguous slice
    big = RNG.standard_normal((7, 5, 3)).astype(dtype)
    xt = big.transpose(2, 1, 0)
    bb = np.repeat(b, 2)[::2]
    out = np.empty((3, 5, 14), dtype)[:, :, ::2]
    ma.bias_act(xt, bb, "relu", out=out, backend="numba", **kw)
    _close(out, ma.bias_act(np.ascontiguousarray(xt), b, "relu", backend="numpy", **kw), dtype)


@needs_numba
def test_numba_linear_full_shape_and_no_sides():
    x, dy, b, s = _data((4, 6), np.float32)
    full_b = RNG.standard_normal(x.shape).astype(np.float32)
    for args in ({"b": full_b, "scale": s}, {"b": None, "scale": None}, {"b": b, "scale": full_b}):
        got = ma.bias_act_grad(dy, x, act="linear", backend="numba", gain=0.5, **args)
        want = ma.bias_act_grad(dy, x, act="linear", backend="numpy", gain=0.5, **args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                        strict=True):
            if w is None:
                assert g is None
            else:
                _close(g, w, np.float32)


# ---- onnxruntime --------------------------------------------------------------------------------------------


@needs_ort
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_ort_in_place_strided_and_sessions(dtype):
    from multiact.backend import onnxruntime_backend as O

    x, dy, b, s = _data((2, 4, 3, 5), dtype)
    kw = {"gain": 1.5, "clamp": 0.75, "negative_slope": 0.2}
    want = ma.bias_act(x, b, "leaky_relu", scale=s, backend="numpy", **kw)
    xx = x.copy()
    ma.bias_act(xx, b, "leaky_relu", scale=s, out=xx, backend="onnxruntime", **kw)
    _close(xx, want, dtype)
    out = np.empty((2, 4, 3, 10), dtype)[..., ::2]
    ma.bias_act(x, b, "leaky_relu", scale=s, out=out, backend="onnxruntime", **kw)
    _close(out, want, dtype)
    before = O.info()["sessions"]
    ma.bias_act(x, b, "leaky_relu", scale=s, backend="onnxruntime", **kw)
    assert O.info()["sessions"] == before  # cached per form and parameters
    gx, gb, gs = ma.bias_act_grad(dy, x, b, "leaky_relu", scale=s, backend="numpy", **kw)
    dd = dy.copy()
    got = ma.bias_act_grad(dd, x, b, "leaky_relu", scale=s, out=(dd, np.empty_like(b), np.empty_like(s)),
                           backend="onnxruntime", **kw)
    assert got[0] is dd
    for g, w in zip(got, (gx, gb, gs), strict=True):
        _close(g, w, dtype)


# ---- ma.to_onnx("bias_act") -----------------------------------------------------------------------------------


@needs_ort
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("act,params,dim,shape,with_scale", [
    ("relu", {"gain": math.sqrt(2)}, 1, (2, 3, 4, 5), False),
    ("leaky_relu", {"negative_slope": 0.2, "clamp": 0.5}, -1, (3, 8), True),
    ("gelu", {"approximate": "tanh", "gain": 1.25}, 0, (6,), True),
    ("linear", {}, 1, (2, 3, 4), True),
])
def test_to_onnx_models_match_the_functions(dtype, act, params, dim, shape, with_scale):
    import onnxruntime as ort

    x, dy, b, s = _data(shape, dtype, c_dim=dim)
    kw = {"dim": dim, **params}
    scale = s if with_scale else None
    feeds = {"x": x, "b": b, **({"scale": s} if with_scale else {})}
    fwd = ma.to_onnx("bias_act", act=act, dtype=np.dtype(dtype).name, ndim=len(shape), scale=with_scale, **kw)
    bwd = ma.to_onnx("bias_act", act=act, dtype=np.dtype(dtype).name, ndim=len(shape), scale=with_scale, grad=True,
                     **kw)
    y = ort.InferenceSession(fwd.SerializeToString()).run(None, feeds)[0]
    _close(y, ma.bias_act(x, b, act, scale=scale, backend="numpy", **kw), dtype)
    got = ort.InferenceSession(bwd.SerializeToString()).run(None, {"dy": dy, **feeds})
    want = ma.bias_act_grad(dy, x, b, act, scale=scale, backend="numpy", **kw)
    assert [o.name for o in bwd.graph.output] == ["dx", "db", "dscale"][:len(want)]
    for g, w in zip(got, want, strict=True):
        _close(g, w, dtype)


def test_to_onnx_bias_act_refuses_bad_arguments():
    pytest.importorskip("onnx")
    with pytest.raises(ValueError, match="dim 3 is out of range"):
        ma.to_onnx("bias_act", act="relu", dim=3, ndim=2)
    with pytest.raises(ValueError, match="ndim"):
        ma.to_onnx("bias_act", act="relu", ndim=0)
    with pytest.raises(ValueError, match="'act'"):
        ma.to_onnx("bias_act", act="prelu")
    with pytest.raises(ValueError, match="no parameter gradient"):
        ma.to_onnx("bias_act", act="relu", grad="b")
    with pytest.raises(ValueError, match="clamp"):
        ma.to_onnx("bias_act", act="relu", clamp=-1.0)


# ---- Dask --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dask_matches_the_host_call(dtype):
    da = pytest.importorskip("dask.array")
    x, dy, b, s = _data((4, 6, 5), dtype)
    xd = da.from_array(x, chunks=(2, 4, 3))  # dim 1 split across chunks
    kw = {"gain": 1.3, "clamp": 0.9}
    y = ma.bias_act(xd, da.from_array(b, chunks=3), "silu", scale=s, **kw)
    assert isinstance(y, da.Array)
    np.testing.assert_array_equal(y.compute(), ma.bias_act(x, b, "silu", scale=s, **kw))
    got = ma.bias_act_grad(da.from_array(dy, chunks=(1, 6, 5)), xd, b, "silu", scale=s, **kw)
    assert all(isinstance(g, da.Array) for g in got)
    want = ma.bias_act_grad(dy, x, b, "silu", scale=s, **kw)
    np.testing.assert_array_equal(got[0].compute(), want[0])
    for g, w in zip(got[1:], want[1:], strict=True):  # float64 sums across chunks, rounded once
        _close(g.compute(), w, dtype)
    # full-shape b, no scale; scale without b
    full = RNG.standard_normal(x.shape).astype(dtype)
    for g, w in zip(ma.bias_act_grad(dy, xd, full, "relu", dim=-1), ma.bias_act_grad(dy, x, full, "relu", dim=-1),
                    strict=True):
        np.testing.assert_array_equal(g.compute(), w)
    g = ma.bias_act_grad(dy, xd, None, "relu", scale=s)
    assert g[1] is None
    _close(g[2].compute(), ma.bias_act_grad(dy, x, None, "relu", scale=s)[2], dtype)


def test_dask_checks_at_build_time():
    da = pytest.importorskip("dask.array")
    x, dy, b, s = _data((4, 6), np.float32)
    xd = da.from_array(x, chunks=2)
    with pytest.raises(ValueError, match="b has shape"):
        ma.bias_act(xd, b[:5], "relu")
    with pytest.raises(TypeError, match="dtype"):
        ma.bias_act(xd, b.astype(np.float64), "relu")
    with pytest.raises(TypeError, match="out= is not supported"):
        ma.bias_act(xd, b, "relu", out=np.empty_like(x))
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        ma.bias_act_grad(dy, xd, b, "relu", dim=2)
    with pytest.raises(ValueError, match="'act'"):
        ma.bias_act(xd, b, "prelu")
