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

from . import _arrays, checks, registry
from ._config import get_num_threads as threads

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


class Hit:
    """A resolved call: the kernel, its checked parameters, the backend module that runs it, what it is (for a
    note on a kernel's error); `at`, for a call cached for tensors whose kernel runs on raw addresses, the
    (entry, handle) pair that does so, else None."""

    __slots__ = ("kernel", "p", "mod", "what", "at")

    def __init__(self, kernel: Any, p: dict, mod: Any, what: str):
        self.kernel, self.p, self.mod, self.what, self.at = kernel, p, mod, what, None

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
    full = (plan.direction, dtype, *terms, plan.backend, registry.preference_key())
    if len(table) < 1024:
        table[full] = hit


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
