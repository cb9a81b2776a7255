"""The one table of scalar formulas, written once as plain Python and compiled for every target.

Each formula is a module-level function `f(x, a, b)` (forward), `f(dy, x, a, b)`
(backward; `y` in place of `x` for a backward from the output), `f(g, dy, x, a, b)`
(backward2: g * dy * f''(x), prelu's too, as its f'' is 0 for every weight) or, for prelu,
`f(x, w, a, b)` / `f(dy, x, w, a, b)`; the parameter-gradient terms are
`f(dy, x, a, b)` in float64.  `a` and `b` are the op's scalar parameters as
float64 (see `PARAMS`); `x`, `dy`, `w` arrive in the compute type `T`.  The
bodies bind no names themselves: `build(jit, T, math)` clones every function
with a globals dict holding `T`, typed constants and a math namespace, then
compiles it with `jit`:

- numba CPU, float32: `numba_math` (arithmetic-only float32 math, so loops
  vectorise), `njit(forceinline=True, error_model="numpy")` (LLVM inlines them);
- numba CPU, float64: `libm(...)` below on libm, mirroring `multiact.reference`;
- CUDA: `libm(...)` on `math.exp` etc. (libdevice's expf... for float32), with
  `cuda.jit(device=True)`; under the CUDA simulator the same functions run as
  plain Python on NumPy scalars (`numpy_libm()`).

A math namespace provides `exp`, `expm1`, `tanh`, `sech2`, `sigmoid`,
`softplus0`, `ncdf`, `npdf` in T; `*_hl(hi, lo)` variants that take their
argument as an unevaluated sum hi + lo (e.g. beta * x from `two_prod`, so its
rounding does not cost |x| ulp in exp); and `fma` (numba.cuda.fma on a GPU, an
exact emulation in the simulator; numba CPU: llvm.fma.f32).  numba_math's CPU
namespace also sets `CPU64`: there the float32 formulas may take float64 steps
(the x * sigmoid and gelu backward, rounded once), which the CUDA build never does.  The float32
formulas are float32 arithmetic only (issue 22: a float64 op is 2x-32x slower
on a GPU, and scripts/cuda_ptx_report.py fails any): where one rounding of a
product or quotient matters they carry it as an error-free pair (`two_prod`,
`two_sum`, `div_hl`: fused multiply-adds), where an exponential tail would be
subnormal they carry it scaled by 2^64 and apply the scale last (`expk_hl`,
as native/src/ma_ops.h does), and a few take their float32 forms from the
native kernels (mish, tanh^2).  Every constant is typed (a bare float literal
in a float32 formula would promote it to double).  Conventions are those of
`multiact.reference`: NaN in gives NaN out, +-inf gives the limit, PyTorch's
choices at the kinks.

An op added at run time (`multiact.register_op`) brings its formulas with `register(key, direction, f)`, the
public form of `@_formula`: they join `TABLE` under names of their own, every namespace `build` made
compiles them on first use, and `unregister(key)` takes them out again.  Their loops are compiled in memory,
never cached on disk: `in_source(name)` says which formulas are this file's own, the ones the numba backend's
on-disk cache keys (a hash of this file) cover.  `on_change(fn)` subscribes a backend's caches to both.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections.abc import Callable
from types import FunctionType, SimpleNamespace
from typing import Any

import numpy as np

import multiact.reference as _ref
from multiact import registry
from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS, OPS

from . import numba_math as _NM

# (op, direction) that CUDA computes in float64 for float16/float32 data (rounding once).  None: every float32
# formula is float32 arithmetic with libdevice's float32 math, within tolerance at libdevice's documented error
# bounds (tests/cuda/test_cuda_formulas.py), and scripts/cuda_ptx_report.py fails any float64 op in a float32 or
# float16 kernel.  (sigmoid/tanh/tanhshrink backward and mish were here until their float32 forms of
# native/src/ma_ops.h replaced them.)
WIDE: frozenset[tuple[str, str]] = frozenset()

# kernel key -> the names of its scalar parameters, in the order (a, b): from the op definitions (an op added at
# run time joins when `register` adds its first formula)
PARAMS: dict[str, tuple[str, ...]] = {k: s.defn.float_params for k, s in KEYS.items() if s.defn.float_params}

_PURE: dict[str, FunctionType] = {}  # helpers and formulas, in dependency order
_LIBM: dict[str, FunctionType] = {}  # the libm math namespace, in dependency order
# (op, direction) -> formula name; op "gelu_tanh" is gelu with approximate="tanh"; direction
# "param_grad" is the float64 per-element term of the parameter gradient.
TABLE: dict[tuple[str, str], str] = {}


def _helper(f: FunctionType) -> FunctionType:
    _PURE[f.__name__] = f
    return f


def _formula(*keys: tuple[str, str]) -> Callable[[FunctionType], FunctionType]:
    def deco(f: FunctionType) -> FunctionType:
        _PURE[f.__name__] = f
        for k in keys:
            TABLE[k] = f.__name__
        return f

    return deco


def _libm(f: FunctionType) -> FunctionType:
    _LIBM[f.__name__] = f
    return f


# Placeholders so linters and plain imports see the names; build() and libm() rebind them.
T: Any = np.float32
D = np.float64
IS32 = True
CPU64 = False
ZERO = ONE = THREE = SIX = HALF = BIG = GCLAMP = INV_SQRT2 = INV_SQRT_2PI = ONE_BELOW = Any
ZCLAMP = SELU_SCALE = SELU_SA = FAST_K = GELU_K2 = GELU_C = Any
TWO = FOUR = EIGHT = THIRD = INF = TAIL = SC = L64_HI = L64_LO = SELU_SCALE_T = SELU_SA_T = Any
INV_SQRT_2PI_HI = INV_SQRT_2PI_LO = INV_SQRT2_HI = INV_SQRT2_LO = INV_SQRT_PI = Any
TANH_SMALL = TANH_T0 = TANH_T1 = TANH_T2 = TANH_T3 = TANH_T4 = TANH_T5 = Any
FAST_K_HI = FAST_K_LO = GELU_K2_HI = GELU_K2_LO = GELU_C_HI = GELU_C_LO = GELU_C3 = GELU_FAR = Any
SERIES: Any = ()
MISH_D0 = MISH_D1 = MISH_D2 = MISH_D3 = MISH_D4 = MISH_D5 = MISH_D6 = MISH_D7 = Any
MISH_MID: Any = None
ZERO_D = ONE_D = HALF_D = INV_SQRT_2PI_D = Any
_exp = _expm1 = _log1p = _tanh = _cosh = _erf = _erfc = _fma = _cuda = Any
fma: Any = None


# ---- the libm math namespace (numba float64, CUDA, the simulator) ----------------------------------------
# The float64 versions mirror multiact.reference; the float32 versions evaluate in float32 (fast on a
# GPU) and use lo as a first-order correction.


def _fma_cuda(a, b, c):
    """a * b + c rounded once: numba-cuda's fma (llvm.fma: fma.rn.f32), called as an attribute of the cuda module
    (numba-cuda types the stub only there)."""
    return _cuda.fma(a, b, c)


def _fma_f64(a, b, c):
    """a * b + c from float64: exact for two_prod's error term, at most one double rounding otherwise.  For
    targets without a fused multiply-add of their own (the numba CPU build, which has no float64 rule)."""
    return T(D(a) * D(b) + D(c))


@_libm
def exp(x):
    return T(_exp(x))


@_libm
def expm1(x):
    return T(_expm1(x))


@_libm
def tanh(x):
    return T(_tanh(x))


@_libm
def exp_hl(hi, lo):
    e = T(_exp(hi))
    return e if lo == ZERO else e + e * lo


@_libm
def expm1_hl(hi, lo):
    e1 = T(_expm1(hi))
    return e1 if lo == ZERO else e1 + (e1 + ONE) * lo


@_libm
def sigmoid(x):
    e = T(_exp(-abs(x)))
    return ONE / (ONE + e) if x >= ZERO else e / (ONE + e)


@_libm
def sigmoid_hl(hi, lo):
    neg = hi < ZERO
    e = exp_hl(hi if neg else -hi, lo if neg else -lo)  # exp(-|z|)
    return (e if neg else ONE) / (ONE + e)


@_libm
def softplus0(z):
    """log(1 + exp(z)) without overflow."""
    return (z if z > ZERO else ZERO) + T(_log1p(T(_exp(-abs(z)))))


@_libm
def softplus0_hl(hi, lo):
    r = softplus0(hi)
    return r if lo == ZERO else r + lo * sigmoid(hi)


@_libm
def sech2(x):
    """1 - tanh(x)^2; in float32 as 4e / (1 + e)^2, e = exp(-2|x|): relatively accurate where tanh ~ 1."""
    if IS32:
        ax = abs(x)
        e = T(_exp(-(ax + ax)))
        d = ONE + e
        return (e + e + e + e) / (d * d)
    c = T(_cosh(x))
    return ONE / (c * c)


@_libm
def ncdf(x):
    """Phi(x) = erfc(-x / sqrt(2)) / 2; in float32 through erf near 0, where erfcf's 4-ulp error would show."""
    z = x * INV_SQRT2
    if IS32 and abs(z) < HALF:
        return HALF + HALF * T(_erf(z))
    r = HALF * T(_erfc(-z))
    return ONE if r > ONE else r  # erfcf may round above 2 near -inf


@_libm
def npdf(xc):
    return INV_SQRT_2PI * T(_exp(-HALF * (xc * xc)))


@_libm
def split64(v):
    """A float64 as hi + lo in T (lo = 0 in float64)."""
    hi = T(v)
    return hi, (T(v - D(hi)) if IS32 else ZERO)


@_libm
def sigmoid64_hl(hi, lo):
    return D(sigmoid_hl(hi, lo))


@_libm
def exp64_hl(hi, lo):
    return D(exp_hl(hi, lo))


@_libm
def ncdf64(x):
    return D(ncdf(x))


# ---- helpers -----------------------------------------------------------------------------------------------


@_helper
def keepnan(x, r):
    """r, or x where x is NaN (piecewise formulas would drop it)."""
    return x if x != x else r


@_helper
def clampz(z):
    """z clamped to +-ZCLAMP, beyond which every sigmoid is exactly 0 or 1; NaN passes."""
    z = ZCLAMP if z > ZCLAMP else z
    return -ZCLAMP if z < -ZCLAMP else z


@_helper
def clampbig(x):
    """x clamped to the finite range (so inf * 0 never happens); NaN passes."""
    x = BIG if x > BIG else x
    return -BIG if x < -BIG else x


@_helper
def two_prod(a, b):
    """a * b = p + e exactly (p the rounded product, e its error, from a fused multiply-add).  p is an fma too, so
    that the compiler cannot fuse it into a later sum (NVVM contracts a * b + c by default) and leave e stale."""
    p = fma(a, b, ZERO)
    return p, fma(a, b, -p)


@_helper
def two_sum(a, b):
    """a + b = s + e exactly (Knuth's branch-free two-sum)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@_helper
def clamp_hl(hi, lo):
    """hi + lo with hi clamped to +-ZCLAMP (beyond which every sigmoid is exactly 0 or 1) and lo dropped there (it
    is inf or NaN where hi overflowed); NaN passes in hi."""
    c = clampz(hi)
    return c, (lo if abs(hi) <= ZCLAMP else ZERO)


@_helper
def expk_hl(hi, lo):
    """e^(hi + lo), hi <= 0 (lo a correction below ulp(hi)), as (eK, sc) with e^(hi + lo) = eK * sc: below TAIL
    (float32 only) eK is scaled by 2^64 and sc = 2^-64, so that x * e^(hi + lo) stays accurate where the exponential
    alone would be subnormal (the product is rounded once, by the final * sc)."""
    hc = -ZCLAMP if hi < -ZCLAMP else hi  # e^-1e5 = 0 either way; -inf would make the error term NaN
    deep = IS32 and hc < TAIL
    s = hc + L64_HI  # exact error below: |hc| > |L64_HI| (fast two-sum)
    h = s if deep else hc  # one exponential either way (vector code would evaluate both)
    lo2 = ((L64_HI - (s - hc)) + (lo + L64_LO)) if deep else lo
    return exp_hl(h, lo2), (SC if deep else ONE)


@_helper
def inv_sq_1pe(e):
    """1 / (1 + e)^2 for e in [0, 1], with 1 + e carried exactly (d + c): about 1 ulp."""
    d = ONE + e
    c = e - (d - ONE)
    r = ONE / (d * d)
    return r - (TWO * c) * (r / d)


@_helper
def sig_parts(hi, lo):
    """sigmoid(z), z = hi + lo, in parts: e = e^-|z| = eK * sc (expk_hl), inv = 1 / (1 + e), small = eK * inv;
    sigmoid(z) = inv where z >= 0, small * sc where z < 0 (and sigmoid(-z) the other one)."""
    neg = hi < ZERO
    ek, sc = expk_hl(hi if neg else -hi, lo if neg else -lo)
    inv = ONE / (ONE + ek * sc)
    return ek * inv, inv, sc, neg


@_helper
def gate_fwd(x, hi, lo):
    """x * sigmoid(hi + lo), relatively accurate where the sigmoid is subnormal; 0 where it is 0 (not -inf * 0)."""
    small, inv, sc, neg = sig_parts(hi, lo)
    s = small if neg else inv
    r = ZERO if s == ZERO else x * s
    return r * sc if neg else r


@_helper
def gate_bwd(dy, hi, lo, w, wlo):
    """dy s (1 + w sn), s = sigmoid(z), sn = sigmoid(-z), z = hi + lo, w + wlo = x dz/dx (z itself for swish's
    family), as native's ma_gate_grad: for z < 0, 1 + w sn = (1 + w) - w s (1 + w exact for |w| >= 1), which no
    error of sn reaches (s + x s sn k carried sn's error |w| / |1 + w sn| times: 6.7 ulp for gelu(tanh) at
    x = -7.5 on CUDA's float32, hidden until issue 44 by a floor of 2 eps |dy|); the small side carries the tail
    scale, applied last; where it underflows to 0 the result is 0 (w may be infinite there)."""
    if CPU64:  # numba's CPU build: s in float64 (relatively accurate in the tail), the rest too, one rounding
        s64 = sigmoid64_hl(hi, lo)
        return T(D(dy) * (s64 + ((D(w) + D(wlo)) * s64) * (ONE_D - s64)))
    # sig_parts with 1 + e = d (1 + cd) carried: s = q (1 - cd) with q = eK / d or 1 / d rounded once, and cd folded
    # into the inner sum's one rounding (q times a rounded inner, inner summed in one rounding: eK times a rounded
    # 1 / (1 + e) and an inner of two roundings took fast_gelu's backward to 6.5 ulp at x = -2.28, simulated)
    neg = hi < ZERO
    ek, sc = expk_hl(hi if neg else -hi, lo if neg else -lo)
    e = ek * sc
    d = ONE + e
    cd = (e - (d - ONE)) / d  # |cd| <= 2^-24
    inv = ONE / d
    q = ek / d
    sn = q * sc  # min(s, 1 - s), unscaled (its error reaches only the small term w sn)
    if sn == ZERO:
        inner = (ONE + w) if neg else ONE
    elif neg:  # (1 + w) - w s + wlo (1 - s), less (1 + w) cd
        big = ONE + w
        inner = big + (fma(wlo, inv, -(w * sn)) - big * cd)
    else:  # 1 + w sn + wlo sn, less cd
        inner = ONE + (fma(wlo, sn, w * sn) - cd)
    g = dy * ((q if neg else inv) * inner)
    if neg:
        return q * dy if q == ZERO else g * sc
    return g


@_helper
def gated(x, s):
    """x * s; 0 where s == 0, not -inf * 0."""
    return ZERO if s == ZERO else x * s


@_helper
def swish_fwd(x, khi, klo):
    """x * sigmoid(k x), k = khi + klo, with k x carried as hi + lo (its rounding would cost |k x| ulp in the tail)."""
    xc = clampbig(x)
    hi, lo = two_prod(xc, khi)
    hi, lo = clamp_hl(hi, lo + xc * klo)
    return gate_fwd(x, hi, lo)


@_helper
def swish_bwd(dy, x, khi, klo):
    xc = clampbig(x)
    hi, lo = two_prod(xc, khi)
    hi, lo = clamp_hl(hi, lo + xc * klo)
    return gate_bwd(dy, hi, lo, hi, lo)


@_helper
def gelu_tanh_z(x):
    """(x clamped to +-1e5; z = 2 sqrt(2/pi) (x + 0.044715 x^3) as hi + lo, in pairs of T (error-free products and
    sums): rounding z to T would cost |z| ulp in the e^z tail)."""
    xc = GCLAMP if x > GCLAMP else (-GCLAMP if x < -GCLAMP else x)
    sh, sl = two_prod(xc, xc)
    ch, cl = two_prod(sh, xc)  # x^3
    cl = cl + sl * xc
    dh, dl = two_prod(GELU_C_HI, ch)  # c x^3
    dl = dl + (GELU_C_HI * cl + GELU_C_LO * ch)
    eh, el = two_sum(xc, dh)
    el = el + dl
    zh, zl = two_prod(GELU_K2_HI, eh)
    zl = zl + (GELU_K2_HI * el + GELU_K2_LO * eh)
    hi = zh + zl
    return xc, hi, zl - (hi - zh)


@_helper
def gelu_tanh_w(xc):
    """x dz/dx = x 2k (1 + 3c x^2) as hi + lo, in pairs of T: gate_bwd's 1 + w sigmoid(-z) takes |w| / |1 + w sn|
    times w's error (dz rounded twice cost 2.3 ulp at x = -1.6, where that ratio is 1.5)."""
    sh, sl = two_prod(xc, xc)
    ph, pl = two_prod(GELU_C_HI, sh)  # c x^2
    pl = pl + (GELU_C_HI * sl + GELU_C_LO * sh)
    th, tl = two_prod(THREE, ph)  # 3 c x^2
    tl = tl + THREE * pl
    qh, ql = two_sum(ONE, th)  # 1 + 3 c x^2
    ql = ql + tl
    dh, dl = two_prod(GELU_K2_HI, qh)  # dz/dx
    dl = dl + (GELU_K2_HI * ql + GELU_K2_LO * qh)
    wh, wl = two_prod(xc, dh)
    return wh, wl + xc * dl


@_helper
def npdf_hl(x):
    """exp(-x^2 / 2) / sqrt(2 pi) from the exact square (x clamped to +-1e5)."""
    xc = GCLAMP if x > GCLAMP else (-GCLAMP if x < -GCLAMP else x)
    sh, sl = two_prod(xc, xc)
    return INV_SQRT_2PI * exp_hl(-(sh * HALF), -(sl * HALF))


@_helper
def div_hl(x, a):
    """x / a as hi + lo, clamped as clamp_hl (the remainder x - hi a is exact from a fused multiply-add)."""
    hi = x / a
    return clamp_hl(hi, fma(-hi, a, x) / a)


# ---- piecewise linear ----------------------------------------------------------------------------------------


@_formula(("relu", "forward"))
def relu(x, a, b):
    return ZERO if x < ZERO else x


@_formula(("relu", "backward"), ("relu", "backward_y"))
def relu_grad(dy, x, a, b):
    return keepnan(x, dy if x > ZERO else ZERO)


@_formula(("relu6", "forward"))
def relu6(x, a, b):
    return ZERO if x < ZERO else (SIX if x > SIX else x)


@_formula(("relu6", "backward"), ("relu6", "backward_y"))
def relu6_grad(dy, x, a, b):
    return keepnan(x, dy if (x > ZERO) & (x < SIX) else ZERO)


@_formula(("leaky_relu", "forward"))
def leaky_relu(x, a, b):
    return x if x > ZERO else x * T(a)


@_formula(("leaky_relu", "backward"), ("leaky_relu", "backward_y"))
def leaky_relu_grad(dy, x, a, b):
    return keepnan(x, dy if x > ZERO else dy * T(a))


@_formula(("prelu", "forward"))
def prelu(x, w, a, b):
    return x if x > ZERO else x * w


@_formula(("prelu", "backward"))
def prelu_grad(dy, x, w, a, b):
    return keepnan(x, dy if x > ZERO else dy * w)


@_formula(("hardtanh", "forward"))
def hardtanh(x, a, b):
    return T(a) if x < T(a) else (T(b) if x > T(b) else x)


@_formula(("hardtanh", "backward"), ("hardtanh", "backward_y"))
def hardtanh_grad(dy, x, a, b):
    return keepnan(x, dy if (x > T(a)) & (x < T(b)) else ZERO)


@_formula(("hardswish", "forward"))
def hardswish(x, a, b):
    return ZERO if x <= -THREE else (x if x >= THREE else x * (x + THREE) / SIX)


@_formula(("hardswish", "backward"))
def hardswish_grad(dy, x, a, b):
    mid = dy * (x / THREE + HALF)
    return keepnan(x, ZERO if x <= -THREE else (mid if x < THREE else dy))  # PyTorch 2.x at the kinks


@_formula(("hardsigmoid", "forward"))
def hardsigmoid(x, a, b):  # alpha = a, beta = b as (x + c) / d: relu6(x + 3) / 6 at PyTorch's (c = 3, d = 6)
    c = T(b) / T(a)
    d = ONE / T(a)
    return ZERO if x <= -c else (ONE if x >= d - c else (x + c) / d)


@_formula(("hardsigmoid", "backward"))
def hardsigmoid_grad(dy, x, a, b):
    c = T(b) / T(a)
    d = ONE / T(a)
    return keepnan(x, dy / d if (x > -c) & (x < d - c) else ZERO)


@_formula(("softshrink", "forward"))
def softshrink(x, a, b):
    lam = T(a)
    return keepnan(x, x - lam if x > lam else (x + lam if x < -lam else ZERO))


@_formula(("softshrink", "backward"), ("hardshrink", "backward"))
def shrink_grad(dy, x, a, b):
    return keepnan(x, dy if abs(x) > T(a) else ZERO)


@_formula(("hardshrink", "forward"))
def hardshrink(x, a, b):
    return keepnan(x, x if abs(x) > T(a) else ZERO)


@_formula(("threshold", "forward"))
def threshold(x, a, b):
    return T(b) if x <= T(a) else x


@_formula(("threshold", "backward"))
def threshold_grad(dy, x, a, b):
    return keepnan(x, ZERO if x <= T(a) else dy)


# ---- exponential family -------------------------------------------------------------------------------------


@_formula(("elu", "forward"))
def elu(x, a, b):
    return x if x > ZERO else T(a) * expm1(x)


@_formula(("elu", "backward"))
def elu_grad(dy, x, a, b):
    return dy if x > ZERO else dy * (T(a) * exp(x))


@_formula(("elu", "backward_y"))
def elu_grad_y(dy, y, a, b):
    return dy if y > ZERO else dy * (y + T(a))


# selu (alpha = a, scale = b), as native/src/ma_ops.h: where x < 0 (or y < 0) is too small to change e^x - 1 (= x),
# e^x (= 1) or y + hi (= hi) in T, the value one ulp toward the true side (times ONE_BELOW), so that a product T
# holds exactly on a bfloat16 tie (6 x, 6 dy at alpha = 2, scale = 3) rounds the way the exact value does.
@_formula(("selu", "forward"))
def selu(x, a, b):
    e = expm1(x)
    e = x * ONE_BELOW if e == x and x < ZERO else e  # expm1(x) in (x, 0)
    return x * T(b) if x > ZERO else (T(b) * T(a)) * e


@_formula(("selu", "backward"))
def selu_grad(dy, x, a, b):
    e = exp(x)
    e = ONE_BELOW if e == ONE and x < ZERO else e  # e^x in (0, 1)
    return dy * T(b) if x > ZERO else dy * ((T(b) * T(a)) * e)


@_formula(("selu", "backward_y"))
def selu_grad_y(dy, y, a, b):
    # scale * alpha as hi + lo (two_prod): y + hi cancels where y saturates at -scale * alpha (exact there), and
    # hi's rounding alone would be 2^-12 of the small sum (0.4% of bfloat16 results one ulp off)
    hi, lo = two_prod(T(b), T(a))
    t = y + hi
    t = hi * ONE_BELOW if t == hi and y < ZERO and hi > ZERO else t  # y + hi below hi
    return dy * T(b) if y > ZERO else dy * (t + lo)


@_formula(("celu", "forward"))
def celu(x, a, b):
    hi, lo = div_hl(x, T(a))
    return x if x > ZERO else T(a) * expm1_hl(hi, lo)


@_formula(("celu", "backward"))
def celu_grad(dy, x, a, b):
    hi, lo = div_hl(x, T(a))
    return dy if x > ZERO else dy * exp_hl(hi, lo)


@_formula(("celu", "backward_y"))
def celu_grad_y(dy, y, a, b):
    return dy if y > ZERO else dy * (y / T(a) + ONE)


@_formula(("sigmoid", "forward"))
def sigmoid_f(x, a, b):
    return sigmoid(x)


@_formula(("sigmoid", "backward"))
def sigmoid_grad(dy, x, a, b):
    ek, sc = expk_hl(-abs(x), ZERO)  # sigmoid(x) sigmoid(-x) = e / (1 + e)^2, e = e^-|x| = ek * sc
    return (dy * (ek * inv_sq_1pe(ek * sc))) * sc


@_formula(("sigmoid", "backward_y"))
def sigmoid_grad_y(dy, y, a, b):
    return dy * (y * (ONE - y))


@_formula(("logsigmoid", "forward"))
def logsigmoid(x, a, b):
    return -softplus0(-x)


@_formula(("logsigmoid", "backward"))
def logsigmoid_grad(dy, x, a, b):
    if IS32:
        small, inv, sc, neg = sig_parts(-x, ZERO)  # sigmoid(-x), scaled in the tail
        return (dy * small) * sc if neg else dy * inv
    return dy * sigmoid_hl(-x, ZERO)  # (the sig_parts form, strided, makes NVVM 13.5 fail to compile in float64)


@_formula(("tanh", "forward"))
def tanh_f(x, a, b):
    return tanh(x)


@_formula(("tanh", "backward"))
def tanh_grad(dy, x, a, b):
    if IS32:  # 4e / (1 + e)^2, e = exp(-2|x|), scaled in the tail (dy * sech2 is normal beyond sech2's range)
        ax = abs(x)
        ek, sc = expk_hl(-(ax + ax), ZERO)
        return (dy * ((FOUR * ek) * inv_sq_1pe(ek * sc))) * sc
    return dy * sech2(x)


@_formula(("tanh", "backward_y"))
def tanh_grad_y(dy, y, a, b):
    return dy * ((ONE - y) * (ONE + y))


@_formula(("softplus", "forward"))
def softplus(x, a, b):
    hi, lo = two_prod(x, T(a))  # z = x beta = hi + lo exactly: the linear branch is decided on it, as the
    if (hi > T(b)) | ((hi == T(b)) & (lo > ZERO)):  # reference does (b is representable in T)
        return x
    if hi > ZCLAMP:  # softplus0(z) = z exactly here; the clamp below would cap it
        return x if IS32 else hi / T(a)
    hi, lo = clamp_hl(hi, lo)
    return softplus0_hl(hi, lo) / T(a)


@_formula(("softplus", "backward"))
def softplus_grad(dy, x, a, b):
    hi, lo = two_prod(x, T(a))  # z = x beta exactly, as in softplus
    linear = (hi > T(b)) | ((hi == T(b)) & (lo > ZERO))
    hi, lo = clamp_hl(hi, lo)
    return keepnan(x, dy if linear else dy * sigmoid_hl(hi, lo))


@_formula(("softsign", "forward"))
def softsign(x, a, b):
    ax = abs(x)
    return (ONE if x > ZERO else -ONE) if ax == INF else x / (ONE + ax)


@_formula(("softsign", "backward"))
def softsign_grad(dy, x, a, b):
    """dy / (1 + |x|)^2 with the rounding error c of 1 + |x| (Fast2Sum) taken back as g (1 - 2 c / d):
    squaring 1 / d doubles that error (native's exhaustive float32 run: 4.2 ulp at x = 1.9e7)."""
    ax = abs(x)
    big = ax if ax > ONE else ONE
    small = ONE if ax > ONE else ax
    d = big + small
    r = ONE / d
    g = (dy * r) * r
    if g == g + g or d == d + d:  # g = +-0 keeps its sign, g = +-inf stays; at |x| = inf, c would be NaN
        return g
    c = small - (d - big)
    return g - ((TWO * c) * r) * g


# ---- x * gate(x) ----------------------------------------------------------------------------------------------


@_formula(("silu", "forward"))
def silu(x, a, b):
    return swish_fwd(x, ONE, ZERO)


@_formula(("silu", "backward"))
def silu_grad(dy, x, a, b):
    return swish_bwd(dy, x, ONE, ZERO)


@_formula(("swish", "forward"))
def swish(x, a, b):
    return swish_fwd(x, T(a), ZERO)


@_formula(("swish", "backward"))
def swish_grad(dy, x, a, b):
    return swish_bwd(dy, x, T(a), ZERO)


@_formula(("fast_gelu", "forward"))
def fast_gelu(x, a, b):
    return swish_fwd(x, FAST_K_HI, FAST_K_LO)


@_formula(("fast_gelu", "backward"))
def fast_gelu_grad(dy, x, a, b):
    return swish_bwd(dy, x, FAST_K_HI, FAST_K_LO)


@_formula(("gelu", "forward"))
def gelu(x, a, b):
    if CPU64:  # numba's CPU build: x Phi(x) from the float64 Phi (relatively accurate to Phi ~ 1e-53), one rounding
        p64 = ncdf64(x)
        return ZERO if p64 == ZERO_D else T(D(x) * p64)
    if IS32 and x < -GELU_FAR:  # Phi(x) is subnormal below -12.9, x Phi(x) is not: x Phi(x) = -pdf(x) S(1 / x^2),
        r = ONE / (x * x)  # S = 1 - r + 3r^2 - 15r^3 + 105r^4 (Mills' series; the next term, 945 r^5, < 1e-8)
        return ZERO - npdf_hl(x) * (ONE - r * (ONE - r * (THREE - r * (T(15.0) - r * T(105.0)))))
    return gated(x, ncdf(x))


@_formula(("gelu", "backward"))
def gelu_grad(dy, x, a, b):
    xc = GCLAMP if x > GCLAMP else (-GCLAMP if x < -GCLAMP else x)
    if CPU64:  # numba's CPU build: Phi and the pdf in float64 from the exact x^2 / 2 (the pdf is subnormal in
        xd = D(xc)  # float32 below x = -13.2, where the result is not), one rounding
        sh, sl = split64(xd * xd * HALF_D)
        return T(D(dy) * (ncdf64(x) + xd * (INV_SQRT_2PI_D * exp64_hl(-sh, -sl))))
    if IS32:  # Phi + x pdf, x pdf = x K e an exact product (K = 1 / sqrt(2 pi) as hi + lo), the sum two-summed: only
        # Phi's and e's own errors remain (the rounded terms cost up to 2 result ulps each where they cancel next to
        # the zero crossing: 4.8 ulp at x = -1.61, simulated)
        sh, sl = two_prod(xc, xc)
        e = exp_hl(-(sh * HALF), -(sl * HALF))
        ph, pl = two_prod(INV_SQRT_2PI_HI, e)
        pl = pl + INV_SQRT_2PI_LO * e
        th, tl = two_prod(xc, ph)
        tl = tl + xc * pl
        # Phi from z = x / sqrt2 rounded (ncdf): its rounding zl costs Phi' zl = e zl / sqrt(pi), added back
        zl = two_prod(xc, INV_SQRT2_HI)[1] + xc * INV_SQRT2_LO
        sh, sl = two_sum(ncdf(x), th)
        return dy * (sh + (sl + (tl + zl * (e * INV_SQRT_PI))))
    return dy * (ncdf(x) + xc * npdf_hl(xc))


@_formula(("gelu_tanh", "forward"))
def gelu_tanh(x, a, b):
    xc, hi, lo = gelu_tanh_z(x)
    return gate_fwd(x, hi, lo)


@_formula(("gelu_tanh", "backward"))
def gelu_tanh_grad(dy, x, a, b):
    xc, hi, lo = gelu_tanh_z(x)
    w, wlo = gelu_tanh_w(xc)
    return gate_bwd(dy, hi, lo, w, wlo)


@_helper
def mish_parts(x):
    """tanh(softplus(x)) as num / den from e = e^-|x| = eK * sc (expk_hl), in float32 arithmetic with no
    cancellation: x >= 0: (1 + 2e) / (1 + 2e + 2e^2); x < 0: eK (e + 2) / (e (e + 2) + 2), scaled by sc."""
    ek, sc = expk_hl(-abs(x), ZERO)
    e = ek * sc
    pos = x >= ZERO
    num = (ONE + (e + e)) if pos else ek * (e + TWO)
    den = (ONE + (e + e) + (e * e + e * e)) if pos else e * (e + TWO) + TWO
    return num, den, e, ek, sc, pos


@_formula(("mish", "forward"))
def mish(x, a, b):
    if CPU64:  # numba's CPU build: tanh(softplus(x)) as mish_parts' rational form in float64 from e = e^-|x| within
        # a float32 ulp, one rounding (the float32 form's roundings reached 4.3 ulp at x = -3.24: issue 44)
        e = exp64_hl(-abs(clampbig(x)), ZERO)
        m = e * (e + e) if x >= ZERO else e * (e + (ONE_D + ONE_D))
        t = (ONE_D + (e + e)) / (ONE_D + (e + e) + m) if x >= ZERO else m / (m + (ONE_D + ONE_D))
        return ZERO if t == ZERO_D else T(D(x) * t)
    if IS32:
        num, den, e, ek, sc, pos = mish_parts(x)
        r = gated(x, num / den)
        return r if pos else r * sc
    return gated(x, tanh(softplus0(x)))


@_formula(("mish", "backward"))
def mish_grad(dy, x, a, b):
    if IS32:  # native's ma_mish_grad_parts, x clamped to +-1e5 (e = 0 beyond); x < 0: B = 4 + 4x + e (6 + 4x +
        # e (4 + e)), D = 4 + m (m + 4), m = e (e + 2), scaled by sc.  (num / den + 4 x (1 + e) f / den^2 from
        # 1 / den squared doubled den's rounding: 9.1 ulp at x = -3.1, hidden until issue 44 by a floor of 2 eps |dy|.)
        xg = GCLAMP if x > GCLAMP else (-GCLAMP if x < -GCLAMP else x)
        if x >= ZERO:  # 1 - d, d = 2e^2 (den - 2x (1 + e)) / den^2 <= 0.4, den = 1 + 2e (1 + e), e = e^-x
            e = exp(ZERO - xg)
            ope = ONE + e
            den = fma(e + e, ope, ONE)
            return dy * (ONE - ((TWO * (e * e)) * fma(-(xg + xg), ope, den)) / (den * den))
        if xg > MISH_MID:  # the polynomial in x: e's rounding would cost |f'' / f'| (up to 2.5) times here
            acc = ((MISH_D7 * xg + MISH_D6) * xg + MISH_D5) * xg + MISH_D4  # Horner, spelled out (a loop over
            acc = ((acc * xg + MISH_D3) * xg + MISH_D2) * xg + MISH_D1  # a tuple does not vectorize in numba)
            return dy * (acc * xg + MISH_D0)
        ek, sc = expk_hl(xg, ZERO)  # e = e^x = ek * sc: e B / D, B / D = q + ql, times ek rounded once
        e = ek * sc
        m = e * (e + TWO)
        dd = fma(m, m + FOUR, FOUR)
        bb = fma(e, fma(e, FOUR + e, fma(FOUR, xg, SIX)), fma(FOUR, xg, FOUR))
        q = bb / dd
        ql = fma(-q, dd, bb) / dd
        return (dy * fma(q, ek, ql * ek)) * sc
    xc = clampbig(x)
    sp = softplus0(x)
    return dy * (tanh(sp) + (xc * sigmoid(x)) * sech2(sp))


@_formula(("tanhshrink", "forward"))
def tanhshrink(x, a, b):
    x2 = x * x
    acc = ZERO
    for c in SERIES:  # x - tanh(x) cancels near 0
        acc = acc * x2 + c
    small = acc * x2 * x
    ax = abs(x)
    if IS32:  # 1 - tanh|x| = 2e / (1 + e), e = exp(-2|x|): no cancellation against |x|
        e = exp(-(ax + ax))
        r = (ax - ONE) + (e + e) / (ONE + e)
        large = r if x >= ZERO else -r
    else:
        large = x - tanh(x)
    return (small if ax < ONE else large) + ZERO  # + 0: a zero result is +0, as x - tanh(x) gives at x = -0


@_formula(("tanhshrink", "backward"))
def tanhshrink_grad(dy, x, a, b):
    if CPU64:  # numba's CPU build: tanh(x) in float64 from numba_math's float32 pieces, squared, one rounding (the
        # float32 path's 22-term series runs 20x slower here): |x| < 0.625, x + x^3 P(x^2) (its tanh polynomial, the
        # x^3 P term a tenth of x at most); else (1 - e) / (1 + e), e = e^-2|x| within a float32 ulp
        ax = abs(x)
        if ax < TANH_SMALL:
            xd = D(x)
            x2 = x * x
            p = ((((TANH_T5 * x2 + TANH_T4) * x2 + TANH_T3) * x2 + TANH_T2) * x2 + TANH_T1) * x2 + TANH_T0
            t = xd + xd * ((xd * xd) * D(p))
        else:
            e = exp64_hl(-(ax + ax), ZERO)
            t = (ONE_D - e) / (ONE_D + e)
        return T(D(dy) * (t * t))
    if IS32:  # native's op_tanhshrink_grad: |x| < 1, tanh(x) = x - (x - tanh(x)) as th + tl from the series,
        # squared in one rounding; |x| >= 1, 1 - sech^2(x) (at most 0.42 there), sech^2 = 4e / (1 + e)^2, e = e^-2|x|
        # (tanh(x)^2 as ((1 - e) / (1 + e))^2 reached 5.1 ulp at x = 0.08, hidden until issue 44 by a floor)
        x2 = x * x
        acc = ZERO
        for c in SERIES:
            acc = acc * x2 + c
        sm = acc * x2 * x
        th = x - sm
        tl = (x - th) - sm
        ax = abs(x)
        if ax < ONE:
            return dy * fma(th, th, (th + th) * tl)
        e = exp(-(ax + ax))
        return dy * (ONE - (FOUR * e) * inv_sq_1pe(e))
    t = tanh(x)
    return dy * (t * t)


# ---- second order: g * dy * f''(x) (`ma.backward2`; multiact.reference's <op>_grad2 conventions) ----------------
# The product is (g * dy) * f''(x), so a zero g * dy keeps the sign rules of the reference; f'' = 0 on the
# linear pieces is +0 whatever g and dy are (NaN only from x), and at a kink of f' (relu's 0, hardswish's +-3,
# elu's 0, softplus's beta x = threshold) f'' is 0, as PyTorch's double backward takes it.  Exponential tails
# are carried scaled (expk_hl's eK * sc, sc applied last) and the exponent as an error-free pair where it is a
# product (k x, x^2 / 2), as the first-order formulas do.  prelu's f'' is 0 for every weight: its formula
# takes no w (one loop of arity 3 in every backend, no per-channel weight operand to pass).


@_formula(*((k, "backward2") for k, s in KEYS.items() if s.defn.piecewise_linear))
def zero_grad2(g, dy, x, a, b):
    """f'' = 0 (piecewise linear): +0, NaN where x is NaN."""
    return keepnan(x, ZERO)


@_helper
def bell3(ax):
    """e (1 - e) / (1 + e)^3, e = e^-ax (ax >= 0), as (q, sc) with the value q * sc: sigmoid''(x) is
    -sign(x) times it at ax = |x|, tanh''(x) 8 times that at ax = 2|x|.  1 - e is -expm1(-ax) (no cancellation
    near 0); 1 / (1 + e)^2 from the exact 1 + e (inv_sq_1pe)."""
    ek, sc = expk_hl(-ax, ZERO)
    e = ek * sc
    return (ek * (ZERO - expm1(-ax))) * (inv_sq_1pe(e) / (ONE + e)), sc


@_formula(("hardswish", "backward2"))
def hardswish_grad2(g, dy, x, a, b):
    return keepnan(x, (g * dy) * THIRD if (x > -THREE) & (x < THREE) else ZERO)  # 0 at the kinks (PyTorch)


@_formula(("elu", "backward2"))
def elu_grad2(g, dy, x, a, b):
    return keepnan(x, (g * dy) * (T(a) * exp(x)) if x < ZERO else ZERO)


@_formula(("selu", "backward2"))
def selu_grad2(g, dy, x, a, b):
    return keepnan(x, (g * dy) * ((T(b) * T(a)) * exp(x)) if x < ZERO else ZERO)


@_formula(("celu", "backward2"))
def celu_grad2(g, dy, x, a, b):
    hi, lo = div_hl(x, T(a))
    return keepnan(x, (g * dy) * (exp_hl(hi, lo) / T(a)) if x < ZERO else ZERO)


@_formula(("sigmoid", "backward2"))
def sigmoid_grad2(g, dy, x, a, b):
    q, sc = bell3(abs(x))  # s s' (s' - s) = -sign(x) e (1 - e) / (1 + e)^3
    return ((g * dy) * (ZERO - q if x >= ZERO else q)) * sc


@_formula(("logsigmoid", "backward2"))
def logsigmoid_grad2(g, dy, x, a, b):
    ek, sc = expk_hl(-abs(x), ZERO)  # -s s' = -e / (1 + e)^2
    return ((g * dy) * (ZERO - ek * inv_sq_1pe(ek * sc))) * sc


@_formula(("tanh", "backward2"))
def tanh_grad2(g, dy, x, a, b):
    if not IS32:  # the reference's form (bell3's, strided, makes NVVM 13.5 fail to compile in float64)
        return (g * dy) * (-TWO * (tanh(x) * sech2(x)))
    ax = abs(x)
    q, sc = bell3(ax + ax)  # -2 tanh sech^2 = -8 sign(x) e (1 - e) / (1 + e)^3, e = e^-2|x|
    return ((g * dy) * (EIGHT * (ZERO - q if x >= ZERO else q))) * sc


@_formula(("tanhshrink", "backward2"))
def tanhshrink_grad2(g, dy, x, a, b):
    if not IS32:  # as tanh_grad2's
        return (g * dy) * (TWO * (tanh(x) * sech2(x)))
    ax = abs(x)
    q, sc = bell3(ax + ax)  # +2 tanh sech^2
    return ((g * dy) * (EIGHT * (q if x >= ZERO else ZERO - q))) * sc


@_formula(("softplus", "backward2"))
def softplus_grad2(g, dy, x, a, b):
    hi, lo = two_prod(x, T(a))  # z = x beta exactly; +0 from z = threshold up (PyTorch's (z < threshold) mask)
    linear = (hi > T(b)) | ((hi == T(b)) & (lo >= ZERO)) | (hi == INF)  # (x = inf: lo is NaN)
    hi, lo = clamp_hl(hi, lo)
    neg = hi < ZERO
    ek, sc = expk_hl(hi if neg else -hi, lo if neg else -lo)  # beta s(z) s(-z) = beta e / (1 + e)^2
    r = ((g * dy) * (T(a) * (ek * inv_sq_1pe(ek * sc)))) * sc
    return keepnan(x, ZERO if linear else r)


@_formula(("softsign", "backward2"))
def softsign_grad2(g, dy, x, a, b):
    d = ONE + abs(x)  # -2 sign(x) / (1 + |x|)^3, divided thrice (the cube never overflows); 0 at x = 0
    s = -TWO if x > ZERO else (TWO if x < ZERO else ZERO)
    return (((g * dy) * s) / d) / d / d


@_helper
def swish_bwd2(g, dy, x, khi, klo):
    """g dy f'' of x sigmoid(k x): k s s' (2 - z tanh(z / 2)), z = k x as hi + lo; s s' = e / (1 + e)^2 and
    tanh(|z| / 2) = (1 - e) / (1 + e), e = e^-|z| (scaled in the tail, as gate_bwd's)."""
    xc = clampbig(x)
    hi, lo = two_prod(xc, khi)
    hi, lo = clamp_hl(hi, lo + xc * klo)
    neg = hi < ZERO
    az = -hi if neg else hi
    ek, sc = expk_hl(-az, lo if neg else -lo)
    e = ek * sc
    d = ONE + e
    w = az * ((ZERO - expm1(-az)) / d)
    return ((g * dy) * ((khi * (ek * inv_sq_1pe(e))) * (TWO - w))) * sc


@_formula(("silu", "backward2"))
def silu_grad2(g, dy, x, a, b):
    return swish_bwd2(g, dy, x, ONE, ZERO)


@_formula(("swish", "backward2"))
def swish_grad2(g, dy, x, a, b):
    return swish_bwd2(g, dy, x, T(a), ZERO)


@_formula(("fast_gelu", "backward2"))
def fast_gelu_grad2(g, dy, x, a, b):
    return swish_bwd2(g, dy, x, FAST_K_HI, FAST_K_LO)


@_formula(("gelu", "backward2"))
def gelu_grad2(g, dy, x, a, b):
    xc = GCLAMP if x > GCLAMP else (-GCLAMP if x < -GCLAMP else x)  # pdf(x) (2 - x^2), x^2 exact (sh + sl)
    sh, sl = two_prod(xc, xc)
    ek, sc = expk_hl(-(sh * HALF), -(sl * HALF))
    return ((g * dy) * ((INV_SQRT_2PI * ek) * ((TWO - sh) - sl))) * sc


@_formula(("gelu_tanh", "backward2"))
def gelu_tanh_grad2(g, dy, x, a, b):
    """x s(z), z = 2k (x + c x^3): f'' = s s' (2 z' + x z'' - |x| tanh(|z| / 2) z'^2) (x and z share a sign),
    z' = 2k (1 + 3c x^2), x z'' = 2k 6c x^2."""
    xc, hi, lo = gelu_tanh_z(x)
    neg = hi < ZERO
    az = -hi if neg else hi
    ek, sc = expk_hl(-az, lo if neg else -lo)
    e = ek * sc
    x2 = xc * xc
    dz = GELU_K2_HI * (ONE + GELU_C3 * x2)
    th = (ZERO - expm1(-az)) / (ONE + e)
    inner = ((dz + dz) + (GELU_K2_HI * (GELU_C3 + GELU_C3)) * x2) - (abs(xc) * th) * (dz * dz)
    return ((g * dy) * ((ek * inv_sq_1pe(e)) * inner)) * sc


@_formula(("mish", "backward2"))
def mish_grad2(g, dy, x, a, b):
    """x tanh(softplus(x)): with u = e^x, D = u^2 + 2u + 2, f'' = (4u / D^2) (2 (1 + u) + x (D - 2u^2 (u + 2)) / D);
    in e = e^-|x| (scaled by sc below 0): x >= 0: (4e^2 / den^2) (2 (1 + e) + x (e den - 2 num) / den), num, den
    those of mish_parts; x < 0: u = e and the result times sc."""
    xc = GCLAMP if x > GCLAMP else (-GCLAMP if x < -GCLAMP else x)  # e = 0 beyond: no x * 0 * inf
    ek, sc = expk_hl(-abs(xc), ZERO)
    e = ek * sc
    pos = x >= ZERO
    den = (ONE + (e + e) + (e * e + e * e)) if pos else e * (e + TWO) + TWO
    # pos: e den - 2 num = ((2e + 2) e - 3) e - 2; else D - 2u^2 (u + 2)
    c = (((e + e) + TWO) * e - THREE) * e - TWO if pos else den - (e + e) * (e * (e + TWO))
    # x >= 0: e^2 is subnormal from x = 43.7 while the result is normal to x = 47: one factor e last
    pre = (FOUR * (e if pos else ek)) / (den * den)
    r = (g * dy) * (pre * ((TWO * (ONE + e)) + xc * (c / den)))
    return r * (e if pos else sc)


# ---- parameter-gradient terms (float64 in, float64 out; summed by the backend) ----------------------------------


@_formula(("swish", "param_grad"))
def swish_beta_term(dy, x, beta, b):
    """dy * d/d(beta) swish(x) = dy * x^2 sigmoid(beta x) sigmoid(-beta x)."""
    xc = clampbig(x)
    kx = xc * beta
    return dy * ((xc * sigmoid(kx)) * (xc * sigmoid(-kx)))


@_formula(("prelu", "param_grad"))
def prelu_weight_term(dy, x, a, b):
    """dy * d/dw prelu(x) = dy * x where x <= 0."""
    return 0.0 if x > 0.0 else x * dy


# ---- composite families: an activation's two formulas composed with another input ------------------------------
# Templates, not formulas: `act` and `act_grad` are bound per activation when they are compiled (`build_family`),
# so a gated kernel is the activation's own forward and backward formulas and nothing restated.  `limit` and
# `shift` arrive as float64 (rounded to float32 by the caller below float64) and are used in T.


def _family(f: FunctionType) -> FunctionType:
    _FAMILY[f.__name__] = f
    return f


_FAMILY: dict[str, FunctionType] = {}
act = act_grad = act_grad_y = Any


@_family
def gated_clip(gate, up, limit, shift):
    """(min(gate, limit), clamp(up, -limit, limit) + shift) in T; NaN passes both; no shift when it is 0 (so
    up = -0 stays -0); limit = inf clips nothing."""
    lim = T(limit)
    g = lim if gate > lim else gate
    u = lim if up > lim else (-lim if up < -lim else up)
    sh = T(shift)
    return g, (u if sh == ZERO else u + sh)


@_family
def gated_forward(gate, up, a, b, limit, shift):
    """act(g) * u: the activation's forward formula, times the clipped up."""
    g, u = gated_clip(gate, up, limit, shift)
    return act(g, a, b) * u


@_family
def gated_backward(dy, gate, up, a, b, limit, shift):
    """(dgate, dup) = (act_grad(dy * u, g), dy * act(g)), 0 where the clip is hit (gate > limit, |up| > limit);
    every input of the element is read before either result exists (in place is safe)."""
    g, u = gated_clip(gate, up, limit, shift)
    dg = act_grad(dy * u, g, a, b)
    du = dy * act(g, a, b)
    lim = T(limit)
    return (ZERO if gate > lim else dg), (ZERO if abs(up) > lim else du)


# bias_act:<act>: z = x * s + b (hb, hs: whether b and s are given, so that a missing one neither adds +0 nor
# multiplies by 1); y = clip(act(z) * gain, -clamp, clamp); the backward's e = dy * gain is 0 where
# |act(z) * gain| > clamp.  gain and clamp arrive as float64 and are used in T (rounded once, as the
# reference's T(gain)); clamp = inf clips nothing and the backward then skips the second act().


@_family
def bias_act_z(x, bv, sv, hb, hs):
    z = x * sv if hs else x
    return z + bv if hb else z


@_family
def bias_act_forward(x, bv, sv, a, b, hb, hs, gain, clamp):
    y = act(bias_act_z(x, bv, sv, hb, hs), a, b) * T(gain)
    c = T(clamp)
    y = c if y > c else y
    return -c if y < -c else y


@_family
def bias_act_backward(dy, x, bv, sv, a, b, hb, hs, gain, clamp):
    """(dx, dz): dz = act_grad(dy * gain, z), with dy * gain = 0 where the forward clips; dx = dz * s."""
    z = bias_act_z(x, bv, sv, hb, hs)
    g = T(gain)
    e = dy * g
    c = T(clamp)
    if c != INF and abs(act(z, a, b) * g) > c:
        e = ZERO
    dz = act_grad(e, z, a, b)
    return (dz * sv if hs else dz), dz


@_family
def bias_act_backward_y(dy, y, a, b, gain, clamp):
    """dz from the forward's output y (fused_bias_act's y= rules, StyleGAN's): the activation's y formula at
    y / gain, on dy * gain = 0 where |y| >= clamp (clamp as y stores it; inf: nothing clipped)."""
    g = T(gain)
    e = dy * g
    c = T(clamp)
    if c != INF and abs(y) >= c:
        e = ZERO
    return act_grad_y(e, y / g, a, b)


@_helper
def linear_identity(x, a, b):
    """bias_act's linear activation (not an op of the table, so not in TABLE)."""
    return x


@_helper
def linear_identity_grad(dy, x, a, b):
    return dy


def family_formulas(key: str) -> tuple[str, str] | None:
    """(forward formula, backward formula) of the activation behind a composite kernel key ('gated:silu'), or
    None when formulas.py lacks either (an activation registered without formulas) or the family's templates."""
    entry = FAMILY_KEYS.get(key) or BIAS_ACT_KEYS.get(key)
    if entry is None or not all(f"{entry[0].name}_{d}" in _FAMILY for d in ("forward", "backward")):
        return None  # not a composite key, or a family without templates here
    if entry[0].name == "bias_act" and entry[2] == "linear":
        return "linear_identity", "linear_identity_grad"
    fwd, bwd = TABLE.get((entry[2], "forward")), TABLE.get((entry[2], "backward"))
    return (fwd, bwd) if fwd and bwd else None


def family_y_formula(key: str) -> str | None:
    """The backward_y formula of a bias_act key's activation (linear: its backward), or None without one."""
    entry = BIAS_ACT_KEYS.get(key)
    if entry is None or family_formulas(key) is None:
        return None
    if entry[2] == "linear":
        return "linear_identity_grad"
    return TABLE.get((entry[2], "backward_y"))


def family_params(key: str, params: dict[str, Any], dtype: str) -> tuple[float, float, float, float]:
    """(a, b, limit, shift) for a composite kernel: the activation's scalars and the family's, as Python floats,
    rounded to float32 below float64 (limit = inf when there is none)."""
    a, b = scalar_params(FAMILY_KEYS[key][2], params, dtype)
    limit = float(params.get("limit", math.inf))
    if dtype != "float64" and limit != math.inf:
        limit = float(np.float32(limit))
    return a, b, limit, float(params.get("shift", 0.0))


def bias_params(key: str, params: dict[str, Any], dtype: str) -> tuple[float, float, float, float]:
    """(a, b, gain, clamp) for a bias_act kernel: the activation's scalars rounded to float32 below float64
    (as scalar_params), gain and clamp as given (the formulas round them to T; clamp = inf for none)."""
    a, b = scalar_params(BIAS_ACT_KEYS[key][2], params, dtype)
    return a, b, float(params.get("gain", 1.0)), float(params.get("clamp", math.inf))


# ---- compiling ----------------------------------------------------------------------------------------------------


def _pair(name: str, v: float, t: Any) -> dict[str, Any]:
    """A float64 constant as name_HI + name_LO in type t (name_LO = 0 in float64)."""
    hi = t(v)
    return {f"{name}_HI": hi, f"{name}_LO": t(v - float(hi))}


def constants(t: Any) -> dict[str, Any]:
    """The typed constants of the formulas and the libm math, in compute type t (np.float32 or np.float64)."""
    is32 = np.dtype(t) == np.float32
    return {
        # CPU64: float32 formulas may take float64 steps (True only from numba_math's CPU namespace; never on CUDA)
        "T": t, "D": np.float64, "IS32": is32, "CPU64": False,
        "ZERO_D": np.float64(0.0), "ONE_D": np.float64(1.0), "HALF_D": np.float64(0.5),
        "INV_SQRT_2PI_D": np.float64(1.0 / math.sqrt(2.0 * math.pi)),
        "ZERO": t(0.0), "ONE": t(1.0), "THREE": t(3.0), "SIX": t(6.0), "HALF": t(0.5),
        "ONE_BELOW": np.nextafter(t(1.0), t(0.0)),  # v * ONE_BELOW: the next float toward 0 (v normal)
        "BIG": t(np.finfo(t).max), "GCLAMP": t(1e5),
        "INV_SQRT2": t(1.0 / math.sqrt(2.0)), "INV_SQRT_2PI": t(1.0 / math.sqrt(2.0 * math.pi)),
        **_pair("INV_SQRT_2PI", 1.0 / math.sqrt(2.0 * math.pi), t), **_pair("INV_SQRT2", 1.0 / math.sqrt(2.0), t),
        "INV_SQRT_PI": t(1.0 / math.sqrt(math.pi)),
        # numba_math's tanh polynomial (float32), for the CPU build's tanhshrink backward
        "TANH_SMALL": t(0.625), **{f"TANH_T{i}": t(getattr(_NM, f"_T{i}")) for i in range(6)},
        "TWO": t(2.0), "FOUR": t(4.0), "EIGHT": t(8.0), "THIRD": t(1.0 / 3.0), "INF": t(math.inf),
        "ZCLAMP": t(1e5),  # |z| beyond which every sigmoid is exactly 0 or 1 (float64 too)
        # expk_hl's tail: below TAIL, e^u is carried times 2^64 (L64 = 64 ln 2 as hi + lo) and SC = 2^-64 applied last
        "TAIL": t(-80.0), "SC": t(2.0**-64), **_pair("L64", 64 * math.log(2.0), t),
        "SELU_SCALE_T": t(_ref.SELU_SCALE), "SELU_SA_T": t(_ref.SELU_SCALE * _ref.SELU_ALPHA),
        **_pair("FAST_K", _ref.FAST_GELU_K, t), **_pair("GELU_K2", 2 * _ref.GELU_TANH_K, t),
        **_pair("GELU_C", _ref.GELU_TANH_C, t), "GELU_C3": t(3.0 * _ref.GELU_TANH_C),
        "GELU_FAR": t(12.0),  # gelu below -GELU_FAR: Mills' series (Phi(x) would be subnormal below -12.9)
        # float64 constants (no formula uses them in T arithmetic any more; kept for the float64 reference values)
        "SELU_SCALE": _ref.SELU_SCALE, "SELU_SA": _ref.SELU_SCALE * _ref.SELU_ALPHA,
        "FAST_K": _ref.FAST_GELU_K, "GELU_K2": 2 * _ref.GELU_TANH_K, "GELU_C": _ref.GELU_TANH_C,
        "SERIES": tuple(t(c) for c in reversed(_ref._tanhshrink_series(22 if is32 else 44))),
        # mish's float32 backward on (MISH_MID, 0): native/fit_coefficients.py's table, highest power first
        **{f"MISH_D{i}": t(c) for i, c in enumerate(reversed(_NM.MISH_D))}, "MISH_MID": t(_NM.MISH_MID),
    }


def _clone_all(funcs: dict[str, FunctionType], g: dict[str, Any], jit: Callable[[FunctionType], Any]) -> dict:
    out = {}
    for name, f in funcs.items():
        clone = FunctionType(f.__code__, g, name, f.__defaults__, f.__closure__)
        clone.__qualname__, clone.__doc__ = f.__qualname__, f.__doc__
        g[name] = out[name] = jit(clone)
    return out


def math_libm(cuda: Any = None) -> dict[str, Any]:
    """libm as the math namespace sees it: Python's `math` (numba and numba-cuda compile it to libm/libdevice);
    `cuda`: the numba.cuda module when compiling for a GPU (its fma), else `fma` comes from float64."""
    fns = {"_exp": math.exp, "_expm1": math.expm1, "_log1p": math.log1p, "_tanh": math.tanh,
           "_cosh": math.cosh, "_erf": math.erf, "_erfc": math.erfc}
    return fns if cuda is None else {**fns, "_cuda": cuda}


def _fma_numpy(a: Any, b: Any, c: Any) -> Any:
    """A fused multiply-add on NumPy float32/float64 scalars, rounded once (the CUDA simulator's: float32 a * b is
    exact in float64, the sum is rounded to odd there, and float64's 29 spare bits make the final rounding to
    float32 correct).  float64 scalars get a * b + c (NumPy has no fma; no float64 formula needs one)."""
    t = type(a)
    if t is not np.float32:
        return t(a * b + c)
    p, cd = np.float64(a) * np.float64(b), np.float64(c)
    s = p + cd
    if np.isfinite(s):
        bb = s - p
        err = (p - (s - bb)) + (cd - bb)
        if err != 0 and not (s.view(np.int64) & 1):  # round to odd: s inexact and even -> step toward the error
            s = np.nextafter(s, np.float64(np.inf) if err > 0 else np.float64(-np.inf))
    return np.float32(s)


def numpy_libm() -> dict[str, Any]:
    """libm on NumPy scalars, evaluated in float64 (no OverflowError): for plain Python and the CUDA simulator."""
    f64 = np.float64
    return {"_exp": lambda v: np.exp(f64(v)), "_expm1": lambda v: np.expm1(f64(v)),
            "_log1p": lambda v: np.log1p(f64(v)), "_tanh": lambda v: np.tanh(f64(v)),
            "_cosh": lambda v: np.cosh(f64(v)), "_erf": lambda v: f64(math.erf(v)),
            "_erfc": lambda v: f64(math.erfc(v)), "_fma": _fma_numpy}


def libm(jit: Callable[[FunctionType], Any], t: Any, fns: dict[str, Any] | None = None) -> SimpleNamespace:
    """The math namespace on libm functions `fns` (default: `math_libm()`), compiled with `jit` for type t."""
    g: dict[str, Any] = dict(globals())
    g.update(constants(t))
    g.update(fns if fns is not None else math_libm())
    if g["_fma"] is not Any:  # _fma_numpy: plain Python on NumPy scalars
        g["fma"] = g["_fma"]
        return SimpleNamespace(fma=g["_fma"], **_clone_all(_LIBM, g, jit))
    fma = _fma_cuda if g["_cuda"] is not Any else _fma_f64  # a GPU's fused multiply-add, or float64's
    return SimpleNamespace(**_clone_all({"fma": fma, **_LIBM}, g, jit))


class Namespace(SimpleNamespace):
    """What `build` returns: every helper and formula compiled for one target, by name.  A formula that `register`
    adds afterwards is compiled on first use, with the same jit against the same globals; `unregister` drops it."""

    __slots__ = ("_globals", "_jit", "__weakref__")

    def __getattr__(self, name: str) -> Any:  # only for a name not compiled yet
        f = _PURE.get(name)
        if f is None or name.startswith("__"):
            raise AttributeError(name)
        with _LOCK:
            if name not in self.__dict__:
                self.__dict__.update(_clone_all({name: f}, self._globals, self._jit))
            return self.__dict__[name]

    def _drop(self, names: set[str]) -> None:
        for n in names:
            self.__dict__.pop(n, None)
            self._globals.pop(n, None)


_BUILT: list[weakref.ref] = []  # every Namespace build() made that is still alive
_LOCK = threading.RLock()


def build(jit: Callable[[FunctionType], Any], t: Any, math_ns: SimpleNamespace) -> Namespace:
    """Every helper and formula compiled with `jit` for compute type t against the math namespace."""
    g: dict[str, Any] = dict(globals())
    g.update(constants(t))
    g.update(vars(math_ns))
    pre = {} if getattr(math_ns, "fma", None) is not None else {"fma": _fma_f64}  # e.g. numba_math's namespace
    with _LOCK:
        ns = Namespace(**_clone_all({**pre, **_PURE}, g, jit))
        ns._globals, ns._jit = g, jit
        _BUILT[:] = [r for r in _BUILT if r() is not None]
        _BUILT.append(weakref.ref(ns))
    return ns


def python(t: Any, fns: dict[str, Any] | None = None) -> Namespace:
    """The formulas as plain Python on NumPy scalars of type t over `libm`: slow, for tests and the simulator."""
    ident = lambda f: f  # noqa: E731
    return build(ident, t, libm(ident, t, fns if fns is not None else numpy_libm()))


def build_family(jit: Callable[[FunctionType], Any], t: Any, ns: Namespace, key: str) -> SimpleNamespace:
    """The composite kernel key's scalar functions (`forward`, `backward`) compiled with `jit` for compute type t,
    calling the activation's formulas from `ns` (what `build` returned for t)."""
    fwd, bwd = family_formulas(key)
    g: dict[str, Any] = dict(globals())
    g.update(constants(t))
    g.update(vars(ns))
    ybwd = family_y_formula(key)  # bias_act's y form: the activation's y formula, where it has one
    g.update(act=getattr(ns, fwd), act_grad=getattr(ns, bwd), act_grad_y=getattr(ns, ybwd or bwd))
    fam = key.split(":", 1)[0]
    done = _clone_all({n: f for n, f in _FAMILY.items() if n.startswith(fam + "_")}, g, jit)
    return SimpleNamespace(forward=done[f"{fam}_forward"], backward=done[f"{fam}_backward"],
                           backward_y=done.get(f"{fam}_backward_y") if ybwd else None)


def formula_name(key: str, direction: str, params: dict[str, Any] | None = None) -> str:
    """The formula for one call: `key` is a kernel key (dispatch resolves it; 'gelu_tanh' is its own
    formula), or an op's name with the parameters that select its variant."""
    if key in OPS and params is not None:
        key = OPS[key].kernel_key(params)
    return TABLE[(key, direction)]


# ---- formulas of an op added at run time ---------------------------------------------------------------------

_ADDED: dict[str, str] = {}  # formula name -> its kernel key, for every formula register() added
_SERIAL = itertools.count(1)
_LISTENERS: list[Callable[[str], None]] = []


def on_change(fn: Callable[[str], None]) -> Callable[[str], None]:
    """Call fn(kernel key) whenever `register` or `unregister` changes that key's formulas (a backend's caches of
    compiled loops subscribe here); returns fn."""
    _LISTENERS.append(fn)
    return fn


def in_source(name: str) -> bool:
    """Whether formula `name` is one of this file's own, not one `register` added: the numba backend caches loops
    on disk only around these (its cache keys hash this file, not a test's or a plug-in's module)."""
    return name in _PURE and name not in _ADDED


def register(key: str, direction: str, f: FunctionType | None = None) -> Any:
    """Add the formula of kernel key `key` in `direction` at run time: the public form of `@_formula((key,
    direction))`, for an op added with `multiact.register_op` (which calls this for its `formulas=`).  Without f,
    a decorator.  Returns f.

    f is written as this file's formulas are (see the module's docstring: `f(x, a, b)` forward, `f(dy, x, a, b)`
    backward, `f(g, dy, x, a, b)` backward2, the float64 term `f(dy, x, a, b)` param_grad; a, b the op's float
    parameters in slot order), and sees only the names they see (`T`, the typed constants, the math namespace,
    the helpers, Python's `math`), not its own module's.  An op whose y-form is "same" gets its backward formula
    for backward_y too.  It runs on the numba backend (loops compiled in memory, never cached on disk) and the
    cuda backend as soon as it is registered.  ValueError for an unknown kernel key, an op with an array
    parameter or more than two float parameters, a direction the op does not have, or one with a formula."""
    if f is None:
        return lambda fn: register(key, direction, fn)
    spec = KEYS.get(key)
    where = f"formulas.register({key!r}, {direction!r})"
    if spec is None:
        raise ValueError(f"{where}: unknown kernel key; add the op first (multiact.register_op)")
    d = spec.defn
    if d.array_param or len(d.float_params) > 2:
        raise ValueError(f"{where}: the formulas take at most two float parameters (a, b) and no array parameter")
    has = spec.backward2 is not None if direction == "backward2" else spec.has(direction)
    if not has:
        raise ValueError(f"{where}: {spec.name} has no {direction} (its definition and references say which "
                         "directions it has)")
    if direction == "backward_y" and d.y_form == "same":
        raise ValueError(f"{where}: its y-form is 'same': the backward's formula holds on y (register backward)")
    if not isinstance(f, FunctionType):
        raise TypeError(f"{where}: a formula is a plain Python function, got {type(f).__name__}")
    name = f"{f.__name__}__{next(_SERIAL)}"  # a name of its own: nothing compiled and keyed by name outlives it
    directions = [direction, *(["backward_y"] if direction == "backward" and d.y_form == "same" else [])]
    with _LOCK:
        if any((key, dr) in TABLE for dr in directions):
            raise ValueError(f"{where}: it has a formula already ({TABLE.get((key, direction))})")
        _PURE[name] = f
        _ADDED[name] = key
        TABLE.update({(key, dr): name for dr in directions})
        if d.float_params:
            PARAMS[key] = d.float_params
    _changed(key)
    return f


def unregister(key: str) -> None:
    """Take out every formula `register` added for kernel key `key` (built-in formulas stay; none is no error)."""
    with _LOCK:
        names = {n for n, k in _ADDED.items() if k == key}
        if not names:
            return
        for k in [k for k, n in TABLE.items() if n in names]:
            del TABLE[k]
        for n in names:
            del _PURE[n], _ADDED[n]
        for ref in _BUILT:
            ns = ref()
            if ns is not None:
                ns._drop(names)
        if not any(k == key for k, _ in TABLE):
            PARAMS.pop(key, None)
    _changed(key)


def _changed(key: str) -> None:
    """Tell the subscribed caches, and the registry (its choices read each backend's supports())."""
    for fn in list(_LISTENERS):
        fn(key)
    registry.clear_cache()


def scalar_params(op: str, params: dict[str, Any], dtype: str) -> tuple[float, float]:
    """(a, b) as Python floats, rounded to float32 below float64 (what the tests compare against)."""
    vals = [float(params[n]) for n in PARAMS.get(op, ())]
    if dtype != "float64":
        vals = [float(np.float32(v)) for v in vals]
    vals += [0.0] * (2 - len(vals))
    return vals[0], vals[1]


__all__ = ["PARAMS", "TABLE", "WIDE", "Namespace", "bias_params", "build", "build_family", "constants",
           "family_formulas", "family_params", "family_y_formula", "formula_name", "in_source", "libm", "math_libm",
           "numpy_libm", "on_change", "python", "register", "scalar_params", "unregister"]
