"""A stand-in CUDA array for the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), which runs kernels on the CPU.

numba's simulated device arrays (`FakeCUDAArray`) do not expose
`__cuda_array_interface__`, so multiact's dispatcher cannot tell them from host
objects.  `SimDeviceArray` is the smallest array that does: host memory
presented through the CUDA array interface (in the simulator a "device pointer"
is a host pointer).  The `cuda` backend allocates results of this kind for
unknown producers under the simulator, and the tests create inputs with
`to_device`.  Never used on a real GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SimDeviceArray:
    """Host memory that claims to live on a (simulated) CUDA device."""

    def __init__(self, host: np.ndarray):
        self._a = host

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        a = self._a
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.__array_interface__["data"][0] if a.size else 0, not a.flags.writeable),
            "strides": None if a.flags.c_contiguous else a.strides,
            "version": 3,
            "stream": None,
        }

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    strides = property(lambda self: self._a.strides)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    T = property(lambda self: SimDeviceArray(self._a.T))

    def __getitem__(self, idx: Any) -> SimDeviceArray:
        return SimDeviceArray(self._a[idx])

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"SimDeviceArray(shape={self.shape}, dtype={self.dtype})"

    def copy_to_host(self) -> np.ndarray:
        return self._a.copy()

    def reshape(self, *shape: Any) -> SimDeviceArray:
        return SimDeviceArray(self._a.reshape(*shape))

    def readonly(self) -> SimDeviceArray:
        """A read-only view (for tests of the read-only `out` check)."""
        v = self._a.view()
        v.flags.writeable = False
        return SimDeviceArray(v)


def to_device(a: Any) -> SimDeviceArray:
    """A simulated device copy of a host array, keeping its layout (Fortran order stays Fortran)."""
    a = np.asarray(a)
    return SimDeviceArray(a.copy(order="K"))


def empty(shape: Any, dtype: Any) -> SimDeviceArray:
    return SimDeviceArray(np.empty(shape, dtype=dtype))


def host_view(cai: dict[str, Any]) -> np.ndarray:
    """The NumPy array behind a simulated device array's interface (same memory, no copy)."""

    class _View:
        __array_interface__ = {
            "shape": tuple(cai["shape"]),
            "typestr": cai["typestr"],
            "data": (cai["data"][0], bool(cai["data"][1])),
            "strides": cai.get("strides"),
            "version": 3,
        }

    return np.asarray(_View())


__all__ = ["SimDeviceArray", "empty", "host_view", "to_device"]
