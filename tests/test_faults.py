"""A backend failing mid-run: a numba compile error, an ONNX Runtime session or run failure.

What each must give: the backend's own exception, noted with the backend's name; `out=` (or x,
in place) exactly as it was, because the failure is raised before anything is written; no
fall-back to another backend, explicit or automatic; and a registry that works again once the
cause is gone (no cache keeps the broken loop or session).
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import pytest

import multiact as ma
from multiact import registry

numba = pytest.importorskip("numba")
from numba.core.errors import TypingError  # noqa: E402

RTOL = {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}


def _noted(e: BaseException, backend: str) -> bool:
    return any(f"backend {backend!r}" in n for n in getattr(e, "__notes__", []))


def _untypeable_like(fn):
    """A function with fn's parameters that numba cannot type: compiling it is a real TypingError."""
    params = ", ".join(inspect.signature(fn).parameters)
    ns = {"_NOT_A_NUMBA_TYPE": object()}
    exec(f"def {fn.__name__}({params}):\n    return _NOT_A_NUMBA_TYPE\n", ns)
    return ns[fn.__name__]


@contextlib.contextmanager
def numba_loops_fail(match: str):
    """While inside, every numba loop the backend builds whose name contains `match` fails to compile."""
    real = numba.njit

    def njit(*args, **opts):
        if args and callable(args[0]):
            return real(*args, **opts)
        opts.pop("cache", None)  # the stand-in lives in no file numba could cache against

        def deco(fn):
            return real(**opts)(_untypeable_like(fn) if match in fn.__name__ else fn)

        return deco

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba, "njit", njit)
        yield


@pytest.fixture
def fresh_numba():
    """The numba backend with no loop built yet, so the next call compiles (and can fail to)."""
    nb = registry.module("numba")
    if not registry.availability("numba")[0]:
        pytest.skip(f"numba: {registry.availability('numba')[1]}")
    registry.clear_cache()
    nb._loops.cache_clear()
    yield nb
    nb._loops.cache_clear()
    registry.clear_cache()


def _inputs(dtype: str, n: int, layout: str) -> np.ndarray:
    x = np.linspace(-4, 4, 2 * n).astype(dtype)
    return x[::2] if layout == "strided" else x[:n]


# flat: one compiled call; blocked: float16 or strided, buffered blocks; >= 65536: the parallel loop
NUMBA_CASES = [
    ("forward", "float32", 1000, "flat"),
    ("forward", "float32", 100_000, "flat"),
    ("forward", "float16", 100_001, "flat"),
    ("forward", "float32", 1000, "strided"),
    ("backward", "float16", 70_001, "strided"),
    ("backward", "float64", 3, "flat"),
]


def _tanh(direction, x, dy, **kw):
    return ma.tanh(x, **kw) if direction == "forward" else ma.tanh_grad(dy, x, **kw)


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize(("direction", "dtype", "n", "layout"), NUMBA_CASES)
def test_numba_compile_error_writes_nothing_and_does_not_stick(fresh_numba, direction, dtype, n, layout, in_place):
    x = _inputs(dtype, n, layout)
    dy = np.full_like(x, 0.5)
    out = x if in_place else np.full_like(x, 7)
    before = out.copy()
    with numba_loops_fail("_loop_tanh_"):
        for _ in range(2):  # first call: resolved and remembered; second: the generated fast path
            with pytest.raises(TypingError) as e:
                _tanh(direction, x, dy, out=out, backend="numba")
            assert _noted(e.value, "numba")
            np.testing.assert_array_equal(out, before)  # bit for bit: nothing was written
        assert _tanh(direction, x, dy, backend="numpy").shape == x.shape  # other backends unaffected
    got = _tanh(direction, x, dy, out=out, backend="numba")  # the cause is gone: it compiles now
    want = _tanh(direction, before if in_place else x, dy, backend="numpy")
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("failing", ["_ser_", "_par_"])
def test_numba_blocked_call_compiles_both_loops_before_writing(fresh_numba, failing):
    """Full blocks run the parallel loop, the tail the serial one: either failing leaves out as it was."""
    if min(ma.get_num_threads(), numba.config.NUMBA_NUM_THREADS) < 2:
        pytest.skip("needs two threads for the parallel loop (NUMBA_NUM_THREADS >= 2)")
    x = _inputs("float16", fresh_numba._PAR_MIN + 1001, "flat")
    out = np.full_like(x, 7)
    with numba_loops_fail(failing), pytest.raises(TypingError):
        ma.silu(x, out=out, backend="numba")
    assert (out == 7).all()
    np.testing.assert_allclose(ma.silu(x, out=out, backend="numba"), ma.silu(x, backend="numpy"), rtol=2e-3)


def test_numba_failure_is_never_answered_by_another_backend(fresh_numba, monkeypatch):
    """Explicit, scoped and automatic choices all raise; explain says no other backend is tried."""
    x = _inputs("float32", 64, "flat")
    monkeypatch.setitem(registry._avail, "native", (False, "hidden by the test"))  # numba is the automatic choice
    text = ma.explain("tanh", x)
    assert "-> numba" in text and "no other backend is tried" in text
    with numba_loops_fail("_loop_tanh_"):
        for how in ({"backend": "numba"}, {}):
            with pytest.raises(TypingError):
                ma.tanh(x, **how)
        with ma.use("numba"), pytest.raises(TypingError):
            ma.tanh(x)
    np.testing.assert_allclose(ma.tanh(x), np.tanh(x), rtol=1e-6)


# ---- ONNX Runtime ----------------------------------------------------------------------------------


@pytest.fixture
def ort_runner():
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    if not registry.availability("onnxruntime")[0]:
        pytest.skip(f"onnxruntime: {registry.availability('onnxruntime')[1]}")
    runner = registry.module("onnxruntime")._runner
    registry.clear_cache()
    runner.clear()
    yield ort, runner
    runner.clear()
    registry.clear_cache()


def _ort_error(name: str):
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return getattr(state, name)


ORT_OUTS = ["contiguous", "strided", "in_place"]


def _ort_out(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "in_place":
        return x
    if kind == "strided":
        return np.full((x.size, 2), 7, x.dtype)[:, 0].reshape(x.shape)
    return np.full_like(x, 7)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", ORT_OUTS)
def test_ort_session_creation_failure(ort_runner, monkeypatch, kind, dtype):
    ort, runner = ort_runner
    x = np.linspace(-3, 3, 1001).astype(dtype)
    out = _ort_out(x, kind)
    before = out.copy()
    fail = _ort_error("Fail")

    def no_session(*args, **kwargs):
        raise fail("injected: cannot create the session")

    with monkeypatch.context() as mp:
        mp.setattr(ort, "InferenceSession", no_session)
        for _ in range(2):
            with pytest.raises(fail) as e:
                ma.gelu(x, out=out, backend="onnxruntime")
            assert _noted(e.value, "onnxruntime")
            np.testing.assert_array_equal(out, before)
            assert runner.session_count() == 0  # nothing half-made is cached
        with ma.use("onnxruntime"), pytest.raises(fail):
            ma.gelu(x)
        assert ma.gelu(x, backend="numpy").shape == x.shape
    got = ma.gelu(x, out=out, backend="onnxruntime")
    want = ma.gelu(before if kind == "in_place" else x, backend="numpy")
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype])
    assert runner.session_count() == 1


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", ORT_OUTS)
def test_ort_run_failure(ort_runner, monkeypatch, kind, dtype):
    ort, runner = ort_runner
    x = np.linspace(-3, 3, 1001).astype(dtype)
    dy = np.full_like(x, 0.25)
    ma.softplus_grad(dy, x, backend="onnxruntime")  # the session exists and works
    out = dy if kind == "in_place" else _ort_out(x, kind)
    before = out.copy()
    err = _ort_error("RuntimeException")

    def run_fails(self, binding):
        raise err("injected: run failed")

    with monkeypatch.context() as mp:
        mp.setattr(ort.InferenceSession, "run_with_iobinding", run_fails)
        for _ in range(2):
            with pytest.raises(err) as e:
                ma.softplus_grad(dy, x, out=out, backend="onnxruntime")
            assert _noted(e.value, "onnxruntime")
            np.testing.assert_array_equal(out, before)
    assert runner.session_count() == 1  # the cached session was not the problem, and is reused
    got = ma.softplus_grad(before if kind == "in_place" else dy, x, out=out, backend="onnxruntime")
    want = ma.softplus_grad(before if kind == "in_place" else dy, x, backend="numpy")
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype])
    assert runner.session_count() == 1
