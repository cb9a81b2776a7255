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

Importing this module imports torch; `import multiact` never does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from . import dispatch
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
