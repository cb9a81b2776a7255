"""quant= in multiact.torch: one custom op, torch.ops.multiact.quantized, for every family's quantized forward.

The op runs the multiact function the caller named (an activation, a gated op, bias_act) with quant= through
the call core, so its codes and scales are multiact.quantize's contract bit for bit; its fake implementation
gives the results' shapes and dtypes, so torch.compile keeps one graph and torch.export takes it.  The call
travels as text (the function, its float and str parameters, the backend), its tensors as up to two optional
tensor arguments (prelu's weight; a gated op's up; bias_act's b and scale).  Codes and scales are not
differentiable (float8 and int8 tensors carry no gradient): autograd is for the float functions.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

import numpy as np
import torch

from . import quant as Q

NAMESPACE = "multiact"
_CODES = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "int8": torch.int8}


_QFIELDS = tuple(f.name for f in dataclasses.fields(Q.Quant))


def encode(fn: str, tensors: tuple[str, ...], params: dict[str, Any], backend: str | None, quant: Any,
           where: str) -> str:
    """The call as the op's text argument, "fn='gelu';p.approximate='tanh';q.dtype='int8';...": the multiact
    function, the names of its tensor arguments, its parameters (numbers, str, None), the backend and the
    Quant's fields (plain string work, which torch.compile traces).  TypeError naming the argument otherwise."""
    q = Q.check(where, quant)
    params = {k: v.item() if isinstance(v, (np.floating, np.integer)) else v for k, v in params.items()}
    for k, v in params.items():
        if not (v is None or isinstance(v, (bool, int, float, str))):
            raise TypeError(f"{where}: with quant=, {k} must be a number or str, got {type(v).__name__}")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"{where}: backend must be a backend name (str) or None, got {type(backend).__name__}")
    items = [("fn", fn), ("tensors", tuple(tensors)), ("backend", backend)]
    items += [(f"p.{k}", v) for k, v in params.items()] + [(f"q.{k}", getattr(q, k)) for k in _QFIELDS]
    return ";".join(f"{k}={v!r}" for k, v in items)


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except ValueError:  # inf, -inf, nan
        return float(text)


def decode(call: str) -> tuple[dict, Q.Quant]:
    """The op's text argument back as ({"fn", "tensors", "backend", "params"}, the Quant): encode's inverse."""
    c: dict[str, Any] = {"p": {}, "q": {}}
    for item in call.split(";"):
        k, v = item.split("=", 1)
        head, _, name = k.partition(".")
        if name:
            c[head][name] = _value(v)
        else:
            c[k] = _value(v)
    return {**c, "params": c["p"]}, Q.Quant(**c["q"])


def _impl(x: torch.Tensor, t1: torch.Tensor | None, t2: torch.Tensor | None, call: str) -> list[torch.Tensor]:
    import multiact

    c, q = decode(call)
    named = dict(zip(c["tensors"], (t1, t2), strict=False))
    res = getattr(multiact, c["fn"])(x, **named, **c["params"], backend=c["backend"], quant=q)
    return [r if r.is_contiguous() else r.contiguous() for r in res]


# multiact.torch's float functions by name (multiact.torch fills it): a forward's fake takes its shape from theirs
FORWARDS: dict[str, Any] = {}


def _fake(x: torch.Tensor, t1: torch.Tensor | None, t2: torch.Tensor | None, call: str) -> list[torch.Tensor]:
    c, q = decode(call)
    named = dict(zip(c["tensors"], (t1, t2), strict=False))
    forward = FORWARDS.get(c["fn"])  # a forward's shape from its own fake; a backward's dx is dy's shape
    shape = tuple(x.shape if forward is None else forward(x, **named, **c["params"], backend=c["backend"]).shape)
    return [x.new_empty(s, dtype=d) for s, d in results(shape, q)]


def results(shape: tuple[int, ...], q: Q.Quant) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of the codes, the scales and (int8 with a zero point) the zero points of a result of
    `shape` (multiact.quantize's layout: one scale per row, group or block along the last axis)."""
    if q.granularity == "tensor":
        sshape: tuple[int, ...] = ()
    elif q.granularity == "token":
        sshape = (*shape[:-1], 1)
    else:
        sshape = (*shape[:-1], shape[-1] // q.block)
    out = [(shape, _CODES[q.dtype]), (sshape, torch.float8_e8m0fnu if q.granularity == "mx" else torch.float32)]
    if not q.symmetric:
        out.append((sshape, torch.int32))
    return out


quantized = torch.library.custom_op(f"{NAMESPACE}::quantized", _impl, mutates_args=(),
                                    schema="(Tensor x, Tensor? t1, Tensor? t2, str call) -> Tensor[]")
quantized.register_fake(_fake)


def call(fn: str, x: Any, tensors: dict[str, Any], params: dict[str, Any], backend: str | None, quant: Any,
         where: str, inplace: bool = False) -> tuple[torch.Tensor, ...]:
    """multiact.torch's quant= path: (codes, scales[, zero points]) of multiact.<fn>'s result."""
    if inplace:
        raise TypeError(f"{where}: inplace=True cannot be combined with quant=: the result is (codes, scales), "
                        "new tensors")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: x must be a torch.Tensor, got {type(x).__name__}")
    names = tuple(n for n, t in tensors.items() if t is not None)
    for n in names:
        if not isinstance(tensors[n], torch.Tensor):
            raise TypeError(f"{where}: {n} must be a torch.Tensor, got {type(tensors[n]).__name__}")
    given = [tensors[n].detach() for n in names] + [None, None]  # codes carry no gradient
    return tuple(quantized(x.detach(), given[0], given[1], encode(fn, names, dict(params), backend, quant, where)))


def backward_quantized(op: str, dy: torch.Tensor, x: torch.Tensor, *, quant: Q.Quant, backend: str | None = None,
                       **params: Any) -> tuple[torch.Tensor, ...]:
    """dx = dy * op'(x) quantized: (codes, scales[, zero points]) of its float32 values (multiact.quantize's
    contract), bit for bit `ma.quantize(ma.<op>_grad(dy, x) in float32, quant)`.  The building block of FP8
    training loops that cast the activation's gradient for the next matrix multiply (Transformer Engine's
    quantize-dact); autograd keeps float gradients, so this is a function, not an autograd rule."""
    import multiact

    where = "multiact.torch.backward_quantized()"
    spec = multiact.ops().get(op) if isinstance(op, str) else None
    if spec is None:
        raise ValueError(f"{where}: op must be one of {', '.join(multiact.ops())}, got {op!r}")
    array = spec.defn.array_param
    tensors = {"x": x, **({array: params.pop(array)} if array and array in params else {})}
    return call(f"{op}_grad", dy, tensors, params, backend, quant, where)
