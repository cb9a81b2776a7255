"""Numerically stable NumPy formulas for every op, generic in the float dtype.

Evaluated in float64 they are the reference every backend is tested against;
evaluated blockwise in float32 they are the `numpy` backend.  They follow
PyTorch's conventions at the kinks, and two of our own everywhere: NaN in gives
NaN out (forward and backward), and +-inf gives the limit, never inf*0.

Signed zeros are PyTorch's too (2.x, CPU): a forward that keeps or scales x keeps
its sign (relu, elu, tanh, gelu, silu... of -0 are -0; a negative slope flips it);
hardshrink and softshrink give +0 inside [-lambd, lambd] (torch's vector loop and
CUDA kernel; its scalar tail gives x * 0); tanhshrink's zeros are +0, as x - tanh(x)
is.  Where torch's float32 vector body gives gelu(-0) = +0 we follow its float64
and scalar paths (-0).  A backward passes dy where it passes dy, is +0 on pieces
where the derivative is identically 0 (relu at x <= 0), and is otherwise the
product dy * f'(x) (dy = -0 gives -0 where f' > 0), also for the ops torch only
has as composites (softsign, tanhshrink, swish, fast_gelu), whose autograd sums
partial products (-0 + 0 = +0: tanhshrink's backward would be +0 for every dy).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from ._opdefs import SELU_ALPHA, SELU_SCALE, tanhshrink_series  # the defaults of selu's parameters: one source

GELU_TANH_K = math.sqrt(2.0 / math.pi)
GELU_TANH_C = 0.044715
FAST_GELU_K = 1.702
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
# Beyond this |x| every sigmoid-weighted derivative term is exactly 0 in float64.
_CLAMP = 1e5

_erfc_scalar = np.frompyfunc(math.erfc, 1, 1)


def _c(x: np.ndarray, v: float):
    """The constant v in x's dtype, so float32 formulas stay float32."""
    return x.dtype.type(v)


def _keepnan(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """r with NaN wherever x is NaN (piecewise formulas would drop it)."""
    return np.where(np.isnan(x), x, r)


@cache
def _erfc_fit() -> np.polynomial.Chebyshev:
    """erfc(z) * exp(z^2) as a Chebyshev series in t = 2 / (2 + z) on z >= 0, fitted to libm.

    Smooth on t in (0, 1]; degree 40 reaches about 1e-15 relative, far below float32's eps.
    """
    t = np.cos(np.linspace(0, np.pi, 400)) * 0.5 + 0.5  # Chebyshev-spaced nodes in [0, 1]
    t = t[t > 1e-3]
    z = 2.0 / t - 2.0
    g = np.array([math.erfc(v) * math.exp(v * v) if v < 26 else _erfcx_asymptotic(v) for v in z])
    return np.polynomial.Chebyshev.fit(t, g, 40, domain=[0, 1])


def _erfcx_asymptotic(z: float) -> float:
    """erfc(z) exp(z^2) for large z, from its asymptotic series (libm underflows there)."""
    s, term = 1.0, 1.0
    for k in range(1, 12):
        term *= -(2 * k - 1) / (2 * z * z)
        s += term
    return s / (z * math.sqrt(math.pi))


def erfc(z: np.ndarray) -> np.ndarray:
    """Complementary error function, relatively accurate in the tails.

    float64 goes through libm elementwise (the reference); float32/float16
    through a vectorised fit evaluated in float64, then rounded once.
    """
    if z.dtype == np.float64:
        return np.asarray(_erfc_scalar(z), dtype=np.float64)  # (a 0-d input comes back as a float)
    zd = z.astype(np.float64)
    a = np.abs(zd)
    with np.errstate(all="ignore"):
        pos = np.exp(-a * a) * _erfc_fit()(2.0 / (2.0 + a))
        pos = np.where(np.isinf(a), 0.0, pos)
        return np.where(zd < 0, 2.0 - pos, pos).astype(z.dtype)


def sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    one = _c(x, 1)
    return np.where(x >= 0, one / (one + e), e / (one + e))


def softplus0(z: np.ndarray) -> np.ndarray:
    """log(1 + exp(z)) without overflow."""
    return np.maximum(z, _c(z, 0)) + np.log1p(np.exp(-np.abs(z)))


def sech2(x: np.ndarray) -> np.ndarray:
    """1 - tanh(x)^2, with full relative accuracy where tanh(x) is near 1."""
    c = np.cosh(x)
    return _c(x, 1) / (c * c)


# ---- piecewise-linear family -------------------------------------------------


@np.errstate(all="ignore")
def relu(x):
    # not np.maximum, which gives +0 for -0: PyTorch keeps x where x is not below 0
    return np.where(x < 0, _c(x, 0), x)


@np.errstate(all="ignore")
def relu_grad(dy, x):
    return _keepnan(x, np.where(x > 0, dy, _c(dy, 0)))


@np.errstate(all="ignore")
def relu6(x):
    return np.clip(x, _c(x, 0), _c(x, 6))


@np.errstate(all="ignore")
def relu6_grad(dy, x):
    return _keepnan(x, np.where((x > 0) & (x < 6), dy, _c(dy, 0)))


@np.errstate(all="ignore")
def leaky_relu(x, negative_slope):
    return np.where(x > 0, x, x * _c(x, negative_slope))


@np.errstate(all="ignore")
def leaky_relu_grad(dy, x, negative_slope):
    return _keepnan(x, np.where(x > 0, dy, dy * _c(dy, negative_slope)))


@np.errstate(all="ignore")
def prelu(x, weight, axis):
    return np.where(x > 0, x, x * weight)


@np.errstate(all="ignore")
def prelu_grad(dy, x, weight, axis):
    return _keepnan(x, np.where(x > 0, dy, dy * weight))


@np.errstate(all="ignore")
def prelu_weight_grad(dy, x, weight, axis):
    """Sum of dy * x over the negative part, reduced to weight's shape, in float64."""
    contrib = np.where(x > 0, 0.0, x.astype(np.float64) * dy.astype(np.float64))
    if weight.size == 1:
        return np.full(weight.shape, contrib.sum())
    others = tuple(i for i in range(x.ndim) if i != axis)
    return contrib.sum(axis=others).reshape(weight.shape)


@np.errstate(all="ignore")
def hardtanh(x, min_val, max_val):
    return np.clip(x, _c(x, min_val), _c(x, max_val))


@np.errstate(all="ignore")
def hardtanh_grad(dy, x, min_val, max_val):
    return _keepnan(x, np.where((x > min_val) & (x < max_val), dy, _c(dy, 0)))


@np.errstate(all="ignore")
def hardswish(x):
    six, three = _c(x, 6), _c(x, 3)
    return np.where(x <= -three, _c(x, 0), np.where(x >= three, x, x * (x + three) / six))


@np.errstate(all="ignore")
def hardswish_grad(dy, x):
    three, half = _c(x, 3), _c(x, 0.5)
    mid = dy * (x / three + half)
    # PyTorch (2.x): 0 at x = -3 and dy at x = +3, the slopes of the outer pieces
    return _keepnan(x, np.where(x <= -three, _c(dy, 0), np.where(x < three, mid, dy)))


def _hardsigmoid_pieces(alpha: float, beta: float) -> tuple[float, float, float, float]:
    """(c, d, lo, hi): alpha * x + beta as (x + c) / d, 0 for x <= lo and 1 for x >= hi.  At PyTorch's
    alpha = 1/6, beta = 1/2 that is relu6(x + 3) / 6 itself (c = 3, d = 6, in float32 too)."""
    return beta / alpha, 1.0 / alpha, -beta / alpha, (1.0 - beta) / alpha


@np.errstate(all="ignore")
def hardsigmoid(x, alpha=1.0 / 6.0, beta=0.5):
    c, d, lo, hi = (_c(x, v) for v in _hardsigmoid_pieces(alpha, beta))
    return np.where(x <= lo, _c(x, 0), np.where(x >= hi, _c(x, 1), (x + c) / d))


@np.errstate(all="ignore")
def hardsigmoid_grad(dy, x, alpha=1.0 / 6.0, beta=0.5):
    _, d, lo, hi = _hardsigmoid_pieces(alpha, beta)
    return _keepnan(x, np.where((x > _c(x, lo)) & (x < _c(x, hi)), dy / _c(dy, d), _c(dy, 0)))


@np.errstate(all="ignore")
def softshrink(x, lambd):
    lam = _c(x, lambd)
    return _keepnan(x, np.where(x > lam, x - lam, np.where(x < -lam, x + lam, _c(x, 0))))


@np.errstate(all="ignore")
def shrink_grad(dy, x, lambd):
    return _keepnan(x, np.where(np.abs(x) > _c(x, lambd), dy, _c(dy, 0)))


@np.errstate(all="ignore")
def hardshrink(x, lambd):
    return _keepnan(x, np.where(np.abs(x) > _c(x, lambd), x, _c(x, 0)))


@np.errstate(all="ignore")
def threshold(x, threshold, value):
    return np.where(x <= _c(x, threshold), _c(x, value), x)


@np.errstate(all="ignore")
def threshold_grad(dy, x, threshold, value):
    return _keepnan(x, np.where(x <= _c(x, threshold), _c(dy, 0), dy))


# ---- exponential family --------------------------------------------------------


@np.errstate(all="ignore")
def elu(x, alpha):
    return np.where(x > 0, x, _c(x, alpha) * np.expm1(x))


@np.errstate(all="ignore")
def elu_grad(dy, x, alpha):
    return np.where(x > 0, dy, dy * (_c(x, alpha) * np.exp(x)))


@np.errstate(all="ignore")
def elu_grad_y(dy, y, alpha):
    return np.where(y > 0, dy, dy * (y + _c(y, alpha)))


# selu: where x < 0 (or y < 0) is too small to change e^x - 1 (= x), e^x (= 1) or y + hi (= hi) in the dtype, the
# value one ulp toward the true side (_below), so that a product held exactly on a bfloat16 tie (6 x, 6 dy at
# alpha = 2, scale = 3; float64's own e^x - 1 is x below 2^-52) rounds the way the exact value does (as
# multiact/backend/formulas.py and native/src/ma_ops.h).
def _below(v: np.ndarray) -> np.ndarray:
    """v times the float below 1 in v's dtype: the next float toward 0 where v is normal."""
    return v * np.nextafter(v.dtype.type(1), v.dtype.type(0))


@np.errstate(all="ignore")
def selu(x, alpha=SELU_ALPHA, scale=SELU_SCALE):
    e = np.expm1(x)
    e = np.where((e == x) & (x < 0), _below(x), e)  # expm1(x) in (x, 0)
    return np.where(x > 0, _c(x, scale) * x, _c(x, scale * alpha) * e)


@np.errstate(all="ignore")
def selu_grad(dy, x, alpha=SELU_ALPHA, scale=SELU_SCALE):
    e = np.exp(x)
    e = np.where((e == 1) & (x < 0), _below(np.ones_like(e)), e)  # e^x in (0, 1)
    return np.where(x > 0, dy * _c(dy, scale), dy * (_c(x, scale * alpha) * e))


@np.errstate(all="ignore")
def selu_grad_y(dy, y, alpha=SELU_ALPHA, scale=SELU_SCALE):
    # scale * alpha as hi + lo in y's dtype (lo = 0 in float64): y + hi cancels where y saturates at
    # -scale * alpha, exactly, so that hi's rounding would be the whole error of the small sum
    hi = _c(y, scale) * _c(y, alpha)  # the kernels' float32 product (lo: its rounding error; 0 in float64)
    lo = _c(y, float(_c(y, scale)) * float(_c(y, alpha)) - float(hi))
    t = y + hi
    if hi > 0:
        t = np.where((t == hi) & (y < 0), _below(np.asarray(hi)), t)  # y + hi below hi
    return np.where(y > 0, dy * _c(dy, scale), dy * (t + lo))


@np.errstate(all="ignore")
def celu(x, alpha):
    a = _c(x, alpha)
    return np.where(x > 0, x, a * np.expm1(x / a))


@np.errstate(all="ignore")
def celu_grad(dy, x, alpha):
    return np.where(x > 0, dy, dy * np.exp(x / _c(x, alpha)))


@np.errstate(all="ignore")
def celu_grad_y(dy, y, alpha):
    return np.where(y > 0, dy, dy * (y / _c(y, alpha) + _c(y, 1)))


@np.errstate(all="ignore")
def sigmoid_fwd(x):
    return sigmoid(x)


@np.errstate(all="ignore")
def sigmoid_grad(dy, x):
    return dy * (sigmoid(x) * sigmoid(-x))


@np.errstate(all="ignore")
def sigmoid_grad_y(dy, y):
    return dy * (y * (_c(y, 1) - y))


@np.errstate(all="ignore")
def logsigmoid(x):
    return np.minimum(x, _c(x, 0)) - np.log1p(np.exp(-np.abs(x)))


@np.errstate(all="ignore")
def logsigmoid_grad(dy, x):
    return dy * sigmoid(-x)


@np.errstate(all="ignore")
def tanh(x):
    return np.tanh(x)


@np.errstate(all="ignore")
def tanh_grad(dy, x):
    return dy * sech2(x)


@np.errstate(all="ignore")
def tanh_grad_y(dy, y):
    one = _c(y, 1)
    return dy * ((one - y) * (one + y))


@np.errstate(all="ignore")
def softplus(x, beta, threshold):
    b = _c(x, beta)
    z = x * b
    return np.where(z > threshold, x, softplus0(z) / b)


@np.errstate(all="ignore")
def softplus_grad(dy, x, beta, threshold):
    z = x * _c(x, beta)
    return _keepnan(x, np.where(z > threshold, dy, dy * sigmoid(z)))


@np.errstate(all="ignore")
def softsign(x):
    one = _c(x, 1)
    return np.where(np.isinf(x), np.sign(x), x / (one + np.abs(x)))


@np.errstate(all="ignore")
def softsign_grad(dy, x):
    # divided twice: (1 + |x|)^2 overflows float32 for |x| >= 1.8e19, where the derivative is still normal
    d = _c(x, 1) + np.abs(x)
    return (dy / d) / d


# ---- x * gate(x) family --------------------------------------------------------


def _gated(x, s):
    """x * s with the x = -inf, s = 0 corner giving 0 instead of NaN."""
    return np.where(s == 0, _c(x, 0), x * s)


def _swish_like(x, k):
    """(s, s', xc) for x * sigmoid(k x): s = sigmoid(kx), s' = sigmoid(-kx), x clamped."""
    big = np.finfo(x.dtype).max
    xc = np.clip(x, -big, big)
    kx = xc * _c(x, k)
    return sigmoid(kx), sigmoid(-kx), xc


@np.errstate(all="ignore")
def swish(x, beta):
    s, _, _ = _swish_like(x, beta)
    return _gated(x, s)


@np.errstate(all="ignore")
def swish_grad(dy, x, beta):
    s, sn, xc = _swish_like(x, beta)
    return dy * (s + ((xc * s) * sn) * _c(x, beta))


@np.errstate(all="ignore")
def swish_beta_grad(dy, x, beta):
    """d/d(beta) summed over all elements: sum(dy * x^2 * s * (1 - s)), in float64."""
    s, sn, xc = _swish_like(x.astype(np.float64), beta)
    return float(np.sum(dy.astype(np.float64) * ((xc * s) * (xc * sn))))


def silu(x):
    return swish(x, 1.0)


def silu_grad(dy, x):
    return swish_grad(dy, x, 1.0)


def fast_gelu(x):
    return swish(x, FAST_GELU_K)


def fast_gelu_grad(dy, x):
    return swish_grad(dy, x, FAST_GELU_K)


@np.errstate(all="ignore")
def _gelu_tanh_parts(x):
    xc = np.clip(x, _c(x, -_CLAMP), _c(x, _CLAMP))
    z = _c(x, 2 * GELU_TANH_K) * (xc + _c(x, GELU_TANH_C) * (xc * xc * xc))
    return sigmoid(z), sigmoid(-z), xc


@np.errstate(all="ignore")
def gelu(x, approximate):
    if approximate == "tanh":
        s, _, _ = _gelu_tanh_parts(x)
        return _gated(x, s)
    s = _c(x, 0.5) * erfc(-x * _c(x, _INV_SQRT2))
    return _gated(x, s)


@np.errstate(all="ignore")
def gelu_grad(dy, x, approximate):
    if approximate == "tanh":
        s, sn, xc = _gelu_tanh_parts(x)
        dz = _c(x, 2 * GELU_TANH_K) * (_c(x, 1) + _c(x, 3 * GELU_TANH_C) * (xc * xc))
        return dy * (s + ((xc * s) * sn) * dz)
    xc = np.clip(x, _c(x, -_CLAMP), _c(x, _CLAMP))
    cdf = _c(x, 0.5) * erfc(-x * _c(x, _INV_SQRT2))
    pdf = _c(x, _INV_SQRT_2PI) * np.exp(_c(x, -0.5) * (xc * xc))
    return dy * (cdf + xc * pdf)


@np.errstate(all="ignore")
def mish(x):
    return _gated(x, np.tanh(softplus0(x)))


@np.errstate(all="ignore")
def mish_grad(dy, x):
    sp = softplus0(x)
    big = np.finfo(x.dtype).max
    xc = np.clip(x, -big, big)
    return dy * (np.tanh(sp) + (xc * sigmoid(x)) * sech2(sp))


# ---- tanhshrink: x - tanh(x) cancels near 0, so a series there -------------------


_tanhshrink_series = tanhshrink_series  # (the definitions' series: native's float64 kernel reads it too)


@np.errstate(all="ignore")
def tanhshrink(x):
    # |x| < 1: the series converges like (2x/pi)^2 per term; 44 terms reach 1e-17.
    nterms = 44 if x.dtype == np.float64 else 22
    x2 = x * x
    acc = np.zeros_like(x)
    for c in reversed(_tanhshrink_series(nterms)):
        acc = acc * x2 + _c(x, c)
    series = acc * x2 * x
    # + 0: a zero result is +0, as x - tanh(x) gives in IEEE arithmetic (and PyTorch) for x = -0
    return np.where(np.abs(x) < 1, series, x - np.tanh(x)) + _c(x, 0)


@np.errstate(all="ignore")
def tanhshrink_grad(dy, x):
    t = np.tanh(x)
    return dy * (t * t)


# ---- second order: g * dy * f''(x), the backward of the backward with respect to x ------------------
#
# The first backward is dx = dy * f'(x).  Its own backward, for an upstream gradient g of dx, is
# d(dy) = g * f'(x) (the first backward applied to g) and d(x) = g * dy * f''(x): these functions.
# The product is (g * dy) * f''(x), as a plain product (g = inf where f'' = 0 is NaN, as dy = inf is
# for the first backward); NaN in x gives NaN; +-inf gives the limit of f'' (0 for every op here,
# never inf * 0); on a piece where f'' is identically 0 (the linear pieces, softplus's linear
# branch) the result is +0 whatever g and dy are, as the first backward is +0 where f' is; at a kink
# of f' (relu's 0, hardswish's +-3, elu's 0) f'' is taken as 0, as PyTorch's double backward of
# relu, elu and hardswish does.


def _grad2(g, dy, d2):
    """(g * dy) * f''."""
    return (g * dy) * d2


def _zero_grad2(g, dy, x):
    """f'' = 0 almost everywhere (piecewise linear): +0, NaN where x is NaN."""
    return _keepnan(x, np.zeros(np.broadcast_shapes(g.shape, dy.shape, x.shape), dtype=np.result_type(g, dy, x)))


@np.errstate(all="ignore")
def zero_grad2(g, dy, x, *params, **named):
    """The second derivative of every piecewise-linear op (`OpDef.piecewise_linear`; prelu's for every weight),
    whatever its parameters: +0, NaN where x is NaN."""
    return _zero_grad2(g, dy, x)


@np.errstate(all="ignore")
def hardswish_grad2(g, dy, x):
    # 1/3 on the open middle piece (-3, 3); 0 outside and at the kinks (PyTorch's double backward)
    three = _c(x, 3)
    mid = _grad2(g, dy, _c(x, 1.0 / 3.0))
    return _keepnan(x, np.where((x > -three) & (x < three), mid, _c(mid, 0)))


@np.errstate(all="ignore")
def elu_grad2(g, dy, x, alpha):
    # alpha * exp(x) below 0, 0 from 0 up (the kink's value: PyTorch's (x < 0) mask)
    d2 = _grad2(g, dy, _c(x, alpha) * np.exp(x))
    return _keepnan(x, np.where(x < 0, d2, _c(d2, 0)))


@np.errstate(all="ignore")
def selu_grad2(g, dy, x, alpha=SELU_ALPHA, scale=SELU_SCALE):
    d2 = _grad2(g, dy, _c(x, scale * alpha) * np.exp(x))
    return _keepnan(x, np.where(x < 0, d2, _c(d2, 0)))


@np.errstate(all="ignore")
def celu_grad2(g, dy, x, alpha):
    a = _c(x, alpha)
    d2 = _grad2(g, dy, np.exp(x / a) / a)
    return _keepnan(x, np.where(x < 0, d2, _c(d2, 0)))


@np.errstate(all="ignore")
def sigmoid_grad2(g, dy, x):
    # s (1 - s) (1 - 2 s), with 1 - s = sigmoid(-x) and 1 - 2 s = sigmoid(-x) - sigmoid(x)
    s, sn = sigmoid(x), sigmoid(-x)
    return _grad2(g, dy, (s * sn) * (sn - s))


@np.errstate(all="ignore")
def logsigmoid_grad2(g, dy, x):
    return _grad2(g, dy, -(sigmoid(x) * sigmoid(-x)))


@np.errstate(all="ignore")
def tanh_grad2(g, dy, x):
    return _grad2(g, dy, _c(x, -2) * (np.tanh(x) * sech2(x)))


@np.errstate(all="ignore")
def tanhshrink_grad2(g, dy, x):
    return _grad2(g, dy, _c(x, 2) * (np.tanh(x) * sech2(x)))


@np.errstate(all="ignore")
def softplus_grad2(g, dy, x, beta, threshold):
    # beta * s(z) * (1 - s(z)) on the smooth branch, +0 where beta * x > threshold (the linear branch)
    # and at the kink beta * x = threshold itself (PyTorch's double backward: its (z < threshold) mask)
    b = _c(x, beta)
    z = x * b
    d2 = _grad2(g, dy, b * (sigmoid(z) * sigmoid(-z)))
    return _keepnan(x, np.where(z < threshold, d2, _c(d2, 0)))


@np.errstate(all="ignore")
def softsign_grad2(g, dy, x):
    # -2 sign(x) / (1 + |x|)^3, divided thrice so the cube never overflows; 0 at the kink x = 0
    d = _c(x, 1) + np.abs(x)
    return _grad2(g, dy, ((_c(x, -2) * np.sign(x)) / d) / d / d)


@np.errstate(all="ignore")
def _swish_d2(x, k):
    """d^2/dx^2 of x * sigmoid(k x): k s s' (2 + k x (s' - s)), with s' = sigmoid(-kx); tails exact 0."""
    s, sn, xc = _swish_like(x, k)
    q = s * sn
    kk = _c(x, k)
    return kk * (_c(x, 2) * q + ((xc * q) * (sn - s)) * kk)


@np.errstate(all="ignore")
def swish_grad2(g, dy, x, beta):
    return _grad2(g, dy, _swish_d2(x, beta))


def silu_grad2(g, dy, x):
    return swish_grad2(g, dy, x, 1.0)


def fast_gelu_grad2(g, dy, x):
    return swish_grad2(g, dy, x, FAST_GELU_K)


@np.errstate(all="ignore")
def gelu_grad2(g, dy, x, approximate):
    if approximate == "tanh":
        # x * s(z), z = 2k (x + c x^3): f'' = s s' (2 z' + x z'^2 (s' - s) + x z''), s' = sigmoid(-z)
        s, sn, xc = _gelu_tanh_parts(x)
        k2 = _c(x, 2 * GELU_TANH_K)
        dz = k2 * (_c(x, 1) + _c(x, 3 * GELU_TANH_C) * (xc * xc))
        ddz = k2 * (_c(x, 6 * GELU_TANH_C) * xc)
        q = s * sn
        d2 = q * (_c(x, 2) * dz + xc * ddz) + ((xc * q) * (dz * dz)) * (sn - s)
        return _grad2(g, dy, d2)
    # x * Phi(x): f'' = phi(x) (2 - x^2)
    xc = np.clip(x, _c(x, -_CLAMP), _c(x, _CLAMP))
    pdf = _c(x, _INV_SQRT_2PI) * np.exp(_c(x, -0.5) * (xc * xc))
    return _grad2(g, dy, _c(x, 2) * pdf - (xc * xc) * pdf)


@np.errstate(all="ignore")
def mish_grad2(g, dy, x):
    # x tanh(sp(x)), sp = softplus: f'' = s h (2 + x (s' - 2 t s)), s = sigmoid(x), s' = sigmoid(-x),
    # t = tanh(sp), h = sech^2(sp); x * s * h first, so that its tails are 0 before meeting x's growth
    sp = softplus0(x)
    t, h = np.tanh(sp), sech2(sp)
    s, sn = sigmoid(x), sigmoid(-x)
    big = np.finfo(x.dtype).max
    xc = np.clip(x, -big, big)
    sh = s * h
    return _grad2(g, dy, _c(x, 2) * sh + ((xc * sh) * (sn - _c(x, 2) * (t * s))))


# ---- second order in a learnable parameter (swish's beta, prelu's weight), elementwise ------------------
#
# For f(x; p): the mixed partial g * dy * d2f/dx dp (summed, the gradient of <g, dy * f'> with respect to
# p; with g the parameter gradient's upstream, the gradient of <g, sum(dy * df/dp)> with respect to x),
# and g * dy * d2f/dp2 (summed, the parameter gradient's own gradient with respect to p).


@np.errstate(all="ignore")
def swish_grad2_beta(g, dy, x, beta):
    """g * dy * x s s' (2 + beta x (s' - s)): d2/dx dbeta of x sigmoid(beta x).  Products with x are 0
    where the other factor is (the tails, never inf * 0); beta = 0 gives x / 2, which grows to +-inf."""
    s, sn, _ = _swish_like(x, beta)
    d = sn - s
    xq = _gated(x, s * sn)
    second = np.where(d == 0, _c(x, 0), (_gated(x, xq) * d) * _c(x, beta))
    return _grad2(g, dy, _c(x, 2) * xq + second)


@np.errstate(all="ignore")
def swish_grad2_beta_beta(g, dy, x, beta):
    """g * dy * x^3 s s' (s' - s): d2/dbeta2 of x sigmoid(beta x) (0 where s' = s: x = 0 or beta = 0)."""
    s, sn, _ = _swish_like(x, beta)
    d = sn - s
    x3q = _gated(x, _gated(x, _gated(x, s * sn)))
    return _grad2(g, dy, np.where(d == 0, _c(x, 0), x3q * d))


@np.errstate(all="ignore")
def prelu_grad2_weight(g, dy, x, weight, axis):
    """g * dy where x <= 0 (d2/dx dw of prelu is 1 there), +0 where x > 0."""
    p = _grad2(g, dy, _c(x, 1))
    return _keepnan(x, np.where(x > 0, _c(p, 0), p))


@np.errstate(all="ignore")
def prelu_grad2_weight_weight(g, dy, x, weight, axis):
    """0: prelu is linear in its weight."""
    return _zero_grad2(g, dy, x)
