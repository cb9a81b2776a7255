"""The hot path: calls seen before, on plain NumPy arrays or plain CPU tensors, run their cached kernel.

The call core (multiact.core) remembers a plain call of a plan that names a cache (`Plan.cache`), keyed by
(direction, dtype, *parameter keys, backend, use() scope); the generated functions (multiact.api,
multiact.torch) look the key up and, on a hit, make the checked path's checks of their arrays (one dtype and
shape, `checks.check_out` of a destination, the version counter bumped after a write) and run the kernel.
Anything the hot path cannot vouch for goes back to the checked path (MISS).  registry.clear_cache empties
the caches (and re-reads MULTIACT_BACKEND).

Plain CPU tensors (type torch.Tensor, not a subclass: Parameter, FakeTensor and the like take the checked path)
run on NumPy views of their memory (bfloat16: seen as int16, then as ml_dtypes.bfloat16), or, where the kernel
takes addresses (the native elementwise kernels' `at`) and the tensor is contiguous, on its address.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _arrays, _config, checks, registry, vocab
from ._config import get_num_threads as threads

try:  # the C hot path (native/hotpath/hotpath.c); without it the Python one below does the same
    from . import _hotpath as C
except ImportError:
    C = None
else:
    C.setup(registry.scope_var, _config)

# Per-op caches: (direction, dtype, *parameter keys, backend, use() scope) -> Hit.  Only what depends on the
# op, direction, dtype and parameter values is kept; every check of the call's arrays is made on each call.
_caches: dict[str, dict[tuple, Any]] = {}


def cache(name: str) -> dict[tuple, Any]:
    """The hot-path cache of one op (the generated functions hold it)."""
    return _caches.setdefault(name, {})


@registry.on_clear
def clear() -> None:
    for c in _caches.values():
        c.clear()
    if C is not None:
        C.invalidate()  # what the C hot path remembers of the caches


class Hit:
    """A resolved call: the kernel, its checked parameters, the backend module that runs it, what it is (for a
    note on a kernel's error); `at`, for a call cached for tensors whose kernel runs on raw addresses, the
    (entry, handle) pair that does so, else None; `c`, where the C hot path is built and the kernel runs on
    raw addresses, its `_hotpath.Native` (the C hot path runs only hits that have one), else None."""

    __slots__ = ("kernel", "p", "mod", "what", "at", "c")

    def __init__(self, kernel: Any, p: dict, mod: Any, what: str):
        self.kernel, self.p, self.mod, self.what, self.at, self.c = kernel, p, mod, what, None, None

    def call(self, *args: Any) -> Any:
        """Run the kernel on args; an error keeps its type and gains a note naming the backend and the call."""
        try:
            return self.kernel(*args, self.p)
        except Exception as e:
            annotate(e, self)
            raise


def annotate(e: BaseException, hit: Hit) -> None:
    """Name the backend and the call on an error from a kernel (its type is kept)."""
    if hasattr(e, "add_note"):
        e.add_note(f"multiact: raised by backend {hit.mod.NAME!r} running {hit.what}")


def remember(plan: Any, job: Any, mod: Any, kernel: Any, arrs: dict[str, np.ndarray]) -> None:
    """Store a plain call of a plan that names a cache where the generated functions will find it: calls on
    plain NumPy arrays used as given (not converted: a byte-swapped input is copied), or on plain CPU tensors."""
    key = getattr(plan, "cache", None)
    if key is None:
        return
    table, terms = key
    named = plan.arrays
    out = plan.out
    hit = Hit(kernel, job.p, mod, f"{plan.what} {plan.direction} in {checks.dtype_name(job.dtype)}")
    if _plain(named, out) and all(arrs[n] is a for n, a in named.items()):
        dtype = job.dtype
    elif _plain_tensors(named, out):
        at = getattr(kernel, "at", None)
        hit.at = None if at is None else at(job.p)
        dtype = next(iter(named.values())).dtype
    else:
        return
    native = getattr(kernel, "native", None)
    if C is not None and native is not None:
        hit.c = C.Native(*native(job.p), dtype)
    full = (plan.direction, dtype, *terms, plan.backend, registry.preference_key())
    if len(table) < 1024:
        table[full] = hit


def c_op(spec: Any, form: str) -> Any:
    """The C hot path of one generated function (form "forward": ma.<op>, "grad": ma.<op>_grad, "torch":
    multiact.torch.<op>) over the op's cache; its parameters' kinds in order (n: a number, c: a choice)."""
    kinds = "".join("c" if p.kind == "choice" else "n" for p in spec.params)
    return C.Op(cache(spec.name), form, kinds)


def _plain(named: dict[str, Any], out: Any) -> bool:
    """Only calls on plain NumPy arrays are remembered for the NumPy hot path (which takes nothing else)."""
    return (out is None or type(out) is np.ndarray) and all(type(a) is np.ndarray for a in named.values())


# ---- tensors ---------------------------------------------------------------------------------------------

TENSOR: list[Any] = [None]  # torch.Tensor once torch is imported (the generated functions' type test)
MISS = object()  # the hot path cannot vouch for this call: take the checked path
BF16: list[Any] = [None]
STRIDED: list[Any] = [None]
EMPTY_LIKE: list[Any] = [None]


def _torch_ready() -> None:
    torch = sys.modules["torch"]
    TENSOR[0], BF16[0], STRIDED[0], EMPTY_LIKE[0] = torch.Tensor, torch.bfloat16, torch.strided, torch.empty_like
    if C is not None:
        tc = torch._C
        try:
            C.set_torch(torch.Tensor, torch.compiler, torch.empty_like, torch.strided,
                        (getattr(tc, "TensorBase", None) or tc._TensorBase).is_neg, tc.is_grad_enabled, tc._is_tracing,
                        tc._are_functorch_transforms_active, tc._is_torch_function_mode_enabled,
                        tc._len_torch_dispatch_stack)
        except AttributeError:  # a torch without one of them: tensors take the Python hot path
            return
        _set_shim(torch)


# The C hot path reads a tensor's dtype, device, layout, contiguity, address and size through libtorch's
# AOTInductor C shim (aoti_torch_*: a C ABI that torch keeps stable for compiled models), whose handle of a
# tensor is a pointer to its at::Tensor (one pointer: the TensorImpl, `_cdata`): a few nanoseconds each, where
# each Python attribute costs some 50.  The at::Tensor is read in place in the tensor's Python object (torch's
# THPVariable: PyObject_HEAD, then the at::Tensor) where that holds for probe tensors, else copied from
# `_cdata`.  It makes its results with the shim's empty_strided (a's sizes and strides, as torch.empty_like
# makes them for a dense tensor) and torch's own THPVariable_Wrap (libtorch_python's C++ entry point that every
# torch extension's tensor return goes through): a third of torch.empty_like's time from Python.  Each part is
# used only where it is found and gives, on probe tensors of every layout, what torch's Python API says;
# otherwise the C hot path reads the Python attributes (and calls torch.empty_like).
_SHIM_FUNCTIONS = ("get_data_ptr", "get_numel", "get_dim", "get_dtype", "get_device_type", "get_layout",
                   "is_contiguous", "get_sizes", "get_strides", "get_device_index", "empty_strided",
                   "delete_tensor_object")
_WRAP = "_Z16THPVariable_WrapRKN2at10TensorBaseE"  # THPVariable_Wrap(const at::TensorBase&), Itanium C++ ABI


def _torch_lib(torch: Any, stem: str) -> Any:
    import ctypes
    import os

    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
        path = os.path.join(libdir, name)
        if os.path.exists(path):
            return ctypes.CDLL(path)
    return None


def _set_shim(torch: Any) -> None:
    import ctypes

    SHIM[0] = "python attributes"
    try:
        lib = _torch_lib(torch, "torch_cpu")
        if lib is None:
            return
        fns = tuple(ctypes.cast(getattr(lib, "aoti_torch_" + g), ctypes.c_void_p).value for g in _SHIM_FUNCTIONS)

        def const(name: str) -> int:
            f = getattr(lib, "aoti_torch_" + name)
            f.restype, f.argtypes = ctypes.c_int32, []
            return int(f())

        dtypes = {const(f"dtype_{d}"): getattr(torch, d) for d in vocab.DTYPE_NAMES}
        args = (fns, dtypes, const("device_type_cpu"), const("layout_strided"))
        for in_place in (True, False):
            C.set_shim(*args, in_place, None)
            if _shim_agrees(torch, dtypes):
                SHIM[0] = "AOTI shim" + (" (in place)" if in_place else " (_cdata)")
                break
        else:
            C.set_shim()
            return
        try:
            py = _torch_lib(torch, "torch_python")
            wrap = None if py is None else ctypes.cast(getattr(py, _WRAP), ctypes.c_void_p).value
        except AttributeError:
            wrap = None
        if wrap is not None:
            C.set_shim(*args, in_place, wrap)
            if _shim_makes_tensors(torch):
                SHIM[0] += ", results by THPVariable_Wrap"
            else:
                C.set_shim(*args, in_place, None)
    except Exception:  # noqa: BLE001 - any doubt: the Python attributes
        SHIM[0] = "python attributes"
        C.set_shim()


SHIM = ["none"]  # how the C hot path reads and makes tensors (for the tests)


def _shim_makes_tensors(torch: Any) -> bool:
    """Whether the shim's new tensors are what torch.empty_like makes (type, dtype, sizes, strides, device, no
    grad, a fresh version counter, only the caller's reference) at the address it says, and hold values."""
    import sys as _sys

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for t in (base, base[1:], base.reshape(2, 3, 4), torch.zeros(()), torch.empty(0), base[:1], base.t()[:1],
              base.to(torch.bfloat16), base.to(torch.float16), base.double(), base.clone().requires_grad_()):
        got = C.probe_empty(t)
        if got is None:
            continue
        y, addr = got
        del got
        want = torch.empty_like(t)
        if (type(y) is not torch.Tensor or y.dtype != want.dtype or y.shape != want.shape or y.device != want.device
                or y.stride() != want.stride() or y.requires_grad or y._version != 0 or _sys.getrefcount(y) != 2):
            return False
        if y.numel() and y.data_ptr() != addr:
            return False
        y.copy_(t.detach())
        if not torch.equal(y, t.detach()):
            return False
    return True


def _shim_agrees(torch: Any, dtypes: dict) -> bool:
    """Whether the shim reads, on tensors of every kind the hot path meets, what torch's Python API says."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    probes = [base, base[1:], base[:, 2:], base.t(), base[::2], base[:1].expand(3, 6), base.reshape(-1)[5:],
              torch.empty(0), torch.zeros(()), torch._neg_view(base), torch.arange(6), base.to_sparse(),
              torch.empty(3, device="meta"), base.clone().requires_grad_()]
    probes += [base.to(d) for d in dtypes.values()]
    for t in probes:
        if C.tensor_impl(t) != t._cdata:
            return False
        got = C.probe(t)
        if got is None:
            return False
        dtype, cpu, strided, direct, addr, numel, shape = got
        want_strided = t.layout is torch.strided
        want_dtype = t.dtype if t.dtype in dtypes.values() else None
        want_direct = t.is_cpu and want_strided and t.is_contiguous() and not t.is_neg()
        if (dtype, bool(cpu), bool(strided), bool(direct)) != (want_dtype, t.is_cpu, want_strided, want_direct):
            return False
        if direct and (addr, numel, shape) != (t.data_ptr(), t.numel(), tuple(t.shape)):
            return False
    return True


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
    if a.dtype is BF16[0]:
        return _arrays.bf16_view(a.detach())
    return a.detach().numpy() if a.requires_grad else a.numpy()


def direct_test(t: str) -> str:
    """The test (Python source, on the CPU tensor named t) that its memory can go to a kernel as one address
    (`Hit.at`): strided layout (not sparse or mkldnn), contiguous, and no lazy negation bit (which numpy()
    refuses, and an address would silently ignore); anything else takes NumPy views, whose refusals are the
    checked path's.  The generated functions inline it (names STRIDED as _STRIDED)."""
    return f"{t}.layout is _STRIDED[0] and {t}.is_contiguous() and not {t}.is_neg()"


_direct = eval(f"lambda a: {direct_test('a')}", {"_STRIDED": STRIDED})  # noqa: S307 - a constant expression


def eager_forward(hit: Hit, x: Any) -> Any:
    """multiact.torch's autograd path: the cached forward on a plain CPU tensor x that requires grad
    (the caller checked type, device and cache key); the result's dtype is x's."""
    if hit.c is not None:  # the C hot path: None where x is not one plain address
        y = C.run(hit.c, x)
        if y is not None:
            return y
    y = EMPTY_LIKE[0](x)
    at = hit.at
    try:
        if at is not None and _direct(x):
            at[0](at[1], x.data_ptr(), y.data_ptr(), y.numel(), threads())
        else:  # a lazily negated x computes as torch's own ops do: on its value
            hit.kernel(_view(x.resolve_neg()), _view(y), hit.p)
    except Exception as e:
        annotate(e, hit)
        raise
    return y


def eager_backward(hit: Hit, g: Any, x: Any) -> Any:
    """multiact.torch's autograd path: the cached backward for autograd's gradient g of a forward on x (the
    engine checked g's shape and dtype against the output, which are x's); MISS where g is unusual."""
    if hit.c is not None:  # the C hot path: None where g and x are not plain addresses of x's dtype
        y = C.run(hit.c, g, x)
        if y is not None:
            return y
    if type(g) is not TENSOR[0] or not g.is_cpu or g.dtype is not x.dtype:
        return tensor_hot(hit, "", ("dy", "x"), (g, x), None) if type(g) is TENSOR[0] else MISS
    y = EMPTY_LIKE[0](x)
    at = hit.at
    try:
        if at is not None and _direct(g) and _direct(x):
            at[0](at[1], g.data_ptr(), x.data_ptr(), y.data_ptr(), y.numel(), threads())
        else:
            hit.kernel(_view(g.resolve_neg()), _view(x.resolve_neg()), _view(y), hit.p)
    except Exception as e:
        annotate(e, hit)
        raise
    return y


def tensor_hot(hit: Hit, fn: str, names: tuple[str, ...], ins: tuple, out: Any) -> Any:
    """Run a cached call on plain CPU tensors (ins[-1] is the array whose dtype and shape the result
    takes; the generated function checked its type); MISS where the checked path must decide (another
    device, dtype or shape, an out= it refuses).  A result it allocates goes to the kernel as an address
    with contiguous inputs where the kernel allows (`Hit.at`), else as NumPy views like the inputs."""
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
        y = EMPTY_LIKE[0](like)  # torch's allocation (a little cheaper than NumPy's, and resizable)
        try:
            if at is not None:
                at[0](at[1], like.data_ptr(), y.data_ptr(), y.numel(), threads())
            elif dt is BF16[0]:
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
            y = EMPTY_LIKE[0](like)
            try:
                at[0](at[1], a.data_ptr(), like.data_ptr(), y.data_ptr(), y.numel(), threads())
            except Exception as e:
                annotate(e, hit)
                raise
            return y
    arrs = (_view(like),) if len(ins) == 1 else (_view(ins[0]), _view(like))
    if out is None:
        y = EMPTY_LIKE[0](like)
        hit.call(*arrs, _view(y))
        return y
    if type(out) is not TENSOR[0] or out.dtype != dt or not out.is_cpu:
        return MISS
    res = _arrays.as_host_array(out, f"{fn}: out", writeable=True)  # refuses an out that requires grad
    checks.check_out(fn, res, dict(zip(names, arrs, strict=True)), arrs[-1])
    hit.call(*arrs, res)
    _arrays.mark_written(out)
    return out
