"""The op definitions: every fact about every op that is not a formula, in one place.

Read by everything that needs to know what the ops are: `multiact.optable` (which adds the float64
references and accuracy bounds), the public functions, the cffi build (`native/kernels.py`, which
must not import NumPy or multiact, so this module imports only the standard library), the
backends' formula tables, the torch functions and modules, the ONNX export and the consistency
cases.  Nothing here is repeated elsewhere: a new op is one `OpDef` plus its kernels.

An op's *kernel key* names the formula a call runs: the op's name, or for an op with variants (gelu's
`approximate`) one key per variant, as oneDNN keys `eltwise_gelu_erf` and `eltwise_gelu_tanh`.
Dispatch resolves the key once per call (`OpDef.kernel_key`); backends are asked for kernels by key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cache
from typing import Any


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

# float32's smallest normal: a parameter that must be nonzero (or > 0) must stay so in float32.
F32_TINY = 2.0**-126
F32_MAX = 3.4028234663852886e38  # float32's largest finite value
SELU_ALPHA = 1.6732632423543772848170429916717  # PyTorch's (and ONNX's) selu constants
SELU_SCALE = 1.0507009873554804934193349852946


@cache
def tanhshrink_series(nterms: int) -> tuple[float, ...]:
    """Coefficients c_k of x - tanh(x) = sum_k c_k x^(2k+3), from Bernoulli numbers."""
    # Akiyama-Tanigawa gives B_n exactly (B_1 = +1/2; only even n are used).
    bern, a = [], []
    for m in range(2 * nterms + 6):
        a.append(Fraction(1, m + 1))
        for j in range(m, 0, -1):
            a[j - 1] = j * (a[j - 1] - a[j])
        bern.append(a[0])
    coeffs = []
    for n in range(2, nterms + 2):  # tanh(x) = sum 2^2n (2^2n - 1) B_2n x^(2n-1) / (2n)!
        c = Fraction(2 ** (2 * n) * (2 ** (2 * n) - 1)) * bern[2 * n] / math.factorial(2 * n)
        coeffs.append(float(-c))
    return tuple(coeffs)


@dataclass(frozen=True)
class Param:
    """One scalar parameter: its PyTorch name, default and valid range."""

    name: str
    default: Any = REQUIRED
    kind: str = "float"  # "float" | "choice" | "int" | "array" | "act" (an activation of the table, by name)
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    nonzero: bool = False
    inf_ok: bool = False  # +inf allowed (softplus's threshold: no linear branch, as ONNX's Softplus)
    choices: tuple[str, ...] = ()
    doc: str = ""
    along: str = ""  # kind "array": the int parameter naming the axis of x it runs along (prelu's axis)

    def range_text(self) -> str:
        if self.kind == "act":
            return "the name of an activation of the table (any but prelu)"
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
        return ("finite or +inf" if self.inf_ok else "finite") + ("" if not parts else ", " + ", ".join(parts))

    def convert(self, fn: str, value: Any) -> Any:
        """The value as a plain Python float/str/int (read now: a tensor or 0-d array gives its current
        value), or TypeError naming it.  `fn` is the function the user called, e.g. "gelu()"."""
        where = f"{fn}: parameter {self.name!r}"
        if value is None and self.default is None:  # an optional parameter left out
            return None
        if self.kind in ("choice", "act"):
            if not isinstance(value, str):
                what = f"one of {self.choices}" if self.choices else "an activation's name"
                raise TypeError(f"{where} must be a str, {what}, got {type(value).__name__}")
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
                raise TypeError(f"{where} must be an int, got {type(value).__name__}")
            return int(value)
        if self.kind == "array":
            return value  # checked against the input's shape at dispatch
        boolean = isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b"  # np.bool_
        if boolean or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise TypeError(f"{where} must be a real number, got {type(value).__name__}")
        if type(value) is not float and hasattr(value, "detach"):  # a tensor that requires grad warns on float()
            value = value.detach()
        try:
            return float(value)
        except OverflowError:  # an int beyond float64
            raise ValueError(f"{where} must be finite, got an integer of {value.bit_length()} bits") from None
        except (TypeError, ValueError):
            raise TypeError(f"{where} must be a real number (one value), got {value!r}") from None

    def check(self, fn: str, v: Any) -> Any:
        """v (converted) if it is in range, else ValueError naming the parameter."""
        where = f"{fn}: parameter {self.name!r}"
        if v is None and self.default is None:
            return v
        if self.kind == "choice":
            if v not in self.choices:
                raise ValueError(f"{where} must be one of {self.choices}, got {v!r}")
            return v
        if self.kind != "float":
            return v
        if not math.isfinite(v) and not (self.inf_ok and v == math.inf):
            raise ValueError(f"{where} must be {'finite or +inf' if self.inf_ok else 'finite'}, got {v}")
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




@dataclass(frozen=True)
class Torch:
    """How PyTorch spells the op: `torch.nn.functional.<fn>` (or `torch.<fn>`), which of our parameters it
    takes positionally and by keyword, and aten's kernels (the peer the benchmarks time): calls in aten's own
    argument order, as PyTorch's derivatives.yaml writes them, of `x`, `y` (the output), `dy`, our parameters
    by name, literals and `1 / <parameter>`.  `aten`: the forward ("": `<fn>` with fn's arguments; its `.out`
    overload writes into a given tensor); `backward` from x and `backward_y` from the output y, as autograd
    saves it ("": torch has none)."""

    fn: str
    args: tuple[str, ...] = ()
    kwargs: tuple[str, ...] = ()
    namespace: str = "torch.nn.functional"
    aten: str = ""
    backward: str = ""
    backward_y: str = ""

    def aten_forward(self) -> str:
        """The forward's aten call."""
        return self.aten or f"{self.fn}({', '.join(['x', *self.args, *(f'{k}={k}' for k in self.kwargs)])})"


@dataclass(frozen=True)
class OpDef:
    """One op: its signature, variants, backward forms, and how the peers spell it."""

    name: str
    summary: str
    formula: str
    params: tuple[Param, ...] = ()
    # The choice parameter whose value picks the formula, and value -> kernel key.
    variant: tuple[str, Mapping[str, str]] | None = None
    y_form: str = ""  # "": the backward needs x; "same": its formula also holds on y; "own": a y formula
    y_condition: str = ""  # when the y-form holds, in words (y_allowed says it in code)
    y_allowed: Callable[[Mapping[str, Any]], bool] = lambda p: True
    condition: Callable[[Mapping[str, Any]], str | None] = lambda p: None  # a cross-parameter rule
    param_grad: str | None = None  # the parameter with a gradient of its own
    # Piecewise linear: f'' = 0 almost everywhere, so the second derivative (backward2) is the one zero formula
    # on every backend (reference.zero_grad2, formulas.zero_grad2, native's generated MA_ZERO_GRAD2 list).
    # "exact": every piece is x, a constant or one product, so backends must round exactly like the formula
    # (OpSpec.exact); "rounded": a piece rounds on its own (hardsigmoid's (x + c) / d, softshrink's x - lambd).
    piecewise_linear: str = ""  # "" | "exact" | "rounded"
    grad_kernel: str | None = None  # a backward kernel shared with other ops (softshrink, hardshrink)
    torch: Torch | None = None
    module: str = ""  # multiact.torch's nn.Module name, PyTorch's spelling, where CamelCase of the name is not it
    onnx: str | None = None  # ONNX's operator
    # How a node of that operator carries the parameters (read by `from_onnx_node`, written by to_onnx's runtime
    # graphs): ONNX attribute, or `input1`, `input2` (the node's inputs after x), -> the parameter it holds (by
    # name) or the value it has for this op (Shrink's bias: lambd for softshrink, 0 for hardshrink).  An op
    # without them is not what a node of a shared operator reads as (relu6: a Clip node is a hardtanh).
    onnx_attrs: Mapping[str, Any] = field(default_factory=dict)
    onnx_fixed: Mapping[str, Any] = field(default_factory=dict)  # the parameters the node computes at these values
    # Per kernel key (forward, backward) time per element relative to relu's, in cache: the native
    # runtime threads a call once elements x cost reach its parallel minimum. y-forms cost 1.
    cost: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    param_grad_cost: int = 1
    cases: tuple[Mapping[str, Any], ...] = ()  # parameter cases of the consistency suite, beyond the defaults

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def array_param(self) -> str | None:
        """The parameter that is an array of its own (prelu's weight: one per channel along `axis`), or None."""
        return next((p.name for p in self.params if p.kind == "array"), None)

    @property
    def float_params(self) -> tuple[str, ...]:
        """The float parameters in kernel slot order (a, b, ...)."""
        return tuple(p.name for p in self.params if p.kind == "float")

    @property
    def keys(self) -> tuple[str, ...]:
        """Every kernel key of the op (one unless it has variants)."""
        return tuple(dict.fromkeys(self.variant[1].values())) if self.variant else (self.name,)

    def kernel_key(self, p: Mapping[str, Any]) -> str:
        """The formula these (validated) parameters select."""
        if self.variant is None:
            return self.name
        return self.variant[1][p[self.variant[0]]]

    def selecting(self, key: str) -> dict[str, str]:
        """The variant parameter that selects kernel key `key` ({} for an op without variants)."""
        if self.variant is None:
            return {}
        name, table = self.variant
        return {name: next(v for v, k in table.items() if k == key)}

    def kernel_names(self, key: str) -> dict[str, str]:
        """direction -> elementwise kernel name for one key (native C names, formula names)."""
        names = {"forward": key, "backward": self.grad_kernel or f"{key}_grad"}
        if self.y_form == "same":
            names["backward_y"] = names["backward"]
        elif self.y_form == "own":
            names["backward_y"] = f"{key}_grad_y"
        return names

    def torch_computes(self, p: Mapping[str, Any]) -> bool:
        """Whether torch's function (`torch`) computes the op at these parameters: each parameter it does not
        take is at its default (F.selu and F.hardsigmoid have PyTorch's constants only; prelu's weight along
        any axis is not torch's)."""
        if self.torch is None:
            return False
        taken = (*self.torch.args, *self.torch.kwargs)
        return all(q.name in taken or (q.default is not REQUIRED and p.get(q.name, q.default) == q.default)
                   for q in self.params)

    @property
    def module_name(self) -> str:
        """The nn.Module name: leaky_relu -> LeakyReLU, hardswish -> Hardswish."""
        return self.module or "".join(part.capitalize() for part in self.name.split("_"))

    def costs(self, key: str) -> dict[str, int]:
        """Kernel name -> relative cost for one key."""
        fwd, bwd = self.cost.get(key, (1, 1))
        names = self.kernel_names(key)
        return {names["forward"]: fwd, names["backward"]: bwd}


def _f(name, default=REQUIRED, **kw) -> Param:
    return Param(name, default, **kw)


_T = Torch
DEFS: tuple[OpDef, ...] = (
    OpDef("relu", "Rectified linear unit.", "max(x, 0)", y_form="same", piecewise_linear="exact",
          torch=_T("relu", backward="threshold_backward(dy, x, 0)", backward_y="threshold_backward(dy, y, 0)"),
          module="ReLU", onnx="Relu"),
    OpDef("relu6", "ReLU clipped at 6.", "min(max(x, 0), 6)", y_form="same", piecewise_linear="exact",
          torch=_T("relu6", aten="hardtanh(x, 0.0, 6.0)", backward="hardtanh_backward(dy, x, 0.0, 6.0)"),
          module="ReLU6", onnx="Clip"),
    OpDef("leaky_relu", "Leaky ReLU: a small slope for negative inputs.", "x if x > 0 else negative_slope * x",
          (_f("negative_slope", 0.01),), y_form="same", y_condition="negative_slope > 0", piecewise_linear="exact",
          y_allowed=lambda p: p["negative_slope"] > 0,
          torch=_T("leaky_relu", ("negative_slope",), backward="leaky_relu_backward(dy, x, negative_slope, False)",
                   backward_y="leaky_relu_backward(dy, y, negative_slope, True)"),
          module="LeakyReLU", onnx="LeakyRelu", onnx_attrs={"alpha": "negative_slope"},
          cases=({"negative_slope": 0.2}, {"negative_slope": -0.3})),
    OpDef("prelu", "Parametric ReLU: a learned slope per channel along `axis`.", "x if x > 0 else weight[c] * x",
          (_f("weight", kind="array", along="axis", doc="1 element, or x.shape[axis] elements"),
           _f("axis", 1, kind="int")),
          param_grad="weight", piecewise_linear="exact", torch=_T("prelu"), module="PReLU", onnx="PRelu",
          onnx_attrs={"input1": "weight"}, onnx_fixed={"axis": -1},
          cases=({"weight": "per-channel", "axis": 1}, {"weight": "single"})),
    OpDef("elu", "Exponential linear unit.", "x if x > 0 else alpha * (exp(x) - 1)", (_f("alpha", 1.0),),
          y_form="own", y_condition="alpha >= 0", y_allowed=lambda p: p["alpha"] >= 0,
          torch=_T("elu", ("alpha",), backward="elu_backward(dy, alpha, 1, 1, False, x)",
                   backward_y="elu_backward(dy, alpha, 1, 1, True, y)"),
          module="ELU", onnx="Elu", onnx_attrs={"alpha": "alpha"}, cost={"elu": (5, 8)},
          cases=({"alpha": 0.5}, {"alpha": 0.0})),
    OpDef("selu", "Scaled ELU (self-normalising); alpha and scale as ONNX's Selu alpha and gamma.",
          "scale * (x if x > 0 else alpha * (exp(x) - 1))",
          (_f("alpha", SELU_ALPHA, doc="PyTorch's constant by default (ONNX Selu's alpha)"),
           _f("scale", SELU_SCALE, doc="PyTorch's constant by default (ONNX Selu's gamma)")),
          y_form="own", y_condition="alpha >= 0 and scale > 0",
          y_allowed=lambda p: p["alpha"] >= 0 and p["scale"] > 0,
          torch=_T("selu", aten="elu(x, alpha, scale)", backward="elu_backward(dy, alpha, scale, 1, False, x)",
                   backward_y="elu_backward(dy, alpha, scale, 1, True, y)"),
          module="SELU", onnx="Selu", onnx_attrs={"alpha": "alpha", "gamma": "scale"},
          cost={"selu": (5, 8)}, cases=({"alpha": 2.0, "scale": 3.0},)),
    OpDef("celu", "Continuously differentiable ELU.", "x if x > 0 else alpha * (exp(x / alpha) - 1)",
          (_f("alpha", 1.0, nonzero=True),), y_form="own", y_condition="alpha > 0",
          y_allowed=lambda p: p["alpha"] > 0,
          torch=_T("celu", ("alpha",), backward="elu_backward(dy, alpha, 1, 1 / alpha, False, x)",
                   backward_y="elu_backward(dy, alpha, 1, 1 / alpha, True, y)"),
          module="CELU", onnx="Celu", onnx_attrs={"alpha": "alpha"}, cost={"celu": (7, 8)},
          cases=({"alpha": 0.7}, {"alpha": 2.5})),
    OpDef("gelu", "Gaussian error linear unit, exact or with the tanh approximation.",
          "x * Phi(x), or 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))",
          (_f("approximate", "none", kind="choice", choices=("none", "tanh")),),
          variant=("approximate", {"none": "gelu", "tanh": "gelu_tanh"}),
          torch=_T("gelu", kwargs=("approximate",), backward="gelu_backward(dy, x, approximate=approximate)"),
          module="GELU", onnx="Gelu", onnx_attrs={"approximate": "approximate"},
          cost={"gelu": (12, 15), "gelu_tanh": (8, 11)}, cases=({"approximate": "tanh"},)),
    OpDef("fast_gelu", "CANN's FastGelu: x * sigmoid(1.702 x).", "x * sigmoid(1.702 x)", module="FastGELU",
          cost={"fast_gelu": (6, 7)}),
    OpDef("silu", "Sigmoid linear unit (swish with beta = 1).", "x * sigmoid(x)",
          torch=_T("silu", backward="silu_backward(dy, x)"), module="SiLU", cost={"silu": (5, 8)}),
    OpDef("swish", "Swish with a (learnable) beta; its beta gradient is swish_beta_grad.", "x * sigmoid(beta x)",
          (_f("beta", 1.0),), param_grad="beta", cost={"swish": (7, 7)}, param_grad_cost=63,  # a double exp
          cases=({"beta": 1.3}, {"beta": -0.7}, {"beta": 0.0})),
    OpDef("hardswish", "Piecewise-quadratic swish (MobileNetV3).", "x * relu6(x + 3) / 6",
          torch=_T("hardswish", backward="hardswish_backward(dy, x)"), onnx="HardSwish"),
    OpDef("hardsigmoid", "Piecewise-linear sigmoid; alpha, beta as ONNX's HardSigmoid (whose default alpha is 0.2).",
          "max(0, min(1, alpha * x + beta)), computed as (x + beta/alpha) / (1/alpha): relu6(x + 3) / 6 at "
          "PyTorch's alpha = 1/6, beta = 0.5",
          (_f("alpha", 1.0 / 6.0, lo=0, lo_open=True, doc="the slope, > 0 (PyTorch: 1/6; ONNX's default: 0.2)"),
           _f("beta", 0.5, doc="the value at x = 0")),
          piecewise_linear="rounded", torch=_T("hardsigmoid", backward="hardsigmoid_backward(dy, x)"),
          onnx="HardSigmoid", onnx_attrs={"alpha": "alpha", "beta": "beta"}, cases=({"alpha": 0.2, "beta": 0.5},)),
    OpDef("sigmoid", "Logistic sigmoid.", "1 / (1 + exp(-x))", y_form="own",
          torch=_T("sigmoid", namespace="torch", backward_y="sigmoid_backward(dy, y)"), onnx="Sigmoid",
          cost={"sigmoid": (5, 7)}),
    OpDef("logsigmoid", "Log of the sigmoid, without overflow.", "-softplus(-x)",
          torch=_T("logsigmoid", aten="log_sigmoid(x)"), module="LogSigmoid", cost={"logsigmoid": (8, 7)}),
    OpDef("tanh", "Hyperbolic tangent.", "tanh(x)", y_form="own",
          torch=_T("tanh", namespace="torch", backward_y="tanh_backward(dy, y)"), onnx="Tanh", cost={"tanh": (6, 6)}),
    OpDef("hardtanh", "Clamp to [min_val, max_val].", "min(max(x, min_val), max_val)",
          (_f("min_val", -1.0), _f("max_val", 1.0)), y_form="same", piecewise_linear="exact",
          # refused as PyTorch refuses it; ONNX's Clip defines min > max as max everywhere (a constant, no activation)
          condition=lambda p: None if p["min_val"] <= p["max_val"] else (
              f"min_val ({p['min_val']}) must be <= max_val ({p['max_val']}), as PyTorch requires; ONNX's Clip "
              "with min > max gives max everywhere, which is np.full_like(x, max_val), not an activation"),
          torch=_T("hardtanh", ("min_val", "max_val"), backward="hardtanh_backward(dy, x, min_val, max_val)"),
          onnx="Clip", onnx_attrs={"input1": "min_val", "input2": "max_val"},
          cases=({"min_val": -2.0, "max_val": 0.5},)),
    OpDef("softplus", "Smooth ReLU; linear where beta * x > threshold.",
          "log(1 + exp(beta x)) / beta, or x where beta x > threshold",
          (_f("beta", 1.0, lo=0, lo_open=True),
           _f("threshold", 20.0, inf_ok=True, doc="+inf: never linear (ONNX's Softplus has no threshold)")),
          torch=_T("softplus", ("beta", "threshold"), backward="softplus_backward(dy, x, beta, threshold)"),
          onnx="Softplus", onnx_fixed={"beta": 1.0, "threshold": math.inf}, cost={"softplus": (10, 7)},
          # threshold 1e6: the smooth branch reaches beta * x far past where sigmoid saturates (1e5)
          cases=({"beta": 2.0, "threshold": 5.0}, {"beta": 0.3, "threshold": 20.0},
                 {"beta": 1.0, "threshold": 1e6}, {"beta": 1.0, "threshold": math.inf})),
    OpDef("softsign", "x / (1 + |x|).", "x / (1 + |x|)", torch=_T("softsign"), onnx="Softsign"),
    OpDef("mish", "Self-regularised non-monotonic activation.", "x * tanh(softplus(x))",
          torch=_T("mish", backward="mish_backward(dy, x)"), onnx="Mish", cost={"mish": (7, 10)}),
    OpDef("softshrink", "Soft shrinkage towards 0 by lambd.", "x - lambd if x > lambd, x + lambd if x < -lambd, else 0",
          (_f("lambd", 0.5, lo=0),), grad_kernel="shrink_grad", piecewise_linear="rounded",
          torch=_T("softshrink", ("lambd",), backward="softshrink_backward(dy, x, lambd)"),
          onnx="Shrink", onnx_attrs={"lambd": "lambd", "bias": "lambd"}, cases=({"lambd": 0.3}, {"lambd": 0.0})),
    OpDef("hardshrink", "Zero inside [-lambd, lambd].", "x if |x| > lambd else 0", (_f("lambd", 0.5, lo=0),),
          grad_kernel="shrink_grad", piecewise_linear="exact",
          torch=_T("hardshrink", ("lambd",), backward="hardshrink_backward(dy, x, lambd)"),
          onnx="Shrink", onnx_attrs={"lambd": "lambd", "bias": 0.0}, cases=({"lambd": 0.3},)),
    OpDef("tanhshrink", "x - tanh(x).", "x - tanh(x)", torch=_T("tanhshrink"), cost={"tanhshrink": (13, 6)}),
    OpDef("threshold", "Replace x <= threshold by value.", "x if x > threshold else value",
          (_f("threshold"), _f("value")), piecewise_linear="exact",
          torch=_T("threshold", ("threshold", "value"), backward="threshold_backward(dy, x, threshold)"),
          onnx="ThresholdedRelu", onnx_attrs={"alpha": "threshold"}, onnx_fixed={"value": 0.0},
          cases=({"threshold": 0.3, "value": -2.0}, {"threshold": -1.0, "value": 0.0})),
)

DEFINITIONS: dict[str, OpDef] = {d.name: d for d in DEFS}


# ---- composite ops: more than one array in or out, built on an activation of the table ----

# The activations a composite op may name: every op whose parameters are scalars (prelu's weight is
# an array of its own, with an axis that would clash with the composite's).
def composable(d: OpDef) -> bool:
    return all(p.kind != "array" for p in d.params)


@dataclass(frozen=True)
class Family:
    """A kind of composite kernel, one per kernel key of every composable activation: its kernel key is
    `<family>:<activation key>` (gated:silu, gated:gelu_tanh), its C name `<family>_<activation key>`.
    The family's own scalars travel to the kernels beside the activation's parameters."""

    name: str
    inputs: tuple[str, ...]  # the kernel's array inputs, per element
    grads: tuple[str, ...]  # what its backward writes, per element
    scalars: tuple[str, ...]  # the family's own kernel parameters (after the activation's)
    formula: str
    own_keys: tuple[str, ...] = ()  # activations of the family's own, beyond the table's (bias_act's linear)

    def key(self, act_key: str) -> str:
        return f"{self.name}:{act_key}"

    def cname(self, act_key: str, direction: str) -> str:
        return f"{self.name}_{act_key}" + ("_grad" if direction == "backward" else "")


GATED = Family(
    "gated", ("gate", "up"), ("dgate", "dup"), ("limit", "shift"),
    "g = min(gate, limit); u = clamp(up, -limit, limit) + shift; y = act(g) * u;"
    " dgate = act'(g) * dy * u (0 where gate > limit); dup = act(g) * dy (0 where |up| > limit)",
)
BIAS_ACT = Family(
    "bias_act", ("x", "b", "scale"), ("dx", "db", "dscale"), ("gain", "clamp"),
    "z = x * scale + b; y = clip(act(z) * gain, -clamp, clamp); dz = act'(z) * dy * gain (0 where clipped);"
    " dx = dz * scale; db = sum of dz; dscale = sum of dz * x (per channel, or elementwise for full-shape b, scale)",
    own_keys=("linear",),  # its own activation beside the table's: optable.LINEAR
)
FAMILIES: dict[str, Family] = {f.name: f for f in (GATED,)}


def family_keys() -> list[tuple[Family, OpDef, str]]:
    """(family, activation, activation key) for every composite kernel, in definition order."""
    return [(f, d, k) for f in FAMILIES.values() for d in DEFS if composable(d) for k in d.keys]


@dataclass(frozen=True)
class CompositeDef:
    """A public op built on the activations: which family of kernels it runs, its own parameters, and
    how it picks its activation.  A fused op names its activation; it never restates it."""

    name: str
    family: str
    summary: str
    formula: str
    params: tuple[Param, ...]
    # (validated own parameters, the caller's extra keywords) -> (activation name, its parameters):
    # glu takes act= and the activation's keywords; the named forms fix the activation.
    activation: Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[str, dict[str, Any]]]
    takes_act_params: bool = False  # whether **act_params reach the activation (glu)
    module: str = ""  # multiact.torch's nn.Module name
    cases: tuple[Mapping[str, Any], ...] = ()  # the shared suite's cases beyond the defaults

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


_DIM = _f("dim", -1, kind="int", doc="the axis split in two halves")
_ACTIVATE = _f("activate", "first", kind="choice", choices=("first", "second"),
               doc="which half goes through the activation (the gate); the other multiplies it")
_LAYOUT = _f("layout", "halves", kind="choice", choices=("halves", "interleaved"),
             doc="halves: [a | b] along dim; interleaved: a = x[0::2], b = x[1::2] (GPT-OSS)")


def _glu_act(p: Mapping[str, Any], extra: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    return p["act"], dict(extra)


def _swiglu_act(p: Mapping[str, Any], extra: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("silu", {}) if p["alpha"] is None else ("swish", {"beta": p["alpha"]})


COMPOSITES: tuple[CompositeDef, ...] = (
    CompositeDef(
        "glu", "gated", "Gated linear unit: one half of x gates the other through an activation.",
        "a, b = halves of x along dim; y = a * act(b) (activate='second', PyTorch's F.glu) or act(a) * b",
        (_DIM, _f("act", "sigmoid", kind="act", doc="the activation; its parameters as keywords"),
         replace(_ACTIVATE, default="second"), _LAYOUT),
        _glu_act, takes_act_params=True, module="GLU",
        cases=({"act": "silu", "activate": "first"}, {"act": "gelu", "approximate": "tanh"},
               {"act": "leaky_relu", "negative_slope": 0.2, "layout": "interleaved"})),
    CompositeDef(
        "swiglu", "gated", "SwiGLU (LLaMA's MLP): silu(gate) * up; with limit, GPT-OSS's clipped form.",
        "silu(a) * b; with alpha/limit: g = min(a, limit), u = clamp(b, -limit, limit), "
        "y = g * sigmoid(alpha g) * (u + 1)",
        (_DIM, _ACTIVATE, _LAYOUT,
         _f("alpha", None, doc="the sigmoid's slope: swish(beta=alpha) instead of silu (GPT-OSS: 1.702)"),
         _f("limit", None, lo=0, lo_open=True,
            doc="clip the gate above and up to [-limit, limit], and add 1 to up (GPT-OSS: 7.0)")),
        _swiglu_act, module="SwiGLU",
        cases=({"alpha": 1.702, "limit": 7.0, "layout": "interleaved"}, {"activate": "second"})),
    CompositeDef(
        "geglu", "gated", "GeGLU (T5, Gemma): gelu(gate) * up, exact or tanh.", "gelu(a) * b",
        (_DIM, _f("approximate", "none", kind="choice", choices=("none", "tanh")), _ACTIVATE, _LAYOUT),
        lambda p, extra: ("gelu", {"approximate": p["approximate"]}), module="GeGLU",
        cases=({"approximate": "tanh"},)),
    CompositeDef(
        "reglu", "gated", "ReGLU: relu(gate) * up.", "relu(a) * b", (_DIM, _ACTIVATE, _LAYOUT),
        lambda p, extra: ("relu", {}), module="ReGLU"),
)
COMPOSITE_DEFINITIONS: dict[str, CompositeDef] = {c.name: c for c in COMPOSITES}
