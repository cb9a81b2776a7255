"""One call, from the caller's arguments to a backend kernel: check everything, then run.

Every check happens before the kernel is called, so bad input never leaves a
half-written `out`.  Host arrays (NumPy, torch CPU tensors, lists, floats) are
handed to kernels as NumPy arrays; device arrays (CUDA, NPU) are handed as they
are to the backend that owns their kind, which allocates results in kind.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _arrays, registry
from . import dtypes as _dtypes
from ._config import get_num_threads as _threads
from .optable import OpSpec, value_key

_HOST_KINDS = ("numpy", "torch", "other")


def _dtype_name(a: Any) -> str:
    return str(a.dtype).replace("torch.", "")


def _kind(a: Any) -> str:
    k = _arrays.kind_of(a)
    return "numpy" if k in _HOST_KINDS else k


def _same_kind(fn: str, named: dict[str, Any]) -> str:
    """The one array kind of a call; mixed libraries or devices are a TypeError naming them."""
    raw = {name: _arrays.kind_of(a) for name, a in named.items() if a is not None}
    libs = {k for k in raw.values() if k != "other"}  # lists and floats go with anything on the host
    if len(libs) > 1 or (not libs <= set(_HOST_KINDS) and "other" in raw.values()):
        desc = ", ".join(f"{n} is {_arrays.library_of(named[n])}" for n in raw)
        raise TypeError(f"{fn}: arrays must come from one library on one device: {desc}")
    k = next(iter(libs), "numpy")
    return "numpy" if k in _HOST_KINDS else k


def same_given_dtype(fn: str, named: dict[str, Any]) -> None:
    """The caller's arrays have one dtype as given (before any conversion: a list's float64 beside a float32 x
    is refused like a float32 dy beside it); TypeError naming them.  Byte order does not count."""
    given = {n: _given_dtype(a) for n, a in named.items() if a is not None and hasattr(a, "dtype")}
    if len(set(given.values())) > 1:
        (n0, d0), *rest = given.items()
        n1, d1 = next((n, d) for n, d in rest if d != d0)
        raise TypeError(f"{fn}: {n1} has dtype {d1} but {n0} has {d0}; they must match")


def _given_dtype(a: Any) -> Any:
    dt = a.dtype
    if isinstance(dt, np.dtype):  # (kind, size): byte order aside, and cheap (dtype.name is not)
        return _NAMES.get((dt.kind, dt.itemsize)) or str(dt)
    return str(dt).replace("torch.", "")


_NAMES = {(np.dtype(n).kind, np.dtype(n).itemsize): n for n in ("float16", "float32", "float64")}


def dtype_name(dt: np.dtype) -> str:
    """A NumPy dtype's name, without dtype.name's cost (microseconds) for the float dtypes."""
    return (_NAMES.get((dt.kind, dt.itemsize)) or dt.name) if dt.isnative else dt.name


def _host(fn: str, named: dict[str, Any]) -> dict[str, np.ndarray]:
    """NumPy views of the host inputs (None is refused by name), one dtype and one shape."""
    same_given_dtype(fn, named)
    arrs = {n: _arrays.as_host_array(a, f"{fn}: {n}") for n, a in named.items()}
    ref_name, ref = next(iter(arrs.items()))
    for n, a in arrs.items():
        if a.dtype != ref.dtype:
            raise TypeError(f"{fn}: {n} has dtype {a.dtype} but {ref_name} has {ref.dtype}; they must match")
        if a.shape != ref.shape:
            raise ValueError(f"{fn}: {n} has shape {a.shape} but {ref_name} has {ref.shape}; they must match")
    return arrs


def _check_device(fn: str, named: dict[str, Any], out: Any) -> None:
    for n, a in named.items():
        if a is None or not hasattr(a, "dtype"):
            raise TypeError(f"{fn}: {n} must be an array like the others, got {type(a).__name__}")
    items = [*named.items()] + ([] if out is None else [("out", out)])
    ref_name, ref = items[0]
    for n, a in items:
        if _dtype_name(a) not in _DEVICE_DTYPES:
            raise TypeError(f"{fn}: {n} must have a {_arrays.DTYPE_TEXT} dtype, got {_dtype_name(a)}")
        if _dtype_name(a) != _dtype_name(ref):
            raise TypeError(f"{fn}: {n} has dtype {_dtype_name(a)} but {ref_name} has {_dtype_name(ref)}")
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError(f"{fn}: {n} has shape {tuple(a.shape)} but {ref_name} has {tuple(ref.shape)}")


_DEVICE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.strides == b.strides
        and a.shape == b.shape
    )


def check_out(fn: str, out: np.ndarray, inputs: dict[str, np.ndarray], like: np.ndarray) -> None:
    """The one check of a NumPy destination, made by the cached hot path and the checked path alike:
    dtype, shape, writeable, and no partial overlap with any input (the same view is in place)."""
    if out.dtype != like.dtype:
        if out.dtype.newbyteorder("=") == like.dtype:
            raise _arrays.byte_order_error(f"{fn}: out", out.dtype)
        raise TypeError(f"{fn}: out has dtype {out.dtype}, expected {like.dtype}")
    if out.shape != like.shape:
        raise ValueError(f"{fn}: out has shape {out.shape}, expected {like.shape}")
    if not out.flags.writeable:
        raise ValueError(f"{fn}: out is read-only")
    if not out.size:
        return
    for n, a in inputs.items():
        if a is out or (out.base is None and a.base is None):  # two owners of memory cannot overlap
            continue
        if np.may_share_memory(out, a) and not _same_memory(out, a):
            try:
                overlap = np.shares_memory(out, a, max_work=10_000)
            except np.exceptions.TooHardError:
                overlap = True
            if overlap:
                raise ValueError(
                    f"{fn}: out overlaps {n} without being the same view; pass out={n} for in place, "
                    "or a separate array"
                )


def prelu_axis(op: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], axis: int) -> int | None:
    """The channel axis of prelu, normalised; None for a single weight.  ValueError naming what is off."""
    size = int(np.prod(w_shape))
    if size == 1:
        return None
    ndim = len(x_shape)
    if ndim == 0 or not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for x with {ndim} dims")
    axis %= ndim
    if len(w_shape) != 1 or size != x_shape[axis]:
        raise ValueError(
            f"{op}: weight has shape {tuple(w_shape)}; expected 1 element, ({x_shape[axis]},) "
            f"to match x.shape[{axis}], or (NumPy arrays) a shape that broadcasts to x's {tuple(x_shape)}"
        )
    return axis


def _prelu_block(x_shape: tuple[int, ...], w: np.ndarray, axis: int) -> tuple[int, int] | None:
    """For a prelu weight that is neither one element nor one per channel along `axis` but broadcasts to x
    (NumPy's rules, ONNX's PRelu): the dims [i, j) of x that its non-1 dims span, else None."""
    ndim = len(x_shape)
    if w.size == 1 or not -ndim <= axis < ndim or (w.ndim == 1 and w.size == x_shape[axis % ndim]):
        return None  # one weight, one per channel, or a bad axis (prelu_axis says so)
    if w.ndim > ndim or any(d not in (1, xd) for d, xd in zip(w.shape[::-1], x_shape[::-1], strict=False)):
        return None  # prelu_axis says what is off
    aligned = (1,) * (ndim - w.ndim) + tuple(w.shape)
    spanned = [k for k, d in enumerate(aligned) if d != 1]
    return spanned[0], spanned[-1] + 1


def _prelu_broadcast_call(fn: str, spec: OpSpec, direction: str, arrs: dict[str, np.ndarray], p: dict, out: Any,
                          backend: str | None, like: np.ndarray, w: np.ndarray, i: int, j: int) -> Any:
    """prelu with a broadcast weight as the per-channel kernels run it: x as (outer, C, inner) around the
    dims [i, j) the weight spans, the weight broadcast over them (C = their product), then x's shape again;
    the weight gradient summed back over the dims the weight broadcasts along."""
    xs = like.shape
    s3 = (int(np.prod(xs[:i], dtype=np.int64)), int(np.prod(xs[i:j], dtype=np.int64)),
          int(np.prod(xs[j:], dtype=np.int64)))
    aligned = w.reshape((1,) * (len(xs) - w.ndim) + w.shape)
    wc = np.ascontiguousarray(np.broadcast_to(aligned.reshape(aligned.shape[i:j]), xs[i:j])).reshape(-1)
    named3 = {n: a.reshape(s3) for n, a in arrs.items()}
    p3 = {**p, "weight": wc, "axis": 1}
    if direction == "param_grad":
        g = np.asarray(call(spec, direction, named3, p3, None, backend), dtype=np.float64).reshape(xs[i:j])
        spread = tuple(k - i for k in range(i, j) if aligned.shape[k] == 1)
        return _dtypes.cast_float64(g.sum(axis=spread, keepdims=True).reshape(w.shape), w.dtype)
    res = np.asarray(call(spec, direction, named3, p3, None, backend)).reshape(xs)
    if out is None:
        return res
    dest = _arrays.as_host_array(out, f"{fn}: out", writeable=True)
    check_out(fn, dest, arrs, like)
    np.copyto(dest, res)
    _arrays.mark_written(out)
    return out


def _weight(spec: OpSpec, p: dict, x: np.ndarray, direction: str = "forward") -> tuple[dict, Any]:
    """prelu: the weight as an array of x's dtype shaped to broadcast along axis."""
    fn = spec.label(direction)
    w = _arrays.as_host_array(p["weight"], f"{fn}: weight")
    axis = prelu_axis(fn, x.shape, w.shape, p["axis"])
    with np.errstate(over="ignore", invalid="ignore"):
        cast = _dtypes.from_float64(w) if _dtypes.is_bf16(x.dtype) else w.astype(x.dtype)
    if not np.isfinite(cast.astype(np.float32) if cast.dtype.kind == "V" else cast).all():
        raise ValueError(f"{fn}: weight must be finite in {x.dtype.name}, where {x.dtype.name} arrays compute it")
    if axis is None:
        return {**p, "weight": cast.reshape((1,) * x.ndim), "axis": 0}, w
    shape = [1] * x.ndim
    shape[axis] = w.size
    return {**p, "weight": cast.reshape(shape), "axis": axis}, w


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


# Per-op caches of the generated functions' hot path: (direction, dtype, *parameter keys, backend,
# use() scope) -> _Fast, emptied by registry.clear_cache (which also re-reads MULTIACT_BACKEND).  Only
# what depends on the op, direction, dtype and parameter values is kept; every check of the call's
# arrays is made again on each call (check_out, and the generated function's dtype/shape tests).
_fast_caches: dict[str, dict[tuple, Any]] = {}


class _Fast:
    """A resolved call: the kernel, its checked parameters, and who runs it; `at`, for a call cached for
    tensors whose kernel can run on raw addresses (the native elementwise kernels' `at`), the
    (entry, handle) pair that does so, else None."""

    __slots__ = ("kernel", "p", "mod", "what", "at")

    def __init__(self, kernel, p, mod, what):
        self.kernel, self.p, self.mod, self.what, self.at = kernel, p, mod, what, None


def fast_cache(spec: OpSpec) -> dict[tuple, Any]:
    return _fast_caches.setdefault(spec.name, {})


@registry.on_clear
def clear_fast_caches() -> None:
    for c in _fast_caches.values():
        c.clear()
    _validated_cache.clear()


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


def _remember(spec: OpSpec, direction: str, dtype: np.dtype, backend, hit: _Fast) -> None:
    """Store a resolved call where the generated function's hot path will find it next time."""
    key = (direction, dtype, *(value_key(hit.p[name]) for name in spec.param_names))
    key += (backend, registry.preference_key())
    cache = fast_cache(spec)
    if len(cache) < 1024:
        cache[key] = hit


def _check_backend(fn: str, backend: Any) -> None:
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            f"{fn}: backend must be a backend name (str) or None, got {type(backend).__name__}; "
            f"valid backends: {', '.join(registry.BACKEND_NAMES)}"
        )


def call(
    spec: OpSpec,
    direction: str,
    named: dict[str, Any],
    params: dict[str, Any],
    out: Any = None,
    backend: str | None = None,
) -> Any:
    """Run one forward/backward/backward_y/param_grad call; `named` holds the array arguments.

    The checked path: the generated functions' hot path comes here for any call it has not seen,
    and for any call whose arrays it cannot vouch for.
    """
    fn = spec.label(direction)
    _check_backend(fn, backend)
    p = validated(spec, params, fn)
    masked = sys.modules.get("numpy.ma")
    if masked is not None and any(isinstance(a, masked.MaskedArray) for a in (*named.values(), out)):
        return _call_masked(spec, direction, named, p, out, backend)
    kind = _same_kind(fn, {**named, "out": out})
    if kind == "dask":
        from . import dask_arrays

        return dask_arrays.call(spec, direction, named, p, out, backend)
    if kind not in _HOST_KINDS and kind != "numpy":
        return _call_device(spec, direction, kind, named, p, out, backend)

    arrs = _host(fn, named)
    like = next(iter(arrs.values()))
    spec.check_precision(p, like.dtype, fn)
    weight_in = None
    if spec.name == "prelu":
        w_host = _arrays.as_host_array(p["weight"], f"{fn}: weight")
        block = _prelu_block(like.shape, w_host, p["axis"])
        if block is not None:  # a weight broadcast to x (ONNX's PRelu): the per-channel kernels on a 3-D view
            return _prelu_broadcast_call(fn, spec, direction, arrs, p, out, backend, like, w_host, *block)
        p, weight_in = _weight(spec, p, like, direction)
    dtype = like.dtype.name
    key = spec.kernel_key(p)  # the variant's formula, resolved here once for every backend
    mod, kernel = registry.resolve(key, direction, dtype, "numpy", backend)
    ins = tuple(arrs.values())
    if direction == "param_grad":
        res = _run(mod, kernel, spec, direction, dtype, ins, p)
        if spec.name == "prelu":
            res = _dtypes.cast_float64(res, weight_in.dtype).reshape(weight_in.shape)
            return _arrays.wrap_like(res, named["x"]) if _arrays.kind_of(named["x"]) == "torch" else res
        return param_result(res, like.dtype)
    if out is None:
        res = np.empty_like(like)
    else:
        if not (isinstance(out, np.ndarray) or _arrays.kind_of(out) == "torch"):
            raise TypeError(f"{fn}: out must be an array to write into, got {type(out).__name__}")
        res = _arrays.as_host_array(out, f"{fn}: out", writeable=True)
        check_out(fn, res, arrs, like)
    hit = _Fast(kernel, p, mod, f"{key} {direction} in {dtype}")
    run_fast(hit, ins + (res,))
    if spec.name != "prelu":
        if _plain(named, out) and all(arrs[n] is a for n, a in named.items()):
            _remember(spec, direction, like.dtype, backend, hit)
        elif _plain_tensors(named, out):
            at = getattr(kernel, "at", None)
            hit.at = None if at is None else at(p)
            _remember(spec, direction, next(iter(named.values())).dtype, backend, hit)
    if out is not None:
        _arrays.mark_written(out)
        return out
    return _arrays.wrap_like(res, named.get("x", named.get("y")))


def param_result(res: float, dtype: np.dtype) -> Any:
    """A float64 parameter-gradient sum as a scalar of the data's dtype, rounded once (a float16 sum beyond
    65504 is inf, as NumPy would say; bfloat16 rounds to nearest even from float64, never via float32)."""
    if _dtypes.is_bf16(dtype):
        return _dtypes.from_float64(res)[()]
    with np.errstate(over="ignore"):
        return dtype.type(res)


def _plain(named: dict[str, Any], out: Any) -> bool:
    """Only calls on plain NumPy arrays are remembered for the hot path (which takes nothing else)."""
    return (out is None or type(out) is np.ndarray) and all(type(a) is np.ndarray for a in named.values())


# ---- the tensor hot path -------------------------------------------------------------------------
#
# A call on plain CPU tensors (type torch.Tensor, not a subclass: Parameter, FakeTensor and the like take
# the checked path) whose (direction, torch dtype, parameter values, backend preference) was seen before
# runs its cached kernel on NumPy views of the tensors, after the checked path's own checks of its arrays:
# one dtype and shape (else the checked path raises), out= a plain CPU tensor of x's dtype (not bfloat16,
# not requiring grad under grad mode: as_host_array's refusals), check_out, and the version counter bumped
# after the write.  bfloat16 tensors are zero-copy too: their memory seen as int16, then as ml_dtypes.bfloat16,
# and run by the backend's bfloat16 kernel (computed in float32, rounded once), like a NumPy bfloat16 array.

TENSOR: list[Any] = [None]  # torch.Tensor once torch is imported (the generated functions' type test)
MISS = object()  # the hot path cannot vouch for this call: take the checked path


def _plain_tensors(named: dict[str, Any], out: Any) -> bool:
    """Only calls on plain CPU tensors are remembered for the tensor hot path."""
    if sys.modules.get("torch") is None:
        return False
    if TENSOR[0] is None:
        _torch_ready()
    T = TENSOR[0]
    return (out is None or (type(out) is T and out.is_cpu)) and all(
        type(a) is T and a.is_cpu for a in named.values())


def _view(a: Any) -> np.ndarray:
    if a.dtype is _BF16[0]:
        return _arrays.bf16_view(a.detach())
    return a.detach().numpy() if a.requires_grad else a.numpy()


def direct_test(t: str) -> str:
    """The test (Python source, on the CPU tensor named t) that its memory can go to a kernel as one address
    (`_Fast.at`): strided layout (not sparse or mkldnn), contiguous, and no lazy negation bit (which numpy()
    refuses, and an address would silently ignore); anything else takes NumPy views, whose refusals are the
    checked path's.  The generated functions inline it (names _STRIDED as here)."""
    return f"{t}.layout is _STRIDED[0] and {t}.is_contiguous() and not {t}.is_neg()"


_direct = eval(f"lambda a: {direct_test('a')}")  # noqa: S307 - a constant expression, above


def eager_forward(hit: _Fast, x: Any) -> Any:
    """multiact.torch's autograd path: the cached forward on a plain CPU tensor x that requires grad
    (the caller checked type, device and cache key); the result's dtype is x's."""
    y = _EMPTY_LIKE[0](x)
    at = hit.at
    try:
        if at is not None and _direct(x):
            at[0](at[1], x.data_ptr(), y.data_ptr(), y.numel(), _threads())
        else:  # a lazily negated x computes as torch's own ops do: on its value
            hit.kernel(_view(x.resolve_neg()), _view(y), hit.p)
    except Exception as e:
        annotate(e, hit)
        raise
    return y


def eager_backward(hit: _Fast, g: Any, x: Any) -> Any:
    """multiact.torch's autograd path: the cached backward for autograd's gradient g of a forward on x (the
    engine checked g's shape and dtype against the output, which are x's); MISS where g is unusual."""
    if type(g) is not TENSOR[0] or not g.is_cpu or g.dtype is not x.dtype:
        return tensor_hot(hit, "", ("dy", "x"), (g, x), None) if type(g) is TENSOR[0] else MISS
    y = _EMPTY_LIKE[0](x)
    at = hit.at
    try:
        if at is not None and _direct(g) and _direct(x):
            at[0](at[1], g.data_ptr(), x.data_ptr(), y.data_ptr(), y.numel(), _threads())
        else:
            hit.kernel(_view(g.resolve_neg()), _view(x.resolve_neg()), _view(y), hit.p)
    except Exception as e:
        annotate(e, hit)
        raise
    return y


def tensor_hot(hit: _Fast, fn: str, names: tuple[str, ...], ins: tuple, out: Any) -> Any:
    """Run a cached call on plain CPU tensors (ins[-1] is the array whose dtype and shape the result
    takes; the generated function checked its type); MISS where the checked path must decide (another
    device, dtype or shape, an out= it refuses).  A result it allocates goes to the kernel as an address
    with contiguous inputs where the kernel allows (`_Fast.at`), else as NumPy views like the inputs."""
    like = ins[-1]
    if not like.is_cpu:
        return MISS
    dt = like.dtype
    if out is None and len(ins) == 1:  # the common case, with nothing in the way
        at = hit.at
        if at is None or not _direct(like):
            if like.is_neg():  # numpy() refuses it: the checked path (multiact.torch: the custom op) decides
                return MISS
            at = None
        y = _EMPTY_LIKE[0](like)  # torch's allocation (a little cheaper than NumPy's, and resizable)
        try:
            if at is not None:
                at[0](at[1], like.data_ptr(), y.data_ptr(), y.numel(), _threads())
            elif dt is _BF16[0]:
                hit.kernel(_view(like), _view(y), hit.p)
            else:
                hit.kernel(like.detach().numpy() if like.requires_grad else like.numpy(), y.numpy(), hit.p)
        except Exception as e:
            annotate(e, hit)
            raise
        return y
    if len(ins) == 2:
        a = ins[0]
        if type(a) is not TENSOR[0] or a.dtype != dt or a.shape != like.shape or not a.is_cpu:
            return MISS
        at = hit.at
        if out is None and at is not None and _direct(a) and _direct(like):
            y = _EMPTY_LIKE[0](like)
            try:
                at[0](at[1], a.data_ptr(), like.data_ptr(), y.data_ptr(), y.numel(), _threads())
            except Exception as e:
                annotate(e, hit)
                raise
            return y
    arrs = (_view(like),) if len(ins) == 1 else (_view(ins[0]), _view(like))
    if out is None:
        y = _EMPTY_LIKE[0](like)
        try:
            hit.kernel(*arrs, _view(y), hit.p)
        except Exception as e:
            annotate(e, hit)
            raise
        return y
    if type(out) is not TENSOR[0] or out.dtype != dt or not out.is_cpu:
        return MISS
    res = _arrays.as_host_array(out, f"{fn}: out", writeable=True)  # refuses an out that requires grad
    check_out(fn, res, dict(zip(names, arrs, strict=True)), arrs[-1])
    run_fast(hit, (*arrs, res))
    _arrays.mark_written(out)
    return out


_BF16: list[Any] = [None]
_STRIDED: list[Any] = [None]
_EMPTY_LIKE: list[Any] = [None]


def _torch_ready() -> None:
    torch = sys.modules["torch"]
    TENSOR[0], _BF16[0], _STRIDED[0], _EMPTY_LIKE[0] = torch.Tensor, torch.bfloat16, torch.strided, torch.empty_like


def _call_masked(spec: OpSpec, direction: str, named: dict, p: dict, out: Any, backend: str | None) -> Any:
    """Masked arrays, as NumPy's ufuncs treat them: computed on the data, the result masked where any
    input is; a parameter gradient sums the unmasked elements only."""
    ma = sys.modules["numpy.ma"]
    data = {n: ma.getdata(a) for n, a in named.items()}
    if direction == "param_grad":
        _host(spec.label(direction), data)  # one dtype and shape before the masks are combined
        mask = _union_mask(ma, named)
        if mask is not ma.nomask:
            data = {n: np.where(mask, 0, a) for n, a in data.items()}
        return call(spec, direction, data, p, None, backend)
    res = call(spec, direction, data, p, None if out is None else ma.getdata(out), backend)
    mask = _union_mask(ma, named)
    if out is None:
        return ma.MaskedArray(res, mask=mask)
    if isinstance(out, ma.MaskedArray):
        out.mask = mask
    return out


def _union_mask(ma: Any, named: dict) -> Any:
    """The union of the inputs' masks (after the call checked that their shapes agree)."""
    mask = ma.nomask
    for a in named.values():
        m = ma.getmask(a)
        if m is not ma.nomask:
            mask = np.logical_or(mask, m) if mask is not ma.nomask else np.array(m, copy=True)
    return mask


def _call_device(spec, direction, kind, named, p, out, backend):
    fn = spec.label(direction)
    _check_device(fn, named, out)
    ins = tuple(named.values())
    like = ins[0]
    spec.check_precision(p, like.dtype, fn)
    dtype = _dtype_name(like)
    mod, kernel = registry.resolve(spec.kernel_key(p), direction, dtype, kind, backend)
    if direction == "param_grad":
        return _run(mod, kernel, spec, direction, dtype, ins, p)
    res = mod.empty_like(like) if out is None else out
    _run(mod, kernel, spec, direction, dtype, ins + (res,), p)
    if out is not None:
        _arrays.mark_written(out)
    return res


def _described(a: Any) -> tuple[str, str, str, str]:
    """(what the caller passed, in words; the array kind dispatch selects for; the dtype it computes
    in; a note on how the input reaches the kernel)."""
    raw = _arrays.kind_of(a)
    dtype = _dtype_name(a) if hasattr(a, "dtype") else np.asarray(a).dtype.name
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


def explain(spec: OpSpec, direction: str, a: Any, backend: str | None = None) -> str:
    """Which backend runs this call, and why the others did not, for any kind of input."""
    if _arrays.kind_of(a) == "dask":  # each chunk is a call of its own: explain the chunks' kind
        inner = explain(spec, direction, a._meta, backend)
        return f"{spec.name} {direction} on a Dask array: dispatched per chunk, lazily; each chunk:\n" + \
            "\n".join(f"  {line}" for line in inner.splitlines())
    what, kind, dtype, note = _described(a)
    try:
        mod, notes = registry.select(spec.kernel_key(spec.defaults()), direction, dtype, kind, backend)
    except Exception as e:
        return f"{spec.name} {direction} on {what}: cannot run: {e}"
    lines = [f"{spec.name} {direction} on {what} -> {mod.NAME}" + (f" ({note})" if note else "")]
    lines += [f"  {n}" for n in notes]
    # fall-through happens only here, at selection; a kernel that fails is never retried elsewhere
    lines.append(f"  an error raised while {mod.NAME} runs reaches the caller; no other backend is tried")
    return "\n".join(lines)
