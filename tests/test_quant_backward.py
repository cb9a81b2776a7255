"""Backward with a quantized gradient (issue 46 item 4): ma.<op>_grad(dy, x, quant=Q) is bit for bit
ma.quantize of the float32 backward, for every op and host backend; bias_act_grad quantizes dx and returns db
and dscale in float32; multiact.torch.backward_quantized is the same through the custom op; Dask too."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_backends

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS

Q = [ma.Quant("float8_e4m3fn", "token"), ma.Quant("float8_e5m2", "group", group_size=32),
     ma.Quant("int8", "tensor")]


def _same(got, want, bytes_only: bool = False) -> None:
    for g, w in zip(got, want, strict=True):
        g, w = np.atleast_1d(np.asarray(g)), np.atleast_1d(np.asarray(w))
        assert (bytes_only or g.dtype == w.dtype) and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def _inputs(dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 64)) * 4).astype(np.float32)
    x[0, :3] = (np.nan, np.inf, -0.0)
    return x.astype(dtype), rng.standard_normal((3, 64)).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("backend", host_backends())
@pytest.mark.parametrize("name", sorted(OPS))
def test_every_backward_quantizes_its_float32_result(name, backend):
    spec = OPS[name]
    p = dict(C.param_cases(spec)[-1])
    for dtype in (np.float32, ma.dtypes.bfloat16):
        x, dy = _inputs(dtype)
        pw, p32 = dict(p), dict(p)
        if spec.defn.array_param:
            a = spec.defn.array_param
            pw[a] = C.prelu_weight(x, p[a], p.get("axis", 1))
            p32[a] = pw[a].astype(np.float32)
        want = ma.backward(name, dy.astype(np.float32), x.astype(np.float32), backend=backend, **p32)
        for q in Q:
            _same(ma.backward(name, dy, x, quant=q, backend=backend, **pw), ma.quantize(want, q))


def test_bias_act_grad_quantizes_dx_and_keeps_the_sums_in_float32():
    x, dy = _inputs(ma.dtypes.bfloat16)
    b = np.linspace(-1, 1, 3).astype(ma.dtypes.bfloat16)
    s = np.linspace(0.5, 2, 3).astype(ma.dtypes.bfloat16)
    q = Q[1]
    (codes, scales), db, ds = ma.bias_act_grad(dy, x, b, "gelu", dim=0, scale=s, quant=q)
    dx, db32, ds32 = ma.bias_act_grad(dy.astype(np.float32), x.astype(np.float32), b.astype(np.float32), "gelu",
                                      dim=0, scale=s.astype(np.float32))
    _same((codes, scales), ma.quantize(dx, q))
    assert db.dtype == ds.dtype == np.float32
    np.testing.assert_array_equal(db, db32)
    np.testing.assert_array_equal(ds, ds32)
    with pytest.raises(TypeError, match=r"bias_act_grad\(\): out= cannot be combined with quant="):
        ma.bias_act_grad(dy, x, None, "gelu", out=np.empty_like(dy), quant=q)


def test_torch_backward_quantized_and_dask():
    torch = pytest.importorskip("torch")
    import multiact.torch as mt

    x, dy = _inputs(np.float32)
    tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
    for q in Q:
        got = mt.backward_quantized("silu", tdy, tx, quant=q)
        want = ma.quantize(ma.silu_grad(dy, x), q)
        _same([g.view(torch.uint8).numpy() if g.element_size() == 1 else g.numpy() for g in got], want, True)
    f = torch.compile(lambda d, t: mt.backward_quantized("mish", d, t, quant=Q[0]), fullgraph=True, backend="eager")
    _same([g.view(torch.uint8).numpy() if g.element_size() == 1 else g.numpy() for g in f(tdy, tx)],
          ma.quantize(ma.mish_grad(dy, x), Q[0]), True)
    with pytest.raises(ValueError, match=r"backward_quantized\(\): op must be one of"):
        mt.backward_quantized("gleu", tdy, tx, quant=Q[0])
    da = pytest.importorskip("dask.array")
    got = ma.gelu_grad(da.from_array(dy, chunks=(1, 32)), da.from_array(x, chunks=(1, 32)), quant=Q[0])
    _same([g.compute() for g in got], ma.quantize(ma.gelu_grad(dy, x), Q[0]))
