"""The elementwise family: one op of the table, one kernel over arrays of one shape, as a plan.

`call(spec, direction, named, params, out, backend)` is every generated function's checked path (multiact.api):
it validates the parameters and hands the call core (multiact.core) a plan.  An op with an array parameter
(a `Param` of kind "array", `along` its axis parameter: prelu's weight) takes it along one axis of x, or, on
host arrays, broadcast to x (ONNX's PRelu) as a per-channel weight on a 3-D view; its parameter gradient has
the weight's shape and dtype.  Other parameter gradients are float64 sums rounded once to x's dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import _arrays, checks, core, registry
from . import dtypes as _dtypes
from ._layout import reshaped
from .optable import OPS, OpSpec, value_key
from .plan import Blocks, Job, Plan, Result

PARAM_GRAD = "param_grad"


# ---- parameters ---------------------------------------------------------------------------------------

_validated_cache: dict[tuple, dict[str, Any]] = {}


def validated(spec: OpSpec, params: dict[str, Any], fn: str) -> dict[str, Any]:
    """Checked parameters, remembered by their converted values (never by the caller's objects: a
    tensor or a list changed in place must be read again), with +0.0 and -0.0 kept apart."""
    conv = spec.convert(params, fn)
    try:
        key = (spec.name, *(value_key(v) for v in conv.values()))
        hit = _validated_cache.get(key)
    except TypeError:  # an array parameter (prelu's weight)
        return spec.check(conv, fn)
    if hit is None:
        hit = spec.check(conv, fn)
        if len(_validated_cache) < 4096:
            _validated_cache[key] = hit
    return hit


@registry.on_clear
def clear_validated() -> None:
    _validated_cache.clear()


def array_param(spec: OpSpec) -> tuple[str, str] | None:
    """(the array parameter, the parameter naming its axis) of an op that has one, else None."""
    return next(((p.name, p.along) for p in spec.params if p.kind == "array"), None)


# ---- the call -----------------------------------------------------------------------------------------


def call(spec: OpSpec, direction: str, named: dict[str, Any], params: dict[str, Any], out: Any = None,
         backend: str | None = None, quant: Any = None, dequant: Any = None) -> Any:
    """Run one forward / backward / backward_y / backward2 / param_grad... call; `named` holds the array
    arguments in the kernel's order.  The checked path: the generated functions' hot path comes here for any
    call it has not seen, and for any call whose arrays it cannot vouch for; a forward with quant= (a
    multiact.Quant) returns its result's (codes, scales), one with dequant= (a multiact.Dequant) reads an int32 x."""
    fn = spec.label(direction)
    checks.check_backend(fn, backend)
    pl = plan(spec, direction, named, validated(spec, params, fn), out, backend)
    pl.quant, pl.dequant = quant, dequant
    return core.run(pl)


def plan(spec: OpSpec, direction: str, named: dict[str, Any], p: dict, out: Any, backend: str | None,
         partial: bool = False) -> Plan:
    key = spec.kernel_key(p)  # the variant's formula, resolved here once for every backend
    pl = Plan(spec.label(direction), key, key, direction, p, named, out, backend, FAMILY, spec, partial)
    if array_param(spec) is None and not partial:  # the hot path's key: the parameters' values
        pl.cache = (_hot_cache(spec), tuple(value_key(p[n]) for n in spec.param_names))
    return pl


def _hot_cache(spec: OpSpec) -> dict:
    from . import hot

    return hot.cache(spec.name)


def param_result(res: Any, dtype: np.dtype) -> Any:
    """A float64 parameter-gradient sum as a scalar of the data's dtype, rounded once (a float16 sum beyond
    65504 is inf, as NumPy would say; bfloat16 rounds to nearest even from float64, never via float32)."""
    return _dtypes.cast_float64(np.asarray(res, np.float64), dtype)[()]


class _Elementwise:
    """The family's side of the call core (multiact.plan.Family)."""

    join_dask = False  # host arrays beside a Dask array join it (else a call mixing them is refused)
    optional = frozenset()  # arrays that may be left out (None)
    masked = None  # masked arrays: computed on the data, masked like NumPy's ufuncs

    def outs(self, plan: Plan) -> tuple:
        return () if plan.out is None else (plan.out,)

    def returned(self, plan: Plan, values: list) -> Any:
        return values[0]

    def check(self, plan: Plan, dtype: Any) -> None:
        plan.state.check_precision(plan.p, dtype, plan.fn)

    def host(self, plan: Plan, arrs: dict[str, np.ndarray]) -> Job:
        fn = plan.fn
        (ref_name, like), *_ = arrs.items()
        for n, a in arrs.items():
            if a.dtype != like.dtype:
                raise TypeError(f"{fn}: {n} has dtype {a.dtype} but {ref_name} has {like.dtype}; they must match")
            if a.shape != like.shape:
                raise ValueError(f"{fn}: {n} has shape {a.shape} but {ref_name} has {like.shape}; they must match")
        ins = tuple(arrs.values())
        if array_param(plan.state) is not None:
            return _weighted(plan, ins, like)
        if plan.direction == PARAM_GRAD:
            return _sum_job(plan, ins, like, plan.p)

        def run(call, arrays):
            call(*ins, arrays[0])
            return {}

        return Job(like.dtype, (Result("out", like),), plan.p, run)

    def device(self, plan: Plan, arrays: dict[str, Any]) -> Job:
        (ref_name, like), *_ = arrays.items()
        for n, a in arrays.items():
            checks.same_as(plan.fn, n, a, ref_name, like)
        if plan.out is not None:
            checks.device_arrays(plan.fn, {"out": plan.out})
        ins = tuple(arrays.values())
        if plan.direction == PARAM_GRAD:
            def grad(call, arrays_):
                v = call(*ins)
                return {0: _partial(v, like.ndim, plan) if plan.partial else v}

            return Job(like.dtype, (Result("value", like, (), kernel=False),), plan.p, grad)

        def run(call, arrays_):
            call(*ins, arrays_[0])
            return {}

        return Job(like.dtype, (Result("out", like),), plan.p, run)

    def blocks(self, plan: Plan, arrays: dict[str, Any]) -> Blocks:
        return _blocks(plan, arrays)


FAMILY = _Elementwise()


def _sum_job(plan: Plan, ins: tuple, like: np.ndarray, kp: dict) -> Job:
    """A parameter gradient without an array parameter: one float64 sum, rounded once to x's dtype."""
    finish = functools.partial(_dtypes.cast_float64, dtype=like.dtype)

    def run(call, arrays):
        v = call(*ins)
        return {0: _partial(v, like.ndim, plan) if plan.partial else param_result(v, like.dtype)}

    return Job(like.dtype, (Result("value", like, (), kernel=False, axes=(), finish=finish),), kp, run)


def _partial(v: Any, ndim: int, plan: Plan, shape: tuple | None = None) -> np.ndarray:
    """A chunk's float64 sum as its block of the partials array (Dask adds them)."""
    return _to_host(v).astype(np.float64).reshape(shape or (1,) * ndim)


def _to_host(value: Any) -> np.ndarray:
    """A backend's parameter-gradient value (float, NumPy, CuPy, tensor) as a NumPy array."""
    if isinstance(value, np.ndarray | np.generic | float | int):
        return np.asarray(value)
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # CuPy
        return np.asarray(value.get())
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().numpy()
    return np.asarray(value)


# ---- an array parameter (prelu's weight) ------------------------------------------------------------


def _broadcast_block(x_shape: tuple[int, ...], w: np.ndarray, axis: int) -> tuple[int, int] | None:
    """For a weight that is neither one element nor one per channel along `axis` but broadcasts to x (NumPy's
    rules, ONNX's PRelu): the dims [i, j) of x that its non-1 dims span, else None."""
    ndim = len(x_shape)
    if w.size == 1 or not -ndim <= axis < ndim or (w.ndim == 1 and w.size == x_shape[axis % ndim]):
        return None  # one weight, one per channel, or a bad axis (channel_axis says so)
    if w.ndim > ndim or any(d not in (1, xd) for d, xd in zip(w.shape[::-1], x_shape[::-1], strict=False)):
        return None  # channel_axis says what is off
    aligned = (1,) * (ndim - w.ndim) + tuple(w.shape)
    spanned = [k for k, d in enumerate(aligned) if d != 1]
    return spanned[0], spanned[-1] + 1


def _as_weight(fn: str, names: tuple[str, str], p: dict, w: np.ndarray, x: np.ndarray) -> dict:
    """The weight as an array of x's dtype shaped to broadcast along its axis (the kernels' form)."""
    wname, aname = names
    axis = checks.channel_axis(fn, x.shape, w.shape, p[aname], wname)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = _dtypes.from_float64(w) if _dtypes.is_bf16(x.dtype) else w.astype(x.dtype)
    if not np.isfinite(cast.astype(np.float32) if cast.dtype.kind == "V" else cast).all():
        raise ValueError(f"{fn}: {wname} must be finite in {x.dtype.name}, where {x.dtype.name} arrays compute it")
    if axis is None:
        return {**p, wname: cast.reshape((1,) * x.ndim), aname: 0}
    shape = [1] * x.ndim
    shape[axis] = w.size
    return {**p, wname: cast.reshape(shape), aname: axis}


def _weighted(plan: Plan, ins: tuple, like: np.ndarray) -> Job:
    fn, p = plan.fn, plan.p
    names = array_param(plan.state)
    wname, aname = names
    w = _arrays.as_host_array(p[wname], f"{fn}: {wname}")
    block = _broadcast_block(like.shape, w, p[aname])
    xs = like.shape
    if block is not None:  # a weight broadcast to x (ONNX's PRelu): the per-channel kernels on a 3-D view
        i, j = block
        s3 = (int(np.prod(xs[:i], dtype=np.int64)), int(np.prod(xs[i:j], dtype=np.int64)),
              int(np.prod(xs[j:], dtype=np.int64)))
        aligned = w.reshape((1,) * (len(xs) - w.ndim) + w.shape)
        wc = np.ascontiguousarray(np.broadcast_to(aligned.reshape(aligned.shape[i:j]), xs[i:j])).reshape(-1)
        ins = tuple(a.reshape(s3) for a in ins)
        kp = _as_weight(fn, names, {**p, wname: wc, aname: 1}, wc, ins[0])
    else:
        kp = _as_weight(fn, names, p, w, like)
    if plan.direction != PARAM_GRAD:
        def run(call, arrays):
            dest, direct = reshaped(arrays[0], ins[0].shape)
            call(*ins, dest)
            if not direct:
                arrays[0][...] = dest.reshape(arrays[0].shape)
            return {}

        return Job(like.dtype, (Result("out", like),), kp, run)

    finish = functools.partial(_dtypes.cast_float64, dtype=w.dtype)

    def grad(call, arrays):
        g = np.asarray(call(*ins), dtype=np.float64)
        if plan.partial:  # per channel along the weight's axis, 1 elsewhere
            shape = [1] * like.ndim
            ax = kp[aname]
            if g.size > 1:
                shape[ax] = g.size
            return {0: g.reshape(shape)}
        if block is not None:  # summed back over the dims the weight broadcasts along
            g = g.reshape(xs[i:j])
            spread = tuple(k - i for k in range(i, j) if aligned.shape[k] == 1)
            g = g.sum(axis=spread, keepdims=True)
        return {0: finish(g.reshape(w.shape))}

    axes = () if w.size == 1 else (kp[aname],)
    return Job(like.dtype, (Result("value", w, kernel=False, axes=axes, finish=finish),), kp, grad)


# ---- Dask ---------------------------------------------------------------------------------------------


def _blocks(plan: Plan, arrays: dict[str, Any]) -> Blocks:
    fn, spec = plan.fn, plan.state
    (ref_name, like), *_ = arrays.items()
    for n, a in arrays.items():
        if a.dtype != like.dtype:
            raise TypeError(f"{fn}: {n} has dtype {a.dtype} but {ref_name} has {like.dtype}; they must match")
        known = not any(np.isnan(s) for s in (*a.shape, *like.shape))
        if known and a.shape != like.shape:
            raise ValueError(f"{fn}: {n} has shape {a.shape} but {ref_name} has {like.shape}; they must match")
    ind = tuple(range(like.ndim))
    args: list[tuple[Any, tuple | None]] = [(a, ind) for a in arrays.values()]
    p = dict(plan.p)
    names = array_param(spec)
    keep: tuple[int, ...] = ()
    w_like: Any = like
    weighted = False
    if names is not None:
        wname, aname = names
        w, w_ind, axis, w_like = _dask_weight(fn, names, p.pop(wname), like, p[aname])
        args.append((w, w_ind))
        keep = () if axis is None else (axis,)
        weighted = True
    rebuild = functools.partial(_chunk_plan, spec.name, plan.direction, tuple(arrays), p, plan.backend, weighted)
    if plan.direction == PARAM_GRAD:
        finish = functools.partial(_dtypes.cast_float64, dtype=w_like.dtype)
        shape = tuple(w_like.shape) if weighted else ()
        res = Result("value", w_like, shape, kernel=False, axes=keep, finish=finish)
        return Blocks(args, ind, rebuild, (res,), like, adjust={i: _one for i in ind if i not in keep})
    return Blocks(args, ind, rebuild, (Result("out", like),), like)


def _one(_: int) -> int:
    return 1


def _dask_weight(fn: str, names: tuple[str, str], w: Any, x: Any, axis: int) -> tuple[Any, tuple | None, int | None,
                                                                                     Any]:
    """The array parameter as a blockwise argument: (array, its index or None for a constant, its axis, the
    weight as an array of its given shape and dtype).
    A single weight goes to every chunk; one per channel is a Dask array chunked like x's channel axis."""
    import dask.array as da

    wname, _ = names
    if not isinstance(w, da.Array):
        w = _arrays.as_host_array(w, f"{fn}: {wname}")
    elif w.dtype.name not in checks.DEVICE_DTYPES:
        raise TypeError(f"{fn}: {wname} must have a {_arrays.DTYPE_TEXT} dtype, got {w.dtype}")
    ax = checks.channel_axis(fn, x.shape, w.shape, axis, wname)
    if ax is None:
        return (w, None, None, w) if isinstance(w, np.ndarray) else (w.reshape(()), (), None, w)
    given = w
    if not isinstance(w, da.Array):
        w = da.from_array(w, chunks=(x.chunks[ax],))
    return w, (ax,), ax, given


def _chunk_plan(op: str, direction: str, names: tuple[str, ...], p: dict, backend: str | None, weighted: bool,
                *blocks: Any) -> Plan:
    """The plan of one chunk (its blocks, the weight's block last where the op has one)."""
    spec = OPS[op]
    named = dict(zip(names, blocks[: len(names)], strict=True))
    if weighted:
        wname, _ = array_param(spec)
        p = {**p, wname: _on_device_of(blocks[-1], blocks[0])}
    return plan(spec, direction, named, p, None, backend, partial=True)


def _on_device_of(w: Any, x: Any) -> Any:
    """A weight block on x's device: a NumPy weight meets a CuPy chunk as a CuPy array."""
    if isinstance(w, np.ndarray) and not isinstance(x, np.ndarray) and hasattr(x, "__cuda_array_interface__"):
        import sys

        xp = sys.modules.get(type(x).__module__.split(".")[0])
        if xp is not None and hasattr(xp, "asarray"):
            return xp.asarray(w)
    return w


# ---- explain ------------------------------------------------------------------------------------------


def _described(a: Any) -> tuple[str, str, str, str]:
    """(what the caller passed, in words; the array kind dispatch selects for; the dtype it computes
    in; a note on how the input reaches the kernel)."""
    raw = _arrays.kind_of(a)
    dtype = checks.dtype_text(a) if hasattr(a, "dtype") else np.asarray(a).dtype.name
    if raw == "torch":
        note = "a zero-copy NumPy view of the tensor; the result is a tensor"
        return f"torch CPU {dtype} tensors", "numpy", dtype, note
    if raw == "other":
        return f"{type(a).__name__} values ({dtype}, as np.asarray gives)", "numpy", dtype, "converted by np.asarray"
    if raw == "numpy" and isinstance(a, np.ndarray) and not a.dtype.isnative:
        native = a.dtype.newbyteorder("=").name
        return f"NumPy {a.dtype.str} arrays", "numpy", native, "computed on a native-order copy"
    if raw in ("cuda", "npu"):
        return f"{_arrays.library_of(a)} {dtype} arrays", raw, dtype, "on its device, results in its kind"
    return f"NumPy {dtype} arrays", raw, dtype, ""


def explain(name: str, key: str, direction: str, a: Any, backend: str | None = None) -> str:
    """Which backend runs kernel `key` of op `name` on this kind of input, and why the others did not."""
    if _arrays.kind_of(a) == "dask":  # each chunk is a call of its own: explain the chunks' kind
        inner = explain(name, key, direction, a._meta, backend)
        return f"{name} {direction} on a Dask array: dispatched per chunk, lazily; each chunk:\n" + \
            "\n".join(f"  {line}" for line in inner.splitlines())
    what, kind, dtype, note = _described(a)
    try:
        mod, notes = registry.select(key, direction, dtype, kind, backend)
    except Exception as e:
        return f"{name} {direction} on {what}: cannot run: {e}"
    lines = [f"{name} {direction} on {what} -> {mod.NAME}" + (f" ({note})" if note else "")]
    lines += [f"  {n}" for n in notes]
    # fall-through happens only here, at selection; a kernel that fails is never retried elsewhere
    lines.append(f"  an error raised while {mod.NAME} runs reaches the caller; no other backend is tried")
    return "\n".join(lines)
