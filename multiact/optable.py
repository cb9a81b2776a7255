"""The op table: each op's definition (`multiact._opdefs`, where every fact that is not a formula
lives) joined with its numerics: float64 references (in `multiact.reference`), kinks and accuracy
bound.  The public functions, the tests and every backend's coverage are derived from `OPS` (by op
name) and `KEYS` (by kernel key: a variant such as gelu_tanh is a key of its op).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import reference as R
from . import vocab
from ._opdefs import (
    BIAS_ACT,
    DEFINITIONS,
    F32_MAX,
    F32_TINY,
    FAMILIES,
    REQUIRED,
    OpDef,
    Param,
    composable,
    family_keys,
)

__all__ = ["DIRECTIONS", "F32_MAX", "F32_TINY", "FAMILY_KEYS", "FLOAT_DTYPES", "KEYS", "OPS", "REQUIRED", "OpDef",
           "OpSpec", "OpTable", "Param", "Tolerance", "get", "in_float32", "register", "unregister", "value_key"]


FLOAT_DTYPES = vocab.NUMPY_DTYPES  # the suite's dtypes: NumPy's own (bfloat16 arrays need ml_dtypes)
DIRECTIONS = vocab.FIRST_ORDER  # the function and its first derivatives (what `OpSpec.has` answers for)


def in_float32(p: Mapping[str, Any]) -> dict[str, Any]:
    """Float parameters as float16/float32 kernels see them (rounded to float32; huge ones become inf)."""
    return {k: _f32(v) if isinstance(v, float) else v for k, v in p.items()}


def _f32(v: float) -> float:
    if abs(v) < 3.4e38:  # no overflow: skip errstate, which costs microseconds on the y= path
        return float(np.float32(v))
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def value_key(v: Any) -> Any:
    """A cache key for a converted parameter value: the value itself, except that +0.0 and -0.0
    (equal, same hash) get keys of their own, since they give different results."""
    if type(v) is not float or v:
        return v
    return ("zero", math.copysign(1.0, v))


@dataclass(frozen=True)
class Tolerance:
    """Accuracy bound against the float64 reference.

    |got - ref| <= ulp * spacing(ref) + atol * eps * scale, where scale is |x| for a
    forward that cancels, and for a backward |dy| (|g| + |x g'|) only around a zero
    crossing of f' = g + x g' (g = f / x), where its two terms cancel and no kernel
    is relatively accurate; elsewhere a backward's bound is relative
    (`consistency.crossings` derives the crossings from the references).
    """

    ulp32: float = 6.0
    ulp64: float = 6.0
    ulp16: float = 1.0
    fwd_atol: float = 0.0
    bwd_atol: float = 0.0
    y_atol: float = 0.0  # in eps * |dy * y|: a backward from y that adds a constant to y cancels
    # The share of bfloat16 results (exhaustive check, `consistency.run_bf16_case`) that may be one bfloat16
    # ulp from the correctly rounded reference: where the float32 computation's own error straddles a
    # bfloat16 rounding boundary, or its correctly rounded float32 value sits exactly on a tie.
    bf16_one_ulp: float = 1e-3
    # Relative-error amplification of the op's internal argument (z = beta*x, x/alpha, x/sqrt2...):
    # rounding z to the compute precision costs cond(x, params) * eps relative in an exp/erfc tail.
    cond: Callable[[np.ndarray, Mapping[str, Any]], np.ndarray] | None = None

    def ulp(self, dtype: str) -> float:
        # the half types (float16, bfloat16) follow one rule (computed in float32, rounded once): ulp16, each in
        # its own ulp
        d = vocab.DTYPES[dtype]
        return self.ulp16 if d.half else self.ulp64 if d.compute == "float64" else self.ulp32


@dataclass(frozen=True)
class OpSpec:
    """Everything multiact knows about one activation: its definition (`multiact._opdefs`) and its
    numerics (float64 references, kinks, accuracy bound)."""

    defn: OpDef
    forward: Callable[..., Any]
    backward: Callable[..., Any]
    backward_y: Callable[..., Any] | None = None
    param_grad_ref: Callable[..., Any] | None = None
    # Second order: g * dy * f''(x), the backward of the backward with respect to x (`ma.backward2`);
    # None for an op registered without one (then no backend runs backward2 for it).
    backward2: Callable[..., Any] | None = None
    # Second order in the learnable parameter (`ma.param_grad2`), elementwise: (g * dy * d2f/dx dp,
    # g * dy * d2f/dp2), directions "param_grad2" and "param_grad2_param"; None without one.
    param_grad2_ref: tuple[Callable[..., Any], Callable[..., Any]] | None = None
    kinks: Callable[[Mapping[str, Any]], tuple[float, ...]] = lambda p: ()
    tol: Tolerance = field(default_factory=Tolerance)
    # backends must round exactly like the formula; None: from the definition (piecewise_linear="exact")
    exact: bool | None = None

    def __repr__(self) -> str:  # the dataclass's would print every reference function's address
        return f"OpSpec({self.signature()}; y-form: {self.y_form_text()})"

    def signature(self) -> str:
        """The forward's call with its defaults: "gelu(x, approximate='none')"."""
        return f"{self.name}({', '.join(['x', *(_param_text(p) for p in self.params)])})"

    def y_form_text(self) -> str:
        """Whether the backward may start from the output y: 'same' (the x formula holds on y), 'own'
        (a formula of its own), each with its condition; '-' where it needs x."""
        form = self.defn.y_form or "-"
        return form if not self.y_condition or form == "-" else f"{form}, if {self.y_condition}"

    def extras(self) -> str:
        """Beyond the forward and backward: the variants, a parameter gradient, the ONNX operator."""
        d = self.defn
        out = []
        if d.variant is not None:
            out.append(f"kernels {'/'.join(self.keys)} by {d.variant[0]}")
        if d.param_grad:
            out.append(f"d/d{d.param_grad}: {self.name}_{d.param_grad}_grad")
        if d.onnx:
            out.append(f"ONNX {d.onnx}")
        return "; ".join(out) or "-"

    def __post_init__(self) -> None:
        d = self.defn
        if bool(d.y_form) != (self.backward_y is not None) or bool(d.param_grad) != (self.param_grad_ref is not None):
            raise ValueError(f"{d.name}: the references do not match the definition's y-form / parameter gradient")
        if self.exact is None:
            object.__setattr__(self, "exact", d.piecewise_linear == "exact")
        if self.backward2 is None and d.piecewise_linear:  # f'' = 0 almost everywhere
            object.__setattr__(self, "backward2", R.zero_grad2)

    name = property(lambda self: self.defn.name)
    summary = property(lambda self: self.defn.summary)
    formula = property(lambda self: self.defn.formula)
    params = property(lambda self: self.defn.params)
    y_condition = property(lambda self: self.defn.y_condition)
    y_allowed = property(lambda self: self.defn.y_allowed)
    condition = property(lambda self: self.defn.condition)
    onnx = property(lambda self: self.defn.onnx)
    keys = property(lambda self: self.defn.keys)

    @property
    def param_grad(self) -> tuple[str, Callable[..., Any]] | None:
        """(parameter name, its float64 reference), or None."""
        return None if self.defn.param_grad is None else (self.defn.param_grad, self.param_grad_ref)

    def kernel_key(self, p: Mapping[str, Any]) -> str:
        return self.defn.kernel_key(p)

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
        if direction == "backward2":
            return f"backward2({self.name!r})"
        if direction in ("param_grad2", "param_grad2_param") and self.param_grad is not None:
            return f"param_grad2({self.name!r}, {self.param_grad[0]!r})"
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
            if prm.kind == "float" and abs(p[prm.name]) > F32_MAX and not (prm.inf_ok and p[prm.name] == math.inf):
                raise ValueError(
                    f"{fn or self.name + '()'}: parameter {prm.name!r} = {p[prm.name]:g} does not fit float32, "
                    f"where {getattr(dtype, 'name', dtype)} arrays are computed (|{prm.name}| <= {F32_MAX:g})"
                )


def _param_text(p: Param) -> str:
    """'negative_slope=0.01', "approximate='none'|'tanh'" (the default first), 'weight: array', 'threshold'."""
    if p.kind == "array":
        return f"{p.name}: array"
    if p.default is REQUIRED:
        return p.name
    if p.kind == "choice" and p.choices:
        return f"{p.name}={'|'.join(repr(c) for c in (p.default, *(c for c in p.choices if c != p.default)))}"
    return f"{p.name}={p.default!r}"


class OpTable(dict):
    """What `ma.ops()` returns: the op table as a dict (name -> OpSpec), which prints as a table of
    each op's parameters with their defaults, its y-form and extras."""

    def __repr__(self) -> str:
        from .cli._report import table

        rows = [[s.signature(), s.y_form_text(), s.extras()] for s in self.values()]
        head = f"{len(self)} ops; ma.ops()[name] is the OpSpec; y-form: the backward may start from the output y\n"
        return head + table(rows, ["op (parameters with defaults)", "y-form", "extras"], "lll")

    __str__ = __repr__

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython
        printer.text(repr(self))


_LINEAR = Tolerance(ulp32=1, ulp64=1, ulp16=1)
_EXP_FROM_Y = Tolerance(y_atol=2)
# selu, over all 65,536 bfloat16 inputs (results/bf16-exhaustive.txt): within the default 0.1% share of
# one-ulp results since every backend (a) holds scale * alpha as hi + lo in the y-form (dy * (y + sa) cancels
# where ~25,000 saturated inputs share y = -sa: 0.40% one ulp off with sa in float32) and (b) keeps the side of
# the exact value where x or y < 0 is too small to change e^x - 1, e^x or y + sa in float32 (scale * alpha *
# x, 6 dy at alpha=2, scale=3 are products float32 holds exactly on a bfloat16 tie: 0.93-1.02% before).  Left:
# alpha=2, scale=3 forward 10 inputs (0.015%), x subnormal in float32, where one ulp toward 0 is no nudge.
_SELU = Tolerance(y_atol=2)


def _scaled_arg(k: float | str) -> Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]:
    """cond = |k * x|, k a constant or the name of a parameter (alpha divides)."""
    if isinstance(k, str):
        return lambda x, p: np.abs(x / p[k]) if k == "alpha" else np.abs(x * p[k])
    return lambda x, p: np.abs(x * k)


def _crosses_zero(cond=None) -> Tolerance:
    """x * gate(x): the derivative crosses zero away from a kink, so around the crossing (where its terms
    cancel) |dy| times the terms' size sets an absolute floor."""
    return Tolerance(ulp32=8, ulp64=8, bwd_atol=8, cond=cond)


def _gelu_cond(x: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    if p["approximate"] == "tanh":
        return np.abs(2 * R.GELU_TANH_K * (x + R.GELU_TANH_C * x**3))
    return x * x  # erfc(z) ~ exp(-z^2): relative sensitivity 2 z^2 = x^2

# The numerics of each op of `multiact._opdefs`: float64 references (forward, backward, the y-form and
# the parameter gradient where the definition has them), kinks, accuracy bound.
_NUMERICS: dict[str, dict[str, Any]] = {
    "relu": dict(forward=R.relu, backward=R.relu_grad, backward_y=R.relu_grad, kinks=lambda p: (0.0,),
                 tol=_LINEAR),
    "relu6": dict(forward=R.relu6, backward=R.relu6_grad, backward_y=R.relu6_grad, kinks=lambda p: (0.0, 6.0),
                  tol=_LINEAR),
    "leaky_relu": dict(forward=R.leaky_relu, backward=R.leaky_relu_grad, backward_y=R.leaky_relu_grad,
                       kinks=lambda p: (0.0,), tol=_LINEAR),
    "prelu": dict(forward=R.prelu, backward=R.prelu_grad, param_grad_ref=R.prelu_weight_grad, kinks=lambda p: (0.0,),
                  tol=_LINEAR, param_grad2_ref=(R.prelu_grad2_weight, R.prelu_grad2_weight_weight)),
    "elu": dict(forward=R.elu, backward=R.elu_grad, backward_y=R.elu_grad_y, kinks=lambda p: (0.0,), tol=_EXP_FROM_Y,
                backward2=R.elu_grad2),
    "selu": dict(forward=R.selu, backward=R.selu_grad, backward_y=R.selu_grad_y, kinks=lambda p: (0.0,),
                 tol=_SELU,
                 backward2=R.selu_grad2),
    "celu": dict(forward=R.celu, backward=R.celu_grad, backward_y=R.celu_grad_y, kinks=lambda p: (0.0,),
                 tol=Tolerance(y_atol=2, cond=_scaled_arg("alpha")),
                 backward2=R.celu_grad2),
    "gelu": dict(forward=R.gelu, backward=R.gelu_grad, kinks=lambda p: (-0.7517915, 0.0),
                 tol=_crosses_zero(_gelu_cond),
                 backward2=R.gelu_grad2),
    "fast_gelu": dict(forward=R.fast_gelu, backward=R.fast_gelu_grad, kinks=lambda p: (0.0,),
                      tol=_crosses_zero(_scaled_arg(R.FAST_GELU_K)),
                      backward2=R.fast_gelu_grad2),
    "silu": dict(forward=R.silu, backward=R.silu_grad, kinks=lambda p: (-1.2784645, 0.0), tol=_crosses_zero(),
                 backward2=R.silu_grad2),
    "swish": dict(forward=R.swish, backward=R.swish_grad, param_grad_ref=R.swish_beta_grad, kinks=lambda p: (0.0,),
                  tol=_crosses_zero(_scaled_arg("beta")),
                  backward2=R.swish_grad2, param_grad2_ref=(R.swish_grad2_beta, R.swish_grad2_beta_beta)),
    "hardswish": dict(forward=R.hardswish, backward=R.hardswish_grad, kinks=lambda p: (-3.0, -1.5, 3.0),
                      tol=Tolerance(ulp32=2, ulp64=2, bwd_atol=2),
                      backward2=R.hardswish_grad2),
    "hardsigmoid": dict(forward=R.hardsigmoid, backward=R.hardsigmoid_grad,
                        kinks=lambda p: R._hardsigmoid_pieces(p["alpha"], p["beta"])[2:],
                        tol=Tolerance(ulp32=2, ulp64=2, fwd_atol=2)),
    "sigmoid": dict(forward=R.sigmoid_fwd, backward=R.sigmoid_grad, backward_y=R.sigmoid_grad_y,
                    backward2=R.sigmoid_grad2),
    "logsigmoid": dict(forward=R.logsigmoid, backward=R.logsigmoid_grad, tol=Tolerance(fwd_atol=1),
                       backward2=R.logsigmoid_grad2),
    "tanh": dict(forward=R.tanh, backward=R.tanh_grad, backward_y=R.tanh_grad_y,
                 backward2=R.tanh_grad2),
    "hardtanh": dict(forward=R.hardtanh, backward=R.hardtanh_grad, backward_y=R.hardtanh_grad,
                     kinks=lambda p: (p["min_val"], p["max_val"]), tol=_LINEAR),
    "softplus": dict(forward=R.softplus, backward=R.softplus_grad, kinks=lambda p: (p["threshold"] / p["beta"],),
                     tol=Tolerance(cond=_scaled_arg("beta")),
                     backward2=R.softplus_grad2),
    "softsign": dict(forward=R.softsign, backward=R.softsign_grad,
                     backward2=R.softsign_grad2),
    "mish": dict(forward=R.mish, backward=R.mish_grad, kinks=lambda p: (-1.1924, 0.0), tol=_crosses_zero(),
                 backward2=R.mish_grad2),
    "softshrink": dict(forward=R.softshrink, backward=R.shrink_grad, kinks=lambda p: (-p["lambd"], p["lambd"]),
                       tol=Tolerance(ulp32=1, ulp64=1, fwd_atol=1)),
    "hardshrink": dict(forward=R.hardshrink, backward=R.shrink_grad, kinks=lambda p: (-p["lambd"], p["lambd"]),
                       tol=_LINEAR),
    "tanhshrink": dict(forward=R.tanhshrink, backward=R.tanhshrink_grad, kinks=lambda p: (0.0,),
                       backward2=R.tanhshrink_grad2),
    "threshold": dict(forward=R.threshold, backward=R.threshold_grad, kinks=lambda p: (p["threshold"],),
                      tol=_LINEAR),
}

OPS: dict[str, OpSpec] = {name: OpSpec(d, **_NUMERICS[name]) for name, d in DEFINITIONS.items()}
# kernel key -> the op it belongs to ("gelu_tanh" -> gelu's spec)
KEYS: dict[str, OpSpec] = {k: s for s in OPS.values() for k in s.keys}


def register(spec: OpSpec) -> OpSpec:
    """Add an op to the table: the extension point (a new op is a definition, its references, and kernels
    in the backends that run it; the numpy backend runs any op from its references).  Returns the spec;
    `multiact.api.publish` then makes its public functions."""
    if spec.name in OPS or any(k in KEYS for k in spec.keys):
        raise ValueError(f"register(): an op or kernel key named {spec.name!r} exists already")
    OPS[spec.name] = spec
    KEYS.update({k: spec for k in spec.keys})
    if composable(spec.defn):  # the composite ops (glu's act=) take it at once
        FAMILY_KEYS.update({f.key(k): (f, spec, k) for f in FAMILIES.values() for k in spec.keys})
        BIAS_ACT_KEYS.update({BIAS_ACT.key(k): (BIAS_ACT, spec, k) for k in spec.keys})
    return spec


def unregister(name: str) -> OpSpec:
    """Take an op that `register` added out of the table again (its kernel keys and composite kernels with it);
    returns its spec.  ValueError for an op of the definitions or an unknown one.  Its public functions and
    kernels are the caller's to take out (`multiact.register_op` does, when one of them is refused)."""
    if name in DEFINITIONS or name not in OPS:
        raise ValueError(f"unregister(): {name!r} is not an op added with register()")
    spec = OPS.pop(name)
    for k in spec.keys:
        del KEYS[k]
    for table in (FAMILY_KEYS, BIAS_ACT_KEYS):
        for k in [k for k, (_, s, _) in table.items() if s is spec]:
            del table[k]
    return spec


def get(name: str) -> OpSpec:
    """The spec of op `name`, or ValueError listing the valid names."""
    try:
        return OPS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown op {name!r}; valid ops: {', '.join(OPS)}") from None


# Composite kernel key ("gated:silu") -> (its family, the activation's spec, the activation's key).
FAMILY_KEYS: dict[str, tuple[Any, OpSpec, str]] = {f.key(k): (f, OPS[d.name], k) for f, d, k in family_keys()}

# bias_act's own activation, the identity (StyleGAN's 'linear'): not an op of the table.
LINEAR = OpSpec(OpDef("linear", "The identity: bias_act's default activation.", "x", piecewise_linear="exact"),
                forward=lambda x: x * 1.0, backward=lambda dy, x: dy * np.ones_like(x), tol=_LINEAR)

# bias_act:<act> -> (its family, the activation's spec, the activation's key).
BIAS_ACT_KEYS: dict[str, tuple[Any, OpSpec, str]] = {
    BIAS_ACT.key(k): (BIAS_ACT, OPS[d.name], k) for d in DEFINITIONS.values() if composable(d) for k in d.keys}
BIAS_ACT_KEYS[BIAS_ACT.key(LINEAR.name)] = (BIAS_ACT, LINEAR, LINEAR.name)
