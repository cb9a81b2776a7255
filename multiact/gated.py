"""The gated family (glu, swiglu, geglu, reglu): from the caller's arguments to a `gated:<act>` kernel.

A gated op is an activation of the table times a second array, so it is one elementwise kernel of two
inputs (gate, up) and, in the backward, two outputs (dgate, dup).  Every layout reduces to views: the
halves of x along `dim`, its even and odd elements (interleaved), or two arrays (the two-input form);
`activate` only says which view is the gate.  The kernels see views and never copy; the backward of
the one-input form writes both halves of dx in the same pass.  The float64 reference is composed
from the table's references, so the family adds no formula of its own.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _arrays, dispatch, registry
from ._opdefs import COMPOSITE_DEFINITIONS, F32_MAX, GATED, CompositeDef, composable
from .optable import FAMILY_KEYS, OPS, OpSpec, value_key


class GatedCall:
    """One call's checked parameters: the activation, its parameters, and the kernel's."""

    __slots__ = ("act", "act_p", "key", "kp", "dim", "gate_first", "layout")

    def __init__(self, act: OpSpec, act_p: dict, key: str, kp: dict, dim: int, gate_first: bool, layout: str):
        self.act, self.act_p, self.key, self.kp = act, act_p, key, kp
        self.dim, self.gate_first, self.layout = dim, gate_first, layout


def label(cdef: CompositeDef, direction: str) -> str:
    return f"{cdef.name}()" if direction == "forward" else f"{cdef.name}_grad()"


_PLAIN = (int, float, str, type(None))
_resolved: dict[tuple, GatedCall] = {}


def resolve(cdef: CompositeDef, given: Mapping[str, Any], extra: Mapping[str, Any], fn: str) -> GatedCall:
    """Check the op's own parameters, pick its activation and check the activation's; ValueError or
    TypeError naming the parameter and `fn`.  Calls with plain values (numbers, str, None) are remembered
    by value (+0.0 and -0.0 apart); anything else (a tensor, a 0-d array) is read afresh each call."""
    try:
        key = (cdef.name, fn, *((k, type(v), value_key(v)) for k, v in given.items()),
               *((k, type(v), value_key(v)) for k, v in sorted(extra.items())))
        plain = all(type(v) in _PLAIN for v in (*given.values(), *extra.values()))
    except TypeError:
        plain = False
    if plain:
        hit = _resolved.get(key)
        if hit is None:
            hit = _resolve(cdef, given, extra, fn)
            if len(_resolved) < 4096:
                _resolved[key] = hit
        return hit
    return _resolve(cdef, given, extra, fn)


def _resolve(cdef: CompositeDef, given: Mapping[str, Any], extra: Mapping[str, Any], fn: str) -> GatedCall:
    own = {p.name: p.validate(fn, given.get(p.name, p.default)) for p in cdef.params}
    name, act_given = cdef.activation(own, extra)
    act = OPS.get(name) if isinstance(name, str) else None
    if act is None or not composable(act.defn):
        valid = ", ".join(n for n, s in OPS.items() if composable(s.defn))
        raise ValueError(f"{fn}: parameter 'act' must be an activation of the table but prelu, got {name!r}; "
                         f"valid: {valid}")
    if extra and not cdef.takes_act_params:  # the generated signatures refuse these before here
        raise TypeError(f"{fn}: unexpected keyword arguments {sorted(extra)}")
    act_p = dispatch.validated(act, act_given, fn)
    limit = own.get("limit")
    kp = {**act_p, "limit": math.inf if limit is None else limit, "shift": 0.0 if limit is None else 1.0}
    return GatedCall(act, act_p, GATED.key(act.kernel_key(act_p)), kp, own["dim"], own["activate"] == "first",
                     own["layout"])


def _check_precision(call: GatedCall, dtype: Any, fn: str) -> None:
    call.act.check_precision(call.act_p, dtype, fn)
    if getattr(dtype, "itemsize", 8) <= 4 and call.kp["limit"] != math.inf and call.kp["limit"] > F32_MAX:
        raise ValueError(f"{fn}: parameter 'limit' = {call.kp['limit']:g} does not fit float32, where "
                         f"{dtype} arrays are computed")


def _axis(fn: str, shape: tuple[int, ...], dim: int, layout: str) -> int:
    ndim = len(shape)
    if ndim == 0 or not -ndim <= dim < ndim:
        raise ValueError(f"{fn}: dim {dim} is out of range for x with {ndim} dims")
    dim %= ndim
    if shape[dim] % 2:
        raise ValueError(f"{fn}: x.shape[{dim}] = {shape[dim]} must be even, to split into the two halves "
                         f"({layout})")
    return dim


def split(x: Any, dim: int, layout: str) -> tuple[Any, Any]:
    """The two views (first, second) of x along `dim` (normalised, of even length)."""
    half = x.shape[dim] // 2
    head = (slice(None),) * dim
    if layout == "interleaved":
        return x[head + (slice(0, None, 2),)], x[head + (slice(1, None, 2),)]
    return x[head + (slice(0, half),)], x[head + (slice(half, None),)]


def _pair(call: GatedCall, first: Any, second: Any) -> tuple[Any, Any]:
    """(gate, up) from the two views."""
    return (first, second) if call.gate_first else (second, first)


# ---- the float64 reference, composed from the table's -------------------------------------------------


def _clipped(gate: np.ndarray, up: np.ndarray, kp: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    limit = kp["limit"]
    g = np.where(gate > limit, limit, gate)  # NaN stays NaN
    u = np.where(up > limit, limit, np.where(up < -limit, -limit, up))
    return g, (u + kp["shift"] if kp["shift"] else u)  # adding 0.0 would turn -0 into +0


def reference_forward(act: OpSpec, kp: Mapping[str, Any], gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """act(min(gate, limit)) * (clamp(up, -limit, limit) + shift), in float64."""
    p = _act_params(act, kp)
    with np.errstate(all="ignore"):
        g, u = _clipped(np.asarray(gate, np.float64), np.asarray(up, np.float64), kp)
        return act.forward(g, **p) * u


def reference_backward(act: OpSpec, kp: Mapping[str, Any], dy: np.ndarray, gate: np.ndarray,
                       up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dgate, dup) in float64, as autograd of the composition gives them (the product's backward, then
    the activation's: dgate = act_backward(dy * u, g)); zero where the clip is hit."""
    p = _act_params(act, kp)
    with np.errstate(all="ignore"):
        gate, up, dy = (np.asarray(a, np.float64) for a in (gate, up, dy))
        g, u = _clipped(gate, up, kp)
        dgate = act.backward(dy * u, g, **p)
        dup = dy * act.forward(g, **p)
        limit = kp["limit"]
        return np.where(gate > limit, 0.0, dgate), np.where(np.abs(up) > limit, 0.0, dup)


def _act_params(act: OpSpec, kp: Mapping[str, Any]) -> dict[str, Any]:
    return {k: kp[k] for k in act.param_names}


# ---- dispatch ----------------------------------------------------------------------------------------


class _Like:
    """What dispatch.check_out compares a destination with: a dtype and a shape."""

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...]):
        self.dtype, self.shape = dtype, shape


def _host_views(fn: str, call: GatedCall, x: Any, up: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x as NumPy, gate, up) for a host call; the two-input form checks that up matches x."""
    dispatch.same_given_dtype(fn, {"x": x, "up": up})
    xa = _arrays.as_host_array(x, f"{fn}: x")
    if up is None:
        dim = _axis(fn, xa.shape, call.dim, call.layout)
        return (xa, *_pair(call, *split(xa, dim, call.layout)))
    ua = _arrays.as_host_array(up, f"{fn}: up")
    _same(fn, xa, ua)
    return (xa, *_pair(call, xa, ua))


def _same(fn: str, xa: Any, ua: Any, names: tuple[str, str] = ("x", "up")) -> None:
    if str(ua.dtype) != str(xa.dtype):
        raise TypeError(f"{fn}: {names[1]} has dtype {ua.dtype} but {names[0]} has {xa.dtype}; they must match")
    if tuple(ua.shape) != tuple(xa.shape):
        raise ValueError(f"{fn}: {names[1]} has shape {tuple(ua.shape)} but {names[0]} has {tuple(xa.shape)}; "
                         "they must match")


def _check_form(fn: str, given: Mapping[str, Any], up: Any) -> None:
    if up is not None and (given.get("layout", "halves") != "halves" or given.get("dim", -1) != -1):
        raise ValueError(f"{fn}: with up= (the two-input form) x and up are the two halves already: dim and "
                         "layout apply to the one-input form only")


def _out_array(fn: str, out: Any) -> np.ndarray:
    if not (isinstance(out, np.ndarray) or _arrays.kind_of(out) == "torch"):
        raise TypeError(f"{fn}: out must be an array to write into, got {type(out).__name__}")
    return _arrays.as_host_array(out, f"{fn}: out", writeable=True)


def forward(cdef: CompositeDef, x: Any, up: Any, given: dict[str, Any], extra: dict[str, Any], out: Any,
            backend: str | None) -> Any:
    """y = act(gate) * up: half of x along dim (one-input form), or x's shape (two-input form)."""
    fn = label(cdef, "forward")
    dispatch._check_backend(fn, backend)
    _check_form(fn, given, up)
    call = resolve(cdef, given, extra, fn)
    _refuse_masked(fn, x, up, out)
    kind = dispatch._same_kind(fn, {"x": x, "up": up, "out": out})
    if kind == "dask":
        from . import dask_arrays

        return dask_arrays.call_gated(cdef, call, x, up, out, backend)
    if kind != "numpy":
        return _forward_device(fn, call, kind, x, up, out, backend)
    xa, gate, upv = _host_views(fn, call, x, up)
    _check_precision(call, xa.dtype, fn)
    mod, kernel = registry.resolve(call.key, "forward", dispatch.dtype_name(xa.dtype), "numpy", backend)
    if out is None:
        res = np.empty(gate.shape, xa.dtype)
    else:
        res = _out_array(fn, out)
        ins = {"x": xa} if up is None else {"x": xa, "up": upv}
        dispatch.check_out(fn, res, ins, _Like(xa.dtype, gate.shape))
    dispatch._run(mod, kernel, _Label(fn, call), "forward", dispatch.dtype_name(xa.dtype), (gate, upv, res),
                  call.kp)
    if out is not None:
        _arrays.mark_written(out)
        return out
    return _arrays.wrap_like(res, x)


def backward(cdef: CompositeDef, dy: Any, x: Any, up: Any, given: dict[str, Any], extra: dict[str, Any],
             out: Any, backend: str | None) -> Any:
    """dx (x's shape: both halves written in one pass), or (dgate, dup) for the two-input form."""
    fn = label(cdef, "backward")
    dispatch._check_backend(fn, backend)
    _check_form(fn, given, up)
    call = resolve(cdef, given, extra, fn)
    outs = _out_pair(fn, out, up)
    _refuse_masked(fn, dy, x, up, *outs)
    kind = dispatch._same_kind(fn, {"dy": dy, "x": x, "up": up, **{f"out[{i}]": o for i, o in enumerate(outs)}})
    if kind == "dask":
        from . import dask_arrays

        return dask_arrays.call_gated_grad(cdef, call, dy, x, up, out, backend)
    if kind != "numpy":
        return _backward_device(fn, call, kind, dy, x, up, out, backend)
    dispatch.same_given_dtype(fn, {"x": x, "dy": dy})
    xa, gate, upv = _host_views(fn, call, x, up)
    dya = _arrays.as_host_array(dy, f"{fn}: dy")
    _same(fn, gate, dya, ("the result", "dy"))
    _check_precision(call, xa.dtype, fn)
    mod, kernel = registry.resolve(call.key, "backward", dispatch.dtype_name(xa.dtype), "numpy", backend)
    ins = {"dy": dya, "x": xa} if up is None else {"dy": dya, "x": xa, "up": upv}
    if up is None:
        if out is None:
            dx = np.empty_like(xa)
        else:
            dx = _out_array(fn, out)
            dispatch.check_out(fn, dx, ins, xa)
        dgate, dup = _pair(call, *split(dx, call.dim % xa.ndim, call.layout))
    else:  # the gradients in the order of the arguments (x, up), whichever of them is the gate
        if out is None:
            dfirst, dsecond = np.empty_like(xa), np.empty_like(xa)
        else:
            dfirst, dsecond = (_out_array(fn, o) for o in outs)
            for o in (dfirst, dsecond):
                dispatch.check_out(fn, o, ins, xa)
            if np.shares_memory(dfirst, dsecond):
                raise ValueError(f"{fn}: out[0] and out[1] overlap; they must be separate arrays")
        dgate, dup = _pair(call, dfirst, dsecond)
    dispatch._run(mod, kernel, _Label(fn, call), "backward", dispatch.dtype_name(xa.dtype),
                  (dya, gate, upv, dgate, dup), call.kp)
    if out is not None:
        for o in outs:
            _arrays.mark_written(o)
        return out
    if up is None:
        return _arrays.wrap_like(dx, x)
    return _arrays.wrap_like(dfirst, x), _arrays.wrap_like(dsecond, x)


def _out_pair(fn: str, out: Any, up: Any) -> tuple[Any, ...]:
    """The destinations: dx (one-input form) or a pair (dgate, dup) for the two-input form."""
    if out is None:
        return ()
    if up is None:
        return (out,)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"{fn}: with up= out must be a pair (dgate, dup), got {type(out).__name__}")
    return tuple(out)


def _refuse_masked(fn: str, *arrays: Any) -> None:
    masked = sys.modules.get("numpy.ma")
    if masked is not None and any(isinstance(a, masked.MaskedArray) for a in arrays):
        raise TypeError(f"{fn}: masked arrays are not supported by the gated ops; pass np.ma.getdata(x) and "
                        "combine the masks of the two halves yourself")


class _Label:
    """What dispatch._run names in a note on a kernel's error: 'swiglu (gated:silu)'."""

    def __init__(self, fn: str, call: GatedCall):
        self.name = f"{fn.split('(')[0]} ({call.key})"


def _device_views(fn: str, call: GatedCall, x: Any, up: Any) -> tuple[Any, Any, int | None]:
    """(gate, up, dim) of a device call: x's halves along dim, or the two arrays (dim None)."""
    dispatch._check_device(fn, {"x": x} if up is None else {"x": x, "up": up}, None)
    if up is not None:
        return (*_pair(call, x, up), None)
    dim = _axis(fn, tuple(x.shape), call.dim, call.layout)
    return (*_pair(call, *split(x, dim, call.layout)), dim)


def _forward_device(fn, call, kind, x, up, out, backend):
    gate, upv, _ = _device_views(fn, call, x, up)
    dtype = dispatch._dtype_name(x)
    _check_precision(call, x.dtype, fn)
    mod, kernel = registry.resolve(call.key, "forward", dtype, kind, backend)
    if out is None:
        res = mod.empty_like(gate)
    else:
        dispatch._check_device(fn, {"the result": gate, "out": out}, None)
        res = out
    dispatch._run(mod, kernel, _Label(fn, call), "forward", dtype, (gate, upv, res), call.kp)
    if out is not None:
        _arrays.mark_written(out)
    return res


def _backward_device(fn, call, kind, dy, x, up, out, backend):
    gate, upv, dim = _device_views(fn, call, x, up)
    dispatch._check_device(fn, {"the result": gate, "dy": dy}, None)
    dtype = dispatch._dtype_name(x)
    _check_precision(call, x.dtype, fn)
    mod, kernel = registry.resolve(call.key, "backward", dtype, kind, backend)
    if up is None:
        dx = mod.empty_like(x) if out is None else out
        if out is not None:
            dispatch._check_device(fn, {"x": x, "out": out}, None)
        dgate, dup = _pair(call, *split(dx, dim, call.layout))
    else:  # the gradients in the order of the arguments (x, up)
        dfirst, dsecond = (mod.empty_like(x), mod.empty_like(up)) if out is None else _out_pair(fn, out, up)
        if out is not None:
            dispatch._check_device(fn, {"x": x, "out[0]": dfirst, "out[1]": dsecond}, None)
        dgate, dup = _pair(call, dfirst, dsecond)
    dispatch._run(mod, kernel, _Label(fn, call), "backward", dtype, (dy, gate, upv, dgate, dup), call.kp)
    if out is not None:
        for o in _out_pair(fn, out, up):
            _arrays.mark_written(o)
        return out
    return dx if up is None else (dfirst, dsecond)


# ---- the public functions, generated from the definitions ---------------------------------------------

_FWD = """
def {name}(x{pos}, *, up=None{kw}, out=None, backend=None{star}):
    return _forward(_cdef, x, up, {pdict}, {extra}, out, backend)
"""
_BWD = """
def {name}_grad(dy, x{pos}, *, up=None{kw}, out=None, backend=None{star}):
    return _backward(_cdef, dy, x, up, {pdict}, {extra}, out, backend)
"""

_POSITIONAL = ("dim", "approximate")  # after x, as the signatures and F.glu(x, dim) have them


def _param_doc(cdef: CompositeDef) -> str:
    lines = []
    for p in cdef.params:
        default = "optional" if p.default is None else f"default {p.default!r}"
        lines.append(f"    {p.name}: {p.range_text()} ({default}){'; ' + p.doc if p.doc else ''}")
    if cdef.takes_act_params:
        lines.append("    **act_params: the activation's own parameters (PyTorch's names)")
    return "\n".join(lines)


def _make(cdef: CompositeDef) -> dict[str, Any]:
    pos = [p for p in cdef.params if p.name in _POSITIONAL]
    kw = [p for p in cdef.params if p.name not in _POSITIONAL]
    fields = {
        "name": cdef.name,
        "pos": "".join(f", {p.name}={p.default!r}" for p in pos),
        "kw": "".join(f", {p.name}={p.default!r}" for p in kw),
        "star": ", **act_params" if cdef.takes_act_params else "",
        "pdict": "{" + ", ".join(f"{p.name!r}: {p.name}" for p in cdef.params) + "}",
        "extra": "act_params" if cdef.takes_act_params else "{}",
    }
    ns: dict[str, Any] = {"_cdef": cdef, "_forward": forward, "_backward": backward}
    exec(compile(_FWD.format(**fields) + _BWD.format(**fields), f"<multiact.{cdef.name}>", "exec"), ns)  # noqa: S102
    params = _param_doc(cdef)
    common = ("up: the second array (the two-input form: x is then the gate and up multiplies it);\n"
              "out: write the result here; backend: run on this backend only.")
    fwd, bwd = ns[cdef.name], ns[f"{cdef.name}_grad"]
    fwd.__doc__ = f"{cdef.summary}\n\n    {cdef.formula}\n\nParameters:\n{params}\n\n{common}"
    bwd.__doc__ = (f"Backward of {cdef.name}: dx with x's shape (both halves, one pass), or (dgate, dup) with "
                   f"up=.\n\nParameters:\n{params}\n\n{common} out is dx, or a pair (dgate, dup) with up=.")
    for f in (fwd, bwd):
        f.__module__ = "multiact"
    return {fwd.__name__: fwd, bwd.__name__: bwd}


FUNCTIONS: dict[str, Any] = {}
for _cdef in COMPOSITE_DEFINITIONS.values():
    FUNCTIONS.update(_make(_cdef))
del _cdef

__all__ = ["FAMILY_KEYS", "FUNCTIONS", "reference_backward", "reference_forward", "resolve", "split"]
