"""The gated family (glu, swiglu, geglu, reglu) on Dask arrays: lazy graphs whose blocks run the kernels,
x rechunked to whole `dim` chunks, the two-input form aligned, the same results as NumPy arrays."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import multiact as ma  # noqa: E402
from multiact import consistency as C  # noqa: E402
from multiact.optable import FLOAT_DTYPES  # noqa: E402

# a few cases of the shared suite: each named form, glu with a parametrised activation, every layout and
# gate, dim -1 and 0, the clipped form, and the two-input form (the whole suite runs in test_gated.py)
CASES = [
    ("swiglu", {"dim": -1, "layout": "halves", "activate": "first"}),
    ("swiglu", {"dim": 0, "layout": "interleaved", "alpha": 1.702, "limit": 7.0}),
    ("geglu", {"dim": -1, "layout": "interleaved", "activate": "second", "approximate": "tanh"}),
    ("reglu", {"dim": 0, "layout": "halves", "activate": "second"}),
    ("glu", {"dim": -1, "layout": "halves", "activate": "second", "act": "softplus", "beta": 2.0, "threshold": 5.0}),
    ("swiglu", {"up": True}),
    ("glu", {"up": True}),  # activate="second": the gate is the up= array
]


def _to_dask():
    """Successive arrays get different chunks (along dim too), so blocks are rechunked and aligned."""
    sizes = itertools.cycle([(8, 2, 5), (5, 3, 4)])
    return lambda a: da.from_array(a, chunks=next(sizes)[: a.ndim])


def _from_dask(dtype):
    def back(d):
        assert isinstance(d, da.Array), f"expected a lazy Dask array, got {type(d).__name__}"
        assert d.dtype == np.dtype(dtype)
        got = d.compute(scheduler="sync")
        assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype) and got.shape == d.shape
        return got

    return back


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,params", [pytest.param(o, p, id=f"{o}[{C.case_id(p)}]") for o, p in CASES])
def test_shared_suite_with_dask_arrays(op, params, dtype):
    """The shared gated comparison (forward, and the backward's dx or (dgate, dup)) with Dask inputs."""
    failures = C.gated_failures(None, op, params, dtype, to_kind=_to_dask(), from_kind=_from_dask(dtype))
    assert not failures, "\n".join(failures)


def _x(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_equals_numpy_with_dim_split_across_chunks(dim, layout):
    """x chunked along dim (even into odd pieces): rechunked to whole dim, the other dims kept."""
    x = _x((10, 12, 6))
    d = da.from_array(x, chunks=(3, 5, 4))
    kw = {"dim": dim, "layout": layout, "alpha": 1.702, "limit": 7.0}
    y = ma.swiglu(d, **kw)
    want = ma.swiglu(x, **kw)
    axis = dim % 3
    assert y.shape == want.shape and y.chunks[axis] == (x.shape[axis] // 2,)
    assert all(y.chunks[i] == d.chunks[i] for i in range(3) if i != axis)
    np.testing.assert_array_equal(y.compute(scheduler="sync"), want)
    dy = _x(want.shape, seed=1)
    ddy = da.from_array(dy, chunks=(4, 3, 2))  # dy chunked unlike x and y
    dx = ma.swiglu_grad(ddy, d, **kw)
    assert isinstance(dx, da.Array) and dx.shape == x.shape and dx.dtype == x.dtype
    assert dx.chunks[axis] == (x.shape[axis],)
    np.testing.assert_array_equal(dx.compute(scheduler="threads"), ma.swiglu_grad(dy, x, **kw))


def test_lazy_until_computed_and_one_pass_per_chunk():
    x = _x((9, 8))
    ran = []

    def count(b):
        ran.append(b.shape)
        return b

    d = da.from_array(x, chunks=(4, 8)).map_blocks(count, dtype=x.dtype, meta=np.empty((0, 0), x.dtype))
    y = ma.geglu(d)
    dx = ma.geglu_grad(da.ones((9, 4), chunks=3, dtype=np.float32), d)
    assert isinstance(y, da.Array) and isinstance(dx, da.Array) and not ran
    np.testing.assert_array_equal(y.compute(scheduler="sync"), ma.geglu(x))
    assert len(ran) == d.npartitions  # x already held whole rows: no rechunk, one block each
    np.testing.assert_array_equal(dx.compute(scheduler="sync"), ma.geglu_grad(np.ones((9, 4), np.float32), x))


def test_two_input_form_aligns_chunks_and_returns_a_lazy_pair():
    gate, up, dy = _x((12, 7)), _x((12, 7), seed=1), _x((12, 7), seed=2)
    dg_, du_ = da.from_array(gate, chunks=(5, 7)), da.from_array(up, chunks=(4, 3))
    y = ma.swiglu(dg_, up=du_)
    assert y.chunks == ((4, 1, 3, 2, 2), (3, 3, 1))
    np.testing.assert_array_equal(y.compute(), ma.swiglu(gate, up=up))
    pair = ma.swiglu_grad(da.from_array(dy, chunks=6), dg_, up=du_)
    assert isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(a, da.Array) for a in pair)
    assert all(a.shape == gate.shape and a.dtype == gate.dtype for a in pair)
    got = da.compute(*pair, scheduler="sync")
    for g, w in zip(got, ma.swiglu_grad(dy, gate, up=up), strict=True):
        np.testing.assert_array_equal(g, w)
    # activate="second" (glu's default): the gradients still come in the order of the arguments
    got = da.compute(*ma.glu_grad(da.from_array(dy, chunks=5), dg_, up=du_, act="gelu"))
    for g, w in zip(got, ma.glu_grad(dy, gate, up=up, act="gelu"), strict=True):
        np.testing.assert_array_equal(g, w)


def test_backend_and_preferences_travel_and_the_graph_pickles():
    x = _x((6, 10))
    d = da.from_array(x, chunks=(2, 5))
    y = ma.reglu(d, backend="numpy")
    np.testing.assert_array_equal(y.compute(scheduler="threads"), ma.reglu(x, backend="numpy"))
    with ma.use("numpy", only=True):
        dx = ma.swiglu_grad(da.ones((6, 5), chunks=2, dtype=np.float32), d, limit=2.0)
    np.testing.assert_array_equal(dx.compute(scheduler="threads"),
                                  ma.swiglu_grad(np.ones((6, 5), np.float32), x, limit=2.0, backend="numpy"))
    # what a worker process receives: plain values (the call's state), no table objects
    restored = pickle.loads(pickle.dumps(dict(y.__dask_graph__())))
    assert len(restored) == len(y.__dask_graph__())


def test_bad_calls_fail_when_the_graph_is_built():
    d = da.from_array(_x((6, 10)), chunks=3)
    with pytest.raises(TypeError, match="out"):
        ma.swiglu(d, out=d)
    with pytest.raises(ValueError, match="even"):
        ma.swiglu(da.from_array(_x((6, 9)), chunks=3))
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        ma.swiglu(d, dim=2)
    with pytest.raises(TypeError, match="dtype"):
        ma.swiglu(d.astype(np.int32))
    with pytest.raises(TypeError, match="dtype"):
        ma.swiglu(d, up=d.astype(np.float64))
    with pytest.raises(ValueError, match="shape"):
        ma.swiglu(d, up=d[:3])
    with pytest.raises(ValueError, match="shape"):
        ma.swiglu_grad(da.ones((6, 10), chunks=3, dtype=np.float32), d)  # dy must have y's shape (6, 5)
    with pytest.raises(ValueError, match="unknown backend"):
        ma.geglu(d, backend="nope")
    with pytest.raises(ValueError, match="limit"):
        ma.swiglu(d, limit=0.0)
    with pytest.raises(ValueError, match="limit"):
        ma.swiglu(d, limit=1e39)  # beyond float32
