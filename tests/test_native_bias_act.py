"""The native bias_act kernels (bias_act:<act>, issue 16) beyond the shared suite (tests/test_bias_act.py runs
every activation x dtype on native): every key has both kernels, the layouts the C code tells apart (a row of
`inner` elements per channel, channels along the row for dim=-1, one channel, short rows, full-shape sides,
views that need a copy, in place) against the numpy backend, the semantics numpy's kernels define (-0 kept
without b, NaN kept, clamped gradients zero), threads, and the sums' float64 accumulation.  Cheap kernels
only (linear, relu, leaky_relu, silu, gelu tanh), so that the file runs in a few seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest

import multiact as ma
from multiact import registry
from multiact.optable import BIAS_ACT_KEYS

native = pytest.importorskip("multiact._native", reason="the native extension is not built")
nb = registry.module("native")
if not nb.available()[0]:
    pytest.skip(f"native backend unavailable: {nb.available()[1]}", allow_module_level=True)

DTYPES = ("float32", "float16")
RNG = np.random.default_rng(16)
TOL = {"float32": 2e-6, "float16": 2e-3}


def _close(got, want, dtype, tol=None):
    t = tol or TOL[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=t, atol=t)


def _both(x, b, act, dy=None, **kw):
    """forward and backward on native and numpy."""
    out = {}
    for be in ("native", "numpy"):
        y = ma.bias_act(x, b, act, backend=be, **kw)
        g = ma.bias_act_grad(dy, x, b, act, backend=be, **kw) if dy is not None else None
        out[be] = (y, g)
    return out


def _compare(res, dtype, tol=None):
    (y1, g1), (y0, g0) = res["native"], res["numpy"]
    _close(y1, y0, dtype, tol)
    if g0 is not None:
        for a, w in zip(g1 if isinstance(g1, tuple) else (g1,), g0 if isinstance(g0, tuple) else (g0,), strict=True):
            if w is None:
                assert a is None
            else:
                _close(a, w, dtype, tol)


def test_every_bias_act_key_has_native_kernels():
    missing = [(k, d, t) for k in BIAS_ACT_KEYS for d in ("forward", "backward") for t in DTYPES
               if not nb.supports(k, d, t)]
    assert not missing


LAYOUTS = [  # (shape, dim, b kind, scale kind): the C code's cases
    ((4, 6, 32, 8), 1, "c", "c"),   # NCHW: rows of H*W per (n, c), broadcast b and s
    ((5, 3, 40), -1, "c", "c"),     # channels along the row (inner = 1)
    ((3, 7, 3), 1, "c", None),      # short rows (inner = 3 < a vector)
    ((9, 1, 50), 1, "c", "c"),      # one channel: one row
    ((6, 5, 7), 0, "full", "c"),    # full-shape b
    ((6, 5, 7), 2, "c", "full"),    # full-shape scale
    ((37,), 0, "c", "c"),           # 1-D x: b along it
    ((2, 3, 4), 1, None, None),     # neither: dx alone
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay[0]}-dim{lay[1]}-{lay[2]}-{lay[3]}")
@pytest.mark.parametrize("act", ["linear", "leaky_relu", "silu"])
def test_layouts_match_numpy(act, layout, dtype):
    shape, dim, bk, sk = layout
    x = RNG.standard_normal(shape).astype(dtype)
    dy = RNG.standard_normal(shape).astype(dtype)
    c = shape[dim]

    def side(kind, lo, hi):
        return None if kind is None else RNG.uniform(lo, hi, c if kind == "c" else shape).astype(dtype)

    kw = {"dim": dim, "scale": side(sk, 0.5, 1.5), "gain": math.sqrt(2), "clamp": 1.0}
    _compare(_both(x, side(bk, -1, 1), act, dy, **kw), dtype, tol=5e-3 if dtype == "float16" else 2e-5)


FLAT = [  # the forward's flat path (b and scale none or per channel): steps across row ends
    ((2, 3, 70), 1, "c", "c"),    # NCHW rows of 70: b and scale from the row's windows, shifted at its end
    ((3, 100), -1, "c", None),    # channels along rows of 100: b from its copy along the flat index
    ((40, 6, 3), 1, "c", "c"),    # short rows (inner 3): b and scale laid along the flat index
    ((2, 5, 45), 1, None, None),  # neither (-0, 1)
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", FLAT, ids=lambda lay: f"{lay[0]}-dim{lay[1]}-{lay[2]}-{lay[3]}")
@pytest.mark.parametrize("act", ["relu", "silu"])
def test_flat_forward_has_the_row_paths_bits(act, layout, dtype):
    """The flat path gives the row path's bits (the same sides given at x's shape take the row path), with and
    without a clamp, at every start alignment of x and y (so every head length), and numpy's values."""
    shape, dim, bk, sk = layout
    n, c = int(np.prod(shape)), shape[dim]
    view = [1] * len(shape)
    view[dim] = c
    b = None if bk is None else RNG.uniform(-1, 1, c).astype(dtype)
    s = None if sk is None else RNG.uniform(0.5, 1.5, c).astype(dtype)
    bf = np.broadcast_to(np.float32(-0.0) if b is None else b.reshape(view), shape).astype(dtype)
    sf = np.broadcast_to(np.float32(1.0) if s is None else s.reshape(view), shape).astype(dtype)
    buf, obuf = RNG.standard_normal(n + 8).astype(dtype), np.empty(n + 8, dtype)
    for off in (0, 1, 3, 7):
        x, out = buf[off:off + n].reshape(shape), obuf[8 - off:8 - off + n].reshape(shape)
        for clamp in (None, 1.0):
            kw = {"dim": dim, "gain": 2.0, "clamp": clamp}
            y = ma.bias_act(x, b, act, scale=s, out=out, backend="native", **kw)
            rows = ma.bias_act(x, bf, act, scale=sf, backend="native", **kw)
            assert y.tobytes() == rows.tobytes()
            _close(y, ma.bias_act(x, b, act, scale=s, backend="numpy", **kw), dtype)


BFLAT = [  # the backward's flat path (rows shorter than BA_FLAT_ROW_BWD, b and scale none or per channel)
    ((40, 6, 3), 1, "c", "c"),    # short rows (inner 3): b, scale and the sums laid along the flat index
    ((7, 5, 20), 1, "c", None),   # rows of 20: steps across row ends
    ((30, 9), -1, "c", "c"),      # channels along short rows (inner 1, c = 9)
    ((2, 5, 45), 1, None, None),  # neither: dx alone
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", BFLAT, ids=lambda lay: f"{lay[0]}-dim{lay[1]}-{lay[2]}-{lay[3]}")
@pytest.mark.parametrize("act", ["relu", "silu"])
def test_flat_backward_has_the_row_paths_bits(act, layout, dtype):
    """The backward's flat path gives the row path's dx bits (the same sides given at x's shape take the row
    path, whose db and dscale are then elementwise: their float64 sums are the flat path's sums), with and
    without a clamp, at every start alignment of x and dx, and numpy's values."""
    shape, dim, bk, sk = layout
    n, c = int(np.prod(shape)), shape[dim]
    view = [1] * len(shape)
    view[dim] = c
    axes = tuple(a for a in range(len(shape)) if a != dim % len(shape))
    b = None if bk is None else RNG.uniform(-1, 1, c).astype(dtype)
    s = None if sk is None else RNG.uniform(0.5, 1.5, c).astype(dtype)
    bf = np.broadcast_to(np.float32(-0.0) if b is None else b.reshape(view), shape).astype(dtype)
    sf = np.broadcast_to(np.float32(1.0) if s is None else s.reshape(view), shape).astype(dtype)
    buf, obuf = RNG.standard_normal(n + 8).astype(dtype), np.empty(n + 8, dtype)
    dy = RNG.standard_normal(shape).astype(dtype)
    for off in (0, 1, 3, 7):
        x, out = buf[off:off + n].reshape(shape), obuf[8 - off:8 - off + n].reshape(shape)
        for clamp in (None, 1.0):
            kw = {"dim": dim, "gain": 2.0, "clamp": clamp}
            g = ma.bias_act_grad(dy, x, b, act, scale=s, backend="native", **kw)
            g = g if isinstance(g, tuple) else (g,)
            outs = (out, *(np.empty_like(v) for v in g[1:])) if len(g) > 1 else out
            ma.bias_act_grad(dy, x, b, act, scale=s, out=outs, backend="native", **kw)
            rows = ma.bias_act_grad(dy, x, bf, act, scale=sf, backend="native", **kw)
            assert g[0].tobytes() == out.tobytes() == rows[0].tobytes()
            if dtype == "float32":  # (float16's elementwise db is rounded before it is summed here)
                if b is not None:
                    _close(g[1], rows[1].astype(np.float64).sum(axis=axes), dtype)
                if s is not None:
                    _close(g[2], rows[2].astype(np.float64).sum(axis=axes), dtype)
            want = ma.bias_act_grad(dy, x, b, act, scale=s, backend="numpy", **kw)
            for got, w in zip(g, want if isinstance(want, tuple) else (want,), strict=True):
                _close(got, w, dtype, 5e-3 if dtype == "float16" else 2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((40, 6, 3), 1), ((7, 5, 20), 1), ((30, 9), -1)])
@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_flat_backward_y_has_the_row_paths_bits(act, shape, dim, dtype):
    """The y= backward's flat path (short rows): the row path's dx bits (a full-shape b takes the row path) and
    its db as the float64 sums of that path's elementwise db, at every start alignment of y and dx."""
    n, c = int(np.prod(shape)), shape[dim]
    view = [1] * len(shape)
    view[dim] = c
    axes = tuple(a for a in range(len(shape)) if a != dim % len(shape))
    b = RNG.uniform(-1, 1, c).astype(dtype)
    bf = np.broadcast_to(b.reshape(view), shape).astype(dtype)
    dy = RNG.standard_normal(shape).astype(dtype)
    buf, obuf = np.empty(n + 8, dtype), np.empty(n + 8, dtype)
    for off in (0, 1, 3, 7):
        y, out = buf[off:off + n].reshape(shape), obuf[8 - off:8 - off + n].reshape(shape)
        y[...] = ma.bias_act(RNG.standard_normal(shape).astype(dtype), b, act, dim=dim, gain=2.0)
        for clamp in (None, 1.0):
            kw = {"dim": dim, "gain": 2.0, "clamp": clamp, "y": y}
            dx, db = ma.bias_act_grad(dy, None, b, act, out=(out, np.empty_like(b)), backend="native", **kw)
            rows = ma.bias_act_grad(dy, None, bf, act, backend="native", **kw)
            assert dx.tobytes() == rows[0].tobytes()
            if dtype == "float32":
                _close(db, rows[1].astype(np.float64).sum(axis=axes), dtype)
            _close(db, ma.bias_act_grad(dy, None, b, act, backend="numpy", **kw)[1], dtype,
                   5e-3 if dtype == "float16" else 2e-5)


Y_ACTS = ["linear", "relu", "leaky_relu", "sigmoid", "elu"]
Y_LAYOUTS = [((4, 6, 40), 1, "c", None), ((5, 3, 40), -1, "c", 1.0), ((6, 5, 7), 0, "full", 1.0),
             ((2, 3, 4), 1, None, None)]


def test_every_y_form_has_a_native_kernel():
    """linear and every key whose activation has a backward from its output: a backward_y kernel per dtype."""
    keys = [k for k, (_, op, _) in BIAS_ACT_KEYS.items() if op.name == "linear" or op.backward_y is not None]
    assert len(keys) > 5
    missing = [(k, t) for k in keys for t in (*DTYPES, "bfloat16") if not nb.supports(k, "backward_y", t)]
    assert not missing
    assert registry.select("bias_act:sigmoid", "backward_y", "float16", "numpy")[0].NAME == "native"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", Y_ACTS)
def test_y_form_kernels_match_numpy(act, dtype):
    """dx and db from y= on native against numpy's y form: per-channel rows, channels along the row, full-shape
    b (db elementwise), no b (dx alone); with a clamp that y reaches (zero gradient there)."""
    for shape, dim, bk, clamp in Y_LAYOUTS:
        x = (RNG.standard_normal(shape) * 2).astype(dtype)
        dy = RNG.standard_normal(shape).astype(dtype)
        b = None if bk is None else RNG.uniform(-1, 1, shape[dim] if bk == "c" else shape).astype(dtype)
        kw = {"dim": dim, "gain": 2.0, "clamp": clamp}
        y = ma.bias_act(x, b, act, backend="numpy", **kw)
        got = ma.bias_act_grad(dy, None, b, act, y=y, backend="native", **kw)
        want = ma.bias_act_grad(dy, None, b, act, y=y, backend="numpy", **kw)
        for g, w in zip(got if b is not None else (got,), want if b is not None else (want,), strict=True):
            _close(g, w, dtype, tol=5e-3 if dtype == "float16" else 1e-5)
        if clamp is not None:
            hit = np.abs(y) >= clamp
            assert hit.any() and not (got[0] if b is not None else got)[hit].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_views_needing_copies_and_in_place(dtype):
    """A transposed x, a strided b, a non-contiguous out, and out=x / out=(dy, ...) in place."""
    big = RNG.standard_normal((9, 5, 4)).astype(dtype)
    xt = big.transpose(2, 1, 0)  # (4, 5, 9), not contiguous
    b = np.repeat(RNG.standard_normal(5).astype(dtype), 2)[::2]
    out = np.empty((4, 5, 18), dtype)[:, :, ::2]
    ma.bias_act(xt, b, "relu", out=out, backend="native", gain=2.0)
    _close(out, ma.bias_act(np.ascontiguousarray(xt), np.ascontiguousarray(b), "relu", backend="numpy", gain=2.0),
           dtype)
    x = RNG.standard_normal((3, 5, 16)).astype(dtype)
    dy = RNG.standard_normal(x.shape).astype(dtype)
    s = RNG.uniform(0.5, 1.5, 5).astype(dtype)
    want_y = ma.bias_act(x, b, "silu", scale=s, backend="numpy")
    want = ma.bias_act_grad(dy, x, b, "silu", scale=s, backend="numpy")
    xx = x.copy()
    assert ma.bias_act(xx, b, "silu", scale=s, out=xx, backend="native") is xx
    _close(xx, want_y, dtype)
    for alias in ("x", "dy"):
        xx, dd = x.copy(), dy.copy()
        dst = xx if alias == "x" else dd
        got = ma.bias_act_grad(dd, xx, b, "silu", scale=s, out=(dst, np.empty(5, dtype), np.empty(5, dtype)),
                               backend="native")
        assert got[0] is dst
        for g, w in zip(got, want, strict=True):
            _close(g, w, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpys_semantics_nan_minus_zero_and_clamp(dtype):
    """No b keeps -0 (x * 1 + -0 is x); NaN stays NaN in y and dx; where |act(z) * gain| > clamp the
    gradient is 0 (db too), and clamp=0 zeroes every gradient but NaN's."""
    x = np.array([[-0.0, 0.0, np.nan, -np.inf, np.inf, 3.0, -3.0, 0.5]], dtype).T.repeat(2, 1)  # (8, 2), dim=1
    dy = np.ones_like(x)
    y = ma.bias_act(x, None, "linear", backend="native")
    assert np.signbit(y[0]).all() and not np.signbit(y[1]).any()
    s = np.ones(2, dtype)
    y = ma.bias_act(x, None, "leaky_relu", scale=s, backend="native", negative_slope=0.5)
    assert np.signbit(y[0]).all() and np.isnan(y[2]).all()
    for clamp in (1.0, 0.0):
        b = np.array([0.25, -0.25], dtype)
        res = _both(x, b, "relu", dy, gain=2.0, clamp=clamp)
        (y1, (dx1, db1)), (y0, (dx0, db0)) = res["native"], res["numpy"]
        assert np.array_equal(y1, y0, equal_nan=True)
        assert np.array_equal(dx1, dx0, equal_nan=True) and np.array_equal(np.signbit(dx1), np.signbit(dx0))
        assert np.array_equal(db1, db0, equal_nan=True)


def test_sums_are_float64_per_channel():
    """db of 2**24 + many ones: a float32 accumulator would stop at 2**24; float64 sums them all."""
    x = np.zeros((1, 2, 1 << 16), np.float32)
    dy = np.ones_like(x)
    dy[0, 0, 0] = 2.0 ** 24
    _, db = ma.bias_act_grad(dy, x, np.zeros(2, np.float32), "linear", backend="native")
    assert db[0] == np.float32(2.0 ** 24 + (1 << 16) - 1) and db[1] == (1 << 16)
    x = np.zeros((1 << 12, 16), np.float32)  # dim=-1: channels along the row
    dy = np.ones_like(x)
    dy[0, :] = 2.0 ** 24
    _, db = ma.bias_act_grad(dy, x, np.zeros(16, np.float32), "linear", dim=-1, backend="native")
    assert (db == np.float32(2.0 ** 24 + (1 << 12) - 1)).all()


@pytest.mark.parametrize("dim", [1, -1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_threads_give_the_one_thread_results(dim, dtype):
    """y and dx bit for bit with 1 and 2 threads, sums within float64 rounding (per-chunk partials)."""
    lib = native.lib
    x = RNG.standard_normal((8, 64, 256)).astype(dtype)
    dy = RNG.standard_normal(x.shape).astype(dtype)
    c = x.shape[dim]
    b, s = RNG.standard_normal(c).astype(dtype), RNG.uniform(0.5, 1.5, c).astype(dtype)
    old_threads, old_min = ma.get_num_threads(), lib.ma_get_parallel_min()
    got = {}
    try:
        for nt, pmin in ((1, old_min), (2, 1024)):
            ma.set_num_threads(nt)
            lib.ma_set_parallel_min(pmin)
            y = ma.bias_act(x, b, "gelu", scale=s, dim=dim, backend="native", approximate="tanh")
            g = ma.bias_act_grad(dy, x, b, "gelu", scale=s, dim=dim, backend="native", approximate="tanh")
            got[nt] = (y, *g)
    finally:
        ma.set_num_threads(old_threads)
        lib.ma_set_parallel_min(old_min)
    (y1, dx1, db1, ds1), (y2, dx2, db2, ds2) = got[1], got[2]
    assert y1.tobytes() == y2.tobytes() and dx1.tobytes() == dx2.tobytes()
    _close(db2, db1, dtype, 1e-6 if dtype == "float32" else 1e-3)
    _close(ds2, ds1, dtype, 1e-6 if dtype == "float32" else 1e-3)


def test_default_dispatch_picks_native():
    assert registry.select("bias_act:relu", "forward", "float32", "numpy")[0].NAME == "native"
    assert registry.select("bias_act:gelu_tanh", "backward", "float16", "numpy")[0].NAME == "native"


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_calls_with_streaming_stores(dtype):
    """Above 8 MB the rows stream (non-temporal stores after a cached head up to the next 64-byte line,
    cached stores after the last whole line): rows of an odd length start and end at every alignment;
    y, dx and db as numpy's."""
    x = RNG.standard_normal((2, 3, 700_001)).astype(dtype)
    dy = RNG.standard_normal(x.shape).astype(dtype)
    b = RNG.standard_normal(3).astype(dtype)
    _compare(_both(x, b, "relu", dy, gain=2.0), dtype)
    _compare(_both(x, b, "silu", dy), dtype)  # the row path's bias-only loop (no scale, gain 1, no clamp)
    xt = np.ascontiguousarray(x.reshape(-1)[: 1_400_001 * 3].reshape(1_400_001, 3))  # dim=-1: rows of 3
    _compare(_both(xt, b, "leaky_relu", np.ones_like(xt), dim=-1), dtype, tol=1e-5 if dtype == "float32" else None)
