"""ONNX graphs of every activation, forward and backward, for export and for ONNX Runtime backends.

`to_onnx(op)` (accuracy="contract") is a one-node graph where ONNX has the op and ONNX Runtime's kernel
keeps our contract (the op's Tolerance; NaN in gives NaN out, +-inf gives the limit, PyTorch's choices at
the kinks and the sign of zero), measured per dtype (_BUILTIN_OK); otherwise a small graph of primitive
ops that follows `multiact.reference`, in float32 where that meets the contract (expm1 by Kahan's trick,
sigmoid and softplus from Exp/Log without overflow), in float64 only where it does not (gelu's erfc tail,
mish's subnormal softplus, tanhshrink's cancellation), rounded once.  float16 models compute in float32 (or
float64) and round once, as the rest of multiact does.  accuracy="runtime" takes ORT's own operators
regardless (RUNTIME_ERRORS: what that costs in accuracy).  Backward graphs are always composites: ONNX
Runtime's standard package has no gradient kernels.  ONNX Runtime's CPU provider runs each node as a pass
over the tensor (no elementwise fusion), so a composite costs several built-in operators' time.

Inputs have any rank (`shape=`: fixed, symbolic or dynamic dims; default 1-D "N"); prelu's weight is 1-D,
broadcast along `axis` in the graph.  The gated ops (glu, swiglu, geglu, reglu) take x of `ndim` dims and
split it along `dim` inside the graph.  `from_onnx_node` maps an ONNX activation node back onto an op and
its keywords.  `onnx` is imported lazily.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from . import reference as R
from .optable import OpSpec, value_key
from .optable import get as _spec

OPSET = 20  # Gelu with `approximate` exists from opset 20
IR_VERSION = 10
DTYPES = ("float16", "float32")

ACCURACIES = ("contract", "runtime")

# accuracy="contract": forward one-node graphs (ORT's own operator) where ONNX Runtime 1.32's CPU kernel meets
# the op's Tolerance on the consistency suite's inputs (specials, kinks, the tails), by dtype; re-checked by
# tests/test_onnx_export.py and tests/test_onnx_contract.py.  _uses_builtin adds the
# parameter conditions.
_BUILTIN_OK = {
    "float32": {"relu", "relu6", "hardtanh", "leaky_relu", "hardsigmoid", "softplus"},
    "float16": {"relu", "relu6", "hardtanh", "leaky_relu", "hardsigmoid", "softplus", "elu", "tanh"},
}
# The composites that cannot meet the contract computing in float32 (measured likewise): these compute in
# float64 and round once; every other composite computes in float32 (float16 models too) and rounds once.
_F64_FORWARD = {"gelu", "tanhshrink", "mish"}  # mish: softplus(x) is subnormal in float32 below -87
_F64_BACKWARD = {"tanhshrink"}

_DEVIATIONS = {
    "elu": "ORT's float32 Elu computes exp(x) - 1 (8e6 ulp near 0): float32 composite with expm1 "
           "(float16: one node, except for a negative alpha, -0.0 included, whose sign of zero at x = +0 it loses)",
    "selu": "ORT's Selu computes exp(x) - 1 (1.5e7 ulp near 0 in float32) and gives +0 at x = -0 (float16 too); "
            "float32 composite with expm1",
    "celu": "ORT's Celu is float32 only and computes exp(x) - 1 (8e6 ulp); float32 composite with expm1",
    "gelu": "ORT's Gelu cancels in the negative tail (1.7e7 ulp, tanh form 7.5e7) and gives NaN at -inf; "
            "composite with erfc in float64 (a float32 erfc is 275 ulp off in the tail)",
    "sigmoid": "ORT's Sigmoid is 6.8e7 ulp off for x < -3 in float32 (1.9 ulp in float16); float32 composite",
    "hardswish": "ORT's HardSwish is 4e6 ulp off near -3 in float32 and gives NaN at -inf; float32 composite",
    "tanh": "ORT's float32 Tanh is 48 ulp off at +-1.2e-38 (the smallest normal): float32 Tanh with x itself "
            "below 2^-12 (float16: one node)",
    "softsign": "ORT's Softsign gives NaN at +-inf; float32 composite",
    "mish": "ORT's Mish gives NaN at -inf; float32 composite",
    "softshrink": "ORT's Shrink maps NaN to 0; float32 composite",
    "hardshrink": "ORT's Shrink maps NaN to 0; float32 composite",
    "threshold": "ORT's ThresholdedRelu is threshold(x, alpha, 0): one node for value = +0, else a composite",
    "softplus": "ORT's Softplus has no beta/threshold: one node only for beta = 1, threshold >= 20",
    "prelu": "ORT's PRelu takes x = -0 as positive, so a negative weight gives the wrong sign of zero: "
             "float32 composite (accuracy='runtime': PRelu)",
    "leaky_relu": "ORT's LeakyRelu takes x = -0 as positive: a negative slope gives the wrong sign of zero "
                  "(one node only for slopes >= +0)",
    "tanhshrink": "x - tanh(x) cancels near 0 in float32: float64 series below 0.5",
}

# accuracy="runtime": ORT's own operators regardless.  Where that breaks the contract, what was measured (ONNX
# Runtime 1.32, CPU provider, AMD Zen 3 with AVX2; the consistency suite's inputs plus a dense grid on [-30, 30],
# against the float64 reference).  RUNTIME_ULPS holds the figures (largest error per dtype over the op's parameter
# cases, in ulp of the dtype), the notes say where; tests/test_onnx_contract.py measures them again and fails where
# an error has grown past twice its figure.  Ops not listed meet the contract in runtime mode too (the same test).
RUNTIME_ULPS: dict[str, dict[str, float]] = {
    "elu": {"float32": 8.4e6}, "selu": {"float32": 1.5e7, "float16": 0.6}, "celu": {"float32": 8.4e6, "float16": 1.0},
    "gelu": {"float32": 7.5e7, "float16": 8.4}, "fast_gelu": {"float32": 7.4e7, "float16": 18.0},
    "silu": {"float32": 5.9e7, "float16": 24.0}, "swish": {"float32": 7.2e7, "float16": 38.0},
    "hardswish": {"float32": 4.2e6}, "sigmoid": {"float32": 6.8e7, "float16": 1.9}, "tanh": {"float32": 48.0},
    "softsign": {"float32": 1.9}, "mish": {"float32": 2.7e3},
}


def _ulps(op: str, dtype: str) -> str:
    v = RUNTIME_ULPS[op][dtype]
    if v < 1e3:
        return f"{v:g}"
    mant, exp = f"{v:.1e}".split("e")
    return f"{mant}e{int(exp)}"


RUNTIME_ERRORS = {
    "leaky_relu": "slope < 0: +0 instead of -0 at x = -0 (values exact)",
    "prelu": "weight < 0: +0 instead of -0 at x = -0 (values exact)",
    "elu": f"float32: {_ulps('elu', 'float32')} ulp near 0 (exp(x) - 1 cancels; absolute <= 6.2e-8 * alpha); "
           "float16 meets the contract; alpha < 0: +0 at x = +0",
    "selu": f"float32: {_ulps('selu', 'float32')} ulp near 0 (exp(x) - 1 cancels); +0 at x = -0 (float16 too, values "
            f"within {_ulps('selu', 'float16')} ulp)",
    "celu": f"float32: {_ulps('celu', 'float32')} ulp near 0; +0 at x = -0; float16 computes in float32 (within "
            f"{_ulps('celu', 'float16')} ulp)",
    "gelu": f"float32: {_ulps('gelu', 'float32')} ulp in the negative tail (erf form 1.7e7), absolute <= 7e-7; "
            f"float16: {_ulps('gelu', 'float16')} ulp (erf form 1.6) and NaN at -inf",
    "fast_gelu": f"x * Sigmoid(1.702 x): float32 {_ulps('fast_gelu', 'float32')} ulp in the negative tail (absolute "
                 f"1.5e-6); float16 {_ulps('fast_gelu', 'float16')} ulp, NaN at -inf",
    "silu": f"x * Sigmoid(x): float32 {_ulps('silu', 'float32')} ulp in the negative tail (absolute 3e-6); float16 "
            f"{_ulps('silu', 'float16')} ulp",
    "swish": f"x * Sigmoid(beta x): float32 up to {_ulps('swish', 'float32')} ulp in the tail; float16 up to "
             f"{_ulps('swish', 'float16')} ulp and NaN at an infinite x whose beta * x is -inf (both infinities for "
             "beta = 0)",
    "hardswish": f"float32: {_ulps('hardswish', 'float32')} ulp just above -3 (absolute 2.3e-7); float16: NaN at -inf",
    "sigmoid": f"float32: {_ulps('sigmoid', 'float32')} ulp below x = -3 (absolute 1.5e-7); float16: "
               f"{_ulps('sigmoid', 'float16')} ulp",
    "tanh": f"float32: {_ulps('tanh', 'float32')} ulp at +-1.2e-38 (the smallest normal), within 6 ulp elsewhere",
    "softsign": f"NaN at +-inf (values within {_ulps('softsign', 'float32')} ulp)",
    "mish": f"NaN at -inf; float32: {_ulps('mish', 'float32')} ulp below x = -87 (subnormal results)",
    "softshrink": "0 instead of NaN at NaN (values exact)",
    "hardshrink": "0 instead of NaN at NaN (values exact)",
    "tanhshrink": "x - Tanh(x) cancels near 0 in float32 (absolute 4.2e-7: no relative accuracy below |x| ~ 0.1); "
                  "float16 within 0.7 ulp",
    "threshold": "value = 0 (ThresholdedRelu): 0 instead of NaN at NaN; other values: the contract's composite",
}

_F32_MAX = float(np.finfo(np.float32).max)
_HS_ALPHA32 = float(np.float32(1.0 / 6.0))  # hardsigmoid's alpha as the kernels hold it
_TANHSHRINK_SERIES_BELOW = 0.5
_TANHSHRINK_TERMS = 12  # (2x/pi)^2 <= 0.1 per term below 0.5: 1e-12 relative


@cache
def _erfc_coeffs(degree: int = 14) -> tuple[float, ...]:
    """P with erfc(z) ~= t * exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z >= 0: least squares on libm here.

    Degree 14 on t in (0, 1] keeps the relative error near 1e-10 (checked in the tests): enough for
    float32 results computed in float64, not for float64 results.
    """
    t = np.linspace(1 / 14, 1.0, 2000)  # z from 0 to 26, where erfc still is a normal float64
    z = 2.0 / t - 2.0
    target = np.array([math.log(math.erfc(v) / tv) + v * v for v, tv in zip(z, t, strict=True)])
    return tuple(np.polynomial.polynomial.polyfit(t, target, degree))


def deviations() -> dict[str, str]:
    """Where and why an op's graph is not ONNX's own op (shown to users and in the docs)."""
    return dict(_DEVIATIONS)


class _Graph:
    """A tiny builder: nodes in order, scalar constants as cached initializers of the compute dtype."""

    def __init__(self, ct: str):
        self.ct = np.dtype(ct)
        self.big = float(np.finfo(self.ct).max)  # +-inf clipped to this keeps x * s(x) from inf * 0
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._consts: dict[tuple[str, Any], str] = {}
        self._n = 0

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        from onnx import helper

        self._n += 1
        out = f"t{self._n}_{op_type.lower()}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def c(self, v: float, dtype: str | None = None) -> str:
        from onnx import numpy_helper

        dt = np.dtype(dtype or self.ct)
        key = (dt.name, value_key(float(v)) if not math.isnan(v) else "nan")  # -0.0 is a constant of its own
        if key not in self._consts:
            name = f"c{len(self._consts)}_{dt.name}"
            with np.errstate(over="ignore"):  # beyond float16's range is inf there, as the kernels round it
                value = np.array(v, dtype=dt)
            self.inits.append(numpy_helper.from_array(value, name))
            self._consts[key] = name
        return self._consts[key]

    def ints(self, *values: int) -> str:
        """A 1-D int64 initializer (Slice's starts/ends/axes/steps, Unsqueeze's axes)."""
        from onnx import numpy_helper

        key = ("int64[]", ",".join(map(str, values)))
        if key not in self._consts:
            name = f"c{len(self._consts)}_int64s"
            self.inits.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
            self._consts[key] = name
        return self._consts[key]

    # arithmetic shorthands; a float argument becomes a constant of the compute dtype
    def _v(self, a: str | float) -> str:
        return a if isinstance(a, str) else self.c(a)

    def add(self, a, b):
        return self.op("Add", self._v(a), self._v(b))

    def sub(self, a, b):
        return self.op("Sub", self._v(a), self._v(b))

    def mul(self, a, b):
        return self.op("Mul", self._v(a), self._v(b))

    def div(self, a, b):
        return self.op("Div", self._v(a), self._v(b))

    def where(self, cond, a, b):
        if isinstance(a, float) and a == 0.0 and math.copysign(1.0, a) < 0:
            # ORT 1.32's CPU Where drops the sign of a -0.0 in its first branch (not in its second); the
            # negation is an Xor, since ORT fuses Where(Not(c), a, b) back into Where(c, b, a)
            return self.op("Where", self.op("Xor", cond, self.c(True, "bool")), self._v(b), self._v(a))
        return self.op("Where", cond, self._v(a), self._v(b))

    def select(self, cond, a, b):
        """Where(cond, a, b) that keeps a -0.0 selected from a tensor branch too.

        ORT's CPU Where returns +0.0 for a -0.0 taken from its first branch (microsoft/onnxruntime
        #32191); one taken from the second survives.  So each tensor branch goes second, negated,
        behind +0.0: negated back, its unselected places are -0.0, and adding -0.0 changes no value.
        where() suffices where the first branch is never -0.0 where selected.
        """
        if not isinstance(a, str):
            return self.where(cond, a, b)
        if isinstance(b, float) and (b != 0.0 or math.copysign(1.0, b) > 0):
            return self.where(self._not(cond), b, a)
        if not isinstance(b, str):
            b = self.op("Expand", self.c(b), self.op("Shape", a))  # -0.0: a tensor branch of its own
        only_a = self.neg(self.where(self._not(cond), 0.0, self.neg(a)))
        only_b = self.neg(self.where(cond, 0.0, self.neg(b)))
        return self.add(only_a, only_b)

    def _not(self, cond):
        """Not(cond) as an Xor: ORT fuses Where(Not(c), a, b) back into Where(c, b, a)."""
        return self.op("Xor", cond, self.c(True, "bool"))

    def gt(self, a, b):
        return self.op("Greater", self._v(a), self._v(b))

    def ge(self, a, b):
        return self.op("GreaterOrEqual", self._v(a), self._v(b))

    def lt(self, a, b):
        return self.op("Less", self._v(a), self._v(b))

    def le(self, a, b):
        return self.op("LessOrEqual", self._v(a), self._v(b))

    def eq(self, a, b):
        return self.op("Equal", self._v(a), self._v(b))

    def abs(self, a):
        return self.op("Abs", a)

    def neg(self, a):
        return self.op("Neg", a)

    def exp(self, a):
        return self.op("Exp", a)

    def clip(self, a, lo: float, hi: float):
        return self.op("Clip", a, self.c(lo), self.c(hi))

    def keepnan(self, x, r):
        """r with NaN wherever x is NaN (piecewise formulas would drop it)."""
        return self.op("Where", self.op("IsNaN", x), x, r)

    def gated(self, x, s):
        """x * s, with 0 where s == 0 (the x = -inf corner)."""
        return self.where(self.eq(s, 0.0), 0.0, self.mul(x, s))

    def sigmoid(self, z):
        e = self.exp(self.neg(self.abs(z)))
        d = self.add(1.0, e)
        return self.where(self.ge(z, 0.0), self.div(1.0, d), self.div(e, d))

    def log1p(self, u):
        """log(1 + u) for finite u > -1, to a few ULP (Kahan's trick)."""
        w = self.add(1.0, u)
        r = self.div(self.mul(self.op("Log", w), u), self.sub(w, 1.0))
        return self.where(self.eq(w, 1.0), u, r)

    def expm1(self, x):
        """exp(x) - 1 to a few ULP: Kahan's trick near 0, where exp(x) - 1 would cancel."""
        u = self.exp(x)
        um1 = self.sub(u, 1.0)
        near0 = self.select(self.eq(u, 1.0), x, self.div(self.mul(um1, x), self.op("Log", u)))  # keeps -0
        return self.where(self.gt(self.abs(x), 0.5), um1, near0)

    def softplus0(self, z):
        """log(1 + exp(z)) without overflow."""
        return self.add(self.op("Max", z, self.c(0.0)), self.log1p(self.exp(self.neg(self.abs(z)))))

    def sech2(self, x):
        """1 - tanh(x)^2 as 4 e / (1 + e)^2 with e = exp(-2|x|): accurate where tanh(x) is near 1."""
        e = self.exp(self.mul(self.abs(x), -2.0))
        d = self.add(1.0, e)
        return self.div(self.mul(e, 4.0), self.mul(d, d))

    def erfc(self, z):
        a = self.abs(z)
        t = self.div(1.0, self.add(1.0, self.mul(a, 0.5)))
        coeffs = _erfc_coeffs()
        p = self.c(coeffs[-1])
        for coef in reversed(coeffs[:-1]):
            p = self.add(self.mul(p, t), coef)
        e = self.mul(t, self.exp(self.sub(p, self.mul(a, a))))
        return self.where(self.lt(z, 0.0), self.sub(2.0, e), e)


# ---- forward bodies: (graph, x, params) -> y, in the graph's compute dtype ---------------------


def _swish_gate(g: _Graph, x: str, k: float) -> tuple[str, str, str]:
    xc = g.clip(x, -g.big, g.big)
    kx = g.mul(xc, k)
    return g.sigmoid(kx), g.sigmoid(g.neg(kx)), xc


def _gelu_tanh_parts(g: _Graph, x: str) -> tuple[str, str, str]:
    xc = g.clip(x, -1e5, 1e5)
    z = g.mul(g.add(xc, g.mul(g.mul(g.mul(xc, xc), xc), R.GELU_TANH_C)), 2 * R.GELU_TANH_K)
    return g.sigmoid(z), g.sigmoid(g.neg(z)), xc


def _selu_sa(p: dict) -> float:
    """selu's scale * alpha in float32, as the kernels compute it."""
    return float(np.float32(p["scale"]) * np.float32(p["alpha"]))


def _hardsigmoid_pieces(p: dict) -> tuple[float, float, float, float]:
    """(c, d, lo, hi) of hardsigmoid as the kernels compute them in float32: (x + c) / d between lo and hi,
    c = beta / alpha, d = 1 / alpha (3 and 6 at PyTorch's alpha = 1/6, beta = 0.5)."""
    a, b = np.float32(p["alpha"]), np.float32(p["beta"])
    c, d = b / a, np.float32(1.0) / a
    return float(c), float(d), float(-c), float(d - c)


def _fwd(g: _Graph, op: str, x: str, p: dict, weight: str | None) -> str:
    if op == "relu":  # the reference's formula: x = -0 stays -0 (Max(-0, 0) would give +0), NaN stays
        return g.where(g.lt(x, 0.0), 0.0, x)
    if op == "relu6":
        return g.clip(x, 0.0, 6.0)
    if op == "hardtanh":
        return g.clip(x, p["min_val"], p["max_val"])
    if op == "leaky_relu":
        return g.where(g.gt(x, 0.0), x, g.mul(x, p["negative_slope"]))
    if op == "prelu":
        return g.where(g.gt(x, 0.0), x, g.mul(x, weight))
    if op == "elu":
        return g.where(g.gt(x, 0.0), x, g.mul(g.expm1(x), p["alpha"]))
    if op == "selu":
        return g.where(g.gt(x, 0.0), g.mul(x, p["scale"]), g.mul(g.expm1(x), _selu_sa(p)))
    if op == "celu":
        a = p["alpha"]
        return g.where(g.gt(x, 0.0), x, g.mul(g.expm1(g.div(x, a)), a))
    if op == "gelu":
        if p["approximate"] == "tanh":
            return g.gated(x, _gelu_tanh_parts(g, x)[0])
        return g.gated(x, g.mul(g.erfc(g.mul(x, -1.0 / math.sqrt(2.0))), 0.5))
    if op in ("fast_gelu", "silu", "swish"):
        k = {"fast_gelu": R.FAST_GELU_K, "silu": 1.0}.get(op) or p["beta"]
        return g.gated(x, _swish_gate(g, x, k)[0])
    if op == "hardswish":
        mid = g.div(g.mul(x, g.add(x, 3.0)), 6.0)
        return g.where(g.le(x, -3.0), 0.0, g.where(g.ge(x, 3.0), x, mid))
    if op == "hardsigmoid":
        c, d, lo, hi = _hardsigmoid_pieces(p)
        return g.where(g.le(x, lo), 0.0, g.where(g.ge(x, hi), 1.0, g.div(g.add(x, c), d)))
    if op == "sigmoid":
        return g.sigmoid(x)
    if op == "logsigmoid":
        return g.sub(g.op("Min", x, g.c(0.0)), g.log1p(g.exp(g.neg(g.abs(x)))))
    if op == "tanh":
        if g.ct == np.float32:  # ORT's float32 Tanh is 48 ulp off at the smallest normal; tanh(x) = x there
            return g.select(g.lt(g.abs(x), 2.0**-12), x, g.op("Tanh", x))  # select: keeps x = -0
        return g.op("Tanh", x)
    if op == "softplus":
        b = p["beta"]
        z = g.mul(x, b)
        return g.select(g.gt(z, p["threshold"]), x, g.div(g.softplus0(z), b))
    if op == "softsign":
        return g.where(g.op("IsInf", x), g.op("Sign", x), g.div(x, g.add(g.abs(x), 1.0)))
    if op == "mish":
        return g.gated(x, g.op("Tanh", g.softplus0(x)))
    if op == "softshrink":
        lam = p["lambd"]
        r = g.where(g.gt(x, lam), g.sub(x, lam), g.where(g.lt(x, -lam), g.add(x, lam), 0.0))
        return g.keepnan(x, r)
    if op == "hardshrink":
        return g.keepnan(x, g.where(g.gt(g.abs(x), p["lambd"]), x, 0.0))
    if op == "tanhshrink":
        x2 = g.mul(x, x)
        coefs = R._tanhshrink_series(_TANHSHRINK_TERMS)
        acc = g.c(coefs[-1])
        for coef in reversed(coefs[:-1]):
            acc = g.add(g.mul(acc, x2), coef)
        series = g.mul(g.mul(acc, x2), x)
        r = g.where(g.lt(g.abs(x), _TANHSHRINK_SERIES_BELOW), series, g.sub(x, g.op("Tanh", x)))
        return g.where(g.eq(r, 0.0), 0.0, r)  # a zero result is +0, as x - tanh(x) gives at x = -0
    if op == "threshold":
        return g.where(g.le(x, p["threshold"]), p["value"], x)
    raise AssertionError(op)


def _builtin_fwd(g: _Graph, op: str, x: str, p: dict, weight: str | None) -> str:
    """op's forward with ONNX's own operators (one node where ONNX has the op): accuracy="runtime"'s graph."""
    if op == "relu":
        return g.op("Relu", x)
    if op == "relu6":
        return g.clip(x, 0.0, 6.0)
    if op == "hardtanh":
        return g.clip(x, p["min_val"], p["max_val"])
    if op == "leaky_relu":
        return g.op("LeakyRelu", x, alpha=p["negative_slope"])
    if op == "prelu":
        return g.op("PRelu", x, weight)
    if op == "hardsigmoid":
        return g.op("HardSigmoid", x, alpha=p["alpha"], beta=p["beta"])
    if op == "hardswish":
        return g.op("HardSwish", x)
    if op == "softplus":
        if p["beta"] == 1.0 and p["threshold"] >= 20.0:
            return g.op("Softplus", x)
        z = g.mul(x, p["beta"])
        return g.where(g.gt(z, p["threshold"]), x, g.div(g.op("Softplus", z), p["beta"]))
    if op == "elu":
        return g.op("Elu", x, alpha=p["alpha"])
    if op == "selu":
        return g.op("Selu", x, alpha=p["alpha"], gamma=p["scale"])
    if op == "celu":
        return g.op("Celu", x, alpha=p["alpha"])
    if op == "gelu":
        return g.op("Gelu", x, approximate=p["approximate"])
    if op in ("fast_gelu", "silu", "swish"):
        k = {"fast_gelu": R.FAST_GELU_K, "silu": 1.0}.get(op, p.get("beta"))
        return g.mul(x, g.op("Sigmoid", x if k == 1.0 else g.mul(x, k)))
    if op == "sigmoid":
        return g.op("Sigmoid", x)
    if op == "logsigmoid":
        return g.neg(g.op("Softplus", g.neg(x)))
    if op == "tanh":
        return g.op("Tanh", x)
    if op == "tanhshrink":
        return g.sub(x, g.op("Tanh", x))
    if op == "softsign":
        return g.op("Softsign", x)
    if op == "mish":
        return g.op("Mish", x)
    if op == "softshrink":
        return g.op("Shrink", x, lambd=p["lambd"], bias=p["lambd"])
    if op == "hardshrink":
        return g.op("Shrink", x, lambd=p["lambd"], bias=0.0)
    if op == "threshold" and p["value"] == 0.0:
        return g.op("ThresholdedRelu", x, alpha=p["threshold"])  # x if x > alpha else 0
    return _fwd(g, op, x, p, weight)


def _uses_builtin(op: str, dtype: str, p: dict) -> bool:
    """Whether accuracy="contract" exports op's forward as ORT's own operator (measured: see _BUILTIN_OK)."""
    if op not in _BUILTIN_OK[dtype]:
        return False
    if op == "softplus":
        return p["beta"] == 1.0 and p["threshold"] >= 20.0
    if op == "leaky_relu":
        return math.copysign(1.0, p["negative_slope"]) > 0  # see deviations()
    if op == "elu":  # ORT's Elu takes x = 0 as positive: a negative alpha (-0.0 too) gives +0 at x = +0
        return math.copysign(1.0, p["alpha"]) > 0
    if op == "hardsigmoid":  # measured at PyTorch's constants only
        return p["alpha"] == _HS_ALPHA32 and p["beta"] == 0.5
    return True


# ---- backward bodies: (graph, dy, x, params) -> dx -------------------------------------------


def _bwd(g: _Graph, op: str, dy: str, x: str, p: dict, weight: str | None) -> str:
    def pass_where(cond):
        return g.keepnan(x, g.select(cond, dy, 0.0))

    if op == "relu":
        return pass_where(g.gt(x, 0.0))
    if op == "relu6":
        return pass_where(g.op("And", g.gt(x, 0.0), g.lt(x, 6.0)))
    if op == "hardtanh":
        return pass_where(g.op("And", g.gt(x, p["min_val"]), g.lt(x, p["max_val"])))
    if op == "leaky_relu":
        return g.keepnan(x, g.select(g.gt(x, 0.0), dy, g.mul(dy, p["negative_slope"])))
    if op == "prelu":
        return g.keepnan(x, g.select(g.gt(x, 0.0), dy, g.mul(dy, weight)))
    if op in ("softshrink", "hardshrink"):
        return pass_where(g.gt(g.abs(x), p["lambd"]))
    if op == "threshold":
        return g.keepnan(x, g.where(g.le(x, p["threshold"]), 0.0, dy))
    if op == "hardsigmoid":
        _, d, lo, hi = _hardsigmoid_pieces(p)
        inside = g.op("And", g.gt(x, lo), g.lt(x, hi))
        return g.keepnan(x, g.select(inside, g.div(dy, d), 0.0))
    if op == "hardswish":
        mid = g.mul(dy, g.add(g.div(x, 3.0), 0.5))
        return g.keepnan(x, g.where(g.le(x, -3.0), 0.0, g.select(g.lt(x, 3.0), mid, dy)))
    if op == "elu":
        return g.select(g.gt(x, 0.0), dy, g.mul(dy, g.mul(g.exp(x), p["alpha"])))
    if op == "selu":
        return g.select(g.gt(x, 0.0), g.mul(dy, p["scale"]), g.mul(dy, g.mul(g.exp(x), _selu_sa(p))))
    if op == "celu":
        return g.select(g.gt(x, 0.0), dy, g.mul(dy, g.exp(g.div(x, p["alpha"]))))
    if op == "sigmoid":
        return g.mul(dy, g.mul(g.sigmoid(x), g.sigmoid(g.neg(x))))
    if op == "logsigmoid":
        return g.mul(dy, g.sigmoid(g.neg(x)))
    if op == "tanh":
        return g.mul(dy, g.sech2(x))
    if op == "softplus":
        z = g.mul(x, p["beta"])
        return g.keepnan(x, g.select(g.gt(z, p["threshold"]), dy, g.mul(dy, g.sigmoid(z))))
    if op == "softsign":  # divided twice: (1 + |x|)^2 overflows float32 for |x| >= 1.8e19 (multiact.reference)
        d = g.add(g.abs(x), 1.0)
        return g.div(g.div(dy, d), d)
    if op in ("fast_gelu", "silu", "swish"):
        k = {"fast_gelu": R.FAST_GELU_K, "silu": 1.0}.get(op) or p["beta"]
        s, sn, xc = _swish_gate(g, x, k)
        return g.mul(dy, g.add(s, g.mul(g.mul(g.mul(xc, s), sn), k)))
    if op == "gelu":
        if p["approximate"] == "tanh":
            s, sn, xc = _gelu_tanh_parts(g, x)
            dz = g.mul(g.add(g.mul(g.mul(xc, xc), 3 * R.GELU_TANH_C), 1.0), 2 * R.GELU_TANH_K)
            return g.mul(dy, g.add(s, g.mul(g.mul(g.mul(xc, s), sn), dz)))
        xc = g.clip(x, -1e5, 1e5)
        cdf = g.mul(g.erfc(g.mul(x, -1.0 / math.sqrt(2.0))), 0.5)
        pdf = g.mul(g.exp(g.mul(g.mul(xc, xc), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
        return g.mul(dy, g.add(cdf, g.mul(xc, pdf)))
    if op == "mish":
        sp = g.softplus0(x)
        xc = g.clip(x, -g.big, g.big)
        return g.mul(dy, g.add(g.op("Tanh", sp), g.mul(g.mul(xc, g.sigmoid(x)), g.sech2(sp))))
    if op == "tanhshrink":
        t = g.op("Tanh", x)
        return g.mul(dy, g.mul(t, t))
    raise AssertionError(op)


def _bwd_y(g: _Graph, op: str, dy: str, y: str, p: dict) -> str:
    """Backward from the output y (only where spec.supports_y)."""
    if _spec(op).defn.y_form == "same":
        return _bwd(g, op, dy, y, p, None)  # same formula: y > 0 exactly where x > 0
    if op == "elu":
        return g.select(g.gt(y, 0.0), dy, g.mul(dy, g.add(y, p["alpha"])))
    if op == "selu":
        return g.select(g.gt(y, 0.0), g.mul(dy, p["scale"]), g.mul(dy, g.add(y, _selu_sa(p))))
    if op == "celu":
        return g.select(g.gt(y, 0.0), dy, g.mul(dy, g.add(g.div(y, p["alpha"]), 1.0)))
    if op == "sigmoid":
        return g.mul(dy, g.mul(y, g.sub(1.0, y)))
    if op == "tanh":
        return g.mul(dy, g.mul(g.sub(1.0, y), g.add(y, 1.0)))
    raise AssertionError(op)


# ---- param grads: float64 results -----------------------------------------------------------


def _param_grad(g: _Graph, op: str, dy: str, x: str, p: dict, axis: int | None, ndim: int) -> str:
    if op == "swish":
        s, sn, xc = _swish_gate(g, x, p["beta"])
        prod = g.mul(dy, g.mul(g.mul(xc, s), g.mul(xc, sn)))
        return g.op("ReduceSum", prod, keepdims=0)
    if op == "prelu":  # one sum per channel: over every axis but `axis` (rank 0: the element itself)
        contrib = g.where(g.gt(x, 0.0), 0.0, g.mul(x, dy))
        others = [i for i in range(ndim) if i != axis]
        return g.op("ReduceSum", contrib, g.ints(*others), keepdims=0) if others and axis is not None else contrib
    raise AssertionError(op)


# ---- the model ------------------------------------------------------------------------------


def _round_params(spec: OpSpec, params: dict) -> dict:
    """Validated params with floats rounded to float32, as every backend decides with them."""
    if spec.name == "prelu":
        params = {"weight": None, **params}
    p = spec.validate(params)
    return {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in p.items()}


def _elem(dtype: str) -> int:
    from onnx import TensorProto

    return {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}[dtype]


def _dtype_name(dtype: Any, fn: str = "to_onnx()") -> str:
    """'float16', 'float32' or 'bfloat16' from a string, a NumPy dtype or a scalar type; ValueError otherwise."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in (*DTYPES, "bfloat16") or isinstance(dtype, bool):
        raise ValueError(f"{fn}: dtype must be float16, float32 or bfloat16 (a name, a NumPy dtype or a scalar "
                         f"type), got {dtype!r}")
    return name


def _bf16_wrapped(model: Any) -> Any:
    """A float32 model with bfloat16 inputs and outputs: each float32 input Cast from bfloat16, each float32
    output Cast to bfloat16 (float64 outputs, the parameter gradients, stay float64)."""
    import onnx
    from onnx import TensorProto, helper

    g = model.graph
    f32, bf = TensorProto.FLOAT, TensorProto.BFLOAT16
    rename = {i.name: f"{i.name}_f32" for i in g.input if i.type.tensor_type.elem_type == f32}
    out_names = {o.name for o in g.output if o.type.tensor_type.elem_type == f32}
    nodes = [helper.make_node("Cast", [n], [m], to=f32) for n, m in rename.items()]
    for node in g.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [f"{n}_f32" if n in out_names else n for n in node.output]
    nodes += list(g.node)
    nodes += [helper.make_node("Cast", [f"{n}_f32"], [n], to=bf) for n in out_names]
    for v in (*g.input, *g.output):
        if v.name in rename or v.name in out_names:
            v.type.tensor_type.elem_type = bf
    del g.node[:]
    g.node.extend(nodes)
    g.doc_string = (g.doc_string.replace(", float32,", ", bfloat16 (the float32 graph between Casts),", 1)
                    if ", float32," in g.doc_string else g.doc_string + " (bfloat16: the float32 graph between Casts)")
    onnx.checker.check_model(model)
    return model


def _input_shape(shape: Any, fn: str = "to_onnx()") -> list[int | str]:
    """The model's input shape: an int is a rank (every dim dynamic); in a sequence an int is a fixed dim,
    a str a symbolic one and None a dynamic one (named d<i>, so that every input and output share it)."""
    if isinstance(shape, bool):
        raise ValueError(f"{fn}: shape must be a rank or a sequence of ints, names and None, got {shape!r}")
    if isinstance(shape, int | np.integer):
        if shape < 0:
            raise ValueError(f"{fn}: shape as a rank must be >= 0, got {shape!r}")
        return [f"d{i}" for i in range(int(shape))]
    if isinstance(shape, str) or not hasattr(shape, "__iter__"):
        raise ValueError(f"{fn}: shape must be a rank or a sequence of ints, names and None, got {shape!r}")
    out: list[int | str] = []
    for i, d in enumerate(shape):
        if d is None:
            out.append(f"d{i}")
        elif isinstance(d, str) and d:
            out.append(d)
        elif isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise ValueError(f"{fn}: shape[{i}] must be an int >= 0, a name or None (dynamic), got {d!r}")
    return out


def _compute_dtype(op: str, what: str, dtype: str, p: dict, accuracy: str) -> str:
    """The dtype the graph computes in: dtype itself for ORT's own operators, float32 for the composites
    that meet the contract there, float64 for the rest (and every parameter gradient, a sum)."""
    if what == "param_grad":
        return "float64"
    if what == "forward" and (accuracy == "runtime" or _uses_builtin(op, dtype, p)):
        # ORT's Celu is float32 only; threshold's composite (value != 0) compares with a float32 threshold
        wide = op == "celu" or (op == "threshold" and p["value"] != 0.0)
        return "float32" if wide and dtype == "float16" else dtype
    if accuracy == "runtime":
        return "float32"
    f64 = _F64_FORWARD if what == "forward" else _F64_BACKWARD
    return "float64" if op in f64 else "float32"


def to_onnx(op: str, *, dtype: Any = "float32", grad: bool | str = False, from_output: bool = False,
            shape: Any = None, accuracy: str = "contract", **params: Any) -> Any:
    """Returns an `onnx.ModelProto` (opset 20, passed by onnx.checker; `onnx.save(model, path)` or
    `model.SerializeToString()` for a session) of op's forward, or with `grad=True` its backward.

    Inputs: forward `x`; backward `dy`, `x` (with `from_output=True`: `dy`, `y`, for the ops whose
    derivative is a function of the output); prelu adds `weight`.  Output `y` or `dx`, x's dtype and shape.

    dtype: float32 or float16, as a name, a NumPy dtype or a scalar type (np.float32); or "bfloat16"
      (ml_dtypes.bfloat16): the float32 graph with bfloat16 inputs Cast to float32 and float32 results Cast
      to bfloat16 (ONNX's Cast rounds to nearest even).  ONNX Runtime's CPU provider has no bfloat16
      arithmetic, so there is no bfloat16 graph of ORT's own operators; where the float32 graph computes in
      float64 (gelu's forward, tanhshrink, mish) its result is rounded to float32 and then to bfloat16, twice,
      so it can sit one bfloat16 ulp from multiact's where that float32 value is a bfloat16 tie.
    shape: the inputs' shape; an int is a rank with every dim dynamic, a sequence holds ints (fixed),
      names (symbolic, e.g. ["N", "C", 224, 224]) and None (dynamic).  Default: 1-D ["N"]; prelu
      ["N", "C", "S"].  prelu's `weight` input is 1-D, one element or x.shape[axis] (per channel along
      `axis`, default 1), broadcast along axis inside the graph.
    accuracy: "contract" (default) keeps multiact's accuracy contract (the Tolerance of `ma.ops()`, the
      conventions at NaN, +-inf, -0 and the kinks): ORT's own operator where its CPU kernel meets it
      (relu, relu6, hardtanh, leaky_relu with a slope >= +0, hardsigmoid, softplus with beta = 1 and
      threshold >= 20; float16 also elu and tanh), elsewhere a composite of primitive nodes in float32,
      in float64 only where float32 cannot meet the contract (gelu's forward, tanhshrink).  Cost: each
      node is a pass over the tensor in ONNX Runtime, which does not fuse them, so a composite runs
      several times slower than a built-in operator (benchmarks/results/onnx-export-x86-2core.txt);
      `deviations()` says why each op is not one node.
      "runtime": ORT's own operators regardless (Gelu, Sigmoid, Elu, Selu, Celu, HardSwish, Mish,
      Softsign, Shrink, PRelu, ...; silu/swish/fast_gelu as x * Sigmoid(k x)): the fastest graph, with the
      measured errors of `RUNTIME_ERRORS` (up to 7e7 ulp in float32 tails, NaN at some infinities).
      Backward graphs are composites in both modes (ONNX Runtime has no gradient kernels), float32.
    `grad="beta"` (swish) and `grad="weight"` (prelu) export the parameter gradient: inputs `dy`, `x`;
    output `dparam` in float64 (swish: the sum over all elements; prelu: one per channel), summed in float64.

    The gated ops (glu, swiglu, geglu, reglu, with their parameters: act and its parameters, activate,
    layout, dim, alpha, limit, approximate) take one input `x` with `ndim` dynamic dims (keyword
    `ndim`, default 2: (tokens, 2 * hidden)), split along `dim` inside the graph (halves or interleaved;
    an odd x.shape[dim] fails in the session), and give `y` (half of x along dim); `grad=True` takes `dy`
    (y's shape) and `x` and gives `dx` (x's shape, both halves).  They compute in float64 (contract only).

    `to_onnx("bias_act", act=..., dim=1, gain=1.0, clamp=None, ndim=4, scale=False, **act_params)`: inputs
    `x`, `b` (x.shape[dim],) and with scale=True `scale`; grad=True takes `dy` first and gives `dx`, `db`
    (and `dscale`), summed in float64.
    """
    import onnx
    from onnx import helper

    from ._opdefs import COMPOSITE_DEFINITIONS

    fn = "to_onnx()"
    dtype = _dtype_name(dtype, fn)
    if dtype == "bfloat16":
        return _bf16_wrapped(to_onnx(op, dtype="float32", grad=grad, from_output=from_output, shape=shape,
                                     accuracy=accuracy, **params))
    if accuracy not in ACCURACIES:
        raise ValueError(f"{fn}: accuracy must be one of {ACCURACIES}, got {accuracy!r}")
    composite = op == "bias_act" or (isinstance(op, str) and op in COMPOSITE_DEFINITIONS)
    if composite and (shape is not None or accuracy != "contract"):
        raise ValueError(f"{fn}: {op} takes ndim= (its dims are all dynamic) and accuracy='contract' only, "
                         f"got shape={shape!r}, accuracy={accuracy!r}")
    if op == "bias_act":
        return _bias_act_to_onnx(dtype, grad, from_output, params)
    if composite:
        return _gated_to_onnx(COMPOSITE_DEFINITIONS[op], dtype, grad, from_output, params)
    spec = _spec(op)
    p = _round_params(spec, params)
    param_grad = isinstance(grad, str)
    if param_grad and (spec.param_grad is None or spec.param_grad[0] != grad):
        have = f"{spec.param_grad[0]!r}" if spec.param_grad else "none"
        raise ValueError(f"{fn}: {op} has no gradient for parameter {grad!r} (it has: {have})")
    if grad not in (False, True) and not param_grad:
        raise ValueError(f"{fn}: grad must be False, True or a parameter's name, got {grad!r}")
    if from_output and (grad is not True or not spec.supports_y(p)):
        raise ValueError(f"{fn}: from_output=True needs grad=True and an op whose backward can use the output "
                         f"({spec.y_condition or 'not ' + op})")
    x_shape = _input_shape(["N", "C", "S"] if shape is None and op == "prelu" else ["N"] if shape is None
                           else shape, fn)
    ndim = len(x_shape)
    axis = None
    if op == "prelu":
        axis = p.get("axis", 1)
        if ndim and not -ndim <= axis < ndim:
            raise ValueError(f"{fn}: prelu's axis {axis} is out of range for x with {ndim} dims (shape={shape!r})")
        axis = axis % ndim if ndim else None
    what = "param_grad" if param_grad else ("backward" if grad else "forward")
    builtin = what == "forward" and (accuracy == "runtime" or _uses_builtin(op, dtype, p))
    ct = _compute_dtype(op, what, dtype, p, accuracy)
    g = _Graph(ct)
    elem = _elem(dtype)
    names = ["dy", "y" if from_output else "x"] if grad else ["x"]
    inputs = [helper.make_tensor_value_info(n, elem, x_shape) for n in names]
    if op == "prelu" and not param_grad:
        names.append("weight")
        inputs.append(helper.make_tensor_value_info("weight", elem, ["W"]))

    def cast_in(n: str) -> str:
        return n if ct == dtype else g.op("Cast", n, to=_elem(ct))

    vals = {n: cast_in(n) for n in names}
    if "weight" in vals:  # (W,) -> (W, 1, ..., 1): along axis; rank 0: the one weight as a scalar
        w = vals["weight"]
        if not ndim:
            w = g.op("ReduceMax", w, keepdims=0)
        elif ndim - axis > 1:
            w = g.op("Unsqueeze", w, g.ints(*range(1, ndim - axis)))
        vals["weight"] = w
    if builtin:
        out = _builtin_fwd(g, op, vals["x"], p, vals.get("weight"))
    elif param_grad:
        out = _param_grad(g, op, vals["dy"], vals["x"], p, axis, ndim)
    elif from_output:
        out = _bwd_y(g, op, vals["dy"], vals["y"], p)
    elif grad:
        out = _bwd(g, op, vals["dy"], vals["x"], p, vals.get("weight"))
    else:
        out = _fwd(g, op, vals["x"], p, vals.get("weight"))

    out_name = "dparam" if param_grad else ("dx" if grad else "y")
    out_elem = _elem("float64") if param_grad else elem
    if param_grad:
        out_shape: list = [] if op == "swish" or not ndim else ["W"]
    else:
        out_shape = x_shape
    if (ct == dtype or param_grad) and g.nodes and g.nodes[-1].output[0] == out:
        g.nodes[-1].output[0] = out_name
    elif ct == dtype or param_grad:
        g.nodes.append(helper.make_node("Identity", [out], [out_name]))
    else:
        g.nodes.append(helper.make_node("Cast", [out], [out_name], to=elem))
    label = f"d{grad}" if param_grad else ("backward_y" if from_output else what)
    settings = ", ".join(f"{k}={v!r}" for k, v in p.items() if k != "weight")
    graph = helper.make_graph(
        g.nodes, f"multiact_{op}_{label}", inputs,
        [helper.make_tensor_value_info(out_name, out_elem, out_shape)], g.inits,
        doc_string=f"multiact {op}({settings}) {label}, {dtype}, accuracy={accuracy}, computed in {ct}",
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="multiact")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def from_onnx_node(node: Any, *inputs: Any) -> tuple[str | None, dict[str, Any]]:
    """(multiact op, its keywords) computing ONNX activation node `node` (an onnx NodeProto), given the
    node's inputs after x as arrays or None (PRelu's slope, Clip's min and max): the inverse of
    `to_onnx(..., accuracy="runtime")`.  ONNX's defaults where an attribute is absent (HardSigmoid alpha
    0.2, Softplus with no threshold, Clip at float32's range).  Clip with min > max maps to
    (None, {"min_val": min, "max_val": max}): ONNX's result is max everywhere, a constant hardtanh refuses.
    ValueError for a node multiact has no activation for.  PRelu maps to prelu(weight=slope, axis=-1): a 1-D
    slope is per channel along the last axis, NumPy's broadcasting of it; a slope of more dims broadcasts."""
    from onnx import helper

    a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    t = node.op_type
    fn = "from_onnx_node()"

    def f(name: str, default: float) -> float:
        return float(a.get(name, default))

    simple = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softsign": "softsign", "Mish": "mish",
              "HardSwish": "hardswish"}
    if t in simple:
        return simple[t], {}
    if t == "LeakyRelu":
        return "leaky_relu", {"negative_slope": f("alpha", 0.01)}
    if t in ("Elu", "Celu"):
        return t.lower(), {"alpha": f("alpha", 1.0)}
    if t == "Selu":  # ONNX's defaults are PyTorch's constants rounded to float32
        return "selu", {"alpha": f("alpha", 1.67326319217681884765625), "scale": f("gamma", 1.05070102214813232421875)}
    if t == "Gelu":
        approx = a.get("approximate", b"none")
        return "gelu", {"approximate": approx.decode() if isinstance(approx, bytes) else approx}
    if t == "Softplus":
        return "softplus", {"beta": 1.0, "threshold": math.inf}
    if t == "HardSigmoid":
        return "hardsigmoid", {"alpha": f("alpha", 0.2), "beta": f("beta", 0.5)}
    if t == "ThresholdedRelu":
        return "threshold", {"threshold": f("alpha", 1.0), "value": 0.0}
    if t == "Shrink":
        lambd, bias = f("lambd", 0.5), f("bias", 0.0)
        if bias == 0.0:
            return "hardshrink", {"lambd": lambd}
        if bias == lambd:
            return "softshrink", {"lambd": lambd}
        raise ValueError(f"{fn}: Shrink with bias {bias} (neither 0 nor lambd {lambd}) is not a multiact activation")
    if t == "PRelu":
        if not inputs or inputs[0] is None:
            raise ValueError(f"{fn}: PRelu needs its slope array")
        return "prelu", {"weight": np.asarray(inputs[0]), "axis": -1}
    if t == "Clip":
        lo, hi = (None if v is None else float(np.asarray(v)) for v in (*inputs, None, None)[:2])
        lo = -_F32_MAX if lo is None else lo
        hi = _F32_MAX if hi is None else hi
        if lo > hi:
            return None, {"min_val": lo, "max_val": hi}
        return "hardtanh", {"min_val": lo, "max_val": hi}
    raise ValueError(f"{fn}: {t} is not an activation multiact maps")


# ---- the gated family (glu, swiglu, geglu, reglu): the activation's graph on the gate, times up ------

# ONNX has SwiGLU since opset 28 (Y = Swish_alpha(A) * B, two inputs of one shape).  ONNX Runtime 1.32's
# CPU provider cannot run it: a session expands the function into Swish (opset 24), which it has no
# kernel for ("NOT_IMPLEMENTED: Could not find an implementation for Swish(24)"), in float16, float32 and
# float64 alike (measured with onnx 1.23.2 / onnxruntime 1.32.0; tests/test_gated_onnx.py re-measures
# it).  So every gated graph is a composite at opset 20: the activation's own graph (_fwd / _bwd, never
# restated here) on the clipped gate, times the clipped up, all in float64 and rounded once, which
# keeps the product within the activation's bound + 1 ulp (float16 and float32 results).
SWIGLU_NOTE = ("ONNX's SwiGLU (opset 28) does not run on ONNX Runtime 1.32 (no kernel for the Swish(24) it "
               "expands into); the gated graphs are the activation's graph times the other half")
_GATED_CT = "float64"


def _gated_clip(g: _Graph, gate: str, up: str, kp: dict) -> tuple[str, str]:
    """(min(gate, limit), clamp(up, -limit, limit) + shift); NaN stays NaN (Where, not Min/Clip, whose
    NaN handling ONNX leaves open); nothing at all without a limit."""
    limit = kp["limit"]
    if limit == math.inf:
        return gate, up
    gc = g.where(g.gt(gate, limit), limit, gate)
    uc = g.where(g.gt(up, limit), limit, g.where(g.lt(up, -limit), -limit, up))
    return gc, (g.add(uc, kp["shift"]) if kp["shift"] else uc)


def _held(g: _Graph, v: str) -> str:
    """v as a float32 kernel holds it: +-inf beyond float32's range (float16 and float32 kernels compute
    in float32, so act(g) and dy * u overflow there, as PyTorch's silu(a) * b does), else v unrounded."""
    return g.where(g.gt(g.abs(v), _F32_MAX), g.mul(v, math.inf), v)


def _gated_fwd(g: _Graph, act: str, kp: dict, gate: str, up: str) -> str:
    gc, uc = _gated_clip(g, gate, up, kp)
    return g.mul(_held(g, _fwd(g, act, gc, kp, None)), uc)


def _gated_bwd(g: _Graph, act: str, kp: dict, dy: str, gate: str, up: str) -> tuple[str, str]:
    """(dgate, dup) = (act_backward(dy * u, g), dy * act(g)), zero where the clip is hit."""
    gc, uc = _gated_clip(g, gate, up, kp)
    dgate = _bwd(g, act, _held(g, g.mul(dy, uc)), gc, kp, None)
    dup = g.mul(dy, _held(g, _fwd(g, act, gc, kp, None)))
    limit = kp["limit"]
    if limit != math.inf:
        dgate = g.where(g.gt(gate, limit), 0.0, dgate)
        dup = g.where(g.gt(g.abs(up), limit), 0.0, dup)
    return dgate, dup


def _gated_params(kp: dict) -> dict:
    """The kernel parameters with floats rounded to float32, as every backend decides with them."""
    return {k: float(np.float32(v)) if isinstance(v, float) and math.isfinite(v) else v for k, v in kp.items()}


def _gated_model(g: _Graph, name: str, dtype: str, inputs: list, outputs: list[tuple[str, str, Any]], doc: str):
    """The model of a gated graph: each (graph value, output name, shape) cast once to dtype."""
    import onnx
    from onnx import helper

    elem = _elem(dtype)
    for value, out_name, _ in outputs:
        g.nodes.append(helper.make_node("Cast", [value], [out_name], to=elem))
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info(n, elem, shape) for _, n, shape in outputs], g.inits,
                              doc_string=doc)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="multiact")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def gated_kernel_onnx(key: str, direction: str, dtype: str, kp: dict):
    """The `gated:<act key>` kernel of the ONNX Runtime backends: 1-D inputs of one dynamic length,
    `gate`, `up` (backward: `dy`, `gate`, `up`), outputs `y` (backward: `dgate`, `dup`).  kp holds the
    activation's validated parameters and the family's scalars (limit, shift)."""
    from onnx import helper

    from .optable import FAMILY_KEYS

    if dtype not in DTYPES:
        raise ValueError(f"gated_kernel_onnx(): dtype must be one of {DTYPES}, got {dtype!r}")
    _, act, _ = FAMILY_KEYS[key]
    p = _gated_params(kp)
    g = _Graph(_GATED_CT)
    names = ("dy", "gate", "up") if direction == "backward" else ("gate", "up")
    inputs = [helper.make_tensor_value_info(n, _elem(dtype), ["N"]) for n in names]
    v = {n: g.op("Cast", n, to=_elem(_GATED_CT)) for n in names}
    if direction == "backward":
        dgate, dup = _gated_bwd(g, act.name, p, v["dy"], v["gate"], v["up"])
        outputs = [(dgate, "dgate", ["N"]), (dup, "dup", ["N"])]
    else:
        outputs = [(_gated_fwd(g, act.name, p, v["gate"], v["up"]), "y", ["N"])]
    settings = ", ".join(f"{k}={val!r}" for k, val in p.items())
    return _gated_model(g, f"multiact_{key.replace(':', '_')}_{direction}", dtype, inputs, outputs,
                        f"multiact {key}({settings}) {direction}, {dtype}")


def _gated_to_onnx(cdef: Any, dtype: str, grad: Any, from_output: bool, params: dict):
    """to_onnx() of a gated op: the one-input form, x of any rank split along dim in the graph."""
    from onnx import helper

    from . import gated

    fn = "to_onnx()"
    if dtype not in DTYPES:
        raise ValueError(f"{fn}: dtype must be one of {DTYPES}, got {dtype!r}")
    if grad not in (False, True) or from_output:
        raise ValueError(f"{fn}: {cdef.name} exports its forward or, with grad=True, dx from (dy, x); "
                         "it has no parameter gradient and no backward from the output")
    params = dict(params)
    ndim = params.pop("ndim", 2)
    if isinstance(ndim, bool) or not isinstance(ndim, int | np.integer) or ndim < 1:
        raise ValueError(f"{fn}: ndim (the rank of x) must be an int >= 1, got {ndim!r}")
    ndim = int(ndim)
    own = {k: v for k, v in params.items() if k in cdef.param_names}
    extra = {k: v for k, v in params.items() if k not in cdef.param_names}
    call = gated.resolve(cdef, own, extra, fn)
    if not -ndim <= call.dim < ndim:
        raise ValueError(f"{fn}: dim {call.dim} is out of range for x with {ndim} dims (ndim={ndim})")
    gated.check_precision(call, np.dtype(dtype), fn)
    p = _gated_params(call.kp)
    dim = call.dim
    axis = dim % ndim
    g = _Graph(_GATED_CT)
    elem = _elem(dtype)
    # x as (..., 2, D/2, ...) (halves) or (..., D/2, 2, ...) (interleaved): a Reshape that fails in the
    # session for an odd D (Split or Slice would give unequal parts that Mul then broadcasts), then the
    # two parts by Gather on the pair axis
    pair_axis = axis if call.layout == "halves" else axis + 1
    half = g.op("Div", g.op("Shape", "x", start=axis, end=axis + 1), g.ints(2))
    parts = [g.op("Shape", "x", start=0, end=axis)] if axis else []
    parts += [g.ints(2), half] if call.layout == "halves" else [half, g.ints(2)]
    parts += [g.op("Shape", "x", start=axis + 1)] if axis + 1 < ndim else []
    paired = g.op("Reshape", g.op("Cast", "x", to=_elem(_GATED_CT)), g.op("Concat", *parts, axis=0))
    first, second = (g.op("Gather", paired, g.c(i, "int64"), axis=pair_axis) for i in (0, 1))
    gate, up = (first, second) if call.gate_first else (second, first)
    # every dim dynamic; the split axis is "D" in x and "H" (its half) in y
    x_shape = [("D" if i == axis else f"d{i}") for i in range(ndim)]
    y_shape = [("H" if i == axis else f"d{i}") for i in range(ndim)]
    inputs = ([helper.make_tensor_value_info("dy", elem, y_shape)] if grad else []) + [
        helper.make_tensor_value_info("x", elem, x_shape)]
    if grad:  # both halves of dx: stacked on the pair axis, then x's shape
        dgate, dup = _gated_bwd(g, call.act.name, p, g.op("Cast", "dy", to=_elem(_GATED_CT)), gate, up)
        dfirst, dsecond = (dgate, dup) if call.gate_first else (dup, dgate)
        pa = g.ints(pair_axis)
        pair = g.op("Concat", g.op("Unsqueeze", dfirst, pa), g.op("Unsqueeze", dsecond, pa), axis=pair_axis)
        outputs = [(g.op("Reshape", pair, g.op("Shape", "x")), "dx", x_shape)]
    else:
        outputs = [(_gated_fwd(g, call.act.name, p, gate, up), "y", y_shape)]
    what = "backward" if grad else "forward"
    settings = ", ".join(f"{k}={v!r}" for k, v in {**own, **extra, "ndim": ndim}.items())
    return _gated_model(g, f"multiact_{cdef.name}_{what}", dtype, inputs, outputs,
                        f"multiact {cdef.name}({settings}) [{call.key}, {p}] {what}, {dtype}; x split along dim "
                        f"{dim} ({call.layout}); {SWIGLU_NOTE}")


# ---- bias_act: z = x * scale + b in the compute precision, the activation's graph on z in float64 ---------
# z rounds as every bias_act kernel holds it (float32 below float64: Mul and Add of float32 tensors); the
# activation's own graph (_fwd / _bwd) then runs on z in float64, times gain, clipped (Where, so NaN passes),
# rounded once.  The backward's per-channel db and dscale are float64 ReduceSums over every axis but the
# channel's; a full-shape b or scale gets dz, dz * x elementwise.

_BIAS_CT = "float64"


def _bias_act_z(g: _Graph, x: str, b: str | None, s: str | None) -> str:
    """z in float32 (x, b, s are float32 graph values), as float64."""
    z = x if s is None else g.op("Mul", x, s)
    z = z if b is None else g.op("Add", z, b)
    return g.op("Cast", z, to=_elem(_BIAS_CT))


def _bias_act_y(g: _Graph, act: str, p: dict, z: str) -> str:
    """act(z) * gain (float64), not yet clipped."""
    y = z if act == "linear" else _fwd(g, act, z, p, None)
    return y if p["gain"] == 1.0 else g.mul(y, p["gain"])


def _bias_act_fwd(g: _Graph, act: str, p: dict, z: str) -> str:
    y = _bias_act_y(g, act, p, z)
    c = p["clamp"]
    if c == math.inf:
        return y
    return g.where(g.gt(y, c), c, g.where(g.lt(y, -c), -c, y))


def _bias_act_dz(g: _Graph, act: str, p: dict, dy: str, z: str) -> str:
    """dz = act_backward(dy * gain, z), with dy * gain = 0 where |act(z) * gain| > clamp (float64)."""
    e = dy if p["gain"] == 1.0 else g.mul(dy, p["gain"])
    if p["clamp"] != math.inf:
        e = g.where(g.gt(g.abs(_bias_act_y(g, act, p, z)), p["clamp"]), 0.0, e)
    return e if act == "linear" else _bwd(g, act, e, z, p, None)


def _bias_act_params(act_p: dict, gain: float, clamp: float) -> dict:
    """The activation's parameters with gain and clamp, floats rounded to float32 (as the kernels decide)."""
    return _gated_params({**act_p, "gain": float(gain), "clamp": float(clamp)})


def _bias_model(g: _Graph, name: str, inputs: list, outputs: list[tuple[str, str, Any, Any]], doc: str):
    """A bias_act model: each (graph value, output name, shape, element type) cast once to its type."""
    import onnx
    from onnx import helper

    for value, out_name, _, elem in outputs:
        g.nodes.append(helper.make_node("Cast", [value], [out_name], to=elem))
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info(n, e, shape) for _, n, shape, e in outputs], g.inits,
                              doc_string=doc)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="multiact")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _to32(g: _Graph, v: str, dtype: str) -> str:
    return v if dtype == "float32" else g.op("Cast", v, to=_elem("float32"))


def bias_act_kernel_onnx(key: str, direction: str, dtype: str, kp: dict, forms: tuple):
    """The `bias_act:<act key>` kernel of the ONNX Runtime backends on (outer, C, inner) arrays: inputs `x`
    (backward: `dy`, `x`), then `b` and `scale` where given, as (C, 1) per channel ("c") or (O, C, I) ("f");
    outputs `y` (backward: `dx`, then `db`, `dscale` for a full-shape b / scale, then the float64 (C,)
    sums `db_sum`, `ds_sum` when asked).  forms = (b form, scale form, sum_db, sum_dscale), a form None
    where absent; kp: the activation's validated parameters, gain and clamp."""
    from onnx import helper

    from .optable import BIAS_ACT_KEYS

    if dtype not in DTYPES:
        raise ValueError(f"bias_act_kernel_onnx(): dtype must be one of {DTYPES}, got {dtype!r}")
    _, act, _ = BIAS_ACT_KEYS[key]
    bf, sf, sum_db, sum_ds = forms
    p = _bias_act_params({k: v for k, v in kp.items() if k not in ("gain", "clamp", "sum_db", "sum_dscale")},
                         kp["gain"], kp["clamp"])
    g = _Graph(_BIAS_CT)
    elem = _elem(dtype)
    full = ["O", "C", "I"]
    shapes = {"c": ["C", 1], "f": full}
    names = (["dy"] if direction == "backward" else []) + ["x"]
    inputs = [helper.make_tensor_value_info(n, elem, full) for n in names]
    for n, form in (("b", bf), ("scale", sf)):
        if form is not None:
            names.append(n)
            inputs.append(helper.make_tensor_value_info(n, elem, shapes[form]))
    v32 = {n: _to32(g, n, dtype) for n in names if n != "dy"}
    z = _bias_act_z(g, v32["x"], v32.get("b"), v32.get("scale"))
    if direction == "forward":
        outputs = [(_bias_act_fwd(g, act.name, p, z), "y", full, elem)]
    else:
        f64 = _elem(_BIAS_CT)
        dz = _bias_act_dz(g, act.name, p, g.op("Cast", "dy", to=f64), z)
        x64 = g.op("Cast", "x", to=f64)
        s64 = None if sf is None else g.op("Cast", "scale", to=f64)
        outputs = [(dz if s64 is None else g.mul(dz, s64), "dx", full, elem)]
        dzx = g.mul(dz, x64) if sf is not None else None
        if bf == "f":
            outputs.append((dz, "db", full, elem))
        if sf == "f":
            outputs.append((dzx, "dscale", full, elem))
        axes = g.ints(0, 2)
        if sum_db:
            outputs.append((g.op("ReduceSum", dz, axes, keepdims=0), "db_sum", ["C"], f64))
        if sum_ds:
            outputs.append((g.op("ReduceSum", dzx, axes, keepdims=0), "ds_sum", ["C"], f64))
    settings = ", ".join(f"{k}={val!r}" for k, val in p.items())
    return _bias_model(g, f"multiact_{key.replace(':', '_')}_{direction}", inputs, outputs,
                       f"multiact {key}({settings}; b={bf}, scale={sf}) {direction}, {dtype}")


def _bias_act_to_onnx(dtype: str, grad: Any, from_output: bool, params: dict):
    """to_onnx("bias_act", act=..., dim=..., gain=..., clamp=..., ndim=..., scale=False, **act_params): inputs
    `x` (ndim dynamic dims), `b` (x.shape[dim],) and with scale=True `scale` (the same); output `y`.  With
    grad=True: inputs `dy`, `x`, `b`[, `scale`]; outputs `dx`, `db` (summed over every axis but dim, in float64,
    then x's dtype)[, `dscale`]."""
    from onnx import helper

    from . import fused_bias_act as B

    fn = "to_onnx()"
    if dtype not in DTYPES:
        raise ValueError(f"{fn}: dtype must be one of {DTYPES}, got {dtype!r}")
    if grad not in (False, True) or from_output:
        raise ValueError(f"{fn}: bias_act exports its forward or, with grad=True, (dx, db[, dscale]) from (dy, x, "
                         "b[, scale]); it has no parameter gradient and no backward from the output")
    params = dict(params)
    ndim = params.pop("ndim", 4)
    with_scale = params.pop("scale", False)
    if isinstance(ndim, bool) or not isinstance(ndim, int | np.integer) or ndim < 1:
        raise ValueError(f"{fn}: ndim (the rank of x) must be an int >= 1, got {ndim!r}")
    if not isinstance(with_scale, bool):
        raise ValueError(f"{fn}: scale must be True or False (whether the model takes a scale input), "
                         f"got {with_scale!r}")
    ndim = int(ndim)
    own = {k: v for k, v in params.items() if k in B.DEFN.param_names}
    extra = {k: v for k, v in params.items() if k not in B.DEFN.param_names}
    call = B.resolve(own, extra, fn)
    if not -ndim <= call.dim < ndim:
        raise ValueError(f"{fn}: dim {call.dim} is out of range for x with {ndim} dims (ndim={ndim})")
    B.check_precision(call, np.dtype(dtype), fn)
    axis = call.dim % ndim
    p = _bias_act_params(call.act_p, call.kp["gain"], call.kp["clamp"])
    g = _Graph(_BIAS_CT)
    elem, f64 = _elem(dtype), _elem(_BIAS_CT)
    x_shape = [("C" if i == axis else f"d{i}") for i in range(ndim)]
    sides = ["b"] + (["scale"] if with_scale else [])
    names = (["dy"] if grad else []) + ["x"]
    inputs = [helper.make_tensor_value_info(n, elem, x_shape) for n in names]
    inputs += [helper.make_tensor_value_info(n, elem, ["C"]) for n in sides]
    tail = tuple(range(1, ndim - axis))  # (C,) -> (C, 1, ..., 1): broadcast along dim

    def along(v: str) -> str:
        return g.op("Unsqueeze", v, g.ints(*tail)) if tail else v

    v32 = {n: _to32(g, n, dtype) for n in ("x", *sides)}
    b32 = along(v32["b"])
    s32 = along(v32["scale"]) if with_scale else None
    z = _bias_act_z(g, v32["x"], b32, s32)
    if grad:
        dz = _bias_act_dz(g, call.act.name, p, g.op("Cast", "dy", to=f64), z)
        s64 = None if s32 is None else g.op("Cast", s32, to=f64)
        outputs = [(dz if s64 is None else g.mul(dz, s64), "dx", x_shape, elem)]
        others = [i for i in range(ndim) if i != axis]

        def total(v: str) -> str:  # 1-D x: one channel per element, nothing to sum
            return g.op("ReduceSum", v, g.ints(*others), keepdims=0) if others else v

        outputs.append((total(dz), "db", ["C"], elem))
        if with_scale:
            outputs.append((total(g.mul(dz, g.op("Cast", "x", to=f64))), "dscale", ["C"], elem))
    else:
        outputs = [(_bias_act_fwd(g, call.act.name, p, z), "y", x_shape, elem)]
    what = "backward" if grad else "forward"
    settings = ", ".join(f"{k}={v!r}" for k, v in {**own, **extra, "ndim": ndim, "scale": with_scale}.items())
    return _bias_model(g, f"multiact_bias_act_{what}", inputs, outputs,
                       f"multiact bias_act({settings}) [{call.key}, {p}] {what}, {dtype}; b (and scale) along dim "
                       f"{call.dim}")
