"""Quantized outputs' contract (multiact/quant.py): codes and scales against a scalar reference written here,
the specials, round trips, the errors, and torch tensors."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import multiact as ma

F8 = ("float8_e4m3fn", "float8_e5m2")


def _grid(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every finite non-negative value of a float8 format, ascending, with its code's bits (decoded by
    ml_dtypes: the encoder under test is not used)."""
    bits = np.arange(128, dtype=np.uint8)
    vals = bits.view(getattr(ml_dtypes, name)).astype(np.float64)
    ok = np.isfinite(vals)
    return vals[ok], bits[ok]


def _rne_f8(name: str, v: float) -> float:
    """The float8 value nearest to v, ties to the even code, saturated to the largest finite (the contract)."""
    if math.isnan(v):
        return math.nan
    vals, bits = _grid(name)
    a = min(abs(v), vals[-1])
    i = int(np.searchsorted(vals, a))
    if i < len(vals) and vals[i] == a:
        r = vals[i]
    else:
        lo, hi = vals[i - 1], vals[i]
        if a - lo < hi - a or (a - lo == hi - a and bits[i - 1] % 2 == 0):
            r = lo
        else:
            r = hi
    return math.copysign(r, v)


def _ref(v: np.ndarray, q: ma.Quant) -> tuple[list[float], list[float]]:
    """Codes (as values) and scales of v, group by group, from the contract's words, in Python floats."""
    f32 = np.float32
    flat = v.astype(np.float32)
    n = flat.shape[-1] if flat.ndim else 1
    g = n if q.granularity == "token" else (q.block or None)
    groups = [flat.reshape(-1)] if q.granularity == "tensor" else list(flat.reshape(-1, g))
    codes, scales = [], []
    for grp in groups:
        amax = max((abs(float(x)) for x in grp), default=0.0)
        if any(math.isnan(float(x)) for x in grp):
            amax = math.nan
        if q.granularity == "mx":
            if not math.isfinite(amax):
                s = math.nan
            elif amax == 0:
                s = 1.0
            elif q.rule == "ceil":
                s = 2.0 ** min(127, max(-127, math.ceil(math.log2(float(f32(amax) / f32(q.qmax))))))
            else:
                s = 2.0 ** min(127, max(-127, math.floor(math.log2(amax)) - {"float8_e4m3fn": 8, "float8_e5m2": 15}[
                    q.dtype]))
        else:
            s = 1.0 if amax == 0 else float(f32(amax) / f32(q.qmax))
        scales.append(s)
        for x in grp:
            r = float(f32(float(x)) / f32(s)) if s == s else math.nan
            if q.dtype == "int8":
                codes.append(0.0 if math.isnan(r) else float(min(127, max(-127, round(r)))))
            else:
                codes.append(_rne_f8(q.dtype, r))
    return codes, scales


def _same(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


CASES = [ma.Quant(d, "tensor") for d in (*F8, "int8")] + [ma.Quant(d, "token") for d in (*F8, "int8")] + [
    ma.Quant("float8_e4m3fn", "group", group_size=32), ma.Quant("int8", "group", group_size=64),
    ma.Quant("float8_e4m3fn", "mx"), ma.Quant("float8_e5m2", "mx", rule="floor"),
    ma.Quant("float8_e4m3fn", "mx", rule="floor")]


@pytest.mark.parametrize("q", CASES, ids=lambda q: f"{q.dtype}-{q.granularity}-{q.block}-{q.rule}")
def test_codes_and_scales_follow_the_contract(q):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 128)) * np.exp(rng.uniform(-12, 12, (4, 1)))).astype(np.float32)
    x[1, :40] = 0.0  # an all-zero group in most granularities
    x[2, 5] = -0.0
    codes, scale = ma.quantize(x, q)
    want_codes, want_scales = _ref(x, q)
    assert _same(np.asarray(scale, np.float32).reshape(-1), np.float32(want_scales))
    assert _same(codes.astype(np.float64).reshape(-1), want_codes)
    if q.dtype != "int8":
        assert np.signbit(codes.astype(np.float32)[2, 5])  # -0.0 keeps its sign
    shape = () if q.granularity == "tensor" else x.shape[:-1] + (x.shape[-1] // (q.block or x.shape[-1]),)
    assert np.shape(scale) == shape


@pytest.mark.parametrize("name", F8)
def test_saturation_where_the_cast_would_give_nan_or_inf(name):
    """ml_dtypes' e4m3fn cast gives NaN from 465 up, and e5m2 overflows to inf: the contract saturates."""
    q = ma.Quant(name, "tensor", scale=1.0)
    big = ma.Quant(name, "tensor").qmax
    x = np.array([big * 1.02, 1e30, np.inf, -np.inf, -1e30, np.nan], np.float32)
    codes, _ = ma.quantize(x, q)
    got = codes.astype(np.float32)
    np.testing.assert_array_equal(got[:5], [big, big, big, -big, -big])
    assert np.isnan(got[5])


def test_specials_are_never_hidden():
    x = np.array([[1, 2, np.nan, 4], [1, np.inf, 3, 4], [0, 0, 0, 0], [0, -0.0, 0, 0]], np.float32)
    for q in (ma.Quant("float8_e4m3fn", "token"), ma.Quant("int8", "token"), ma.Quant("float8_e5m2", "token"),
              ma.Quant("int8", "token", symmetric=False)):
        got = ma.quantize(x, q)
        back = ma.dequantize(*got[:2], q, zero_point=got[2] if len(got) > 2 else None)
        assert not np.isfinite(back[0]).any() and not np.isfinite(back[1]).any(), q
        np.testing.assert_array_equal(back[2:], 0.0)
        assert np.all(np.isfinite(np.asarray(got[1], np.float32)[2:]))
    c, s = ma.quantize(np.array([0.0, 1.0, np.nan] + [0.0] * 29, np.float32), ma.Quant("float8_e4m3fn", "mx"))
    assert np.isnan(ma.dequantize(c, s, ma.Quant("float8_e4m3fn", "mx"))).all()


@pytest.mark.parametrize("q", CASES, ids=lambda q: f"{q.dtype}-{q.granularity}-{q.block}-{q.rule}")
def test_round_trip_within_half_a_code(q):
    """|dequantize(quantize(x)) - x| <= half the code spacing at x, times the scale; where the OCP floor rule's
    scale puts x / scale beyond qmax (it may: amax / scale is in [2^emax, 2^(emax + 1))), the code saturates."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    codes, scale = ma.quantize(x, q)
    back = ma.dequantize(codes, scale, q)
    s = np.broadcast_to(np.asarray(ma.dequantize(np.ones_like(codes), scale, q)), x.shape)
    r = np.abs(x / s)
    if q.dtype == "int8":
        spacing = np.ones_like(r)
    else:
        f = getattr(ml_dtypes, q.dtype)
        fi = ml_dtypes.finfo(f)
        e = np.floor(np.log2(np.maximum(r, float(fi.smallest_normal))))
        spacing = 2.0 ** (e - fi.nmant)
    inside = r <= q.qmax * (1 + 1e-6)  # amax / (amax / qmax) may round a hair above qmax
    assert np.all((np.abs(back - x) <= 0.5 * spacing * s * (1 + 1e-6) + 1e-30)[inside])
    np.testing.assert_array_equal(back[~inside], np.sign(x[~inside]) * q.qmax * s[~inside])
    assert q.rule == "floor" or inside.all()


def test_zero_point_form_is_vllms_azp():
    x = np.array([[-1.0, 0.5, 2.0, 3.0]], np.float32)
    q = ma.Quant("int8", "token", symmetric=False)
    codes, scale, zp = ma.quantize(x, q)
    s = np.float32(4.0) / np.float32(255)
    assert scale[0, 0] == s and zp[0, 0] == np.rint(np.float32(-128) - np.float32(-1.0) / s)
    np.testing.assert_array_equal(codes[0], np.clip(np.rint(x[0] / s) + zp[0, 0], -128, 127))


def test_pow2_and_bounds():
    x = np.array([[3.0, -1.0], [1000.0, 1.0], [0.0, 0.0]], np.float32)
    c, s = ma.quantize(x, ma.Quant("float8_e4m3fn", "token", pow2=True))
    assert np.all(np.frexp(s)[0] == 0.5) and np.all(s >= x.max(axis=1, keepdims=True) / 448)
    _, s_ub = ma.quantize(x, ma.Quant("float8_e4m3fn", "token", scale_ub=10.0))
    assert s_ub[1, 0] == np.float32(10.0) / np.float32(448)
    _, s_lo = ma.quantize(x, ma.Quant("float8_e4m3fn", "token", amax_floor=1e-3))
    assert s_lo[2, 0] == np.float32(1e-3) / np.float32(448)


@pytest.mark.parametrize("make, exc, match", [
    (lambda: ma.Quant("float8_e4m3", "token"), ValueError, "dtype must be one of"),
    (lambda: ma.Quant("int8", "row"), ValueError, "granularity must be one of"),
    (lambda: ma.Quant("int8", "group", group_size=48), ValueError, "group_size must be one of"),
    (lambda: ma.Quant("int8", "token", group_size=32), ValueError, "group_size applies"),
    (lambda: ma.Quant("int8", "tensor", scale=0.0), ValueError, "scale must be positive and finite"),
    (lambda: ma.Quant("int8", "tensor", scale=float("inf")), ValueError, "scale must be positive and finite"),
    (lambda: ma.Quant("int8", "token", scale=1.0), ValueError, "static scale"),
    (lambda: ma.Quant("int8", "mx"), ValueError, "float8 dtype"),
    (lambda: ma.Quant("float8_e5m2", "mx", rule="round"), ValueError, "rule must be one of"),
    (lambda: ma.Quant("float8_e5m2", "token", symmetric=False), ValueError, "int8 only"),
    (lambda: ma.quantize(np.ones((2, 40), np.float32), ma.Quant("int8", "group", group_size=32)), ValueError,
     r"last axis \(40\) must be a multiple of the group size \(32\)"),
    (lambda: ma.quantize(np.float32(1.0), ma.Quant("int8", "token")), ValueError, "0-d"),
    (lambda: ma.quantize(np.ones(4, np.float32), "int8"), TypeError, "quant must be a multiact.Quant"),
    (lambda: ma.quantize(np.ones(4, np.int32), ma.Quant("int8")), TypeError, "y must have a"),
])
def test_bad_input_is_named(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_half_inputs_are_quantized_exactly_widened():
    x16 = np.linspace(-70000, 70000, 256).astype(np.float32).astype(np.float16)
    for x in (x16, x16.astype(np.float32).astype(ma.dtypes.bfloat16)):
        q = ma.Quant("float8_e5m2", "group", group_size=32)
        a, b = ma.quantize(x, q), ma.quantize(x.astype(np.float32), q)
        assert _same(a[0].astype(np.float32), b[0].astype(np.float32)) and _same(a[1], b[1])


def test_torch_tensors_give_torch_float8():
    torch = pytest.importorskip("torch")
    x = torch.linspace(-5, 5, 64).reshape(2, 32)
    for q, cdt, sdt in ((ma.Quant("float8_e4m3fn", "mx"), torch.float8_e4m3fn, torch.float8_e8m0fnu),
                        (ma.Quant("float8_e5m2", "token"), torch.float8_e5m2, torch.float32),
                        (ma.Quant("int8", "group", group_size=32), torch.int8, torch.float32)):
        c, s = ma.quantize(x, q)
        assert c.dtype == cdt and s.dtype == sdt and c.shape == x.shape
        cn, sn = ma.quantize(x.numpy(), q)
        np.testing.assert_array_equal(c.view(torch.uint8 if cdt != torch.int8 else torch.int8).numpy(),
                                      cn.view(np.uint8) if cdt != torch.int8 else cn)
        back = ma.dequantize(c, s, q)
        assert isinstance(back, torch.Tensor)
        np.testing.assert_array_equal(back.numpy(), ma.dequantize(cn, sn, q))


def test_the_fused_families_quantize_their_float32_result():
    """quant= on a gated op and on bias_act is quantize() of the op on the input widened to float32, bit for
    bit; out= with quant= and a quant that is not a Quant are refused by name."""
    x = np.linspace(-3, 3, 128, dtype=np.float32).astype(np.float16).reshape(2, 64)
    b = np.linspace(-1, 1, 64).astype(np.float16)
    q = ma.Quant("float8_e4m3fn", "group", group_size=32)
    for got, want in ((ma.swiglu(x, quant=q), ma.swiglu(x.astype(np.float32))),
                      (ma.geglu(x, approximate="tanh", quant=q), ma.geglu(x.astype(np.float32), approximate="tanh")),
                      (ma.bias_act(x, b, "gelu", quant=q), ma.bias_act(x.astype(np.float32), b.astype(np.float32),
                                                                         "gelu"))):
        codes, scale = ma.quantize(want, q)
        np.testing.assert_array_equal(got[0].view(np.uint8), codes.view(np.uint8))
        np.testing.assert_array_equal(got[1], scale)
    with pytest.raises(TypeError, match=r"swiglu\(\): out= cannot be combined with quant="):
        ma.swiglu(x, quant=q, out=np.empty((2, 32), np.float16))
    with pytest.raises(TypeError, match=r"bias_act\(\): quant must be a multiact.Quant"):
        ma.bias_act(x, b, quant="int8")


def test_a_scale_never_underflows_to_zero():
    """amax below qmax times the smallest subnormal: the scale is 2^-149 (not 0, whose codes would be v / 0 =
    NaN), the codes the values' multiples of it; MX's ceil rule clamps log2(0) to E8M0's least exponent."""
    tiny = np.finfo(np.float32).smallest_subnormal
    v = np.array([[3 * tiny, -tiny] + [0.0] * 30], np.float32)
    for q in (ma.Quant("float8_e5m2", "token"), ma.Quant("int8", "token"), ma.Quant("int8", "token", symmetric=False)):
        codes, scale = ma.quantize(v, q)[:2]
        assert scale[0, 0] == tiny, q
        assert np.isfinite(codes.astype(np.float32)).all() and codes.astype(np.float32)[0, 0] != 0
    codes, scale = ma.quantize(v, ma.Quant("float8_e4m3fn", "mx"))
    assert scale.view(np.uint8)[0, 0] == 0  # 2^-127
    assert np.isfinite(ma.dequantize(codes, scale, ma.Quant("float8_e4m3fn", "mx"))).all()
