"""The backends' one pass of a quantized forward (`quantized` in a backend module, multiact.core._fused): for
every backend that has one (native on each ISA this CPU runs), every elementwise op of the table, the gated ops,
each input dtype, granularity and target dtype, the codes and scales are the bits of the two passes,
`ma.quantize(ma.<op>(x.astype(float32)), Q)`, specials included (NaN, +-inf, beyond qmax, all-zero groups,
subnormal codes, signed zeros); and the conversion itself on a sample of every float32 pattern
(scripts/quant_convert_check.py runs all 2^32: results/quant-convert-exhaustive.txt)."""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import pytest
from conftest import spy_one_pass

import multiact as ma
from multiact import core, elementwise, registry
from multiact import quant as Q
from multiact._opdefs import REQUIRED
from multiact.backend import native_backend as nb
from multiact.optable import OPS

FMTS = ("float8_e4m3fn", "float8_e5m2", "int8")
DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _quants() -> list[ma.Quant]:
    qs = []
    for d in FMTS:
        qs += [ma.Quant(d, "tensor", scale=0.0123), ma.Quant(d, "tensor"), ma.Quant(d, "token"),
               *(ma.Quant(d, "group", group_size=g) for g in Q.GROUP_SIZES)]
        if d != "int8":
            qs += [ma.Quant(d, "mx", rule=r) for r in Q.RULES]
    qs += [ma.Quant("float8_e4m3fn", "token", pow2=True), ma.Quant("float8_e5m2", "group", group_size=32, pow2=True),
           ma.Quant("float8_e4m3fn", "group", group_size=128, scale_ub=2.0, amax_floor=1e-3),
           ma.Quant("int8", "token", scale_ub=0.5), ma.Quant("int8", "token", symmetric=False),
           ma.Quant("int8", "group", group_size=64, symmetric=False), ma.Quant("int8", "tensor", symmetric=False)]
    return qs


QUANTS = _quants()


def _native_isas() -> list[str]:
    ok, _ = nb.available()
    if not ok or not hasattr(nb._load()["lib"], f"ma_q_run__{nb._load()['isa']}"):
        return []
    return list(nb._load()["isas"])


def _fused_backends() -> list[tuple[str, str | None]]:
    """(backend, ISA) for every backend module with `quantized`: native once per ISA this CPU runs."""
    out: list[tuple[str, str | None]] = [("native", isa) for isa in NATIVE_ISAS]
    for name in registry.BACKEND_NAMES:
        if name != "native" and registry.availability(name)[0] and hasattr(registry.module(name), "quantized"):
            out.append((name, None))
    return out


NATIVE_ISAS = _native_isas()
FUSED = _fused_backends()


@pytest.fixture
def fused(request, monkeypatch):
    """(backend, ISA) with the one pass in force on that ISA, and a list of the one pass's answers (None: the two
    passes ran)."""
    backend, isa = request.param
    seen = spy_one_pass(monkeypatch, registry.module(backend), "quantized", isa if backend == "native" else None)
    yield backend, isa, seen
    monkeypatch.undo()
    registry.clear_cache()


def _inputs(dtype: np.dtype, rows: int = 6, n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(plain, special) inputs of shape (rows, n): random values over several scales; and rows with NaN, +-inf,
    values far beyond qmax, all-zero groups (+-0), values whose codes are subnormal."""
    rng = np.random.default_rng(seed)
    big = 6e4 if dtype == np.float16 else 1e30
    plain = rng.standard_normal((rows, n)) * np.exp(rng.uniform(-4, 4, (rows, 1)))
    sp = rng.standard_normal((rows, n)) * 3
    sp[0, :128] = 0.0
    sp[0, 1:128:2] = -0.0
    sp[1, 5] = np.nan
    sp[1, 200] = np.inf
    sp[2, 7] = -np.inf
    sp[2, 130] = big
    sp[2, 131] = -big
    sp[3] *= 1e-3
    sp[3, :64] = rng.uniform(-1, 1, 64) * 2.0 ** rng.integers(-18, -6, 64)  # far below the group's amax
    sp[3, 64] = 40.0
    sp[4, 32:64] = 0.0
    sp[5, ::3] = big / 1e3
    return _cast(plain, dtype), _cast(sp, dtype)


def _cast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        return a.astype(np.float32).astype(dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 4: np.uint32}[a.dtype.itemsize]) if a.dtype.itemsize in (1, 4) else a


def _same(got: tuple, want: tuple, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} [{i}]: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        bad = np.flatnonzero(_bits(g).ravel() != _bits(w).ravel())
        assert bad.size == 0, (f"{what} [{i}]: {bad.size} of {g.size} differ, first at {bad[0]}: "
                               f"{_bits(g).ravel()[bad[0]]:#x} vs {_bits(w).ravel()[bad[0]]:#x}")


def _op_params(op: str) -> list[dict]:
    spec = OPS[op]
    if spec.defn.array_param:
        return [{spec.defn.array_param: np.array([0.25], np.float32)}]
    p = {q.name: (0.5 if q.name == "threshold" else -2.0) for q in spec.scalar_params if q.default is REQUIRED}
    cases = [p]
    if op == "gelu":
        cases.append({"approximate": "tanh"})
    return cases


def _elementwise_quant(op: str, x, p: dict, q: ma.Quant, backend: str):
    """`ma.<op>(x, quant=q)` where the generated function takes quant=, else the same plan through the call core."""
    f = getattr(ma, op)
    if "quant" in inspect.signature(f).parameters:
        return f(x, **p, quant=q, backend=backend)
    spec = OPS[op]
    pl = elementwise.plan(spec, "forward", {"x": x}, elementwise.validated(spec, p, spec.label("forward")), None,
                          backend)
    pl.quant = q
    return core.run(pl)


@pytest.mark.parametrize("fused", FUSED, indirect=True, ids=[f"{b}-{i}" for b, i in FUSED])
@pytest.mark.parametrize("op", list(OPS))
def test_elementwise_fused_is_two_passes(fused, op):
    backend, isa, seen = fused
    for p in _op_params(op):
        for dtype in DTYPES:
            for x in _inputs(dtype):
                ref32 = getattr(ma, op)(x.astype(np.float32), **p, backend=backend)
                for q in QUANTS:
                    what = f"{op}{p} {dtype} {q}"
                    _same(_elementwise_quant(op, x, p, q, backend), ma.quantize(ref32, q), what)
    if not OPS[op].defn.array_param:
        assert seen and all(seen), "the one pass did not run"


@pytest.mark.parametrize("fused", FUSED, indirect=True, ids=[f"{b}-{i}" for b, i in FUSED])
@pytest.mark.parametrize("op", [op for op in OPS if not OPS[op].defn.array_param])
def test_backward_fused_is_two_passes(fused, op):
    """The elementwise backwards' one pass (dx from dy and x, and from dy and y where the op has that form): the
    bits of ma.quantize of the float32 backward on the widened inputs."""
    backend, isa, seen = fused
    spec = OPS[op]
    rng = np.random.default_rng(4)
    for p in _op_params(op):
        for dtype in DTYPES:
            dy = _cast(rng.standard_normal((6, 256)) * 2, dtype)
            dy[1, 9] = np.nan
            for x in _inputs(dtype):
                forms = [{"x": x}]
                if spec.supports_y(elementwise.validated(spec, p, spec.label("backward")), np.dtype(np.float32)):
                    forms.append({"y": getattr(ma, op)(x, **p)})  # y: data of the input dtype
                for form in forms:
                    wide = {k: a.astype(np.float32) for k, a in form.items()}
                    want = ma.backward(op, dy.astype(np.float32), **wide, backend=backend, **p)
                    for q in QUANTS:
                        _same(ma.backward(op, dy, **form, quant=q, backend=backend, **p), ma.quantize(want, q),
                              f"{op}{p} backward ({next(iter(form))}) {dtype} {q}")
    if backend in ("native", "numba"):  # the backends whose one pass takes the backwards (others: forwards only)
        assert seen and all(seen), "the one pass did not run"


GATED = [("swiglu", {}), ("geglu", {}), ("reglu", {}), ("glu", {}), ("swiglu", {"limit": 7.0, "alpha": 1.702}),
         ("swiglu", {"layout": "interleaved"}), ("glu", {"act": "gelu", "approximate": "tanh"})]


@pytest.mark.parametrize("fused", FUSED, indirect=True, ids=[f"{b}-{i}" for b, i in FUSED])
@pytest.mark.parametrize("name,kw", GATED, ids=[f"{n}-{'-'.join(map(str, k.values())) or 'plain'}" for n, k in GATED])
def test_gated_fused_is_two_passes(fused, name, kw):
    backend, isa, seen = fused
    f = getattr(ma, name)
    for dtype in DTYPES:
        for x in _inputs(dtype, rows=6, n=512):
            ref32 = f(x.astype(np.float32), **kw, backend=backend)
            for q in QUANTS:
                _same(f(x, **kw, quant=q, backend=backend), ma.quantize(ref32, q), f"{name}{kw} {dtype} {q}")
    assert seen and all(seen), "the one pass did not run"


@pytest.mark.parametrize("fused", FUSED, indirect=True, ids=[f"{b}-{i}" for b, i in FUSED])
def test_layouts_and_shapes(fused):
    """Strided and transposed inputs, the two-input form, rows longer than a block (token), odd sizes, 1-D and 3-D,
    a group size the last axis does not divide (the two passes' error)."""
    backend, isa, seen = fused
    rng = np.random.default_rng(1)
    for dtype in DTYPES:
        x = _cast(rng.standard_normal((3, 4, 6400)), dtype)
        for q in (ma.Quant("float8_e4m3fn", "token"), ma.Quant("int8", "tensor"), ma.Quant("float8_e5m2", "mx")):
            _same(ma.swiglu(x, quant=q, backend=backend), ma.quantize(ma.swiglu(x.astype(np.float32),
                                                                               backend=backend), q), f"3-D {q}")
            xt = x.transpose(1, 0, 2)[:, :, ::2]
            _same(ma.swiglu(xt, dim=0, quant=q, backend=backend),
                  ma.quantize(ma.swiglu(xt.astype(np.float32), dim=0, backend=backend), q), f"strided {q}")
            g, u = x[..., :3200], x[..., 3200:]
            _same(ma.swiglu(g, up=u, quant=q, backend=backend),
                  ma.quantize(ma.swiglu(g.astype(np.float32), up=u.astype(np.float32), backend=backend), q),
                  f"two inputs {q}")
            for y in (x[0, 0, :77], x.T, x[:, ::2, 1::3]) if q.granularity != "mx" else ():
                _same(_elementwise_quant("silu", y, {}, q, backend),
                      ma.quantize(ma.silu(y.astype(np.float32), backend=backend), q), f"silu {y.shape} {q}")
        with pytest.raises(ValueError, match="multiple of the group size"):
            ma.swiglu(x[..., :200], quant=ma.Quant("float8_e4m3fn", "group", group_size=64), backend=backend)


@pytest.mark.parametrize("fused", FUSED, indirect=True, ids=[f"{b}-{i}" for b, i in FUSED])
def test_threads(fused):
    """Many chunks on the pool give the bits of one thread."""
    backend, isa, seen = fused
    x = _cast(np.random.default_rng(2).standard_normal((512, 1024)), np.dtype(ml_dtypes.bfloat16))
    for q in (ma.Quant("float8_e4m3fn", "group", group_size=128), ma.Quant("float8_e4m3fn", "tensor"),
              ma.Quant("int8", "tensor", symmetric=False)):
        with _threads(2):
            two = ma.swiglu(x, quant=q, backend=backend)
        with _threads(1):
            one = ma.swiglu(x, quant=q, backend=backend)
        _same(two, one, f"threads {q}")


class _threads:
    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.old = ma.get_num_threads()
        ma.set_num_threads(self.n)

    def __exit__(self, *exc):
        ma.set_num_threads(self.old)


@pytest.mark.parametrize("fused", FUSED, indirect=True, ids=[f"{b}-{i}" for b, i in FUSED])
@pytest.mark.parametrize("fmt", FMTS[:2])
def test_near_midpoints(fused, fmt):
    """Quotients within a few units in the last place of the codes' rounding midpoints, for static scales and for
    group scales from the amax, on relu (whose result is x)."""
    backend, isa, seen = fused
    rng = np.random.default_rng(3)
    grid = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, fmt)).astype(np.float64)
    g = np.unique(np.abs(grid[np.isfinite(grid)]))
    mids = (g[1:] + g[:-1]) / 2
    for _ in range(20):
        s = np.float32(rng.uniform(1, 2) * 2.0 ** rng.integers(-30, 30))
        x = (mids * s).astype(np.float32)
        x = np.concatenate([(x.view(np.int32) + d).view(np.float32) for d in range(-6, 7)])
        x = x[: x.size // 128 * 128].reshape(-1, 128)
        x[:, 0] = np.float32(Q.QMAX[fmt]) * s  # each group's amax: the scale s again (amax / qmax)
        for q in (ma.Quant(fmt, "tensor", scale=float(s)), ma.Quant(fmt, "group", group_size=128)):
            _same(_elementwise_quant("relu", x, {}, q, backend), ma.quantize(ma.relu(x, backend=backend), q),
                  f"near midpoints {q}")


def _patterns(step: int = 65537) -> np.ndarray:
    """Every step-th float32 pattern, the specials, and every pattern around the formats' boundaries."""
    bits = np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32)
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 1, 0x80000001,
               0x007FFFFF]
    around = []
    for v in (448.0, 464.0, 57344.0, 61440.0, 127.0, 127.5, 2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 2.0 ** -14,
              2.0 ** -16, 2.0 ** -17, 0.5, 1.5, 2.5):
        b = int(np.array(v, np.float32).view(np.uint32))
        around += [b + d for d in range(-3, 4)]
    extra = np.array(special + around, np.uint32)
    return np.concatenate([bits, extra, extra | np.uint32(0x80000000)])


@pytest.mark.skipif(not NATIVE_ISAS, reason="the native extension has no one pass")
@pytest.mark.parametrize("isa", NATIVE_ISAS)
@pytest.mark.parametrize("seq", (0, 4), ids=("kernels", "general"))
@pytest.mark.parametrize("fi,fmt", list(enumerate(FMTS)))
def test_conversion_sample(isa, seq, fi, fmt):
    """ma_q_convert's two sequences (the kernels': q_fast8 and the general one where it says so; the general one
    alone) on every 65537th float32 pattern, the specials and the formats' boundaries, against multiact.quant."""
    s = nb._load()
    r = _patterns().view(np.float32)
    out = np.empty(r.size, np.uint8)
    getattr(s["lib"], f"ma_q_convert__{isa}")(s["ffi"].from_buffer("float[]", r), r.size, fi | seq,
                                             s["ffi"].from_buffer("uint8_t[]", out))
    with np.errstate(all="ignore"):
        ref = Q._codes(ma.Quant(fmt, "token"), r).view(np.uint8)
    bad = np.flatnonzero(out != ref)
    assert bad.size == 0, (f"{bad.size} differ, first {r.view(np.uint32)[bad[0]]:#x}: {out[bad[0]]:#x} vs "
                           f"{ref[bad[0]]:#x}")


def test_exhaustive_result_committed():
    """The 2^32 check's committed result says every pattern agreed on every ISA it ran."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "results", "quant-convert-exhaustive.txt")
    text = open(path).read()
    assert "(2^32)" in text and text.rstrip().endswith("all equal")
    for f in FMTS:
        for seq in ("kernels", "general"):
            for isa in ("scalar", "avx2", "avx512"):
                assert f"{f:15s} {seq:8s} {isa:8s} {1 << 32:12d} {0:10d}" in text
