"""Dask arrays: every op as a lazy blockwise graph whose chunks are dispatched like plain calls.

A chunk runs wherever Dask schedules it, through the same dispatcher as a plain
call, so each worker picks its own best backend for the chunk it holds (native
or numba for NumPy chunks, cuda for CuPy chunks).  What the caller chose when
building the graph travels with it: `backend=` and any `ma.use(...)` scopes.
Arrays with different chunks are aligned (`unify_chunks`) first.  Parameter
gradients (swish's beta, prelu's weight) are per-chunk float64 partials summed
by Dask, then rounded to the dtype a plain call returns.

The dispatcher imports this module only when it meets a Dask array.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Iterator
from typing import Any

import dask.array as da
import numpy as np

from . import _arrays, dispatch, registry
from . import dtypes as _dtypes
from .optable import OPS, OpSpec

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def call(spec: OpSpec, direction: str, named: dict[str, Any], p: dict, out: Any, backend: str | None) -> da.Array:
    """The lazy result of one call on Dask arrays (p is validated; chunks run at compute time)."""
    op = spec.name
    if out is not None:
        raise TypeError(
            f"{op}(): out= is not supported for Dask arrays: the result is lazy; use the returned array "
            "(da.store writes it into an existing array)"
        )
    if backend is not None:
        registry.check_name(backend)  # a typo fails now; availability is each worker's own question
    arrays = {n: a for n, a in named.items() if a is not None}
    _check(op, arrays)
    like = next(iter(arrays.values()))
    prefs = registry.preference_key()
    p = dict(p)
    weight = p.pop("weight", None) if op == "prelu" else None
    args: list[Any] = []
    ind = tuple(range(like.ndim))
    for a in arrays.values():
        args += [a, ind]
    axis = w_shape = w_dtype = None
    if weight is not None:
        w_arg, w_ind, axis, w_shape = _prelu_weight(op, weight, like, p["axis"])
        w_dtype = w_arg.dtype
        args += [w_arg, w_ind]
    names = tuple(arrays)
    if direction != "param_grad":
        fn = functools.partial(_chunk, op, direction, names, p, backend, prefs)
        return da.blockwise(fn, ind, *args, dtype=like.dtype, meta=like._meta, token=f"multiact-{op}-{direction}")
    fn = functools.partial(_partial, op, p, backend, prefs)
    keep = {axis} if axis is not None else set()
    partials = da.blockwise(
        fn, ind, *args, dtype=np.float64, meta=np.empty((0,) * like.ndim, np.float64),
        adjust_chunks={i: _one for i in ind if i not in keep}, token=f"multiact-{op}-{direction}",
    )
    if op == "prelu":
        other = tuple(i for i in ind if i not in keep)
        total = partials.sum(axis=other, dtype=np.float64)
        return _rounded(total.reshape(w_shape), w_dtype)
    return _rounded(partials.sum(dtype=np.float64), like.dtype)


def _rounded(total: da.Array, dtype: np.dtype) -> da.Array:
    """The float64 total in the data's dtype, rounded once (bfloat16 by multiact.dtypes, not via float32)."""
    if not _dtypes.is_bf16(np.dtype(dtype)):
        return total.astype(dtype)
    return total.map_blocks(_dtypes.cast_float64, dtype, dtype=dtype)


def _one(_: int) -> int:
    return 1


def _check(op: str, arrays: dict[str, da.Array]) -> None:
    """What a plain call checks, done now rather than when a chunk first runs."""
    ref_name, ref = next(iter(arrays.items()))
    for n, a in arrays.items():
        if a.dtype.name not in _FLOATS:
            raise TypeError(f"{op}(): {n} must have a {_arrays.DTYPE_TEXT} dtype, got {a.dtype}")
        if a.dtype != ref.dtype:
            raise TypeError(f"{op}(): {n} has dtype {a.dtype} but {ref_name} has {ref.dtype}; they must match")
        known = not any(math.isnan(s) for s in (*a.shape, *ref.shape))
        if known and a.shape != ref.shape:
            raise ValueError(f"{op}(): {n} has shape {a.shape} but {ref_name} has {ref.shape}; they must match")


def _prelu_weight(op: str, w: Any, x: da.Array, axis: int) -> tuple[Any, tuple | None, int | None, tuple]:
    """prelu's weight as a blockwise argument: (array, its index, channel axis or None, the weight's shape).

    A single weight goes to every chunk; one per channel is a Dask array chunked like x's channel axis.
    """
    if not isinstance(w, da.Array):
        w = _arrays.as_host_array(w, f"{op}(): weight")
    elif w.dtype.name not in _FLOATS:
        raise TypeError(f"{op}(): weight must have a {_arrays.DTYPE_TEXT} dtype, got {w.dtype}")
    axis = dispatch.prelu_axis(op, x.shape, w.shape, axis)
    if axis is None:
        return (w, None, None, w.shape) if isinstance(w, np.ndarray) else (w.reshape(()), (), None, w.shape)
    if not isinstance(w, da.Array):
        w = da.from_array(w, chunks=(x.chunks[axis],))
    return w, (axis,), axis, w.shape


@contextlib.contextmanager
def _preferences(prefs: tuple[tuple[str, bool], ...]) -> Iterator[None]:
    """Re-enter the caller's ma.use(...) scopes where the chunk runs (another thread or process)."""
    if not prefs:
        yield
        return
    with contextlib.ExitStack() as stack:
        for name, only in prefs:
            stack.enter_context(registry.use(name, only=only))
        yield


def _chunk(op: str, direction: str, names: tuple[str, ...], p: dict, backend: str | None, prefs: tuple,
           *blocks: Any) -> Any:
    """One chunk of a forward or backward: a plain dispatched call."""
    named = dict(zip(names, blocks[: len(names)], strict=True))
    if len(blocks) > len(names):
        p = {**p, "weight": _like(blocks[-1], blocks[0])}
    with _preferences(prefs):
        return dispatch.call(OPS[op], direction, named, p, None, backend)


def _partial(op: str, p: dict, backend: str | None, prefs: tuple, dy: Any, x: Any, w: Any = None) -> np.ndarray:
    """One chunk's parameter gradient in float64, shaped as its block of the partials array.

    A plain call rounds the sum to x's dtype; here that would round every chunk's
    partial (and overflow float16), so host chunks call the kernel directly.
    """
    spec = OPS[op]
    pp = dict(p)
    if w is not None:
        pp["weight"] = _like(w, x)
    shape = (1,) * x.ndim
    with _preferences(prefs):
        if dispatch._kind(x) == "numpy":
            arrs = dispatch._host(spec.label("param_grad"), {"dy": dy, "x": x})
            hx = arrs["x"]
            if op == "prelu":
                pp, _ = dispatch._weight(spec, pp, hx)
                shape = pp["weight"].shape
            mod, kernel = registry.resolve(op, "param_grad", hx.dtype.name, "numpy", backend)
            value = dispatch._run(mod, kernel, spec, "param_grad", hx.dtype.name, (arrs["dy"], hx), pp)
        else:
            value = dispatch.call(spec, "param_grad", {"dy": dy, "x": x}, pp, None, backend)
            if op == "prelu" and pp["weight"].size > 1:
                shape = tuple(pp["weight"].size if i == p["axis"] % x.ndim else 1 for i in range(x.ndim))
    return _to_host(value).astype(np.float64).reshape(shape)


def _like(w: Any, x: Any) -> Any:
    """prelu's weight block on x's device: a NumPy weight meets a CuPy chunk as a CuPy array."""
    if isinstance(w, np.ndarray) and not isinstance(x, np.ndarray) and hasattr(x, "__cuda_array_interface__"):
        import sys

        xp = sys.modules.get(type(x).__module__.split(".")[0])
        if xp is not None and hasattr(xp, "asarray"):
            return xp.asarray(w)
    return w


def _to_host(value: Any) -> np.ndarray:
    """A backend's parameter-gradient value (float, NumPy, CuPy, tensor) as a NumPy array."""
    if isinstance(value, np.ndarray | np.generic | float | int):
        return np.asarray(value)
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # CuPy
        return np.asarray(value.get())
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().numpy()
    return np.asarray(value)


# ---- the gated family -------------------------------------------------------------------------------


def _no_out(fn: str, out: Any) -> None:
    if out is not None:
        raise TypeError(
            f"{fn}: out= is not supported for Dask arrays: the result is lazy; use the returned array "
            "(da.store writes it into an existing array)"
        )


def _call_state(call: Any) -> tuple:
    """What a chunk needs to rebuild the GatedCall: plain values that pickle (worker processes)."""
    return (call.act.name, dict(call.act_p), call.key, dict(call.kp), call.dim, call.gate_first, call.layout)


def _rebuild(state: tuple) -> Any:
    from .gated import GatedCall

    act, act_p, key, kp, dim, gate_first, layout = state
    return GatedCall(OPS[act], act_p, key, kp, dim, gate_first, layout)


def _gated_dim(fn: str, call: Any, x: da.Array) -> int:
    """The normalised dim of the one-input form, checked now (range, even and known length)."""
    from . import gated

    ndim = x.ndim
    if ndim and -ndim <= call.dim < ndim and math.isnan(x.shape[call.dim % ndim]):
        raise ValueError(f"{fn}: x.shape[{call.dim}] is unknown (NaN chunks); the gated ops split x along dim, "
                         "so its length must be known: x.compute_chunk_sizes() first")
    return gated._axis(fn, tuple(x.shape), call.dim, call.layout)


def _gated_checks(fn: str, cdef: Any, call: Any, arrays: dict[str, da.Array], backend: str | None) -> None:
    from . import gated

    if backend is not None:
        registry.check_name(backend)  # a typo fails now; availability is each worker's own question
    _check(fn.split("(")[0], arrays)
    gated._check_precision(call, next(iter(arrays.values())).dtype, fn)


def call_gated(cdef: Any, call: Any, x: Any, up: Any, out: Any, backend: str | None) -> da.Array:
    """The lazy y of a gated op (forward) on Dask arrays; `call` is the checked gated.GatedCall.

    One-input form: x is rechunked so each chunk holds the whole `dim` axis; y has x's chunks but
    one chunk of half x's length along dim.  Two-input form: x (the gate or up, as `activate` says)
    and up are aligned blockwise like an elementwise op's arrays."""
    from . import gated

    fn = gated.label(cdef, "forward")
    _no_out(fn, out)
    arrays = {"x": _dask(x)} if up is None else {"x": _dask(x), "up": _dask(up)}
    _gated_checks(fn, cdef, call, arrays, backend)
    prefs = registry.preference_key()
    state = _call_state(call)
    xd = arrays["x"]
    ind = tuple(range(xd.ndim))
    token = f"multiact-{cdef.name}-forward"
    if up is None:
        dim = _gated_dim(fn, call, xd)
        xd = xd.rechunk({dim: -1})
        chunk = functools.partial(_gated_forward_chunk, fn, state, False, backend, prefs)
        return da.blockwise(chunk, ind, xd, ind, dtype=xd.dtype, meta=xd._meta, token=token,
                            adjust_chunks={dim: lambda n: n // 2})
    chunk = functools.partial(_gated_forward_chunk, fn, state, True, backend, prefs)
    return da.blockwise(chunk, ind, xd, ind, arrays["up"], ind, dtype=xd.dtype, meta=xd._meta, token=token)


def call_gated_grad(cdef: Any, call: Any, dy: Any, x: Any, up: Any, out: Any, backend: str | None) -> Any:
    """The lazy backward of a gated op on Dask arrays: dx (one-input form: x's shape, x rechunked to
    whole `dim` chunks, dy to match) or the pair (dgate, dup) for the two-input form (aligned)."""
    from . import gated

    fn = gated.label(cdef, "backward")
    _no_out(fn, out)
    prefs = registry.preference_key()
    state = _call_state(call)
    token = f"multiact-{cdef.name}-backward"
    if up is None:
        xd, dyd = _dask(x), _dask(dy)
        _gated_checks(fn, cdef, call, {"x": xd}, backend)
        dim = _gated_dim(fn, call, xd)
        half = tuple(n // 2 if i == dim else n for i, n in enumerate(xd.shape))
        _check(fn.split("(")[0], {"the result": _Shape(xd.dtype, half), "dy": dyd})
        xd = xd.rechunk({dim: -1})
        dyd = dyd.rechunk({dim: -1})
        ind = tuple(range(xd.ndim))
        # dy's dim axis has a label of its own (half x's length, one chunk): concatenate=True hands the block
        dy_ind = tuple(xd.ndim if i == dim else i for i in ind)
        chunk = functools.partial(_gated_backward_chunk, fn, state, False, backend, prefs)
        return da.blockwise(chunk, ind, dyd, dy_ind, xd, ind, dtype=xd.dtype, meta=xd._meta, token=token,
                            concatenate=True)
    arrays = {"dy": _dask(dy), "x": _dask(x), "up": _dask(up)}
    _gated_checks(fn, cdef, call, arrays, backend)
    ind = tuple(range(arrays["x"].ndim))
    chunk = functools.partial(_gated_backward_chunk, fn, state, True, backend, prefs)
    # both results of a block in one array, (2, *block): one pass per chunk, then two lazy views
    both = da.blockwise(chunk, (-1, *ind), arrays["dy"], ind, arrays["x"], ind, arrays["up"], ind,
                        new_axes={-1: 2}, dtype=arrays["x"].dtype,
                        meta=arrays["x"]._meta.reshape((0,) * (len(ind) + 1)), token=token)
    return both[0], both[1]


class _Shape:
    """A dtype and shape for _check (the result of a one-input forward, which dy must match)."""

    def __init__(self, dtype: Any, shape: tuple[int, ...]):
        self.dtype, self.shape = dtype, shape


def _dask(a: Any) -> da.Array:
    """A Dask array of a call's argument (the dispatcher sends here when any of them is one)."""
    return a if isinstance(a, da.Array) else da.from_array(_arrays.as_host_array(a, "array"))


def _gated_forward_chunk(fn: str, state: tuple, two: bool, backend: str | None, prefs: tuple, x: Any,
                         up: Any = None) -> Any:
    """One chunk of a gated forward: the kernel path of a plain call (gated.forward without re-resolving)."""
    from . import gated

    call = _rebuild(state)
    with _preferences(prefs):
        kind = dispatch._kind(x)
        if kind != "numpy":
            return gated._forward_device(fn, call, kind, x, up, None, backend)
        xa, gate, upv = gated._host_views(fn, call, x, up)
        mod, kernel = registry.resolve(call.key, "forward", xa.dtype.name, "numpy", backend)
        res = np.empty(gate.shape, xa.dtype)
        dispatch._run(mod, kernel, gated._Label(fn, call), "forward", xa.dtype.name, (gate, upv, res), call.kp)
        return res


def _gated_backward_chunk(fn: str, state: tuple, two: bool, backend: str | None, prefs: tuple, dy: Any, x: Any,
                          up: Any = None) -> Any:
    """One chunk of a gated backward: dx (one-input form) or (dgate, dup) stacked on a new first axis."""
    from . import gated

    call = _rebuild(state)
    with _preferences(prefs):
        kind = dispatch._kind(x)
        if kind != "numpy":
            res = gated._backward_device(fn, call, kind, dy, x, up, None, backend)
            if not two:
                return res
            return _xp(res[0]).stack(res)
        xa, gate, upv = gated._host_views(fn, call, x, up)
        dya = _arrays.as_host_array(dy, f"{fn}: dy")
        mod, kernel = registry.resolve(call.key, "backward", xa.dtype.name, "numpy", backend)
        if two:  # in the order of the arguments (x, up), whichever of them is the gate
            res = np.empty((2, *xa.shape), xa.dtype)
            dgate, dup = gated._pair(call, res[0], res[1])
        else:
            res = np.empty_like(xa)
            dgate, dup = gated._pair(call, *gated.split(res, call.dim % xa.ndim, call.layout))
        dispatch._run(mod, kernel, gated._Label(fn, call), "backward", xa.dtype.name, (dya, gate, upv, dgate, dup),
                      call.kp)
        return res


def _xp(a: Any) -> Any:
    """The array module of a device block (CuPy), for stacking the pair."""
    return sys.modules[type(a).__module__.split(".")[0]]


# ---- bias_act ---------------------------------------------------------------------------------------------
# x blockwise; a per-channel b / scale is chunked like x along dim (an array of x's shape like x).  The
# backward runs one pass per chunk, which returns dx, its float64 partial sums of dz and dz * x (one row per
# chunk, so Dask sums them across chunks in float64, rounded at the end), and dz / dz * x for full-shape ones.


def _bias_side(fn: str, name: str, a: Any, x: da.Array, dim: int | None) -> tuple[da.Array, bool] | None:
    """(b or scale as a Dask array chunked along x, whether it is one value per channel); None if not given."""
    if a is None:
        return None
    ad = _dask(a)
    if ad.dtype != x.dtype:
        raise TypeError(f"{fn}: {name} has dtype {ad.dtype} but x has {x.dtype}; they must match")
    if ad.shape == x.shape and x.ndim != 1:
        return ad.rechunk(x.chunks), False
    if ad.ndim == 1 and ad.shape[0] == x.shape[dim]:
        return ad.rechunk((x.chunks[dim],)), True
    raise ValueError(f"{fn}: {name} has shape {ad.shape}; expected ({x.shape[dim]},) to run along dim {dim} "
                     f"of x, or x's shape {x.shape}")


def _bias_prepare(fn: str, call: Any, x: Any, b: Any, scale: Any, dy: Any = None):
    from . import fused_bias_act as B

    dispatch.same_given_dtype(fn, {"x": x, "b": b, "scale": scale, "dy": dy})
    xd = _dask(x)
    _check(fn.split("(")[0], {"x": xd} if dy is None else {"x": xd, "dy": _dask(dy)})
    if any(math.isnan(n) for n in xd.shape):
        raise ValueError(f"{fn}: x has unknown chunk sizes (NaN); x.compute_chunk_sizes() first")
    dim = None if b is None and scale is None else B._axis(fn, tuple(xd.shape), call.dim)
    sides = (_bias_side(fn, "b", b, xd, dim), _bias_side(fn, "scale", scale, xd, dim))
    B._check_precision(call, xd.dtype, fn)
    return xd, dim, sides


def _bias_blockwise_args(xd: da.Array, dim: int | None, sides) -> tuple[list, tuple[bool, ...]]:
    ind = tuple(range(xd.ndim))
    args: list = []
    given = []
    for side in sides:
        given.append(side is not None)
        if side is not None:
            arr, per_channel = side
            args += [arr, (dim,) if per_channel else ind]
    return args, tuple(given)


def _bias_unpack(given: tuple[bool, ...], rest: tuple) -> tuple[Any, Any]:
    it = iter(rest)
    return tuple(next(it) if g else None for g in given)


def call_bias_act(call: Any, x: Any, b: Any, scale: Any, out: Any, backend: str | None) -> da.Array:
    """The lazy y of ma.bias_act on Dask arrays (`call`: the checked fused_bias_act.BiasActCall)."""
    from . import fused_bias_act as B

    fn = B.label("forward")
    _no_out(fn, out)
    if backend is not None:
        registry.check_name(backend)
    xd, dim, sides = _bias_prepare(fn, call, x, b, scale)
    args, given = _bias_blockwise_args(xd, dim, sides)
    ind = tuple(range(xd.ndim))
    chunk = functools.partial(_bias_forward_chunk, _bias_state(call), given, backend, registry.preference_key())
    return da.blockwise(chunk, ind, xd, ind, *args, dtype=xd.dtype, meta=xd._meta, token="multiact-bias_act",
                        align_arrays=False)


def call_bias_act_grad(call: Any, dy: Any, x: Any, b: Any, scale: Any, out: Any, backend: str | None) -> Any:
    """The lazy backward: dx, (dx, db) or (dx, db, dscale) as ma.bias_act_grad returns them."""
    import operator

    from . import fused_bias_act as B

    fn = B.label("backward")
    _no_out(fn, out)
    if backend is not None:
        registry.check_name(backend)
    xd, dim, sides = _bias_prepare(fn, call, x, b, scale, dy)
    dyd = _dask(dy).rechunk(xd.chunks)
    args, given = _bias_blockwise_args(xd, dim, sides)
    ind = tuple(range(xd.ndim))
    chunk = functools.partial(_bias_backward_chunk, _bias_state(call), given, backend, registry.preference_key())
    # one task per chunk returning a tuple; the results are lazy views of it
    parts = da.blockwise(chunk, ind, dyd, ind, xd, ind, *args, dtype=object, meta=np.empty((0,) * xd.ndim, object),
                         token="multiact-bias_act-grad", align_arrays=False)
    dx = parts.map_blocks(operator.itemgetter(0), dtype=xd.dtype, meta=xd._meta)
    if not any(given):
        return dx
    results = [dx]
    for k, side in enumerate(sides):
        if side is None:
            results.append(None)
            continue
        _, per_channel = side
        if not per_channel:  # dz or dz * x elementwise, x's chunks
            results.append(parts.map_blocks(operator.itemgetter(3 + k), dtype=xd.dtype, meta=xd._meta))
            continue
        chunks = tuple(c if i == dim else (1,) * len(c) for i, c in enumerate(xd.chunks))
        partial = parts.map_blocks(operator.itemgetter(1 + k), dtype=np.float64, chunks=chunks,
                                   meta=np.empty((0,) * xd.ndim))
        total = partial.sum(axis=tuple(i for i in ind if i != dim), dtype=np.float64)
        results.append(total.map_blocks(B._rounded_sum, xd.dtype, dtype=xd.dtype, meta=np.empty((0,), xd.dtype)))
    if sides[1] is None:
        results.pop()
    return tuple(results)


def _bias_state(call: Any) -> tuple:
    return (call.act.name, dict(call.act_p), dict(call.kp), call.dim)


def _bias_rebuild(state: tuple) -> Any:
    from . import fused_bias_act as B
    from .optable import LINEAR

    act, act_p, kp, dim = state
    return B.BiasActCall(LINEAR if act == LINEAR.name else OPS[act], act_p, kp, dim)


def _bias_block_views(call: Any, x: np.ndarray, b: Any, s: Any):
    from . import fused_bias_act as B

    dim = None if b is None and s is None else call.dim % x.ndim
    o, c, i = B._three(x.shape, dim)
    b3, s3 = B._per_channel(b, s, x, o, c, i)
    return dim, (o, c, i), b3, s3


def _bias_forward_chunk(state: tuple, given: tuple, backend: str | None, prefs: tuple, x: Any, *rest: Any) -> Any:
    """One chunk of the forward: the kernel path of a plain call."""
    from . import fused_bias_act as B

    call = _bias_rebuild(state)
    b, s = _bias_unpack(given, rest)
    with _preferences(prefs):
        if dispatch._kind(x) != "numpy":  # device chunks (CuPy): the plain call for that kind
            return B.forward(x, b, s, {"act": call.act.name, "dim": call.dim, "gain": call.kp["gain"],
                                       "clamp": _clamp(call)}, dict(call.act_p), None, backend)
        xa = np.asarray(x)
        _, (o, c, i), b3, s3 = _bias_block_views(call, xa, b, s)
        mod, kernel = registry.resolve(call.key, "forward", xa.dtype.name, "numpy", backend)
        res = np.empty_like(xa)
        dispatch._run(mod, kernel, B._Label("", call), "forward", xa.dtype.name,
                      (xa.reshape(o, c, i), b3, s3, res.reshape(o, c, i)), call.kp)
        return res


def _clamp(call: Any) -> float | None:
    return None if call.kp["clamp"] == math.inf else call.kp["clamp"]


def _bias_backward_chunk(state: tuple, given: tuple, backend: str | None, prefs: tuple, dy: Any, x: Any,
                         *rest: Any) -> tuple:
    """One chunk of the backward: (dx, db partial, dscale partial, db full, dscale full), the partials float64
    sums shaped (1, .., C_block, .., 1), Nones where not asked."""
    from . import fused_bias_act as B

    call = _bias_rebuild(state)
    b, s = _bias_unpack(given, rest)
    with _preferences(prefs):
        xa, dya = np.asarray(x), np.asarray(dy)
        dim, (o, c, i), b3, s3 = _bias_block_views(call, xa, b, s)
        full_b = b is not None and not B._channelwise(b, xa)
        full_s = s is not None and not B._channelwise(s, xa)
        want = (b is not None and not full_b, s is not None and not full_s)
        mod, kernel = registry.resolve(call.key, "backward", xa.dtype.name, "numpy", backend)
        dx = np.empty_like(xa)
        db_full = np.empty_like(xa) if full_b else None
        ds_full = np.empty_like(xa) if full_s else None
        kp = {**call.kp, "sum_db": want[0], "sum_dscale": want[1]}
        sums = dispatch._run(mod, kernel, B._Label("", call), "backward", xa.dtype.name,
                             (dya.reshape(o, c, i), xa.reshape(o, c, i), b3, s3, dx.reshape(o, c, i),
                              None if db_full is None else db_full.reshape(o, c, i),
                              None if ds_full is None else ds_full.reshape(o, c, i)), kp)
        shape = tuple(n if k == dim else 1 for k, n in enumerate(xa.shape))
        parts = [None if not w else np.asarray(sums[k], np.float64).reshape(shape) for k, w in enumerate(want)]
        return dx, parts[0], parts[1], db_full, ds_full
