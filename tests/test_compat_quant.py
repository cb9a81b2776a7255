"""multiact.compat's quantized conventions (issue 45, item 4): each anchor's function against the anchor's formula
written out again here, independently (float64 or exact where it matters; IEEE float32 steps where the anchor
takes them, which are exact specifications), on NumPy and torch inputs, with the specials, the errors, and the
documented differences from the contract (`ma.quantize`) counted.

The formulas, with the anchors' sources:
- vLLM: csrc/quantization/activation_kernels.cu (`act_and_mul_quant_kernel`, `silu_kernel`),
  csrc/quantization/w8a8/fp8/common.cuh (`scaled_fp8_conversion`), common.cu (static, dynamic per-tensor and
  per-token kernels), csrc/quantization/utils.cuh (`min_scaling_factor`: 1 / (448 * 512)),
  csrc/quantization/w8a8/fp8/per_token_group_quant.cu (`per_token_group_quant_8bit_kernel`),
  csrc/quantization/w8a8/int8/scaled_quant.cu (static, dynamic and azp kernels);
- Transformer Engine: transformer_engine/common/recipe/recipe_common.cuh (`compute_scale_from_amax`),
  recipe/current_scaling.cu (value_for_inf = FLT_MAX), common/util/vectorized_pointwise.h (`unary_kernel`:
  value * scale, then the satfinite float8 constructor);
- CANN ops-nn: quant/swi_glu_quant/op_kernel/swi_glu_quant.h (`Compute`: scale = 127 / rowmax is the output),
  activation/gelu_quant/op_kernel/gelu_static_quant_per_tensor.h and gelu_dynamic_quant.h (CAST_ODD to
  float16, CAST_RINT to int8; out_scale = 1 / (127 / rowmax)), quant/dequant_swiglu_quant/op_kernel/
  dequant_swiglu_quant_dynamic_base.hpp and dequant_swiglu_quant_static_base.hpp (torch_npu's
  npu_dequant_swiglu_quant), with Ascend/op-plugin's golden model (test/test_custom_ops/
  test_npu_dequant_swiglu_quant.py).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import multiact as ma
from multiact import compat
from multiact import dtypes as mdt

torch = pytest.importorskip("torch")

E4 = "float8_e4m3fn"
F32 = np.float32
RNG = np.random.default_rng(45)


# ---- an independent float8 encoder (nearest, ties to the even code; the format's grid decoded by ml_dtypes) ----

def _grid(name: str) -> tuple[np.ndarray, np.ndarray]:
    bits = np.arange(128, dtype=np.uint8)
    vals = bits.view(getattr(ml_dtypes, name)).astype(np.float64)
    ok = np.isfinite(vals)
    return vals[ok], bits[ok]


def enc(v: np.ndarray, name: str = E4) -> np.ndarray:
    """float64 values within the format's range (or NaN) as the float8 values they round to (float64)."""
    vals, bits = _grid(name)
    v = np.asarray(v, np.float64)
    a = np.abs(v)
    i = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    with np.errstate(invalid="ignore"):
        pick_lo = (a - lo < hi - a) | ((a - lo == hi - a) & (bits[i - 1] % 2 == 0))
        r = np.where(a == hi, hi, np.where(pick_lo, lo, hi))
        r = np.where(a >= vals[-1], vals[-1], r)
    return np.where(np.isnan(v), np.nan, np.copysign(r, v))


def f8_values(q) -> np.ndarray:
    """Codes (NumPy float8 or a torch float8 tensor) as float64 values."""
    if isinstance(q, torch.Tensor):
        q = q.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(q.dtype).split(".")[1]))
    return np.asarray(q).astype(np.float64)


def same(a, b) -> bool:
    """Equal values, NaN where NaN, and the same sign of zero."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all(((a == b) & (np.signbit(a) == np.signbit(b)))
                                              | (np.isnan(a) & np.isnan(b))))


def code_steps(a, b, name: str = E4) -> np.ndarray:
    """How many codes apart two float8 value arrays are (NaN against a number: 255)."""
    vals, _ = _grid(name)
    full = np.concatenate([-vals[::-1], vals[1:]])
    ia = np.searchsorted(full, np.asarray(a, np.float64))
    ib = np.searchsorted(full, np.asarray(b, np.float64))
    d = np.abs(ia - ib)
    return np.where(np.isnan(a) != np.isnan(b), 255, np.where(np.isnan(a), 0, d))


def f32(v) -> np.ndarray:
    """float64 values rounded once to float32 (IEEE): what an anchor's float32 step gives for an exact input."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(v, np.float64).astype(np.float32).astype(np.float64)


def silu64(g: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x)) in float64: the anchors' formula (NaN at -inf, as theirs)."""
    g = np.asarray(g, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g))


def to_half64(v: np.ndarray, half: str) -> np.ndarray:
    """float64 values rounded once to nearest even into float16 or bfloat16, as float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        if half == "float16":
            return np.asarray(v, np.float64).astype(np.float16).astype(np.float64)
        return mdt.from_float64(np.asarray(v, np.float64)).astype(np.float64)


def all_bf16() -> np.ndarray:
    """All 65,536 bfloat16 values (NaNs and infs included) as a (256, 256) bfloat16 array."""
    return np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(256, 256)


def as_input(v32: np.ndarray, dtype: str):
    """float32 values (exact in dtype) as a NumPy array of dtype."""
    return v32.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else v32.astype(dtype)


# ==== vLLM: static per-tensor silu_and_mul ======================================================================

def _vllm_silu_mul_ref(x32: np.ndarray, scale: float, half: str | None, sil32=None) -> np.ndarray:
    """vLLM's act_and_mul_quant_kernel: silu (float32, or float64 rounded to float32), to T; T * T to T; times
    fl(1 / scale); fmaxf(-448, fminf(x, 448)) (NaN -> 448); nearest-even float8."""
    n = x32.shape[-1] // 2
    g, u = x32[..., :n].astype(np.float64), x32[..., n:].astype(np.float64)
    s = silu64(g) if sil32 is None else sil32.astype(np.float64)
    s = to_half64(s, half) if half else f32(s)
    p = to_half64(s * u, half) if half else f32(s * u)  # exact products, one rounding
    inv = float(F32(1) / F32(scale))
    x = f32(p * inv)  # T (or float32) times a float32: exact in float64, then one rounding
    x = np.where(np.isnan(x), 448.0, np.clip(x, -448.0, 448.0))
    return enc(x)


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("scale", [0.05, 7.0, 0.0123])
def test_vllm_silu_and_mul_quant_every_half_gate(half, scale):
    """Every bfloat16 (every float16) value as the gate, with random ups: exactly the kernel's formula on
    multiact's float32 silu, and within one code of it on the float64 silu (counted)."""
    if half == "bfloat16":
        gate = all_bf16().astype(np.float32)
    else:
        gate = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256).astype(np.float32)
    up = as_input((RNG.standard_normal(gate.shape) * 4).astype(np.float32), half).astype(np.float32)
    x32 = np.concatenate([gate, up], axis=-1)
    q, s = compat.vllm_silu_and_mul_quant(as_input(x32, half), scale)
    assert q.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and q.shape == gate.shape
    assert s.dtype == np.float32 and float(s) == float(F32(scale))
    got = f8_values(q)
    sil = ma.silu(gate)
    sil = np.where(np.isneginf(gate), F32(np.nan), sil)  # the formula's NaN at -inf
    assert same(got, _vllm_silu_mul_ref(x32, scale, half, sil))
    ref64 = _vllm_silu_mul_ref(x32, scale, half)
    steps = code_steps(got, ref64)
    assert steps.max() <= 1 and np.count_nonzero(steps) <= 0.001 * steps.size, np.count_nonzero(steps)
    # against the contract (the float32 product divided by the scale): NaN and a -inf gate give 448 where the
    # contract gives NaN (or its 0 * up); elsewhere one code at most, for about 0.1% of the values (the T
    # roundings and the reciprocal; the docs quote this count)
    qc, _ = ma.swiglu(as_input(x32, half), quant=ma.Quant(E4, "tensor", scale=scale))
    want = f8_values(qc)
    plain = ~np.isnan(want) & ~np.isneginf(gate)
    assert (got[np.isnan(want)] == 448).all()
    steps = code_steps(got[plain], want[plain])
    assert steps.max() <= 1 and 0 < np.count_nonzero(steps) <= 0.003 * steps.size, np.count_nonzero(steps)


def test_vllm_silu_and_mul_quant_float32_and_torch():
    x32 = (RNG.standard_normal((64, 256)) * 3).astype(np.float32)
    q, s = compat.vllm_silu_and_mul_quant(x32, 0.02)
    sil = ma.silu(x32[:, :128])
    assert same(f8_values(q), _vllm_silu_mul_ref(x32, 0.02, None, sil))
    steps = code_steps(f8_values(q), _vllm_silu_mul_ref(x32, 0.02, None))
    assert steps.max() <= 1 and np.count_nonzero(steps) <= 0.005 * steps.size
    for half, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16), (None, torch.float32)):
        xn = as_input(x32, half) if half else x32
        qn, _ = compat.vllm_silu_and_mul_quant(xn, 0.02)
        qt, st = compat.vllm_silu_and_mul_quant(torch.from_numpy(x32).to(tdt), torch.tensor([0.02]))
        assert qt.dtype == torch.float8_e4m3fn and st.dtype == torch.float32 and tuple(st.shape) == (1,)
        assert same(f8_values(qt), f8_values(qn))


def test_vllm_silu_and_mul_quant_specials():
    """NaN and +-inf, gate or up: +-448 (NaN -> +448: fminf(NaN, 448) is 448); a -inf gate is NaN in x / (1 +
    exp(-x)), so +448 too; zeros give zero codes of the product's sign."""
    g = np.float32([np.nan, 1.0, np.inf, -np.inf, 2.0, 0.0, -0.0, 1e30, 3.0])
    u = np.float32([1.0, np.nan, 1.0, 1.0, -np.inf, 1.0, 1.0, -1.0, 0.0])
    q, _ = compat.vllm_silu_and_mul_quant(np.concatenate([g, u]).reshape(1, -1), 1.0)
    assert same(f8_values(q)[0], [448, 448, 448, 448, -448, 0, -0.0, -448, 0])
    # the contract keeps NaN where vLLM writes 448 (its first two; the -inf gate is the contract's 0 * 1)
    qc, _ = ma.quantize(ma.swiglu(g, up=u), ma.Quant(E4, "tensor", scale=1.0))
    assert same(f8_values(qc), [np.nan, np.nan, 448, 0, -448, 0, -0.0, -448, 0])


# ==== vLLM: scaled_fp8_quant (static, dynamic per tensor, dynamic per token) ==================================

def test_vllm_static_multiplies_by_the_inverted_scale():
    """The documented example: 10.9375 / 7 is exactly 1.5625, a tie that goes to the even code 1.5; vLLM's
    10.9375 * fl(1/7) = 1.5625001 rounds up to 1.625."""
    y = np.float32([10.9375, -10.9375, 12.6875])
    q, s = compat.vllm_scaled_fp8_quant(y, scale=7.0)
    assert list(f8_values(q)) == [1.625, -1.625, 1.875]
    qc, _ = ma.quantize(y, ma.Quant(E4, "tensor", scale=7.0))
    assert list(f8_values(qc)) == [1.5, -1.5, 1.75]
    assert float(F32(10.9375) * (F32(1) / F32(7))) == pytest.approx(1.5625001192092896, abs=0)


def _static_ref(v32: np.ndarray, scale: float) -> np.ndarray:
    inv = float(F32(1) / F32(scale))
    x = f32(v32.astype(np.float64) * inv)
    return enc(np.where(np.isnan(x), 448.0, np.clip(x, -448.0, 448.0)))


def test_vllm_static_on_every_bfloat16_value_and_the_count_against_dividing():
    """Every bfloat16 value, several scales: the reference exactly; and how often multiplying by fl(1/s)
    changes a code against the contract's division.  The float32 quotients differ in their last bit for about a
    quarter of the values; the codes only where the exact quotient is a midpoint of the format: none for these
    scales but 7, where 60 of the 65,280 non-NaN values change by one code (the docs quote these counts).  NaN
    aside: 448 against the contract's NaN."""
    v = all_bf16().astype(np.float32)
    fin = ~np.isnan(v)
    diff_f32 = n = 0
    for scale, expected in ((0.05, 0), (0.37, 0), (3.0, 0), (7.0, 60), (1e-3, 0)):
        q, _ = compat.vllm_scaled_fp8_quant(v.astype(ml_dtypes.bfloat16), scale=scale)
        assert same(f8_values(q), _static_ref(v, scale))
        qc, _ = ma.quantize(v, ma.Quant(E4, "tensor", scale=scale))
        with np.errstate(over="ignore", invalid="ignore"):
            diff_f32 += np.count_nonzero((v * (F32(1) / F32(scale)) != v / F32(scale)) & fin)
        steps = code_steps(f8_values(q)[fin], f8_values(qc)[fin])
        assert np.count_nonzero(steps) == expected and steps.max() <= 1, (scale, np.count_nonzero(steps))
        assert np.isnan(f8_values(qc)[~fin]).all() and (f8_values(q)[~fin] == 448).all()
        n += np.count_nonzero(fin)
    assert 0.2 < diff_f32 / n < 0.35


def test_vllm_dynamic_per_tensor():
    v = (RNG.standard_normal((8, 64)) * 5).astype(np.float32)
    v[2, 3] = np.nan
    q, s = compat.vllm_scaled_fp8_quant(v)
    amax = np.nanmax(np.abs(v))
    assert s.shape == (1,) and float(s[0]) == float(F32(amax) / F32(448))
    assert same(f8_values(q), _static_ref(v, float(s[0])))
    # an all-zero tensor: scale 0, so 0 * inf is NaN and every code 448 (dequantized: 0)
    q0, s0 = compat.vllm_scaled_fp8_quant(np.zeros((2, 4), np.float32))
    assert float(s0[0]) == 0 and (f8_values(q0) == 448).all() and (f8_values(q0) * s0[0] == 0).all()


def _per_token_ref(v32: np.ndarray, ub: float | None) -> tuple[np.ndarray, np.ndarray]:
    codes, scales = [], []
    floor = float(F32(1) / F32(448 * 512))
    for row in v32.reshape(-1, v32.shape[-1]).astype(np.float64):
        amax = max([abs(x) for x in row if not math.isnan(x)], default=0.0)
        if ub is not None:
            amax = min(amax, float(F32(ub)))
        s = max(float(F32(amax) / F32(448)), floor)
        scales.append(s)
        with np.errstate(invalid="ignore", divide="ignore"):
            x = f32(row / s)
        codes.append(enc(np.where(np.isnan(x), 448.0, np.clip(x, -448.0, 448.0))))
    return np.array(codes).reshape(v32.shape), np.array(scales).reshape(v32.shape[:-1] + (1,))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("ub", [None, 3.0])
def test_vllm_dynamic_per_token(dtype, ub):
    v = as_input((RNG.standard_normal((3, 5, 64)) * 4).astype(np.float32), dtype).astype(np.float32)
    v[0, 0] = 0.0
    v[0, 1, :5] = [np.nan, np.inf, -np.inf, 1e-30, 2.0]
    v[1, 2, :] = 1e-4  # below the floor: scale 1 / (448 * 512)
    v = as_input(v, dtype).astype(np.float32)
    q, s = compat.vllm_scaled_fp8_quant(as_input(v, dtype), scale_ub=ub, use_per_token_if_dynamic=True)
    rq, rs = _per_token_ref(v, ub)
    assert s.shape == (3, 5, 1) and same(s, rs) and same(f8_values(q), rq)
    # equal to the contract with amax_floor = 1/512 on the finite rows; the special row differs
    qc, sc = ma.quantize(v, ma.Quant(E4, "token", scale_ub=ub, amax_floor=1 / 512))
    fin = np.isfinite(v).all(axis=-1)
    assert same(f8_values(q)[fin], f8_values(qc)[fin]) and same(s[fin], sc[fin])
    assert not same(f8_values(q)[0, 1], f8_values(qc)[0, 1])
    if ub is None:  # the inf row: scale inf, finite values 0, the infs +448 (inf / inf is NaN)
        assert np.isinf(s[0, 1, 0]) and list(f8_values(q)[0, 1, :4]) == [448, 448, 448, 0]


# ==== vLLM: per-token-group FP8 ===============================================================================

def _group_ref(v32: np.ndarray, g: int, eps: float, ue8m0: bool) -> tuple[np.ndarray, np.ndarray]:
    rows = v32.reshape(-1, g).astype(np.float64)
    codes, scales = [], []
    for grp in rows:
        amax = max([float(F32(eps))] + [abs(x) for x in grp if not math.isnan(x)])
        ys = float(F32(amax) / F32(448))
        if ue8m0 and math.isfinite(ys):  # exp2f(ceilf(log2f(fmaxf(fabsf(y_s), 1e-10f)))), log2f correctly rounded
            ys = 2.0 ** math.ceil(float(F32(math.log2(max(ys, float(F32(1e-10)))))))
        scales.append(ys)
        with np.errstate(invalid="ignore", divide="ignore"):
            x = f32(grp / ys)
        codes.append(enc(np.where(np.isnan(x), -448.0, np.clip(x, -448.0, 448.0))))
    return np.array(codes).reshape(v32.shape), np.array(scales).reshape(v32.shape[:-1] + (v32.shape[-1] // g,))


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_vllm_per_token_group(ue8m0, dtype):
    v = as_input((RNG.standard_normal((6, 512)) * RNG.uniform(0.01, 100, (6, 1))).astype(np.float32),
                 dtype).astype(np.float32)
    v[0, :128] = 0.0
    v[1, 3], v[1, 200], v[2, 300] = np.nan, np.inf, -np.inf
    v[3, :128] = 1e-9  # amax below 448e-10
    v = as_input(v, dtype).astype(np.float32)
    q, s = compat.vllm_per_token_group_quant_fp8(as_input(v, dtype), 128, use_ue8m0=ue8m0)
    rq, rs = _group_ref(v, 128, 1e-10, ue8m0)
    assert s.shape == (6, 4) and same(s, rs) and same(f8_values(q), rq)
    # a NaN is skipped by the amax, its code -448 (fmaxf(NaN, -448)); an inf: scale inf, code -448
    assert f8_values(q)[1, 3] == -448 and np.isfinite(s[1, 0]) and np.isinf(s[1, 1]) and f8_values(q)[1, 200] == -448
    # against the contract (amax_floor=eps, pow2=ue8m0): equal but the special groups and, with UE8M0, the tiny
    # ones (the 1e-10 floor on the scale: 2^-33)
    qc, sc = ma.quantize(v, ma.Quant(E4, "group", group_size=128, amax_floor=1e-10, pow2=ue8m0))
    special = ~np.isfinite(v.reshape(6, 4, 128)).all(axis=-1)
    tiny = (np.abs(v.reshape(6, 4, 128)).max(axis=-1) < 448e-10) & ue8m0
    ok = ~special & ~tiny
    assert same(s[ok], sc[ok])
    assert same(f8_values(q).reshape(6, 4, 128)[ok], f8_values(qc).reshape(6, 4, 128)[ok])
    if ue8m0:
        assert s[0, 0] == 2.0 ** -33 and sc[0, 0] == 2.0 ** math.ceil(math.log2(float(F32(1e-10) / F32(448))))


def test_vllm_ue8m0_log2f_rounds_down_just_above_a_power_of_two():
    """The documented difference: a scale one ulp above 2^-7 has log2f exactly -7 in float32, so vLLM keeps 2^-7
    (the group's largest value clamps to 448) where the contract rounds up to 2^-6; counted over scales k ulps
    above powers of two."""
    amax = np.nextafter(F32(3.5), F32(4))  # amax / 448 rounds to 2^-7 (1 + 2^-23)
    y = np.full((1, 128), amax, np.float32)
    q, s = compat.vllm_per_token_group_quant_fp8(y, 128, use_ue8m0=True)
    qc, sc = ma.quantize(y, ma.Quant(E4, "group", group_size=128, amax_floor=1e-10, pow2=True))
    assert float(s[0, 0]) == 2.0 ** -7 and f8_values(q)[0, 0] == 448
    assert float(sc[0, 0]) == 2.0 ** -6 and f8_values(qc)[0, 0] == 224
    kept = 0
    for e in range(-30, 10):
        base = F32(2.0 ** e)
        for k in range(1, 9):
            ys = base
            for _ in range(k):
                ys = np.nextafter(ys, F32(np.inf))
            lg = F32(math.log2(float(ys)))
            kept += int(math.ceil(float(lg)) == e)
    assert kept == 98  # of the 320 scales 1 to 8 ulps above 2^e, 98 keep 2^e (the docs quote this count)


# ==== vLLM: int8 (static, dynamic, azp) ========================================================================

def _rni_sat(x: float, lo: int, hi: int) -> int:
    """PTX cvt.rni.sat: nearest even, clamped, NaN -> 0."""
    if math.isnan(x):
        return 0
    if math.isinf(x):
        return hi if x > 0 else lo
    return int(min(hi, max(lo, round(x))))  # Python's round is to nearest even


def test_vllm_int8_static_and_dynamic():
    v = (RNG.standard_normal((5, 40)) * 3).astype(np.float32)
    v[1, :3] = [np.nan, 1e9, -1e9]
    v[2, :] = 0.0
    # static symmetric: divided
    q, s, z = compat.vllm_scaled_int8_quant(v, scale=0.05)
    ref = [[_rni_sat(float(f32(x / float(F32(0.05)))), -128, 127) for x in row.astype(np.float64)] for row in v]
    assert z is None and (q == np.array(ref)).all()
    # dynamic symmetric: times 127 / amax (0 for an all-zero row)
    q, s, z = compat.vllm_scaled_int8_quant(v)
    for i, row in enumerate(v.astype(np.float64)):
        amax = max([abs(x) for x in row if not math.isnan(x)], default=0.0)
        assert float(s[i, 0]) == float(F32(amax) / F32(127))
        inv = 0.0 if amax == 0 else float(F32(127) / F32(amax))
        assert list(q[i]) == [_rni_sat(float(f32(x * inv)), -128, 127) for x in row]
    assert float(s[2, 0]) == 0 and (q[2] == 0).all()  # the contract: scale 1
    # dynamic codes v * (127 / amax) against the contract's v / (amax / 127): counted (rare at ties)
    w = (RNG.standard_normal((2000, 64)) * 3).astype(np.float32)
    qv, sv, _ = compat.vllm_scaled_int8_quant(w)
    qc, sc = ma.quantize(w, ma.Quant("int8", "token"))
    assert same(sv, sc) and np.count_nonzero(qv != qc) <= 0.001 * qv.size
    assert np.abs(qv.astype(int) - qc).max() <= 1


def test_vllm_int8_azp():
    v = (RNG.standard_normal((4, 50)) * 2 + 1).astype(np.float32)
    v[2, :] = 2.0  # all equal: scale 0 (the contract: 1)
    v[3, 5] = np.nan
    q, s, z = compat.vllm_scaled_int8_quant(v, symmetric=False)
    for i, row in enumerate(v):
        fin = [F32(x) for x in row if not np.isnan(x)]
        lo, hi = min(fin), max(fin)  # fminf / fmaxf folds: NaN skipped
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            sc = (hi - lo) / F32(255)  # float32 steps, IEEE specials included
            zpf = np.rint(F32(-128) - lo / sc)
            inv = F32(1) / sc
            prods = [F32(x) * inv for x in row]
        zp = 0 if np.isnan(zpf) else int(max(-2 ** 31, min(2 ** 31 - 1, math.trunc(float(zpf)) if np.isfinite(zpf)
                                                             else math.copysign(2 ** 40, float(zpf)))))  # cvt.rzi.sat
        assert same(s[i, 0], sc) and int(z[i, 0]) == zp
        for j, p in enumerate(prods):
            t = _rni_sat(float(p), -2 ** 31, 2 ** 31 - 1)
            t = ((t + zp + 2 ** 31) % 2 ** 32) - 2 ** 31  # the GPU's int32 add wraps
            assert int(q[i, j]) == min(127, max(-128, t)), (i, j)
    assert float(s[2, 0]) == 0 and int(z[2, 0]) == -2 ** 31 and (q[2] == -1).all()  # documented: dequantizes to 0
    # static azp: v * fl(1 / scale), rounded, plus azp, saturated
    q, s, z = compat.vllm_scaled_int8_quant(v[:2], scale=0.03, azp=5, symmetric=False)
    inv = float(F32(1) / F32(0.03))
    ref = [[min(127, max(-128, _rni_sat(float(f32(x * inv)), -2 ** 31, 2 ** 31 - 1) + 5)) for x in row]
           for row in v[:2].astype(np.float64)]
    assert (q == np.array(ref)).all() and int(z) == 5
    # the contract's zero-point form on the finite rows with distinct values: same scales and zero points
    qc, sc, zc = ma.quantize(v[:2], ma.Quant("int8", "token", symmetric=False))
    qv, sv, zv = compat.vllm_scaled_int8_quant(v[:2], symmetric=False)
    assert same(sv, sc) and (zv == zc).all() and np.abs(qv.astype(int) - qc).max() <= 1


# ==== Transformer Engine =======================================================================================

def _te_scale_ref(amax: float, qmax: float, pow2: bool, eps: float) -> float:
    if amax < eps:
        amax = eps
    if math.isinf(amax) or amax == 0 or math.isnan(amax):
        return 1.0
    s = float(F32(qmax) / F32(amax))
    if math.isinf(s):
        s = float(np.finfo(np.float32).max)
    if pow2:
        m, e = math.frexp(s)  # clear the mantissa: 2^floor(log2 s)
        s = math.ldexp(0.5, e)
    return s


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("pow2", [False, True])
def test_te_scale_from_amax(name, pow2):
    qmax = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}[name]
    amaxes = [0.0, 1e-45, 1e-40, 1e-30, 0.3, 1.0, 3.0, 448.0, 1e30, math.inf, math.nan]
    got = compat.te_scale_from_amax(np.array(amaxes, np.float32), name, force_pow_2_scales=pow2)
    assert got.dtype == np.float32
    assert same(got, [_te_scale_ref(float(F32(a)), qmax, pow2, 0.0) for a in amaxes])
    assert float(compat.te_scale_from_amax(0.5, name, epsilon=1.0)) == _te_scale_ref(0.5, qmax, False, 1.0)
    t = compat.te_scale_from_amax(torch.tensor([3.0]), name)
    assert isinstance(t, torch.Tensor) and float(t[0]) == _te_scale_ref(3.0, qmax, False, 0.0)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_te_cast_to_fp8(name):
    qmax = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}[name]
    v = (RNG.standard_normal((16, 64)) * 7).astype(np.float32)
    v[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    for scale in (None, 11.0):
        q, sinv, amax = compat.te_cast_to_fp8(v.astype(ml_dtypes.bfloat16).astype(np.float32), scale, name)
        s = _te_scale_ref(math.inf, qmax, False, 0.0) if scale is None else float(F32(scale))
        assert float(amax) == math.inf and float(sinv) == float(F32(1) / F32(s))
        x = f32(v.astype(ml_dtypes.bfloat16).astype(np.float64) * s)
        assert same(f8_values(q), enc(np.clip(x, -qmax, qmax), name))  # satfinite: +-inf -> +-max, NaN stays
    # finite tensors: codes value * fl(qmax / amax), scale_inv fl(1 / that), counted against the contract
    diff_scale = diff_codes = n = 0
    for _ in range(300):
        w = (RNG.standard_normal(256) * RNG.uniform(1e-3, 1e3)).astype(np.float32)
        q, sinv, amax = compat.te_cast_to_fp8(w, None, name)
        s = _te_scale_ref(float(np.abs(w).max()), qmax, False, 0.0)
        assert same(f8_values(q), enc(f32(w.astype(np.float64) * s), name))
        qc, sc = ma.quantize(w, ma.Quant(name, "tensor"))
        diff_scale += int(float(sinv) != float(sc))
        diff_codes += np.count_nonzero(f8_values(q) != f8_values(qc))
        n += w.size
        assert np.abs(float(sinv) / float(sc) - 1) < 2.5e-7
    assert 0.1 < diff_scale / 300 < 0.5 and diff_codes < 0.001 * n  # about a quarter; codes: none seen
    # torch in, torch out
    qt, st, at = compat.te_cast_to_fp8(torch.from_numpy(v[1:]).bfloat16(), 4.0, name)
    assert qt.dtype == getattr(torch, name) and st.dtype == torch.float32 and at.dtype == torch.float32


# ==== CANN: swi_glu_quant, gelu_quant; torch_npu: npu_dequant_swiglu_quant =====================================

def _round_to_odd_f16(v: np.ndarray) -> np.ndarray:
    """float32 values rounded to odd into float16 (truncate toward zero, set the last bit where inexact; beyond
    the largest finite, the largest finite), as float64: Ascend's CAST_ODD, written out."""
    v = np.asarray(v, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t = v.astype(np.float16)
        away = np.abs(t.astype(np.float64)) > np.abs(v)
        t = np.where(away, np.nextafter(t, np.float16(0)), t).astype(np.float16)
        inexact = (t.astype(np.float64) != v) & ~np.isnan(v)
        bits = t.view(np.uint16) | inexact.astype(np.uint16)
    return bits.view(np.float16).astype(np.float64)


def _int8_two_step(v: np.ndarray) -> np.ndarray:
    """CAST_ODD to float16, then CAST_RINT to int8 (saturating; NaN -> 0 as assumed)."""
    h = _round_to_odd_f16(v)
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(np.clip(np.rint(h), -128, 127), nan=0).astype(np.int8)


def _swiglu_rows(x32: np.ndarray, left: bool) -> np.ndarray:
    h = x32.shape[-1] // 2
    a, b = (x32[:, :h], x32[:, h:]) if left else (x32[:, h:], x32[:, :h])
    y = ma.swiglu(np.ascontiguousarray(a), up=np.ascontiguousarray(b))
    return np.where(np.isneginf(a), F32(np.nan), y)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("left", [False, True])
def test_cann_swi_glu_quant_dynamic(dtype, left):
    x32 = as_input((RNG.standard_normal((7, 96)) * 3).astype(np.float32), dtype).astype(np.float32)
    x32[3] = 0.0
    smooth = RNG.uniform(0.5, 2, (2, 48)).astype(np.float32)
    group = np.array([3, 5], np.int32)  # cumulative ends: rows 0-2 group 0, 3-4 group 1, 5-6 none
    y, s = compat.cann_swi_glu_quant(as_input(x32, dtype), smooth, group_index=group, activate_left=left)
    act = _swiglu_rows(x32, left).astype(np.float64)
    for r in range(7):
        g = 0 if r < 3 else 1 if r < 5 else None
        row = f32(act[r] * smooth[g]) if g is not None else act[r]
        amax = float(np.max(np.abs(row)))
        m = float(F32(127) / F32(amax)) if amax else math.inf
        assert float(s[r]) == m
        with np.errstate(invalid="ignore"):
            ref = np.nan_to_num(np.clip(np.rint(f32(row * m)), -128, 127), nan=0)
        assert (y[r] == ref).all()
    assert math.isinf(s[3]) and (y[3] == 0).all()  # all-zero row: scale inf (the contract: 1)
    # end to end against float64 silu: within one code, rarely off
    h = 48
    a64, b64 = (x32[:, :h], x32[:, h:]) if left else (x32[:, h:], x32[:, :h])
    e2e = silu64(a64) * b64
    e2e[:3] *= smooth[0]
    e2e[3:5] *= smooth[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        m64 = 127 / np.abs(e2e).max(axis=-1, keepdims=True)
        ref64 = np.nan_to_num(np.clip(np.rint(e2e * m64), -128, 127), nan=0)
    assert np.abs(y.astype(int) - ref64).max() <= 1
    # count mode gives the same groups as cumulative ends
    y2, s2 = compat.cann_swi_glu_quant(as_input(x32, dtype), smooth, group_index=[3, 2], activate_left=left,
                                       group_list_type=1)
    assert (y2 == y).all() and same(s2, s)


def test_cann_swi_glu_quant_static_and_torch():
    x32 = (RNG.standard_normal((4, 64)) * 3).astype(np.float32)
    act = _swiglu_rows(x32, False).astype(np.float64)
    y, s = compat.cann_swi_glu_quant(x32, np.float32([20.0]), np.float32([1.5]), quant_mode="static")
    assert (s == 0).all()
    assert (y == np.clip(np.rint(f32(f32(act * 20.0) + 1.5)), -128, 127)).all()
    sm, off = RNG.uniform(1, 30, (1, 32)).astype(np.float32), RNG.uniform(-2, 2, (1, 32)).astype(np.float32)
    y, _ = compat.cann_swi_glu_quant(x32, sm, off, quant_mode="static")
    assert (y == np.clip(np.rint(f32(f32(act * sm) + off)), -128, 127)).all()
    yt, st = compat.cann_swi_glu_quant(torch.from_numpy(x32).half())
    yn, sn = compat.cann_swi_glu_quant(x32.astype(np.float16))
    assert yt.dtype == torch.int8 and st.dtype == torch.float32 and (yt.numpy() == yn).all() and same(st.numpy(), sn)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cann_gelu_quant(approximate, dtype):
    x32 = as_input((RNG.standard_normal((6, 80)) * 4).astype(np.float32), dtype).astype(np.float32)
    x32[0, :3] = [0.0, -np.inf, np.inf]
    g = ma.gelu(x32, approximate=approximate)
    if approximate == "tanh":
        g = np.where(np.isneginf(x32), F32(np.nan), g)
    g = g.astype(np.float64)
    # static, per tensor and per channel: the literal two-step cast (round to odd into float16, then rint)
    for sc, off in ((np.float32([25.0]), np.float32([-3.0])), (RNG.uniform(1, 40, 80).astype(np.float32), None)):
        y, s = compat.cann_gelu_quant(as_input(x32, dtype), sc, off, approximate, "static")
        assert s is None
        ref = f32(g * sc.astype(np.float64)) if off is None else f32(f32(g * float(sc[0])) + float(off[0]))
        assert (y == _int8_two_step(ref)).all()
        assert (y == np.nan_to_num(np.clip(np.rint(ref), -128, 127), nan=0)).all()  # one RNE, as documented
    # dynamic: out_scale 1 / (127 / amax), codes value * (127 / amax) through the two casts
    y, s = compat.cann_gelu_quant(as_input(x32, dtype), approximate=approximate)
    for r in range(6):
        amax = float(np.max(np.abs(g[r])))
        m = float(F32(127) / F32(amax))
        assert same(s[r], float(F32(1) / F32(m)))
        assert (y[r] == _int8_two_step(f32(g[r] * m))).all()
    # against the contract's scale amax / 127: equal but in the last bit now and then (counted)
    w = (RNG.standard_normal((3000, 32)) * 2).astype(np.float32)
    _, so = compat.cann_gelu_quant(w, approximate=approximate)
    _, sc = ma.quantize(ma.gelu(w, approximate=approximate), ma.Quant("int8", "token"))
    sc = sc[:, 0]
    assert 0 < np.count_nonzero(so != sc) < 0.5 * len(so) and np.abs(so / sc - 1).max() < 2.5e-7


def _dequant_swiglu_golden(x, ws, acs, bias, qs, qoff, left, mode, swiglu_mode=0, limit=7.0, alpha=1.702,
                           gbias=1.0):
    """Ascend/op-plugin's golden model (float32 torch ops), as written there: dequantize, SwiGLU (standard, or
    the clamped variant on interleaved (mode 1) or split (mode 2) halves), then dynamic (times 127 / max,
    clamp, round) or static (divide by quant_scale, add quant_offset, clamp, round)."""
    x = torch.from_numpy(x)
    if bias is not None and bias.dtype == np.int32:
        x = x + torch.from_numpy(bias)
    res = x.to(torch.float32) * torch.from_numpy(ws)
    if acs is not None:
        res = res * torch.from_numpy(acs).reshape(-1, 1)
    if bias is not None and bias.dtype != np.int32:
        res = res + torch.from_numpy(bias)
    if swiglu_mode == 1:
        a, b = res[..., ::2], res[..., 1::2]
    else:
        a, b = torch.chunk(res, 2, dim=-1)
        a, b = (a, b) if left else (b, a)
    if swiglu_mode:
        a, b = a.clamp(min=None, max=limit), b.clamp(min=-limit, max=limit)
        out = a * torch.sigmoid(alpha * a) * (b + gbias)
    else:
        out = torch.nn.functional.silu(a) * b
    if mode == 1:
        if qs is not None:
            out = out * torch.from_numpy(qs)
        mx = out.abs().amax(dim=-1)
        scale = mx / 127
        out = out * (127 / mx).unsqueeze(1)
    else:
        scale = torch.zeros(out.shape[0])
        out = out / torch.from_numpy(qs) + torch.from_numpy(qoff)
    return torch.round(torch.clamp(out, -128, 127)).to(torch.int8).numpy(), scale.numpy()


@pytest.mark.parametrize("bias_kind", [None, "int32", "float32"])
@pytest.mark.parametrize("left", [False, True])
def test_npu_dequant_swiglu_quant_dynamic(bias_kind, left):
    t, n = 16, 128
    x = RNG.integers(-300, 300, (t, n)).astype(np.int32)
    ws = (RNG.standard_normal(n) * 0.01).astype(np.float32)
    acs = RNG.uniform(0.5, 2, t).astype(np.float32)
    qs = RNG.uniform(0.5, 2, n // 2).astype(np.float32)
    bias = None if bias_kind is None else (RNG.integers(-50, 50, n).astype(np.int32) if bias_kind == "int32"
                                           else RNG.standard_normal(n).astype(np.float32))
    y, s = compat.npu_dequant_swiglu_quant(x, weight_scale=ws, activation_scale=acs, bias=bias, quant_scale=qs,
                                           activate_left=left, quant_mode=1)
    # the kernel's order, written out: int32 bias, cast, weight scale, activation scale, float bias, SwiGLU, smooth
    xi = x.astype(np.int64) + (bias.astype(np.int64) if bias_kind == "int32" else 0)
    v = f32(f32(xi.astype(np.float32).astype(np.float64) * ws) * acs[:, None].astype(np.float64))
    if bias_kind == "float32":
        v = f32(v + bias)
    act = f32(_swiglu_rows(v.astype(np.float32), left).astype(np.float64) * qs)
    scale = f32(np.abs(act).max(axis=-1) / 127.0)
    mult = f32(1.0 / scale)
    assert same(s, scale)
    assert (y == np.clip(np.rint(f32(act * mult[:, None])), -128, 127)).all()
    # the golden model multiplies by 127 / max in one rounding: within one code, rarely off
    gy, gs = _dequant_swiglu_golden(x, ws, acs, bias, qs, None, left, 1)
    assert np.abs(y.astype(int) - gy).max() <= 1 and np.count_nonzero(y != gy) <= 0.01 * y.size
    assert np.abs(s / gs - 1).max() < 1e-6
    # torch in, torch out
    yt, st = compat.npu_dequant_swiglu_quant(torch.from_numpy(x), weight_scale=torch.from_numpy(ws),
                                             activation_scale=torch.from_numpy(acs),
                                             bias=None if bias is None else torch.from_numpy(bias),
                                             quant_scale=torch.from_numpy(qs), activate_left=left, quant_mode=1)
    assert yt.dtype == torch.int8 and (yt.numpy() == y).all() and same(st.numpy(), s)


def test_npu_dequant_swiglu_quant_static_groups_and_halves():
    t, n = 8, 64
    x = RNG.integers(-100, 100, (t, n)).astype(np.int32)
    ws = (RNG.standard_normal(n) * 0.05).astype(np.float32)
    qs, qoff = RNG.uniform(0.01, 0.1, n // 2).astype(np.float32), RNG.uniform(-2, 2, n // 2).astype(np.float32)
    y, s = compat.npu_dequant_swiglu_quant(x, weight_scale=ws, quant_scale=qs, quant_offset=qoff)
    v = f32(x.astype(np.float64) * ws)
    act = _swiglu_rows(v.astype(np.float32), False).astype(np.float64)
    assert (s == 0).all() and (y == np.clip(np.rint(f32(f32(act / qs) + qoff)), -128, 127)).all()
    gy, _ = _dequant_swiglu_golden(x, ws, None, None, qs, qoff, False, 0)
    assert np.abs(y.astype(int) - gy).max() <= 1
    # one quant_scale: times fl(1 / quant_scale) (the kernel's quantIsOne path)
    y1, _ = compat.npu_dequant_swiglu_quant(x, weight_scale=ws, quant_scale=np.float32([0.03]),
                                            quant_offset=np.float32([0.5]))
    assert (y1 == np.clip(np.rint(f32(f32(act * float(F32(1) / F32(0.03))) + 0.5)), -128, 127)).all()
    # groups (count mode): each its row of weight_scale and quant_scale; rows past the groups are zeros here
    wsg = (RNG.standard_normal((2, n)) * 0.05).astype(np.float32)
    qsg = RNG.uniform(0.5, 2, (2, n // 2)).astype(np.float32)
    yg, sg = compat.npu_dequant_swiglu_quant(x, weight_scale=wsg, quant_scale=qsg, group_index=np.int64([3, 4]),
                                             quant_mode=1)
    for rows, g in ((slice(0, 3), 0), (slice(3, 7), 1)):
        yy, ss = compat.npu_dequant_swiglu_quant(x[rows], weight_scale=wsg[g], quant_scale=qsg[g], quant_mode=1)
        assert (yg[rows] == yy).all() and same(sg[rows], ss)
    assert (yg[7] == 0).all() and sg[7] == 0
    # a bfloat16 x is not dequantized
    xb = (RNG.standard_normal((4, n)) * 2).astype(ml_dtypes.bfloat16)
    yb, sb = compat.npu_dequant_swiglu_quant(xb, quant_mode=1)
    act = _swiglu_rows(xb.astype(np.float32), False).astype(np.float64)
    scale = f32(np.abs(act).max(axis=-1) / 127.0)
    assert same(sb, scale) and (yb == np.clip(np.rint(f32(act * f32(1.0 / scale)[:, None])), -128, 127)).all()


# ==== errors: named, nothing returned ==========================================================================

X = np.ones((2, 8), np.float32)
XI = np.ones((2, 8), np.int32)

BAD = [
    (lambda: compat.vllm_silu_and_mul_quant(XI, 1.0), TypeError, r"vllm_silu_and_mul_quant\(\): input must"),
    (lambda: compat.vllm_silu_and_mul_quant(X, 0.0), ValueError, r"vllm_silu_and_mul_quant\(\): scale must be pos"),
    (lambda: compat.vllm_silu_and_mul_quant(X, "1"), TypeError, r"vllm_silu_and_mul_quant\(\): scale must be a real"),
    (lambda: compat.vllm_silu_and_mul_quant(np.ones((2, 7), np.float32), 1.0), ValueError, r"input's last axis"),
    (lambda: compat.vllm_scaled_fp8_quant(X, scale=np.inf), ValueError, r"vllm_scaled_fp8_quant\(\): scale must"),
    (lambda: compat.vllm_scaled_fp8_quant(X, scale_ub=-1.0, use_per_token_if_dynamic=True), ValueError,
     r"scale_ub must be positive"),
    (lambda: compat.vllm_scaled_fp8_quant(X, scale_ub=1.0), ValueError, r"scale_ub applies to per-token"),
    (lambda: compat.vllm_scaled_fp8_quant(X, use_per_token_if_dynamic=1), TypeError, r"use_per_token_if_dynamic"),
    (lambda: compat.vllm_per_token_group_quant_fp8(X, 3), ValueError, r"x's last axis \(8\) must be a multiple of 3"),
    (lambda: compat.vllm_per_token_group_quant_fp8(X, 0), ValueError, r"group_size must be a positive integer"),
    (lambda: compat.vllm_per_token_group_quant_fp8(X, 8, eps=-1.0), ValueError, r"eps must be non-negative"),
    (lambda: compat.vllm_scaled_int8_quant(X, scale=1.0, azp=3), ValueError, r"azp applies to symmetric=False"),
    (lambda: compat.vllm_scaled_int8_quant(X, scale=1.0, azp=1.5, symmetric=False), TypeError, r"azp must be an"),
    (lambda: compat.vllm_scaled_int8_quant(X, scale=1.0, symmetric=False), ValueError, r"azp must be given"),
    (lambda: compat.te_scale_from_amax(1.0, "int8"), ValueError, r"te_scale_from_amax\(\): fp8_dtype must be one"),
    (lambda: compat.te_cast_to_fp8(X, -2.0), ValueError, r"te_cast_to_fp8\(\): scale must be positive"),
    (lambda: compat.te_cast_to_fp8(X, 2.0, force_pow_2_scales=True), ValueError, r"with a given scale"),
    (lambda: compat.te_cast_to_fp8("x"), TypeError, r"te_cast_to_fp8\(\): y must be an array"),
    (lambda: compat.cann_swi_glu_quant(X, np.ones(3, np.float32)), ValueError, r"smooth_scales has shape \(3,\)"),
    (lambda: compat.cann_swi_glu_quant(X, quant_mode="msd"), ValueError, r"quant_mode must be one of"),
    (lambda: compat.cann_swi_glu_quant(X, quant_mode="static"), ValueError, r"smooth_scales must be given"),
    (lambda: compat.cann_swi_glu_quant(X, group_index=[2, 1]), ValueError, r"group_index must be non-decreasing"),
    (lambda: compat.cann_swi_glu_quant(X, activate_left="yes"), TypeError, r"activate_left must be a bool"),
    (lambda: compat.cann_gelu_quant(X, quant_mode="static"), ValueError, r"input_scale must be given"),
    (lambda: compat.cann_gelu_quant(X, approximate="erf"), ValueError, r"approximate must be one of"),
    (lambda: compat.cann_gelu_quant(X, np.ones(3, np.float32)), ValueError, r"input_scale has shape"),
    (lambda: compat.npu_dequant_swiglu_quant(X, activation_scale=np.ones(2, np.float32)), ValueError,
     r"activation_scale dequantizes an int32 x"),
    (lambda: compat.npu_dequant_swiglu_quant(X, weight_scale=np.ones(7, np.float32)), ValueError,
     r"weight_scale has shape \(7,\)"),
    (lambda: compat.npu_dequant_swiglu_quant(XI, swiglu_mode=3), ValueError, r"swiglu_mode must be one of"),
    (lambda: compat.npu_dequant_swiglu_quant(XI, swiglu_mode=1, clamp_limit=0.0), ValueError,
     r"clamp_limit must be positive"),
    (lambda: compat.npu_dequant_swiglu_quant(XI, glu_bias=np.inf), ValueError, r"glu_bias must be finite"),
    (lambda: compat.npu_dequant_swiglu_quant(XI, weight_scale=np.ones(8, np.float32), quant_mode=2), ValueError,
     r"quant_mode must be one of \(0, 1\)"),
    (lambda: compat.npu_dequant_swiglu_quant(XI, weight_scale=np.ones(8, np.float32), group_index=[2]),
     ValueError, r"group_index takes the dynamic mode only"),
    (lambda: compat.npu_dequant_swiglu_quant(np.ones((2, 8), np.int64)), TypeError, r"x must have a float16"),
    (lambda: compat.npu_dequant_swiglu_quant(XI, weight_scale=np.ones(8, np.float32), quant_offset=[1.0]),
     ValueError, r"quant_offset applies with quant_scale"),
    (lambda: compat.npu_dequant_swiglu_quant(XI, weight_scale=np.ones(8, np.float32), bias=np.ones(3, np.int32)),
     ValueError, r"bias has shape \(3,\); expected \(8,\)"),
]


@pytest.mark.parametrize("call,exc,match", BAD, ids=range(len(BAD)))
def test_bad_input_is_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_device_arrays_are_refused_by_name():
    class Dev:
        __cuda_array_interface__ = {"shape": (2, 8), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(TypeError, match=r"vllm_scaled_fp8_quant\(\): input must be a host array"):
        compat.vllm_scaled_fp8_quant(Dev())


def test_specials_raise_no_floating_point_warnings():
    """NaN, +-inf, zero rows and huge values through every function: results, no RuntimeWarning."""
    import warnings

    v = np.float32([[np.nan, np.inf, -np.inf, 0.0, 1e38, -1e38, 1.0, 2.0],
                    [0.0] * 8, [1.0] * 8, [-3.0, 3.0, 0.5, -0.5, 1e-30, -1e-45, 7.0, 1.0]])
    xi = np.int32([[2 ** 31 - 1, -2 ** 31, 0, 5, 1, 2, 3, 4]] * 4)
    with np.errstate(over="ignore", invalid="ignore"):
        inputs = [v, v.astype(ml_dtypes.bfloat16), v.astype(np.float16)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for x in inputs:
            compat.vllm_silu_and_mul_quant(x, 0.5)
            compat.vllm_scaled_fp8_quant(x)
            compat.vllm_scaled_fp8_quant(x, scale=0.5)
            compat.vllm_scaled_fp8_quant(x, scale_ub=2.0, use_per_token_if_dynamic=True)
            compat.vllm_per_token_group_quant_fp8(x, 4, use_ue8m0=True)
            compat.vllm_scaled_int8_quant(x)
            compat.vllm_scaled_int8_quant(x, symmetric=False)
            compat.vllm_scaled_int8_quant(x, scale=0.5, azp=3, symmetric=False)
            compat.te_cast_to_fp8(x)
            compat.te_cast_to_fp8(x, 1e30, "float8_e5m2")
            compat.cann_swi_glu_quant(x)
            compat.cann_swi_glu_quant(x, np.float32([3.0]), np.float32([1.0]), quant_mode="static")
            compat.cann_gelu_quant(x, approximate="tanh")
            compat.cann_gelu_quant(x, 1e30, quant_mode="static")
            compat.npu_dequant_swiglu_quant(x, quant_mode=1)
        compat.te_scale_from_amax(np.float32([0, np.nan, np.inf, 1e-45]), force_pow_2_scales=True)
        compat.npu_dequant_swiglu_quant(xi, weight_scale=np.full(8, 1e30, np.float32), quant_mode=1)
        compat.npu_dequant_swiglu_quant(xi, weight_scale=np.ones(8, np.float32), bias=np.full(8, 7, np.int32),
                                        quant_scale=np.float32([1e-30]))


CALLS = {
    "vllm_silu_and_mul_quant": lambda x: compat.vllm_silu_and_mul_quant(x, 0.03),
    "vllm_scaled_fp8_quant static": lambda x: compat.vllm_scaled_fp8_quant(x, 0.03),
    "vllm_scaled_fp8_quant tensor": lambda x: compat.vllm_scaled_fp8_quant(x),
    "vllm_scaled_fp8_quant token": lambda x: compat.vllm_scaled_fp8_quant(x, None, 4.0, True),
    "vllm_per_token_group_quant_fp8": lambda x: compat.vllm_per_token_group_quant_fp8(x, 32, use_ue8m0=True),
    "vllm_scaled_int8_quant": lambda x: compat.vllm_scaled_int8_quant(x),
    "vllm_scaled_int8_quant azp": lambda x: compat.vllm_scaled_int8_quant(x, symmetric=False),
    "te_cast_to_fp8": lambda x: compat.te_cast_to_fp8(x, None, "float8_e5m2", force_pow_2_scales=True),
    "cann_swi_glu_quant": lambda x: compat.cann_swi_glu_quant(x),
    "cann_gelu_quant": lambda x: compat.cann_gelu_quant(x, approximate="tanh"),
    "npu_dequant_swiglu_quant": lambda x: compat.npu_dequant_swiglu_quant(x, quant_mode=1),
}


def _np(r):
    if r is None:
        return None
    if isinstance(r, torch.Tensor):
        if r.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return f8_values(r)
        return r.numpy()
    return f8_values(r) if r.dtype.itemsize == 1 and r.dtype.kind == "V" else np.asarray(r)


@pytest.mark.parametrize("tdt", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", list(CALLS))
def test_torch_tensors_give_the_numpy_results(name, tdt):
    x32 = (RNG.standard_normal((4, 64)) * 3).astype(np.float32)
    xt = torch.from_numpy(x32).to(getattr(torch, tdt))
    xn = as_input(x32, tdt)
    rt, rn = CALLS[name](xt), CALLS[name](xn)
    assert len(rt) == len(rn)
    for a, b in zip(rt, rn, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert isinstance(a, torch.Tensor) and same(_np(a), _np(b))


def test_the_counts_the_docs_quote():
    """docs/fused-gated.md's "against the contract" counts, on this seeded sample: the same activation values on
    both sides (multiact's), so only the quantization conventions differ."""
    rng = np.random.default_rng(7)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        ds = dc = 0
        for _ in range(2000):
            w = (rng.standard_normal(256) * rng.uniform(1e-3, 1e3)).astype(np.float32)
            q, sinv, _ = compat.te_cast_to_fp8(w, None, name)
            qc, sc = ma.quantize(w, ma.Quant(name, "tensor"))
            ds += int(float(sinv) != float(sc))
            dc += np.count_nonzero(f8_values(q) != f8_values(qc))
        assert 400 < ds < 700 and dc == 0, (name, ds, dc)  # "about a quarter"; no code in 512,000
    w = (rng.standard_normal((20000, 64)) * 3).astype(np.float32)
    qv, sv, _ = compat.vllm_scaled_int8_quant(w)
    qc, sc = ma.quantize(w, ma.Quant("int8", "token"))
    assert same(sv, sc) and np.count_nonzero(qv != qc) == 2  # ties only: 2 in 1.28 million
    yo, so = compat.cann_gelu_quant(w)
    qg, sg = ma.quantize(ma.gelu(w), ma.Quant("int8", "token"))
    assert 0.2 < np.count_nonzero(so != sg[:, 0]) / len(so) < 0.4 and np.count_nonzero(yo != qg) <= 2
    x = (rng.standard_normal((20000, 128)) * 3).astype(np.float32)
    yc, sc = ma.swiglu(x, quant=ma.Quant("int8", "token"))
    ys, _ = compat.cann_swi_glu_quant(x, activate_left=True)
    yn, sn = compat.npu_dequant_swiglu_quant(x, activate_left=True, quant_mode=1)
    assert np.count_nonzero(ys != yc) == 0 and np.count_nonzero(yn != yc) == 0 and same(sn, sc[:, 0])


@pytest.mark.parametrize("swiglu_mode", [1, 2])
def test_npu_dequant_swiglu_quant_variant_swiglu(swiglu_mode):
    """swiglu_mode 1 (GPT-OSS: interleaved, clamped, alpha, + glu_bias) and 2 (the same on the two halves),
    against the golden model: within one code; for mode 1 with glu_bias 1, exactly multiact's own
    `swiglu(layout="interleaved", alpha=1.702, limit=7.0)` quantized by the kernel's rule."""
    t, n = 32, 128
    x = RNG.integers(-2000, 2000, (t, n)).astype(np.int32)
    ws = np.full(n, 0.005, np.float32)
    for gbias in (1.0, 0.25):
        y, s = compat.npu_dequant_swiglu_quant(x, weight_scale=ws, quant_mode=1, swiglu_mode=swiglu_mode,
                                               glu_bias=gbias, activate_left=True)
        gy, gs = _dequant_swiglu_golden(x, ws, None, None, None, None, True, 1, swiglu_mode, 7.0, 1.702, gbias)
        assert np.abs(y.astype(int) - gy).max() <= 1 and np.abs(s / gs - 1).max() < 1e-5
    if swiglu_mode == 1:
        y, s = compat.npu_dequant_swiglu_quant(x, weight_scale=ws, quant_mode=1, swiglu_mode=1)
        act = ma.swiglu(x.astype(np.float32) * ws, layout="interleaved", alpha=1.702,
                        limit=7.0).astype(np.float64)
        scale = f32(np.abs(act).max(axis=-1) / 127.0)
        assert same(s, scale) and (y == np.clip(np.rint(f32(act * f32(1.0 / scale)[:, None])), -128, 127)).all()
