"""CUDA arrays for the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), which runs kernels on the CPU.

numba's simulated device arrays (`FakeCUDAArray`, what `cuda.to_device` returns
there) do not expose `__cuda_array_interface__`, so multiact's dispatcher would
take them for host objects.  `accept_fake_arrays()` gives them the interface
(in the simulator a "device pointer" is a host pointer), so code tested under
the simulator with numba's own arrays runs on the `cuda` backend and gets
FakeCUDAArrays back.  `SimDeviceArray` is the smallest array with the interface:
the backend allocates results of this kind for other producers under the
simulator, and the tests create inputs with `to_device`.  Never used on a real GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def interface(a: np.ndarray) -> dict[str, Any]:
    """The CUDA array interface of host memory standing in for device memory."""
    return {
        "shape": a.shape,
        "typestr": a.dtype.str,
        "data": (a.__array_interface__["data"][0] if a.size else 0, not a.flags.writeable),
        "strides": None if a.flags.c_contiguous else a.strides,
        "version": 3,
        "stream": None,
    }


def accept_fake_arrays() -> None:
    """Give numba's simulated device arrays the CUDA array interface of the host memory they wrap."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    if "__cuda_array_interface__" not in vars(FakeCUDAArray):
        FakeCUDAArray.__cuda_array_interface__ = property(lambda self: interface(self._ary))


def is_fake_array(a: Any) -> bool:
    """Whether a is numba's own simulated device array (checked without importing numba)."""
    return type(a).__name__ == "FakeCUDAArray" and type(a).__module__.startswith("numba.cuda.simulator")


class SimDeviceArray:
    """Host memory that claims to live on a (simulated) CUDA device."""

    def __init__(self, host: np.ndarray):
        self._a = host

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return interface(self._a)

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

    def view(self, dtype: Any) -> SimDeviceArray:
        """The same memory as another dtype of the same size (quantized codes: uint8 bits as float8)."""
        return SimDeviceArray(self._a.view(dtype))

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


__all__ = ["SimDeviceArray", "accept_fake_arrays", "empty", "host_view", "interface", "is_fake_array", "to_device"]
