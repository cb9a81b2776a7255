"""Scalar float32 math built from arithmetic only, so numba loops that call it vectorise.

numba >= 0.62 has no SVML: a loop that calls `math.exp` stays scalar.  The
functions here use only +, -, *, /, comparisons (which LLVM turns into selects),
floor, float<->int conversion and one bit cast (int32 -> float32, to build 2^k),
so a prange loop around them compiles to AVX2/AVX-512 code.

This is the float32 math namespace of the shared formulas (`formulas.py`) on
the CPU; the `cuda` backend compiles the same formulas against libdevice
instead (`formulas.libm`), so both namespaces provide the same names.
They are plain Python functions, registered in dependency order.  `build(jit,
bitcasts)` clones them with a globals dict in which every helper is the compiled
version (`cpu()`: `njit(inline="always")`, bit casts from a tiny LLVM
intrinsic).  Uncompiled, they run in plain Python (with NumPy bit casts), which
is how the tests debug them.

Conventions: float32 in, float32 out.  `*_hl(hi, lo)` take their argument as an
unevaluated sum hi + lo (|lo| <= ulp(hi)), for arguments that were computed in
float64 (beta * x, x^2 / 2, ...) and whose float32 rounding would otherwise
cost |x| ulp in exp(x).  Clamps are written `C if v > C else v` so that NaN
passes through; results are fixed up for NaN and +-inf with a final select.

Measured error against float64/mpmath over dense sweeps (see
tests/test_numba_math.py, which asserts these bounds):
  exp <= 1 ulp; expm1, log1p, tanh, softplus0 <= 1.5; sech2, erfc, npdf <= 2;
  sigmoid (float32 division) and ncdf <= 2.5 (float32 ulp);
  results that are subnormal are correctly rounded to within 1 subnormal step.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType, SimpleNamespace
from typing import Any

import numpy as np

F32 = np.float32

# ---- constants (module globals are frozen as typed constants by numba) --------------------

_ZERO = F32(0.0)
_HALF = F32(0.5)
_ONE = F32(1.0)
_TWO = F32(2.0)
_INF = F32(np.inf)
_LOG2E = F32(1.4426950408889634)
_LN2_HI = F32(0.693145751953125)  # 15 significant bits: k * _LN2_HI is exact for |k| <= 256
_LN2_LO = F32(1.4286067653302e-06)
_EXP_MAX = F32(89.0)  # exp overflows above 88.72; clamping here keeps 2^k finite in two halves
_EXP_MIN = F32(-120.0)  # exp(-104) < min subnormal / 2; -120 leaves room for 2^24 * exp(x)
_EXPM1_KMAX = F32(24.0)  # 2^k - 1 is exact up to here
_BIAS = F32(127.0)
_K24 = F32(24.0)
_MANT = F32(8388608.0)  # 2^23
_TANH_SMALL = F32(0.625)
_TANH_CLAMP = F32(9.5)  # tanh(9.5) rounds to 1 in float32
_SQRT1_2 = F32(0.7071067811865476)
_ERF_SPLIT = F32(0.5)
_ERFC_ZMAX = F32(12.0)  # erfc(12) ~ 1e-64: underflows; clamping keeps t away from 0
_LOG1P_MAGIC = np.int32(0x3F3504F3)  # bits of sqrt(1/2): mantissa f ends in [sqrt(1/2), sqrt(2))
_I23 = np.int32(23)

# expm1(r) = r + r^2 * P(r), |r| <= 0.36: relative error 3.3e-10 in float64 (least squares fit
# at Chebyshev nodes against mpmath).
_E0, _E1, _E2, _E3, _E4, _E5 = (F32(v) for v in (
    0.5, 0.1666666567325592, 0.04166630282998085, 0.008333385922014713, 0.001394508988596499,
    0.00019852379045914859))
# erf(z) = z * P(z^2), 0 <= z <= 0.5, evaluated in float64: relative error 1.0e-13.
_R0, _R1, _R2, _R3, _R4, _R5, _R6 = (
    1.12837916709547, -0.37612638900139134, 0.11283791450806885, -0.02686611453288725, 0.005223310645981982,
    -0.0008507921622429884, 0.00010837365645863876)
# tanh(x) = x + x^3 * P(x^2), |x| <= 0.625: relative error 1.7e-10.
_T0, _T1, _T2, _T3, _T4, _T5 = (F32(v) for v in (
    -0.3333333134651184, 0.13333211839199066, -0.05394745245575905, 0.021703999489545822,
    -0.008184662088751793, 0.0021489840000867844))
# erfc(z) * exp(z^2) = t * P(t), t = 1 / (1 + z / 2), 0.5 <= z <= 12: relative error 4.9e-9.
# Evaluated in float64: in float32 the rounding of t alone costs 2 ulp near z = 1.
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9 = (
    0.28209089154129807, 0.2822089106521356, 0.24542116923229512, 0.18592734166422165, 0.04459153725518103,
    0.09067362788909246, -0.17837254489691498, -0.025513389121471684, 0.11428935178866091, -0.041356700730726906)
_LN2_64 = 0.6931471805599453


# ---- registry of device functions -------------------------------------------------------------

_PURE: dict[str, FunctionType] = {}


def _device(f: FunctionType) -> FunctionType:
    """Register f as a device function; it may call those registered before it."""
    _PURE[f.__name__] = f
    return f


def _i32_as_f32(i):
    """Reinterpret int32 bits as float32 (replaced by an intrinsic when compiled)."""
    return np.array(i, dtype=np.int32).view(np.float32)[()]


def _f32_as_i32(x):
    """Reinterpret float32 bits as int32 (replaced by an intrinsic when compiled)."""
    return np.array(x, dtype=np.float32).view(np.int32)[()]


# ---- the functions ------------------------------------------------------------------------------


@_device
def pow2_scale(p, kf):
    """p * 2^kf for integral kf in [-150, 128], rounding once (also into subnormals)."""
    k1 = np.floor(kf * _HALF)
    k2 = kf - k1
    s1 = _i32_as_f32(np.int32((k1 + _BIAS) * _MANT))
    s2 = _i32_as_f32(np.int32((k2 + _BIAS) * _MANT))
    return (p * s1) * s2


@_device
def expm1_reduced(r):
    """expm1(r) for |r| <= 0.36 (plus a little): r + r^2 * P(r)."""
    p = _E5
    p = p * r + _E4
    p = p * r + _E3
    p = p * r + _E2
    p = p * r + _E1
    p = p * r + _E0
    return r + (r * r) * p


@_device
def exp_hl_k(hi, lo, kadd):
    """2^kadd * exp(hi + lo) for integral 0 <= kadd <= 2, rounded once (also into subnormals)."""
    xc = hi if hi < _EXP_MAX else _EXP_MAX  # NaN -> max; fixed up at the end
    xc = xc if xc > _EXP_MIN else _EXP_MIN
    kf = np.floor(xc * _LOG2E + _HALF)
    r = ((xc - kf * _LN2_HI) - kf * _LN2_LO) + lo
    res = pow2_scale(_ONE + expm1_reduced(r), kf + kadd)
    res = res if hi > _EXP_MIN else _ZERO
    return res if hi == hi else hi


@_device
def exp64_hl(hi, lo):
    """exp(hi + lo) as a float64, relatively accurate (<= 1 float32 ulp) down to exp(-120) (scaled by 2^24)."""
    return np.float64(exp_hl_k(hi, lo, _K24)) * 5.9604644775390625e-08


@_device
def exp_hl(hi, lo):
    """exp(hi + lo); <= 1 ulp; inf above 88.72, subnormal results rounded once, 0 below -103.97."""
    return exp_hl_k(hi, lo, _ZERO)


@_device
def exp(x):
    """exp(x) in float32; <= 1 ulp."""
    return exp_hl(x, _ZERO)


@_device
def expm1_hl(hi, lo):
    """expm1(hi + lo); <= 2 ulp: (2^k - 1) + 2^k * expm1(r), or exp(x) - 1 for k > 24."""
    xc = hi if hi < _EXP_MAX else _EXP_MAX
    xc = xc if xc > _EXP_MIN else _EXP_MIN
    kf = np.floor(xc * _LOG2E + _HALF)
    r = ((xc - kf * _LN2_HI) - kf * _LN2_LO) + lo
    q = expm1_reduced(r)
    kc = kf if kf < _EXPM1_KMAX else _EXPM1_KMAX
    t = pow2_scale(_ONE, kc)
    small = (t - _ONE) + t * q
    big = pow2_scale(_ONE + q, kf) - _ONE
    res = small if kf < _EXPM1_KMAX else big
    return res if (hi == hi) & (hi != _ZERO) else hi  # NaN, and +-0 with its sign (r would be +0 at -0)


@_device
def expm1(x):
    """expm1(x) in float32; <= 2 ulp (exact 0 -> 0, -inf -> -1, +inf -> inf)."""
    return expm1_hl(x, _ZERO)


@_device
def log1p(x):
    """log1p(x) in float32; <= 2 ulp; log1p(-1) = -inf, x < -1 -> NaN, subnormal x -> x."""
    m = _ONE + x
    c = (x - (m - _ONE)) / m  # what the rounding of 1 + x lost, relative to m
    i = _f32_as_i32(m)
    ki = (i - _LOG1P_MAGIC) >> _I23
    f = _i32_as_f32(i - (ki << _I23))  # m = 2^k * f, f in [sqrt(1/2), sqrt(2))
    f64 = np.float64(f)
    s = (f64 - 1.0) / (f64 + 1.0)  # |s| <= 0.1716: log f = 2 atanh(s), series to s^9 (error 2e-9)
    s2 = s * s
    p = (((s2 * (1.0 / 9.0) + 1.0 / 7.0) * s2 + 0.2) * s2 + 1.0 / 3.0) * s2
    logf = (s + s) + (s + s) * p
    res = F32(np.float64(ki) * _LN2_64 + (logf + np.float64(c)))
    res = res if x < _INF else x  # +inf, and NaN (x < inf is False for NaN)
    res = res if m > _ZERO else -_INF  # x == -1
    return res if x >= -_ONE else (x - x) / (x - x)  # x < -1 -> NaN


@_device
def softplus0_hl(hi, lo):
    """log(1 + exp(z)), z = hi + lo, without overflow: max(z, 0) + log1p(exp(-|z|))."""
    neg = hi < _ZERO
    e = exp_hl(hi if neg else -hi, lo if neg else -lo)
    l1 = log1p(e)
    res = l1 if neg else hi + (lo + l1)
    return res if hi == hi else hi


@_device
def softplus0(z):
    """log(1 + exp(z)) in float32; <= 2 ulp."""
    return softplus0_hl(z, _ZERO)


@_device
def sigmoid_hl(hi, lo):
    """1 / (1 + exp(-(hi + lo))); <= 2 ulp, subnormal tail included."""
    neg = hi < _ZERO
    e = np.float64(exp_hl(hi if neg else -hi, lo if neg else -lo))  # exp(-|z|), in (0, 1]
    return F32((e if neg else 1.0) / (1.0 + e))  # float64: one rounding after exp's


@_device
def sigmoid64_hl(hi, lo):
    """sigmoid(hi + lo) as a float64, relatively accurate where it is below float32's normal range."""
    neg = hi < _ZERO
    e = exp64_hl(hi if neg else -hi, lo if neg else -lo)
    return (e if neg else 1.0) / (1.0 + e)


@_device
def sigmoid(x):
    """Logistic sigmoid in float32, all float32 arithmetic (the fast forward); <= 2.5 ulp."""
    neg = x < _ZERO
    e = exp(x if neg else -x)  # exp(-|x|), in (0, 1]
    return (e if neg else _ONE) / (_ONE + e)


@_device
def tanh(x):
    """tanh(x) in float32; <= 2 ulp: odd polynomial for |x| < 0.625, else 1 - 2e/(1+e), e = exp(-2|x|)."""
    ax = x if x >= _ZERO else -x
    x2 = x * x
    p = _T5
    p = p * x2 + _T4
    p = p * x2 + _T3
    p = p * x2 + _T2
    p = p * x2 + _T1
    p = p * x2 + _T0
    small = x + x * (x2 * p)
    small = small if x != _ZERO else x  # -0 + (-0 * -p) would give +0; tanh(-0) = -0
    ac = _TANH_CLAMP if ax > _TANH_CLAMP else ax
    e = exp(-(ac + ac))
    big = _ONE - (e + e) / (_ONE + e)
    big = big if x >= _ZERO else -big
    return small if ax < _TANH_SMALL else big


@_device
def sech2(x):
    """1 - tanh(x)^2 = 4e / (1 + e)^2, e = exp(-2|x|): relatively accurate where tanh ~ 1."""
    ax = x if x >= _ZERO else -x
    e4 = np.float64(exp_hl_k(-(ax + ax), _ZERO, _TWO))  # 4 exp(-2|x|), one rounding even if subnormal
    d = 1.0 + 0.25 * e4
    return F32(e4 / (d * d))


@_device
def erfcx_tail(z):
    """erfc(z) * exp(z^2) (float64) for 0.5 <= z (clamped at 12): t * P(t), t = 1 / (1 + z/2)."""
    zc = np.float64(_ERFC_ZMAX if z > _ERFC_ZMAX else z)
    t = 1.0 / (1.0 + 0.5 * zc)
    p = _C9
    p = p * t + _C8
    p = p * t + _C7
    p = p * t + _C6
    p = p * t + _C5
    p = p * t + _C4
    p = p * t + _C3
    p = p * t + _C2
    p = p * t + _C1
    p = p * t + _C0
    return t * p


@_device
def erf_small(z):
    """erf(z) (float64 in, float64 out) for |z| <= 0.5: z * P(z^2)."""
    z2 = z * z
    p = _R6
    p = p * z2 + _R5
    p = p * z2 + _R4
    p = p * z2 + _R3
    p = p * z2 + _R2
    p = p * z2 + _R1
    p = p * z2 + _R0
    return z * p


@_device
def split64(v):
    """A float64 as float32 hi + lo with hi + lo == v to ~48 bits."""
    hi = F32(v)
    return hi, F32(v - np.float64(hi))


@_device
def erfc(z):
    """erfc(z) in float32, relatively accurate in the tail (exp(-z^2) from the exact z^2)."""
    az = z if z >= _ZERO else -z
    azc = np.float64(_ERFC_ZMAX if az > _ERFC_ZMAX else az)
    sq_hi, sq_lo = split64(azc * azc)  # exact square, split
    tail = F32(np.float64(exp_hl(-sq_hi, -sq_lo)) * erfcx_tail(az))
    tail = tail if z >= _ZERO else _TWO - tail
    small = F32(1.0 - erf_small(np.float64(z)))
    res = small if az < _ERF_SPLIT else tail
    return res if z == z else z


@_device
def ncdf64(x):
    """Phi(x) = erfc(-x / sqrt(2)) / 2 as a float64, relatively accurate for x -> -inf (to Phi ~ 1e-53)."""
    z = x * _SQRT1_2
    az = z if z >= _ZERO else -z
    xa = np.float64(F32(20.0) if az > _ERFC_ZMAX else (x if x >= _ZERO else -x))
    sq_hi, sq_lo = split64(xa * xa * 0.5)  # x^2/2 exact in float64
    tail = 0.5 * exp64_hl(-sq_hi, -sq_lo) * erfcx_tail(az)
    tail = tail if x < _ZERO else 1.0 - tail
    small = 0.5 + 0.5 * erf_small(np.float64(x) * 0.7071067811865476)
    res = small if az < _ERF_SPLIT else tail
    return res if x == x else np.float64(x)


@_device
def ncdf(x):
    """Phi(x) in float32; <= 2 ulp, subnormal results included."""
    return F32(ncdf64(x))


@_device
def npdf(x):
    """exp(-x^2/2) / sqrt(2 pi), relatively accurate (exact-argument exp)."""
    xc = F32(1e5) if x > F32(1e5) else x
    xc = F32(-1e5) if xc < F32(-1e5) else xc
    sq_hi, sq_lo = split64(np.float64(xc) * np.float64(xc) * 0.5)
    return F32(0.3989422804014327 * np.float64(exp_hl(-sq_hi, -sq_lo)))


# ---- compiling ----------------------------------------------------------------------------------


def names() -> tuple[str, ...]:
    """The registered device functions, in dependency order."""
    return tuple(_PURE)


def build(jit: Callable[[FunctionType], Any], bitcasts: dict[str, Any]) -> SimpleNamespace:
    """Compile every device function with `jit`; `bitcasts` gives _i32_as_f32 / _f32_as_i32."""
    g: dict[str, Any] = dict(globals())
    g.update(bitcasts)
    out = {}
    for name, f in _PURE.items():
        clone = FunctionType(f.__code__, g, name, f.__defaults__, f.__closure__)
        clone.__qualname__ = f.__qualname__
        clone.__doc__ = f.__doc__
        g[name] = out[name] = jit(clone)
    return SimpleNamespace(**out)


def _cpu_bitcasts() -> dict[str, Any]:
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def i32_as_f32(typingctx, i):
        if not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = args[0]
            if i.bitwidth > 32:
                v = builder.trunc(v, ir.IntType(32))
            return builder.bitcast(v, ir.FloatType())

        return types.float32(i), codegen

    @intrinsic
    def f32_as_i32(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.IntType(32))

        return types.int32(x), codegen

    return {"_i32_as_f32": i32_as_f32, "_f32_as_i32": f32_as_i32}


_CPU: SimpleNamespace | None = None


def cpu() -> SimpleNamespace:
    """The device functions compiled for the CPU (numba njit, inlined into callers)."""
    global _CPU
    if _CPU is None:
        from numba import njit

        _CPU = build(lambda f: njit(inline="always", error_model="numpy")(f), _cpu_bitcasts())
    return _CPU


def python() -> SimpleNamespace:
    """The device functions as plain Python (NumPy scalars): slow, for debugging and tests."""
    return SimpleNamespace(**{name: _PURE[name] for name in _PURE})


__all__ = ["build", "cpu", "names", "python"]
