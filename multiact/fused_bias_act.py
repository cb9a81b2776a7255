"""Fused bias (and per-channel scale) + activation + gain + clamp: `ma.bias_act` and `ma.bias_act_grad`.

    y = clip(act(x * scale + b) * gain, -clamp, clamp)

One kernel family, `bias_act:<act>` (every activation of the table but prelu, and `linear`), on x seen as
a 3-D view (outer, C, inner) with C = x.shape[dim]: b and scale are None, one value per channel (shape
(C,)), or x's shape seen the same way.  The backward writes dx and reduces db and dscale per channel
in the same pass (float64 sums); for a full-shape b or scale they are elementwise.  Clamped elements
get zero gradient (StyleGAN's rule: where |act(z) * gain| > clamp).  The float64 reference is composed
from the activation's.  The backward also runs from the forward's output (y=) where the activation, gain
and clamp allow it (`y_form_check`).  Host arrays go to the host backends as 3-D views; device arrays
(cuda) go as they are, with dim, to kernels that see them as strided views.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _arrays, dispatch, registry
from . import dtypes as _dtypes
from ._opdefs import BIAS_ACT, F32_MAX, CompositeDef, Param, composable
from .errors import YFormError
from .optable import LINEAR as LINEAR_SPEC
from .optable import OPS, OpSpec

LINEAR = LINEAR_SPEC.name


class BiasActCall:
    """One call's checked parameters: the activation (optable.LINEAR for linear), its parameters, the
    kernel's."""

    __slots__ = ("act", "act_p", "key", "kp", "dim")

    def __init__(self, act: OpSpec, act_p: dict, kp: dict, dim: int):
        self.act, self.act_p, self.kp, self.dim = act, act_p, kp, dim
        self.key = BIAS_ACT.key(act.kernel_key(act_p))

    def forward_ref(self, z: np.ndarray) -> np.ndarray:
        return self.act.forward(z, **self.act_p)

    def backward_ref(self, dy: np.ndarray, z: np.ndarray) -> np.ndarray:
        return self.act.backward(dy, z, **self.act_p)


DEFN = CompositeDef(
    "bias_act", "bias_act", "Fused bias (and scale) + activation + gain + clamp, in one pass.",
    "y = clip(act(x * scale + b) * gain, -clamp, clamp)",
    (Param("act", LINEAR, kind="act", doc="'linear' or an activation of the table but prelu; its parameters as "
           "keywords"),
     Param("dim", 1, kind="int", doc="the channel axis of x that b and scale run along"),
     Param("gain", 1.0, doc="multiplies the activation's output (StyleGAN: sqrt(2) for relu, lrelu, swish)"),
     Param("clamp", None, lo=0, doc="clip the result to [-clamp, clamp]; clipped elements get zero gradient")),
    lambda p, extra: (p["act"], dict(extra)), takes_act_params=True, module="BiasAct",
    cases=({"act": "relu", "gain": math.sqrt(2)}, {"act": "leaky_relu", "negative_slope": 0.2, "clamp": 256.0}),
)


def label(direction: str) -> str:
    return "bias_act()" if direction == "forward" else "bias_act_grad()"


def resolve(given: Mapping[str, Any], extra: Mapping[str, Any], fn: str) -> BiasActCall:
    own = {p.name: p.validate(fn, given.get(p.name, p.default)) for p in DEFN.params}
    name = own["act"]
    if name == LINEAR:
        if extra:
            raise TypeError(f"{fn}: unexpected keyword argument {sorted(extra)[0]!r}; linear's parameters: none")
        act, act_p = LINEAR_SPEC, {}
    else:
        act = OPS.get(name)
        if act is None or not composable(act.defn):
            valid = ", ".join([LINEAR] + [n for n, s in OPS.items() if composable(s.defn)])
            raise ValueError(f"{fn}: parameter 'act' must be 'linear' or an activation of the table but prelu, "
                             f"got {name!r}; valid: {valid}")
        act_p = dispatch.validated(act, dict(extra), fn)
    clamp = own["clamp"]
    kp = {**act_p, "gain": own["gain"], "clamp": math.inf if clamp is None else clamp}
    return BiasActCall(act, act_p, kp, own["dim"])


def _check_precision(call: BiasActCall, dtype: Any, fn: str) -> None:
    call.act.check_precision(call.act_p, dtype, fn)
    if getattr(dtype, "itemsize", 8) <= 4:
        for k in ("gain", "clamp"):
            v = call.kp[k]
            if v != math.inf and abs(v) > F32_MAX:
                raise ValueError(f"{fn}: parameter {k!r} = {v:g} does not fit float32, where {dtype} arrays "
                                 "are computed")


# ---- the y= form of the backward -----------------------------------------------------------------------
# dz = act'(z) * dy * gain read from the forward's output y = clip(act(z) * gain, -clamp, clamp), as
# StyleGAN's bias_act does (yy = y / gain; gradient 0 where y is not strictly inside (-clamp, clamp)):
# - act: "linear", or an activation whose definition has a y form (_opdefs: y_form) with its y condition
#   holding for these parameters (in float32 where the kernels compute float16 / float32 data);
# - gain: finite and nonzero, so that y / gain gives act(z) back;
# - an activation whose y form is its x formula read on y (y_form "same") and that is not positively
#   homogeneous (relu6, hardtanh: breakpoints away from 0) sees y / gain at its breakpoints, which only a
#   gain that is a power of two gives back exactly; for float16 data its float parameters (the breakpoints)
#   must also be float16 values (the stored y is);  relu and leaky_relu (breakpoint 0: a sign) take any gain;
# - clamp: any; the clipped elements are those with |y| >= clamp, clamp rounded as y is stored.  This
#   differs from the x form only where |act(z) * gain| == clamp exactly (the x form passes that gradient),
#   or where the storage rounding of y moves an element onto clamp;
# - scale: refused (dscale = sum(dz * x) needs x; pass x).  b is fine: db = sum(dz) needs no x.
# The y form is exact up to the storage rounding of y (dz is read at round(act(z) * gain) / gain).


def y_form_check(fn: str, call: BiasActCall, dtype: Any, scale: Any) -> None:
    """YFormError naming the argument where y= cannot give this call's gradient (the rules above)."""
    act, name = call.act, call.act.name
    if name != LINEAR:
        if act.backward_y is None:
            valid = ", ".join([LINEAR] + [n for n, s in OPS.items() if composable(s.defn) and s.backward_y])
            raise YFormError(f"{fn}: y= is not supported with act={name!r}: its derivative needs the input "
                             f"(x * scale + b); activations with a y form: {valid}")
        if not act.supports_y(call.act_p):
            raise YFormError(f"{fn}: y= with act={name!r} is only supported when {act.y_condition}")
        if dtype is not None and not act.supports_y(call.act_p, dtype):
            raise YFormError(f"{fn}: y= with act={name!r} is only supported when {act.y_condition}, in float32 "
                             f"(where the kernels compute {dtype})")
    gain = call.kp["gain"]
    if gain == 0 or not math.isfinite(gain):
        raise YFormError(f"{fn}: y= needs a finite nonzero gain (act(z) = y / gain), got parameter 'gain' = "
                         f"{gain!r}; pass x")
    if name != LINEAR and act.defn.y_form == "same" and not _homogeneous(call):
        if math.frexp(abs(gain))[0] != 0.5:
            raise YFormError(f"{fn}: y= with act={name!r} needs parameter 'gain' to be a power of two, got "
                             f"{gain!r}: {name}'s y form reads y / gain at its breakpoints, exact only then; "
                             "pass x")
        half = None if dtype is None else str(dtype).replace("torch.", "")
        if half in ("float16", "bfloat16"):
            for k in act.defn.float_params:
                v = call.act_p[k]
                stored = float(np.float16(v)) if half == "float16" else float(_dtypes.from_float64(v))
                if stored != float(np.float32(v)):
                    raise YFormError(f"{fn}: y= with act={name!r} on {half} needs parameter {k!r} to be a "
                                     f"{half} value (y is stored in {half}), got {v!r}; pass x")
    if scale is not None:
        raise YFormError(f"{fn}: y= with scale= is not supported: dscale = sum(dz * x) needs the input x; "
                         "pass x instead of y=")


_homogeneous_seen: dict[tuple, bool] = {}
_PROBES = np.array([-9.0, -6.0, -3.0, -1.5, -1.0, -0.4, -0.1, 0.0, 0.1, 0.4, 1.0, 1.5, 3.0, 6.0, 9.0])


def _homogeneous(call: BiasActCall) -> bool:
    """act(k z) == k act(z) for k > 0 (relu, leaky_relu), probed on the float64 reference: its derivative
    then reads only the sign of act(z), which y / gain keeps for any gain."""
    key = (call.act.name, tuple(sorted((k, repr(v)) for k, v in call.act_p.items())))
    hit = _homogeneous_seen.get(key)
    if hit is None:
        with np.errstate(all="ignore"):
            base = call.forward_ref(_PROBES)
            hit = all(np.allclose(call.forward_ref(_PROBES * k), base * k, rtol=1e-12, atol=0) for k in (0.3, 7.0))
        _homogeneous_seen[key] = hit
    return hit


def y_clamp(clamp: float, dtype: Any) -> float:
    """clamp as y holds it where the forward clipped: rounded to x's dtype (through float32 below float64),
    the largest finite value where that overflows (an inf would say 'no clamp'); inf stays inf."""
    if clamp == math.inf or np.dtype(dtype) == np.float64:
        return clamp
    t = np.dtype(dtype).type
    with np.errstate(over="ignore"):
        r = float(t(np.float32(clamp)))
    return float(np.finfo(t).max) if r == math.inf else r


def reference_backward_y(call: BiasActCall, dy: np.ndarray, y: np.ndarray, clamp: float | None = None) -> np.ndarray:
    """dz from y in float64 by the rules above (clamp: as y_clamp rounds it for y's dtype)."""
    with np.errstate(all="ignore"):
        dy, y = np.asarray(dy, np.float64), np.asarray(y, np.float64)
        gain = call.kp["gain"]
        c = call.kp["clamp"] if clamp is None else clamp
        e = dy * gain
        if c != math.inf:
            e = np.where(np.abs(y) >= c, 0.0, e)
        if call.act.name == LINEAR:
            return e
        return call.act.backward_y(e, y / gain, **call.act_p)


# ---- the float64 reference ----------------------------------------------------------------------------


def _z(x, b, s):
    z = x if s is None else x * s
    return z if b is None else z + b


def reference_forward(call: BiasActCall, x: np.ndarray, b: np.ndarray | None, s: np.ndarray | None) -> np.ndarray:
    """clip(act(x * s + b) * gain, -clamp, clamp) in float64 (b, s broadcast to x already, or None)."""
    with np.errstate(all="ignore"):
        f = [None if a is None else np.asarray(a, np.float64) for a in (x, b, s)]
        y = call.forward_ref(_z(*f)) * call.kp["gain"]
        c = call.kp["clamp"]
        return y if c == math.inf else np.clip(y, -c, c)


def reference_backward(call: BiasActCall, dy: np.ndarray, x: np.ndarray, b: np.ndarray | None,
                       s: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dz) in float64 elementwise: dz = act'(z) * dy * gain, 0 where clipped; dx = dz * s.  db and
    dscale are sums of dz and dz * x over every axis but dim (or dz, dz * x for a full shape)."""
    with np.errstate(all="ignore"):
        dy, x = np.asarray(dy, np.float64), np.asarray(x, np.float64)
        b, s = (None if a is None else np.asarray(a, np.float64) for a in (b, s))
        z = _z(x, b, s)
        e = dy * call.kp["gain"]
        c = call.kp["clamp"]
        if c != math.inf:
            e = np.where(np.abs(call.forward_ref(z) * call.kp["gain"]) > c, 0.0, e)
        dz = call.backward_ref(e, z)
        return (dz if s is None else dz * s), dz


# ---- dispatch -----------------------------------------------------------------------------------------


def _axis(fn: str, shape: tuple[int, ...], dim: int) -> int:
    ndim = len(shape)
    if ndim == 0 or not -ndim <= dim < ndim:
        raise ValueError(f"{fn}: dim {dim} is out of range for x with {ndim} dims")
    return dim % ndim


def _three(shape: tuple[int, ...], dim: int | None) -> tuple[int, int, int]:
    """(outer, C, inner) of x seen along dim (the whole array one channel when there is no dim)."""
    if dim is None:
        return 1, 1, int(np.prod(shape))
    return int(np.prod(shape[:dim])), shape[dim], int(np.prod(shape[dim + 1:]))


def _side(fn: str, name: str, a: Any, x: np.ndarray, dim: int) -> np.ndarray:
    """b or scale as (C,) or as x's shape; TypeError/ValueError naming it."""
    arr = _arrays.as_host_array(a, f"{fn}: {name}")
    if arr.dtype != x.dtype:
        raise TypeError(f"{fn}: {name} has dtype {arr.dtype} but x has {x.dtype}; they must match")
    if arr.shape == x.shape or arr.ndim == 1 and arr.shape[0] == x.shape[dim]:
        return arr
    raise ValueError(f"{fn}: {name} has shape {arr.shape}; expected ({x.shape[dim]},) to run along dim {dim} "
                     f"of x, or x's shape {x.shape}")


def _view3(a: np.ndarray, o: int, c: int, i: int) -> np.ndarray:
    return a.reshape(o, c, i)


def _writable3(a: np.ndarray, o: int, c: int, i: int) -> tuple[np.ndarray, bool]:
    """A 3-D view of a destination, or a scratch array to copy back (False) when none exists."""
    try:
        v = a.view()
        v.shape = (o, c, i)  # raises where a reshape would copy
        return v, True
    except AttributeError:
        return np.empty((o, c, i), a.dtype), False


def _prepare(fn: str, call: BiasActCall, x: Any, b: Any, scale: Any, dy: Any = None, xn: str = "x"):
    dispatch.same_given_dtype(fn, {xn: x, "b": b, "scale": scale, "dy": dy})
    xa = _arrays.as_host_array(x, f"{fn}: {xn}")
    dim = None if b is None and scale is None else _axis(fn, xa.shape, call.dim)
    ba = None if b is None else _side(fn, "b", b, xa, dim)
    sa = None if scale is None else _side(fn, "scale", scale, xa, dim)
    return xa, dim, ba, sa


def forward(x: Any, b: Any, scale: Any, given: dict[str, Any], extra: dict[str, Any], out: Any,
            backend: str | None) -> Any:
    fn = label("forward")
    dispatch._check_backend(fn, backend)
    call = resolve(given, extra, fn)
    route = _refuse(fn, x, b, scale, out)
    if route == "dask":
        from . import dask_arrays

        return dask_arrays.call_bias_act(call, x, b, scale, out, backend)
    if route == "device":
        return _forward_device(fn, call, dispatch._same_kind(fn, {"x": x, "b": b, "scale": scale, "out": out}),
                               x, b, scale, out, backend)
    xa, dim, ba, sa = _prepare(fn, call, x, b, scale)
    _check_precision(call, xa.dtype, fn)
    mod, kernel = registry.resolve(call.key, "forward", xa.dtype.name, "numpy", backend)
    if out is None:
        res = np.empty_like(xa)
    else:
        res = _out(fn, out)
        ins = {n: a for n, a in (("x", xa), ("b", ba), ("scale", sa)) if a is not None}
        dispatch.check_out(fn, res, ins, xa)
    o, c, i = _three(xa.shape, dim)
    r3, direct = _writable3(res, o, c, i)
    b3, s3 = _per_channel(ba, sa, xa, o, c, i)
    dispatch._run(mod, kernel, _Label(fn, call), "forward", xa.dtype.name, (_view3(xa, o, c, i), b3, s3, r3), call.kp)
    if not direct:
        res[...] = r3.reshape(res.shape)
    if out is not None:
        _arrays.mark_written(out)
        return out
    return _arrays.wrap_like(res, x)


def _per_channel(ba, sa, xa, o, c, i):
    """b and scale as the kernels take them: (C,) per channel, or (outer, C, inner) for x's shape."""
    return tuple(None if a is None else a if _channelwise(a, xa) else _view3(a, o, c, i) for a in (ba, sa))


def _channelwise(a: np.ndarray, xa: np.ndarray) -> bool:
    """One value per channel (for 1-D x, the same thing as x's shape, and summed the same way)."""
    return a.ndim == 1 and (xa.ndim == 1 or a.shape != xa.shape)


def backward(dy: Any, x: Any, b: Any, scale: Any, given: dict[str, Any], extra: dict[str, Any], out: Any,
             backend: str | None, y: Any = None) -> Any:
    """dx, or (dx, db) with b, or (dx, db, dscale) with scale (db None without b); from the forward's
    output y instead of x where `y_form_check` allows it."""
    fn = label("backward")
    dispatch._check_backend(fn, backend)
    call = resolve(given, extra, fn)
    if y is not None:
        if x is not None:
            raise ValueError(f"{fn}: pass the input x or the forward's output y=, not both")
        y_form_check(fn, call, getattr(y, "dtype", None), scale)
    elif x is None:
        raise TypeError(f"{fn} needs the input x (or, where the activation allows it, the forward's output y=)")
    outs_given = out if isinstance(out, (tuple, list)) else (out,)
    kind = _refuse(fn, dy, x, y, b, scale, *outs_given)
    if kind == "dask":
        if y is not None:
            raise TypeError(f"{fn}: y= is not supported on Dask arrays; pass x")
        from . import dask_arrays

        return dask_arrays.call_bias_act_grad(call, dy, x, b, scale, out, backend)
    if kind == "device":
        named = {"dy": dy, "x": x, "y": y, "b": b, "scale": scale,
                 **{f"out[{i}]": o for i, o in enumerate(outs_given)}}
        return _backward_device(fn, call, dispatch._same_kind(fn, named), dy, x, y, b, scale, out, backend)
    ya = None if y is None else _arrays.as_host_array(y, f"{fn}: y")
    direction = "backward" if y is None else "backward_y"
    xa, dim, ba, sa = _prepare(fn, call, x if y is None else ya, b, scale, dy, "x" if y is None else "y")
    xn = "x" if y is None else "y"
    dya = _arrays.as_host_array(dy, f"{fn}: dy")
    if dya.dtype != xa.dtype:
        raise TypeError(f"{fn}: dy has dtype {dya.dtype} but {xn} has {xa.dtype}; they must match")
    if dya.shape != xa.shape:
        raise ValueError(f"{fn}: dy has shape {dya.shape} but {xn} has {xa.shape}; they must match")
    _check_precision(call, xa.dtype, fn)
    if y is not None:
        y_form_check(fn, call, xa.dtype, scale)  # the storage dtype now known for sure
    mod, kernel = registry.resolve(call.key, direction, xa.dtype.name, "numpy", backend)
    outs = _out_tuple(fn, out, ba, sa)
    ins = {n: a for n, a in (("dy", dya), (xn, xa), ("b", ba), ("scale", sa)) if a is not None}
    o, c, i = _three(xa.shape, dim)
    if outs is None:
        dx = np.empty_like(xa)
    else:
        dx = _out(fn, outs[0])
        dispatch.check_out(fn, dx, ins, xa)
        sides = [a for a in (ba, sa) if a is not None]
        if ba is None and sa is not None:  # (dx, None, dscale)
            sides = [None, sa]
        for dst, like in zip(outs[1:], sides, strict=True):  # all checked before anything is written
            if dst is not None and like is not None:
                d = _out(fn, dst)
                dispatch.check_out(fn, d, {**ins, "out[0]": dx}, like)
    dx3, direct = _writable3(dx, o, c, i)
    b3, s3 = _per_channel(ba, sa, xa, o, c, i)
    full_b = ba is not None and not _channelwise(ba, xa)
    full_s = sa is not None and not _channelwise(sa, xa)
    db_full = np.empty((o, c, i), xa.dtype) if full_b else None
    ds_full = np.empty((o, c, i), xa.dtype) if full_s else None
    want = (ba is not None and not full_b, sa is not None and not full_s)
    kp = {**call.kp, "sum_db": want[0], "sum_dscale": want[1]}
    if y is not None:  # the kernel needs no b: dz comes from y alone; b only says whether db is wanted
        kp["clamp"] = y_clamp(call.kp["clamp"], xa.dtype)
        b3 = s3 = None
    sums = dispatch._run(mod, kernel, _Label(fn, call), direction, xa.dtype.name,
                         (_view3(dya, o, c, i), _view3(xa, o, c, i), b3, s3, dx3, db_full, ds_full), kp)
    if not direct:
        dx[...] = dx3.reshape(dx.shape)
    results = [dx]
    if ba is not None:
        db = db_full.reshape(xa.shape) if full_b else _rounded_sum(sums[0], xa.dtype)
        results.append(db)
    elif sa is not None:
        results.append(None)
    if sa is not None:
        results.append(ds_full.reshape(xa.shape) if full_s else _rounded_sum(sums[1], xa.dtype))
    if outs is not None:
        for dst, got in zip(outs[1:], results[1:], strict=True):
            if dst is not None and got is not None:
                _out(fn, dst)[...] = got
        for dst in outs:
            if dst is not None:
                _arrays.mark_written(dst)
        return outs[0] if len(outs) == 1 else tuple(outs)
    wrapped = [r if r is None else _arrays.wrap_like(r, x) for r in results]
    return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)


def _rounded_sum(s: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float64 sum in the data's dtype, rounded once (a float16 sum beyond 65504 is inf, as NumPy would say;
    bfloat16 from float64 directly, not through float32)."""
    return _dtypes.cast_float64(s, dtype)


def _out(fn: str, out: Any) -> np.ndarray:
    if not (isinstance(out, np.ndarray) or _arrays.kind_of(out) == "torch"):
        raise TypeError(f"{fn}: out must be an array to write into, got {type(out).__name__}")
    return _arrays.as_host_array(out, f"{fn}: out", writeable=True)


def _out_tuple(fn: str, out: Any, ba: Any, sa: Any) -> tuple | None:
    """The destinations in the order of the results: (dx,), (dx, db) or (dx, db, dscale)."""
    if out is None:
        return None
    n = 1 + (ba is not None or sa is not None) + (sa is not None)
    if n == 1:
        return (out,)
    if not isinstance(out, (tuple, list)) or len(out) != n:
        what = "(dx, db)" if n == 2 else "(dx, db, dscale)"
        raise TypeError(f"{fn}: out must be a tuple {what} matching the results, got {type(out).__name__}")
    if out[0] is None:
        raise TypeError(f"{fn}: out[0] (dx) must be an array")
    return tuple(out)


def _refuse(fn: str, *arrays: Any) -> str:
    """"dask" where any array is a Dask array (the lazy route: host arrays beside it join it), else
    "numpy" for host arrays; TypeError for masked arrays and other kinds."""
    masked = sys.modules.get("numpy.ma")
    if masked is not None and any(isinstance(a, masked.MaskedArray) for a in arrays):
        raise TypeError(f"{fn}: masked arrays are not supported; pass np.ma.getdata(x)")
    kinds = {_arrays.kind_of(a) for a in arrays if a is not None}
    if "dask" in kinds:
        return "dask"
    if kinds - {"numpy", "torch", "other"}:
        return "device"  # dispatch._same_kind names the kind, or the mix
    return "numpy"


# ---- device arrays (the cuda backend): the kernels take the arrays as they are, with dim ----------------------


def _device_sides(fn: str, call: BiasActCall, x: Any, b: Any, scale: Any, xn: str = "x") -> int | None:
    """Check b and scale against a device x (dtype; (C,) or x's shape); the normalised dim, None without
    either."""
    dispatch._check_device(fn, {xn: x}, None)
    if b is None and scale is None:
        return None
    dim = _axis(fn, tuple(x.shape), call.dim)
    for name, a in (("b", b), ("scale", scale)):
        if a is None:
            continue
        if not hasattr(a, "dtype") or not hasattr(a, "shape"):
            raise TypeError(f"{fn}: {name} must be an array like x, got {type(a).__name__}")
        if dispatch._dtype_name(a) != dispatch._dtype_name(x):
            raise TypeError(f"{fn}: {name} has dtype {dispatch._dtype_name(a)} but {xn} has "
                            f"{dispatch._dtype_name(x)}; they must match")
        shape = tuple(a.shape)
        if not (shape == tuple(x.shape) or len(shape) == 1 and shape[0] == x.shape[dim]):
            raise ValueError(f"{fn}: {name} has shape {shape}; expected ({x.shape[dim]},) to run along dim {dim} "
                             f"of {xn}, or {xn}'s shape {tuple(x.shape)}")
    return dim


def _forward_device(fn, call, kind, x, b, scale, out, backend):
    dim = _device_sides(fn, call, x, b, scale)
    dtype = dispatch._dtype_name(x)
    _check_precision(call, x.dtype, fn)
    mod, kernel = registry.resolve(call.key, "forward", dtype, kind, backend)
    if out is None:
        res = mod.empty_like(x)
    else:
        dispatch._check_device(fn, {"x": x, "out": out}, None)
        res = out
    dispatch._run(mod, kernel, _Label(fn, call), "forward", dtype, (x, b, scale, res), {**call.kp, "dim": dim})
    if out is not None:
        _arrays.mark_written(out)
    return res


def _backward_device(fn, call, kind, dy, x, y, b, scale, out, backend):
    xn, xa = ("x", x) if y is None else ("y", y)
    dim = _device_sides(fn, call, xa, b, scale, xn)
    dispatch._check_device(fn, {xn: xa, "dy": dy}, None)
    dtype = dispatch._dtype_name(xa)
    _check_precision(call, xa.dtype, fn)
    direction = "backward" if y is None else "backward_y"
    mod, kernel = registry.resolve(call.key, direction, dtype, kind, backend)
    outs = _out_tuple(fn, out, b, scale)
    if outs is None:
        dx = mod.empty_like(xa)
        db = None if b is None else mod.empty_like(b)
        ds = None if scale is None else mod.empty_like(scale)
    else:
        dx = outs[0]
        dispatch._check_device(fn, {xn: xa, "out[0]": dx}, None)
        rest = list(outs[1:])
        db = rest.pop(0) if b is not None or scale is not None else None
        ds = rest.pop(0) if scale is not None else None
        for i, (dst, like, name) in enumerate(((db, b, "b"), (ds, scale, "scale")), 1):
            if dst is not None and like is None:
                raise TypeError(f"{fn}: out[{i}] must be None without {name}")
            if dst is not None:
                dispatch._check_device(fn, {name: like, f"out[{i}]": dst}, None)
    kp = {**call.kp, "dim": dim}
    if y is not None:
        kp["clamp"] = y_clamp(call.kp["clamp"], np.dtype(dtype))
    dispatch._run(mod, kernel, _Label(fn, call), direction, dtype, (dy, xa, None if y is not None else b,
                  None if y is not None else scale, dx, db, ds), kp)
    if outs is not None:
        for dst in outs:
            if dst is not None:
                _arrays.mark_written(dst)
        return outs[0] if len(outs) == 1 else tuple(outs)
    if b is None and scale is None:
        return dx
    return (dx, db) if scale is None else (dx, db, ds)


class _Label:
    def __init__(self, fn: str, call: BiasActCall):
        self.name = f"bias_act ({call.key})"


# ---- the public functions -----------------------------------------------------------------------------


def bias_act(x: Any, b: Any = None, act: str = LINEAR, *, dim: int = 1, scale: Any = None, gain: float = 1.0,
             clamp: float | None = None, out: Any = None, backend: str | None = None, **act_params: Any) -> Any:
    return forward(x, b, scale, {"act": act, "dim": dim, "gain": gain, "clamp": clamp}, act_params, out, backend)


def bias_act_grad(dy: Any, x: Any = None, b: Any = None, act: str = LINEAR, *, dim: int = 1, scale: Any = None,
                  gain: float = 1.0, clamp: float | None = None, y: Any = None, out: Any = None,
                  backend: str | None = None, **act_params: Any) -> Any:
    return backward(dy, x, b, scale, {"act": act, "dim": dim, "gain": gain, "clamp": clamp}, act_params, out,
                    backend, y)


def _doc() -> str:
    lines = [f"    {p.name}: {p.range_text()} ({'optional' if p.default is None else f'default {p.default!r}'})"
             f"; {p.doc}" for p in DEFN.params]
    return "\n".join(lines)


bias_act.__doc__ = f"""{DEFN.summary}

    {DEFN.formula}

x: any shape; b, scale: None, one value per channel (shape (x.shape[dim],)), or x's shape.
Parameters:
{_doc()}
    **act_params: the activation's own parameters (PyTorch's names)

out: write the result here (out=x is in place); backend: run on this backend only."""

bias_act_grad.__doc__ = f"""Backward of bias_act: dx, and db (with b) and dscale (with scale).

Returns dx alone without b and scale; (dx, db) with b; (dx, db, dscale) with scale (db is None
without b).  Per-channel db and dscale are summed over every axis but dim in float64 and returned in
x's dtype; for a full-shape b or scale they are elementwise.  Clamped elements get zero gradient.
Parameters as bias_act's; out: a tuple matching the results (out[0] may be x: in place).

y=: the forward's output instead of x (bias_act_grad(dy, None, b, act, y=y, ...); b only says db is
wanted): for linear and the activations with a y form (their y condition holding), a finite nonzero
gain (a power of two for relu6 and hardtanh), any clamp (zero gradient where |y| >= clamp, StyleGAN's
rule: it differs from the x form only where act(z) * gain hits clamp exactly), and no scale (dscale
needs x).  Anything else is a YFormError naming the argument.
{_doc()}"""

FUNCTIONS = {"bias_act": bias_act, "bias_act_grad": bias_act_grad}
for _f in FUNCTIONS.values():
    _f.__module__ = "multiact"
del _f
