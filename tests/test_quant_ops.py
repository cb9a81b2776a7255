"""quant= on the elementwise ops (issue 45): every op of the table, on every host backend, from float32,
float16 and bfloat16 inputs, is bit for bit quantize() of the op on the input widened to float32, for each
granularity and target; the contract's errors hold cold and warm (after the hot path has seen the call)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_backends

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS

QUANTS = [ma.Quant("float8_e4m3fn", "tensor"), ma.Quant("float8_e4m3fn", "tensor", scale=0.03),
          ma.Quant("float8_e5m2", "token"), ma.Quant("int8", "group", group_size=32),
          ma.Quant("int8", "token", symmetric=False), ma.Quant("float8_e4m3fn", "mx"),
          ma.Quant("float8_e5m2", "mx", rule="floor")]
DTYPES = (np.float32, np.float16, ma.dtypes.bfloat16)


def _x(dtype) -> np.ndarray:
    """Values across the ops' interesting ranges with the specials in one row, a zero row, and a row of
    values beyond float8's range (3 x 64: two groups of 32, two MX blocks per row)."""
    x = np.linspace(-9, 9, 192).astype(np.float32).reshape(3, 64)
    x[1] = 0.0
    x[2, :6] = (np.nan, np.inf, -np.inf, -0.0, 1e4, -3e4)
    return x.astype(dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


@pytest.mark.parametrize("backend", host_backends())
@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_quantizes_its_float32_result(name, backend):
    spec = OPS[name]
    p = C.param_cases(spec)[-1]
    for dtype in DTYPES:
        x = _x(dtype)
        pw, p32 = dict(p), dict(p)
        array = spec.defn.array_param
        if array:  # an array parameter (prelu's weight) in x's dtype, and widened with it
            pw[array] = C.prelu_weight(x, p[array], p.get("axis", 1))
            p32[array] = pw[array].astype(np.float32)
        want_y = ma.forward(name, x.astype(np.float32), backend=backend, **p32)
        for q in QUANTS:  # (codes, scales), and the zero points of int8's asymmetric form
            got, want = ma.forward(name, x, quant=q, backend=backend, **pw), ma.quantize(want_y, q)
            assert len(got) == len(want) and [a.dtype for a in got] == [a.dtype for a in want], (dtype, q)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(_bits(np.ascontiguousarray(a)), _bits(np.ascontiguousarray(b)),
                                              err_msg=f"{backend} {dtype} {q}")


def test_the_generated_functions_take_quant_and_the_hot_path_keeps_its_checks():
    """ma.gelu(x, quant=Q) cold and after the plain call is cached (the hot path must not answer it); the
    errors name the function and the argument, cold and warm, and nothing is written."""
    x = _x(np.float32)
    q = ma.Quant("float8_e4m3fn", "group", group_size=32)
    for warm in (False, True):
        if warm:
            for _ in range(3):
                ma.gelu(x, approximate="tanh")
        codes, scale = ma.gelu(x, approximate="tanh", quant=q)
        wc, ws = ma.quantize(ma.gelu(x, approximate="tanh"), q)
        np.testing.assert_array_equal(codes.view(np.uint8), wc.view(np.uint8))
        np.testing.assert_array_equal(scale, ws)
        out = np.full_like(x, 7.0)
        with pytest.raises(TypeError, match=r"gelu\(\): out= cannot be combined with quant="):
            ma.gelu(x, approximate="tanh", out=out, quant=q)
        assert (out == 7.0).all()
        with pytest.raises(TypeError, match=r"gelu\(\): quant must be a multiact.Quant"):
            ma.gelu(x, approximate="tanh", quant="float8_e4m3fn")
        with pytest.raises(ValueError, match=r"gelu\(\): the last axis \(48\) must be a multiple of the group size"):
            ma.gelu(x[:, :48], quant=q)


def test_torch_tensors_give_torch_codes():
    torch = pytest.importorskip("torch")
    t = torch.linspace(-4, 4, 128).reshape(2, 64).to(torch.bfloat16)
    q = ma.Quant("float8_e4m3fn", "token")
    for _ in range(2):  # cold, then warm
        codes, scale = ma.silu(t, quant=q)
        assert codes.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (2, 1)
        wc, ws = ma.quantize(ma.silu(t.float().numpy()), q)
        np.testing.assert_array_equal(codes.view(torch.uint8).numpy(), wc.view(np.uint8))
        np.testing.assert_array_equal(scale.numpy(), ws)
