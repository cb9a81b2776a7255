"""Dequantized inputs (multiact.dequant, `dequant=` on the forwards): an int32 accumulator's float32 values against
their composition in float64 (each step rounded to float32: exact, 53 >= 2 * 24 + 2), the op on them, quant= with
them (the native one pass bit for bit the passes in multiact.core, on every ISA this CPU runs), Dask and CPU
tensors equal to NumPy, and every contract error named, on a first call and a repeated one."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import spy_one_pass

import multiact as ma
from multiact import dequant as D
from multiact import registry
from multiact._opdefs import REQUIRED
from multiact.backend import native_backend as nb
from multiact.optable import OPS

ROWS, N = 5, 512


def _acc(rows: int = ROWS, n: int = N, seed: int = 0) -> np.ndarray:
    """int32 accumulators over their whole range (a GEMM's: large and small rows, both extremes)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2**20, 2**20, (rows, n), dtype=np.int32) >> rng.integers(0, 16, (rows, 1)).astype(np.int32)
    x[0, :4] = (np.iinfo(np.int32).max, np.iinfo(np.int32).min, 0, -1)
    return x


def _parts(n: int = N, rows: int = ROWS, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"weight_scale": (rng.random(n, dtype=np.float32) + 0.5) * np.float32(1e-3),
            "activation_scale": (rng.random(rows, dtype=np.float32) + 0.5) * np.float32(1e-2),
            "bias_int": rng.integers(-1000, 1000, n, dtype=np.int32),
            "bias_float": rng.standard_normal(n).astype(np.float32)}


def _dequants(rows: int = ROWS, n: int = N) -> list[ma.Dequant]:
    p = _parts(n, rows)
    ws, acs, bi, bf = p["weight_scale"], p["activation_scale"], p["bias_int"], p["bias_float"]
    return [ma.Dequant(ws, acs, bi), ma.Dequant(ws, acs), ma.Dequant(ws, acs, bf), ma.Dequant(ws),
            ma.Dequant(activation_scale=acs.reshape(rows, 1)), ma.Dequant(0.0123, 2.0, 7), ma.Dequant(),
            ma.Dequant(ws, acs, np.full(n, np.iinfo(np.int32).max, np.int32))]  # an int32 bias that wraps


def _composed64(x: np.ndarray, d: ma.Dequant) -> np.ndarray:
    """The contract's values computed in float64, each step rounded to float32 (int32 bias wrapping as int32)."""
    c = D.check("test", d, x.shape)
    v = x.astype(np.int64)
    if c.bias_int is not None:
        v = (v + c.bias_int.astype(np.int64) + 2**31) % 2**32 - 2**31
    v = v.astype(np.float64).astype(np.float32)
    for s in (c.weight_scale, c.activation_scale):
        if s is not None:
            v = (v.astype(np.float64) * s.astype(np.float64)).astype(np.float32)
    if c.bias_float is not None:
        v = (v.astype(np.float64) + c.bias_float.astype(np.float64)).astype(np.float32)
    return v


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 4: np.uint32}[a.dtype.itemsize])


def _same(got: tuple, want: tuple, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} [{i}]"
        bad = np.flatnonzero(_bits(g).ravel() != _bits(w).ravel())
        assert bad.size == 0, f"{what} [{i}]: {bad.size} of {g.size} differ, first at {bad[0]}"


def test_values_are_the_float64_composition():
    x = _acc()
    for d in _dequants():
        v = d.apply(x)
        assert v.dtype == np.float32 and v.shape == x.shape
        np.testing.assert_array_equal(_bits(v), _bits(_composed64(x, d)), err_msg=repr(d))


def test_op_reads_the_values():
    """The op on dequant= is the op on the float32 values; swiglu's against its float64 reference too."""
    x = _acc()
    for d in _dequants():
        v = d.apply(x)
        for op in ("silu", "gelu", "relu"):
            _same((getattr(ma, op)(x, dequant=d),), (getattr(ma, op)(v),), f"{op} {d}")
        y = ma.swiglu(x, dequant=d)
        _same((y,), (ma.swiglu(v),), f"swiglu {d}")
        g, u = v[:, :N // 2].astype(np.float64), v[:, N // 2:].astype(np.float64)
        with np.errstate(over="ignore"):
            want = g / (1 + np.exp(-g)) * u
        np.testing.assert_allclose(y, want, rtol=3e-7, atol=1e-37)
    out = np.empty((ROWS, N), np.float32)
    assert ma.silu(x, dequant=_dequants()[0], out=out) is out
    _same((out,), (ma.silu(_dequants()[0].apply(x)),), "out=")


QUANTS = [ma.Quant("int8", "token"), ma.Quant("float8_e4m3fn", "token"), ma.Quant("float8_e4m3fn", "group",
          group_size=128), ma.Quant("float8_e5m2", "mx"), ma.Quant("int8", "tensor"), ma.Quant("int8", "tensor",
          scale=0.05), ma.Quant("int8", "token", symmetric=False)]
NATIVE_ISAS = list(nb._load()["isas"]) if nb.available()[0] and hasattr(nb._load()["lib"], "ma_q_run__scalar") \
    else []


@pytest.fixture
def one_pass(request, monkeypatch):
    """Native on one ISA with its `dequantized` spied: a list of whether the one pass answered."""
    seen = spy_one_pass(monkeypatch, nb, "dequantized", request.param)
    yield seen
    monkeypatch.undo()
    registry.clear_cache()


# every op of the table without an array parameter, a required parameter given a value (threshold's two)
UNARY = {op: {q.name: (0.5 if q.name == "threshold" else -2.0) for q in OPS[op].scalar_params
              if q.default is REQUIRED} for op in OPS if not OPS[op].defn.array_param}


@pytest.mark.parametrize("one_pass", NATIVE_ISAS, indirect=True)
def test_native_one_pass_is_the_passes(one_pass):
    x = _acc()
    for d in _dequants():
        v = d.apply(x)
        for q in QUANTS:
            for op, p in UNARY.items():
                _same(getattr(ma, op)(x, **p, dequant=d, quant=q, backend="native"),
                      ma.quantize(getattr(ma, op)(v, **p, backend="native"), q), f"{op} {d} {q}")
            for name, kw in (("swiglu", {}), ("geglu", {}), ("swiglu", {"layout": "interleaved"}),
                             ("swiglu", {"limit": 7.0, "alpha": 1.702})):
                _same(getattr(ma, name)(x, **kw, dequant=d, quant=q, backend="native"),
                      ma.quantize(getattr(ma, name)(v, **kw, backend="native"), q), f"{name}{kw} {d} {q}")
    assert one_pass and all(one_pass), "the one pass did not run"


@pytest.mark.parametrize("one_pass", NATIVE_ISAS, indirect=True)
def test_native_one_pass_layouts(one_pass):
    """3-D, strided, transposed (gated along dim 0), rows longer than a block, a tail, per-token scales (t, 1)."""
    rng = np.random.default_rng(3)
    x3 = rng.integers(-2**24, 2**24, (2, 3, 5000), dtype=np.int32)
    p = _parts(5000, 6)
    d3 = ma.Dequant(p["weight_scale"], p["activation_scale"].reshape(2, 3), p["bias_int"])
    q = ma.Quant("float8_e4m3fn", "token")
    _same(ma.swiglu(x3, dequant=d3, quant=q), ma.quantize(ma.swiglu(d3.apply(x3)), q), "3-D")
    _same(ma.gelu(x3, dequant=d3, quant=q), ma.quantize(ma.gelu(d3.apply(x3)), q), "3-D gelu")
    xs = _acc(4, 2 * N)[:, ::2]
    ds = ma.Dequant(_parts()["weight_scale"], np.arange(1, 5, dtype=np.float32).reshape(4, 1) * 1e-3,
                    _parts()["bias_float"])
    for q in QUANTS:
        _same(ma.silu(xs, dequant=ds, quant=q), ma.quantize(ma.silu(ds.apply(xs)), q), f"strided {q}")
    xt = _acc(2 * N, 8).T.copy().T  # (2N, 8) column-major: halves along dim 0
    dt = ma.Dequant(np.linspace(1e-3, 2e-3, 8, dtype=np.float32), np.linspace(1, 2, 2 * N, dtype=np.float32))
    _same(ma.swiglu(xt, dim=0, dequant=dt, quant=ma.Quant("int8", "token")),
          ma.quantize(ma.swiglu(dt.apply(xt), dim=0), ma.Quant("int8", "token")), "dim=0")
    xo = _acc(3, 333)
    do = ma.Dequant(np.float32(0.01), activation_scale=np.ones(3, np.float32))
    _same(ma.relu6(xo, dequant=do, quant=ma.Quant("int8", "token")),
          ma.quantize(ma.relu6(do.apply(xo)), ma.Quant("int8", "token")), "odd length")
    assert one_pass and all(one_pass)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_other_backends_take_the_passes(backend):
    x, d, q = _acc(), _dequants()[0], ma.Quant("int8", "token")
    _same(ma.swiglu(x, dequant=d, quant=q, backend=backend), ma.quantize(ma.swiglu(d.apply(x), backend=backend), q),
          backend)


def test_tensors_and_dask():
    torch = pytest.importorskip("torch")
    da = pytest.importorskip("dask.array")
    x, d, q = _acc(), _dequants()[0], ma.Quant("float8_e4m3fn", "group", group_size=128)
    want = ma.swiglu(x, dequant=d, quant=q)
    got = ma.swiglu(torch.from_numpy(x), dequant=d, quant=q)
    assert isinstance(got[0], torch.Tensor) and got[0].dtype == torch.float8_e4m3fn
    _same(tuple(t.view(torch.uint8).numpy() if t.dtype == torch.float8_e4m3fn else t.numpy() for t in got),
          tuple(np.asarray(a).view(np.uint8) if a.dtype.itemsize == 1 else a for a in want), "torch")
    y = ma.silu(torch.from_numpy(x), dequant=d)
    assert y.dtype == torch.float32
    _same((y.numpy(),), (ma.silu(x, dequant=d),), "torch float")
    xd = da.from_array(x, chunks=(2, 128))
    _same((ma.silu(xd, dequant=d).compute(),), (ma.silu(x, dequant=d),), "dask float")
    got = ma.swiglu(xd, dequant=d, quant=q)
    _same(tuple(np.asarray(a.compute() if hasattr(a, "compute") else a) for a in got), want, "dask quant")


def _errors() -> list[tuple[str, type, str, object]]:
    x, p = _acc(), _parts()
    ws = p["weight_scale"]
    return [
        ("float x", TypeError, "x must be int32", lambda: ma.silu(x.astype(np.float32), dequant=ma.Dequant(ws))),
        ("int64 x", TypeError, "got int64", lambda: ma.swiglu(x.astype(np.int64), dequant=ma.Dequant(ws))),
        ("not a Dequant", TypeError, "multiact.Dequant", lambda: ma.silu(x, dequant={"weight_scale": ws})),
        ("weight shape", ValueError, "weight_scale has shape (7,)", lambda: ma.silu(x, dequant=ma.Dequant(ws[:7]))),
        ("token shape", ValueError, "activation_scale has shape", lambda: ma.gelu(
            x, dequant=ma.Dequant(activation_scale=np.ones(ROWS + 1, np.float32)))),
        ("bias shape", ValueError, "bias has shape", lambda: ma.swiglu(
            x, dequant=ma.Dequant(bias=np.ones(3, np.int32)))),
        ("float64 scale", TypeError, "float64", lambda: ma.silu(x, dequant=ma.Dequant(ws.astype(np.float64)))),
        ("bool bias", TypeError, "bool", lambda: ma.silu(x, dequant=ma.Dequant(bias=True))),
        ("wide int bias", ValueError, "int32's range", lambda: ma.silu(x, dequant=ma.Dequant(bias=2**40))),
        ("wide int64 bias", ValueError, "int32's range", lambda: ma.silu(
            x, dequant=ma.Dequant(bias=np.full(N, 2**33, np.int64)))),
        ("up=", ValueError, "up= cannot come with it", lambda: ma.swiglu(x, up=x, dequant=ma.Dequant(ws))),
        ("out with quant", TypeError, "out= cannot be combined with quant=", lambda: ma.silu(
            x, dequant=ma.Dequant(ws), quant=ma.Quant("int8", "token"), out=np.empty(x.shape, np.float32))),
        ("masked", TypeError, "masked", lambda: ma.silu(np.ma.masked_array(x), dequant=ma.Dequant(ws))),
        ("0-d", ValueError, "0-d", lambda: ma.silu(np.int32(3), dequant=ma.Dequant())),
        ("out dtype", TypeError, "out has dtype", lambda: ma.silu(x, dequant=ma.Dequant(ws),
                                                                  out=np.empty(x.shape, np.float16))),
        ("bad quant", TypeError, "quant", lambda: ma.silu(x, dequant=ma.Dequant(ws), quant="int8")),
    ]


@pytest.mark.parametrize("case", _errors(), ids=[e[0] for e in _errors()])
def test_errors_cold_and_warm(case):
    """Each error names its argument and the function called, on a first call and after good calls warmed every
    path (the hot path hands dequant= calls to the checked path)."""
    _, exc, text, call = case
    fn_names = ("silu()", "gelu()", "swiglu()")
    for _ in range(2):
        with pytest.raises(exc, match=None) as info:
            call()
        assert text in str(info.value) and any(f in str(info.value) for f in fn_names), str(info.value)
        x, d = _acc(), _dequants()[0]
        ma.silu(x, dequant=d), ma.silu(x, dequant=d, quant=ma.Quant("int8", "token")), ma.swiglu(x, dequant=d)


def test_parts_of_other_kinds():
    """Parts as CPU tensors, bfloat16 scales (widened exactly), an int64 bias that fits (NumPy's default int)."""
    torch = pytest.importorskip("torch")
    x, p = _acc(), _parts()
    d = ma.Dequant(p["weight_scale"], p["activation_scale"], p["bias_int"])
    want = ma.silu(x, dequant=d)
    dt = ma.Dequant(torch.from_numpy(p["weight_scale"]), torch.from_numpy(p["activation_scale"]),
                    torch.from_numpy(p["bias_int"]))
    _same((ma.silu(x, dequant=dt),), (want,), "tensor parts")
    _same((ma.silu(x, dequant=ma.Dequant(p["weight_scale"], p["activation_scale"], p["bias_int"].astype(np.int64))),),
          (want,), "int64 bias")
    lists = ma.Dequant([float(v) for v in p["weight_scale"]], list(p["activation_scale"].astype(float)),
                       [int(v) for v in p["bias_int"]])
    _same((ma.silu(x, dequant=lists),), (want,), "lists of Python numbers")
    wb = p["weight_scale"].astype(ml_dtypes.bfloat16)
    _same((ma.silu(x, dequant=ma.Dequant(wb)),), (ma.silu(x, dequant=ma.Dequant(wb.astype(np.float32))),), "bf16")


def test_out_untouched_on_error():
    x = _acc()
    out = np.full(x.shape, 7.0, np.float32)
    with pytest.raises(ValueError):
        ma.silu(x, dequant=ma.Dequant(np.ones(3, np.float32)), out=out)
    assert (out == 7.0).all()


def test_signatures_and_docs():
    for op in OPS:
        assert "dequant" in ma.forward.__code__.co_varnames
        assert "dequant:" in getattr(ma, op).__doc__
    assert "dequant:" in ma.swiglu.__doc__
    assert "dequant" not in ma.silu_grad.__code__.co_varnames
    assert repr(ma.Dequant(np.ones(4, np.float32), 2.0)) == "Dequant(weight_scale=<float32 (4,)>, activation_scale=2.0)"
