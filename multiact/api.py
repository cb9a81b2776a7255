"""The public functions, generated from the op table with real signatures and docstrings.

Each op gets `name(x, *params, out=None, backend=None, quant=None)` and
`name_grad(dy, x, *params, [y=None,] out=None, backend=None, quant=None)`; swish and prelu
also get their parameter gradients.  Functions are compiled from source so
that help(), inspect and IDEs show the actual parameters, and so that a call
on NumPy arrays seen before is one dictionary lookup away from its kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import checks, elementwise, hot, registry
from ._config import get_num_threads
from .dequant import DOC as DEQUANT_DOC
from .errors import YFormError
from .optable import OPS, REQUIRED, OpSpec, get, in_float32, value_key


def forward(op: str, x: Any, *, out: Any = None, backend: str | None = None, quant: Any = None,
            dequant: Any = None, **params: Any) -> Any:
    """Generic forward: `forward("gelu", x, approximate="tanh")` is `gelu(x, approximate="tanh")`."""
    return elementwise.call(get(op), "forward", {"x": x}, params, out, backend, quant, dequant)


def backward(
    op: str, dy: Any, x: Any = None, *, y: Any = None, out: Any = None, backend: str | None = None,
    quant: Any = None, **params: Any
) -> Any:
    """Generic backward: dL/dx from dy and the input x (or, where the op allows, the output y=)."""
    return _grad(get(op), dy, x, y, params, out, backend, quant)


def param_grad(op: str, param: str, dy: Any, x: Any, *, backend: str | None = None, **params: Any) -> Any:
    """Generic parameter gradient: `param_grad("swish", "beta", dy, x, beta=1.3)`."""
    spec = get(op)
    if spec.param_grad is None or spec.param_grad[0] != param:
        raise ValueError(f"{op} has no gradient for parameter {param!r}")
    return elementwise.call(spec, "param_grad", {"dy": dy, "x": x}, params, None, backend)


def backward2(
    op: str, g: Any, dy: Any, x: Any, *, out: Any = None, backend: str | None = None, **params: Any
) -> Any:
    """Second order: g * dy * f''(x), the backward of `backward(op, dy, x)` with respect to x for an
    upstream gradient g of its result (its backward with respect to dy is `backward(op, g, x)`).
    g, dy and x must share dtype and shape; out=, backend= and the parameters as for `backward`."""
    return elementwise.call(get(op), "backward2", {"g": g, "dy": dy, "x": x}, params, out, backend)


def param_grad2(
    op: str, param: str, g: Any, dy: Any, x: Any, *, wrt: str = "x", out: Any = None, backend: str | None = None,
    **params: Any,
) -> Any:
    """Second order in a learnable parameter p (swish's beta, prelu's weight), elementwise, not summed:
    wrt="x": g * dy * d2f/dx dp (summed to p's shape, the gradient of <g, backward(op, dy, x)> with respect
    to p; with g the parameter gradient's upstream, broadcast to x, the gradient of <g, param_grad(...)>
    with respect to x); wrt=param: g * dy * d2f/dp2 (summed, the parameter gradient's own gradient)."""
    spec = get(op)
    if spec.param_grad is None or spec.param_grad[0] != param or spec.param_grad2_ref is None:
        raise ValueError(f"{op} has no second derivative in parameter {param!r}")
    if wrt not in ("x", param):
        raise ValueError(f"param_grad2({op!r}, {param!r}): wrt must be 'x' or {param!r}, got {wrt!r}")
    direction = "param_grad2" if wrt == "x" else "param_grad2_param"
    return elementwise.call(spec, direction, {"g": g, "dy": dy, "x": x}, params, out, backend)


def _grad(spec: OpSpec, dy, x, y, params, out, backend, quant=None):
    name = spec.label("backward")
    if y is None:
        if x is None:
            raise TypeError(f"{name} needs the input x (or, where the op allows it, the output y=)")
        return elementwise.call(spec, "backward", {"dy": dy, "x": x}, params, out, backend, quant)
    if x is not None:
        raise ValueError(f"{name}: pass the input x or the output y=, not both")
    if spec.backward_y is None:
        raise YFormError(f"{name}: y= is not supported: {spec.name}'s derivative needs the input x")
    p = spec.validate(params, name)
    if not spec.supports_y(p):
        raise ValueError(f"{name}: y= is only supported when {spec.y_condition}")
    if not spec.supports_y(p, getattr(y, "dtype", None)):
        raise ValueError(f"{name}: y= is only supported when {spec.y_condition}, in float32 (where the kernels "
                         f"compute {y.dtype}): the parameters {p} round to {in_float32(p)}")
    return elementwise.call(spec, "backward_y", {"dy": dy, "y": y}, params, out, backend, quant)


def _param_doc(spec: OpSpec) -> str:
    lines = []
    for p in spec.params:
        default = "required" if p.default is REQUIRED else f"default {p.default!r}"
        extra = f"; {p.doc}" if p.doc else ""
        lines.append(f"    {p.name}: {p.range_text()} ({default}){extra}")
    return "\n".join(lines)


def _sig(spec: OpSpec, x_optional: bool = False) -> tuple[str, str]:
    """('a=1.0, b=2.0', "{'a': a, 'b': b}") for the op's parameters.  After an optional x (a backward
    may take y= instead), a required parameter defaults to REQUIRED, which validation refuses by name."""
    def default(p):
        if p.default is not REQUIRED:
            return f"={p.default!r}"
        return "=REQUIRED" if x_optional else ""

    parts = [f"{p.name}{default(p)}" for p in spec.params]
    return ", ".join(parts), "{" + ", ".join(f"{p.name!r}: {p.name}" for p in spec.params) + "}"


def _docs(spec: OpSpec) -> dict[str, str]:
    params = _param_doc(spec)
    pblock = f"\n\nParameters (PyTorch's names and defaults):\n{params}" if params else ""
    common = "out: write the result here (out=x is in place); backend: run on this backend only."
    quant = ("\nquant: a multiact.Quant: return (codes, scales) of the float32 result instead "
             "(multiact.quantize's contract).")
    fwd = f"{spec.summary}\n\n    y = {spec.formula}{pblock}\n\n{common}{quant}{DEQUANT_DOC}"
    ycan = ""
    if spec.backward_y is not None:
        cond = f" (when {spec.y_condition})" if spec.y_condition else ""
        ycan = f"\n\nPass y= (the forward's output) instead of x{cond}: what an in-place forward needs."
    bwd = f"Backward of {spec.name}: dy * d{spec.name}(x)/dx.{ycan}{pblock}\n\n{common}{quant}"
    return {"fwd": fwd, "bwd": bwd}


# The hot path: a call on plain NumPy arrays whose (direction, dtype, parameter values, backend
# preference) was seen before runs its cached kernel after the same checks of its arrays as the
# checked path (check_out; dtype and shape agreement). Parameters take it only as plain numbers
# (or str choices): anything else (a tensor, a list, an object with __float__) is read afresh by
# elementwise.call, and the key holds the value itself, +0.0 and -0.0 apart.
_FAST_FWD = """
def {name}(x{pre}, *, out=None, backend=None, quant=None, dequant=None):
    if quant is not None or dequant is not None:
        return _call(_spec, 'forward', {{'x': x}}, {pdict}, out, backend, quant, dequant){cfwd}
    if type(x) is _nd and {fast}(out is None or type(out) is _nd) and (backend is None or type(backend) is str):
        hit = _cache.get(('forward', x.dtype{keys}, backend, _prefs()))
        if hit is not None:
            if out is None:
                res = _empty_like(x)
            else:
                _check_out(_FN, out, {{'x': x}}, x)
                res = out
            try:
                hit.kernel(x, res, hit.p)
            except Exception as e:
                _annotate(e, hit)
                raise
            return res
    elif type(x) is _tt[0] and {fast}(backend is None or type(backend) is str):
        hit = _cache.get(('forward', x.dtype{keys}, backend, _prefs()))
        if hit is not None:
            at = hit.at
            if at is not None and out is None and x.is_cpu and {direct}:
                res = _tempty[0](x)
                at[0](at[1], x.data_ptr(), res.data_ptr(), res.numel(), _threads())
                return res
            res = _thot(hit, _FN, ('x',), (x,), out)
            if res is not _MISS:
                return res
    return _call(_spec, 'forward', {{'x': x}}, {pdict}, out, backend)
"""

# One hot path for x and y= (a cached backward_y passed _grad's y= checks for these parameters and
# this dtype before it was cached; an op without a y-form never has one, so y= reaches _grad's message).
# Plain CPU tensors take hot.tensor_hot the same way (keyed by the torch dtype), which hands any call
# it cannot vouch for back to the checked path; the forward runs its commonest case (no out=, a contiguous
# tensor, a kernel that takes addresses: hot.tensor_hot's first branch) itself, one call fewer.
_FAST_GRAD = """
def {name}_grad(dy, x=None{pre}, *, y=None, out=None, backend=None, quant=None):
    if quant is not None:
        return _grad(_spec, dy, x, y, {pdict}, out, backend, quant){cgrad}
    if type(dy) is _nd and {fast}(out is None or type(out) is _nd) and (backend is None or type(backend) is str):
        if y is None:
            a, d, an = x, 'backward', 'x'
        else:
            a, d, an = (y, 'backward_y', 'y') if x is None else (None, None, None)
        if type(a) is _nd and dy.dtype == a.dtype and dy.shape == a.shape:
            hit = _cache.get((d, a.dtype{keys}, backend, _prefs()))
            if hit is not None:
                if out is None:
                    res = _empty_like(a)
                else:
                    _check_out(_FN_GRAD, out, {{'dy': dy, an: a}}, a)
                    res = out
                try:
                    hit.kernel(dy, a, res, hit.p)
                except Exception as e:
                    _annotate(e, hit)
                    raise
                return res
    elif type(dy) is _tt[0] and {fast}(backend is None or type(backend) is str):
        if y is None:
            a, d, an = x, 'backward', 'x'
        else:
            a, d, an = (y, 'backward_y', 'y') if x is None else (None, None, None)
        if type(a) is _tt[0]:
            hit = _cache.get((d, a.dtype{keys}, backend, _prefs()))
            if hit is not None:
                res = _thot(hit, _FN_GRAD, ('dy', an), (dy, a), out)
                if res is not _MISS:
                    return res
    return _grad(_spec, dy, x, y, {pdict}, out, backend)
"""


# Where multiact._hotpath is built, each function asks it first: it runs what it can vouch for (plain
# contiguous arrays of a native kernel's dtype; see native/hotpath/hotpath.c) and returns None otherwise.
_C_FIRST = """
    res = {call}
    if res is not None:
        return res"""


def _fast_terms(spec: OpSpec) -> tuple[str, str]:
    """The hot path's guard (each parameter a plain number or str) and its key terms."""
    fast, keys = [], []
    for p in spec.params:
        if p.kind == "choice":
            fast.append(f"type({p.name}) is str and ")
            keys.append(f", {p.name}")
        else:
            fast.append(f"type({p.name}) in _NUM and ")
            keys.append(f", {p.name} or _zero_key({p.name})")
    return "".join(fast), "".join(keys)


# Plain numbers whose value (and hash) is the float they convert to: the hot path keys on them as given.
_NUM = frozenset((float, int, np.float64, np.float32, np.float16))


def _zero_key(v: Any) -> Any:
    return value_key(float(v))


def _make(spec: OpSpec) -> dict[str, Any]:
    plist, pdict = _sig(spec)
    pre = f", {plist}" if plist else ""
    gpre = f", {_sig(spec, x_optional=True)[0]}" if plist else ""
    name = spec.name
    ns: dict[str, Any] = {
        "_spec": spec, "_call": elementwise.call, "_grad": _grad, "_nd": np.ndarray, "_empty_like": np.empty_like,
        "_cache": hot.cache(spec.name), "_prefs": registry.preference_key, "_NUM": _NUM,
        "_zero_key": _zero_key, "_check_out": checks.check_out, "_annotate": hot.annotate,
        "_tt": hot.TENSOR, "_thot": hot.tensor_hot, "_MISS": hot.MISS, "_tempty": hot.EMPTY_LIKE,
        "_STRIDED": hot.STRIDED, "_threads": get_num_threads,
        "_FN": spec.label("forward"), "_FN_GRAD": spec.label("backward"), "REQUIRED": REQUIRED,
    }
    if elementwise.array_param(spec) is not None:  # an array parameter (prelu's weight): always the checked path
        src = [
            f"def {name}(x{pre}, *, out=None, backend=None, quant=None, dequant=None):\n"
            f"    return _call(_spec, 'forward', {{'x': x}}, {pdict}, out, backend, quant, dequant)\n",
            f"def {name}_grad(dy, x=None{gpre}, *, y=None, out=None, backend=None, quant=None):\n"
            f"    return _grad(_spec, dy, x, y, {pdict}, out, backend, quant)\n",
        ]
    else:
        fast, keys = _fast_terms(spec)
        cfwd = cgrad = ""
        if hot.C is not None:  # the C hot path first (see hot.c_op); None: the paths below
            args = "".join(f", {p.name}" for p in spec.params)
            ns["_cfwd"], ns["_cgrad"] = hot.c_op(spec, "forward"), hot.c_op(spec, "grad")
            cfwd = _C_FIRST.format(call=f"_cfwd(x, out, backend{args})")
            cgrad = _C_FIRST.format(call=f"_cgrad(dy, x, y, out, backend{args})")
        src = [
            _FAST_FWD.format(name=name, pre=pre, fast=fast, keys=keys, pdict=pdict, direct=hot.direct_test("x"),
                             cfwd=cfwd),
            _FAST_GRAD.format(name=name, pre=gpre, fast=fast, keys=keys, pdict=pdict, cgrad=cgrad),
        ]
    if spec.param_grad is not None:
        src.append(
            f"def {name}_{spec.param_grad[0]}_grad(dy, x{pre}, *, backend=None):\n"
            f"    return _call(_spec, 'param_grad', {{'dy': dy, 'x': x}}, {pdict}, None, backend)\n"
        )
    exec(compile("\n".join(src), f"<multiact.{name}>", "exec"), ns)  # noqa: S102 - generated from the op table
    docs = _docs(spec)
    funcs = {name: ns[name], f"{name}_grad": ns[f"{name}_grad"]}
    funcs[name].__doc__ = docs["fwd"]
    funcs[f"{name}_grad"].__doc__ = docs["bwd"]
    if spec.param_grad is not None:
        pname = spec.param_grad[0]
        f = ns[f"{name}_{pname}_grad"]
        f.__doc__ = (
            f"Gradient of the loss with respect to {name}'s {pname!r}, summed over every element "
            f"(accumulated in float64).{('' if not _param_doc(spec) else chr(10) * 2 + _param_doc(spec))}"
        )
        funcs[f.__name__] = f
    for f in funcs.values():
        f.__module__ = "multiact"
    return funcs


FUNCTIONS: dict[str, Any] = {}
for _spec in OPS.values():
    FUNCTIONS.update(_make(_spec))
del _spec


def publish(spec: OpSpec) -> dict[str, Any]:
    """The public functions of an op added with `ops.register` (`multiact.register_op` does both)."""
    funcs = _make(spec)
    FUNCTIONS.update(funcs)
    return funcs
