"""What kind of array a caller handed us, and how to hand the result back in kind.

Probes are cheap and guarded: a library that is not already imported by the
caller is never imported here (its arrays cannot exist yet).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import dtypes as _dtypes
from . import vocab

FLOAT_DTYPES = tuple(np.dtype(n) for n in vocab.NUMPY_DTYPES)  # NumPy's own float dtypes (bfloat16: ml_dtypes')
DTYPE_TEXT = vocab.DTYPE_TEXT


def _is_torch(a: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _is_dask(a: Any) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(a, da.Array)


def kind_of(a: Any) -> str:
    """"numpy", "torch" (CPU tensor), "cuda", "npu", "dask", or "other"."""
    if isinstance(a, np.ndarray):
        return "numpy"
    if _is_torch(a):
        dev = a.device.type
        return {"cpu": "torch", "cuda": "cuda", "npu": "npu"}.get(dev, f"torch-{dev}")
    if hasattr(a, "__cuda_array_interface__"):
        return "cuda"
    if type(a).__name__ == "FakeCUDAArray":  # numba's simulated device array: it gets the interface once
        from .backend import cuda_sim

        if cuda_sim.is_fake_array(a):
            cuda_sim.accept_fake_arrays()
            return "cuda"
    if _is_dask(a):
        return "dask"
    return "other"


def library_of(a: Any) -> str:
    """A short name for error messages: 'numpy.ndarray', 'torch.Tensor(cuda)', 'cupy.ndarray'..."""
    t = type(a)
    name = f"{t.__module__.split('.')[0]}.{t.__name__}"
    if _is_torch(a):
        name += f"({a.device})"
    return name


def as_host_array(a: Any, argname: str, *, writeable: bool = False) -> np.ndarray:
    """A NumPy view of a host array (NumPy, torch CPU tensor, list, scalar), checked to be float.

    writeable=True marks a destination (out=): it must be a view we can write through.
    """
    if isinstance(a, np.ndarray):
        arr = a if type(a) is np.ndarray else a.view(np.ndarray)  # a subclass (np.matrix...): its base array
    elif _is_torch(a):
        arr = _torch_view(a, argname, writeable)
    elif isinstance(a, (list, tuple, float, int, np.generic)) and not isinstance(a, bool):
        arr = np.asarray(a)
        if arr.dtype.kind in "iu" and arr.size == 0:
            arr = arr.astype(np.float64)
    else:
        raise TypeError(
            f"{argname} must be an array (NumPy, a torch tensor, a CUDA array, a Dask array) "
            f"or a list/float, got {type(a).__name__}"
        )
    if arr.dtype.kind == "f" and not arr.dtype.isnative:
        arr = _native_order(arr, argname, writeable)
    if arr.dtype not in FLOAT_DTYPES and not _dtypes.is_bf16(arr.dtype):
        raise TypeError(f"{argname} must have a {DTYPE_TEXT} dtype, got {arr.dtype}")
    return arr


def _native_order(arr: np.ndarray, argname: str, writeable: bool) -> np.ndarray:
    """A byte-swapped input (FITS files, network buffers) as a native-order copy; results are native.

    A destination cannot be swapped in place without a second pass, so it is refused by name.
    """
    if writeable:
        raise byte_order_error(argname, arr.dtype)
    return arr.astype(arr.dtype.newbyteorder("="))


def byte_order_error(argname: str, dtype: np.dtype) -> ValueError:
    return ValueError(
        f"{argname} has non-native byte order ({dtype.str}); results are written in native order "
        f"({dtype.newbyteorder('=').name}): pass a native-order out"
    )


def _torch_view(a: Any, argname: str, writeable: bool) -> np.ndarray:
    """Zero-copy NumPy view of a CPU tensor; bfloat16 as an `ml_dtypes.bfloat16` view of the same memory
    (the storage seen as int16, then as bfloat16), writable like any other."""
    torch = sys.modules["torch"]
    if writeable and a.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{argname} requires grad: multiact's plain functions write outside autograd; "
            "use multiact.torch for training, or write under torch.no_grad()"
        )
    t = a.detach()
    if t.dtype == torch.bfloat16:
        return bf16_view(t)
    if t.dtype not in _TORCH_OK:
        raise TypeError(f"{argname} must be a float16, bfloat16, float32 or float64 tensor, got {t.dtype}")
    return t.numpy()


def bf16_view(t: Any) -> np.ndarray:
    """A bfloat16 CPU tensor (detached) as a NumPy bfloat16 array over its memory (any strides)."""
    return t.view(sys.modules["torch"].int16).numpy().view(_dtypes.bf16_dtype() or _dtypes._load())


def bf16_tensor(arr: np.ndarray) -> Any:
    """A NumPy bfloat16 array as a torch bfloat16 tensor over the same memory."""
    torch = sys.modules["torch"]
    return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)


class _TorchDtypes:
    """float dtypes of torch that map onto NumPy's, resolved once torch exists."""

    def __contains__(self, dt: Any) -> bool:
        torch = sys.modules["torch"]
        return dt in (torch.float16, torch.float32, torch.float64)


_TORCH_OK = _TorchDtypes()


def mark_written(a: Any) -> None:
    """Tell autograd that a tensor was written in place (its version counter), as torch's own in-place
    ops do: a tensor saved for a backward and then overwritten makes that backward raise, not lie."""
    if _is_torch(a):
        sys.modules["torch"].autograd.graph.increment_version(a)


def wrap_like(result: np.ndarray, like: Any) -> Any:
    """Return the host result in the caller's kind: a tensor (of its dtype) for a tensor, the caller's
    ndarray subclass as NumPy's ufuncs would return it (np.matrix stays a matrix), else NumPy."""
    if isinstance(like, np.ndarray):
        return result if type(like) is np.ndarray else like.__array_wrap__(result, None)
    if _is_torch(like):
        return bf16_tensor(result) if _dtypes.is_bf16(result.dtype) else sys.modules["torch"].from_numpy(result)
    return result
