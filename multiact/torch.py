"""multiact's activations inside PyTorch autograd: functions and nn.Modules, generated from the op table.

    import multiact.torch as mt
    y = mt.gelu(x, approximate="tanh")          # backward runs ma.gelu_grad
    act = mt.Swish(beta=1.0, learnable=True)    # beta learns through ma.swish_beta_grad

Forward and backward both go through multiact's dispatcher, so a CPU tensor runs
on the best CPU backend (as a zero-copy NumPy view) and a CUDA tensor on the
`cuda` backend.  With inplace=True the input is overwritten; the backward then
starts from the output where the op allows it (`spec.supports_y`), and otherwise
from a copy of the input taken before the write (what PyTorch does for its own
in-place ops that need their input).  Every function runs torch.library custom ops
(torch.ops.multiact.<op>, <op>_grad, <op>_grad2 ...), so torch.compile(fullgraph=True) sees
through them and backwards are differentiable again (second order: gradient penalties).

The gated family comes from the composite definitions the same way:

    y = mt.swiglu(x)                 # silu(first half) * second half; the backward writes both halves
    y = mt.swiglu(gate, up=up)       # two-input form: gate and up both get gradients
    mlp = w2(mt.SwiGLU()(w13(x)))    # modules: mt.GLU, mt.SwiGLU, mt.GeGLU, mt.ReGLU

Importing this module imports torch; `import multiact` never does.
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
from typing import Any

import numpy as np
import torch
from torch import nn

import multiact as _multiact

from . import api, checks, elementwise, fused_bias_act, gated, hot, registry, torch_quant
from ._config import get_num_threads
from ._opdefs import COMPOSITES, GATED, CompositeDef
from ._torch_func import TransformableOp
from .optable import OPS, REQUIRED, OpSpec

__all__: list[str] = []


def _as_tensor(value: Any, like: torch.Tensor) -> torch.Tensor:
    """A backend result (tensor, NumPy scalar/array, CUDA array) as a tensor of like's dtype, device, shape."""
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value, device=like.device)
    return value.to(device=like.device, dtype=like.dtype).reshape(like.shape)


def _as_result(y: Any, x: torch.Tensor) -> torch.Tensor:
    """The forward's result as a tensor on x's device (a backend may hand back another CUDA array kind)."""
    return y if isinstance(y, torch.Tensor) else torch.as_tensor(y, device=x.device)


# ---- torch.library custom ops, generated from the definitions ------------------------------------------
#
# Every op is `torch.ops.multiact.<name>` with a schema built from its parameters (floats as float, choices
# as str, prelu's weight as Tensor), a fake (meta) implementation that checks the parameters and gives the
# result's shape, dtype, device and layout, and an autograd registration whose backward calls the next op
# down (forward -> <op>_grad -> <op>_grad2), so a backward is itself differentiable where the second
# derivative exists.  The real implementations run multiact's dispatcher on the tensors as they are: a CPU
# tensor on the CPU backends (a zero-copy NumPy view), a CUDA tensor on `cuda`.

NAMESPACE = "multiact"
CUSTOM_OPS: dict[str, Any] = {}  # name -> torch.library CustomOpDef (torch.ops.multiact.<name>)
_NO_DEFAULT = object()


class _Arg:
    """One argument of a generated op: its name, schema type and default."""

    __slots__ = ("name", "type", "default")

    def __init__(self, name: str, type_: str, default: Any = _NO_DEFAULT):
        self.name, self.type, self.default = name, type_, default

    def schema(self) -> str:
        if self.default is _NO_DEFAULT or self.default is REQUIRED:
            return f"{self.type} {self.name}"
        d = self.default
        text = "None" if d is None else f'"{d}"' if isinstance(d, str) else repr(d)
        return f"{self.type} {self.name}={text}"

    def py(self) -> str:
        if self.default is _NO_DEFAULT or self.default is REQUIRED:
            return self.name
        return f"{self.name}={self.default!r}"


def _define(name: str, args: list[_Arg], returns: str, impl, fake, mutates: tuple[str, ...] = ()):
    """torch.ops.multiact.<name>: a custom op calling impl(*args), with fake(*args) as its meta function."""
    sig = ", ".join(a.py() for a in args)
    names = ", ".join(a.name for a in args)
    src = (f"def {name}({sig}):\n    return _impl({names})\n"
           f"def {name}_fake({sig}):\n    return _fake({names})\n")
    ns: dict[str, Any] = {"_impl": impl, "_fake": fake}
    exec(compile(src, f"<torch.ops.multiact.{name}>", "exec"), ns)  # noqa: S102 - generated from the definitions
    schema = "(" + ", ".join(a.schema() for a in args) + ") -> " + returns
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", ns[name], mutates_args=mutates, schema=schema)
    if fake is not None:
        op.register_fake(ns[f"{name}_fake"])
    op.__class__ = TransformableOp  # torch.func transforms take it (multiact/_torch_func.py)
    CUSTOM_OPS[name] = op
    return op


def _layout(res: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """res with the strides torch.empty_like(like) has (what the fake implementations promise)."""
    if res.is_contiguous() and like.is_contiguous():
        return res
    want = torch.empty_like(like)
    if want.stride() == res.stride():
        return res
    return want.copy_(res)


def _written_in_place(like: torch.Tensor) -> bool:
    """Whether a result can be written straight into a tensor allocated like `like` (any host tensor: bfloat16
    ones are zero-copy NumPy bfloat16 views too)."""
    return like.device.type == "cpu"


def _elementwise(spec: OpSpec, direction: str, named: dict, p: dict, backend, like: torch.Tensor) -> torch.Tensor:
    if _written_in_place(like):
        out = torch.empty_like(like)
        elementwise.call(spec, direction, named, p, out, backend)
        return out
    return _layout(_as_result(elementwise.call(spec, direction, named, p, None, backend), like), like)


def _to(value: Any, like: torch.Tensor) -> torch.Tensor:
    """A parameter gradient (NumPy scalar, array or tensor) as a tensor of like's dtype, device and shape."""
    if not isinstance(value, torch.Tensor):
        arr = np.asarray(value)
        if arr.dtype.kind == "V":  # NumPy bfloat16 (torch cannot take it): its float32 values, exactly
            arr = arr.astype(np.float32)
        value = torch.as_tensor(arr, device=like.device)
    return value.to(device=like.device, dtype=like.dtype).reshape(like.shape).clone()


def _second_order_error(what: str, why: str) -> RuntimeError:
    return RuntimeError(f"multiact.torch: {what} is not differentiable: {why}.  First-order gradients work; "
                        "use torch's own function where a higher derivative is needed")


def _has_backward2() -> bool:
    return hasattr(_multiact, "backward2")


class _OpSet:
    """The custom ops of one op of the table: forward, in-place forward, backward (from x, and from y
    where the op allows), parameter gradient and second derivative (where multiact has them).

    learn: the name of the op's parameter that is a tensor in these ops' schemas (prelu's weight; swish's
    beta in the `swish_t` set, for a learnable beta), else None."""

    def __init__(self, spec: OpSpec, tensor_learn: bool = False):
        self.spec = spec
        pg = spec.defn.param_grad
        array = [p.name for p in spec.params if p.kind == "array"]
        self.learn = pg if tensor_learn else (array[0] if array else None)
        self.base = spec.name + ("_t" if tensor_learn else "")
        self.li = None if self.learn is None else spec.param_names.index(self.learn)
        self.names = spec.param_names
        params = [_Arg(p.name, self._type(p), p.default if p.name != self.learn else _NO_DEFAULT)
                  for p in spec.params]
        tail = [*params, _Arg("backend", "str?", None)]
        b = self.base
        self.fwd = _define(b, [_Arg("x", "Tensor"), *tail], "Tensor", self._forward, self._fake_like_x)
        self.fwd_ = _define(f"{b}_", [_Arg("x", "Tensor(a!)"), *tail], "()", self._forward_inplace,
                            self._fake_none, mutates=("x",))
        self.grad = _define(f"{b}_grad", [_Arg("dy", "Tensor"), _Arg("x", "Tensor"), *tail], "Tensor",
                            self._backward, self._fake_like_x2)
        self.grad_y = None
        if spec.backward_y is not None:
            self.grad_y = _define(f"{b}_grad_y", [_Arg("dy", "Tensor"), _Arg("y", "Tensor"), *tail], "Tensor",
                                  self._backward_y, self._fake_like_x2)
        self.pgrad = None
        if pg is not None:
            self.pgrad = _define(f"{b}_{pg}_grad", [_Arg("dy", "Tensor"), _Arg("x", "Tensor"), *tail], "Tensor",
                                 self._param_grad, self._fake_param_grad)
        self.grad2 = None
        if _has_backward2():
            self.grad2 = _define(f"{b}_grad2", [_Arg("g", "Tensor"), _Arg("dy", "Tensor"), _Arg("x", "Tensor"),
                                                *tail], "Tensor", self._backward2, self._fake_like_x3)
        self.fwd.register_autograd(self._fwd_backward, setup_context=self._setup_x)
        self.grad.register_autograd(self._grad_backward, setup_context=self._setup_grad)
        if self.grad_y is not None:
            self.grad_y.register_autograd(self._grad_y_backward, setup_context=self._setup_grad)
        if self.pgrad is not None:
            self.pgrad.register_autograd(self._pgrad_backward, setup_context=self._setup_grad)
        if self.grad2 is not None:
            self.grad2.register_autograd(self._grad2_backward, setup_context=self._setup_none)
        plain = self.learn is None  # no tensor parameter: every tensor argument is elementwise with x
        self.fwd.transform_rules(jvp=self._fwd_jvp, elementwise=plain)
        self.grad.transform_rules(jvp=self._grad_jvp, elementwise=plain)
        for op in (self.grad_y, self.grad2):
            if op is not None:
                op.transform_rules(elementwise=plain)

    def _type(self, p) -> str:
        if p.name == self.learn:
            return "Tensor"
        return {"float": "float", "choice": "str", "int": "int"}[p.kind]

    # -- the parameters as the dispatcher takes them --

    def _params(self, vals: tuple) -> tuple[dict, Any]:
        *pv, backend = vals
        p = dict(zip(self.names, pv, strict=True))
        if self.learn is not None and self.spec.params[self.li].kind == "float":
            p[self.learn] = float(p[self.learn])  # swish_t's beta: read inside the op, where tracing never goes
        return p, backend

    def _check(self, vals: tuple) -> None:
        """The fake implementations' parameter check: a bad value fails while tracing, not at run time."""
        *pv, backend = vals
        if self.learn is not None and self.spec.params[self.li].kind == "array":
            return  # prelu: the weight is checked against x by the real call
        p = dict(zip(self.names, pv, strict=True))
        if self.learn is not None:
            p[self.learn] = self.spec.params[self.li].default
        checks.check_backend(self.spec.label("forward"), backend)
        self.spec.validate(p)

    # -- real implementations --

    def _forward(self, x, *vals):
        p, backend = self._params(vals)
        return _elementwise(self.spec, "forward", {"x": x}, p, backend, x)

    def _forward_inplace(self, x, *vals):
        p, backend = self._params(vals)
        elementwise.call(self.spec, "forward", {"x": x}, p, x, backend)

    def _backward(self, dy, x, *vals):
        p, backend = self._params(vals)
        return _elementwise(self.spec, "backward", {"dy": dy, "x": x}, p, backend, x)

    def _backward_y(self, dy, y, *vals):
        p, backend = self._params(vals)
        return _elementwise(self.spec, "backward_y", {"dy": dy, "y": y}, p, backend, y)

    def _param_grad(self, dy, x, *vals):
        p, backend = self._params(vals)
        g = elementwise.call(self.spec, "param_grad", {"dy": dy, "x": x}, p, None, backend)
        return _to(g, self._param_like(x, vals))

    def _backward2(self, g, dy, x, *vals):
        p, backend = self._params(vals)
        if _written_in_place(x):
            out = torch.empty_like(x)
            _multiact.backward2(self.spec.name, g, dy, x, out=out, backend=backend, **p)
            return out
        return _layout(_as_result(_multiact.backward2(self.spec.name, g, dy, x, backend=backend, **p), x), x)

    # -- fake implementations --

    def _fake_like_x(self, x, *vals):
        self._check(vals)
        return torch.empty_like(x)

    def _fake_like_x2(self, dy, x, *vals):
        self._check(vals)
        return torch.empty_like(x)

    def _fake_like_x3(self, g, dy, x, *vals):
        self._check(vals)
        return torch.empty_like(x)

    def _fake_none(self, x, *vals):
        self._check(vals)

    def _param_like(self, x, vals):
        return vals[self.li] if self.learn is not None else x.new_empty(())

    def _fake_param_grad(self, dy, x, *vals):
        self._check(vals)
        return torch.empty_like(self._param_like(x, vals))

    # -- autograd --

    def _setup_x(self, ctx, inputs, output):
        x, *vals = inputs
        learn = None if self.li is None else vals[self.li]
        ctx.save_for_backward(x, learn)
        ctx.vals = [None if isinstance(v, torch.Tensor) else v for v in vals]

    def _setup_grad(self, ctx, inputs, output):
        dy, x, *vals = inputs
        learn = None if self.li is None else vals[self.li]
        ctx.save_for_backward(dy, x, learn)
        ctx.vals = [None if isinstance(v, torch.Tensor) else v for v in vals]

    def _setup_none(self, ctx, inputs, output):
        pass

    def _vals(self, ctx, learn):
        vals = list(ctx.vals)
        if self.li is not None:
            vals[self.li] = learn
        return vals

    def _fwd_backward(self, ctx, g):
        x, learn = ctx.saved_tensors
        vals = self._vals(ctx, learn)
        need = ctx.needs_input_grad
        res: list[Any] = [None] * (1 + len(vals))
        if need[0]:
            res[0] = self.grad(g, x, *vals)
        if self.li is not None and need[1 + self.li]:
            res[1 + self.li] = self.pgrad(g, x, *vals)
        return tuple(res)

    def _grad_backward(self, ctx, gg):
        """Of dx = dy * f'(x): d(dy) = gg * f'(x) (the first backward again), d(x) = gg * dy * f''(x)."""
        dy, x, learn = ctx.saved_tensors
        vals = self._vals(ctx, learn)
        need = ctx.needs_input_grad
        res: list[Any] = [None] * (2 + len(vals))
        if need[0]:
            res[0] = self.grad(gg, x, *vals)
        if need[1]:
            if self.grad2 is None:
                raise _second_order_error(
                    f"the gradient of multiact.{self.spec.name}_grad with respect to x (double backward)",
                    "it needs multiact.backward2 (f''), which this version of multiact does not have")
            res[1] = self.grad2(gg, dy, x, *vals)
        if self.li is not None and need[2 + self.li]:
            res[2 + self.li] = _mixed(self, gg, dy, x, vals)
        return tuple(res)

    def _grad_y_backward(self, ctx, gg):
        dy, y, learn = ctx.saved_tensors
        vals = self._vals(ctx, learn)
        need = ctx.needs_input_grad
        res: list[Any] = [None] * (2 + len(vals))
        if need[0]:
            res[0] = self.grad_y(gg, y, *vals)
        if need[1] and self.spec.defn.y_form != "same":  # "same": piecewise linear, d/dy of f' is 0
            raise _second_order_error(
                f"multiact.{self.spec.name}_grad(dy, y=...) with respect to y (the backward of an in-place "
                f"{self.spec.name})", "its derivative in terms of the output is not in the op table; "
                "use inplace=False where the second derivative is needed")
        return tuple(res)

    def _pgrad_backward(self, ctx, gg):
        dy, x, learn = ctx.saved_tensors
        vals = self._vals(ctx, learn)
        return _mixed_pgrad(self, ctx.needs_input_grad, gg, dy, x, vals)

    def _tangent_of_x_only(self, tangents, first: int) -> None:
        if any(t is not None for t in tangents[first:]):
            raise RuntimeError(f"multiact.torch.{self.spec.name}: forward-mode differentiation (jvp, jacfwd, "
                               f"hessian) with respect to {self.learn} is not defined; use reverse mode")

    def _fwd_jvp(self, inputs, tangents):
        """d f(x) = f'(x) dx: the first backward applied to the tangent."""
        x, *vals = inputs
        self._tangent_of_x_only(tangents, 1)
        return self.grad(tangents[0], x, *vals)

    def _grad_jvp(self, inputs, tangents):
        """d(dy f'(x)) = d(dy) f'(x) + dy f''(x) dx."""
        dy, x, *vals = inputs
        self._tangent_of_x_only(tangents, 2)
        t_dy, t_x = tangents[:2]
        out = None if t_dy is None else self.grad(t_dy, x, *vals)
        if t_x is not None:
            if self.grad2 is None:
                raise _second_order_error(f"the forward-mode derivative of multiact.{self.spec.name}_grad in x",
                                          "it needs multiact.backward2 (f'')")
            d2 = self.grad2(t_x, dy, x, *vals)
            out = d2 if out is None else out + d2
        return torch.zeros_like(x) if out is None else out

    def _grad2_backward(self, ctx, g3):
        raise _second_order_error(f"multiact.{self.spec.name}_grad2 (a third derivative)",
                                  "multiact has derivatives up to the second")

    def args(self, params: dict, backend) -> tuple:
        return (*(params[n] for n in self.names), backend)


# The mixed second derivatives of the two ops with a learnable parameter, where the parameter meets x: these
# are products and sums of elementary terms (prelu's are its linear part), written with torch's own ops.


def _channel(w: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    """prelu's weight broadcast along x's axis, in x's dtype."""
    if w.numel() == 1:
        return w.reshape(()).to(x.dtype)
    shape = [1] * x.ndim
    shape[axis % x.ndim] = -1
    return w.reshape(shape).to(x.dtype)


def _per_channel(t: torch.Tensor, x: torch.Tensor, w: torch.Tensor, axis: int) -> torch.Tensor:
    """t summed to prelu's weight's shape (over every axis but `axis`)."""
    if w.numel() == 1:
        return t.sum().reshape(w.shape).to(w.dtype)
    ax = axis % x.ndim
    return t.sum([d for d in range(x.ndim) if d != ax]).reshape(w.shape).to(w.dtype)


def _swish_terms(x: torch.Tensor, beta: torch.Tensor):
    b = beta.to(x.dtype)
    s = torch.sigmoid(b * x)
    ds = s * (1 - s)
    return b, s, ds


# The second derivatives of an op in its learnable parameter, registered against the op (prelu's weight, swish's
# beta): mixed(s, gg, dy, x, vals) -> d/d(param) of <gg, dy * f'(x)>; pgrad(s, need, gg, dy, x, vals) -> the
# backward of the parameter gradient sum(dy * df/dp) for an upstream gg of the parameter's shape.
_MIXED: dict[str, Any] = {}
_PGRAD: dict[str, Any] = {}


def _second_rule(table: dict[str, Any], op: str):
    def register(fn):
        table[op] = fn
        return fn
    return register


@_second_rule(_MIXED, "prelu")
def _prelu_mixed(s: _OpSet, gg, dy, x, vals):
    return _per_channel(torch.where(x > 0, torch.zeros_like(x), gg * dy), x, vals[s.li], vals[1])


@_second_rule(_MIXED, "swish")
def _swish_mixed(s: _OpSet, gg, dy, x, vals):
    learn = vals[s.li]
    b, _, ds = _swish_terms(x, learn)
    return (gg * dy * x * ds * (2 + b * x * (1 - 2 * torch.sigmoid(b * x)))).sum().to(learn.dtype)


@_second_rule(_PGRAD, "prelu")
def _prelu_pgrad(s: _OpSet, need, gg, dy, x, vals):
    res: list[Any] = [None] * len(need)
    w = _channel(gg, x, vals[1])
    neg = x <= 0
    if need[0]:
        res[0] = torch.where(neg, w * x, torch.zeros_like(x))
    if need[1]:
        res[1] = torch.where(neg, w * dy, torch.zeros_like(x))
    return tuple(res)


@_second_rule(_PGRAD, "swish")
def _swish_pgrad(s: _OpSet, need, gg, dy, x, vals):
    res: list[Any] = [None] * len(need)
    learn = vals[s.li]
    b, sg, ds = _swish_terms(x, learn)
    g = gg.to(x.dtype)
    if need[0]:
        res[0] = g * x * x * ds
    if need[1]:
        res[1] = g * dy * x * ds * (2 + b * x * (1 - 2 * sg))
    if need[2 + s.li]:
        res[2 + s.li] = (g * (dy * x ** 3 * ds * (1 - 2 * sg)).sum()).to(learn.dtype)
    return tuple(res)


def _mixed(s: _OpSet, gg, dy, x, vals):
    """d/d(learnable parameter) of <gg, dy * f'(x>: the mixed second derivative, where the op registered it."""
    rule = _MIXED.get(s.spec.name)
    if rule is None:
        raise _second_order_error(
            f"the gradient of multiact.{s.spec.name}_grad with respect to {s.learn} (double backward)",
            "its mixed second derivative is not written")
    return rule(s, gg, dy, x, vals)


def _mixed_pgrad(s: _OpSet, need, gg, dy, x, vals):
    """The backward of the parameter gradient, where the op registered it (a learnable parameter given as a
    tensor)."""
    if not any(need):
        return (None,) * len(need)
    rule = _PGRAD.get(s.spec.name)
    if rule is None or s.li is None:
        raise _second_order_error(f"multiact.{s.spec.name}_{s.spec.defn.param_grad}_grad (the parameter gradient's "
                                  "own gradient)", "its second derivatives are not written")
    return rule(s, need, gg, dy, x, vals)


class _InPlace(torch.autograd.Function):
    """inplace=True where autograd is on: the in-place op writes x (its version counter moves), and the
    backward starts from the output where the op allows it (`spec.supports_y`), else from a copy of the
    input taken before the write (what PyTorch does for its own in-place ops that need their input)."""

    @staticmethod
    def forward(ctx, s: _OpSet, args: tuple, from_y: bool, x, learn):
        saved = None if from_y else x.detach().clone()
        full = list(args)
        if s.li is not None:
            full[s.li] = learn
        s.fwd_(x, *full)
        ctx.mark_dirty(x)
        ctx.s, ctx.args, ctx.from_y = s, args, from_y
        ctx.save_for_backward(x if from_y else saved, learn)
        return x

    @staticmethod
    def backward(ctx, g):
        a, learn = ctx.saved_tensors
        s = ctx.s
        full = list(ctx.args)
        if s.li is not None:
            full[s.li] = learn
        gx = glearn = None
        if ctx.needs_input_grad[3]:
            gx = s.grad_y(g, a, *full) if ctx.from_y else s.grad(g, a, *full)
        if ctx.needs_input_grad[4]:
            glearn = s.pgrad(g, a, *full)
        return None, None, None, gx, glearn


SETS: dict[str, _OpSet] = {}  # op name -> its custom ops (and "<op>_t": swish's with a tensor beta)
for _spec in OPS.values():
    SETS[_spec.name] = _OpSet(_spec)
    if _spec.defn.param_grad is not None and all(p.kind != "array" for p in _spec.params):
        SETS[f"{_spec.name}_t"] = _OpSet(_spec, tensor_learn=True)
del _spec


def _exporting_onnx() -> bool:
    """Whether torch.onnx.export is tracing (torch.onnx is imported by then)."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


def _float(v: Any) -> Any:
    """A float parameter as the schema takes it (ints and NumPy scalars as float; anything else as given,
    for the schema to refuse by name)."""
    return v if type(v) is float else float(v) if isinstance(v, (int, np.floating)) and not isinstance(v, bool) else v


def _apply(spec: OpSpec, x: torch.Tensor, params: dict, inplace: bool, backend: str | None) -> torch.Tensor:
    """Run op `spec` on x through its custom ops (autograd comes with them)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"multiact.torch.{spec.name}(): x must be a torch.Tensor, got {type(x).__name__}")
    s = SETS[spec.name]
    learn = None
    pg = spec.defn.param_grad
    if pg is not None and isinstance(params[pg], torch.Tensor) or s.learn is not None:
        value = params[pg]
        learn = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, device=x.device)
        if s.learn is None:
            s = SETS[f"{spec.name}_t"]
            if learn.numel() != 1:
                raise ValueError(f"multiact.torch.{spec.name}(): {pg} must have one element, got shape "
                                 f"{tuple(learn.shape)}")
            learn = learn.reshape(())
    args = [learn if n == s.learn else _float(params[n]) if k == "float" else params[n]
            for n, k in zip(s.names, (p.kind for p in spec.params), strict=True)]
    if not inplace or _exporting_onnx():  # an exported graph has no in-place op: the out-of-place one
        return s.fwd(x, *args, backend)
    if torch.is_grad_enabled() and (x.requires_grad or (learn is not None and learn.requires_grad)):
        from_y = learn is None and spec.supports_y(spec.validate(dict(zip(s.names, args, strict=True))), x.dtype)
        return _InPlace.apply(s, (*args, backend), from_y, x, learn)
    s.fwd_(x, *args, backend)
    return x


# ---- functions, generated from the op table ------------------------------------------------


def _signature(spec: OpSpec) -> tuple[str, str]:
    """('a=1.0, b=2.0', "{'a': a, 'b': b}") for the op's parameters."""
    parts = [p.name if p.default is REQUIRED else f"{p.name}={p.default!r}" for p in spec.params]
    return ", ".join(parts), "{" + ", ".join(f"{p.name!r}: {p.name}" for p in spec.params) + "}"


def _doc(spec: OpSpec) -> str:
    learn = ""
    if spec.param_grad is not None:
        learn = (
            f"\n\n{spec.param_grad[0]} may be a tensor; if it requires grad it gets its gradient from "
            f"multiact.{spec.name}_{spec.param_grad[0]}_grad."
        )
    return (
        f"{spec.summary} Differentiable: the backward runs multiact.{spec.name}_grad.\n\n"
        f"    y = {spec.formula}{learn}\n\n"
        "inplace=True overwrites x (the backward then uses the output where the op allows it); "
        "backend= runs forward and backward on that backend only."
    )


# ---- the eager hot path ----------------------------------------------------------------------------
#
# A custom op costs tens of microseconds per call in eager mode (torch.library's Python dispatch), several
# times torch's own function on a small tensor.  So in eager mode a plain CPU tensor whose call the
# dispatcher has cached (the tensor hot path, hot.tensor_hot: same checks, same kernel) skips it: no
# autograd needed -> the kernel straight away; autograd needed -> _Eager, an autograd.Function whose backward
# runs the cached backward kernel, or the differentiable custom op <op>_grad when the backward itself is
# recorded (create_graph=True: second order).  Anything else takes the custom ops: torch.compile/export
# (is_compiling), torch.jit.trace, torch.func transforms, torch function/dispatch modes, subclasses
# (Parameter, FakeTensor), other devices, inplace=True, tensor parameters, and the first call of a kind.


# Whether a call runs eagerly with no tracer, transform or mode that must see the custom op (Python source,
# inlined by the generated functions over the names in _EAGER_NAMES).
_EAGER_TEST = "not (_compiling() or _tracing() or _transforms() or _function_mode() or _dispatch_modes())"
_C = torch._C
_EAGER_NAMES = {"_compiling": torch.compiler.is_compiling, "_tracing": _C._is_tracing,
                "_transforms": _C._are_functorch_transforms_active,
                "_function_mode": _C._is_torch_function_mode_enabled, "_dispatch_modes": _C._len_torch_dispatch_stack}
_X = ("x",)
# The C hot path's guard in Python: torch.compile (dynamo) folds it to True, so that it never sees the C call;
# the C side reads the rest of is_compiling() (torch.compiler's flag) itself.  Older torch: is_compiling().
_DYNAMO_COMPILING = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


class _Eager(torch.autograd.Function):
    """One op's forward with autograd on the tensor hot path (see above).  Its one argument besides x is
    the cached forward call, so that Function.apply has little to look through; what the backward needs
    is kept beside it, in _BACKWARD."""

    @staticmethod
    def forward(ctx, x, hit):
        ctx.save_for_backward(x)
        ctx.hit = hit
        return hot.eager_forward(hit, x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s, cache, key, vals = _BACKWARD[ctx.hit]
        if not _C.is_grad_enabled():  # the backward is not recorded: no second order through it
            hit = cache.get(key + (registry.preference_key(),))
            if hit is not None:
                dx = hot.eager_backward(hit, g, x)
                if dx is not hot.MISS:
                    return dx, None
        return s.grad(g, x, *vals), None  # the custom op: differentiable, and it fills the cache


# a cached forward call -> (its op set, the op's hot-path cache, its backward's cache key, custom op args)
_BACKWARD: dict[Any, tuple] = {}

# Function.apply's Python layer binds setup_context's arguments and routes functorch transforms; the eager
# test (_EAGER_TEST) has ruled transforms out and _Eager has no setup_context, so the hot path calls the C apply
# beneath it, after the one step of that layer that still applies: a tensor left over from a finished
# transform, unwrapped.
_eager_apply = super(torch.autograd.Function, _Eager).apply
_undead = torch._C._functorch.unwrap_if_dead


def _eager_grad(s: _OpSet, hit, key: tuple, vals: tuple):
    """What _Eager's backward needs for the forward call `hit` (remembered once per cached call)."""
    got = _BACKWARD.get(hit)
    if got is None:
        kinds = [p.kind for p in s.spec.params] + ["backend"]
        args = tuple(_float(v) if k == "float" else v for v, k in zip(vals, kinds, strict=True))
        got = _BACKWARD[hit] = (s, hot.cache(s.spec.name), ("backward", *key), args)
        if len(_BACKWARD) > 4096:
            _BACKWARD.clear()
            _BACKWARD[hit] = got
    return got


# The C hot path of multiact.torch.<op> (hot.c_op(spec, "torch")), asked first outside torch.compile (dynamo folds
# _dynamo_compiling() to True, so that it never meets the C call): the result; or, where autograd must record
# the call, the cached Hit for _Eager (what the Python path below would find); or None: the Python path.
_C_FIRST = """    if not _dynamo_compiling():
        y = _cmt(x, {inplace}, {backend}{args})
        if y is not None:
            if type(y) is not _Hit:
                return y
            if y not in _BACKWARD:
                _eager_grad(_set, y, (x.dtype{args}, {backend}), ({values}{backend},))
            return _eager_apply(_undead(x), y)
"""


def _c_first(spec: OpSpec, inplace: str, backend: str, prefix: str) -> str:
    """_C_FIRST for a function (prefix "") or a module's forward (prefix "self."): the C path's key terms are
    the parameters as given (it takes only non-zero numbers and str, which key as themselves)."""
    args = "".join(f", {prefix}{p.name}" for p in spec.params)
    values = "".join(f"{prefix}{p.name}, " for p in spec.params)
    return _C_FIRST.format(inplace=inplace, backend=backend, args=args, values=values)


def _c_names(spec: OpSpec) -> dict[str, Any]:
    """What _C_FIRST's source names."""
    return {"_cmt": hot.c_op(spec, "torch"), "_dynamo_compiling": _DYNAMO_COMPILING, "_Hit": hot.Hit,
            "_BACKWARD": _BACKWARD, "_eager_grad": _eager_grad, "_set": SETS[spec.name], "_eager_apply": _eager_apply,
            "_undead": _undead}


def _make_function(spec: OpSpec):
    plist, pdict = _signature(spec)
    pre = f", {plist}" if plist else ""
    fast, keys = api._fast_terms(spec)
    values = "".join(f"{p.name}, " for p in spec.params)
    if any(p.kind == "array" for p in spec.params):  # prelu's weight: always the custom ops
        body = ""
    else:
        eager = _EAGER_TEST
        body = (
            f"    if type(x) is _T and not inplace and {fast}(backend is None or type(backend) is str) and {eager}:\n"
            f"        key = ('forward', x.dtype{keys}, backend, _prefs())\n"
            f"        hit = _cache.get(key)\n"
            f"        if hit is not None and x.is_cpu:\n"
            f"            if x.requires_grad and _grad_on():\n"
            f"                if hit not in _BACKWARD:\n"
            f"                    _eager_grad(_set, hit, key[1:-1], ({values}backend,))\n"
            f"                return _eager_apply(_undead(x), hit)\n"
            f"            at = hit.at\n"
            f"            if at is not None and {hot.direct_test('x')}:\n"
            f"                y = _tempty[0](x)\n"
            f"                at[0](at[1], x.data_ptr(), y.data_ptr(), y.numel(), _threads())\n"
            f"                return y\n"
            f"            y = _thot(hit, _FN, _X, (x,), None)\n"
            f"            if y is not _MISS:\n"
            f"                return y\n"
        )
    cfirst = ""
    if body and hot.C is not None:  # the C hot path first (hot.c_op), outside torch.compile: None, the paths below
        cfirst = _c_first(spec, "inplace", "backend", "")
    array = spec.defn.array_param
    tensors = f"{{{array!r}: {array}}}" if array else "{}"
    qparams = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in spec.params if p.name != array) + "}"
    src = (
        f"def {spec.name}(x{pre}, *, inplace=False, backend=None, quant=None):\n"
        f"    if quant is not None:\n"
        f"        return _tq(_spec.name, x, {tensors}, {qparams}, backend, quant, _QFN, inplace)\n"
        f"{cfirst}{body}"
        f"    return _apply(_spec, x, {pdict}, inplace, backend)\n"
    )
    ns: dict[str, Any] = {
        **_EAGER_NAMES, "_tempty": hot.EMPTY_LIKE, "_STRIDED": hot.STRIDED, "_threads": get_num_threads,
        "_spec": spec, "_apply": _apply, "_T": torch.Tensor, "_NUM": api._NUM,
        "_zero_key": api._zero_key, "_cache": hot.cache(spec.name), "_prefs": registry.preference_key,
        "_grad_on": _C.is_grad_enabled, "_eager_apply": _eager_apply, "_undead": _undead, "_set": SETS[spec.name],
        "_thot": hot.tensor_hot, "_MISS": hot.MISS, "_tq": torch_quant.call, "_QFN": f"multiact.torch.{spec.name}()",
        "_FN": spec.label("forward"), "_X": _X, "_BACKWARD": _BACKWARD, "_eager_grad": _eager_grad,
        **(_c_names(spec) if cfirst else {}),
    }
    exec(compile(src, f"<multiact.torch.{spec.name}>", "exec"), ns)  # noqa: S102 - generated from the op table
    f = ns[spec.name]
    f.__doc__ = _doc(spec)
    f.__module__ = __name__
    return f


FUNCTIONS: dict[str, Any] = {name: _make_function(spec) for name, spec in OPS.items()}
globals().update(FUNCTIONS)
__all__ += sorted(FUNCTIONS)


# ---- modules ------------------------------------------------------------------------------

def module_name(op: str) -> str:
    """The nn.Module name of op (its definition's): leaky_relu -> LeakyReLU, gelu -> GELU, hardswish -> Hardswish."""
    return OPS[op].defn.module_name


class _Multiact(nn.Module):
    """What every multiact.torch module shares: print(model) says which modules are multiact's."""

    backend: str | None

    def __repr__(self) -> str:
        return super().__repr__() + " [multiact]"

    def _backend_repr(self) -> str:
        return f"backend={'auto' if self.backend is None else repr(self.backend)}"


class _ActivationModule(_Multiact):
    """Base of the generated modules: the op's parameters as attributes, validated when built."""

    _spec: OpSpec

    def _setup(self, params: dict, inplace: bool, backend: str | None) -> None:
        self._spec.validate(params)  # a bad parameter fails here, not at the first forward
        for k, v in params.items():
            setattr(self, k, v)
        self.inplace = inplace
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the function (FUNCTIONS[op]): its eager hot path, else the custom ops (_make_module generates each
        # module's own forward, the same with the C hot path first)
        return self._fn(x, *[getattr(self, n) for n in self._names], inplace=self.inplace, backend=self.backend)

    def extra_repr(self) -> str:
        parts = [f"{p.name}={getattr(self, p.name)!r}" for p in self._spec.params]
        if self.inplace:
            parts.append("inplace=True")
        parts.append(self._backend_repr())
        return ", ".join(parts)


def _make_module(spec: OpSpec) -> type:
    plist, pdict = _signature(spec)
    pre = f"{plist}, " if plist else ""
    src = (
        f"def __init__(self, {pre}inplace=False, *, backend=None):\n"
        f"    super(_cls, self).__init__()\n"
        f"    self._setup({pdict}, inplace, backend)\n"
    )
    name = module_name(spec.name)
    cls = type(name, (_ActivationModule,), {"_spec": spec, "_fn": staticmethod(FUNCTIONS[spec.name]),
                                            "_names": spec.param_names, "__module__": __name__,
                                            "__doc__": f"nn.Module form of multiact.torch.{spec.name}: {spec.summary}"})
    ns: dict[str, Any] = {"_cls": cls}
    fast = "_cmt" in FUNCTIONS[spec.name].__globals__
    if fast:  # the function's C hot path straight from forward (see _make_function), else the function
        attrs = "".join(f", self.{n}" for n in spec.param_names)
        src += (
            "def forward(self, x):\n"
            + _c_first(spec, "self.inplace", "self.backend", "self.")
            + f"    return _fn(x{attrs}, inplace=self.inplace, backend=self.backend)\n"
        )
        ns.update(_c_names(spec), _fn=FUNCTIONS[spec.name])
    exec(compile(src, f"<multiact.torch.{name}>", "exec"), ns)  # noqa: S102 - generated from the op table
    ns["__init__"].__qualname__ = f"{name}.__init__"
    cls.__init__ = ns["__init__"]
    if fast:
        ns["forward"].__qualname__ = f"{name}.forward"
        ns["forward"].__doc__ = _ActivationModule.forward.__doc__
        cls.forward = ns["forward"]
    return cls


class Swish(_Multiact):
    """x * sigmoid(beta x) with beta learned (learnable=True) through multiact.swish_beta_grad."""

    op = "swish"  # the op of the table this module is, with its parameter as a learnable tensor

    def __init__(self, beta: float = 1.0, learnable: bool = True, inplace: bool = False, *,
                 backend: str | None = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        OPS[self.op].validate({"beta": beta})
        b = torch.tensor(float(beta), device=device, dtype=dtype or torch.get_default_dtype())
        if learnable:
            self.beta = nn.Parameter(b)
        else:
            self.register_buffer("beta", b)
        self.inplace, self.backend = inplace, backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _apply(OPS[self.op], x, {"beta": self.beta}, self.inplace, self.backend)

    def extra_repr(self) -> str:
        learn = isinstance(self.beta, nn.Parameter)
        return (f"beta={float(self.beta.detach()):g}, learnable={learn}" + (", inplace=True" if self.inplace else "")
                + f", {self._backend_repr()}")


class PReLU(_Multiact):
    """Parametric ReLU, a learned slope per channel (dim 1) or one for all, through multiact.prelu_weight_grad."""

    op = "prelu"  # the op of the table this module is, with its weight as a learnable tensor

    def __init__(self, num_parameters: int = 1, init: float = 0.25, inplace: bool = False, *,
                 backend: str | None = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if num_parameters < 1:
            raise ValueError(f"PReLU(): num_parameters must be >= 1, got {num_parameters}")
        self.num_parameters = num_parameters
        self.weight = nn.Parameter(torch.full((num_parameters,), float(init), device=device, dtype=dtype))
        self.inplace, self.backend = inplace, backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _apply(OPS[self.op], x, {"weight": self.weight, "axis": 1}, self.inplace, self.backend)

    def extra_repr(self) -> str:
        return (f"num_parameters={self.num_parameters}" + (", inplace=True" if self.inplace else "")
                + f", {self._backend_repr()}")


MODULES: dict[str, type] = {cls.op: cls for cls in (Swish, PReLU)}  # the learnable forms, written by hand
for _op, _spec in OPS.items():
    if _op not in MODULES:
        MODULES[_op] = _make_module(_spec)
del _op, _spec
globals().update({cls.__name__: cls for cls in MODULES.values()})
__all__ += sorted(cls.__name__ for cls in MODULES.values())


# ---- the gated family (glu, swiglu, geglu, reglu), generated from the composite definitions ---------------
#
# torch.ops.multiact.<name>(x, ...) and <name>_grad(dy, x, ...) -> dx (both halves in one pass) for the
# one-input form; <name>_up(gate, up, ...) and <name>_up_grad(dy, gate, up, ...) -> (dgate, dup) for the
# two-input form.  glu's activation parameters travel as one string (`_encode`).


def _encode(extra: dict) -> str:
    """glu's activation parameters as one schema string: "negative_slope=0.2;approximate='tanh'"."""
    return ";".join(f"{k}={v!r}" for k, v in extra.items())


def _decode(text: str) -> dict:
    return {k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in text.split(";") if item)}


_COMPOSITE_TYPES = {"int": "int", "choice": "str", "act": "str"}


def _composite_args(cdef: CompositeDef) -> list[_Arg]:
    args = []
    for p in cdef.params:
        t = _COMPOSITE_TYPES.get(p.kind, "float?" if p.default is None else "float")
        args.append(_Arg(p.name, t, p.default))
    if cdef.takes_act_params:
        args.append(_Arg("act_params", "str", ""))
    return [*args, _Arg("backend", "str?", None)]


class _GatedSet:
    """The custom ops of one gated op (one- and two-input forms, forward and backward)."""

    def __init__(self, cdef: CompositeDef):
        self.cdef = cdef
        self.names = cdef.param_names
        tail = _composite_args(cdef)
        n = cdef.name
        T = _Arg
        self.fwd = _define(n, [T("x", "Tensor"), *tail], "Tensor", self._forward, self._fake_forward)
        self.grad = _define(f"{n}_grad", [T("dy", "Tensor"), T("x", "Tensor"), *tail], "Tensor",
                            self._backward, self._fake_backward)
        self.fwd_up = _define(f"{n}_up", [T("x", "Tensor"), T("up", "Tensor"), *tail], "Tensor",
                              self._forward_up, self._fake_forward_up)
        self.grad_up = _define(f"{n}_up_grad", [T("dy", "Tensor"), T("x", "Tensor"), T("up", "Tensor"), *tail],
                               "(Tensor, Tensor)", self._backward_up, self._fake_backward_up)
        self.fwd.register_autograd(self._fwd_backward, setup_context=self._setup1)
        self.fwd_up.register_autograd(self._fwd_up_backward, setup_context=self._setup2)
        self.grad.register_autograd(self._grad_backward, setup_context=self._setup2)
        self.grad_up.register_autograd(self._grad_up_backward, setup_context=self._setup3)

    def _given(self, vals: tuple) -> tuple[dict, dict, Any]:
        k = len(self.names)
        given = dict(zip(self.names, vals[:k], strict=True))
        extra = _decode(vals[k]) if self.cdef.takes_act_params else {}
        return given, extra, vals[-1]

    def args(self, given: dict, extra: dict, backend) -> tuple:
        lists = (_encode(extra),) if self.cdef.takes_act_params else ()
        return (*(given[n] for n in self.names), *lists, backend)

    def _forward(self, x, *vals):
        given, extra, backend = self._given(vals)
        return _as_result(gated.forward(self.cdef, x, None, given, extra, None, backend), x).contiguous()

    def _forward_up(self, x, up, *vals):
        given, extra, backend = self._given(vals)
        return _as_result(gated.forward(self.cdef, x, up, given, extra, None, backend), x).contiguous()

    def _backward(self, dy, x, *vals):
        given, extra, backend = self._given(vals)
        return _layout(_as_result(gated.backward(self.cdef, dy, x, None, given, extra, None, backend), x), x)

    def _backward_up(self, dy, x, up, *vals):
        given, extra, backend = self._given(vals)
        dg, du = gated.backward(self.cdef, dy, x, up, given, extra, None, backend)
        return _layout(_as_result(dg, x), x), _layout(_as_result(du, x), x)

    def _resolve(self, vals: tuple, x, up=None):
        given, extra, backend = self._given(vals)
        fn = gated.label(self.cdef, "forward")
        checks.check_backend(fn, backend)
        call = gated.resolve(self.cdef, given, extra, fn)
        if up is not None:
            gated.check_form(fn, given, up)
        return call, fn

    def _fake_forward(self, x, *vals):
        call, fn = self._resolve(vals, x)
        shape = list(x.shape)
        d = gated.split_axis(fn, tuple(shape), call.dim, call.layout)
        shape[d] //= 2
        return x.new_empty(shape)

    def _fake_forward_up(self, x, up, *vals):
        self._resolve(vals, x, up)
        return x.new_empty(x.shape)

    def _fake_backward(self, dy, x, *vals):
        self._resolve(vals, x)
        return torch.empty_like(x)

    def _fake_backward_up(self, dy, x, up, *vals):
        self._resolve(vals, x, up)
        return torch.empty_like(x), torch.empty_like(x)

    def _setup1(self, ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.vals = inputs[1:]

    def _setup2(self, ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.vals = inputs[2:]

    def _setup3(self, ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3])
        ctx.vals = inputs[3:]

    def _fwd_backward(self, ctx, g):
        (x,) = ctx.saved_tensors
        dx = self.grad(g, x, *ctx.vals) if ctx.needs_input_grad[0] else None
        return (dx,) + (None,) * len(ctx.vals)

    def _fwd_up_backward(self, ctx, g):
        x, up = ctx.saved_tensors
        dg = du = None
        if any(ctx.needs_input_grad[:2]):
            dg, du = self.grad_up(g, x, up, *ctx.vals)
        need = ctx.needs_input_grad
        return (dg if need[0] else None, du if need[1] else None) + (None,) * len(ctx.vals)

    # Second order.  With g = min(gate, limit), u = clamp(up, -limit, limit) + shift and the masks
    # mg = gate <= limit, mu = |up| <= limit, the backward is dgate = mg a'(g) dy u, dup = mu a(g) dy; for
    # upstream gradients (Gg, Gu) of (dgate, dup) its own backward is
    #     d(dy)   = a_grad(Gg mg u, g) + Gu mu a(g)
    #     d(gate) = mg (a_grad2(Gg, dy u, g) + a_grad(Gu mu dy, g))
    #     d(up)   = mu a_grad(Gg mg dy, g)
    # with the activation's own custom ops (a, a_grad, a_grad2 = multiact.backward2).

    def _second(self, vals, dy, gate, up, gg, gu):
        given, extra, backend = self._given(vals)
        call = gated.resolve(self.cdef, given, extra, gated.label(self.cdef, "backward"))
        s = SETS[call.act.name]
        args = s.args(call.act_p, backend)
        limit, shift = call.kp["limit"], call.kp["shift"]
        zero = torch.zeros_like(gate)
        gg = zero if gg is None else gg
        gu = zero if gu is None else gu
        if limit == math.inf:
            g, u = gate, up
        else:
            mg, mu = gate <= limit, up.abs() <= limit
            g, u = gate.clamp(max=limit), up.clamp(-limit, limit) + shift
            gg, gu = torch.where(mg, gg, zero), torch.where(mu, gu, zero)
        if s.grad2 is None:
            raise _second_order_error(f"multiact.{self.cdef.name}_grad (double backward)",
                                      "it needs multiact.backward2, which this version of multiact does not have")
        d_dy = s.grad(gg * u, g, *args) + gu * s.fwd(g, *args)
        d_gate = s.grad2(gg, dy * u, g, *args) + s.grad(gu * dy, g, *args)
        d_up = s.grad(gg * dy, g, *args)
        if limit != math.inf:
            d_gate, d_up = torch.where(mg, d_gate, zero), torch.where(mu, d_up, zero)
        return call, d_dy, d_gate, d_up

    def _grad_backward(self, ctx, gdx):
        dy, x = ctx.saved_tensors
        given, _, _ = self._given(ctx.vals)
        fn = gated.label(self.cdef, "backward")
        call = gated.resolve(self.cdef, given, self._given(ctx.vals)[1], fn)
        dim = gated.split_axis(fn, tuple(x.shape), call.dim, call.layout)
        gate, up = gated.pair(call, *gated.split(x, dim, call.layout))
        gg, gu = gated.pair(call, *gated.split(gdx, dim, call.layout))
        call, d_dy, d_gate, d_up = self._second(ctx.vals, dy, gate, up, gg, gu)
        first, second = gated.pair(call, d_gate, d_up)
        if call.layout == "interleaved":
            d_x = torch.stack([first, second], dim + 1).flatten(dim, dim + 1)
        else:
            d_x = torch.cat([first, second], dim)
        need = ctx.needs_input_grad
        return (d_dy if need[0] else None, d_x if need[1] else None) + (None,) * len(ctx.vals)

    def _grad_up_backward(self, ctx, g_first, g_second):
        dy, x, up = ctx.saved_tensors
        given, extra, _ = self._given(ctx.vals)
        call = gated.resolve(self.cdef, given, extra, gated.label(self.cdef, "backward"))
        gate, upv = gated.pair(call, x, up)
        gg, gu = gated.pair(call, g_first, g_second)
        call, d_dy, d_gate, d_up = self._second(ctx.vals, dy, gate, upv, gg, gu)
        d_x, d_u = gated.pair(call, d_gate, d_up)
        need = ctx.needs_input_grad
        return (d_dy if need[0] else None, d_x if need[1] else None, d_u if need[2] else None) + \
            (None,) * len(ctx.vals)


GATED_SETS: dict[str, _GatedSet] = {c.name: _GatedSet(c) for c in COMPOSITES if c.family == GATED.name}


def _apply_gated(cdef: CompositeDef, x: Any, up: Any, given: dict, extra: dict, backend: str | None) -> torch.Tensor:
    """Run gated op `cdef` on x (and up) through its custom ops."""
    fn = f"multiact.torch.{cdef.name}()"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    s = GATED_SETS[cdef.name]
    args = s.args(given, extra, backend)
    if up is None:
        return s.fwd(x, *args)
    if not isinstance(up, torch.Tensor):
        raise TypeError(f"{fn}: up must be a torch.Tensor or None, got {type(up).__name__}")
    if up.dtype != x.dtype:  # checked here, before the custom op (whose message would name its own arguments)
        raise TypeError(f"{fn}: up has dtype {up.dtype} but x has {x.dtype}; they must match")
    return s.fwd_up(x, up, *args)


def _gated_signature(cdef: CompositeDef) -> tuple[str, str, str]:
    """(multiact.<name>'s parameters after x without out=, the module's after self (no up=, no quant=: a module is
    a float layer), the own-parameter dict)."""
    sig = inspect.signature(gated.FUNCTIONS[cdef.name])
    params = [p for p in sig.parameters.values() if p.name not in ("x", "out")]
    fn = str(sig.replace(parameters=params))[1:-1]
    mod = str(sig.replace(parameters=[p for p in params if p.name not in ("up", "quant")]))[1:-1]
    return fn, mod, "{" + ", ".join(f"{p.name!r}: {p.name}" for p in cdef.params) + "}"


def _make_gated_function(cdef: CompositeDef):
    plist, _, pdict = _gated_signature(cdef)
    extra = "act_params" if cdef.takes_act_params else "{}"
    src = (f"def {cdef.name}(x, {plist}):\n"
           f"    if quant is not None:\n"
           f"        return _tq(_cdef.name, x, {{'up': up}}, {{**{pdict}, **{extra}}}, backend, quant, _QFN)\n"
           f"    return _apply_gated(_cdef, x, up, {pdict}, {extra}, backend)\n")
    ns: dict[str, Any] = {"_cdef": cdef, "_apply_gated": _apply_gated, "_tq": torch_quant.call,
                          "_QFN": f"multiact.torch.{cdef.name}()"}
    exec(compile(src, f"<multiact.torch.{cdef.name}>", "exec"), ns)  # noqa: S102 - generated from the definitions
    f = ns[cdef.name]
    f.__doc__ = (f"{cdef.summary} Differentiable (first order): the backward runs multiact.{cdef.name}_grad, "
                 f"both halves in one pass.\n\n    {cdef.formula}\n\n"
                 "up=: the two-input form (x is the gate, up multiplies it; both get gradients). "
                 f"Parameters as multiact.{cdef.name}'s; backend= runs forward and backward on that backend only; "
                 "quant= (a multiact.Quant) returns the result's (codes, scales) instead, not differentiable.")
    f.__module__ = __name__
    return f


class _GatedModule(_Multiact):
    """Base of the gated modules: the op's parameters as attributes, validated when built;
    forward(x) is the one-input form, forward(gate, up) the two-input form."""

    _cdef: CompositeDef

    def _setup(self, given: dict, extra: dict, backend: str | None) -> None:
        gated.resolve(self._cdef, given, extra, f"multiact.torch.{type(self).__name__}()")  # fails here, not later
        for k, v in given.items():
            setattr(self, k, v)
        self.act_params = dict(extra)
        self.backend = backend

    def forward(self, x: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        given = {p.name: getattr(self, p.name) for p in self._cdef.params}
        return _apply_gated(self._cdef, x, up, given, self.act_params, self.backend)

    def extra_repr(self) -> str:
        parts = [f"{p.name}={getattr(self, p.name)!r}" for p in self._cdef.params if getattr(self, p.name) is not None]
        parts += [f"{k}={v!r}" for k, v in self.act_params.items()]
        parts.append(self._backend_repr())
        return ", ".join(parts)


def _make_gated_module(cdef: CompositeDef) -> type:
    _, plist, pdict = _gated_signature(cdef)
    extra = "act_params" if cdef.takes_act_params else "{}"
    src = (f"def __init__(self, {plist}):\n"
           f"    super(_cls, self).__init__()\n"
           f"    self._setup({pdict}, {extra}, backend)\n")
    name = cdef.module
    cls = type(name, (_GatedModule,), {"_cdef": cdef, "__module__": __name__,
                                       "__doc__": f"nn.Module form of multiact.torch.{cdef.name}: {cdef.summary}"})
    ns: dict[str, Any] = {"_cls": cls}
    exec(compile(src, f"<multiact.torch.{name}>", "exec"), ns)  # noqa: S102 - generated from the definitions
    ns["__init__"].__qualname__ = f"{name}.__init__"
    cls.__init__ = ns["__init__"]
    return cls


GATED_FUNCTIONS: dict[str, Any] = {c.name: _make_gated_function(c) for c in COMPOSITES if c.family == GATED.name}
GATED_MODULES: dict[str, type] = {c.name: _make_gated_module(c) for c in COMPOSITES if c.family == GATED.name}
FUNCTIONS.update(GATED_FUNCTIONS)
MODULES.update(GATED_MODULES)
globals().update(GATED_FUNCTIONS)
globals().update({cls.__name__: cls for cls in GATED_MODULES.values()})
__all__ += sorted(GATED_FUNCTIONS) + sorted(cls.__name__ for cls in GATED_MODULES.values())


# ---- fused bias + activation: torch.ops.multiact.bias_act / bias_act_grad, mt.bias_act, mt.BiasAct --------


class _BiasActSet:
    """bias_act(x, b, scale, <definition's parameters>) -> y and bias_act_grad(dy, x, b, scale, ...) ->
    [dx, db (with b), dscale (with scale)]."""

    def __init__(self):
        self.cdef = fused_bias_act.DEFN
        self.names = self.cdef.param_names
        tail = _composite_args(self.cdef)
        T = _Arg
        sides = [T("b", "Tensor?"), T("scale", "Tensor?")]
        self.fwd = _define("bias_act", [T("x", "Tensor"), *sides, *tail], "Tensor", self._forward,
                           self._fake_forward)
        self.grad = _define("bias_act_grad", [T("dy", "Tensor"), T("x", "Tensor"), *sides, *tail], "Tensor[]",
                            self._backward, self._fake_backward)
        self.fwd.register_autograd(self._fwd_backward, setup_context=self._setup)
        self.grad.register_autograd(self._grad_backward, setup_context=self._setup_grad)

    def _given(self, vals):
        k = len(self.names)
        return dict(zip(self.names, vals[:k], strict=True)), _decode(vals[k]), vals[-1]

    def args(self, given: dict, extra: dict, backend) -> tuple:
        return (*(given[n] for n in self.names), _encode(extra), backend)

    def _forward(self, x, b, scale, *vals):
        given, extra, backend = self._given(vals)
        y = fused_bias_act.forward(x, b, scale, given, extra, None, backend)
        return _layout(_as_result(y, x), x)

    def _backward(self, dy, x, b, scale, *vals):
        given, extra, backend = self._given(vals)
        got = fused_bias_act.backward(dy, x, b, scale, given, extra, None, backend)
        got = got if isinstance(got, tuple) else (got,)
        res = [_layout(_as_result(got[0], x), x)]
        for like, g in zip((b, scale), (got[1:] + (None,) * 2)[:2], strict=True):
            if like is not None:
                res.append(_layout(_as_result(g, like), like))
        return res

    def _check(self, vals):
        given, extra, backend = self._given(vals)
        fn = fused_bias_act.label("forward")
        checks.check_backend(fn, backend)
        fused_bias_act.resolve(given, extra, fn)

    def _fake_forward(self, x, b, scale, *vals):
        self._check(vals)
        return torch.empty_like(x)

    def _fake_backward(self, dy, x, b, scale, *vals):
        self._check(vals)
        return [torch.empty_like(a) for a in (x, b, scale) if a is not None]

    def _setup(self, ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3])
        ctx.vals = inputs[3:]

    def _setup_none(self, ctx, inputs, output):
        pass

    def _fwd_backward(self, ctx, g):
        x, b, scale = ctx.saved_tensors
        need = ctx.needs_input_grad
        res: list[Any] = [None] * (3 + len(ctx.vals))
        if any(need[:3]):
            got = iter(self.grad(g, x, b, scale, *ctx.vals))
            res[0] = next(got)
            for i, a in ((1, b), (2, scale)):
                if a is not None:
                    res[i] = next(got)
            res[:3] = [r if n else None for r, n in zip(res[:3], need[:3], strict=True)]
        return tuple(res)

    # Second order.  With z = x * s + b (s, b broadcast along dim, or of x's shape), a = act(z), the mask
    # m = |a * gain| <= clamp and e = dy * gain * m, the backward is dz = act_grad(e, z), dx = dz * s, db = sum(dz),
    # dscale = sum(dz * x) (sums over every axis but dim; none for a full-shape b or scale).  For upstream
    # gradients (Gdx, Gdb, Gds) of its outputs, Gz' = Gdx * s + Gdb + Gds * x is dz's, and its own backward is
    #     d(dy)    = gain * m * act_grad(Gz', z)
    #     Gz       = act_grad2(Gz', e, z)                       (the activation's f'', multiact.backward2)
    #     d(x)     = Gz * s + Gds * dz,   d(b) = sum(Gz),   d(scale) = sum(Gz * x) + sum(Gdx * dz)
    # with the activation's own custom ops (linear: act_grad the identity, act_grad2 zero); m is piecewise
    # constant, so the clamp adds no term of its own.  Half types compute z in float32, as the kernels do.

    def _setup_grad(self, ctx, inputs, output):
        ctx.save_for_backward(*inputs[:4])
        ctx.vals = inputs[4:]

    def _grad_backward(self, ctx, *grads):
        dy, x, b, scale = ctx.saved_tensors
        if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
            grads = tuple(grads[0])
        grads = iter(grads)
        g_dx = next(grads)
        g_db = next(grads) if b is not None else None
        g_ds = next(grads) if scale is not None else None
        given, extra, backend = self._given(ctx.vals)
        fn = fused_bias_act.label("backward")
        call = fused_bias_act.resolve(given, extra, fn)
        dim = fused_bias_act.axis_of(fn, tuple(x.shape), call.dim)
        ct = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        act = SETS.get(call.act.name)  # None: linear, the identity
        args = act.args(call.act_p, backend) if act is not None else ()
        gain, clamp = call.kp["gain"], call.kp["clamp"]

        def wide(t):
            return None if t is None else t.to(ct)

        def along(t):  # (C,) along dim, or x's shape
            return t if t is None or t.shape == x.shape else t.reshape([-1 if i == dim else 1 for i in range(x.ndim)])

        def total(t, like):  # summed back to like's shape (per channel), in like's dtype
            if like.shape != x.shape:
                t = t.sum([i for i in range(x.ndim) if i != dim]).reshape(like.shape)
            return t.to(like.dtype)

        xw, dyw = wide(x), wide(dy)
        s, bb = along(wide(scale)), along(wide(b))
        z = xw if s is None else xw * s
        z = z if bb is None else z + bb
        e = dyw * gain
        zero = torch.zeros_like(z)
        if clamp != math.inf:
            a = z if act is None else act.fwd(z, *args)
            keep = ~((a * gain).abs() > clamp)
            e = torch.where(keep, e, zero)
        dz = e if act is None else act.grad(e, z, *args)
        gz_ = zero if g_dx is None else wide(g_dx) * (1 if s is None else s)
        if g_db is not None:
            gz_ = gz_ + along(wide(g_db))
        if g_ds is not None:
            gz_ = gz_ + along(wide(g_ds)) * xw
        need = ctx.needs_input_grad
        # one per argument as the dispatcher passed it (arguments equal to their defaults are dropped, and a
        # custom op with a list output checks the structure)
        res: list[Any] = [None] * len(need)
        if need[0]:
            d_dy = (gz_ if act is None else act.grad(gz_, z, *args)) * gain
            res[0] = (d_dy if clamp == math.inf else torch.where(keep, d_dy, zero)).to(dy.dtype)
        if any(need[1:4]):
            if act is not None and act.grad2 is None:
                raise _second_order_error("multiact.bias_act_grad (double backward through bias_act)",
                                          "it needs multiact.backward2, which this version of multiact does not have")
            gz = zero if act is None else act.grad2(gz_, e, z, *args)
            if need[1]:
                d_x = gz if s is None else gz * s
                if g_ds is not None:
                    d_x = d_x + along(wide(g_ds)) * dz
                res[1] = d_x.to(x.dtype)
            if need[2] and b is not None:
                res[2] = total(gz, b)
            if need[3] and scale is not None:
                d_s = gz * xw
                if g_dx is not None:
                    d_s = d_s + wide(g_dx) * dz
                res[3] = total(d_s, scale)
        return tuple(res)


BIAS_ACT_SET = _BiasActSet()


def bias_act(x: torch.Tensor, b: torch.Tensor | None = None, act: str = "linear", *, dim: int = 1,
             scale: torch.Tensor | None = None, gain: float = 1.0, clamp: float | None = None,
             backend: str | None = None, quant: Any = None, **act_params: Any) -> Any:
    fn = "multiact.torch.bias_act()"
    if quant is not None:
        given = {"act": act, "dim": dim, "gain": gain, "clamp": clamp, **act_params}
        return torch_quant.call("bias_act", x, {"b": b, "scale": scale}, given, backend, quant, fn)
    for name, a in (("x", x), ("b", b), ("scale", scale)):
        if not (isinstance(a, torch.Tensor) or (a is None and name != "x")):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor{'' if name == 'x' else ' or None'}, "
                            f"got {type(a).__name__}")
    given = {"act": act, "dim": dim, "gain": _float(gain), "clamp": None if clamp is None else _float(clamp)}
    return BIAS_ACT_SET.fwd(x, b, scale, *BIAS_ACT_SET.args(given, act_params, backend))


bias_act.__doc__ = (f"{fused_bias_act.DEFN.summary} Differentiable twice: the backward runs multiact.bias_act_grad "
                    f"(dx, db, dscale in one pass), its own backward the activation's f'' (multiact.backward2)."
                    f"\n\n    {fused_bias_act.DEFN.formula}\n\n"
                    "b, scale: None, one value per channel (x.shape[dim],) or x's shape; parameters as "
                    "multiact.bias_act's; backend= runs forward and backward on that backend only; quant= (a "
                    "multiact.Quant) returns the result's (codes, scales) instead, not differentiable.")


class BiasAct(_Multiact):
    """Fused bias (learned, one per channel along dim) + activation + gain + clamp; scale=True adds a
    learned per-channel scale (initialised to 1) applied before the bias."""

    def __init__(self, channels: int, act: str = "linear", dim: int = 1, gain: float = 1.0,
                 clamp: float | None = None, scale: bool = False, *, backend: str | None = None,
                 device: Any = None, dtype: Any = None, **act_params: Any) -> None:
        super().__init__()
        if channels < 1:
            raise ValueError(f"BiasAct(): channels must be >= 1, got {channels}")
        fused_bias_act.resolve({"act": act, "dim": dim, "gain": gain, "clamp": clamp}, act_params, "BiasAct()")
        self.channels, self.act, self.dim, self.gain, self.clamp = channels, act, dim, float(gain), clamp
        self.act_params, self.backend = dict(act_params), backend
        self.bias = nn.Parameter(torch.zeros(channels, device=device, dtype=dtype))
        self.scale = nn.Parameter(torch.ones(channels, device=device, dtype=dtype)) if scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_act(x, self.bias, self.act, dim=self.dim, scale=self.scale, gain=self.gain, clamp=self.clamp,
                        backend=self.backend, **self.act_params)

    def extra_repr(self) -> str:
        parts = [f"{self.channels}", f"act={self.act!r}", f"dim={self.dim}"]
        if self.gain != 1.0:
            parts.append(f"gain={self.gain:g}")
        if self.clamp is not None:
            parts.append(f"clamp={self.clamp:g}")
        if self.scale is not None:
            parts.append("scale=True")
        parts += [f"{k}={v!r}" for k, v in self.act_params.items()]
        parts.append(self._backend_repr())
        return ", ".join(parts)


bias_act.__module__ = __name__
FUNCTIONS["bias_act"] = bias_act
MODULES["bias_act"] = BiasAct
__all__ += ["BiasAct", "bias_act"]


# ---- torch.onnx.export: every forward op translated into standard ONNX (multiact/torch_onnx.py) -------------

from . import torch_onnx  # noqa: E402

for _name, _s in SETS.items():  # <op> and <op>_t (a learnable parameter); inplace=True exports as <op>
    torch_onnx.add(_name, torch_onnx.activation_builder(_s.spec, _s.learn))
for _g in GATED_SETS.values():
    torch_onnx.add(_g.cdef.name, torch_onnx.gated_builder(_g.cdef, _decode, two_inputs=False))
    torch_onnx.add(f"{_g.cdef.name}_up", torch_onnx.gated_builder(_g.cdef, _decode, two_inputs=True))
torch_onnx.add(BIAS_ACT_SET.cdef.name, torch_onnx.bias_act_builder(BIAS_ACT_SET.cdef, _decode))
del _name, _s, _g
torch_onnx.install()
onnx_translations = torch_onnx.onnx_translations
export_onnx = torch_onnx.export_onnx


# ---- samples for torch.library.opcheck (tests/test_torch_compile.py, scripts/opcheck_all.py) --------------


def opcheck_samples(dtype: torch.dtype, *, every_case: bool = False) -> list[tuple[str, Any, tuple]]:
    """(name, op, args) for every registered custom op: inputs that require grad where the op's backward
    exists (so opcheck's autograd checks run it), the definitions' parameter cases (the first of each, or
    all with every_case=True)."""
    from . import consistency

    gen = torch.Generator().manual_seed(0)

    def t(*shape, grad=True, lo=-3.0, hi=3.0):
        a = (torch.rand(*shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
        return a.requires_grad_(grad)

    out: list[tuple[str, Any, tuple]] = []
    for key, s in SETS.items():
        spec = s.spec
        cases = consistency.param_cases(spec)
        for case in cases if every_case else cases[:1]:
            p = {**spec.defaults(), **case}
            if s.learn == "weight":
                w = consistency.prelu_weight(np.zeros((3, 4)), p["weight"])
                p["weight"] = torch.tensor(w, dtype=dtype, requires_grad=True)
            elif s.learn is not None:
                p[s.learn] = torch.tensor(float(p[s.learn]), dtype=dtype, requires_grad=True)
            args = s.args(p, None)
            x, dy = t(3, 4), t(3, 4)
            out += [(key, s.fwd, (x, *args)), (f"{key}_", s.fwd_, (t(3, 4, grad=False), *args)),
                    (f"{key}_grad", s.grad, (dy, x, *args))]
            if s.grad_y is not None and spec.supports_y(spec.validate({k: v for k, v in p.items()
                                                                        if k != s.learn} | ({} if s.learn is None else
                                                                        {s.learn: case.get(s.learn, 1.0)}))):
                with torch.no_grad():
                    y = s.fwd(x, *args)
                y.requires_grad_(spec.defn.y_form == "same")  # an own y-form has no derivative in y
                out.append((f"{key}_grad_y", s.grad_y, (dy, y, *args)))
            if s.pgrad is not None:
                tensor_learn = s.learn is not None
                out.append((s.pgrad._name, s.pgrad, (t(3, 4, grad=tensor_learn), t(3, 4, grad=tensor_learn),
                                                     *args)))
            if s.grad2 is not None:
                plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
                out.append((f"{key}_grad2", s.grad2, (t(3, 4, grad=False), t(3, 4, grad=False),
                                                      t(3, 4, grad=False), *plain)))
    for name, g in GATED_SETS.items():
        for case in (({},) + tuple(g.cdef.cases)) if every_case else ({},):
            own = {k: v for k, v in case.items() if k in g.names}
            extra = {k: v for k, v in case.items() if k not in g.names}
            given = {**{p.name: p.default for p in g.cdef.params}, **own}
            args = g.args(given, extra, None)
            x = t(3, 8)
            y = g.fwd(x.detach(), *args)
            out += [(name, g.fwd, (x, *args)), (f"{name}_grad", g.grad, (t(*y.shape), x, *args))]
            if given.get("layout", "halves") == "halves" and given["dim"] == -1:
                out += [(f"{name}_up", g.fwd_up, (t(3, 4), t(3, 4), *args)),
                        (f"{name}_up_grad", g.grad_up, (t(3, 4), t(3, 4), t(3, 4), *args))]
    ba = BIAS_ACT_SET
    for case in (({},) + tuple(ba.cdef.cases)) if every_case else ({},):
        own = {k: v for k, v in case.items() if k in ba.names}
        extra = {k: v for k, v in case.items() if k not in ba.names}
        args = ba.args({**{p.name: p.default for p in ba.cdef.params}, **own}, extra, None)
        x, b, sc = t(2, 3, 4), t(3), t(3, lo=0.5, hi=2.0)
        out += [("bias_act", ba.fwd, (x, b, sc, *args)), ("bias_act", ba.fwd, (x, None, None, *args)),
                ("bias_act_grad", ba.grad, (t(2, 3, 4), t(2, 3, 4), t(3), t(3, lo=0.5, hi=2.0), *args))]
    return out


# ---- what the module shows ----------------------------------------------------------------------------

# Public beside the functions and modules (which `from multiact.torch import *` brings): the tables of
# them, the registered custom ops and the samples opcheck runs on.
_EXTRAS = ("CUSTOM_OPS", "FUNCTIONS", "MODULES", "NAMESPACE", "export_onnx", "module_name", "onnx_translations",
           "opcheck_samples")


def __dir__() -> list[str]:
    """Only the public names (not the imports and helpers: torch, nn, elementwise, Any, ...)."""
    return sorted({*__all__, *_EXTRAS})
