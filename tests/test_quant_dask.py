"""quant= on Dask arrays (issue 46 item 3): lazy codes and scales, bit for bit the host call's, for chunks that
hold whole groups and for chunks that split them (rechunked along the last axis), a dynamic tensor scale from
the whole array's statistics, every family."""

from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import multiact as ma  # noqa: E402

QUANTS = [ma.Quant("float8_e4m3fn", "token"), ma.Quant("int8", "group", group_size=64),
          ma.Quant("float8_e5m2", "mx", rule="floor"), ma.Quant("float8_e4m3fn", "tensor"),
          ma.Quant("int8", "tensor", symmetric=False), ma.Quant("int8", "tensor", scale=0.1),
          ma.Quant("int8", "token", symmetric=False)]


def _same(got, want) -> None:
    g, w = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    assert g.shape == w.shape and g.dtype == w.dtype
    np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def _x(dtype) -> np.ndarray:
    x = (np.random.default_rng(0).standard_normal((6, 256)) * 4).astype(np.float32)
    x[2, 5], x[4] = np.nan, 0.0
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ma.dtypes.bfloat16])
@pytest.mark.parametrize("chunks", [(2, 256), (3, 64), (2, 100)], ids=["rows", "groups", "split"])
def test_elementwise_matches_the_host_call(dtype, chunks):
    x = _x(dtype)
    dx = da.from_array(x, chunks=chunks)
    for q in QUANTS:
        got, want = ma.gelu(dx, approximate="tanh", quant=q), ma.gelu(x, approximate="tanh", quant=q)
        assert len(got) == len(want) and all(isinstance(g, da.Array) for g in got)
        for g, w in zip(got, want, strict=True):
            _same(g.compute(), w)


def test_the_families_match_the_host_call():
    x, b = _x(np.float32), np.linspace(-1, 1, 256).astype(np.float32)
    dx = da.from_array(x, chunks=(2, 128))
    for q in (QUANTS[1], QUANTS[3]):
        for got, want in ((ma.swiglu(dx, quant=q), ma.swiglu(x, quant=q)),
                          (ma.bias_act(dx, b, "silu", dim=1, quant=q), ma.bias_act(x, b, "silu", dim=1, quant=q))):
            for g, w in zip(got, want, strict=True):
                _same(g.compute(), w)


def test_errors_come_before_the_graph():
    x = _x(np.float32)
    with pytest.raises(ValueError, match=r"gelu\(\): the last axis \(48\) must be a multiple of the group size"):
        ma.gelu(da.from_array(x[:, :48]), quant=ma.Quant("int8", "group", group_size=32))
    with pytest.raises(TypeError, match=r"gelu\(\): quant must be a multiact.Quant"):
        ma.gelu(da.from_array(x), quant="int8")
