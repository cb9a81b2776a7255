"""One call, from the caller's arguments to a backend kernel: check everything, then run.

Every check happens before the kernel is called, so bad input never leaves a
half-written `out`.  Host arrays (NumPy, torch CPU tensors, lists, floats) are
handed to kernels as NumPy arrays; device arrays (CUDA, NPU) are handed as they
are to the backend that owns their kind, which allocates results in kind.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _arrays, registry
from .ops import OpSpec

_HOST_KINDS = ("numpy", "torch", "other")


def _dtype_name(a: Any) -> str:
    return str(a.dtype).replace("torch.", "")


def _kind(a: Any) -> str:
    k = _arrays.kind_of(a)
    return "numpy" if k in _HOST_KINDS else k


def _same_kind(op: str, named: dict[str, Any]) -> str:
    """The one array kind of a call; mixed libraries or devices are a TypeError naming them."""
    raw = {name: _arrays.kind_of(a) for name, a in named.items() if a is not None}
    libs = {k for k in raw.values() if k != "other"}  # lists and floats go with anything on the host
    if len(libs) > 1 or (not libs <= set(_HOST_KINDS) and "other" in raw.values()):
        desc = ", ".join(f"{n} is {_arrays.library_of(named[n])}" for n in raw)
        raise TypeError(f"{op}(): arrays must come from one library on one device: {desc}")
    k = next(iter(libs), "numpy")
    return "numpy" if k in _HOST_KINDS else k


def _host(op: str, named: dict[str, Any]) -> dict[str, np.ndarray]:
    arrs = {n: _arrays.as_host_array(a, f"{op}(): {n}") for n, a in named.items() if a is not None}
    ref_name, ref = next(iter(arrs.items()))
    for n, a in arrs.items():
        if a.dtype != ref.dtype:
            raise TypeError(f"{op}(): {n} has dtype {a.dtype} but {ref_name} has {ref.dtype}; they must match")
        if a.shape != ref.shape:
            raise ValueError(f"{op}(): {n} has shape {a.shape} but {ref_name} has {ref.shape}; they must match")
    return arrs


def _check_device(op: str, named: dict[str, Any]) -> None:
    items = [(n, a) for n, a in named.items() if a is not None]
    ref_name, ref = items[0]
    for n, a in items:
        if _dtype_name(a) not in ("float16", "float32", "float64"):
            raise TypeError(f"{op}(): {n} must have a float16, float32 or float64 dtype, got {_dtype_name(a)}")
        if _dtype_name(a) != _dtype_name(ref):
            raise TypeError(f"{op}(): {n} has dtype {_dtype_name(a)} but {ref_name} has {_dtype_name(ref)}")
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError(f"{op}(): {n} has shape {tuple(a.shape)} but {ref_name} has {tuple(ref.shape)}")


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.strides == b.strides
        and a.shape == b.shape
    )


def _check_out(op: str, out: np.ndarray, inputs: dict[str, np.ndarray], like: np.ndarray) -> None:
    if out.dtype != like.dtype:
        raise TypeError(f"{op}(): out has dtype {out.dtype}, expected {like.dtype}")
    if out.shape != like.shape:
        raise ValueError(f"{op}(): out has shape {out.shape}, expected {like.shape}")
    if not out.flags.writeable:
        raise ValueError(f"{op}(): out is read-only")
    for n, a in inputs.items():
        if out.size and np.may_share_memory(out, a) and not _same_memory(out, a):
            try:
                overlap = np.shares_memory(out, a, max_work=10_000)
            except np.exceptions.TooHardError:
                overlap = True
            if overlap:
                raise ValueError(
                    f"{op}(): out overlaps {n} without being the same view; pass out={n} for in place, "
                    "or a separate array"
                )


def prelu_axis(op: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], axis: int) -> int | None:
    """The channel axis of prelu, normalised; None for a single weight.  ValueError naming what is off."""
    size = int(np.prod(w_shape))
    if size == 1:
        return None
    ndim = len(x_shape)
    if ndim == 0 or not -ndim <= axis < ndim:
        raise ValueError(f"{op}(): axis {axis} is out of range for x with {ndim} dims")
    axis %= ndim
    if len(w_shape) != 1 or size != x_shape[axis]:
        raise ValueError(
            f"{op}(): weight has shape {tuple(w_shape)}; expected 1 element or ({x_shape[axis]},) "
            f"to match x.shape[{axis}]"
        )
    return axis


def _weight(spec: OpSpec, p: dict, x: np.ndarray) -> tuple[dict, Any]:
    """prelu: the weight as an array of x's dtype shaped to broadcast along axis."""
    w = _arrays.as_host_array(p["weight"], f"{spec.name}(): weight")
    axis = prelu_axis(spec.name, x.shape, w.shape, p["axis"])
    if axis is None:
        shaped = w.astype(x.dtype).reshape((1,) * x.ndim)
        return {**p, "weight": shaped, "axis": 0}, w
    shape = [1] * x.ndim
    shape[axis] = w.size
    return {**p, "weight": w.astype(x.dtype).reshape(shape), "axis": axis}, w


_FAST_DTYPES = {np.dtype(t): np.dtype(t).name for t in ("float16", "float32", "float64")}
_validated_cache: dict[tuple, dict[str, Any]] = {}


def _validated(spec: OpSpec, params: dict[str, Any]) -> dict[str, Any]:
    """spec.validate, remembered for hashable parameter values (the common case)."""
    try:
        key = (spec.name, tuple((k, type(v), v) for k, v in params.items()))
        hit = _validated_cache.get(key)
    except TypeError:  # an array parameter (prelu's weight)
        return spec.validate(params)
    if hit is None:
        hit = spec.validate(params)
        if len(_validated_cache) < 4096:
            _validated_cache[key] = hit
    return hit


# Per-op caches of the generated functions' hot path:
# (direction, dtype, *param types and values, backend, use() scope, MULTIACT_BACKEND) -> _Fast.
_fast_caches: dict[str, dict[tuple, Any]] = {}


class _Fast:
    """A resolved call: the kernel, its checked parameters, and who runs it."""

    __slots__ = ("kernel", "p", "mod", "what")

    def __init__(self, kernel, p, mod, what):
        self.kernel, self.p, self.mod, self.what = kernel, p, mod, what


def fast_cache(spec: OpSpec) -> dict[tuple, Any]:
    return _fast_caches.setdefault(spec.name, {})


def clear_fast_caches() -> None:
    for c in _fast_caches.values():
        c.clear()


def out_ok(out: Any, *inputs: np.ndarray) -> bool:
    """True when out is a fresh, writeable NumPy array matching the inputs (else the slow path judges).

    Written as plain branches and loops: it runs on every out= call of the hot path.
    """
    x = inputs[-1]
    if type(out) is not np.ndarray or out.dtype != x.dtype or out.shape != x.shape or not out.flags.writeable:
        return False
    if out.base is None:  # two arrays that each own their memory cannot overlap; views need the real check
        for a in inputs:
            if a.base is not None:
                break
        else:
            return True
    for a in inputs:
        if np.may_share_memory(out, a):
            return False
    return True


def annotate(e: BaseException, hit: _Fast) -> None:
    """Name the backend and the call on an error from a kernel (its type is kept)."""
    if hasattr(e, "add_note"):
        e.add_note(f"multiact: raised by backend {hit.mod.NAME!r} running {hit.what}")


def run_fast(hit: _Fast, args: tuple) -> Any:
    """Call the kernel; an error keeps its type and gains a note naming the backend and the call."""
    try:
        return hit.kernel(*args, hit.p)
    except Exception as e:
        annotate(e, hit)
        raise


def _run(mod: Any, kernel: Any, spec: OpSpec, direction: str, dtype: str, args: tuple, p: dict) -> Any:
    return run_fast(_Fast(kernel, p, mod, f"{spec.name} {direction} in {dtype}"), args)


def _remember(spec: OpSpec, direction: str, dtype: Any, params: dict, backend, mod, kernel, p) -> None:
    """Store a resolved call where the generated function's fast path will find it next time."""
    if spec.name == "prelu" or direction == "param_grad":
        return
    key = (direction, dtype)
    for name in spec.param_names:
        v = params.get(name, spec.params[spec.param_names.index(name)].default)
        key += (v.__class__, v)
    key += (backend, registry._scope.get(), registry._env_backend)
    cache = fast_cache(spec)
    if len(cache) < 1024:
        try:
            cache[key] = _Fast(kernel, p, mod, f"{spec.name} {direction} in {dtype}")
        except TypeError:  # unhashable parameter value
            pass


def _call_ndarrays(spec: OpSpec, direction: str, named: dict, params: dict, out: Any, backend: str | None) -> Any:
    """The hot path: NumPy arrays of one float dtype and shape; None if the call is not that simple."""
    arrs = tuple(named.values())
    x0 = arrs[0]
    dtype = _FAST_DTYPES.get(x0.dtype)
    if dtype is None or any(a.dtype != x0.dtype or a.shape != x0.shape for a in arrs[1:]):
        return None
    p = _validated(spec, params)
    mod, kernel = registry.resolve(spec.name, direction, dtype, "numpy", backend)
    if out is None:
        res = np.empty_like(x0)
    else:
        _check_out(spec.name, out, named, x0)
        res = out
    _remember(spec, direction, x0.dtype, params, backend, mod, kernel, p)
    _run(mod, kernel, spec, direction, dtype, arrs + (res,), p)
    return res


def call(
    spec: OpSpec,
    direction: str,
    named: dict[str, Any],
    params: dict[str, Any],
    out: Any = None,
    backend: str | None = None,
) -> Any:
    """Run one forward/backward/backward_y/param_grad call; `named` holds the array arguments."""
    if (
        direction != "param_grad"
        and spec.name != "prelu"
        and (out is None or type(out) is np.ndarray)
        and all(type(a) is np.ndarray for a in named.values())
    ):
        res = _call_ndarrays(spec, direction, named, params, out, backend)
        if res is not None:
            return res
    op = spec.name
    p = _validated(spec, params)
    kind = _same_kind(op, {**named, "out": out})
    if kind == "dask":
        from . import dask_arrays

        return dask_arrays.call(spec, direction, named, p, out, backend)
    if kind not in _HOST_KINDS and kind != "numpy":
        return _call_device(spec, direction, kind, named, p, out, backend)

    arrs = _host(op, named)
    like = next(iter(arrs.values()))
    weight_in = None
    if spec.name == "prelu":
        p, weight_in = _weight(spec, p, like)
    dtype = like.dtype.name
    mod, kernel = registry.resolve(op, direction, dtype, "numpy", backend)
    ins = tuple(arrs.values())
    if direction == "param_grad":
        res = _run(mod, kernel, spec, direction, dtype, ins, p)
        if spec.name == "prelu":
            return _arrays.wrap_like(np.asarray(res).astype(weight_in.dtype).reshape(weight_in.shape), named["x"])
        with np.errstate(over="ignore"):  # a float16 sum beyond 65504 is inf, as NumPy would say
            return like.dtype.type(res)
    if out is None:
        res = np.empty_like(like)
    else:
        if not (isinstance(out, np.ndarray) or _arrays.kind_of(out) == "torch"):
            raise TypeError(f"{op}(): out must be an array to write into, got {type(out).__name__}")
        res = _arrays.as_host_array(out, f"{op}(): out", writeable=True)
        _check_out(op, res, arrs, like)
    _run(mod, kernel, spec, direction, dtype, ins + (res,), p)
    if out is not None:
        return out
    result_like = named.get("x", named.get("y"))
    return _arrays.wrap_like(res, result_like)


def _call_device(spec, direction, kind, named, p, out, backend):
    op = spec.name
    _check_device(op, {**named, "out": out})
    like = next(a for a in named.values() if a is not None)
    dtype = _dtype_name(like)
    mod, kernel = registry.resolve(op, direction, dtype, kind, backend)
    ins = tuple(a for a in named.values() if a is not None)
    if direction == "param_grad":
        return _run(mod, kernel, spec, direction, dtype, ins, p)
    res = mod.empty_like(like) if out is None else out
    _run(mod, kernel, spec, direction, dtype, ins + (res,), p)
    return res


def explain(spec: OpSpec, direction: str, a: Any, backend: str | None = None) -> str:
    """Which backend runs this call, and why the others did not."""
    kind = _kind(a)
    dtype = _dtype_name(a) if hasattr(a, "dtype") else np.asarray(a).dtype.name
    try:
        mod, notes = registry.select(spec.name, direction, dtype, kind, backend)
    except Exception as e:
        return f"{spec.name} {direction} on {kind} {dtype} arrays: cannot run: {e}"
    lines = [f"{spec.name} {direction} on {kind} {dtype} arrays -> {mod.NAME}"]
    lines += [f"  {n}" for n in notes]
    # fall-through happens only here, at selection; a kernel that fails is never retried elsewhere
    lines.append(f"  an error raised while {mod.NAME} runs reaches the caller; no other backend is tried")
    return "\n".join(lines)
