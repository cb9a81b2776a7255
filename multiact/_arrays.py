"""What kind of array a caller handed us, and how to hand the result back in kind.

Probes are cheap and guarded: a library that is not already imported by the
caller is never imported here (its arrays cannot exist yet).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


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
    """A NumPy view of a host array (NumPy, torch CPU tensor, list, scalar), checked to be float."""
    if isinstance(a, np.ndarray):
        arr = a
    elif _is_torch(a):
        t = a.detach()
        if t.dtype not in _TORCH_OK:
            raise TypeError(f"{argname} must be a float16, float32 or float64 tensor, got {t.dtype}")
        arr = t.numpy()
    elif isinstance(a, (list, tuple, float, int, np.generic)) and not isinstance(a, bool):
        arr = np.asarray(a)
        if arr.dtype.kind in "iu" and arr.size == 0:
            arr = arr.astype(np.float64)
    else:
        raise TypeError(
            f"{argname} must be an array (NumPy, a torch tensor, a CUDA array, a Dask array) "
            f"or a list/float, got {type(a).__name__}"
        )
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{argname} must have a float16, float32 or float64 dtype, got {arr.dtype}")
    return arr


class _TorchDtypes:
    """float dtypes of torch that map onto NumPy's, resolved once torch exists."""

    def __contains__(self, dt: Any) -> bool:
        torch = sys.modules["torch"]
        return dt in (torch.float16, torch.float32, torch.float64)


_TORCH_OK = _TorchDtypes()


def wrap_like(result: np.ndarray, like: Any) -> Any:
    """Return the host result in the caller's kind: a tensor for a tensor, else NumPy."""
    if _is_torch(like):
        return sys.modules["torch"].from_numpy(result)
    return result
