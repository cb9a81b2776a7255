"""Scalar formulas of every op, written once as plain Python and compiled per target and precision.

Each formula is a module-level function `f(x, a, b)` (forward), `f(dy, x, a, b)`
(backward; `y` in place of `x` for a backward from the output) or, for prelu,
`f(x, w, a, b)` / `f(dy, x, w, a, b)`.  `a` and `b` are the op's scalar
parameters as float64 (see `PARAMS`); `x`, `dy`, `w` arrive already in the
compute type.  The bodies use only names this module does not bind itself:
`T` (the compute type: float32 for float16/float32 data, float64 for float64),
typed constants (`ZERO`, `ONE`, ...), the libm functions `exp`, `expm1`,
`log1p`, `tanh`, `erfc` and the helpers registered before them.  `build(jit,
T)` clones every function with a globals dict that binds those names, so the
same text compiles with `cuda.jit(device=True)` for a GPU (libdevice's expf,
tanhf... for float32) and runs as plain Python (NumPy scalars, every step
rounded to T) in the CUDA simulator and in tests.

Every constant is typed T, never a bare Python float: in numba a float literal
is float64 and would silently promote a float32 formula to double.  Libm results
are wrapped in T() because plain Python's math returns a double.  The
conventions are those of `multiact.reference`: NaN in gives NaN out, +-inf gives
the limit, PyTorch's choices at the kinks.  Error budget (float32, libdevice's
documented bounds: expf/tanhf 2 ulp, expm1f/log1pf 1 ulp, erfcf 4 ulp): every
formula stays within the op's tolerance in multiact.ops; the comments say where
a formulation was chosen for accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import FunctionType, SimpleNamespace
from typing import Any

import numpy as np

import multiact.reference as _ref

# Evaluated with the float64 formula for float32/float16 data and rounded once: the float32 versions
# sit within 1-2 ulp of the bound when libdevice's tanhf/expf errors (2 ulp each) add up (squares of
# tanh, tanh of softplus).  One double tanh/exp per element: free on data-centre GPUs, slower elsewhere.
WIDE: frozenset[tuple[str, str]] = frozenset({
    ("sigmoid", "backward"), ("tanh", "backward"), ("tanhshrink", "backward"),
    ("mish", "forward"), ("mish", "backward"),
})

# (op -> the names of its scalar parameters, in the order a, b)
PARAMS: dict[str, tuple[str, ...]] = {
    "leaky_relu": ("negative_slope",),
    "elu": ("alpha",),
    "celu": ("alpha",),
    "hardtanh": ("min_val", "max_val"),
    "softplus": ("beta", "threshold"),
    "softshrink": ("lambd",),
    "hardshrink": ("lambd",),
    "threshold": ("threshold", "value"),
    "swish": ("beta",),
}

_PURE: dict[str, FunctionType] = {}
# (op, direction) -> formula name; op "gelu_tanh" is gelu with approximate="tanh".
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


# Placeholders so linters and plain imports see the names; build() rebinds them.
T: Any = np.float32
ZERO = ONE = TWO = THREE = SIX = HALF = INF = BIG = ZCLAMP = GCLAMP = Any
SELU_SCALE = SELU_SA = FAST_K = GELU_K2 = GELU_C = GELU_C3 = INV_SQRT2 = INV_SQRT_2PI = Any
SERIES: Any = ()
exp = expm1 = log1p = tanh = erf = erfc = Any


# ---- helpers --------------------------------------------------------------------------------------


@_helper
def keepnan(x, r):
    """r, or x where x is NaN (piecewise formulas would drop it)."""
    return x if x != x else r


@_helper
def sigmoid_e(z):
    """(sigmoid(z), sigmoid(-z)) from one e = exp(-|z|); NaN gives NaN."""
    e = T(exp(-abs(z)))
    d = ONE + e
    big = ONE / d
    small = e / d
    if z >= ZERO:
        return big, small
    return small, big


@_helper
def gated(x, s):
    """x * s with the x = -inf, s = 0 corner giving 0 instead of NaN."""
    return ZERO if s == ZERO else x * s


@_helper
def clampbig(x):
    """x clamped to the finite range (so inf * 0 never happens); NaN passes."""
    x = BIG if x > BIG else x
    return -BIG if x < -BIG else x


@_helper
def sech2(x):
    """1 - tanh(x)^2 = 4e / (1 + e)^2, e = exp(-2|x|): relatively accurate where tanh(x) ~ 1."""
    ax = abs(x)
    e = T(exp(-(ax + ax)))
    d = ONE + e
    return (e + e + e + e) / (d * d)


@_helper
def softplus0(z):
    """log(1 + exp(z)) without overflow."""
    m = z if z > ZERO else ZERO
    return m + T(log1p(T(exp(-abs(z)))))


@_helper
def swish_fwd(x, k):
    s, sn = sigmoid_e(clampbig(x) * k)
    return gated(x, s)


@_helper
def swish_bwd(dy, x, k):
    xc = clampbig(x)
    s, sn = sigmoid_e(xc * k)
    return dy * (s + ((xc * s) * sn) * k)


@_helper
def gelu_tanh_z(x):
    """(x clamped to +-1e5, 2 sqrt(2/pi) (x + 0.044715 x^3))."""
    xc = GCLAMP if x > GCLAMP else x
    xc = -GCLAMP if xc < -GCLAMP else xc
    return xc, GELU_K2 * (xc + GELU_C * (xc * xc * xc))


# ---- piecewise linear -------------------------------------------------------------------------------


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
    return keepnan(x, dy if (x > ZERO and x < SIX) else ZERO)


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
    return keepnan(x, dy if (x > T(a) and x < T(b)) else ZERO)


@_formula(("hardswish", "forward"))
def hardswish(x, a, b):
    # x + 3 is exact on [-3, -1.5] (Sterbenz), so the three roundings stay within 1.5 ulp.
    return ZERO if x <= -THREE else (x if x >= THREE else x * (x + THREE) / SIX)


@_formula(("hardswish", "backward"))
def hardswish_grad(dy, x, a, b):
    return keepnan(x, ZERO if x <= -THREE else (dy * (x / THREE + HALF) if x < THREE else dy))


@_formula(("hardsigmoid", "forward"))
def hardsigmoid(x, a, b):
    return ZERO if x <= -THREE else (ONE if x >= THREE else (x + THREE) / SIX)


@_formula(("hardsigmoid", "backward"))
def hardsigmoid_grad(dy, x, a, b):
    return keepnan(x, dy / SIX if (x > -THREE and x < THREE) else ZERO)


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


# ---- exponential family --------------------------------------------------------------------------------


@_formula(("elu", "forward"))
def elu(x, a, b):
    return x if x > ZERO else T(a) * T(expm1(x))


@_formula(("elu", "backward"))
def elu_grad(dy, x, a, b):
    return dy if x > ZERO else dy * (T(a) * T(exp(x)))


@_formula(("elu", "backward_y"))
def elu_grad_y(dy, y, a, b):
    return dy if y > ZERO else dy * (y + T(a))


@_formula(("selu", "forward"))
def selu(x, a, b):
    return SELU_SCALE * x if x > ZERO else SELU_SA * T(expm1(x))


@_formula(("selu", "backward"))
def selu_grad(dy, x, a, b):
    return dy * SELU_SCALE if x > ZERO else dy * (SELU_SA * T(exp(x)))


@_formula(("selu", "backward_y"))
def selu_grad_y(dy, y, a, b):
    return dy * SELU_SCALE if y > ZERO else dy * (y + SELU_SA)


@_formula(("celu", "forward"))
def celu(x, a, b):
    return x if x > ZERO else T(a) * T(expm1(x / T(a)))


@_formula(("celu", "backward"))
def celu_grad(dy, x, a, b):
    return dy if x > ZERO else dy * T(exp(x / T(a)))


@_formula(("celu", "backward_y"))
def celu_grad_y(dy, y, a, b):
    return dy if y > ZERO else dy * (y / T(a) + ONE)


@_formula(("sigmoid", "forward"))
def sigmoid_f(x, a, b):
    s, sn = sigmoid_e(x)
    return s


@_formula(("sigmoid", "backward"))
def sigmoid_grad(dy, x, a, b):
    # e / (1 + e)^2 from one exp: about 4 ulp, where s * (1 - s) would cancel for x >> 0.
    e = T(exp(-abs(x)))
    d = ONE + e
    return dy * (e / (d * d))


@_formula(("sigmoid", "backward_y"))
def sigmoid_grad_y(dy, y, a, b):
    return dy * (y * (ONE - y))


@_formula(("logsigmoid", "forward"))
def logsigmoid(x, a, b):
    m = x if x < ZERO else ZERO
    return keepnan(x, m - T(log1p(T(exp(-abs(x))))))


@_formula(("logsigmoid", "backward"))
def logsigmoid_grad(dy, x, a, b):
    s, sn = sigmoid_e(x)
    return dy * sn


@_formula(("tanh", "forward"))
def tanh_f(x, a, b):
    return T(tanh(x))


@_formula(("tanh", "backward"))
def tanh_grad(dy, x, a, b):
    return dy * sech2(x)


@_formula(("tanh", "backward_y"))
def tanh_grad_y(dy, y, a, b):
    return dy * ((ONE - y) * (ONE + y))


@_formula(("softplus", "forward"))
def softplus(x, a, b):
    # The linear branch is decided on the exact product (as the reference does); one double multiply.
    if np.float64(x) * a > b:
        return x
    return softplus0(x * T(a)) / T(a)


@_formula(("softplus", "backward"))
def softplus_grad(dy, x, a, b):
    if np.float64(x) * a > b:
        return dy
    s, sn = sigmoid_e(x * T(a))
    return keepnan(x, dy * s)


@_formula(("softsign", "forward"))
def softsign(x, a, b):
    if x == INF:
        return ONE
    if x == -INF:
        return -ONE
    return x / (ONE + abs(x))


@_formula(("softsign", "backward"))
def softsign_grad(dy, x, a, b):
    d = ONE + abs(x)
    return (dy / d) / d  # never overflows: d * d would for |x| > 1.8e19


# ---- x * gate(x) -----------------------------------------------------------------------------------------


@_formula(("silu", "forward"))
def silu(x, a, b):
    return swish_fwd(x, ONE)


@_formula(("silu", "backward"))
def silu_grad(dy, x, a, b):
    return swish_bwd(dy, x, ONE)


@_formula(("swish", "forward"))
def swish(x, a, b):
    return swish_fwd(x, T(a))


@_formula(("swish", "backward"))
def swish_grad(dy, x, a, b):
    return swish_bwd(dy, x, T(a))


@_formula(("fast_gelu", "forward"))
def fast_gelu(x, a, b):
    return swish_fwd(x, FAST_K)


@_formula(("fast_gelu", "backward"))
def fast_gelu_grad(dy, x, a, b):
    return swish_bwd(dy, x, FAST_K)


@_helper
def ncdf(x):
    """Phi(x) = erfc(-x / sqrt(2)) / 2; through erf near 0, where erfcf's 4-ulp error would show."""
    z = x * INV_SQRT2
    if abs(z) < HALF:
        return HALF + HALF * T(erf(z))
    r = HALF * T(erfc(-z))
    return ONE if r > ONE else r  # erfcf may round above 2 near -inf


@_formula(("gelu", "forward"))
def gelu(x, a, b):
    return gated(x, ncdf(x))


@_formula(("gelu", "backward"))
def gelu_grad(dy, x, a, b):
    xc = GCLAMP if x > GCLAMP else x
    xc = -GCLAMP if xc < -GCLAMP else xc
    cdf = ncdf(x)
    pdf = INV_SQRT_2PI * T(exp(-HALF * (xc * xc)))
    return dy * (cdf + xc * pdf)


@_formula(("gelu_tanh", "forward"))
def gelu_tanh(x, a, b):
    xc, z = gelu_tanh_z(x)
    s, sn = sigmoid_e(z)
    return gated(x, s)


@_formula(("gelu_tanh", "backward"))
def gelu_tanh_grad(dy, x, a, b):
    xc, z = gelu_tanh_z(x)
    s, sn = sigmoid_e(z)
    dz = GELU_K2 * (ONE + GELU_C3 * (xc * xc))
    return dy * (s + ((xc * s) * sn) * dz)


@_formula(("mish", "forward"))
def mish(x, a, b):
    return gated(x, T(tanh(softplus0(x))))


@_formula(("mish", "backward"))
def mish_grad(dy, x, a, b):
    sp = softplus0(x)
    s, sn = sigmoid_e(x)
    return dy * (T(tanh(sp)) + (clampbig(x) * s) * sech2(sp))


@_formula(("tanhshrink", "forward"))
def tanhshrink(x, a, b):
    ax = abs(x)
    if ax < ONE:  # series: x - tanh(x) cancels near 0
        x2 = x * x
        acc = ZERO
        for c in SERIES:
            acc = acc * x2 + c
        return acc * x2 * x
    # |x| - tanh|x| = (|x| - 1) + 2e / (1 + e), e = exp(-2|x|): no cancellation against tanh's error
    e = T(exp(-(ax + ax)))
    r = (ax - ONE) + (e + e) / (ONE + e)
    return r if x >= ZERO else -r


@_formula(("tanhshrink", "backward"))
def tanhshrink_grad(dy, x, a, b):
    t = T(tanh(x))
    return dy * (t * t)


# ---- compiling ------------------------------------------------------------------------------------------


def constants(t: Any) -> dict[str, Any]:
    """The typed constants the formulas use, in compute type t (np.float32 or np.float64)."""
    is32 = np.dtype(t) == np.float32
    return {
        "T": t,
        "ZERO": t(0.0), "ONE": t(1.0), "TWO": t(2.0), "THREE": t(3.0), "SIX": t(6.0), "HALF": t(0.5),
        "INF": t(np.inf), "BIG": t(np.finfo(t).max), "GCLAMP": t(1e5),
        "SELU_SCALE": t(_ref.SELU_SCALE), "SELU_SA": t(_ref.SELU_SCALE * _ref.SELU_ALPHA),
        "FAST_K": t(_ref.FAST_GELU_K), "GELU_K2": t(2 * _ref.GELU_TANH_K), "GELU_C": t(_ref.GELU_TANH_C),
        "GELU_C3": t(3 * _ref.GELU_TANH_C),
        "INV_SQRT2": t(1.0 / math.sqrt(2.0)), "INV_SQRT_2PI": t(1.0 / math.sqrt(2.0 * math.pi)),
        "SERIES": tuple(t(c) for c in reversed(_ref._tanhshrink_series(22 if is32 else 44))),
    }


def build(jit: Callable[[FunctionType], Any], t: Any, libm: dict[str, Any] | None = None) -> SimpleNamespace:
    """Every helper and formula compiled with `jit` for compute type t; libm defaults to `math`."""
    g: dict[str, Any] = dict(globals())
    g.update(constants(t))
    g.update(libm or {"exp": math.exp, "expm1": math.expm1, "log1p": math.log1p, "tanh": math.tanh,
                      "erf": math.erf, "erfc": math.erfc})
    out = {}
    for name, f in _PURE.items():
        clone = FunctionType(f.__code__, g, name, f.__defaults__, f.__closure__)
        clone.__qualname__, clone.__doc__ = f.__qualname__, f.__doc__
        g[name] = out[name] = jit(clone)
    return SimpleNamespace(**out)


def python(t: Any) -> SimpleNamespace:
    """The formulas as plain Python on NumPy scalars of type t: slow, for tests and debugging."""
    return build(lambda f: f, t)


def formula_name(op: str, direction: str, params: dict[str, Any]) -> str:
    """The formula for one call ('gelu' with approximate='tanh' is its own formula)."""
    if op == "gelu" and params.get("approximate") == "tanh":
        op = "gelu_tanh"
    return TABLE[(op, direction)]


def scalar_params(op: str, params: dict[str, Any], dtype: str) -> tuple[float, float]:
    """(a, b) as Python floats, rounded to float32 below float64 (what the tests compare against)."""
    vals = [float(params[n]) for n in PARAMS.get(op, ())]
    if dtype != "float64":
        vals = [float(np.float32(v)) for v in vals]
    vals += [0.0] * (2 - len(vals))
    return vals[0], vals[1]


__all__ = ["PARAMS", "TABLE", "WIDE", "build", "constants", "formula_name", "python", "scalar_params"]
