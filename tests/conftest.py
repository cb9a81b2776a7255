"""Shared fixtures: which backends this machine can test, and how to reach each array kind."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import multiact as ma

# tests/cuda needs the CUDA simulator switched on before numba is imported: it runs in a process of
# its own, started by tests/test_cuda_simulator.py (or directly with `pytest tests/cuda`).
collect_ignore = [] if any(a.rstrip("/").endswith("cuda") for a in sys.argv) else ["cuda"]


def native_bf16_cvt(lib, ffi) -> tuple[bool, str]:
    """Whether avx512's bfloat16 stores can use vcvtneps2bf16 on this CPU with this build (ma_bf16_cvt_check runs
    there, whatever MULTIACT_NATIVE_BF16_CVT says), and why it is not used now ("" when it is)."""
    return (lib.ma_bf16_cvt_check(0, 0, ffi.NULL) != int(ffi.cast("size_t", -1)),
            ffi.string(lib.ma_bf16_cvt_why()).decode())


def native_kernels():
    """native/kernels.py, the kernel table, loaded by path (it imports only the standard library, and the
    native tests read it whether or not the extension is built); one module for every test file."""
    name = "_multiact_native_kernels"
    if name not in sys.modules:
        import importlib.util
        from pathlib import Path

        path = Path(__file__).resolve().parents[1] / "native" / "kernels.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def host_backends() -> list:
    """Backends to run the shared suite on: available ones that take NumPy arrays.

    MULTIACT_TEST_BACKENDS=a,b narrows it (e.g. CI runs the CUDA simulator separately).
    """
    only = [b for b in os.environ.get("MULTIACT_TEST_BACKENDS", "").split(",") if b]
    out = []
    for info in ma.backends():
        if only and info.name not in only:
            continue
        if "numpy" in info.kinds or (only and info.name in only):
            mark = () if info.available else (pytest.mark.skip(reason=f"{info.name}: {info.reason}"),)
            out.append(pytest.param(info.name, marks=mark, id=info.name))
    return out


def supports(backend: str, op: str, direction: str, dtype: str) -> bool:
    from multiact import registry

    return registry.module(backend).supports(op, direction, str(dtype))


def require(backend: str, op: str, direction: str, dtype: str) -> None:
    """Skip when the backend has no such kernel (the registry would fall through to another)."""
    if not supports(backend, op, direction, dtype):
        pytest.skip(f"{backend} has no {op} {direction} kernel for {dtype} (the registry falls through)")


# Backends whose composite kernels (gated:<act>, bias_act:<act>) are compiled per kernel key at first use,
# seconds each (numba): the default run (CI) holds them to the suite on a sample of the keys; the full
# run is MULTIACT_TEST_FULL=1 (not run in full yet: see the closing note of 2026-12-01).
COMPILED_PER_KEY = ("numba",)
FULL = os.environ.get("MULTIACT_TEST_FULL") == "1"


def composite_sample(keys: list[str]) -> set[str]:
    """The keys a compiled-per-key backend runs in the default run: the named forms' (silu, gelu both ways,
    relu, swish) and every fourth other one, so that each kind of formula appears."""
    named = {k for k in keys if k.split(":", 1)[1] in ("silu", "gelu", "gelu_tanh", "relu", "swish", "linear",
                                                       "leaky_relu")}
    return named | set(keys[::4])


def skip_unless_sampled(backend: str, key: str, keys: list[str]) -> None:
    if backend in COMPILED_PER_KEY and not FULL and key not in composite_sample(keys):
        pytest.skip(f"{backend} compiles each {key.split(':')[0]} kernel at first use; this key runs with "
                    "MULTIACT_TEST_FULL=1")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def spy_one_pass(monkeypatch, mod, hook: str, isa: str | None = None) -> list:
    """Spy a backend module's one-pass hook (`quantized`, `dequantized`): the returned list gets, per call, whether
    the hook answered (False: it left the call to the core's passes).  With `isa`, the native backend runs that ISA's
    kernels, the passes' too (as MULTIACT_NATIVE_ISA does).  The caller clears the registry's cache after."""
    seen: list = []
    orig = getattr(mod, hook)

    def spy(*a, **k):
        r = orig(*a, **k)
        seen.append(r is not None)
        return r

    monkeypatch.setattr(mod, hook, spy)
    if isa is not None:
        from multiact.backend import native_backend as nb

        st = nb._load()
        monkeypatch.setitem(st, "isa", isa)
        monkeypatch.setitem(st, "table", {k[:3]: row for k, row in st["by_isa"].items() if k[3] == isa})
    from multiact import registry

    registry.clear_cache()
    return seen
