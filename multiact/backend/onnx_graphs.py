"""The ONNX graphs of every activation, forward and backward: the kernels of the `onnxruntime` and `ascend`
backends, and what `multiact.onnx_export.to_onnx` exports.

Each graph body is a small function registered against its (kernel key, direction), as formulas.py registers
the numba and CUDA formulas: `@_graph(("gelu_tanh", "forward"))`.  Bodies take a `Graph` (the builder) and its
values: forward `(g, x, p, w)`, backward `(g, dy, x, p, w)`, backward_y `(g, dy, y, p)` (an op whose y-form is
"same" runs its backward on y), param_grad `(g, dy, x, p, axis, ndim)`; `p` holds the validated parameters
rounded to float32 (`round_params`), `w` the array parameter's graph value (prelu's weight, along the axis).

accuracy="runtime" forwards are ONNX Runtime's own operators: a `@_runtime(key)` body where the op is not
one node of its definition's operator, else that node as the definition spells it (`OpDef.onnx`,
`onnx_attrs`, where its parameters are `onnx_fixed`'s), else the contract graph.  Which graphs are ORT's own
operators under accuracy="auto" (`BUILTIN_OK`) and which compute in float64 (`F64_FORWARD`,
`F64_BACKWARD`) are measured (ONNX Runtime 1.32's CPU kernels); tests/test_onnx_export.py and
tests/test_onnx_contract.py measure them again.  The gated and bias_act kernels are the activation's graphs
on the gate (times up) or on x * scale + b.  `onnx` is imported lazily.

An op added at run time (`multiact.register_op`) brings its bodies with `register(key, direction, body)`, the
public form of `@_graph`; `unregister(key)` takes them out again, and `on_change(fn)` subscribes the session
caches of the backends that run them.  Such a graph computes in float32 for float16 and float32 data (the
measured sets above name only the built-in ops); a body that needs more casts inside.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import numpy as np

from multiact import reference as R
from multiact._opdefs import F32_MAX, tanhshrink_series
from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS, OPS, OpSpec, value_key

OPSET = 20  # the default opset: Gelu with `approximate` exists from opset 20
# The lowest opset the graphs are written for: Unsqueeze's and ReduceSum's axes as inputs (13), Shape's start and
# end (15, the gated graphs' split).  ORT's own operators that a lower opset lacks (Gelu below 20, Mish below 18)
# give way to the composite there.
MIN_OPSET = 15
IR_VERSION = 10
DTYPES = ("float16", "float32")
# "auto" (the default): ORT's own operator where its measured error meets the contract (BUILTIN_OK), else the
# composite; "contract": the composite (the registered body) always; "runtime": ORT's own operators regardless.
ACCURACIES = ("auto", "contract", "runtime")

_HS_ALPHA32 = float(np.float32(1.0 / 6.0))  # hardsigmoid's alpha as the kernels hold it
_TANHSHRINK_SERIES_BELOW = 0.5
_TANHSHRINK_TERMS = 12  # (2x/pi)^2 <= 0.1 per term below 0.5: 1e-12 relative


def _always(p: Mapping[str, Any]) -> bool:
    return True


# accuracy="auto": forward one-node graphs (ORT's own operator) where ONNX Runtime 1.32's CPU kernel meets the
# op's Tolerance on the consistency suite's inputs (specials, kinks, the tails): op -> (the dtypes, the parameters
# where it does); re-checked by tests/test_onnx_export.py and tests/test_onnx_contract.py.
BUILTIN_OK: dict[str, tuple[tuple[str, ...], Callable[[Mapping[str, Any]], bool]]] = {
    "relu": (("float32", "float16"), _always),
    "relu6": (("float32", "float16"), _always),
    "hardtanh": (("float32", "float16"), _always),
    # ORT's LeakyRelu takes x = -0 as positive: a negative slope (-0.0 too) gives the wrong sign of zero
    "leaky_relu": (("float32", "float16"), lambda p: math.copysign(1.0, p["negative_slope"]) > 0),
    "hardsigmoid": (("float32", "float16"), lambda p: p["alpha"] == _HS_ALPHA32 and p["beta"] == 0.5),  # measured there
    # ORT's Softplus (a threshold of its own composed around it: Greater, Where) and logsigmoid as -Softplus(-x); a
    # beta != 1 around it (Mul, Div) rounds twice in float16 (5 ulp)
    "softplus": (("float32", "float16"), lambda p: p["beta"] == 1.0),
    "logsigmoid": (("float32", "float16"), _always),
    # ORT's Elu takes x = 0 as positive: a negative alpha (-0.0 too) gives +0 at x = +0
    "elu": (("float16",), lambda p: math.copysign(1.0, p["alpha"]) > 0),
    "tanh": (("float16",), _always),
}
# The composites that cannot meet the contract computing in float32 (measured likewise): these compute in
# float64 and round once; every other composite computes in float32 (float16 models too) and rounds once.
F64_FORWARD = frozenset({"gelu", "tanhshrink", "mish"})  # mish: softplus(x) is subnormal in float32 below -87
F64_BACKWARD = frozenset({"tanhshrink", "gelu"})  # gelu: 8.6 ulp at x = -0.073 in float32 (issue 44's rule)
# ONNX operators whose ORT CPU kernel is float32 only: a float16 model computes them in float32.
_F32_ONLY = frozenset({"Celu"})


@cache
def erfc_coeffs(degree: int = 14) -> tuple[float, ...]:
    """P with erfc(z) ~= t * exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z >= 0: least squares on libm here.

    Degree 14 on t in (0, 1] keeps the relative error near 1e-10 (checked in the tests): enough for
    float32 results computed in float64, not for float64 results.
    """
    t = np.linspace(1 / 14, 1.0, 2000)  # z from 0 to 26, where erfc still is a normal float64
    z = 2.0 / t - 2.0
    target = np.array([math.log(math.erfc(v) / tv) + v * v for v, tv in zip(z, t, strict=True)])
    return tuple(np.polynomial.polynomial.polyfit(t, target, degree))


class Graph:
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
        coeffs = erfc_coeffs()
        p = self.c(coeffs[-1])
        for coef in reversed(coeffs[:-1]):
            p = self.add(self.mul(p, t), coef)
        e = self.mul(t, self.exp(self.sub(p, self.mul(a, a))))
        return self.where(self.lt(z, 0.0), self.sub(2.0, e), e)


# ---- registration: (kernel key, direction) -> body --------------------------------------------------------

GRAPHS: dict[tuple[str, str], Callable[..., str]] = {}
RUNTIME: dict[str, Callable[..., str]] = {}  # kernel key -> its accuracy="runtime" forward, where not one node


def _graph(*keys: tuple[str, str]) -> Callable[[Callable], Callable]:
    def deco(f: Callable) -> Callable:
        for k in keys:
            GRAPHS[k] = f
        return f

    return deco


def _runtime(*keys: str) -> Callable[[Callable], Callable]:
    def deco(f: Callable) -> Callable:
        for k in keys:
            RUNTIME[k] = f
        return f

    return deco


_ADDED: set[tuple[str, str]] = set()  # the (kernel key, direction) bodies register() added
_LISTENERS: list[Callable[[str], None]] = []


def on_change(fn: Callable[[str], None]) -> Callable[[str], None]:
    """Call fn(name) with a kernel key and its op's name whenever `register` or `unregister` changes that key's
    graphs (the session caches of the onnxruntime and ascend backends subscribe here); returns fn."""
    _LISTENERS.append(fn)
    return fn


def has(key: str, direction: str) -> bool:
    """Whether kernel key `key` has a graph in `direction` (backward_y: its own, or the backward's for an op whose
    y-form is "same")."""
    spec = KEYS.get(key)
    if spec is None or not spec.has(direction):
        return False
    if direction == "backward_y" and spec.defn.y_form == "same":
        direction = "backward"
    return (key, direction) in GRAPHS


def register(key: str, direction: str, body: Callable[..., str] | None = None) -> Any:
    """Add the graph body of kernel key `key` in `direction` at run time: the public form of `@_graph((key,
    direction))`, for an op added with `multiact.register_op` (which calls this for its `graphs=`).  Without
    body, a decorator.  Returns body.

    body is written as the bodies here are (see the module's docstring): forward `body(g, x, p, w)`, backward
    `body(g, dy, x, p, w)`, backward_y `body(g, dy, y, p)`, param_grad `body(g, dy, x, p, axis, ndim)`, on the
    `Graph` g, returning the result's graph value.  It runs on the onnxruntime and ascend backends and in
    `multiact.to_onnx` as soon as it is registered.  ValueError for an unknown kernel key, a direction the op
    does not have (backward_y where its y-form is "same": the backward's graph runs on y), or one with a body."""
    if body is None:
        return lambda fn: register(key, direction, fn)
    spec = KEYS.get(key)
    where = f"onnx_graphs.register({key!r}, {direction!r})"
    if spec is None:
        raise ValueError(f"{where}: unknown kernel key; add the op first (multiact.register_op)")
    if not spec.has(direction) or (direction == "backward_y" and spec.defn.y_form == "same"):
        raise ValueError(f"{where}: {spec.name} has no {direction} graph of its own (its definition and references "
                         "say which directions it has; a y-form 'same' runs the backward's graph on y)")
    if (key, direction) in GRAPHS:
        raise ValueError(f"{where}: it has a graph already")
    if not callable(body):
        raise TypeError(f"{where}: a graph body is a function, got {type(body).__name__}")
    GRAPHS[(key, direction)] = body
    _ADDED.add((key, direction))
    _changed(key)
    return body


def unregister(key: str) -> None:
    """Take out every body `register` added for kernel key `key` (built-in graphs stay; none is no error)."""
    added = {k for k in _ADDED if k[0] == key}
    if not added:
        return
    for k in added:
        del GRAPHS[k]
    _ADDED.difference_update(added)
    _changed(key)


def _changed(key: str) -> None:
    """Tell the subscribed session caches (by the key and its op's name: sessions are made per op), and the
    registry (its choices read each backend's supports())."""
    from multiact import registry

    names = {key} | ({KEYS[key].name} if key in KEYS else set())
    for fn in list(_LISTENERS):
        for n in names:
            fn(n)
    registry.clear_cache()


def forward(g: Graph, key: str, x: str, p: dict, w: str | None = None) -> str:
    return GRAPHS[(key, "forward")](g, x, p, w)


def backward(g: Graph, key: str, dy: str, x: str, p: dict, w: str | None = None) -> str:
    return GRAPHS[(key, "backward")](g, dy, x, p, w)


def backward_y(g: Graph, key: str, dy: str, y: str, p: dict) -> str:
    """Backward from the output y (only where spec.supports_y)."""
    if KEYS[key].defn.y_form == "same":
        return backward(g, key, dy, y, p)  # same formula: y > 0 exactly where x > 0
    return GRAPHS[(key, "backward_y")](g, dy, y, p)


def param_grad(g: Graph, key: str, dy: str, x: str, p: dict, axis: int | None, ndim: int) -> str:
    """The parameter gradient, float64: a sum over every element (a scalar parameter) or per channel."""
    return GRAPHS[(key, "param_grad")](g, dy, x, p, axis, ndim)


# ---- helpers --------------------------------------------------------------------------------------------


def _swish_gate(g: Graph, x: str, k: float) -> tuple[str, str, str]:
    xc = g.clip(x, -g.big, g.big)
    kx = g.mul(xc, k)
    return g.sigmoid(kx), g.sigmoid(g.neg(kx)), xc


def _gelu_tanh_parts(g: Graph, x: str) -> tuple[str, str, str]:
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


def _pass_where(g: Graph, dy: str, x: str, cond: str) -> str:
    return g.keepnan(x, g.select(cond, dy, 0.0))


# ---- forward bodies: (graph, x, params, weight) -> y, in the graph's compute dtype ---------------------


@_graph(("relu", "forward"))
def _relu(g, x, p, w):  # the reference's formula: x = -0 stays -0 (Max(-0, 0) would give +0), NaN stays
    return g.where(g.lt(x, 0.0), 0.0, x)


@_graph(("relu6", "forward"))
def _relu6(g, x, p, w):
    return g.clip(x, 0.0, 6.0)


@_graph(("hardtanh", "forward"))
def _hardtanh(g, x, p, w):
    return g.clip(x, p["min_val"], p["max_val"])


@_graph(("leaky_relu", "forward"))
def _leaky_relu(g, x, p, w):
    return g.where(g.gt(x, 0.0), x, g.mul(x, p["negative_slope"]))


@_graph(("prelu", "forward"))
def _prelu(g, x, p, w):
    return g.where(g.gt(x, 0.0), x, g.mul(x, w))


@_graph(("elu", "forward"))
def _elu(g, x, p, w):
    return g.where(g.gt(x, 0.0), x, g.mul(g.expm1(x), p["alpha"]))


@_graph(("selu", "forward"))
def _selu(g, x, p, w):
    return g.where(g.gt(x, 0.0), g.mul(x, p["scale"]), g.mul(g.expm1(x), _selu_sa(p)))


@_graph(("celu", "forward"))
def _celu(g, x, p, w):
    a = p["alpha"]
    return g.where(g.gt(x, 0.0), x, g.mul(g.expm1(g.div(x, a)), a))


@_graph(("gelu", "forward"))
def _gelu(g, x, p, w):
    return g.gated(x, g.mul(g.erfc(g.mul(x, -1.0 / math.sqrt(2.0))), 0.5))


@_graph(("gelu_tanh", "forward"))
def _gelu_tanh(g, x, p, w):
    return g.gated(x, _gelu_tanh_parts(g, x)[0])


def _x_sigmoid(g: Graph, x: str, k: float) -> str:
    return g.gated(x, _swish_gate(g, x, k)[0])


@_graph(("fast_gelu", "forward"))
def _fast_gelu(g, x, p, w):
    return _x_sigmoid(g, x, R.FAST_GELU_K)


@_graph(("silu", "forward"))
def _silu(g, x, p, w):
    return _x_sigmoid(g, x, 1.0)


@_graph(("swish", "forward"))
def _swish(g, x, p, w):
    return _x_sigmoid(g, x, p["beta"])


@_graph(("hardswish", "forward"))
def _hardswish(g, x, p, w):
    mid = g.div(g.mul(x, g.add(x, 3.0)), 6.0)
    return g.where(g.le(x, -3.0), 0.0, g.where(g.ge(x, 3.0), x, mid))


@_graph(("hardsigmoid", "forward"))
def _hardsigmoid(g, x, p, w):
    c, d, lo, hi = _hardsigmoid_pieces(p)
    return g.where(g.le(x, lo), 0.0, g.where(g.ge(x, hi), 1.0, g.div(g.add(x, c), d)))


@_graph(("sigmoid", "forward"))
def _sigmoid(g, x, p, w):
    return g.sigmoid(x)


@_graph(("logsigmoid", "forward"))
def _logsigmoid(g, x, p, w):
    return g.sub(g.op("Min", x, g.c(0.0)), g.log1p(g.exp(g.neg(g.abs(x)))))


@_graph(("tanh", "forward"))
def _tanh(g, x, p, w):
    if g.ct == np.float32:  # ORT's float32 Tanh is 48 ulp off at the smallest normal; tanh(x) = x there
        return g.select(g.lt(g.abs(x), 2.0**-12), x, g.op("Tanh", x))  # select: keeps x = -0
    return g.op("Tanh", x)


@_graph(("softplus", "forward"))
def _softplus(g, x, p, w):
    b = p["beta"]
    z = g.mul(x, b)
    return g.select(g.gt(z, p["threshold"]), x, g.div(g.softplus0(z), b))


@_graph(("softsign", "forward"))
def _softsign(g, x, p, w):
    return g.where(g.op("IsInf", x), g.op("Sign", x), g.div(x, g.add(g.abs(x), 1.0)))


@_graph(("mish", "forward"))
def _mish(g, x, p, w):
    return g.gated(x, g.op("Tanh", g.softplus0(x)))


@_graph(("softshrink", "forward"))
def _softshrink(g, x, p, w):
    lam = p["lambd"]
    r = g.where(g.gt(x, lam), g.sub(x, lam), g.where(g.lt(x, -lam), g.add(x, lam), 0.0))
    return g.keepnan(x, r)


@_graph(("hardshrink", "forward"))
def _hardshrink(g, x, p, w):
    return g.keepnan(x, g.where(g.gt(g.abs(x), p["lambd"]), x, 0.0))


@_graph(("tanhshrink", "forward"))
def _tanhshrink(g, x, p, w):
    x2 = g.mul(x, x)
    coefs = tanhshrink_series(_TANHSHRINK_TERMS)
    acc = g.c(coefs[-1])
    for coef in reversed(coefs[:-1]):
        acc = g.add(g.mul(acc, x2), coef)
    series = g.mul(g.mul(acc, x2), x)
    r = g.where(g.lt(g.abs(x), _TANHSHRINK_SERIES_BELOW), series, g.sub(x, g.op("Tanh", x)))
    return g.where(g.eq(r, 0.0), 0.0, r)  # a zero result is +0, as x - tanh(x) gives at x = -0


@_graph(("threshold", "forward"))
def _threshold(g, x, p, w):
    return g.where(g.le(x, p["threshold"]), p["value"], x)


@_graph(("linear", "forward"))
def _linear(g, x, p, w):  # bias_act's own activation, the identity: no node
    return x


# ---- backward bodies: (graph, dy, x, params, weight) -> dx -------------------------------------------


@_graph(("relu", "backward"))
def _relu_grad(g, dy, x, p, w):
    return _pass_where(g, dy, x, g.gt(x, 0.0))


@_graph(("relu6", "backward"))
def _relu6_grad(g, dy, x, p, w):
    return _pass_where(g, dy, x, g.op("And", g.gt(x, 0.0), g.lt(x, 6.0)))


@_graph(("hardtanh", "backward"))
def _hardtanh_grad(g, dy, x, p, w):
    return _pass_where(g, dy, x, g.op("And", g.gt(x, p["min_val"]), g.lt(x, p["max_val"])))


@_graph(("leaky_relu", "backward"))
def _leaky_relu_grad(g, dy, x, p, w):
    return g.keepnan(x, g.select(g.gt(x, 0.0), dy, g.mul(dy, p["negative_slope"])))


@_graph(("prelu", "backward"))
def _prelu_grad(g, dy, x, p, w):
    return g.keepnan(x, g.select(g.gt(x, 0.0), dy, g.mul(dy, w)))


@_graph(("softshrink", "backward"), ("hardshrink", "backward"))
def _shrink_grad(g, dy, x, p, w):
    return _pass_where(g, dy, x, g.gt(g.abs(x), p["lambd"]))


@_graph(("threshold", "backward"))
def _threshold_grad(g, dy, x, p, w):
    return g.keepnan(x, g.where(g.le(x, p["threshold"]), 0.0, dy))


@_graph(("hardsigmoid", "backward"))
def _hardsigmoid_grad(g, dy, x, p, w):
    _, d, lo, hi = _hardsigmoid_pieces(p)
    inside = g.op("And", g.gt(x, lo), g.lt(x, hi))
    return g.keepnan(x, g.select(inside, g.div(dy, d), 0.0))


@_graph(("hardswish", "backward"))
def _hardswish_grad(g, dy, x, p, w):
    mid = g.mul(dy, g.add(g.div(x, 3.0), 0.5))
    return g.keepnan(x, g.where(g.le(x, -3.0), 0.0, g.select(g.lt(x, 3.0), mid, dy)))


@_graph(("elu", "backward"))
def _elu_grad(g, dy, x, p, w):
    return g.select(g.gt(x, 0.0), dy, g.mul(dy, g.mul(g.exp(x), p["alpha"])))


@_graph(("selu", "backward"))
def _selu_grad(g, dy, x, p, w):
    return g.select(g.gt(x, 0.0), g.mul(dy, p["scale"]), g.mul(dy, g.mul(g.exp(x), _selu_sa(p))))


@_graph(("celu", "backward"))
def _celu_grad(g, dy, x, p, w):
    return g.select(g.gt(x, 0.0), dy, g.mul(dy, g.exp(g.div(x, p["alpha"]))))


@_graph(("sigmoid", "backward"))
def _sigmoid_grad(g, dy, x, p, w):
    return g.mul(dy, g.mul(g.sigmoid(x), g.sigmoid(g.neg(x))))


@_graph(("logsigmoid", "backward"))
def _logsigmoid_grad(g, dy, x, p, w):
    return g.mul(dy, g.sigmoid(g.neg(x)))


@_graph(("tanh", "backward"))
def _tanh_grad(g, dy, x, p, w):
    return g.mul(dy, g.sech2(x))


@_graph(("softplus", "backward"))
def _softplus_grad(g, dy, x, p, w):
    z = g.mul(x, p["beta"])
    return g.keepnan(x, g.select(g.gt(z, p["threshold"]), dy, g.mul(dy, g.sigmoid(z))))


@_graph(("softsign", "backward"))
def _softsign_grad(g, dy, x, p, w):  # divided twice: (1 + |x|)^2 overflows float32 for |x| >= 1.8e19
    d = g.add(g.abs(x), 1.0)
    return g.div(g.div(dy, d), d)


def _x_sigmoid_grad(g: Graph, dy: str, x: str, k: float) -> str:
    s, sn, xc = _swish_gate(g, x, k)
    return g.mul(dy, g.add(s, g.mul(g.mul(g.mul(xc, s), sn), k)))


@_graph(("fast_gelu", "backward"))
def _fast_gelu_grad(g, dy, x, p, w):
    return _x_sigmoid_grad(g, dy, x, R.FAST_GELU_K)


@_graph(("silu", "backward"))
def _silu_grad(g, dy, x, p, w):
    return _x_sigmoid_grad(g, dy, x, 1.0)


@_graph(("swish", "backward"))
def _swish_grad(g, dy, x, p, w):
    return _x_sigmoid_grad(g, dy, x, p["beta"])


@_graph(("gelu_tanh", "backward"))
def _gelu_tanh_grad(g, dy, x, p, w):
    s, sn, xc = _gelu_tanh_parts(g, x)
    dz = g.mul(g.add(g.mul(g.mul(xc, xc), 3 * R.GELU_TANH_C), 1.0), 2 * R.GELU_TANH_K)
    return g.mul(dy, g.add(s, g.mul(g.mul(g.mul(xc, s), sn), dz)))


@_graph(("gelu", "backward"))
def _gelu_grad(g, dy, x, p, w):
    xc = g.clip(x, -1e5, 1e5)
    cdf = g.mul(g.erfc(g.mul(x, -1.0 / math.sqrt(2.0))), 0.5)
    pdf = g.mul(g.exp(g.mul(g.mul(xc, xc), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    return g.mul(dy, g.add(cdf, g.mul(xc, pdf)))


@_graph(("mish", "backward"))
def _mish_grad(g, dy, x, p, w):
    sp = g.softplus0(x)
    xc = g.clip(x, -g.big, g.big)
    return g.mul(dy, g.add(g.op("Tanh", sp), g.mul(g.mul(xc, g.sigmoid(x)), g.sech2(sp))))


@_graph(("tanhshrink", "backward"))
def _tanhshrink_grad(g, dy, x, p, w):
    t = g.op("Tanh", x)
    return g.mul(dy, g.mul(t, t))


@_graph(("linear", "backward"))
def _linear_grad(g, dy, x, p, w):
    return dy


# ---- backward from the output y: (graph, dy, y, params) -> dx (the y-form "own" ops) --------------------


@_graph(("elu", "backward_y"))
def _elu_grad_y(g, dy, y, p):
    return g.select(g.gt(y, 0.0), dy, g.mul(dy, g.add(y, p["alpha"])))


@_graph(("selu", "backward_y"))
def _selu_grad_y(g, dy, y, p):
    return g.select(g.gt(y, 0.0), g.mul(dy, p["scale"]), g.mul(dy, g.add(y, _selu_sa(p))))


@_graph(("celu", "backward_y"))
def _celu_grad_y(g, dy, y, p):
    return g.select(g.gt(y, 0.0), dy, g.mul(dy, g.add(g.div(y, p["alpha"]), 1.0)))


@_graph(("sigmoid", "backward_y"))
def _sigmoid_grad_y(g, dy, y, p):
    return g.mul(dy, g.mul(y, g.sub(1.0, y)))


@_graph(("tanh", "backward_y"))
def _tanh_grad_y(g, dy, y, p):
    return g.mul(dy, g.mul(g.sub(1.0, y), g.add(y, 1.0)))


# ---- parameter gradients: (graph, dy, x, params, axis, ndim) -> float64 sums -----------------------------


@_graph(("swish", "param_grad"))
def _swish_beta_grad(g, dy, x, p, axis, ndim):
    s, sn, xc = _swish_gate(g, x, p["beta"])
    prod = g.mul(dy, g.mul(g.mul(xc, s), g.mul(xc, sn)))
    return g.op("ReduceSum", prod, keepdims=0)


@_graph(("prelu", "param_grad"))
def _prelu_weight_grad(g, dy, x, p, axis, ndim):  # one sum per channel: over every axis but `axis` (rank 0: itself)
    contrib = g.where(g.gt(x, 0.0), 0.0, g.mul(x, dy))
    if ndim is None:  # x of unknown rank: the other axes from the rank in the graph
        rank = g.op("Size", g.op("Shape", x))
        a = g.c(axis, "int64") if axis >= 0 else g.op("Add", rank, g.c(axis, "int64"))
        one, zero = g.c(1, "int64"), g.c(0, "int64")
        others = g.op("Concat", g.op("Range", zero, a, one), g.op("Range", g.op("Add", a, one), rank, one), axis=0)
        return g.op("ReduceSum", contrib, others, keepdims=0, noop_with_empty_axes=1)
    others = [i for i in range(ndim) if i != axis]
    return g.op("ReduceSum", contrib, g.ints(*others), keepdims=0) if others and axis is not None else contrib


# ---- accuracy="runtime": ORT's own operators --------------------------------------------------------------


@_runtime("relu6")
def _relu6_runtime(g, x, p, w):  # Clip at 0 and 6 (a Clip node reads back as hardtanh, whose bounds it carries)
    return g.clip(x, 0.0, 6.0)


@_runtime("prelu")
def _prelu_runtime(g, x, p, w):  # the weight along any axis (the graph broadcasts it there)
    return g.op("PRelu", x, w)


@_runtime("softplus")
def _softplus_runtime(g, x, p, w):  # ORT's Softplus has no beta or threshold
    if p["beta"] == 1.0 and p["threshold"] >= 20.0:
        return g.op("Softplus", x)
    z = g.mul(x, p["beta"])
    return g.where(g.gt(z, p["threshold"]), x, g.div(g.op("Softplus", z), p["beta"]))


def _x_sigmoid_runtime(g: Graph, x: str, k: float) -> str:
    return g.mul(x, g.op("Sigmoid", x if k == 1.0 else g.mul(x, k)))


@_runtime("fast_gelu")
def _fast_gelu_runtime(g, x, p, w):
    return _x_sigmoid_runtime(g, x, R.FAST_GELU_K)


@_runtime("silu")
def _silu_runtime(g, x, p, w):
    return _x_sigmoid_runtime(g, x, 1.0)


@_runtime("swish")
def _swish_runtime(g, x, p, w):
    return _x_sigmoid_runtime(g, x, p["beta"])


@_runtime("logsigmoid")
def _logsigmoid_runtime(g, x, p, w):
    return g.neg(g.op("Softplus", g.neg(x)))


@_runtime("tanhshrink")
def _tanhshrink_runtime(g, x, p, w):
    return g.sub(x, g.op("Tanh", x))


def _one_node(spec: OpSpec, p: Mapping[str, Any]) -> bool:
    """Whether the op at these parameters is one node of its definition's ONNX operator."""
    d = spec.defn
    return bool(d.onnx) and bool(d.onnx_attrs or not d.params) and all(p[k] == v for k, v in d.onnx_fixed.items())


def runtime_graph(spec: OpSpec, key: str, p: Mapping[str, Any]) -> str | None:
    """What accuracy="runtime" exports for the forward: "registered" (a `@_runtime` body), "node" (the definition's
    ONNX operator, one node), or None (no ORT operator computes it: the contract's graph)."""
    if key in RUNTIME:
        return "registered"
    return "node" if _one_node(spec, p) else None


def runtime_forward(g: Graph, spec: OpSpec, key: str, x: str, p: dict, w: str | None) -> str:
    """The forward with ONNX's own operators (accuracy="runtime"'s graph)."""
    kind = runtime_graph(spec, key, p)
    if kind == "registered":
        return RUNTIME[key](g, x, p, w)
    if kind is None:
        return forward(g, key, x, p, w)
    d = spec.defn
    inputs, attrs = [x], {}
    for a, v in d.onnx_attrs.items():
        value = p[v] if isinstance(v, str) else v
        if a.startswith("input"):  # the node's inputs after x: the array parameter's graph value, or a constant
            inputs.append(w if v == d.array_param else g.c(value))
        else:
            attrs[a] = value
    return g.op(d.onnx, *inputs, **attrs)


def uses_builtin(spec: OpSpec, dtype: str, p: Mapping[str, Any]) -> bool:
    """Whether ORT's own operator meets the contract for the forward (measured: see BUILTIN_OK)."""
    dtypes, when = BUILTIN_OK.get(spec.name, ((), _always))
    return dtype in dtypes and when(p)


@cache
def onnx_has(op_type: str, opset: int) -> bool:
    """Whether ONNX's default domain has op_type at this opset."""
    import onnx.defs

    try:
        onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True


def forward_form(spec: OpSpec, key: str, dtype: str, p: Mapping[str, Any], accuracy: str = "auto",
                 opset: int = OPSET, tensor_params: tuple[str, ...] = ()) -> str | None:
    """What the forward graph is: runtime_graph's kind ("registered" or "node": ORT's own operators) or None (the
    registered composite).  accuracy="contract" always the composite; "auto" ORT's operator where BUILTIN_OK says it
    meets the contract (never for a parameter given as a tensor, whose value is not known); "runtime" ORT's
    operators regardless; all three the composite where ORT's operators do not exist at `opset`."""
    if accuracy == "contract" or (accuracy == "auto" and (tensor_params or not uses_builtin(spec, dtype, p))):
        return None
    kind = runtime_graph(spec, key, p)
    if kind is None or (kind == "node" and tensor_params):  # a node's attributes are values
        return None
    g = Graph(dtype)  # the ORT graph built aside, to see which operators it needs
    w = "w" if spec.defn.array_param else None
    runtime_forward(g, spec, key, "x", dict(p), w)
    return kind if all(onnx_has(n.op_type, opset) for n in g.nodes) else None


def compute_dtype(spec: OpSpec, direction: str, dtype: str, form: str | None, accuracy: str) -> str:
    """The dtype the graph computes in: dtype itself for ORT's own operators (form not None; float32 for float16
    where ORT's kernel is float32 only), float32 for the composites that meet the contract there, float64 for the
    rest (and every parameter gradient, a sum)."""
    if direction == "param_grad":
        return "float64"
    if direction == "forward" and form is not None:
        f32_only = form == "node" and spec.defn.onnx in _F32_ONLY
        return "float32" if f32_only and dtype == "float16" else dtype
    if accuracy == "runtime" and direction == "forward":
        return "float32"
    # a backward has no ORT operator to trade accuracy for: the same graph in every mode
    f64 = F64_FORWARD if direction == "forward" else F64_BACKWARD
    return "float64" if spec.name in f64 else "float32"


# ---- the model of one activation kernel -------------------------------------------------------------------


def check_opset(opset: Any, fn: str) -> int:
    """opset as an int in [MIN_OPSET, the installed onnx's newest]; ValueError naming fn otherwise."""
    import onnx.defs

    top = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int | np.integer) or not MIN_OPSET <= opset <= top:
        raise ValueError(f"{fn}: opset must be an int from {MIN_OPSET} (the graphs' own operators) to {top} (the "
                         f"installed onnx's newest), got {opset!r}")
    return int(opset)


def make_model(graph: Any, opset: int = OPSET) -> Any:
    """A checked model of graph at `opset` (the IR version that opset needs, at least IR_VERSION)."""
    from onnx import helper

    imports = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=imports, producer_name="multiact")
    model.ir_version = max(IR_VERSION, helper.find_min_ir_version_for(imports))
    check(model)
    return model


def check(model: Any) -> None:
    """onnx.checker on model.  An input or output of unknown rank has no `shape` field, as ONNX's IR allows and
    ONNX Runtime takes; the checker wants the field on a graph's inputs and outputs, so it checks a copy where
    those have one (empty)."""
    import onnx

    g = model.graph
    if all(v.type.tensor_type.HasField("shape") for v in (*g.input, *g.output)):
        onnx.checker.check_model(model)
        return
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for v in (*copy.graph.input, *copy.graph.output):
        v.type.tensor_type.shape.SetInParent()
    onnx.checker.check_model(copy)


def round_params(spec: OpSpec, params: Mapping[str, Any]) -> dict:
    """Validated params with floats rounded to float32, as every backend decides with them."""
    if spec.defn.array_param:
        params = {spec.defn.array_param: None, **params}
    p = spec.validate(params)
    return {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in p.items()}


def elem(dtype: str) -> int:
    from onnx import TensorProto

    return {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}[dtype]


def default_shape(spec: OpSpec) -> list[str]:
    """The inputs' shape where none is given: 1-D "N"; an op with an array parameter (N, C, S), channels on axis 1."""
    return ["N", "C", "S"] if spec.defn.array_param else ["N"]


def activation_model(spec: OpSpec, p: dict, direction: str, dtype: str, x_shape: list | None, axis: int | None,
                     accuracy: str = "auto", opset: int = OPSET, tensor_params: tuple[str, ...] = ()) -> Any:
    """The model of one op's kernel in `direction` (forward, backward, backward_y, param_grad), p from
    round_params: inputs `x` (backward: `dy`, `x`; backward_y: `dy`, `y`) of x_shape in dtype (None: any rank),
    and the array parameter (1-D "W", broadcast along `axis`, a non-negative axis of x_shape, or any axis where the
    rank is unknown); output `y`, `dx` or `dparam` (float64).  tensor_params: scalar parameters that are inputs of
    the model (0-d, dtype) instead of constants (a learned swish beta)."""
    from onnx import helper

    op, key, array = spec.name, spec.kernel_key(p), spec.defn.array_param
    pgrad = direction == "param_grad"
    grad = direction != "forward"
    what = "param_grad" if pgrad else ("backward" if grad else "forward")
    ndim = None if x_shape is None else len(x_shape)
    form = forward_form(spec, key, dtype, p, accuracy, opset, tensor_params) if what == "forward" else None
    ct = compute_dtype(spec, what, dtype, form, accuracy)
    g = Graph(ct)
    el = elem(dtype)
    names = ["dy", "y" if direction == "backward_y" else "x"] if grad else ["x"]
    inputs = [helper.make_tensor_value_info(n, el, x_shape) for n in names]
    if array and not pgrad:
        names.append(array)
        inputs.append(helper.make_tensor_value_info(array, el, ["W"]))
    for n in tensor_params:
        names.append(n)
        inputs.append(helper.make_tensor_value_info(n, el, []))

    def cast_in(n: str) -> str:
        return n if ct == dtype else g.op("Cast", n, to=elem(ct))

    vals = {n: cast_in(n) for n in names}
    p = {**p, **{n: vals[n] for n in tensor_params}}
    if array in vals:
        vals[array] = along_axis(g, vals[array], "x" if "x" in names else "y", axis, ndim)
    weight = vals.get(array) if array else None
    if form is not None:
        out = runtime_forward(g, spec, key, vals["x"], p, weight)
    elif pgrad:
        out = param_grad(g, key, vals["dy"], vals["x"], p, axis, ndim)
    elif direction == "backward_y":
        out = backward_y(g, key, vals["dy"], vals["y"], p)
    elif grad:
        out = backward(g, key, vals["dy"], vals["x"], p, weight)
    else:
        out = forward(g, key, vals["x"], p, weight)

    out_name = "dparam" if pgrad else ("dx" if grad else "y")
    out_elem = elem("float64") if pgrad else el
    if pgrad:  # a scalar parameter's gradient is one sum; an array parameter's one per channel
        out_shape: list | None = ["W"] if spec.defn.param_grad == array and ndim != 0 else []
    else:
        out_shape = x_shape
    if (ct == dtype or pgrad) and g.nodes and g.nodes[-1].output[0] == out:
        g.nodes[-1].output[0] = out_name
    elif ct == dtype or pgrad:
        g.nodes.append(helper.make_node("Identity", [out], [out_name]))
    else:
        g.nodes.append(helper.make_node("Cast", [out], [out_name], to=el))
    label = f"d{spec.defn.param_grad}" if pgrad else direction
    settings = ", ".join(f"{k}={v!r}" for k, v in p.items() if k != array and k not in tensor_params)
    graph = helper.make_graph(
        g.nodes, f"multiact_{op}_{label}", inputs,
        [helper.make_tensor_value_info(out_name, out_elem, out_shape)], g.inits,
        doc_string=f"multiact {op}({settings}) {label}, {dtype}, accuracy={accuracy}, computed in {ct}",
    )
    return make_model(graph, opset)


# The longest shape a weight along an axis of an input of unknown rank is reshaped to: [-1, 1, ..., 1]
_MAX_RANK = 64


def along_axis(g: Graph, w: str, x: str, axis: int | None, ndim: int | None) -> str:
    """A 1-D weight (W,) as (W, 1, ..., 1): along `axis` of x (rank 0: the one weight as a scalar).  Where x's rank
    is unknown (ndim None) a negative axis still fixes the trailing ones; a non-negative one takes them from the
    rank in the graph (Shape(Shape(x)))."""
    if ndim == 0:
        return g.op("ReduceMax", w, keepdims=0)
    if ndim is not None:
        return g.op("Unsqueeze", w, g.ints(*range(1, ndim - axis))) if ndim - axis > 1 else w
    if axis < 0:
        return g.op("Unsqueeze", w, g.ints(*range(1, -axis))) if axis < -1 else w
    rank = g.op("Shape", g.op("Shape", x))
    n = g.op("Max", g.op("Min", rank, g.op("Sub", rank, g.ints(axis))), g.ints(0))  # rank - axis; 0 at rank 0
    target = g.op("Slice", g.ints(-1, *([1] * (_MAX_RANK - 1))), g.ints(0), n)
    return g.op("Reshape", w, target)


def kernel_model(op: str, direction: str, dtype: str, params: Mapping[str, Any]) -> Any:
    """The onnxruntime / ascend backends' kernel of one op (accuracy="auto"): 1-D inputs, or (N, C, S) with
    the weight along axis 1 for an op with an array parameter (the backends reshape to it)."""
    spec = OPS[op]
    p = round_params(spec, params)
    shape = default_shape(spec)
    return activation_model(spec, p, direction, dtype, shape, 1 if spec.defn.array_param else None)


# ---- the gated family (glu, swiglu, geglu, reglu): the activation's graph on the gate, times up ------
# Every gated graph is a composite at opset 20 (ONNX's SwiGLU, opset 28, does not run on ONNX Runtime 1.32: see
# multiact.onnx_export.SWIGLU_NOTE): the activation's own graph on the clipped gate, times the clipped up, all in
# float64 and rounded once, which keeps the product within the activation's bound + 1 ulp (float16 and float32).
GATED_CT = "float64"


def _gated_clip(g: Graph, gate: str, up: str, kp: dict) -> tuple[str, str]:
    """(min(gate, limit), clamp(up, -limit, limit) + shift); NaN stays NaN (Where, not Min/Clip, whose
    NaN handling ONNX leaves open); nothing at all without a limit."""
    limit = kp["limit"]
    if limit == math.inf:
        return gate, up
    gc = g.where(g.gt(gate, limit), limit, gate)
    uc = g.where(g.gt(up, limit), limit, g.where(g.lt(up, -limit), -limit, up))
    return gc, (g.add(uc, kp["shift"]) if kp["shift"] else uc)


def _held(g: Graph, v: str) -> str:
    """v as a float32 kernel holds it: +-inf beyond float32's range (float16 and float32 kernels compute
    in float32, so act(g) and dy * u overflow there, as PyTorch's silu(a) * b does), else v unrounded."""
    return g.where(g.gt(g.abs(v), F32_MAX), g.mul(v, math.inf), v)


def gated_forward(g: Graph, act_key: str, kp: dict, gate: str, up: str) -> str:
    """act(min(gate, limit)) * (clamp(up, -limit, limit) + shift): the activation's graph (kernel key act_key)."""
    gc, uc = _gated_clip(g, gate, up, kp)
    return g.mul(_held(g, forward(g, act_key, gc, kp)), uc)


def gated_backward(g: Graph, act_key: str, kp: dict, dy: str, gate: str, up: str) -> tuple[str, str]:
    """(dgate, dup) = (act_backward(dy * u, g), dy * act(g)), zero where the clip is hit."""
    gc, uc = _gated_clip(g, gate, up, kp)
    dgate = backward(g, act_key, _held(g, g.mul(dy, uc)), gc, kp)
    dup = g.mul(dy, _held(g, forward(g, act_key, gc, kp)))
    limit = kp["limit"]
    if limit != math.inf:
        dgate = g.where(g.gt(gate, limit), 0.0, dgate)
        dup = g.where(g.gt(g.abs(up), limit), 0.0, dup)
    return dgate, dup


def gated_params(kp: dict) -> dict:
    """The kernel parameters with floats rounded to float32, as every backend decides with them."""
    return {k: float(np.float32(v)) if isinstance(v, float) and math.isfinite(v) else v for k, v in kp.items()}


def gated_model(g: Graph, name: str, dtype: str, inputs: list, outputs: list[tuple[str, str, Any]], doc: str,
                opset: int = OPSET):
    """The model of a gated graph: each (graph value, output name, shape) cast once to dtype."""
    from onnx import helper

    el = elem(dtype)
    for value, out_name, _ in outputs:
        g.nodes.append(helper.make_node("Cast", [value], [out_name], to=el))
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info(n, el, shape) for _, n, shape in outputs], g.inits,
                              doc_string=doc)
    return make_model(graph, opset)


def gated_kernel_onnx(key: str, direction: str, dtype: str, kp: dict, opset: int = OPSET):
    """The `gated:<act key>` kernel of the ONNX Runtime backends: 1-D inputs of one dynamic length,
    `gate`, `up` (backward: `dy`, `gate`, `up`), outputs `y` (backward: `dgate`, `dup`).  kp holds the
    activation's validated parameters and the family's scalars (limit, shift)."""
    from onnx import helper

    if dtype not in DTYPES:
        raise ValueError(f"gated_kernel_onnx(): dtype must be one of {DTYPES}, got {dtype!r}")
    _, _, act_key = FAMILY_KEYS[key]
    p = gated_params(kp)
    g = Graph(GATED_CT)
    names = ("dy", "gate", "up") if direction == "backward" else ("gate", "up")
    inputs = [helper.make_tensor_value_info(n, elem(dtype), ["N"]) for n in names]
    v = {n: g.op("Cast", n, to=elem(GATED_CT)) for n in names}
    if direction == "backward":
        dgate, dup = gated_backward(g, act_key, p, v["dy"], v["gate"], v["up"])
        outputs = [(dgate, "dgate", ["N"]), (dup, "dup", ["N"])]
    else:
        outputs = [(gated_forward(g, act_key, p, v["gate"], v["up"]), "y", ["N"])]
    settings = ", ".join(f"{k}={val!r}" for k, val in p.items())
    return gated_model(g, f"multiact_{key.replace(':', '_')}_{direction}", dtype, inputs, outputs,
                        f"multiact {key}({settings}) {direction}, {dtype}", opset)


# ---- bias_act: z = x * scale + b in the compute precision, the activation's graph on z in float64 ---------
# z rounds as every bias_act kernel holds it (float32 below float64: Mul and Add of float32 tensors); the
# activation's own graph then runs on z in float64, times gain, clipped (Where, so NaN passes), rounded once.
# The backward's per-channel db and dscale are float64 ReduceSums over every axis but the channel's; a
# full-shape b or scale gets dz, dz * x elementwise.  bias_act's own activation, linear, has graphs of its own
# (the identity).

BIAS_CT = "float64"


def bias_act_z(g: Graph, x: str, b: str | None, s: str | None) -> str:
    """z in float32 (x, b, s are float32 graph values), as float64."""
    z = x if s is None else g.op("Mul", x, s)
    z = z if b is None else g.op("Add", z, b)
    return g.op("Cast", z, to=elem(BIAS_CT))


def _bias_act_y(g: Graph, act_key: str, p: dict, z: str) -> str:
    """act(z) * gain (float64), not yet clipped."""
    y = forward(g, act_key, z, p)
    return y if p["gain"] == 1.0 else g.mul(y, p["gain"])


def bias_act_forward(g: Graph, act_key: str, p: dict, z: str) -> str:
    """clip(act(z) * gain, -clamp, clamp) (float64; Where, so NaN passes)."""
    y = _bias_act_y(g, act_key, p, z)
    c = p["clamp"]
    if c == math.inf:
        return y
    return g.where(g.gt(y, c), c, g.where(g.lt(y, -c), -c, y))


def bias_act_dz(g: Graph, act_key: str, p: dict, dy: str, z: str) -> str:
    """dz = act_backward(dy * gain, z), with dy * gain = 0 where |act(z) * gain| > clamp (float64)."""
    e = dy if p["gain"] == 1.0 else g.mul(dy, p["gain"])
    if p["clamp"] != math.inf:
        e = g.where(g.gt(g.abs(_bias_act_y(g, act_key, p, z)), p["clamp"]), 0.0, e)
    return backward(g, act_key, e, z, p)


def bias_act_params(act_p: dict, gain: float, clamp: float) -> dict:
    """The activation's parameters with gain and clamp, floats rounded to float32 (as the kernels decide)."""
    return gated_params({**act_p, "gain": float(gain), "clamp": float(clamp)})


def bias_model(g: Graph, name: str, inputs: list, outputs: list[tuple[str, str, Any, Any]], doc: str,
               opset: int = OPSET):
    """A bias_act model: each (graph value, output name, shape, element type) cast once to its type."""
    from onnx import helper

    for value, out_name, _, el in outputs:
        g.nodes.append(helper.make_node("Cast", [value], [out_name], to=el))
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info(n, e, shape) for _, n, shape, e in outputs], g.inits,
                              doc_string=doc)
    return make_model(graph, opset)


def to32(g: Graph, v: str, dtype: str) -> str:
    return v if dtype == "float32" else g.op("Cast", v, to=elem("float32"))


def bias_act_kernel_onnx(key: str, direction: str, dtype: str, kp: dict, forms: tuple):
    """The `bias_act:<act key>` kernel of the ONNX Runtime backends on (outer, C, inner) arrays: inputs `x`
    (backward: `dy`, `x`), then `b` and `scale` where given, as (C, 1) per channel ("c") or (O, C, I) ("f");
    outputs `y` (backward: `dx`, then `db`, `dscale` for a full-shape b / scale, then the float64 (C,)
    sums `db_sum`, `ds_sum` when asked).  forms = (b form, scale form, sum_db, sum_dscale), a form None
    where absent; kp: the activation's validated parameters, gain and clamp."""
    from onnx import helper

    if dtype not in DTYPES:
        raise ValueError(f"bias_act_kernel_onnx(): dtype must be one of {DTYPES}, got {dtype!r}")
    _, _, act_key = BIAS_ACT_KEYS[key]
    bf, sf, sum_db, sum_ds = forms
    p = bias_act_params({k: v for k, v in kp.items() if k not in ("gain", "clamp", "sum_db", "sum_dscale")},
                         kp["gain"], kp["clamp"])
    g = Graph(BIAS_CT)
    el = elem(dtype)
    full = ["O", "C", "I"]
    shapes = {"c": ["C", 1], "f": full}
    names = (["dy"] if direction == "backward" else []) + ["x"]
    inputs = [helper.make_tensor_value_info(n, el, full) for n in names]
    for n, form in (("b", bf), ("scale", sf)):
        if form is not None:
            names.append(n)
            inputs.append(helper.make_tensor_value_info(n, el, shapes[form]))
    v32 = {n: to32(g, n, dtype) for n in names if n != "dy"}
    z = bias_act_z(g, v32["x"], v32.get("b"), v32.get("scale"))
    if direction == "forward":
        outputs = [(bias_act_forward(g, act_key, p, z), "y", full, el)]
    else:
        f64 = elem(BIAS_CT)
        dz = bias_act_dz(g, act_key, p, g.op("Cast", "dy", to=f64), z)
        x64 = g.op("Cast", "x", to=f64)
        s64 = None if sf is None else g.op("Cast", "scale", to=f64)
        outputs = [(dz if s64 is None else g.mul(dz, s64), "dx", full, el)]
        dzx = g.mul(dz, x64) if sf is not None else None
        if bf == "f":
            outputs.append((dz, "db", full, el))
        if sf == "f":
            outputs.append((dzx, "dscale", full, el))
        axes = g.ints(0, 2)
        if sum_db:
            outputs.append((g.op("ReduceSum", dz, axes, keepdims=0), "db_sum", ["C"], f64))
        if sum_ds:
            outputs.append((g.op("ReduceSum", dzx, axes, keepdims=0), "ds_sum", ["C"], f64))
    settings = ", ".join(f"{k}={val!r}" for k, val in p.items())
    return bias_model(g, f"multiact_{key.replace(':', '_')}_{direction}", inputs, outputs,
                       f"multiact {key}({settings}; b={bf}, scale={sf}) {direction}, {dtype}")


