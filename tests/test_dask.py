"""Dask arrays: lazy results, chunk alignment, parameter-gradient reductions, a LocalCluster."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import multiact as ma  # noqa: E402
from multiact import consistency as C  # noqa: E402
from multiact.errors import BackendError  # noqa: E402
from multiact.optable import FLOAT_DTYPES, OPS  # noqa: E402

CASES = [pytest.param(op, params, id=f"{op}[{C.case_id(params)}]") for op in OPS for params in C.param_cases(OPS[op])]


def _to_dask():
    """Successive arrays get different chunk sizes, so a backward sees dy and x chunked differently."""
    sizes = itertools.cycle([150, 97])
    return lambda a: da.from_array(a, chunks=next(sizes))


def _from_dask(dtype):
    def back(d):
        assert isinstance(d, da.Array), f"expected a lazy Dask array, got {type(d).__name__}"
        assert d.dtype == np.dtype(dtype)
        got = d.compute(scheduler="sync")
        assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype)
        return got

    return back


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,params", CASES)
def test_shared_suite_with_dask_arrays(op, params, dtype):
    """The shared consistency comparison with Dask inputs (unaligned chunks in every backward)."""
    failures = C.case_failures(None, op, params, dtype, to_kind=_to_dask(), from_kind=_from_dask(dtype))
    assert not failures, "\n".join(failures)


def _x(shape=(7, 6), dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class _Counting:
    """A chunk-level spy: how many chunks a graph has actually run."""

    def __init__(self):
        self.calls = 0


def test_result_is_lazy_and_keeps_dtype_and_chunks():
    x = _x((9, 10))
    ran = _Counting()

    def count(b):
        ran.calls += 1
        return b

    d = da.from_array(x, chunks=(4, 3)).map_blocks(count, dtype=x.dtype, meta=np.empty((0, 0), x.dtype))
    y = ma.gelu(d, approximate="tanh")
    assert isinstance(y, da.Array) and ran.calls == 0
    assert y.dtype == x.dtype and y.chunks == d.chunks
    np.testing.assert_array_equal(y.compute(scheduler="sync"), ma.gelu(x, approximate="tanh"))
    assert ran.calls == d.npartitions


def test_backward_aligns_unaligned_chunks():
    x, dy = _x((12, 5)), _x((12, 5), seed=1)
    g = ma.silu_grad(da.from_array(dy, chunks=(5, 2)), da.from_array(x, chunks=(4, 5)))
    assert g.chunks == ((4, 1, 3, 2, 2), (2, 2, 1))
    np.testing.assert_array_equal(g.compute(), ma.silu_grad(dy, x))
    yb = ma.tanh_grad(da.from_array(dy, chunks=3), y=da.from_array(np.tanh(x), chunks=3))
    np.testing.assert_array_equal(yb.compute(), ma.tanh_grad(dy, y=np.tanh(x)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_swish_beta_grad_is_a_lazy_0d_sum_of_float64_partials(dtype):
    x, dy = _x((40, 30), dtype), _x((40, 30), dtype, seed=1)
    b = ma.swish_beta_grad(da.from_array(dy, chunks=(7, 11)), da.from_array(x, chunks=(9, 30)), beta=1.3)
    assert isinstance(b, da.Array) and b.shape == () and b.dtype == np.dtype(dtype)
    want = ma.swish_beta_grad(dy, x, beta=1.3)  # accumulated in float64, rounded once
    # chunked partials add up in another order than one pass: a few eps, at least 1e-12 relative
    np.testing.assert_allclose(float(b.compute()), float(want), rtol=max(4 * np.finfo(dtype).eps, 1e-12))


def test_swish_beta_grad_float16_chunks_do_not_overflow():
    """Partials stay float64: each chunk's (about +-82000) would be inf in float16; their sum is 0."""
    x = np.full(4096, 4.0, np.float16)
    dy = np.concatenate([np.full(2048, 10.0), np.full(2048, -10.0)]).astype(np.float16)
    with np.errstate(over="ignore"):
        assert float(ma.swish_beta_grad(dy[:2048], x[:2048], beta=0.01)) == np.inf  # one chunk, plain call
    got = ma.swish_beta_grad(da.from_array(dy, chunks=2048), da.from_array(x, chunks=2048), beta=0.01).compute()
    assert got.dtype == np.float16 and got == 0.0


@pytest.mark.parametrize("weight", ["per-channel", "single", "dask-per-channel", "dask-single"])
def test_prelu_weight_grad_reduces_across_chunks(weight):
    x, dy = _x((11, 6, 3)), _x((11, 6, 3), seed=1)
    w = C.prelu_weight(x, weight.replace("dask-", ""))
    w_in = da.from_array(w, chunks=4) if weight.startswith("dask") else w
    dx, ddy = da.from_array(x, chunks=(4, 4, 2)), da.from_array(dy, chunks=(5, 3, 3))
    g = ma.prelu_weight_grad(ddy, dx, w_in)
    assert isinstance(g, da.Array) and g.shape == w.shape and g.dtype == w.dtype
    np.testing.assert_allclose(g.compute(), ma.prelu_weight_grad(dy, x, w), rtol=1e-6)
    np.testing.assert_array_equal(ma.prelu(dx, w_in).compute(), ma.prelu(x, w))
    np.testing.assert_array_equal(ma.prelu_grad(ddy, dx, w_in).compute(), ma.prelu_grad(dy, x, w))


def test_zero_d_and_empty():
    z = np.float32(-0.5)
    assert ma.gelu(da.from_array(np.array(z))).compute() == ma.gelu(np.array(z))
    e = da.zeros((0, 3), chunks=2, dtype=np.float32)
    assert ma.relu(e).compute().shape == (0, 3)
    assert float(ma.swish_beta_grad(e, e).compute()) == 0.0


def test_bad_calls_fail_when_the_graph_is_built():
    d = da.from_array(_x(), chunks=3)
    with pytest.raises(TypeError, match="out"):
        ma.gelu(d, out=d)
    with pytest.raises(TypeError, match="dtype"):
        ma.gelu(d.astype(np.int32))
    with pytest.raises(ValueError, match="shape"):
        ma.gelu_grad(d[:3], d)
    with pytest.raises(TypeError, match="dtype"):
        ma.gelu_grad(d.astype(np.float64), d)
    with pytest.raises(ValueError, match="weight"):
        ma.prelu(d, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="unknown backend"):
        ma.gelu(d, backend="nope")
    with pytest.raises(ValueError, match="negative_slope"):
        ma.leaky_relu(d, negative_slope=float("nan"))
    with pytest.raises(TypeError, match="dy is numpy.ndarray, x is dask"):
        ma.gelu_grad(_x(), d)


def test_backend_and_use_scope_travel_with_the_graph():
    """Chunks run in pool threads (no contextvars there): the caller's choices must still apply."""
    d = da.from_array(_x(), chunks=3)
    want = ma.gelu(_x(), backend="numpy")
    np.testing.assert_array_equal(ma.gelu(d, backend="numpy").compute(scheduler="threads"), want)
    unavailable = next((b.name for b in ma.backends() if not b.available), None)
    if unavailable is None:
        pytest.skip("every backend is available here; no unavailable one to prefer")
    with ma.use(unavailable):
        y = ma.gelu(d)
    with pytest.raises(BackendError, match=unavailable):
        y.compute(scheduler="threads")


# ---- a real cluster: worker processes on loopback -----------------------------------------------


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("dask.distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_local_cluster_forward_backward_and_reductions(client):
    x = _x((64, 50), seed=3)
    dy = _x((64, 50), seed=4)
    dx, ddy = da.from_array(x, chunks=(16, 50)), da.from_array(dy, chunks=(32, 25))
    y, g, b = client.compute([ma.mish(dx), ma.mish_grad(ddy, dx), ma.swish_beta_grad(ddy, dx, beta=0.7)], sync=True)
    np.testing.assert_array_equal(y, ma.mish(x))
    np.testing.assert_array_equal(g, ma.mish_grad(dy, x))
    np.testing.assert_allclose(float(b), float(ma.swish_beta_grad(dy, x, beta=0.7)), rtol=1e-6)
    w = C.prelu_weight(x, "per-channel")
    pw = client.compute(ma.prelu_weight_grad(ddy, dx, w), sync=True)
    np.testing.assert_allclose(pw, ma.prelu_weight_grad(dy, x, w), rtol=1e-6)
    # the chunks ran in the workers' processes, not here
    seen = set(client.run(lambda: "multiact.dask_arrays" in sys.modules).values())
    assert seen == {True}


def test_local_cluster_sum_of_gelu(client):
    x = _x((1 << 16,), seed=5)
    d = da.from_array(x, chunks=1 << 13)
    got = client.compute(ma.gelu(d).sum(dtype=np.float64), sync=True)
    assert got == pytest.approx(ma.gelu(x).astype(np.float64).sum(), rel=1e-12)


# ---- imports ---------------------------------------------------------------------------------------


def test_plain_api_and_the_torch_adapter_do_not_import_dask():
    """Extends test_dispatch's import check: every plain op, and no dask/distributed or cupy on the way."""
    code = (
        "import sys, numpy as np, multiact as ma\n"
        "x = np.linspace(-2, 2, 9).astype(np.float32)\n"
        "for op in ma.ops():\n"
        "    kw = {'weight': np.float32([0.2])} if op == 'prelu' else {}\n"
        "    kw.update({'threshold': 0.1, 'value': 0.0} if op == 'threshold' else {})\n"
        "    ma.forward(op, x, **kw); ma.backward(op, x, x, **kw)\n"
        "ma.explain('gelu', x)\n"
        "heavy = ('torch', 'cupy', 'dask', 'distributed', 'multiact.dask_arrays', 'multiact.torch')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
