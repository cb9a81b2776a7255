"""multiact's activations inside PyTorch autograd: functions and nn.Modules, generated from the op table.

    import multiact.torch as mt
    y = mt.gelu(x, approximate="tanh")          # backward runs ma.gelu_grad
    act = mt.Swish(beta=1.0, learnable=True)    # beta learns through ma.swish_beta_grad

Forward and backward both go through multiact's dispatcher, so a CPU tensor runs
on the best CPU backend (as a zero-copy NumPy view) and a CUDA tensor on the
`cuda` backend.  With inplace=True the input is overwritten; the backward then
starts from the output where the op allows it (`spec.supports_y`), and otherwise
from a copy of the input taken before the write (what PyTorch does for its own
in-place ops that need their input).  Gradients are first-order only.

The gated family comes from the composite definitions the same way:

    y = mt.swiglu(x)                 # silu(first half) * second half; the backward writes both halves
    y = mt.swiglu(gate, up=up)       # two-input form: gate and up both get gradients
    mlp = w2(mt.SwiGLU()(w13(x)))    # modules: mt.GLU, mt.SwiGLU, mt.GeGLU, mt.ReGLU

Importing this module imports torch; `import multiact` never does.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from . import dispatch, gated
from ._opdefs import COMPOSITES, GATED, CompositeDef
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


class _Activation(torch.autograd.Function):
    """One op of the table; `learn` is its learnable tensor parameter (swish's beta, prelu's weight) or None."""

    @staticmethod
    def forward(ctx, spec: OpSpec, params: dict, inplace: bool, backend: str | None, x, learn):
        p = _with_learn(spec, params, learn)
        xd = x.detach()
        from_y = inplace and spec.supports_y(spec.validate(p), xd.dtype)
        saved = None
        if inplace and not from_y and any(ctx.needs_input_grad[4:]):
            saved = xd.clone()  # the input is about to be overwritten and the backward needs it
        y = dispatch.call(spec, "forward", {"x": xd}, p, xd if inplace else None, backend)
        ctx.spec, ctx.params, ctx.backend, ctx.from_y = spec, p, backend, from_y
        ctx.learn_like = None if learn is None else learn.detach()  # dtype/device/shape of its gradient
        if inplace:
            ctx.mark_dirty(x)
            ctx.save_for_backward(x if from_y else saved)
            return x
        ctx.save_for_backward(x)
        return _as_result(y, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        (a,) = ctx.saved_tensors
        spec, p, backend = ctx.spec, ctx.params, ctx.backend
        gy = gy.detach()
        a = a.detach()
        gx = glearn = None
        if ctx.needs_input_grad[4]:
            if ctx.from_y:
                gx = dispatch.call(spec, "backward_y", {"dy": gy, "y": a}, p, None, backend)
            else:
                gx = dispatch.call(spec, "backward", {"dy": gy, "x": a}, p, None, backend)
            gx = _as_tensor(gx, a)
        if ctx.needs_input_grad[5]:
            g = dispatch.call(spec, "param_grad", {"dy": gy, "x": a}, p, None, backend)
            glearn = _as_tensor(g, ctx.learn_like)
        return None, None, None, None, gx, glearn


def _with_learn(spec: OpSpec, params: dict, learn: torch.Tensor | None) -> dict:
    """The parameter dict the dispatcher takes, with the learnable tensor put back as a plain value."""
    if learn is None:
        return params
    name = spec.param_grad[0]
    value = learn.detach()
    return {**params, name: float(value) if spec.name == "swish" else value}


def _apply(spec: OpSpec, x: torch.Tensor, params: dict, inplace: bool, backend: str | None) -> torch.Tensor:
    """Run op `spec` on x, through autograd when anything needs a gradient."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"multiact.torch.{spec.name}(): x must be a torch.Tensor, got {type(x).__name__}")
    learn = None
    if spec.param_grad is not None:
        name = spec.param_grad[0]
        value = params[name]
        if isinstance(value, torch.Tensor) or spec.name == "prelu":
            learn = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, device=x.device)
            if spec.name == "swish" and learn.numel() != 1:
                raise ValueError(f"multiact.torch.swish(): beta must have one element, got shape {tuple(learn.shape)}")
            params = {k: v for k, v in params.items() if k != name}
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or (learn is not None and learn.requires_grad))
    if not needs_grad:
        xd = x.detach()
        p = _with_learn(spec, params, learn)
        y = dispatch.call(spec, "forward", {"x": xd}, p, xd if inplace else None, backend)
        return x if inplace else _as_result(y, x)
    return _Activation.apply(spec, params, inplace, backend, x, learn)


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


def _make_function(spec: OpSpec):
    plist, pdict = _signature(spec)
    pre = f", {plist}" if plist else ""
    src = (
        f"def {spec.name}(x{pre}, *, inplace=False, backend=None):\n"
        f"    return _apply(_spec, x, {pdict}, inplace, backend)\n"
    )
    ns: dict[str, Any] = {"_spec": spec, "_apply": _apply}
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


class _ActivationModule(nn.Module):
    """Base of the generated modules: the op's parameters as attributes, validated when built."""

    _spec: OpSpec

    def _setup(self, params: dict, inplace: bool, backend: str | None) -> None:
        self._spec.validate(params)  # a bad parameter fails here, not at the first forward
        for k, v in params.items():
            setattr(self, k, v)
        self.inplace = inplace
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = {p.name: getattr(self, p.name) for p in self._spec.params}
        return _apply(self._spec, x, params, self.inplace, self.backend)

    def extra_repr(self) -> str:
        parts = [f"{p.name}={getattr(self, p.name)!r}" for p in self._spec.params]
        if self.inplace:
            parts.append("inplace=True")
        if self.backend is not None:
            parts.append(f"backend={self.backend!r}")
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
    cls = type(name, (_ActivationModule,), {"_spec": spec, "__module__": __name__,
                                            "__doc__": f"nn.Module form of multiact.torch.{spec.name}: {spec.summary}"})
    ns: dict[str, Any] = {"_cls": cls}
    exec(compile(src, f"<multiact.torch.{name}>", "exec"), ns)  # noqa: S102 - generated from the op table
    ns["__init__"].__qualname__ = f"{name}.__init__"
    cls.__init__ = ns["__init__"]
    return cls


class Swish(nn.Module):
    """x * sigmoid(beta x) with beta learned (learnable=True) through multiact.swish_beta_grad."""

    def __init__(self, beta: float = 1.0, learnable: bool = True, inplace: bool = False, *,
                 backend: str | None = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        OPS["swish"].validate({"beta": beta})
        b = torch.tensor(float(beta), device=device, dtype=dtype or torch.get_default_dtype())
        if learnable:
            self.beta = nn.Parameter(b)
        else:
            self.register_buffer("beta", b)
        self.inplace, self.backend = inplace, backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _apply(OPS["swish"], x, {"beta": self.beta}, self.inplace, self.backend)

    def extra_repr(self) -> str:
        learn = isinstance(self.beta, nn.Parameter)
        return f"beta={float(self.beta.detach()):g}, learnable={learn}" + (", inplace=True" if self.inplace else "")


class PReLU(nn.Module):
    """Parametric ReLU, a learned slope per channel (dim 1) or one for all, through multiact.prelu_weight_grad."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, inplace: bool = False, *,
                 backend: str | None = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if num_parameters < 1:
            raise ValueError(f"PReLU(): num_parameters must be >= 1, got {num_parameters}")
        self.num_parameters = num_parameters
        self.weight = nn.Parameter(torch.full((num_parameters,), float(init), device=device, dtype=dtype))
        self.inplace, self.backend = inplace, backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _apply(OPS["prelu"], x, {"weight": self.weight, "axis": 1}, self.inplace, self.backend)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}" + (", inplace=True" if self.inplace else "")


MODULES: dict[str, type] = {"swish": Swish, "prelu": PReLU}
for _op, _spec in OPS.items():
    if _op not in MODULES:
        MODULES[_op] = _make_module(_spec)
del _op, _spec
globals().update({cls.__name__: cls for cls in MODULES.values()})
__all__ += sorted(cls.__name__ for cls in MODULES.values())


# ---- the gated family (glu, swiglu, geglu, reglu), generated from the composite definitions ---------------


class _Gated(torch.autograd.Function):
    """One gated op: the forward runs multiact.<name>, the backward multiact.<name>_grad, which writes both
    halves of dx (or dgate and dup with up=) in one pass.  First order only, like _Activation: the second
    derivative needs act'' of the activation, which the op table does not have (issue 15, item 2)."""

    @staticmethod
    def forward(ctx, cdef: CompositeDef, given: dict, extra: dict, backend: str | None, x, up):
        xd = x.detach()
        ud = None if up is None else up.detach()
        y = gated.forward(cdef, xd, ud, given, extra, None, backend)
        ctx.cdef, ctx.given, ctx.extra, ctx.backend = cdef, given, extra, backend
        ctx.save_for_backward(x, up)  # a later in-place write into either makes the backward raise
        return _as_result(y, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, up = ctx.saved_tensors
        xd = x.detach()
        ud = None if up is None else up.detach()
        g = gated.backward(ctx.cdef, gy.detach(), xd, ud, ctx.given, ctx.extra, None, ctx.backend)
        if up is None:
            gx, gup = _as_tensor(g, xd), None
        else:
            gx, gup = (_as_tensor(g[0], xd), _as_tensor(g[1], ud))
        need_x, need_up = ctx.needs_input_grad[4:6]
        return None, None, None, None, gx if need_x else None, gup if need_up else None


def _apply_gated(cdef: CompositeDef, x: Any, up: Any, given: dict, extra: dict, backend: str | None) -> torch.Tensor:
    """Run gated op `cdef` on x (and up), through autograd when anything needs a gradient."""
    fn = f"multiact.torch.{cdef.name}()"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if up is not None:
        if not isinstance(up, torch.Tensor):
            raise TypeError(f"{fn}: up must be a torch.Tensor or None, got {type(up).__name__}")
        if up.dtype != x.dtype:  # checked here: a bfloat16 tensor reaches multiact as a float32 copy
            raise TypeError(f"{fn}: up has dtype {up.dtype} but x has {x.dtype}; they must match")
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or (up is not None and up.requires_grad))
    if not needs_grad:
        y = gated.forward(cdef, x.detach(), None if up is None else up.detach(), given, extra, None, backend)
        return _as_result(y, x)
    return _Gated.apply(cdef, given, extra, backend, x, up)


def _gated_signature(cdef: CompositeDef) -> tuple[str, str, str]:
    """(multiact.<name>'s parameters after x without out=, the module's after self, the own-parameter dict)."""
    sig = inspect.signature(gated.FUNCTIONS[cdef.name])
    params = [p for p in sig.parameters.values() if p.name not in ("x", "out")]
    fn = str(sig.replace(parameters=params))[1:-1]
    mod = str(sig.replace(parameters=[p for p in params if p.name != "up"]))[1:-1]
    return fn, mod, "{" + ", ".join(f"{p.name!r}: {p.name}" for p in cdef.params) + "}"


def _make_gated_function(cdef: CompositeDef):
    plist, _, pdict = _gated_signature(cdef)
    extra = "act_params" if cdef.takes_act_params else "{}"
    src = (f"def {cdef.name}(x, {plist}):\n"
           f"    return _apply_gated(_cdef, x, up, {pdict}, {extra}, backend)\n")
    ns: dict[str, Any] = {"_cdef": cdef, "_apply_gated": _apply_gated}
    exec(compile(src, f"<multiact.torch.{cdef.name}>", "exec"), ns)  # noqa: S102 - generated from the definitions
    f = ns[cdef.name]
    f.__doc__ = (f"{cdef.summary} Differentiable (first order): the backward runs multiact.{cdef.name}_grad, "
                 f"both halves in one pass.\n\n    {cdef.formula}\n\n"
                 "up=: the two-input form (x is the gate, up multiplies it; both get gradients). "
                 f"Parameters as multiact.{cdef.name}'s; backend= runs forward and backward on that backend only.")
    f.__module__ = __name__
    return f


class _GatedModule(nn.Module):
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
        if self.backend is not None:
            parts.append(f"backend={self.backend!r}")
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
