"""The checks every call makes of its arrays, whatever the family, by the cold path and the hot path alike.

Each raises TypeError or ValueError naming the argument and the function the user called (`fn`, such as
"gelu_grad()"), before anything is written.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _arrays, registry, vocab

HOST_KINDS = ("numpy", "torch", "other")  # what runs on the host: NumPy views of it go to the CPU backends
DEVICE_DTYPES = vocab.DTYPE_NAMES  # what device and Dask arrays may hold


def check_backend(fn: str, backend: Any) -> None:
    """backend= is a name or None (whether it exists and runs is the registry's question)."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            f"{fn}: backend must be a backend name (str) or None, got {type(backend).__name__}; "
            f"valid backends: {', '.join(registry.BACKEND_NAMES)}"
        )


def masked(*arrays: Any) -> bool:
    """Whether any argument is a NumPy masked array (without importing numpy.ma)."""
    mod = sys.modules.get("numpy.ma")
    return mod is not None and any(isinstance(a, mod.MaskedArray) for a in arrays)


def kind_name(a: Any) -> str:
    """The array kind a backend runs on: "numpy" for every host array, else "cuda", "npu", "dask"..."""
    k = _arrays.kind_of(a)
    return "numpy" if k in HOST_KINDS else k


def same_kind(fn: str, named: dict[str, Any], join_dask: bool = False) -> str:
    """The one array kind of a call; mixed libraries or devices are a TypeError naming them.  With join_dask,
    host arrays beside a Dask array join it (the call is lazy)."""
    raw = {name: _arrays.kind_of(a) for name, a in named.items() if a is not None}
    libs = {k for k in raw.values() if k != "other"}  # lists and floats go with anything on the host
    if join_dask and "dask" in libs and libs <= {"dask", *HOST_KINDS}:
        return "dask"
    if len(libs) > 1 or (not libs <= set(HOST_KINDS) and "other" in raw.values()):
        desc = ", ".join(f"{n} is {_arrays.library_of(named[n])}" for n in raw)
        raise TypeError(f"{fn}: arrays must come from one library on one device: {desc}")
    k = next(iter(libs), "numpy")
    return "numpy" if k in HOST_KINDS else k


def dtype_text(a: Any) -> str:
    """An array's dtype as a plain name ("float32", "bfloat16"), whatever its library."""
    return str(a.dtype).replace("torch.", "")


_NAMES = {(np.dtype(n).kind, np.dtype(n).itemsize): n for n in vocab.NUMPY_DTYPES}


def dtype_name(dt: np.dtype) -> str:
    """A NumPy dtype's name, without dtype.name's cost (microseconds) for the float dtypes."""
    return (_NAMES.get((dt.kind, dt.itemsize)) or dt.name) if dt.isnative else dt.name


def _given_dtype(a: Any) -> Any:
    dt = a.dtype
    if isinstance(dt, np.dtype):  # (kind, size): byte order aside, and cheap (dtype.name is not)
        return _NAMES.get((dt.kind, dt.itemsize)) or str(dt)
    return dtype_text(a)


def same_given_dtype(fn: str, named: dict[str, Any]) -> None:
    """The caller's arrays have one dtype as given (before any conversion: a list's float64 beside a float32 x
    is refused like a float32 dy beside it); TypeError naming them.  Byte order does not count."""
    given = {n: _given_dtype(a) for n, a in named.items() if a is not None and hasattr(a, "dtype")}
    if len(set(given.values())) > 1:
        (n0, d0), *rest = given.items()
        n1, d1 = next((n, d) for n, d in rest if d != d0)
        raise TypeError(f"{fn}: {n1} has dtype {d1} but {n0} has {d0}; they must match")


def same_as(fn: str, name: str, a: Any, ref_name: str, ref: Any) -> None:
    """a has ref's dtype and shape (any array kind); TypeError / ValueError naming both."""
    if dtype_text(a) != dtype_text(ref):
        raise TypeError(f"{fn}: {name} has dtype {dtype_text(a)} but {ref_name} has {dtype_text(ref)}; "
                        "they must match")
    if tuple(a.shape) != tuple(ref.shape):
        raise ValueError(f"{fn}: {name} has shape {tuple(a.shape)} but {ref_name} has {tuple(ref.shape)}; "
                         "they must match")


def host_arrays(fn: str, named: dict[str, Any], optional: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """NumPy views of the host arrays, one dtype as given; an optional one not given (None) is left out, any
    other None refused by name."""
    same_given_dtype(fn, named)
    return {n: _arrays.as_host_array(a, f"{fn}: {n}") for n, a in named.items() if a is not None or n not in optional}


def device_arrays(fn: str, named: dict[str, Any]) -> None:
    """Device arrays are arrays of a float dtype (what a backend can take as they are)."""
    for n, a in named.items():
        if a is None or not hasattr(a, "dtype") or not hasattr(a, "shape"):
            raise TypeError(f"{fn}: {n} must be an array like the others, got {type(a).__name__}")
        if dtype_text(a) not in DEVICE_DTYPES:
            raise TypeError(f"{fn}: {n} must have a {_arrays.DTYPE_TEXT} dtype, got {dtype_text(a)}")


def destination(fn: str, out: Any) -> np.ndarray:
    """A host destination (out=) as a writeable NumPy view; TypeError for anything that is not an array."""
    if not (isinstance(out, np.ndarray) or _arrays.kind_of(out) == "torch"):
        raise TypeError(f"{fn}: out must be an array to write into, got {type(out).__name__}")
    return _arrays.as_host_array(out, f"{fn}: out", writeable=True)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.strides == b.strides
        and a.shape == b.shape
    )


def check_out(fn: str, out: np.ndarray, inputs: dict[str, np.ndarray], like: Any) -> None:
    """The one check of a NumPy destination, made by the cached hot path and the checked path alike:
    dtype and shape (like's), writeable, and no partial overlap with any input (the same view is in place)."""
    if out.dtype != like.dtype:
        if out.dtype.newbyteorder("=") == like.dtype:
            raise _arrays.byte_order_error(f"{fn}: out", out.dtype)
        raise TypeError(f"{fn}: out has dtype {out.dtype}, expected {like.dtype}")
    if out.shape != tuple(like.shape):
        raise ValueError(f"{fn}: out has shape {out.shape}, expected {tuple(like.shape)}")
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


def separate(fn: str, dests: list[tuple[str, Any]]) -> None:
    """Two destinations of one call never share memory (each gets its own result)."""
    for i, (n1, a) in enumerate(dests):
        for n2, b in dests[i + 1:]:
            if a is not None and b is not None and np.shares_memory(a, b):
                raise ValueError(f"{fn}: {n1} and {n2} overlap; they must be separate arrays")


def channel_axis(fn: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], axis: int,
                 wname: str = "weight") -> int | None:
    """The channel axis of an array parameter, normalised; None for a single value.  ValueError naming what is
    off."""
    size = int(np.prod(w_shape))
    if size == 1:
        return None
    ndim = len(x_shape)
    if ndim == 0 or not -ndim <= axis < ndim:
        raise ValueError(f"{fn}: axis {axis} is out of range for x with {ndim} dims")
    axis %= ndim
    if len(w_shape) != 1 or size != x_shape[axis]:
        raise ValueError(
            f"{fn}: {wname} has shape {tuple(w_shape)}; expected 1 element, ({x_shape[axis]},) "
            f"to match x.shape[{axis}], or (NumPy arrays) a shape that broadcasts to x's {tuple(x_shape)}"
        )
    return axis
