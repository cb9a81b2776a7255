"""The backend registry: which backends exist, which can run here, and which runs a call.

A backend is a module `multiact.backend.<name>_backend` that satisfies `Backend` below (a test
checks every one).  Modules import nothing heavy until a kernel is asked for.

Selection order: explicit `backend=` (strict) > `use(...)` scopes, innermost
first > MULTIACT_BACKEND > the array's kind and priority among available
backends that support (kernel key, direction, dtype).  A backend named by `use` or the
environment must be available; one that lacks the kernel, dtype or array kind is
passed over unless `only=True`.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .errors import BackendError


@runtime_checkable
class Backend(Protocol):
    """What a backend module provides (the contract every `multiact.backend.*_backend` satisfies).

    Kernels are asked for by kernel key (`OpDef.kernel_key`: the op's name, or its variant's, such as
    gelu_tanh), resolved once per call by dispatch.  A kernel takes the arrays (inputs, then out) and
    the checked parameters: `kernel(x, out, p)`, `kernel(dy, x_or_y, out, p)`; a parameter gradient
    `kernel(dy, x, p)` returns its float64 sum.
    """

    NAME: str
    PRIORITY: int  # higher wins among automatic choices; 0: only when asked for
    KINDS: tuple[str, ...]  # the array kinds it runs on ("numpy", "cuda", "npu", ...)

    def available(self) -> tuple[bool, str]:
        """(ok, reason); never raises."""

    def info(self) -> dict[str, Any]:
        """ISA, devices, versions: what `ma.backends()` shows."""

    def supports(self, key: str, direction: str, dtype: str) -> bool:
        """Whether it has this kernel."""

    def kernel(self, key: str, direction: str, dtype: str) -> Callable[..., Any]:
        """The kernel (raises if unsupported)."""


# Every backend of the design (shared/DESIGN.md), built here or not; the registry reports all of them.
BACKEND_NAMES = ("native", "numba", "numpy", "cuda", "onnxruntime", "ascend")


@dataclass(frozen=True)
class BackendInfo:
    """What `backends()` reports about one backend."""

    name: str
    available: bool
    reason: str
    priority: int = 0
    kinds: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)


class _Missing:
    """Stands in for a backend module that is not part of this build."""

    PRIORITY = 0
    KINDS: tuple[str, ...] = ()

    def __init__(self, name: str, why: str):
        self.NAME, self._why = name, why

    def available(self) -> tuple[bool, str]:
        return False, self._why

    def info(self) -> dict:
        return {}

    def supports(self, op: str, direction: str, dtype: str) -> bool:
        return False

    def kernel(self, op: str, direction: str, dtype: str) -> Callable:
        raise BackendError(f"backend {self.NAME!r} is not available: {self._why}")


_modules: dict[str, Any] = {}
_avail: dict[str, tuple[bool, str]] = {}
_lock = threading.Lock()


def check_name(name: Any) -> str:
    """name, or ValueError listing the valid backend names."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKEND_NAMES)}")
    return name


def module(name: str) -> Any:
    """The backend module (imported once), or a stand-in that says why there is none."""
    mod = _modules.get(name)
    if mod is None:
        check_name(name)
        modname = f"multiact.backend.{name}_backend"
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            why = "not built in this version of multiact" if e.name == modname else f"needs {e.name!r} ({e})"
            mod = _Missing(name, why)
        except Exception as e:  # a broken backend must not break the registry
            mod = _Missing(name, f"failed to import: {type(e).__name__}: {e}")
        _modules[name] = mod
    return mod


def availability(name: str) -> tuple[bool, str]:
    """(ok, reason), detected once per process."""
    res = _avail.get(name)
    if res is None:
        try:
            res = tuple(module(name).available())
        except Exception as e:  # available() must never raise; if it does, say so
            res = (False, f"detection failed: {type(e).__name__}: {e}")
        _avail[name] = res
    return res


def backends() -> list[BackendInfo]:
    """Every backend of the design, available or not, with the reason and its ISA/devices."""
    out = []
    for name in BACKEND_NAMES:
        mod = module(name)
        ok, why = availability(name)
        details: dict[str, Any] = {}
        if ok:
            try:
                details = dict(mod.info())
            except Exception as e:
                details = {"info_error": f"{type(e).__name__}: {e}"}
        devices = tuple(str(d) for d in details.pop("devices", ()))
        out.append(BackendInfo(name, ok, why, mod.PRIORITY, tuple(mod.KINDS), devices, details))
    return out


# ---- scoped preference -----------------------------------------------------

_scope: contextvars.ContextVar[tuple[tuple[str, bool], ...]] = contextvars.ContextVar("multiact_use", default=())


@contextlib.contextmanager
def use(name: str, *, only: bool = False) -> Iterator[None]:
    """Prefer backend `name` inside the block (nestable, per thread and task).

    With only=True a call it cannot run is an error instead of falling through.
    """
    check_name(name)
    token = _scope.set(_scope.get() + ((name, only),))
    try:
        yield
    finally:
        _scope.reset(token)


# The scope part of a cache key: `use(...)` preferences in force here (a tuple, hashable).  The
# MULTIACT_BACKEND part never changes between clear_cache() calls, which clear every cache keyed on it.
preference_key: Callable[[], tuple[tuple[str, bool], ...]] = _scope.get
scope_var = _scope  # the same, as the C hot path reads it (multiact._hotpath)

_env_backend = os.environ.get("MULTIACT_BACKEND", "").strip()
_on_clear: list[Callable[[], None]] = []


def on_clear(fn: Callable[[], None]) -> Callable[[], None]:
    """Register a cache of a higher layer (dispatch's hot path) to be emptied by clear_cache()."""
    _on_clear.append(fn)
    return fn


def _preferences() -> tuple[tuple[tuple[str, bool], ...], str]:
    """Scoped preferences, innermost first, and MULTIACT_BACKEND (read at import and by clear_cache)."""
    return tuple(reversed(_scope.get())), _env_backend


# ---- selection --------------------------------------------------------------

_cache: dict[tuple, tuple[Any, tuple[str, ...]]] = {}


_kernels: dict[tuple, tuple[Any, Callable]] = {}


def resolve(op: str, direction: str, dtype: str, kind: str, explicit: str | None = None) -> tuple[Any, Callable]:
    """(backend module, kernel) for one call: the hot path, one dictionary lookup when cached."""
    key = (op, direction, dtype, kind, explicit, _scope.get(), _env_backend)
    hit = _kernels.get(key)
    if hit is None:
        mod, _ = select(op, direction, dtype, kind, explicit)
        hit = (mod, mod.kernel(op, direction, dtype))
        with _lock:
            _kernels[key] = hit
    return hit


def _runs(mod: Any, op: str, direction: str, dtype: str, kind: str) -> str | None:
    """None if mod can run the call, else why not."""
    if kind not in mod.KINDS:
        return f"does not run on {kind} arrays"
    try:
        if not mod.supports(op, direction, dtype):
            return f"has no {op} {direction} kernel for {dtype}"
    except Exception as e:
        return f"support check failed: {type(e).__name__}: {e}"
    return None


def _unavailable(name: str, how: str) -> BackendError:
    return BackendError(f"backend {name!r} ({how}) is not available: {availability(name)[1]}")


def select(op: str, direction: str, dtype: str, kind: str, explicit: str | None = None) -> tuple[Any, tuple[str, ...]]:
    """(backend module, reasons) for one call; cached per call shape and preferences."""
    prefs, env = _preferences()
    key = (op, direction, dtype, kind, explicit, prefs, env)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    res = _select(op, direction, dtype, kind, explicit, prefs, env)
    with _lock:
        _cache[key] = res
    return res


def _select(op, direction, dtype, kind, explicit, prefs, env):
    if explicit is not None:
        check_name(explicit)
        if not availability(explicit)[0]:
            raise _unavailable(explicit, "backend=")
        why = _runs(module(explicit), op, direction, dtype, kind)
        if why:
            raise BackendError(f"backend {explicit!r} (backend=) cannot run this call: it {why}")
        return module(explicit), (f"{explicit}: asked for with backend=",)

    notes = []
    chain = [(name, only, "ma.use") for name, only in prefs]
    if env:
        if env not in BACKEND_NAMES:
            raise ValueError(f"MULTIACT_BACKEND={env!r} is not a backend; valid: {', '.join(BACKEND_NAMES)}")
        chain.append((env, False, "MULTIACT_BACKEND"))
    for name, only, how in chain:
        if not availability(name)[0]:
            raise _unavailable(name, how)
        why = _runs(module(name), op, direction, dtype, kind)
        if why is None:
            return module(name), tuple(notes) + (f"{name}: preferred by {how}",)
        if only:
            raise BackendError(f"backend {name!r} ({how}, only=True) cannot run this call: it {why}")
        notes.append(f"{name} (preferred by {how}) skipped: it {why}")

    ranked = sorted((module(n) for n in BACKEND_NAMES), key=lambda m: -m.PRIORITY)
    for mod in ranked:
        if mod.PRIORITY <= 0 or kind not in mod.KINDS:
            continue
        ok, reason = availability(mod.NAME)
        if not ok:
            notes.append(f"{mod.NAME} skipped: not available ({reason})")
            continue
        why = _runs(mod, op, direction, dtype, kind)
        if why:
            notes.append(f"{mod.NAME} skipped: it {why}")
            continue
        return mod, tuple(notes) + (f"{mod.NAME}: highest-priority available backend for {kind} arrays",)
    detail = "; ".join(notes) or "no backend runs on this kind of array"
    raise BackendError(f"no backend can run {op} {direction} in {dtype} on {kind} arrays ({detail})")


def clear_cache() -> None:
    """Forget detections, choices and MULTIACT_BACKEND (re-read it): after installing a backend, in tests."""
    global _env_backend
    for fn in _on_clear:
        fn()
    with _lock:
        _cache.clear()
        _kernels.clear()
        _avail.clear()
        _modules.clear()
        _env_backend = os.environ.get("MULTIACT_BACKEND", "").strip()
