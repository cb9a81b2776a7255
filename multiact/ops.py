"""The op table: one declarative spec per activation, the single source of truth.

The public functions, their signatures and docstrings, the tests, the docs and
every backend's coverage are derived from `OPS`.  Parameters carry PyTorch's
names and defaults and their valid ranges; each op carries its float64
reference (in `multiact.reference`), whether its backward may start from the
output, its ONNX mapping and its accuracy bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import reference as R


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

FLOAT_DTYPES = ("float16", "float32", "float64")
DIRECTIONS = ("forward", "backward", "backward_y", "param_grad")


# float32's smallest normal: a parameter that must be nonzero (or > 0) must stay so in float32.
F32_TINY = 2.0**-126
F32_MAX = float(np.finfo(np.float32).max)


def in_float32(p: Mapping[str, Any]) -> dict[str, Any]:
    """Float parameters as float16/float32 kernels see them (rounded to float32; huge ones become inf)."""
    return {k: _f32(v) if isinstance(v, float) else v for k, v in p.items()}


def _f32(v: float) -> float:
    if abs(v) < 3.4e38:  # no overflow: skip errstate, which costs microseconds on the y= path
        return float(np.float32(v))
    with np.errstate(over="ignore"):
        return float(np.float32(v))


@dataclass(frozen=True)
class Param:
    """One scalar parameter: its PyTorch name, default and valid range."""

    name: str
    default: Any = REQUIRED
    kind: str = "float"  # "float" | "choice" | "int" | "array"
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    nonzero: bool = False
    choices: tuple[str, ...] = ()
    doc: str = ""

    def range_text(self) -> str:
        if self.kind == "choice":
            return " | ".join(repr(c) for c in self.choices)
        if self.kind != "float":
            return self.kind
        parts = []
        if self.lo == 0 and self.lo_open:
            parts.append(f">= {F32_TINY:g}")
        elif self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{'<' if self.hi_open else '<='} {self.hi:g}")
        if self.nonzero:
            parts.append(f"|x| >= {F32_TINY:g}")
        return "finite" + ("" if not parts else ", " + ", ".join(parts))

    def convert(self, fn: str, value: Any) -> Any:
        """The value as a plain Python float/str/int (read now: a tensor or 0-d array gives its current
        value), or TypeError naming it.  `fn` is the function the user called, e.g. "gelu()"."""
        where = f"{fn}: parameter {self.name!r}"
        if self.kind == "choice":
            if not isinstance(value, str):
                raise TypeError(f"{where} must be a str, one of {self.choices}, got {type(value).__name__}")
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
                raise TypeError(f"{where} must be an int, got {type(value).__name__}")
            return int(value)
        if self.kind == "array":
            return value  # checked against the input's shape at dispatch
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise TypeError(f"{where} must be a real number, got {type(value).__name__}")
        if type(value) is not float and hasattr(value, "detach"):  # a tensor that requires grad warns on float()
            value = value.detach()
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{where} must be a real number (one value), got {value!r}") from None

    def check(self, fn: str, v: Any) -> Any:
        """v (converted) if it is in range, else ValueError naming the parameter."""
        where = f"{fn}: parameter {self.name!r}"
        if self.kind == "choice":
            if v not in self.choices:
                raise ValueError(f"{where} must be one of {self.choices}, got {v!r}")
            return v
        if self.kind != "float":
            return v
        if not math.isfinite(v):
            raise ValueError(f"{where} must be finite, got {v}")
        bad = (
            (self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo))
            or (self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi))
            # nonzero, or > 0: also in float32, where float16/float32 kernels compute
            or (self.nonzero and abs(v) < F32_TINY)
            or (self.lo == 0 and self.lo_open and v < F32_TINY)
        )
        if bad:
            raise ValueError(f"{where} must be {self.range_text()}, got {v}")
        return v

    def validate(self, fn: str, value: Any) -> Any:
        """The value converted and range-checked; TypeError/ValueError naming it."""
        return self.check(fn, self.convert(fn, value))


def value_key(v: Any) -> Any:
    """A cache key for a converted parameter value: the value itself, except that +0.0 and -0.0
    (equal, same hash) get keys of their own, since they give different results."""
    if type(v) is not float or v:
        return v
    return ("zero", math.copysign(1.0, v))


@dataclass(frozen=True)
class Tolerance:
    """Accuracy bound against the float64 reference.

    |got - ref| <= ulp * spacing(ref) + atol * eps * scale, where scale is |dy|
    for a backward (derivatives that cross zero away from a kink cannot be
    relatively accurate there) and |x| for a forward that cancels.
    """

    ulp32: float = 6.0
    ulp64: float = 6.0
    ulp16: float = 1.0
    fwd_atol: float = 0.0
    bwd_atol: float = 0.0
    y_atol: float = 0.0  # in eps * |dy * y|: a backward from y that adds a constant to y cancels
    # Relative-error amplification of the op's internal argument (z = beta*x, x/alpha, x/sqrt2...):
    # rounding z to the compute precision costs cond(x, params) * eps relative in an exp/erfc tail.
    cond: Callable[[np.ndarray, Mapping[str, Any]], np.ndarray] | None = None

    def ulp(self, dtype: str) -> float:
        return {"float16": self.ulp16, "float32": self.ulp32, "float64": self.ulp64}[dtype]


@dataclass(frozen=True)
class OpSpec:
    """Everything multiact knows about one activation."""

    name: str
    summary: str
    formula: str
    params: tuple[Param, ...]
    forward: Callable[..., Any]
    backward: Callable[..., Any]
    backward_y: Callable[..., Any] | None = None
    y_allowed: Callable[[Mapping[str, Any]], bool] = lambda p: True
    y_condition: str = ""
    param_grad: tuple[str, Callable[..., Any]] | None = None  # (param name, reference)
    condition: Callable[[Mapping[str, Any]], str | None] = lambda p: None  # a cross-parameter rule
    kinks: Callable[[Mapping[str, Any]], tuple[float, ...]] = lambda p: ()
    onnx: str | None = None
    tol: Tolerance = field(default_factory=Tolerance)
    exact: bool = False  # piecewise linear: backends must round exactly like the formula

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def scalar_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind != "array")

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params if p.default is not REQUIRED}

    def has(self, direction: str) -> bool:
        """Whether the op has this direction at all (backward_y and param_grad are per op)."""
        return {
            "forward": True,
            "backward": True,
            "backward_y": self.backward_y is not None,
            "param_grad": self.param_grad is not None,
        }.get(direction, False)

    def supports_y(self, params: Mapping[str, Any], dtype: Any = None) -> bool:
        """Whether the y-form holds for these parameters; for a single-precision dtype (NumPy, torch,
        CuPy: 4 bytes or fewer), also for the parameters rounded to float32, where its kernels compute."""
        if self.backward_y is None or not self.y_allowed(params):
            return False
        return getattr(dtype, "itemsize", 8) > 4 or self.y_allowed(in_float32(params))

    def label(self, direction: str) -> str:
        """The public function a call in this direction came through, for messages: 'gelu_grad()'."""
        if direction == "forward":
            return f"{self.name}()"
        if direction == "param_grad" and self.param_grad is not None:
            return f"{self.name}_{self.param_grad[0]}_grad()"
        return f"{self.name}_grad()"

    def convert(self, given: Mapping[str, Any], fn: str | None = None) -> dict[str, Any]:
        """Plain parameter values (defaults filled in), read from the caller's objects now; TypeError
        for an unknown keyword (listing the op's parameters), a missing one, or a value of the wrong type."""
        fn = fn or f"{self.name}()"
        for k in given:
            if k not in self.param_names:
                known = ", ".join(self.param_names) or "none"
                raise TypeError(f"{fn}: unexpected keyword argument {k!r}; {self.name}'s parameters: {known}")
        out = {}
        for p in self.params:
            v = given.get(p.name, p.default)
            if v is REQUIRED:
                raise TypeError(f"{fn}: missing required parameter {p.name!r}")
            out[p.name] = p.convert(fn, v)
        return out

    def check(self, p: dict[str, Any], fn: str | None = None) -> dict[str, Any]:
        """p (converted) if every value is in range and the op's own condition holds, else ValueError."""
        fn = fn or f"{self.name}()"
        for prm in self.params:
            prm.check(fn, p[prm.name])
        problem = self.condition(p)
        if problem:
            raise ValueError(f"{fn}: {problem}")
        return p

    def validate(self, given: Mapping[str, Any], fn: str | None = None) -> dict[str, Any]:
        """Plain, checked parameter values (defaults filled in)."""
        return self.check(self.convert(given, fn), fn)

    def check_precision(self, p: Mapping[str, Any], dtype: Any, fn: str | None = None) -> None:
        """float16/float32 kernels compute in float32: every float parameter must be finite there
        (1e300 would become inf and turn finite inputs into NaN).  ValueError naming it."""
        size = getattr(dtype, "itemsize", None)
        if size is None:
            size = np.dtype(dtype).itemsize
        if size > 4:
            return
        for prm in self.params:
            if prm.kind == "float" and abs(p[prm.name]) > F32_MAX:
                raise ValueError(
                    f"{fn or self.name + '()'}: parameter {prm.name!r} = {p[prm.name]:g} does not fit float32, "
                    f"where {getattr(dtype, 'name', dtype)} arrays are computed (|{prm.name}| <= {F32_MAX:g})"
                )


def _f(name, default=REQUIRED, **kw) -> Param:
    return Param(name, default, **kw)


_LINEAR = Tolerance(ulp32=1, ulp64=1, ulp16=1)
_EXP_FROM_Y = Tolerance(y_atol=2)


def _scaled_arg(k: float | str) -> Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]:
    """cond = |k * x|, k a constant or the name of a parameter (alpha divides)."""
    if isinstance(k, str):
        return lambda x, p: np.abs(x / p[k]) if k == "alpha" else np.abs(x * p[k])
    return lambda x, p: np.abs(x * k)


def _crosses_zero(cond=None) -> Tolerance:
    """x * gate(x): the derivative crosses zero away from a kink, so |dy| sets an absolute floor."""
    return Tolerance(ulp32=8, ulp64=8, bwd_atol=8, cond=cond)


def _gelu_cond(x: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    if p["approximate"] == "tanh":
        return np.abs(2 * R.GELU_TANH_K * (x + R.GELU_TANH_C * x**3))
    return x * x  # erfc(z) ~ exp(-z^2): relative sensitivity 2 z^2 = x^2

_SPECS = (
    OpSpec(
        "relu", "Rectified linear unit.", "max(x, 0)", (),
        R.relu, R.relu_grad, R.relu_grad, kinks=lambda p: (0.0,), onnx="Relu", tol=_LINEAR, exact=True,
    ),
    OpSpec(
        "relu6", "ReLU clipped at 6.", "min(max(x, 0), 6)", (),
        R.relu6, R.relu6_grad, R.relu6_grad, kinks=lambda p: (0.0, 6.0), onnx="Clip", tol=_LINEAR, exact=True,
    ),
    OpSpec(
        "leaky_relu", "Leaky ReLU: a small slope for negative inputs.", "x if x > 0 else negative_slope * x",
        (_f("negative_slope", 0.01),),
        R.leaky_relu, R.leaky_relu_grad, R.leaky_relu_grad,
        y_allowed=lambda p: p["negative_slope"] > 0, y_condition="negative_slope > 0",
        kinks=lambda p: (0.0,), onnx="LeakyRelu", tol=_LINEAR, exact=True,
    ),
    OpSpec(
        "prelu", "Parametric ReLU: a learned slope per channel along `axis`.",
        "x if x > 0 else weight[c] * x",
        (_f("weight", kind="array", doc="1 element, or x.shape[axis] elements"), _f("axis", 1, kind="int")),
        R.prelu, R.prelu_grad, param_grad=("weight", R.prelu_weight_grad),
        kinks=lambda p: (0.0,), onnx="PRelu", tol=_LINEAR, exact=True,
    ),
    OpSpec(
        "elu", "Exponential linear unit.", "x if x > 0 else alpha * (exp(x) - 1)",
        (_f("alpha", 1.0),),
        R.elu, R.elu_grad, R.elu_grad_y, y_allowed=lambda p: p["alpha"] >= 0, y_condition="alpha >= 0",
        kinks=lambda p: (0.0,), tol=_EXP_FROM_Y, onnx="Elu",
    ),
    OpSpec(
        "selu", "Scaled ELU (self-normalising).", "scale * (x if x > 0 else alpha * (exp(x) - 1))", (),
        R.selu, R.selu_grad, R.selu_grad_y, kinks=lambda p: (0.0,), tol=_EXP_FROM_Y, onnx="Selu",
    ),
    OpSpec(
        "celu", "Continuously differentiable ELU.", "x if x > 0 else alpha * (exp(x / alpha) - 1)",
        (_f("alpha", 1.0, nonzero=True),),
        R.celu, R.celu_grad, R.celu_grad_y, y_allowed=lambda p: p["alpha"] > 0, y_condition="alpha > 0",
        kinks=lambda p: (0.0,), tol=Tolerance(y_atol=2, cond=_scaled_arg("alpha")), onnx="Celu",
    ),
    OpSpec(
        "gelu", "Gaussian error linear unit, exact or with the tanh approximation.",
        "x * Phi(x), or 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))",
        (_f("approximate", "none", kind="choice", choices=("none", "tanh")),),
        R.gelu, R.gelu_grad, kinks=lambda p: (-0.7517915, 0.0), onnx="Gelu", tol=_crosses_zero(_gelu_cond),
    ),
    OpSpec(
        "fast_gelu", "CANN's FastGelu: x * sigmoid(1.702 x).", "x * sigmoid(1.702 x)", (),
        R.fast_gelu, R.fast_gelu_grad, kinks=lambda p: (0.0,), tol=_crosses_zero(_scaled_arg(R.FAST_GELU_K)),
    ),
    OpSpec(
        "silu", "Sigmoid linear unit (swish with beta = 1).", "x * sigmoid(x)", (),
        R.silu, R.silu_grad, kinks=lambda p: (-1.2784645, 0.0), tol=_crosses_zero(),
    ),
    OpSpec(
        "swish", "Swish with a (learnable) beta; its beta gradient is swish_beta_grad.", "x * sigmoid(beta x)",
        (_f("beta", 1.0),),
        R.swish, R.swish_grad, param_grad=("beta", R.swish_beta_grad), kinks=lambda p: (0.0,),
        tol=_crosses_zero(_scaled_arg("beta")),
    ),
    OpSpec(
        "hardswish", "Piecewise-quadratic swish (MobileNetV3).", "x * relu6(x + 3) / 6", (),
        R.hardswish, R.hardswish_grad, kinks=lambda p: (-3.0, -1.5, 3.0), onnx="HardSwish",
        tol=Tolerance(ulp32=2, ulp64=2, bwd_atol=2),
    ),
    OpSpec(
        "hardsigmoid", "Piecewise-linear sigmoid.", "relu6(x + 3) / 6", (),
        R.hardsigmoid, R.hardsigmoid_grad, kinks=lambda p: (-3.0, 3.0), onnx="HardSigmoid",
        tol=Tolerance(ulp32=2, ulp64=2, fwd_atol=2),
    ),
    OpSpec(
        "sigmoid", "Logistic sigmoid.", "1 / (1 + exp(-x))", (),
        R.sigmoid_fwd, R.sigmoid_grad, R.sigmoid_grad_y, onnx="Sigmoid",
    ),
    OpSpec(
        "logsigmoid", "Log of the sigmoid, without overflow.", "-softplus(-x)", (),
        R.logsigmoid, R.logsigmoid_grad, tol=Tolerance(fwd_atol=1),
    ),
    OpSpec(
        "tanh", "Hyperbolic tangent.", "tanh(x)", (),
        R.tanh, R.tanh_grad, R.tanh_grad_y, onnx="Tanh",
    ),
    OpSpec(
        "hardtanh", "Clamp to [min_val, max_val].", "min(max(x, min_val), max_val)",
        (_f("min_val", -1.0), _f("max_val", 1.0)),
        R.hardtanh, R.hardtanh_grad, R.hardtanh_grad,
        condition=lambda p: None if p["min_val"] <= p["max_val"] else "min_val must be <= max_val",
        kinks=lambda p: (p["min_val"], p["max_val"]), onnx="Clip", tol=_LINEAR, exact=True,
    ),
    OpSpec(
        "softplus", "Smooth ReLU; linear where beta * x > threshold.",
        "log(1 + exp(beta x)) / beta, or x where beta x > threshold",
        (_f("beta", 1.0, lo=0, lo_open=True), _f("threshold", 20.0)),
        R.softplus, R.softplus_grad, kinks=lambda p: (p["threshold"] / p["beta"],), onnx="Softplus",
        tol=Tolerance(cond=_scaled_arg("beta")),
    ),
    OpSpec(
        "softsign", "x / (1 + |x|).", "x / (1 + |x|)", (),
        R.softsign, R.softsign_grad, onnx="Softsign",
    ),
    OpSpec(
        "mish", "Self-regularised non-monotonic activation.", "x * tanh(softplus(x))", (),
        R.mish, R.mish_grad, kinks=lambda p: (-1.1924, 0.0), onnx="Mish", tol=_crosses_zero(),
    ),
    OpSpec(
        "softshrink", "Soft shrinkage towards 0 by lambd.", "x - lambd if x > lambd, x + lambd if x < -lambd, else 0",
        (_f("lambd", 0.5, lo=0),),
        R.softshrink, R.shrink_grad, kinks=lambda p: (-p["lambd"], p["lambd"]), onnx="Shrink",
        tol=Tolerance(ulp32=1, ulp64=1, fwd_atol=1),
    ),
    OpSpec(
        "hardshrink", "Zero inside [-lambd, lambd].", "x if |x| > lambd else 0",
        (_f("lambd", 0.5, lo=0),),
        R.hardshrink, R.shrink_grad, kinks=lambda p: (-p["lambd"], p["lambd"]), onnx="Shrink",
        tol=_LINEAR, exact=True,
    ),
    OpSpec(
        "tanhshrink", "x - tanh(x).", "x - tanh(x)", (),
        R.tanhshrink, R.tanhshrink_grad, kinks=lambda p: (0.0,),
    ),
    OpSpec(
        "threshold", "Replace x <= threshold by value.", "x if x > threshold else value",
        (_f("threshold"), _f("value")),
        R.threshold, R.threshold_grad, kinks=lambda p: (p["threshold"],), onnx="ThresholdedRelu",
        tol=_LINEAR, exact=True,
    ),
)

OPS: dict[str, OpSpec] = {s.name: s for s in _SPECS}


def get(name: str) -> OpSpec:
    """The spec of op `name`, or ValueError listing the valid names."""
    try:
        return OPS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown op {name!r}; valid ops: {', '.join(OPS)}") from None
