"""torch.func transforms (grad, vjp, jacrev, jvp/jacfwd, hessian, vmap) through multiact's custom ops.

torch.library.custom_op's autograd is an autograd.Function without `setup_context`, which every functorch
transform refuses ("it must override the setup_context staticmethod": pytorch/pytorch#168393, #179652,
open).  So each multiact custom op with an autograd formula also gets an autograd.Function of its own,
built from the very backward and setup_context it registers, and the op runs through that Function while
a transform is active (and as the plain custom op otherwise: eager autograd, torch.compile, export).

- grad/vjp/jacrev: the Function's backward is the registered one; it calls the other ops through this
  path again, so grad of grad nests to the second derivative multiactually has.
- vmap: one call on the stacked tensors where the op is elementwise in all its batched arguments (the
  forward, backward, y-form and second derivative of an op with no tensor parameter); otherwise one call
  per batch element (per-channel weights, learnable scalars, reductions), as torch's own fallback does.
- jvp/jacfwd (hessian): the forward's tangent is the backward applied to it, the backward's tangent comes
  from the backward and the second derivative; an op without such a rule says so when a tangent arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._library.custom_ops import CustomOpDef

_C = torch._C
_compiling = torch.compiler.is_compiling


def _transforms_active() -> bool:
    return not _compiling() and _C._are_functorch_transforms_active()


class TransformableOp(CustomOpDef):
    """A multiact custom op that takes torch.func transforms: the class of every op `_define` makes."""

    _func: type[torch.autograd.Function] | None = None
    _jvp: Callable | None = None
    _vmap_elementwise: bool = False

    def register_autograd(self, backward, /, *, setup_context=None):
        super().register_autograd(backward, setup_context=setup_context)
        self._func = _function(self, backward, setup_context)

    def transform_rules(self, *, jvp: Callable | None = None, elementwise: bool = False) -> None:
        """jvp(ctx-free args, tangents) -> the output's tangent; elementwise: the op maps same-shape tensor
        arguments element by element (one batched call under vmap)."""
        self._jvp, self._vmap_elementwise = jvp, elementwise

    def __call__(self, *args, **kwargs):
        if self._func is not None and not kwargs and _transforms_active():
            return self._func.apply(*args)
        return super().__call__(*args, **kwargs)

    def plain(self, *args):
        """The custom op itself, with no Function around it (the Function's forward)."""
        return super().__call__(*args)


def _function(op: TransformableOp, backward, setup_context) -> type[torch.autograd.Function]:
    name = op._name

    def forward(*args):
        return op(*args) if _transforms_active() else op.plain(*args)

    def setup(ctx, inputs, output):
        ctx.inputs = inputs  # for jvp (the tensors among them are the unwrapped ones of this level)
        if setup_context is not None:
            setup_context(ctx, inputs, output)

    def jvp(ctx, *tangents):
        if op._jvp is None:
            raise RuntimeError(f"torch.ops.multiact.{name}: forward-mode differentiation (jvp, jacfwd, hessian) "
                               "is not defined for this op; use reverse mode (torch.func.grad, jacrev, vjp)")
        return op._jvp(ctx.inputs, tangents)

    def vmap(info, in_dims, *args):
        return _vmap(op, info, in_dims, args)

    return type(f"_Func_{name}", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "setup_context": staticmethod(setup),
        "backward": staticmethod(backward), "jvp": staticmethod(jvp), "vmap": staticmethod(vmap),
    })


def _vmap(op: TransformableOp, info, in_dims: tuple, args: tuple) -> tuple[Any, Any]:
    if op._vmap_elementwise:  # batch dims in front, unbatched tensors expanded: one call if the shapes agree
        flat = [a.movedim(d, 0) if d is not None else a.expand(info.batch_size, *a.shape)
                if isinstance(a, torch.Tensor) else a for a, d in zip(args, in_dims, strict=True)]
        if len({a.shape for a in flat if isinstance(a, torch.Tensor)}) == 1:
            return op(*flat), 0
    outs = [op(*(a.select(d, b) if isinstance(a, torch.Tensor) and d is not None else a
                 for a, d in zip(args, in_dims, strict=True))) for b in range(info.batch_size)]
    if isinstance(outs[0], (tuple, list)):
        return tuple(torch.stack(parts) for parts in zip(*outs, strict=True)), tuple(0 for _ in outs[0])
    return torch.stack(outs), 0
