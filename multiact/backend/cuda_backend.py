"""The `cuda` backend: numba-cuda kernels on any array with `__cuda_array_interface__`.

CuPy arrays, PyTorch CUDA tensors and Numba device arrays are used where they
are: results are allocated by the caller's library (`empty_like`), kernels are
launched on the stream the caller works on (torch's current stream; the
interface's v3 `stream` otherwise), and nothing is copied to the host.

Kernels: one grid-stride loop per (formula, number of inputs, layout, compute
type), compiled once and cached; the scalar formulas are the ones the `numba`
backend compiles too (`formulas.py`, plain Python), here compiled with
`cuda.jit(device=True, inline="always")` against libdevice's math (`math.exp`...)
and inlined into each kernel, so `builds()` can hand every kernel to numba-cuda's
driverless compiler (scripts/cuda_ptx_report.py, CI); under the simulator they run
as plain Python on NumPy scalars.  float16 and float32 data
are computed in float32 (a few ops in float64, see `formulas.WIDE`) and rounded
once on store.  bfloat16 (the elementwise ops, forward, backward and y-forms) is
staged through float32 on the device: one kernel widens each input's uint16 bits
(<< 16) into a float32 buffer, the float32 kernel runs on the buffers, and one
kernel stores with round-to-nearest-even in integer arithmetic, NaN kept quiet
(`multiact.dtypes`' rule, the same bits as every backend).  numba-cuda 0.30 has
`__nv_bfloat16` loads and stores (`numba.cuda.bf16`) on real GPUs of compute
capability 8.0 and up, but its simulator has none (`numba.cuda.bf16.bfloat16` is
None there), so the staging is what runs, and is tested, everywhere.  The gated,
bias_act, prelu and parameter-gradient kernels do not claim bfloat16.  Contiguous operands run a
1-D loop; any other layout (strided, transposed, negative strides, broadcast
prelu weight) runs a loop over up to four coalesced dimensions that indexes a
flat base array with element strides, so no operand is ever copied.

The gated family (gated:<act>, `ma.swiglu` and kin) has one kernel per key, direction and layout: the
family's scalar function of `formulas.build_family` (the activation's own two formulas) over two inputs
and one output (forward) or three inputs and two outputs (backward), on strided views as they come.

The bias_act family (bias_act:<act>, `ma.bias_act` / `ma.bias_act_grad`, the y= form too) has two kernels
per key, direction and compute type over a 5-D strided view (outer dims, channel, inner dims): "strided", one
block per (channel, chunk), for channels with elements inside them (NCHW's dim=1), and "rows", a block's
threads on consecutive channels walking rows, for channels along the fastest axis (dim=-1: the transformer's
(T, hidden), NHWC), so a warp's loads are consecutive elements either way; db and dscale are reduced in two
stages in float64 (per-chunk partials, then per channel in a fixed order), so the result is the same from run
to run.

quant= (`quantized`, the call core's hook for device arrays): the forwards of the elementwise ops (not prelu) and of
the gated family quantized in one pass on the device, bit for bit multiact.quant's contract on the float32 result:
a warp per group or MX block, a block per row, or a tensor amax kernel and an apply pass (the section "quantized
outputs" below); codes and scales come back as device arrays of the caller's library.

Parameter gradients are reduced on the device in float64: swish's beta
gradient is returned as a 0-d device array of x's dtype and kind (no host
synchronisation; `float(g)` fetches it); prelu's weight gradient as a device
array of the weight's shape and dtype, of x's kind.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from functools import cache, lru_cache
from typing import Any, NamedTuple

import numpy as np

from multiact import vocab
from multiact._layout import coalesce
from multiact.optable import BIAS_ACT_KEYS as _BIAS_ACT_KEYS
from multiact.optable import DIRECTIONS as _DIRECTIONS
from multiact.optable import FAMILY_KEYS as _FAMILY_KEYS
from multiact.optable import KEYS as _KEYS

from . import formulas as _F

NAME = "cuda"
PRIORITY = 50
KINDS = ("cuda",)

_DTYPES = tuple(d for d in vocab.DTYPE_NAMES if d != "bfloat16")  # kernels of their own; bfloat16 is staged
_SIM_GRID, _SIM_BLOCK = 2, 32
_BLOCK = 256
_lock = threading.Lock()


# ---- detection ------------------------------------------------------------------------------------------


def _simulating() -> bool:
    if "numba" in sys.modules:
        from numba import config

        return bool(config.ENABLE_CUDASIM)
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _numba_cuda_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("numba-cuda")
    except Exception:
        return None


@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, device) on a real GPU or under the simulator; else why not, in words a user can act on.

    Detection asks the driver (libcuda, through ctypes) and looks for numba-cuda without importing it,
    so listing backends stays cheap.
    """
    if _simulating():
        from .cuda_sim import accept_fake_arrays

        accept_fake_arrays()  # numba's own simulated arrays (cuda.to_device) are CUDA arrays from here on
        return True, "CUDA simulator (CPU emulation, for tests): NUMBA_ENABLE_CUDASIM=1"
    import importlib.util

    if importlib.util.find_spec("numba") is None:
        return False, "numba-cuda is not installed; pip install 'multiact[cuda]'"
    devices, why = _driver_devices()
    if not devices:
        return False, why
    d = devices[0]
    note = "" if _numba_cuda_version() else "; numba-cuda is not installed: numba's deprecated built-in CUDA target"
    return True, f"{d['name']} (compute capability {d['cc']}, {d['sms']} SMs){note}"


@lru_cache(maxsize=1)
def _driver_devices() -> tuple[list[dict[str, Any]], str]:
    """([{name, cc, sms}] per visible device, reason if none), from the CUDA driver API."""
    import ctypes
    import ctypes.util

    lib = None
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return [], "no NVIDIA driver: libcuda could not be loaded (no GPU driver installed on this machine)"
    rc = lib.cuInit(0)
    if rc == 100:  # CUDA_ERROR_NO_DEVICE
        return [], "no CUDA device is visible (no NVIDIA GPU, or CUDA_VISIBLE_DEVICES hides it)"
    if rc != 0:
        return [], f"the CUDA driver failed to initialise (CUresult {rc}; driver too old, or GPU in a bad state)"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return [], "no CUDA device is visible (no NVIDIA GPU, or CUDA_VISIBLE_DEVICES hides it)"
    out = []
    for i in range(count.value):
        dev, buf = ctypes.c_int(0), ctypes.create_string_buffer(256)
        lib.cuDeviceGet(ctypes.byref(dev), i)
        lib.cuDeviceGetName(buf, 256, dev)
        vals = []
        for attr in (16, 75, 76):  # multiprocessor count, compute capability major, minor
            v = ctypes.c_int(0)
            lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
            vals.append(v.value)
        out.append({"name": buf.value.decode(errors="replace"), "cc": f"{vals[1]}.{vals[2]}", "sms": vals[0]})
    return out, ""


def info() -> dict[str, Any]:
    """Devices (name, compute capability, SM count), numba-cuda version, whether simulated."""
    ok, reason = available()
    if not ok:
        return {"available": False, "reason": reason}
    sim = _simulating()
    facts = [{"name": "CUDA simulator", "cc": "5.2", "sms": _SIM_GRID}] if sim else _driver_devices()[0]
    return {
        "devices": [f"{f['name']} (compute capability {f['cc']}, {f['sms']} SMs)" for f in facts],
        "compute_capability": facts[0]["cc"],
        "multiprocessors": facts[0]["sms"],
        "numba_cuda": _numba_cuda_version() or "not installed",
        "simulator": sim,
    }


def supports(key: str, direction: str, dtype: str) -> bool:
    if direction == "backward2":  # g * dy * f''(x): the formulas' backward2 (every dtype; bfloat16 staged)
        return (dtype in _DTYPES or dtype == "bfloat16") and (key, direction) in _F.TABLE
    if dtype == "bfloat16":  # staged through float32 (module docstring): the elementwise kernels
        return key in _KEYS and not _KEYS[key].defn.array_param and \
            direction in ("forward", "backward", "backward_y") and _KEYS[key].has(direction) and \
            (key, direction) in _F.TABLE
    if dtype not in _DTYPES:
        return False
    if key in _FAMILY_KEYS:
        return direction in _FAMILY_IO and _F.family_formulas(key) is not None
    if key in _BIAS_ACT_KEYS:
        return _bias_supports(key, direction)
    return key in _KEYS and _KEYS[key].has(direction) and (key, direction) in _F.TABLE  # an op added at run time:
    # only where it brought its formulas


# ---- arrays of the caller's kind ---------------------------------------------------------------------------


def _library(a: Any) -> str:
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    if isinstance(a, _sim_array_type()):
        return "sim"
    return "numba"


@lru_cache(maxsize=1)
def _sim_array_type() -> type:
    from .cuda_sim import SimDeviceArray

    return SimDeviceArray


def _empty(like: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised device array of the caller's kind and device."""
    lib = _library(like)
    dtype = np.dtype(dtype)
    if lib == "torch":
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, dtype.name), device=like.device)
    if lib == "cupy":
        cp = sys.modules["cupy"]
        with like.device:
            return cp.empty(shape, dtype=dtype)
    from .cuda_sim import empty, is_fake_array

    if _simulating() and not is_fake_array(like):
        return empty(shape, dtype)
    from numba import cuda

    return cuda.device_array(shape, dtype=dtype)  # under the simulator: numba's FakeCUDAArray, like the input


def empty_like(x: Any) -> Any:
    """A result array for x: same shape, dtype, device and library (CuPy, torch, Numba)."""
    lib = _library(x)
    if lib == "torch":
        return sys.modules["torch"].empty_like(x)
    if lib == "cupy":
        return sys.modules["cupy"].empty_like(x)
    if lib == "sim" or _simulating():
        return _empty(x, tuple(x.shape), np.dtype(str(x.dtype)))
    from numba import cuda

    if hasattr(x, "copy_to_host") and hasattr(x, "gpu_data"):
        return cuda.device_array_like(x)
    return cuda.device_array(tuple(x.shape), dtype=np.dtype(str(x.dtype)))


class _Desc:
    """One operand as the interface describes it: pointer, shape, element strides, dtype, stream."""

    __slots__ = ("obj", "ptr", "shape", "strides", "dtype", "readonly", "stream", "cai")

    def __init__(self, obj: Any, cai: dict[str, Any] | None = None):
        if cai is None:
            cai = _cai(obj)
        self.obj, self.cai = obj, cai
        self.dtype = np.dtype(cai["typestr"])
        self.ptr, self.readonly = int(cai["data"][0]), bool(cai["data"][1])
        self.shape = tuple(int(s) for s in cai["shape"])
        item = self.dtype.itemsize
        st = cai.get("strides")
        if st is None:
            st, acc = [], 1
            for n in reversed(self.shape):
                st.append(acc)
                acc *= n
            self.strides = tuple(reversed(st))
        else:
            if any(s % item for s in st):
                raise ValueError("multiact cuda: strides that are not a multiple of the item size are not supported")
            self.strides = tuple(int(s) // item for s in st)
        self.stream = cai.get("stream")


def _cai(obj: Any) -> dict[str, Any]:
    if _library(obj) == "torch":
        obj = obj.detach()  # a tensor that requires grad refuses to export its interface
    return obj.__cuda_array_interface__


def _extent(ptr: int, shape, strides, item: int) -> tuple[int, int]:
    """[lo, hi) byte range an operand touches."""
    lo = hi = 0
    for n, s in zip(shape, strides, strict=True):
        if n == 0:
            return ptr, ptr
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return ptr + lo * item, ptr + (hi + 1) * item


def _check_out(op: str, out: _Desc, ins: dict[str, _Desc]) -> None:
    """The dispatcher's NumPy checks, for device pointers: read-only out, partial overlap with an input."""
    if out.readonly:
        raise ValueError(f"{op}(): out is read-only")
    if not math.prod(out.shape):
        return
    olo, ohi = _extent(out.ptr, out.shape, out.strides, out.dtype.itemsize)
    for name, d in ins.items():
        if d.ptr == out.ptr and d.shape == out.shape and d.strides == out.strides:
            continue  # the very same view: in place
        lo, hi = _extent(d.ptr, d.shape, d.strides, d.dtype.itemsize)
        if lo < ohi and olo < hi and _shares_memory(out, d):
            raise ValueError(
                f"{op}(): out overlaps {name} without being the same view; pass out={name} for in place, "
                "or a separate array"
            )


def _shares_memory(a: _Desc, b: _Desc) -> bool:
    """NumPy's exact overlap test on address-only stand-ins (the memory is never touched)."""

    def fake(d: _Desc) -> np.ndarray:
        class _Addr:
            __array_interface__ = {
                "shape": d.shape, "typestr": d.dtype.str, "version": 3, "data": (d.ptr, True),
                "strides": tuple(s * d.dtype.itemsize for s in d.strides),
            }

        return np.asarray(_Addr())

    try:
        return bool(np.shares_memory(fake(a), fake(b), max_work=10_000))
    except np.exceptions.TooHardError:
        return True


# ---- streams and devices --------------------------------------------------------------------------------------

_ext_streams: dict[int, Any] = {}


def _stream_for(descs: list[_Desc]) -> Any:
    """The stream to launch on: torch's current stream, else the interface's v3 `stream` of the first operand.

    Operands that report a different stream are synchronised first (the interface's rule for consumers).
    """
    if _simulating():
        return 0
    from numba import cuda

    first = descs[0]
    if _library(first.obj) == "torch":
        torch = sys.modules["torch"]
        handle = torch.cuda.current_stream(first.obj.device).cuda_stream
    else:
        handle = first.stream
    for d in descs[1:]:
        if d.stream not in (None, handle) and _library(d.obj) != "torch":
            _stream_object(d.stream, cuda).synchronize()
    return _stream_object(handle, cuda)


def _stream_object(handle: Any, cuda: Any) -> Any:
    if handle is None or handle == 0:
        return cuda.default_stream()
    if handle == 1:
        return cuda.legacy_default_stream()
    if handle == 2:
        return cuda.per_thread_default_stream()
    s = _ext_streams.get(handle)
    if s is None:
        s = _ext_streams[handle] = cuda.external_stream(handle)
    return s


def _device_index(obj: Any) -> int | None:
    lib = _library(obj)
    if lib == "torch":
        return obj.device.index
    if lib == "cupy":
        return obj.device.id
    return None


@lru_cache(maxsize=1)
def _multi_gpu() -> bool:
    from numba import cuda

    return len(cuda.gpus) > 1


class _OnDevice:
    """Make the operand's device current for the launch (multi-GPU machines)."""

    def __init__(self, obj: Any):
        self.idx = None if _simulating() or not _multi_gpu() else _device_index(obj)
        self.ctx = None

    def __enter__(self):
        if self.idx is not None:
            from numba import cuda

            if cuda.get_current_device().id != self.idx:
                self.ctx = cuda.gpus[self.idx]
                self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


# ---- flat device views ---------------------------------------------------------------------------------------


def _flat(d: _Desc, ptr: int, length: int) -> Any:
    """A 1-D contiguous numba array of `length` elements at ptr, viewing d's memory."""
    cai = {"shape": (length,), "typestr": d.dtype.str, "data": (ptr, False), "strides": None,
           "version": 3, "stream": None}
    if _simulating():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        from .cuda_sim import host_view

        return FakeCUDAArray(host_view(cai))
    from numba import cuda

    return cuda.from_cuda_array_interface(cai, owner=d.obj, sync=False)


def _coalesce(
    shape: tuple[int, ...], strides: list[tuple[int, ...]], lead: int = -1
) -> tuple[list[int], list[list[int]]]:
    """Drop unit dims, order by operand `lead`'s strides (out's), merge dims contiguous in every operand."""
    shp, sts = coalesce(shape, strides, lead)
    if not shp:
        shp, sts = [1], [[1] for _ in sts]
    return shp, sts


class _Plan:
    """Where each operand's elements are: a contiguous 1-D run, or base arrays + offsets + element strides."""

    def __init__(self, descs: list[_Desc], shape: tuple[int, ...], strides: list[tuple[int, ...]], lead: int = -1):
        self.n = math.prod(shape)
        shp, sts = _coalesce(shape, strides, lead)
        self.contiguous = len(shp) == 1 and all(st[0] == 1 for st in sts)
        if self.contiguous:
            self.arrays = [_flat(d, d.ptr, self.n) for d in descs]
            return
        self.bases, self.offsets = [], []
        for d, st in zip(descs, sts, strict=True):
            lo = sum((n - 1) * s for n, s in zip(shp, st, strict=True) if s < 0)
            hi = sum((n - 1) * s for n, s in zip(shp, st, strict=True) if s > 0)
            self.bases.append(_flat(d, d.ptr + lo * d.dtype.itemsize, hi - lo + 1))
            self.offsets.append(-lo)
        lead = len(shp) - 4
        self.outer = shp[:lead] if lead > 0 else []
        inner = shp[lead:] if lead > 0 else [1] * (4 - len(shp)) + shp
        self.shape4 = tuple(inner)
        self.outer_strides = [st[:lead] if lead > 0 else [] for st in sts]
        self.strides4 = [tuple(st[lead:] if lead > 0 else [0] * (4 - len(st)) + st) for st in sts]

    def launches(self):
        """(offsets per operand) for each launch: one, or one per index of the dims beyond four."""
        if not self.outer:
            yield self.offsets
            return
        for idx in np.ndindex(*self.outer):
            pairs = zip(self.offsets, self.outer_strides, strict=True)
            yield [o + sum(i * s for i, s in zip(idx, os_, strict=True)) for o, os_ in pairs]


# ---- kernels ---------------------------------------------------------------------------------------------------


def _grid(n: int) -> tuple[int, int]:
    if _simulating():
        return max(1, min(_SIM_GRID, -(-n // _SIM_BLOCK))), _SIM_BLOCK
    return max(1, min(-(-n // _BLOCK), _sms() * 32)), _BLOCK


@cache
def _sms() -> int:
    from numba import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


@cache
def _formulas(compute: str):
    """The shared formulas as device functions: libdevice math on a GPU, NumPy scalars in the simulator.

    `inline="always"` inlines them into each kernel at numba's IR level, so a kernel compiles as one
    unit: no device-function dispatcher asks the driver for the current device, and the very same
    kernel compiles with `cuda.compile_ptx` on a machine without a GPU (scripts/cuda_ptx_report.py).
    """
    from numba import cuda

    t = np.float64 if compute == "float64" else np.float32
    jit = cuda.jit(device=True, inline="always")
    fns = _F.numpy_libm() if _simulating() else _F.math_libm(cuda)
    return _F.build(jit, t, _F.libm(jit, t, fns))


def _kernel_source(nin: int, contiguous: bool) -> str:
    ins = [f"u{k}" for k in range(nin)]
    if contiguous:
        args = ", ".join(ins + ["out"])
        vals = ", ".join(f"T(u{k}[i])" for k in range(nin))
        return (
            f"def kern({args}, a, b):\n"
            f"    start = cuda.grid(1)\n"
            f"    step = cuda.gridsize(1)\n"
            f"    for i in range(start, out.shape[0], step):\n"
            f"        out[i] = f({vals}, a, b)\n"
        )
    args = ", ".join(f"u{k}, o{k}, s{k}" for k in range(nin))
    at = "{o} + i0 * {s}[0] + i1 * {s}[1] + i2 * {s}[2] + i3 * {s}[3]"
    vals = ", ".join(f"T(u{k}[" + at.format(o=f"o{k}", s=f"s{k}") + "])" for k in range(nin))
    return (
        f"def kern({args}, out, oo, so, shp, a, b):\n"
        f"    n1 = shp[1]\n"
        f"    n2 = shp[2]\n"
        f"    n3 = shp[3]\n"
        f"    n = shp[0] * n1 * n2 * n3\n"
        f"    start = cuda.grid(1)\n"
        f"    step = cuda.gridsize(1)\n"
        f"    for i in range(start, n, step):\n"
        f"        i3 = i % n3\n"
        f"        t = i // n3\n"
        f"        i2 = t % n2\n"
        f"        t = t // n2\n"
        f"        i1 = t % n1\n"
        f"        i0 = t // n1\n"
        f"        out[{at.format(o='oo', s='so')}] = f({vals}, a, b)\n"
    )


@cache
def _elementwise_py(formula: str, compute: str, nin: int, contiguous: bool) -> Callable:
    """The grid-stride kernel of one formula as a Python function: what `cuda.jit` and `compile_ptx` compile."""
    from numba import cuda

    g = {"cuda": cuda, "f": getattr(_formulas(compute), formula), "T": np.float64 if compute == "float64" else
         np.float32}
    exec(compile(_kernel_source(nin, contiguous), f"<multiact cuda {formula}>", "exec"), g)
    return g["kern"]


@cache
def _elementwise(formula: str, compute: str, nin: int, contiguous: bool) -> Any:
    """The compiled grid-stride kernel of one formula (numba specialises it per array dtype)."""
    from numba import cuda

    return cuda.jit(_elementwise_py(formula, compute, nin, contiguous))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Under the simulator kernels run on NumPy scalars, which warn on overflow; a GPU never does.

    A warnings filter, not np.errstate: errstate is per thread and the simulator runs each GPU thread in its own.
    """
    if not _simulating():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _run(formula: str, compute: str, descs: list[_Desc], a: float, b: float) -> None:
    """Launch `formula` over inputs descs[:-1] into descs[-1] (any layouts, same shape)."""
    out = descs[-1]
    n = math.prod(out.shape)
    if n == 0:
        return
    nin = len(descs) - 1
    with _OnDevice(out.obj), _quiet():
        stream = _stream_for(descs)
        plan = _Plan(descs, out.shape, [d.strides for d in descs])
        grid, block = _grid(n)
        if plan.contiguous:
            _elementwise(formula, compute, nin, True)[grid, block, stream](*plan.arrays, a, b)
            return
        k = _elementwise(formula, compute, nin, False)
        for offs in plan.launches():
            args = []
            for i in range(nin):
                args += [plan.bases[i], offs[i], plan.strides4[i]]
            args += [plan.bases[-1], offs[-1], plan.strides4[-1], plan.shape4, a, b]
            k[_grid(math.prod(plan.shape4))[0], block, stream](*args)


# ---- the kernels the registry hands out ----------------------------------------------------------------------


def _compute(op: str, direction: str, dtype: str) -> str:
    return "float64" if dtype == "float64" or (op, direction) in _F.WIDE else "float32"


def kernel(key: str, direction: str, dtype: str) -> Callable:
    """The kernel for (kernel key, direction, dtype), following the registry's calling conventions."""
    if not supports(key, direction, dtype):
        raise ValueError(f"cuda backend has no kernel for {key} {direction} {dtype}")
    if direction == "param_grad":  # an array parameter's gradient per channel, a scalar one's a sum
        return _channel_param_grad(key) if _KEYS[key].defn.array_param else _scalar_param_grad(key)
    if key in _FAMILY_KEYS:
        return _family_kernel(key, direction, dtype)
    if key in _BIAS_ACT_KEYS:
        return _bias_kernel(key, direction, dtype)
    compute = _compute(key, direction, dtype)
    if _KEYS[key].defn.array_param and direction != "backward2":  # (prelu's f'' takes no weight: elementwise)
        return _channel_forward(key) if direction == "forward" else _channel_backward(key)
    names = vocab.DIRECTIONS[direction].arrays

    def run(*args: Any) -> None:
        *arrays, out, p = args
        descs = [_Desc(a) for a in arrays]
        od = _Desc(out)
        _check_out(key, od, dict(zip(names, descs, strict=True)))
        a, b = _F.scalar_params(key, p, dtype)
        _run(_F.formula_name(key, direction, p), compute, descs + [od], a, b)

    if dtype == "bfloat16":
        run = _bf16_staged(key, direction, names)
    run.__name__ = f"cuda_{key}_{direction}_{dtype}"
    return run


# ---- bfloat16: float32 staging on the device ------------------------------------------------------------------

_WIDEN = "        dst[{d}] = uint32(src[{s}]) << uint32(16)\n"
_NARROW = (
    "        v = src[{s}]\n"
    "        if (v & uint32(0x7FFFFFFF)) > uint32(0x7F800000):\n"
    "            r = (v >> uint32(16)) | uint32(0x40)\n"
    "        else:\n"
    "            r = (v + uint32(0x7FFF) + ((v >> uint32(16)) & uint32(1))) >> uint32(16)\n"
    "        dst[{d}] = uint16(r)\n"
)


def _bits_source(body: str, contiguous: bool) -> str:
    """A grid-stride kernel src -> dst over bit patterns (the loops of `_kernel_source`)."""
    if contiguous:
        return ("def kern(src, dst):\n    start = cuda.grid(1)\n    step = cuda.gridsize(1)\n"
                "    for i in range(start, dst.shape[0], step):\n" + body.format(s="i", d="i"))
    at = "{o} + i0 * {s}[0] + i1 * {s}[1] + i2 * {s}[2] + i3 * {s}[3]"
    return (
        "def kern(src, os, ss, dst, od, sd, shp):\n"
        "    n1 = shp[1]\n    n2 = shp[2]\n    n3 = shp[3]\n    n = shp[0] * n1 * n2 * n3\n"
        "    start = cuda.grid(1)\n    step = cuda.gridsize(1)\n"
        "    for i in range(start, n, step):\n"
        "        i3 = i % n3\n        t = i // n3\n        i2 = t % n2\n        t = t // n2\n"
        "        i1 = t % n1\n        i0 = t // n1\n"
        + body.format(s=at.format(o="os", s="ss"), d=at.format(o="od", s="sd"))
    )


@cache
def _bits_kernel(which: str, contiguous: bool) -> Any:
    from numba import cuda, uint16, uint32

    g = {"cuda": cuda, "uint16": uint16, "uint32": uint32}
    src = _bits_source(_WIDEN if which == "widen" else _NARROW, contiguous)
    exec(compile(src, f"<multiact cuda bf16 {which}>", "exec"), g)
    return cuda.jit(g["kern"])


def _as_bits(d: _Desc, typestr: str) -> _Desc:
    """The same memory described as unsigned integers of the same size (bfloat16 as <u2, float32 as <u4)."""
    return _Desc(d.obj, {**d.cai, "typestr": typestr})


def _run_bits(which: str, src: _Desc, dst: _Desc) -> None:
    n = math.prod(dst.shape)
    if n == 0:
        return
    with _OnDevice(dst.obj), _quiet():
        stream = _stream_for([src, dst])
        plan = _Plan([src, dst], dst.shape, [src.strides, dst.strides])
        grid, block = _grid(n)
        if plan.contiguous:
            _bits_kernel(which, True)[grid, block, stream](*plan.arrays)
            return
        k = _bits_kernel(which, False)
        for offs in plan.launches():
            k[_grid(math.prod(plan.shape4))[0], block, stream](
                plan.bases[0], offs[0], plan.strides4[0], plan.bases[1], offs[1], plan.strides4[1], plan.shape4)


def _bf16_staged(key: str, direction: str, names: tuple[str, ...]) -> Callable:
    """The bfloat16 kernel: inputs widened into float32 device buffers, the float32 kernel, the result stored
    rounded once into out's bits (out may be an input: every input is widened before out is written)."""
    formula_compute = _compute(key, direction, "float32")
    if formula_compute != "float32":  # a float64 formula would round twice on the way to bfloat16
        raise NotImplementedError(f"cuda: {key} {direction} computes in {formula_compute}, not staged for bfloat16")

    def run(*args: Any) -> None:
        *arrays, out, p = args
        descs = [_Desc(a) for a in arrays]
        od = _Desc(out)
        _check_out(key, od, dict(zip(names, descs, strict=True)))
        if not math.prod(od.shape):
            return
        bufs = [_Desc(_empty(out, od.shape, np.float32)) for _ in range(len(descs) + 1)]
        for d, b in zip(descs, bufs, strict=False):
            _run_bits("widen", _as_bits(d, "<u2"), _as_bits(b, "<u4"))
        a, b = _F.scalar_params(key, p, "bfloat16")
        _run(_F.formula_name(key, direction, p), "float32", bufs, a, b)
        _run_bits("narrow", _as_bits(bufs[-1], "<u4"), _as_bits(od, "<u2"))

    return run


# ---- composite families (gated:<act>): two inputs, one output forward, two backward ------------------------------
# The family's scalar function (formulas.build_family: the activation's own forward and backward formulas) in a
# grid-stride loop of one thread per element: a flat loop when every operand is contiguous, else the 4-D
# strided loop of `_run` over base arrays (halves and interleaved views are strided views of x).  float16
# data is computed in float32 (float64 where formulas.WIDE says so for either of the activation's formulas
# the kernel uses) and rounded once on store; every input of an element is read before its results are stored.

_FAMILY_IO = {"forward": (2, 1), "backward": (3, 2)}  # (inputs, outputs) per direction
_FAMILY_NAMES = {"forward": ("gate", "up"), "backward": ("dy", "gate", "up")}


def _family_compute(key: str, direction: str, dtype: str) -> str:
    act = _FAMILY_KEYS[key][2]
    uses = ("forward",) if direction == "forward" else ("forward", "backward")
    wide = any((act, d) in _F.WIDE for d in uses)
    return "float64" if dtype == "float64" or wide else "float32"


@cache
def _family_formulas(key: str, compute: str):
    from numba import cuda

    t = np.float64 if compute == "float64" else np.float32
    return _F.build_family(cuda.jit(device=True, inline="always"), t, _formulas(compute), key)


@_F.on_change
def _forget_families(key: str) -> None:
    """A key's formulas changed (an op added or removed at run time): its families' device functions go too."""
    _family_formulas.cache_clear()


def _family_source(nin: int, nout: int, contiguous: bool) -> str:
    ins, outs = [f"u{k}" for k in range(nin)], [f"w{k}" for k in range(nout)]
    if contiguous:
        at = {name: f"{name}[i]" for name in ins + outs}
        args = ", ".join(ins + outs)
        head = [f"def kern({args}, a, b, lim, sh):", "    start = cuda.grid(1)", "    step = cuda.gridsize(1)",
                f"    for i in range(start, {outs[0]}.shape[0], step):"]
    else:
        idx = "{o} + i0 * {s}[0] + i1 * {s}[1] + i2 * {s}[2] + i3 * {s}[3]"
        at = {name: f"{name}[" + idx.format(o=f"o_{name}", s=f"s_{name}") + "]" for name in ins + outs}
        args = ", ".join(f"{n}, o_{n}, s_{n}" for n in ins + outs)
        head = [f"def kern({args}, shp, a, b, lim, sh):", "    n1 = shp[1]", "    n2 = shp[2]", "    n3 = shp[3]",
                "    n = shp[0] * n1 * n2 * n3", "    start = cuda.grid(1)", "    step = cuda.gridsize(1)",
                "    for i in range(start, n, step):", "        i3 = i % n3", "        t = i // n3",
                "        i2 = t % n2", "        t = t // n2", "        i1 = t % n1", "        i0 = t // n1"]
    vals = ", ".join(f"T({at[n]})" for n in ins)
    if nout == 1:
        body = [f"        {at[outs[0]]} = f({vals}, a, b, lim, sh)"]
    else:
        res = ", ".join(f"r{k}" for k in range(nout))
        body = [f"        {res} = f({vals}, a, b, lim, sh)"] + [f"        {at[o]} = r{k}" for k, o in enumerate(outs)]
    return "\n".join(head + body) + "\n"


@cache
def _family_py(key: str, direction: str, compute: str, contiguous: bool) -> Callable:
    """The grid-stride kernel of one composite key and direction, as a Python function (what cuda.jit and
    compile_ptx compile)."""
    from numba import cuda

    g = {"cuda": cuda, "f": getattr(_family_formulas(key, compute), direction),
         "T": np.float64 if compute == "float64" else np.float32}
    exec(compile(_family_source(*_FAMILY_IO[direction], contiguous), f"<multiact cuda {key} {direction}>", "exec"), g)
    return g["kern"]


@cache
def _family_jit(key: str, direction: str, compute: str, contiguous: bool) -> Any:
    from numba import cuda

    return cuda.jit(_family_py(key, direction, compute, contiguous))


def _family_arg_types(dtype: str, contiguous: bool, nops: int) -> tuple:
    from numba import types

    arr, i64, f64 = types.Array(getattr(types, dtype), 1, "C"), types.int64, types.float64
    if contiguous:
        return (arr,) * nops + (f64,) * 4
    t4 = types.UniTuple(i64, 4)
    return (arr, i64, t4) * nops + (t4,) + (f64,) * 4


def _family_builds() -> list[tuple[str, str, str]]:
    """(key, direction, dtype) of every composite kernel, backward first (what a representative pick takes)."""
    return [(key, direction, dtype) for key in _FAMILY_KEYS for direction in ("backward", "forward")
            for dtype in _DTYPES if supports(key, direction, dtype)]


def _family_kernel(key: str, direction: str, dtype: str) -> Callable:
    nin, nout = _FAMILY_IO[direction]
    compute = _family_compute(key, direction, dtype)
    names = _FAMILY_NAMES[direction]

    def run(*args: Any) -> None:
        *arrays, p = args
        descs = [_Desc(a) for a in arrays]
        ins, outs = descs[:nin], descs[nin:]
        for od in outs:
            _check_out(key, od, dict(zip(names, ins, strict=True)))
        if nout == 2 and math.prod(outs[0].shape) and _shares_memory(outs[0], outs[1]):
            raise ValueError(f"{key}: the two outputs overlap; they must be separate arrays")
        _run_family(key, direction, compute, descs, nout, _F.family_params(key, p, dtype))

    run.__name__ = f"cuda_{key.replace(':', '_')}_{direction}_{dtype}"
    return run


def _run_family(key: str, direction: str, compute: str, descs: list[_Desc], nout: int, params: tuple) -> None:
    out = descs[-1]
    n = math.prod(out.shape)
    if n == 0:
        return
    with _OnDevice(out.obj), _quiet():
        stream = _stream_for(descs)
        plan = _Plan(descs, out.shape, [d.strides for d in descs])
        grid, block = _grid(n)
        if plan.contiguous:
            _family_jit(key, direction, compute, True)[grid, block, stream](*plan.arrays, *params)
            return
        k = _family_jit(key, direction, compute, False)
        for offs in plan.launches():
            args = []
            for i in range(len(descs)):
                args += [plan.bases[i], offs[i], plan.strides4[i]]
            k[_grid(math.prod(plan.shape4))[0], block, stream](*args, plan.shape4, *params)


# ---- bias_act:<act>: x seen as (outer, C, inner), b and scale per channel or of x's shape -------------------------
# One kernel per (key, direction, compute type, layout) over a 5-D index space (o1, o2, c, i1, i2): the dims before
# `dim` and after it, each side coalesced to at most two (more: one launch per index of the extra dims), every
# operand a flat base array + offset + five element strides (a per-channel b or scale has stride 0 but along c; a
# missing one is a one-element dummy, flags hb, hs).  Every input of an element is read before its results are
# stored (in place is safe).  Two layouts:
# - "strided" (channels with elements inside them: NCHW's dim=1, dim=0): the grid runs over (channel, chunk)
#   pairs, one block each, its threads striding over the chunk's elements of that channel (consecutive threads
#   on consecutive inner elements: coalesced), so b and s are one value per block;
# - "rows" (nothing inside the channel axis and it is x's fastest one: dim=-1 of a C-contiguous array, the
#   transformer's (T, hidden), NHWC, (N, C) with dim=1): the strided mapping would put a warp's threads C
#   elements apart (one 32-byte sector per thread per load), so here the grid runs over (channel tile, row
#   chunk) pairs and a block's threads sit on `width` consecutive channels (a power of two, at most the block;
#   block // width rows at a time for narrow C), each walking the chunk's rows: a warp reads consecutive
#   elements of a row, b and s one value per thread (a per-channel stride 0 along the rows).
# The backward's db / dscale are two-stage in both: each thread sums dz (and dz * x) in float64, the block reduces
# them in shared memory (rows: over its row groups, per channel; a thread per channel needs none) into
# partial[chunk, 2, C] (+=, launches run in order on one stream), and a second kernel sums the partials of each
# channel in a fixed order (deterministic) and rounds once into db / dscale.

_BIAS_OPS = {"forward": ("x", "b", "s", "out"), "backward": ("dy", "x", "b", "s", "dx", "db", "ds"),
             "backward_y": ("dy", "y", "dx", "db")}
_BIAS_NIN = {"forward": 3, "backward": 4, "backward_y": 2}
_BIAS_TAIL = ("shp", "nchunk", "chunk", "part", "hb", "hs", "hdb", "hds", "want", "a", "b", "gain", "clamp")
_BIAS_LAYOUTS = ("strided", "rows")


def _bias_supports(key: str, direction: str) -> bool:
    if direction == "backward_y":
        return _F.family_y_formula(key) is not None
    return direction in ("forward", "backward") and _F.family_formulas(key) is not None


def _bias_compute(key: str, direction: str, dtype: str) -> str:
    act = _BIAS_ACT_KEYS[key][2]
    uses = {"forward": ("forward",), "backward": ("forward", "backward"), "backward_y": ("backward_y",)}[direction]
    wide = any((act, d) in _F.WIDE for d in uses)
    return "float64" if dtype == "float64" or wide else "float32"


def _bias_body(direction: str, at: dict[str, str], pad: str) -> list[str]:
    """The per-element statements of a direction (`at`: each operand's element expression), the float64 sums
    acc0 / acc1 included."""
    if direction == "forward":
        body = [f"{at['out']} = f(T({at['x']}), T({at['b']}), T({at['s']}), a, b, hb, hs, gain, clamp)"]
    elif direction == "backward":
        body = [f"xv = T({at['x']})",
                f"dxv, dz = f(T({at['dy']}), xv, T({at['b']}), T({at['s']}), a, b, hb, hs, gain, clamp)",
                f"{at['dx']} = dxv", "if hdb:", f"    {at['db']} = dz", "if hds:", f"    {at['ds']} = dz * xv",
                "acc0 += np.float64(dz)", "acc1 += np.float64(dz) * np.float64(xv)"]
    else:
        body = [f"dz = f(T({at['dy']}), T({at['y']}), a, b, gain, clamp)", f"{at['dx']} = dz", "if hdb:",
                f"    {at['db']} = dz", "acc0 += np.float64(dz)"]
    return [pad + line for line in body]


def _bias_source(direction: str, block: int, layout: str = "strided") -> str:
    ops = _BIAS_OPS[direction]
    args = ", ".join(f"u_{n}, o_{n}, s_{n}" for n in ops) + ", " + ", ".join(_BIAS_TAIL)
    sums = direction != "forward"
    if layout == "rows":
        return _bias_rows_source(direction, block, ops, args, sums)
    at = {n: f"u_{n}[o_{n} + o1 * s_{n}[0] + o2 * s_{n}[1] + c * s_{n}[2] + i1 * s_{n}[3] + i2 * s_{n}[4]]"
          for n in ops}
    lines = [f"def kern({args}):", "    n_o2 = shp[1]", "    nc = shp[2]", "    n_i1 = shp[3]", "    n_i2 = shp[4]",
             "    m = shp[0] * n_o2 * n_i1 * n_i2", "    tid = cuda.threadIdx.x", "    nthr = cuda.blockDim.x"]
    if sums:
        lines += [f"    sh0 = cuda.shared.array({block}, np.float64)",
                  f"    sh1 = cuda.shared.array({block}, np.float64)"]
    lines += ["    for blk in range(cuda.blockIdx.x, nc * nchunk, cuda.gridDim.x):", "        c = blk // nchunk",
              "        j = blk - c * nchunk", "        lo = j * chunk", "        hi = min(lo + chunk, m)"]
    if sums:
        lines += ["        acc0 = 0.0", "        acc1 = 0.0"]
    lines += ["        for e in range(lo + tid, hi, nthr):", "            i2 = e % n_i2", "            t = e // n_i2",
              "            i1 = t % n_i1", "            t = t // n_i1", "            o2 = t % n_o2",
              "            o1 = t // n_o2"]
    lines += _bias_body(direction, at, " " * 12)
    if sums:  # want is the same for every thread of the block: the barriers are reached by all or none
        lines += ["        if want:", "            sh0[tid] = acc0", "            sh1[tid] = acc1",
                  "            cuda.syncthreads()", f"            width = {block // 2}", "            while width > 0:",
                  "                if tid < width:", "                    sh0[tid] += sh0[tid + width]",
                  "                    sh1[tid] += sh1[tid + width]", "                cuda.syncthreads()",
                  "                width //= 2", "            if tid == 0:",
                  "                part[2 * j * nc + c] += sh0[0]",
                  "                part[(2 * j + 1) * nc + c] += sh1[0]",
                  "            cuda.syncthreads()"]
    return "\n".join(lines) + "\n"


def _bias_rows_source(direction: str, block: int, ops: tuple, args: str, sums: bool) -> str:
    """The "rows" layout: thread tid on channel tile * width + tid % width and rows lo + tid // width, step
    block // width, of its chunk (inner dims are all 1: i1 = i2 = 0).  The row's (o1, o2) advance by addition
    (no 64-bit division per element: gelu's float16 backward takes 72 registers on sm_90, 80 with r % n_o2);
    the carry loop turns at most ng // n_o2 + 1 times a step (n_o2 is the whole outer extent when the outer
    dims coalesce to one)."""
    at = {n: f"u_{n}[o_{n} + o1 * s_{n}[0] + o2 * s_{n}[1] + c * s_{n}[2]]" for n in ops}
    lines = [f"def kern({args}, width):", "    n_o2 = shp[1]", "    nc = shp[2]", "    m = shp[0] * n_o2",
             "    tid = cuda.threadIdx.x", "    ng = cuda.blockDim.x // width", "    g = tid // width",
             "    cl = tid - g * width", "    ntile = (nc + width - 1) // width"]
    if sums:
        lines += [f"    sh0 = cuda.shared.array({block}, np.float64)",
                  f"    sh1 = cuda.shared.array({block}, np.float64)"]
    lines += ["    for blk in range(cuda.blockIdx.x, ntile * nchunk, cuda.gridDim.x):", "        j = blk // ntile",
              "        c = (blk - j * ntile) * width + cl", "        lo = j * chunk", "        hi = min(lo + chunk, m)"]
    if sums:
        lines += ["        acc0 = 0.0", "        acc1 = 0.0"]
    lines += ["        if c < nc:", "            r = lo + g", "            o1 = r // n_o2",
              "            o2 = r - o1 * n_o2", "            while r < hi:"]
    lines += _bias_body(direction, at, " " * 16)
    lines += ["                r += ng", "                o2 += ng", "                while o2 >= n_o2:",
              "                    o2 -= n_o2", "                    o1 += 1"]
    if sums:  # want and ng are the same for every thread of the block: the barriers are reached by all or none
        lines += ["        if want:", "            if ng == 1:", "                if c < nc:",
                  "                    part[2 * j * nc + c] += acc0",
                  "                    part[(2 * j + 1) * nc + c] += acc1",
                  "            else:", "                sh0[tid] = acc0", "                sh1[tid] = acc1",
                  "                cuda.syncthreads()", f"                w = {block // 2}",
                  "                while w >= width:", "                    if tid < w:",
                  "                        sh0[tid] += sh0[tid + w]",
                  "                        sh1[tid] += sh1[tid + w]",
                  "                    cuda.syncthreads()", "                    w //= 2",
                  "                if tid < width and c < nc:", "                    part[2 * j * nc + c] += sh0[tid]",
                  "                    part[(2 * j + 1) * nc + c] += sh1[tid]",
                  "                cuda.syncthreads()"]
    return "\n".join(lines) + "\n"


def _bias_sums_source() -> str:
    """The second stage: per channel, the chunks' float64 partials summed in order, rounded once on store."""
    return (
        "def bsum(part, nchunk, u0, o0, s0, u1, o1, s1, nc, h0, h1):\n"
        "    for c in range(cuda.grid(1), nc, cuda.gridsize(1)):\n"
        "        t0 = 0.0\n"
        "        t1 = 0.0\n"
        "        for j in range(nchunk):\n"
        "            t0 += part[2 * j * nc + c]\n"
        "            t1 += part[(2 * j + 1) * nc + c]\n"
        "        if h0:\n"
        "            u0[o0 + c * s0] = t0\n"
        "        if h1:\n"
        "            u1[o1 + c * s1] = t1\n"
    )


def _bias_block() -> int:
    return _SIM_BLOCK if _simulating() else _BLOCK


@cache
def _bias_py(key: str, direction: str, compute: str, layout: str) -> Callable:
    """The bias_act kernel of one key, direction, compute type and layout ("strided" or "rows") as a Python
    function (what cuda.jit and compile_ptx compile)."""
    from numba import cuda

    g = {"cuda": cuda, "np": np, "f": getattr(_family_formulas(key, compute), direction),
         "T": np.float64 if compute == "float64" else np.float32}
    exec(compile(_bias_source(direction, _bias_block(), layout), f"<multiact cuda {key} {direction} {layout}>",
                 "exec"), g)
    return g["kern"]


@cache
def _bias_jit(key: str, direction: str, compute: str, layout: str) -> Any:
    from numba import cuda

    return cuda.jit(_bias_py(key, direction, compute, layout))


@lru_cache(maxsize=1)
def _bias_sums_py() -> Callable:
    from numba import cuda

    g = {"cuda": cuda}
    exec(compile(_bias_sums_source(), "<multiact cuda bias_act sums>", "exec"), g)
    return g["bsum"]


@lru_cache(maxsize=1)
def _bias_sums_jit() -> Any:
    from numba import cuda

    return cuda.jit(_bias_sums_py())


def _bias_arg_types(dtype: str, direction: str, layout: str) -> tuple:
    from numba import types

    arr, i64, f64 = types.Array(getattr(types, dtype), 1, "C"), types.int64, types.float64
    t5 = types.UniTuple(i64, 5)
    return ((arr, i64, t5) * len(_BIAS_OPS[direction]) + (t5, i64, i64, types.Array(f64, 1, "C")) + (i64,) * 5
            + (f64,) * 4 + ((i64,) if layout == "rows" else ()))


def _bias_sums_types(dtype: str) -> tuple:
    from numba import types

    arr, i64 = types.Array(getattr(types, dtype), 1, "C"), types.int64
    return (types.Array(types.float64, 1, "C"), i64, arr, i64, i64, arr, i64, i64, i64, i64, i64)


def _bias_builds() -> list[tuple[str, str, str]]:
    """(key, direction, dtype) of every bias_act kernel, backward first."""
    return [(key, direction, dtype) for key in _BIAS_ACT_KEYS for direction in ("backward", "backward_y", "forward")
            for dtype in _DTYPES if supports(key, direction, dtype)]


def _bias_kernel(key: str, direction: str, dtype: str) -> Callable:
    """The registry's kernel: forward(x, b, s, out, p), backward(dy, x, b, s, dx, db, ds, p) and
    backward_y(dy, y, b, s, dx, db, ds, p) (b, s unused) on device arrays as fused_bias_act passes them: b, s
    (C,) or x's shape or None; db, ds the destinations ((C,): summed; x's shape: elementwise) or None."""
    compute = _bias_compute(key, direction, dtype)

    def forward(x: Any, b: Any, s: Any, out: Any, p: dict) -> None:
        _run_bias(key, direction, compute, dtype, [x, b, s, out], p)

    def backward(dy: Any, x: Any, b: Any, s: Any, dx: Any, db: Any, ds: Any, p: dict) -> None:
        arrays = [dy, x, b, s, dx, db, ds] if direction == "backward" else [dy, x, dx, db]
        _run_bias(key, direction, compute, dtype, arrays, p)

    run = forward if direction == "forward" else backward
    run.__name__ = f"cuda_{key.replace(':', '_')}_{direction}_{dtype}"
    return run


def _channelwise(d: _Desc, x: _Desc) -> bool:
    """One value per channel (for 1-D x the same thing as x's shape)."""
    return len(d.shape) == 1 and (len(x.shape) == 1 or d.shape != x.shape)


def _run_bias(key: str, direction: str, compute: str, dtype: str, arrays: list, p: dict) -> None:
    names = _BIAS_OPS[direction]
    nin = _BIAS_NIN[direction]
    descs = [None if a is None else _Desc(a) for a in arrays]
    xd = descs[0] if direction == "forward" else descs[1]
    ins = {n: d for n, d in zip(names[:nin], descs[:nin], strict=True) if d is not None}
    outs = [(n, d) for n, d in zip(names[nin:], descs[nin:], strict=True) if d is not None]
    for _, od in outs:
        _check_out(f"bias_act ({key})", od, ins)
    for (na, da), (nb, db) in itertools.combinations(outs, 2):
        if math.prod(da.shape) and math.prod(db.shape) and _shares_memory(da, db):
            raise ValueError(f"bias_act ({key}): {na} and {nb} overlap; they must be separate arrays")
    dim = p.get("dim")
    nc = 1 if dim is None else xd.shape[dim]
    chan = {n for n, d in zip(names, descs, strict=True)
            if d is not None and n in ("b", "s", "db", "ds") and _channelwise(d, xd)}
    views = _bias_views(descs, names, chan, xd, dim)
    layout = _bias_layout(views, names, dim, nc)
    n = math.prod(xd.shape)
    with _OnDevice(xd.obj), _quiet():
        stream = _stream_for([d for d in descs if d is not None])
        nchunk = _bias_nchunk(views, nc, layout, direction)
        part = None
        if chan & {"db", "ds"}:
            size = 2 * nchunk * nc
            part = _empty(xd.obj, (size,), np.float64)
            pd = _Desc(part)
            grid, block = _grid(size)
            _fill_cast()[0][grid, block, stream](_flat(pd, pd.ptr, size))
        if n:
            _launch_bias(key, direction, compute, layout, descs, names, chan, views, xd, nc, nchunk, part, p, dtype,
                         stream)
        if part is not None:
            _bias_sum_stage(part, nchunk, nc, descs, names, chan, stream)


def _bias_layout(views: tuple, names: tuple, dim: int | None, nc: int) -> str:
    """"rows" where the channel axis has nothing inside it and is the output's fastest axis (dim=-1 of a
    C-contiguous array: the strided layout's warps would read C elements apart), else "strided"."""
    oshp, ishp, osts, cst, _ = views
    if dim is None or nc < 2 or math.prod(ishp) != 1:
        return "strided"
    lead = names.index("out" if "out" in names else "dx")
    return "rows" if not oshp or abs(cst[lead]) < abs(osts[lead][-1]) else "strided"


def _bias_width(nc: int) -> int:
    """The rows layout's channels per block: the power of two covering nc, at most the block."""
    return min(_bias_block(), 1 << max(0, nc - 1).bit_length())


def _bias_nchunk(views: tuple, nc: int, layout: str, direction: str) -> int:
    """Chunks per channel (strided) or row chunks (rows) of one launch: enough blocks to fill the device; a
    strided chunk at least four blocks' worth of elements, a rows chunk at least 4 rows per thread forward and
    16 backward (each chunk costs the backward a float64 partial per channel, written and read once)."""
    oshp, ishp = views[0], views[1]
    target = _SIM_GRID * 2 if _simulating() else _sms() * 8
    if layout == "rows":
        width = _bias_width(nc)
        per = (4 if direction == "forward" else 16) * (_bias_block() // width)
        return max(1, min(-(-target // -(-nc // width)), -(-math.prod(oshp[-2:]) // per)))
    m = math.prod(oshp[-2:]) * math.prod(ishp[-2:])
    return max(1, min(-(-target // max(nc, 1)), -(-m // (4 * _bias_block()))))


def _bias_views(descs: list, names: tuple, chan: set, xd: _Desc, dim: int | None) -> tuple:
    """(outer shape, inner shape, per operand outer strides, channel strides, inner strides), the dims before
    and after dim coalesced apart (a dummy operand: all strides 0)."""
    ndim = len(xd.shape)
    full = []
    for nm, d in zip(names, descs, strict=True):
        if d is None:
            full.append([0] * ndim)
        elif nm in chan:
            st = [0] * ndim
            st[dim] = d.strides[0]
            full.append(st)
        else:
            full.append(list(d.strides))
    d0 = ndim if dim is None else dim
    lead = names.index("out" if "out" in names else "dx")
    oshp, osts = coalesce(xd.shape[:d0], [st[:d0] for st in full], lead)
    ishp, ists = coalesce(xd.shape[d0 + 1:], [st[d0 + 1:] for st in full], lead)
    cst = [0 if dim is None else st[dim] for st in full]
    return oshp, ishp, osts, cst, ists


def _two(v: list[int], pad: int) -> list[int]:
    """The last two entries of v, padded in front to two."""
    return [pad] * (2 - len(v[-2:])) + v[-2:]


def _launch_bias(key, direction, compute, layout, descs, names, chan, views, xd, nc, nchunk, part, p, dtype,
                 stream) -> None:
    oshp, ishp, osts, cst, ists = views
    lo_n, li_n = max(0, len(oshp) - 2), max(0, len(ishp) - 2)  # dims beyond two a side: one launch per index
    k_o, k_i = _two(oshp, 1), _two(ishp, 1)
    shp5 = (k_o[0], k_o[1], nc, k_i[0], k_i[1])
    chunk = -(-(math.prod(k_o) * math.prod(k_i)) // nchunk)
    bases, offs0, st5, lst = [], [], [], []
    dummy = None
    for k, d in enumerate(descs):
        s_o, s_i = _two(osts[k], 0), _two(ists[k], 0)
        st5.append((s_o[0], s_o[1], cst[k], s_i[0], s_i[1]))
        lst.append(osts[k][:lo_n] + ists[k][:li_n])
        if d is None:
            if dummy is None:
                dd = _Desc(_empty(xd.obj, (1,), xd.dtype))
                dummy = _flat(dd, dd.ptr, 1)
            bases.append(dummy)
            offs0.append(0)
            continue
        every = [*zip(oshp, osts[k], strict=True), (nc, cst[k]), *zip(ishp, ists[k], strict=True)]
        lo = sum((m - 1) * s for m, s in every if s < 0)
        hi = sum((m - 1) * s for m, s in every if s > 0)
        bases.append(_flat(d, d.ptr + lo * d.dtype.itemsize, hi - lo + 1))
        offs0.append(-lo)
    given = {nm: d is not None for nm, d in zip(names, descs, strict=True)}
    hb, hs = int(given.get("b", False)), int(given.get("s", False))
    hdb = int(given.get("db", False) and "db" not in chan)
    hds = int(given.get("ds", False) and "ds" not in chan)
    want = int(part is not None)
    pd = _Desc(part if part is not None else _empty(xd.obj, (1,), np.float64))
    part_flat = _flat(pd, pd.ptr, math.prod(pd.shape))
    a, b, gain, clamp = _F.bias_params(key, p, dtype)
    kern = _bias_jit(key, direction, compute, layout)
    blocks, extra = nc * nchunk, ()
    if layout == "rows":
        width = _bias_width(nc)
        blocks, extra = -(-nc // width) * nchunk, (width,)
    grid = max(1, min(blocks, _SIM_GRID if _simulating() else _sms() * 32))
    for idx in np.ndindex(*(oshp[:lo_n] + ishp[:li_n])):
        args = []
        for j in range(len(descs)):
            args += [bases[j], offs0[j] + sum(i * s for i, s in zip(idx, lst[j], strict=True)), st5[j]]
        kern[grid, _bias_block(), stream](*args, shp5, nchunk, chunk, part_flat, hb, hs, hdb, hds, want, a, b,
                                          gain, clamp, *extra)


def _bias_sum_stage(part: Any, nchunk: int, nc: int, descs: list, names: tuple, chan: set, stream: Any) -> None:
    pd = _Desc(part)
    args: list = [_flat(pd, pd.ptr, math.prod(pd.shape)), nchunk]
    flags = []
    for nm in ("db", "ds"):
        d = descs[names.index(nm)] if nm in names else None
        if d is None or nm not in chan:
            dd = _Desc(_empty(part, (1,), descs[0].dtype))
            args += [_flat(dd, dd.ptr, 1), 0, 0]
            flags.append(0)
        else:
            s = d.strides[0]
            lo = min(0, (nc - 1) * s)
            args += [_flat(d, d.ptr + lo * d.dtype.itemsize, abs(s) * (nc - 1) + 1), -lo, s]
            flags.append(1)
    grid, block = _grid(nc)
    _bias_sums_jit()[grid, block, stream](*args, nc, *flags)


# ---- an array parameter (prelu's weight) as a broadcast operand ----------------------------------------------


def _weight_desc(w: Any, x: _Desc, axis: Any, op: str) -> tuple[_Desc, int, int, tuple[int, ...], Any]:
    """(weight broadcast to x's shape, channel count, channel axis, the weight's own shape and dtype)."""
    if hasattr(w, "__cuda_array_interface__"):
        wd = _Desc(w)
        if wd.dtype != x.dtype:
            raise TypeError(f"{op}(): weight has dtype {wd.dtype} but x has {x.dtype}; they must match on the device")
        wshape, wdtype = wd.shape, wd.dtype
    else:
        from multiact import _arrays

        host = _arrays.as_host_array(w, f"{op}(): weight")
        wshape, wdtype = host.shape, host.dtype
        dev = _upload(np.ascontiguousarray(host.reshape(-1), dtype=x.dtype), x.obj)
        wd = _Desc(dev)
    from multiact.checks import channel_axis

    ndim = len(x.shape)
    axis = channel_axis(op, x.shape, wshape, axis)
    if axis is None:
        return _view(wd, x.shape, [0] * ndim), 1, 0, wshape, wdtype
    size = math.prod(wshape)
    strides = [0] * ndim
    strides[axis] = wd.strides[0]
    return _view(wd, x.shape, strides), size, axis, wshape, wdtype


def _view(d: _Desc, shape: tuple[int, ...], strides: list[int]) -> _Desc:
    v = _Desc.__new__(_Desc)
    v.obj, v.cai, v.dtype, v.ptr, v.readonly, v.stream = d.obj, d.cai, d.dtype, d.ptr, d.readonly, d.stream
    v.shape, v.strides = tuple(shape), tuple(strides)
    return v


def _upload(host: np.ndarray, like: Any) -> Any:
    """A small host array (a weight given on the host) copied to the device, in the caller's kind."""
    lib = _library(like)
    if lib == "torch":
        return sys.modules["torch"].from_numpy(host).to(like.device)
    if lib == "cupy":
        cp = sys.modules["cupy"]
        with like.device:
            return cp.asarray(host)
    if _simulating():
        from .cuda_sim import to_device

        return to_device(host)
    from numba import cuda

    return cuda.to_device(host)


def _channel_forward(key: str) -> Callable:
    array = _KEYS[key].defn.array_param

    def forward(x: Any, out: Any, p: dict) -> None:
        xd, od = _Desc(x), _Desc(out)
        wd = _weight_desc(p[array], xd, p.get("axis", 1), key)[0]
        _check_out(key, od, {"x": xd, array: wd})
        _run(_F.formula_name(key, "forward", p), _compute(key, "forward", xd.dtype.name), [xd, wd, od], 0.0, 0.0)

    return forward


def _channel_backward(key: str) -> Callable:
    array = _KEYS[key].defn.array_param

    def backward(dy: Any, x: Any, out: Any, p: dict) -> None:
        dd, xd, od = _Desc(dy), _Desc(x), _Desc(out)
        wd = _weight_desc(p[array], xd, p.get("axis", 1), key)[0]
        _check_out(key, od, {"dy": dd, "x": xd, array: wd})
        _run(_F.formula_name(key, "backward", p), _compute(key, "backward", xd.dtype.name), [dd, xd, wd, od],
             0.0, 0.0)

    return backward


# ---- parameter gradients: device reductions in float64 ----------------------------------------------------------


def _reduce_source(block: int) -> str:
    return (
        "def kern(u0, o0, s0, u1, o1, s1, acc, oa, sa, shp, a):\n"
        "    n1 = shp[1]\n"
        "    n2 = shp[2]\n"
        "    n3 = shp[3]\n"
        "    n = shp[0] * n1 * n2 * n3\n"
        "    start = cuda.grid(1)\n"
        "    step = cuda.gridsize(1)\n"
        "    run = 0.0\n"
        "    where = -1\n"
        "    for i in range(start, n, step):\n"
        "        i3 = i % n3\n"
        "        t = i // n3\n"
        "        i2 = t % n2\n"
        "        t = t // n2\n"
        "        i1 = t % n1\n"
        "        i0 = t // n1\n"
        "        dy = np.float64(u0[o0 + i0 * s0[0] + i1 * s0[1] + i2 * s0[2] + i3 * s0[3]])\n"
        "        x = np.float64(u1[o1 + i0 * s1[0] + i1 * s1[1] + i2 * s1[2] + i3 * s1[3]])\n"
        "        k = oa + i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3]\n"
        "        if k != where:\n"
        "            if where >= 0:\n"
        "                cuda.atomic.add(acc, where, run)\n"
        "            where = k\n"
        "            run = 0.0\n"
        "        run += term(dy, x, a, 0.0)\n"
        "    if ONE_SLOT:\n"  # a single accumulator: reduce the block in shared memory first
        f"        sh = cuda.shared.array({block}, np.float64)\n"
        "        tid = cuda.threadIdx.x\n"
        "        sh[tid] = run\n"
        "        cuda.syncthreads()\n"
        f"        width = {block // 2}\n"
        "        while width > 0:\n"
        "            if tid < width:\n"
        "                sh[tid] += sh[tid + width]\n"
        "            cuda.syncthreads()\n"
        "            width //= 2\n"
        "        if tid == 0:\n"
        "            cuda.atomic.add(acc, 0, sh[0])\n"
        "    elif where >= 0:\n"
        "        cuda.atomic.add(acc, where, run)\n"
    )


@cache
def _reducer_py(which: str) -> Callable:
    """The float64 reduction kernel of one op's parameter gradient, as a Python function."""
    from numba import cuda

    term = getattr(_formulas("float64"), _F.TABLE[(which, "param_grad")])
    block = _SIM_BLOCK if _simulating() else _BLOCK
    g = {"cuda": cuda, "np": np, "term": term, "ONE_SLOT": not _KEYS[which].defn.array_param}  # a scalar: one sum
    exec(compile(_reduce_source(block), f"<multiact cuda {which} reduction>", "exec"), g)
    return g["kern"]


@cache
def _reducer(which: str) -> Any:
    from numba import cuda

    return cuda.jit(_reducer_py(which))


def _fill_source() -> str:
    return (
        "def fill(acc):\n"
        "    for i in range(cuda.grid(1), acc.shape[0], cuda.gridsize(1)):\n"
        "        acc[i] = 0.0\n"
        "def cast(acc, out):\n"
        "    for i in range(cuda.grid(1), acc.shape[0], cuda.gridsize(1)):\n"
        "        out[i] = acc[i]\n"
    )


@lru_cache(maxsize=1)
def _fill_cast_py() -> tuple[Callable, Callable]:
    from numba import cuda

    g = {"cuda": cuda}
    exec(compile(_fill_source(), "<multiact cuda fill>", "exec"), g)
    return g["fill"], g["cast"]


@lru_cache(maxsize=1)
def _fill_cast() -> tuple[Any, Any]:
    from numba import cuda

    fill, cast = _fill_cast_py()
    return cuda.jit(fill), cuda.jit(cast)


def _reduce(which: str, dy: _Desc, x: _Desc, acc_view: _Desc, acc: Any, a: float, like: Any,
            shape: tuple[int, ...], dtype: Any) -> Any:
    """Sum term(dy, x) into acc (float64, zeroed here), then cast into a new array of the caller's kind."""
    fill, cast = _fill_cast()
    nacc = math.prod(_Desc(acc).shape)
    res = _empty(like, shape, dtype)
    with _OnDevice(x.obj), _quiet():
        stream = _stream_for([dy, x])
        accd = _Desc(acc)
        acc_flat = _flat(accd, accd.ptr, nacc)
        fill[1, _grid(nacc)[1], stream](acc_flat)
        n = math.prod(x.shape)
        if n:
            plan = _Plan([dy, x, acc_view], x.shape, [dy.strides, x.strides, acc_view.strides], lead=1)
            if plan.contiguous:  # every operand is one run: index it as a 1-D strided case
                plan.bases, plan.offsets, plan.outer = plan.arrays, [0, 0, 0], []
                plan.shape4 = (1, 1, 1, n)
                plan.strides4 = [(0, 0, 0, 1), (0, 0, 0, 1), (0, 0, 0, 1 if nacc > 1 else 0)]
            k = _reducer(which)
            for offs in plan.launches():
                b = plan.bases
                s = plan.strides4
                grid, block = _grid(math.prod(plan.shape4))
                k[grid, block, stream](b[0], offs[0], s[0], b[1], offs[1], s[1], b[2], offs[2], s[2],
                                       plan.shape4, a)
        rd = _Desc(res)
        cast[_grid(nacc)[0], _grid(nacc)[1], stream](acc_flat, _flat(rd, rd.ptr, nacc))
    return res


def _scalar_param_grad(key: str) -> Callable:
    """d/d(param) of sum(op(x) * dy) for a scalar parameter (swish's beta), as a 0-d device array of x's dtype
    and kind."""

    def grad(dy: Any, x: Any, p: dict) -> Any:
        dd, xd = _Desc(dy), _Desc(x)
        a, _ = _F.scalar_params(key, p, xd.dtype.name)  # the parameter is the op's only one
        acc = _empty(x, (1,), np.float64)
        accd = _Desc(acc)
        view = _view(accd, xd.shape, [0] * len(xd.shape))
        return _reduce(key, dd, xd, view, acc, a, x, (), xd.dtype)

    return grad


def _channel_param_grad(key: str) -> Callable:
    """The array parameter's term summed per channel (prelu: dy * x over x <= 0), as a device array of the
    weight's shape and dtype, x's kind."""
    array = _KEYS[key].defn.array_param

    def grad(dy: Any, x: Any, p: dict) -> Any:
        dd, xd = _Desc(dy), _Desc(x)
        _, c, axis, wshape, wdtype = _weight_desc(p[array], xd, p.get("axis", 1), key)
        acc = _empty(x, (c,), np.float64)
        accd = _Desc(acc)
        strides = [0] * len(xd.shape)
        if c > 1:
            strides[axis] = 1
        view = _view(accd, xd.shape, strides)
        return _reduce(key, dd, xd, view, acc, 0.0, x, tuple(wshape), wdtype)

    return grad


# ---- quantized outputs (quant=): the activation, the amax, the scale and the codes on the device ---------------
# multiact.quant's contract, bit for bit, in float32 on the device.  The values are the call's formula (the same
# device functions as the float kernels: the elementwise forward or backward formula, f(x) or f(dy, x), or the
# gated family's forward) on inputs loaded as they are (float16 / float32 widened in registers, bfloat16 by its
# bits << 16, float64 computed in float64 and rounded once to float32).  Three kernels:
# - "seg" (granularity token, group, mx): each segment (a row, a group of 32/64/128 or an MX block of 32) is taken
#   by W threads: W = 32 (a warp) for groups and MX blocks, several segments per block; W = the block for a row.
#   The threads read their elements (strided over the segment) for max |v| (NaN wins), reduce it by warp shuffles
#   (xor butterfly: every lane ends with the warp's amax) and, where W spans warps, through shared memory; every
#   thread derives the same scale with multiact.quant's float32 operations; lane 0 stores it; the threads then
#   recompute their elements (rather than hold them: a row has any length) and store the codes.
# - "amax" + "apply" (granularity tensor): a grid-stride max |v| per block into one int32 word (atomic max on the
#   non-negative float32 bits: the order of float32 magnitudes, NaN above inf), then a grid-stride pass in which
#   every thread derives the scale from that word (or takes the static scale) and stores its codes.
# The float8 codes are float32 bits -> float8 bits by integer operations (numba-cuda has no float8 type):
# round to nearest even, saturated to the largest finite value (PTX's satfinite), NaN kept; written as uint8.
# The conversions are branch-free on uint32, so the very functions the kernels compile also run on NumPy uint32
# arrays (scripts/cuda_quant_bits_check.py checks them against ml_dtypes on all 2^32 float32 bit patterns, the
# tests on 2^24 and the specials).  Under the simulator (no warp shuffles there) the shuffle is a shared-memory
# exchange between the same lanes.

_U = np.uint32
_Q_ALL, _Q_ABS, _Q_INF, _Q_MANT, _Q_HID, _Q_EXP = (_U(0xFFFFFFFF), _U(0x7FFFFFFF), _U(0x7F800000), _U(0x007FFFFF),
                                                   _U(0x00800000), _U(0x7F800000))
_Q0, _Q1, _Q7, _Q16, _Q20, _Q21, _Q23, _Q31 = (_U(0), _U(1), _U(7), _U(16), _U(20), _U(21), _U(23), _U(31))
_Q127, _Q255 = _U(127), _U(255)
_E4_MIN, _E4_SAT, _E4_LOW, _E4_BIAS, _E4_TOP = _U(0x3C800000), _U(0x43E00000), _U(0x7FFFF), _U(960), _U(120)
_E4_SUB, _E4_MAXC, _E4_NAN = _U(141), _U(0x7E), _U(0x7F)
_E5_MIN, _E5_SAT, _E5_LOW, _E5_BIAS, _E5_TOP = _U(0x38800000), _U(0x47600000), _U(0xFFFFF), _U(448), _U(112)
_E5_SUB, _E5_MAXC, _E5_NAN = _U(134), _U(0x7B), _U(0x7E)
_F0, _F1, _F127, _FM127 = np.float32(0), np.float32(1), np.float32(127), np.float32(-127)
_FINF, _FNAN, _FMINNORM = np.float32(np.inf), np.float32(np.nan), np.float32(2.0 ** -126)
_F2P64, _F2M64, _FMAGIC, _FTINY = np.float32(2.0 ** 64), np.float32(2.0 ** -64), np.float32(12582912.0), \
    np.float32(2.0 ** -149)
_I0, _I1, _I64, _I127, _IM127 = np.int32(0), np.int32(1), np.int32(64), np.int32(127), np.int32(-127)
_E8M0_MIN = _U(0x00400000)  # 2^-127, E8M0's least scale, a float32 subnormal


def _sel(c, x, y):
    """x where c else y on uint32, without a branch (a select on the GPU, elementwise on NumPy arrays)."""
    return y ^ ((x ^ y) & (np.uint32(c) * _Q_ALL))


def e4m3fn_bits(u):
    """float32 bits -> float8_e4m3fn bits: round to nearest even, saturated to +-448 (inf included), NaN kept
    NaN with its sign.  The cuda kernels' conversion; runs on NumPy uint32 arrays as it is."""
    a = u & _Q_ABS
    an = _sel(a >= _E4_MIN, a, _E4_MIN)  # normal results: drop 20 mantissa bits with RNE, rebias 127 -> 7
    nrm = ((an + _E4_LOW + ((an >> _Q20) & _Q1)) >> _Q20) - _E4_BIAS
    e = _sel(a >= _E4_MIN, _E4_TOP, a >> _Q23)  # subnormal results: the significand >> (141 - e), RNE
    sh = _sel(_E4_SUB - e > _Q31, _Q31, _E4_SUB - e)
    m = (a & _Q_MANT) | _Q_HID
    sub = (m + ((_Q1 << (sh - _Q1)) - _Q1) + ((m >> sh) & _Q1)) >> sh
    mag = _sel(a >= _E4_MIN, nrm, sub)
    mag = _sel(a >= _E4_SAT, _E4_MAXC, mag)
    mag = _sel(a > _Q_INF, _E4_NAN, mag)
    return ((u >> _Q31) << _Q7) | mag


def e5m2_bits(u):
    """float32 bits -> float8_e5m2 bits: round to nearest even, saturated to +-57344 (inf included), NaN kept
    NaN (0x7E with its sign).  The cuda kernels' conversion; runs on NumPy uint32 arrays as it is."""
    a = u & _Q_ABS
    an = _sel(a >= _E5_MIN, a, _E5_MIN)  # normal results: drop 21 mantissa bits with RNE, rebias 127 -> 15
    nrm = ((an + _E5_LOW + ((an >> _Q21) & _Q1)) >> _Q21) - _E5_BIAS
    e = _sel(a >= _E5_MIN, _E5_TOP, a >> _Q23)  # subnormal results: the significand >> (134 - e), RNE
    sh = _sel(_E5_SUB - e > _Q31, _Q31, _E5_SUB - e)
    m = (a & _Q_MANT) | _Q_HID
    sub = (m + ((_Q1 << (sh - _Q1)) - _Q1) + ((m >> sh) & _Q1)) >> sh
    mag = _sel(a >= _E5_MIN, nrm, sub)
    mag = _sel(a >= _E5_SAT, _E5_MAXC, mag)
    mag = _sel(a > _Q_INF, _E5_NAN, mag)
    return ((u >> _Q31) << _Q7) | mag


def _int8_code(r):
    """A float32 quotient -> the int8 code's value: clipped to +-127, RNE (the 1.5 * 2^23 trick), NaN 0."""
    if r != r:
        return _I0
    if r > _F127:
        r = _F127
    if r < _FM127:
        r = _FM127
    return np.int32((r + _FMAGIC) - _FMAGIC)


def _nanmax(m, a):
    """max(m, a) where a NaN wins and stays."""
    if a > m or a != a:
        return a
    return m


def _f2u_gpu(x):
    return np.uint32(libdevice.float_as_int(x))  # noqa: F821 - the namespace of _quant_ns


def _u2f_gpu(u):
    return libdevice.int_as_float(np.int32(u))  # noqa: F821


def _f2u_host(x):
    return np.float32(x).view(np.uint32)


def _u2f_host(u):
    return np.uint32(u).view(np.float32)


def _q_scale(a, qmax, ub, lo, pow2):
    """The float32 scale of amax a (multiact.quant's `_scales`): capped at ub, raised to lo, a / qmax, 1 for a = 0,
    2^-149 for a quotient that underflows, rounded up to a power of two with pow2; NaN and inf propagate."""
    if a > ub:
        a = ub
    if a < lo:
        a = lo
    if a == _F0:
        return _F1
    s = a / qmax
    if s == _F0:
        s = _FTINY
    if pow2 != 0 and s < _FINF:
        k = _F1
        if s < _FMINNORM:  # a subnormal scale: scaled into the normal range exactly, and back
            s = s * _F2P64
            k = _F2M64
        b = f2u(s)  # noqa: F821
        if (b & _Q_MANT) != _Q0:
            b = (b & _Q_EXP) + _Q_HID
        s = u2f(b) * k  # noqa: F821
    return s


def _q_e8m0(amax, qmax, emax, floor_rule):
    """MX's E8M0 scale bits of amax (multiact.quant's `_e8m0`): 2^ceil(log2(amax / qmax)) or
    2^(floor(log2 amax) - emax), clamped to [-127, 127]; 127 (scale 1) for amax 0, 255 (NaN) for NaN or inf."""
    if not amax < _FINF:
        return _Q255
    if amax == _F0:
        return _Q127
    x = amax
    if floor_rule == 0:
        x = amax / qmax
    e = _IM127
    if x != _F0:
        k = _I0
        if x < _FMINNORM:
            x = x * _F2P64
            k = _I64
        b = f2u(x)  # noqa: F821
        e = np.int32(b >> _Q23) - _I127 - k
        if floor_rule == 0 and (b & _Q_MANT) != _Q0:
            e = e + _I1
    if floor_rule != 0:
        e = e - emax
    if e < _IM127:
        e = _IM127
    if e > _I127:
        e = _I127
    return np.uint32(e + _I127)


def _e8m0_value(bits):
    """The float32 value of E8M0 bits (2^(bits - 127); 255 is NaN)."""
    if bits == _Q255:
        return _FNAN
    if bits == _Q0:
        return u2f(_E8M0_MIN)  # noqa: F821
    return u2f(bits << _Q23)  # noqa: F821


_QUANT_HELPERS = (_sel, e4m3fn_bits, e5m2_bits, _int8_code, _nanmax, _q_scale, _q_e8m0, _e8m0_value)
_Q_TARGETS = ("float8_e4m3fn", "float8_e5m2", "int8")


@cache
def _quant_ns() -> dict[str, Any]:
    """The helpers as inlined device functions, in one namespace (each calls the others' device versions)."""
    from types import FunctionType

    from numba import cuda

    jit = cuda.jit(device=True, inline="always")
    g: dict[str, Any] = {k: v for k, v in globals().items() if k.startswith(("_Q", "_E4", "_E5", "_F", "_I", "_E8"))}
    g["np"] = np
    if _simulating():
        g["f2u"], g["u2f"] = jit(_f2u_host), jit(_u2f_host)
    else:
        from numba.cuda import libdevice

        g["libdevice"] = libdevice
        for name, fn in (("f2u", _f2u_gpu), ("u2f", _u2f_gpu)):
            g[name] = jit(FunctionType(fn.__code__, g, name))
    for fn in _QUANT_HELPERS:  # under its own name (the helpers call each other so) and without the underscore
        g[fn.__name__] = g[fn.__name__.lstrip("_")] = jit(FunctionType(fn.__code__, g, fn.__name__))
    g["conv"] = {"float8_e4m3fn": g["e4m3fn_bits"], "float8_e5m2": g["e5m2_bits"]}
    return g


def _q_load(k: int, bf16: bool, at: str) -> str:
    """An input's element as the compute type (bfloat16: its bits << 16 as float32)."""
    if bf16:
        return f"u2f(np.uint32(u{k}[{at}]) << Q16)"
    return f"T(u{k}[{at}])"


def _q_reduce(block: int, width: int, sim: bool, pad: str) -> list[str]:
    """m: the amax of the W = width threads of a segment, in every one of them (xor butterfly in the warp,
    then the warps of a wider segment through shared memory)."""
    out = []
    for k in (16, 8, 4, 2, 1):
        if sim:  # no shuffles in the simulator: the same exchange through shared memory
            out += ["red[tid] = m", "cuda.syncthreads()", f"m = nanmax(m, red[tid ^ {k}])", "cuda.syncthreads()"]
        else:
            out += [f"m = nanmax(m, cuda.shfl_xor_sync(0xFFFFFFFF, m, {k}))"]
    if width > 32:
        nw = width // 32
        out += ["if tid % 32 == 0:", "    wred[tid // 32] = m", "cuda.syncthreads()",
                f"m = wred[sub * {nw}]"] + [f"m = nanmax(m, wred[sub * {nw} + {w}])" for w in range(1, nw)] + \
            ["cuda.syncthreads()"]
    return [pad + line for line in out]


def _quant_source(kind: str, nin: int, nparams: int, bf16: bool, target: str, block: int, width: int,
                  sim: bool) -> str:
    """One quantizing kernel: kind "seg" (token / group) or "mx" (`width` threads per segment), "amax" or "apply"
    (tensor).  Inputs are flat base arrays with an offset, a row stride and a column stride (rows x n)."""
    ins = ", ".join(f"u{k}, o{k}, rs{k}, cs{k}" for k in range(nin))
    ps = ", ".join(f"p{k}" for k in range(nparams))
    vals = ", ".join(_q_load(k, bf16, f"o{k} + row * rs{k} + col * cs{k}") for k in range(nin))
    value = f"F32(f({vals}, {ps}))"
    if target == "int8":
        store = "codes[{at}] = int8_code(v / s)"
    else:
        store = "codes[{at}] = conv(f2u(v / s))"
    head = ["    tid = cuda.threadIdx.x",
            f"    red = cuda.shared.array({block}, np.float32)",
            f"    wred = cuda.shared.array({max(block // 32, 1)}, np.float32)"]
    if kind in ("seg", "mx"):
        spb = block // width
        if kind == "mx":
            scale = ["            bits = q_e8m0(m, qmax, emax, rule)", "            s = e8m0_value(bits)",
                     "            if lane == 0:", "                scales[(rb + row) * spr + (seg - row * spr)] = bits"]
        else:
            scale = ["            s = q_scale(m, qmax, ub, lo, pow2)", "            if lane == 0:",
                     "                scales[(rb + row) * spr + (seg - row * spr)] = s"]
        lines = [f"def kern({ins}, codes, scales, rows, n, g, spr, rb, {ps}, qmax, ub, lo, pow2, emax, rule):",
                 *head,
                 f"    lane = tid % {width}", f"    sub = tid // {width}", "    nseg = rows * spr",
                 f"    for base in range(cuda.blockIdx.x * {spb}, nseg, cuda.gridDim.x * {spb}):",
                 "        seg = base + sub", "        live = seg < nseg",
                 "        row = seg // spr", "        first = (seg - row * spr) * g", "        m = Z",
                 "        if live:", f"            for j in range(lane, g, {width}):",
                 "                col = first + j", f"                m = nanmax(m, abs({value}))",
                 *_q_reduce(block, width, sim, "        "),
                 "        if live:", *scale,
                 f"            for j in range(lane, g, {width}):", "                col = first + j",
                 f"                v = {value}",
                 "                " + store.format(at="(rb + row) * n + col")]
    elif kind == "amax":
        lines = [f"def kern({ins}, word, rows, n, {ps}):", *head, "    sub = 0", "    m = Z",
                 "    for i in range(cuda.grid(1), rows * n, cuda.gridsize(1)):", "        row = i // n",
                 "        col = i - row * n", f"        m = nanmax(m, abs({value}))",
                 *_q_reduce(block, block, sim, "    "),
                 "    if tid == 0:", "        cuda.atomic.max(word, 0, np.int32(f2u(m) & Q_ABS))"]
    else:
        lines = [f"def kern({ins}, codes, scales, word, rows, n, rb, {ps}, qmax, ub, lo, pow2, sfix, static):",
                 "    if static != 0:", "        s = sfix", "    else:",
                 "        s = q_scale(u2f(np.uint32(word[0])), qmax, ub, lo, pow2)",
                 "    if cuda.grid(1) == 0 and rb == 0:", "        scales[0] = s",
                 "    for i in range(cuda.grid(1), rows * n, cuda.gridsize(1)):", "        row = i // n",
                 "        col = i - row * n", f"        v = {value}", "        " + store.format(at="rb * n + i")]
    return "\n".join(lines) + "\n"


def _quant_formula(key: str, p: dict | None, dtype: str, direction: str = "forward"
                   ) -> tuple[Any, str, tuple, str] | None:
    """(device function, compute type, its scalar parameters, a name for it) of a call the quantizing kernels
    take: an elementwise op's forward or backward formula (dy and x, or dy and y), or the gated family's forward;
    None where there is none here.  p None: the kernel's form only (zeros for the parameters, what builds()
    needs)."""
    if key in _FAMILY_KEYS:
        if direction != "forward" or _FAMILY_KEYS[key][0].name != "gated" or _F.family_formulas(key) is None:
            return None
        compute = _family_compute(key, "forward", "float32" if dtype == "bfloat16" else dtype)
        return (_family_formulas(key, compute).forward, compute,
                (0.0,) * 4 if p is None else _F.family_params(key, p, dtype), key)
    if key not in _KEYS or _KEYS[key].defn.array_param or direction not in _Q_DIRECTIONS or \
            (key, direction) not in _F.TABLE:
        return None
    compute = _compute(key, direction, "float32" if dtype == "bfloat16" else dtype)
    name = _F.TABLE[(key, direction)] if p is None else _F.formula_name(key, direction, p)
    return getattr(_formulas(compute), name), compute, (0.0, 0.0) if p is None else _F.scalar_params(key, p, dtype), \
        name


_Q_DIRECTIONS = ("forward", "backward", "backward_y")  # an elementwise call with one result the kernels quantize


@cache
def _quant_py(fname: str, compute: str, nin: int, nparams: int, kind: str, dtype: str, target: str,
              width: int) -> Callable:
    """A quantizing kernel as a Python function (what cuda.jit and compile_ptx compile); `fname` names the
    formula: an elementwise formula's name, or a gated key."""
    from numba import cuda

    sim = _simulating()
    block = (2 * _SIM_BLOCK) if sim else _BLOCK
    if fname in _FAMILY_KEYS:
        f = _family_formulas(fname, compute).forward
    else:
        f = getattr(_formulas(compute), fname)
    g = dict(_quant_ns())
    t = np.float64 if compute == "float64" else np.float32
    g.update(cuda=cuda, f=f, T=t, F32=np.float32, Z=np.float32(0), Q16=_Q16, Q0=_Q0, Q_ABS=_Q_ABS,
             conv=g["conv"].get(target))
    src = _quant_source(kind, nin, nparams, dtype == "bfloat16", target, block, width, sim)
    exec(compile(src, f"<multiact cuda quant {kind} {fname} {dtype} {target}>", "exec"), g)
    return g["kern"]


@cache
def _quant_jit(*args: Any) -> Any:
    from numba import cuda

    return cuda.jit(_quant_py(*args))


def _quant_arg_types(kind: str, nin: int, nparams: int, dtype: str, target: str) -> tuple:
    """The numba types of a quantizing launch (what `_run_quant` passes)."""
    from numba import types

    data = types.uint16 if dtype == "bfloat16" else getattr(types, dtype)
    arr = types.Array(data, 1, "C")
    i64, f32, f64, i32 = types.int64, types.float32, types.float64, types.int32
    ins = (arr, i64, i64, i64) * nin
    codes = types.Array(types.int8 if target == "int8" else types.uint8, 1, "C")
    word = types.Array(types.int32, 1, "C")
    if kind in ("seg", "mx"):
        scales = types.Array(types.uint8 if kind == "mx" else f32, 1, "C")
        return ins + (codes, scales, i64, i64, i64, i64, i64) + (f64,) * nparams + (f32, f32, f32, i32, i32, i32)
    if kind == "amax":
        return ins + (word, i64, i64) + (f64,) * nparams
    return ins + (codes, types.Array(f32, 1, "C"), word, i64, i64, i64) + (f64,) * nparams + \
        (f32, f32, f32, i32, f32, i32)


@lru_cache(maxsize=1)
def _zero_word_py() -> Callable:
    """word[0] = 0 (the tensor amax's int32 word), as a Python function."""
    from numba import cuda

    g = {"cuda": cuda}
    exec(compile("def zero(word):\n    if cuda.grid(1) == 0:\n        word[0] = 0\n", "<multiact cuda zero>",
                 "exec"), g)
    return g["zero"]


@lru_cache(maxsize=1)
def _zero_word() -> Any:
    from numba import cuda

    return cuda.jit(_zero_word_py())


def _q_rows(descs: list[_Desc], shape: tuple[int, ...]) -> tuple[list[int], list[list[int]], int]:
    """The leading dims (all but the last) merged in C order where every input allows: (outer dims, per-input
    outer strides, rows of the last merged dim) with each input's row stride last in its list."""
    lead = list(shape[:-1]) or [1]
    sts = [list(d.strides[:-1]) or [0] for d in descs]
    k = len(lead) - 1
    while k > 0:
        if lead[k] == 1 or lead[k - 1] == 1 or all(st[k - 1] == st[k] * lead[k] for st in sts):
            keep = k - 1 if lead[k] == 1 else k  # a unit dim's stride does not matter
            for st in sts:
                st[k - 1] = st[keep]
                del st[k]
            lead[k - 1] *= lead[k]
            del lead[k]
        k -= 1
    return lead, sts, lead[-1]


def _q_view(lib_obj: Any, a: Any, name: str) -> Any:
    """Codes or E8M0 scales (uint8 bits) as the caller's library names them: torch float8 tensors, ml_dtypes
    arrays under the simulator; CuPy and Numba have no float8 type: uint8 bits."""
    lib = _library(lib_obj)
    if lib == "torch":
        return a.view(getattr(sys.modules["torch"], name))
    if lib == "sim":
        import ml_dtypes

        return a.view(getattr(ml_dtypes, name))
    return a


def quantized(plan: Any, job: Any, kernel: Any, dtype: str, quant: Any) -> tuple[Any, Any] | None:
    """`ma.<op>(x, quant=Q)` and `ma.<op>_grad(dy, x, quant=Q)` on CUDA arrays, in one pass on the device (see the
    section's comment): (codes, scales) as device arrays of the caller's library, bit for bit
    multiact.quant.quantize_host of the float32 result; None (not built here): the gated and bias_act backwards,
    second order, the zero-point int8 form, bias_act and prelu."""
    if not quant.symmetric:
        return None
    got = _quant_formula(plan.key, job.p, dtype, plan.direction)
    if got is None:
        return None
    f, compute, params, fname = got
    captured: list[Any] = []
    job.run(lambda *a: captured.extend(a), [None])
    ins = [a for a in captured[:-1]]
    fn = plan.fn
    shape = tuple(job.results[0].shape)
    q = quant
    if q.granularity != "tensor":
        if not shape:
            raise ValueError(f"{fn}: granularity {q.granularity!r} needs an array with a last axis, got a 0-d one")
        n = shape[-1]
        g = q.block or n
        if g == 0 or n % g:
            raise ValueError(f"{fn}: the last axis ({n}) must be a multiple of the group size ({g}) for granularity "
                             f"{q.granularity!r}")
    like = ins[0]
    if dtype == "bfloat16":  # its bits (a torch bfloat16 tensor has no array interface: its int16 view has)
        ins_bits = [a.detach().view(sys.modules["torch"].int16) if _library(a) == "torch" else a for a in ins]
        descs = [_as_bits(_Desc(a), "<u2") for a in ins_bits]
    else:
        descs = [_Desc(a) for a in ins]
    nin = len(descs)
    code_dt = np.int8 if q.dtype == "int8" else np.uint8
    codes = _empty(like, shape, code_dt)
    mx = q.granularity == "mx"
    if q.granularity == "tensor":
        sshape: tuple[int, ...] = ()
    else:
        sshape = shape[:-1] + (shape[-1] // (q.block or shape[-1]),)
    f32 = np.float32
    if not math.prod(shape):  # nothing to read: a tensor's scale is the static one, or 1 (the amax of nothing is 0)
        scales = _upload(np.full(sshape, f32(q.scale or 1), np.uint8 if mx else f32), like) if not sshape \
            else _empty(like, sshape, np.uint8 if mx else f32)
    else:
        scales = _empty(like, sshape, np.uint8 if mx else f32)
        _run_quant(fname, compute, nin, params, dtype, q, descs, shape, codes, scales,
                   (f32(q.qmax), f32(np.inf if q.scale_ub is None else q.scale_ub),
                    f32(0 if q.amax_floor is None else q.amax_floor), np.int32(q.pow2)), like)
    if q.dtype != "int8":
        codes = _q_view(like, codes, q.dtype)
    if mx:
        scales = _q_view(like, scales, "float8_e8m0fnu")
    return codes, scales


def _run_quant(fname: str, compute: str, nin: int, params: tuple, dtype: str, q: Any, descs: list[_Desc],
               shape: tuple[int, ...], codes: Any, scales: Any, qargs: tuple, like: Any) -> None:
    """Launch the quantizing kernels over descs (rows x n after merging leading dims; one launch per index of
    the dims that do not merge) into codes and scales."""
    sim = _simulating()
    block = (2 * _SIM_BLOCK) if sim else _BLOCK
    n = shape[-1] if shape else 1
    total = math.prod(shape)
    eshape = shape if shape else (1,)
    descs = [_view(d, eshape, list(d.strides) if d.strides else [0]) for d in descs]
    outer, sts, rows = _q_rows(descs, eshape)
    cd, sd = _Desc(codes), _Desc(scales)
    nsc = max(math.prod(sd.shape), 1)
    with _OnDevice(like), _quiet():
        stream = _stream_for(descs)
        cflat = _flat(cd, cd.ptr, total)
        sflat = _flat(sd, sd.ptr, nsc)
        # each input: one flat base array over all it touches (negative strides included)
        bases, offs0 = [], []
        for d in descs:
            lo = sum((m - 1) * s for m, s in zip(eshape, d.strides, strict=True) if s < 0)
            hi = sum((m - 1) * s for m, s in zip(eshape, d.strides, strict=True) if s > 0)
            bases.append(_flat(d, d.ptr + lo * d.dtype.itemsize, hi - lo + 1))
            offs0.append(-lo)
        launches = []  # (input offsets, first row) per index of the outer dims beyond the last
        for idx in np.ndindex(*outer[:-1]):
            offs = [o + sum(i * s for i, s in zip(idx, st[:-1], strict=False))
                    for o, st in zip(offs0, sts, strict=True)]
            first = (int(np.ravel_multi_index(idx, outer[:-1])) if idx else 0) * rows
            launches.append((offs, first))
        def ins_args(offs: list[int]) -> list[Any]:
            args: list[Any] = []
            for k in range(nin):
                args += [bases[k], offs[k], sts[k][-1], descs[k].strides[-1] if shape else 0]
            return args

        target = q.dtype
        if q.granularity == "tensor":
            word_arr = _empty(like, (1,), np.int32)
            wd = _Desc(word_arr)
            word = _flat(wd, wd.ptr, 1)
            static = q.scale is not None
            if not static:
                _zero_word()[1, 32, stream](word)
                k = _quant_jit(fname, compute, nin, len(params), "amax", dtype, "int8", block)  # no codes: one kernel
                for offs, _ in launches:
                    k[_q_grid(rows * n, block), block, stream](*ins_args(offs), word, rows, n, *params)
            k = _quant_jit(fname, compute, nin, len(params), "apply", dtype, target, block)
            for offs, first in launches:
                k[_q_grid(rows * n, block), block, stream](
                    *ins_args(offs), cflat, sflat, word, rows, n, first, *params, *qargs,
                    np.float32(q.scale or 0), np.int32(static))
            return
        g = q.block or n
        spr = n // g
        width = 32 if q.block else block
        kind = "mx" if q.granularity == "mx" else "seg"
        emax = {"float8_e4m3fn": 8, "float8_e5m2": 15}.get(q.dtype, 0)
        k = _quant_jit(fname, compute, nin, len(params), kind, dtype, target, width)
        for offs, first in launches:
            k[_q_grid(rows * spr * width, block), block, stream](
                *ins_args(offs), cflat, sflat, rows, n, g, spr, first, *params, *qargs, np.int32(emax),
                np.int32(q.rule == "floor"))


def _q_grid(threads: int, block: int) -> int:
    if _simulating():
        return max(1, min(_SIM_GRID, -(-threads // block)))
    return max(1, min(-(-threads // block), _sms() * 32))


# ---- every kernel the backend can launch, for compiling without a GPU ----------------------------------------------


class Build(NamedTuple):
    """One kernel as `_run` / `_reduce` launch it: the Python function and the numba types of its arguments;
    `dispatcher()` is the cached `cuda.jit` dispatcher that launches it on a GPU."""

    name: str
    source: str  # the formula (or helper kernel) it is built from
    layout: str  # "contiguous" or "strided"
    dtype: str  # of the arrays
    compute: str  # what the formula computes in
    uses: tuple[str, ...]  # the calls that launch it
    pyfunc: Callable
    argtypes: tuple
    dispatcher: Callable[[], Any]
    family: str = ""  # a composite family's kernel ("gated"), else ""


_ELEMENTWISE = tuple(d for d in _DIRECTIONS if d != "param_grad")


def _elementwise_uses() -> dict[tuple[str, str, int, str], list[str]]:
    """(formula, compute, inputs, dtype) -> the calls that launch that kernel, as kernel() resolves them."""
    uses: dict[tuple[str, str, int, str], list[str]] = {}
    for key, spec in _KEYS.items():
        weights = sum(p.kind == "array" for p in spec.params)  # prelu's weight: one more broadcast operand
        for direction, dtype in itertools.product((*_ELEMENTWISE, "backward2"), _DTYPES):
            if supports(key, direction, dtype):  # backward2: (g, dy, x), no weight (prelu's f'' is 0)
                nin = 3 if direction == "backward2" else (1 if direction == "forward" else 2) + weights
                k = (_F.formula_name(key, direction), _compute(key, direction, dtype), nin, dtype)
                uses.setdefault(k, []).append(f"{key} {direction}")
    return uses


def _arg_types(dtype: str, contiguous: bool, nin: int) -> tuple:
    """The numba types of an elementwise launch in `_run`: flat 1-D arrays, Python ints and tuples, two floats."""
    from numba import types

    arr, i64, f64 = types.Array(getattr(types, dtype), 1, "C"), types.int64, types.float64
    if contiguous:
        return (arr,) * (nin + 1) + (f64, f64)
    t4 = types.UniTuple(i64, 4)
    return (arr, i64, t4) * (nin + 1) + (t4, f64, f64)


def _reduction_types(dtype: str) -> tuple:
    """The numba types of a `_reduce` launch: dy, x and the float64 accumulator, each base + offset + strides."""
    from numba import types

    arr, acc, i64 = types.Array(getattr(types, dtype), 1, "C"), types.Array(types.float64, 1, "C"), types.int64
    t4 = types.UniTuple(i64, 4)
    return (arr, i64, t4, arr, i64, t4, acc, i64, t4, t4, types.float64)


def _quant_builds() -> list[Build]:
    """The quantizing kernels (quant=): every elementwise forward and backward formula's group kernel (float32
    data, e4m3fn); for silu every kind (group, row, MX, tensor amax and apply) x target x input dtype; the gated
    family's group kernel for every gated key in float16 data."""
    from numba import types  # noqa: F401 - _quant_arg_types imports it too

    picks: list[tuple[str, str, str, str, int]] = []  # (key, kind, dtype, target, width)
    backward: list[tuple[str, str]] = []  # (key, direction): the backwards (dy and x, or dy and y) a group kernel too
    for key in _KEYS:
        if _quant_formula(key, None, "float32") is not None:
            picks.append((key, "seg", "float32", "float8_e4m3fn", 32))
        backward += [(key, d) for d in _Q_DIRECTIONS[1:] if _quant_formula(key, None, "float32", d) is not None]
    for dtype, target in itertools.product(vocab.DTYPE_NAMES, _Q_TARGETS):
        picks += [("silu", "seg", dtype, target, 32), ("silu", "seg", dtype, target, _BLOCK),
                  ("silu", "apply", dtype, target, _BLOCK)]
        if target != "int8":
            picks.append(("silu", "mx", dtype, target, 32))
        if target == "int8":
            picks.append(("silu", "amax", dtype, target, _BLOCK))
    picks += [(key, "seg", "float16", "float8_e4m3fn", 32) for key in _FAMILY_KEYS
              if _quant_formula(key, None, "float16")]
    out, seen = [], set()
    jobs = [(*pick, "forward") for pick in picks] + [(key, "seg", "float32", "float8_e4m3fn", 32, d)
                                                      for key, d in backward]
    for key, kind, dtype, target, width, direction in jobs:
        _, compute, params, fname = _quant_formula(key, None, dtype, direction)
        nin = 2 if key in _FAMILY_KEYS or direction != "forward" else 1
        args = (fname, compute, nin, len(params), kind, dtype, target, width)
        tag = {"seg": f"group{width}" if width == 32 else "row", "mx": "mx", "amax": "amax", "apply": "tensor"}[kind]
        name = f"quant:{fname}.{tag}.{'any' if kind == 'amax' else target}.{dtype}.strided"
        if name in seen:
            continue
        seen.add(name)
        out.append(Build(name, f"quant:{fname}.{tag}", "strided", dtype, compute, (f"{key} {direction} quant=",),
                         _quant_py(*args), _quant_arg_types(kind, nin, len(params), dtype, target),
                         lambda args=args: _quant_jit(*args), family="quant"))
    return out


def builds() -> list[Build]:
    """Every kernel this backend can launch (each formula x inputs x layout x dtype, the reductions, the
    gated and bias_act families, fill and cast), for `cuda.compile_ptx` on a machine without a GPU
    (scripts/cuda_ptx_report.py)."""
    from numba import types

    if _simulating():
        raise RuntimeError("builds() compiles for a GPU: unset NUMBA_ENABLE_CUDASIM")
    out = []
    for (formula, compute, nin, dtype), uses in _elementwise_uses().items():
        for layout in ("contiguous", "strided"):
            args = (formula, compute, nin, layout == "contiguous")
            out.append(Build(f"{formula}.{dtype}.{layout}", formula, layout, dtype, compute, tuple(uses),
                             _elementwise_py(*args), _arg_types(dtype, layout == "contiguous", nin),
                             lambda args=args: _elementwise(*args)))
    for key, spec in _KEYS.items():
        if spec.has("param_grad"):
            src = f"{key}_param_grad"
            for dtype in _DTYPES:
                out.append(Build(f"{src}.{dtype}.strided", src, "strided", dtype, "float64", (f"{key} param_grad",),
                                 _reducer_py(key), _reduction_types(dtype), lambda key=key: _reducer(key)))
    for key, direction, dtype in _family_builds():
        nin, nout = _FAMILY_IO[direction]
        compute = _family_compute(key, direction, dtype)
        for layout in ("strided", "contiguous"):
            args = (key, direction, compute, layout == "contiguous")
            out.append(Build(f"{key}.{direction}.{dtype}.{layout}", key, layout, dtype, compute,
                             (f"{key} {direction}",), _family_py(*args),
                             _family_arg_types(dtype, layout == "contiguous", nin + nout),
                             lambda args=args: _family_jit(*args), family=key.split(":", 1)[0]))
    for (key, direction, dtype), layout in itertools.product(_bias_builds(), _BIAS_LAYOUTS):
        compute = _bias_compute(key, direction, dtype)
        args = (key, direction, compute, layout)
        # the backward's kernels sum db / dscale in float64 (the "_db_sums" allowance of the PTX report)
        src = key if direction == "forward" else f"{key}.{direction}_db_sums"
        out.append(Build(f"{key}.{direction}.{dtype}.{layout}", src, layout, dtype, compute, (f"{key} {direction}",),
                         _bias_py(*args), _bias_arg_types(dtype, direction, layout),
                         lambda args=args: _bias_jit(*args), family="bias_act"))
    for dtype in _DTYPES:
        out.append(Build(f"bias_act_db_sums.{dtype}.contiguous", "bias_act_db_sums", "contiguous", dtype, "float64",
                         ("bias_act backward", "bias_act backward_y"), _bias_sums_py(), _bias_sums_types(dtype),
                         _bias_sums_jit))
    out += _quant_builds()
    acc = types.Array(types.float64, 1, "C")
    fill, cast = _fill_cast_py()
    out.append(Build("fill.float64.contiguous", "fill", "contiguous", "float64", "float64", ("param_grad",), fill,
                     (acc,), lambda: _fill_cast()[0]))
    for dtype in _DTYPES:
        out.append(Build(f"cast.{dtype}.contiguous", "cast", "contiguous", dtype, "float64", ("param_grad",), cast,
                         (acc, types.Array(getattr(types, dtype), 1, "C")), lambda: _fill_cast()[1]))
    return out


__all__ = ["NAME", "PRIORITY", "KINDS", "available", "info", "supports", "kernel", "empty_like", "builds", "quantized",
           "e4m3fn_bits", "e5m2_bits"]
