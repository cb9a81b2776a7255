"""Which backend runs a call: explicit > use() > MULTIACT_BACKEND > array kind and priority."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

import multiact as ma
from multiact import hot, registry


def _fake(name, priority, ok=True, ops=None, dtypes=("float32", "float64", "float16"), calls=None):
    """A backend module that records its calls and returns a marker value."""
    mod = types.SimpleNamespace(NAME=name, PRIORITY=priority, KINDS=("numpy",))
    mod.available = lambda: (ok, "fake backend" if ok else "fake: no such device here")
    mod.info = lambda: {"isa": "fake"}
    mod.supports = lambda op, d, dt: (ops is None or op in ops) and dt in dtypes and d != "param_grad"

    def kernel(op, direction, dtype):
        def run(*args):
            out = args[-2]
            out[...] = priority
            if calls is not None:
                calls.append((name, op))

        return run

    mod.kernel = kernel
    return mod


@pytest.fixture
def fakes(monkeypatch):
    """native (priority 30, relu only), numba (20, no float16), numpy (10, everything) as fakes."""
    registry.clear_cache()
    calls = []
    mods = {
        "native": _fake("native", 30, ops={"relu"}, calls=calls),
        "numba": _fake("numba", 20, dtypes=("float32", "float64"), calls=calls),
        "numpy": _fake("numpy", 10, calls=calls),
        "cuda": _fake("cuda", 0, ok=False, calls=calls),
    }
    for n, m in mods.items():
        monkeypatch.setitem(registry._modules, n, m)
    yield calls
    registry.clear_cache()


X = np.ones(4, np.float32)


def test_priority_among_available(fakes):
    assert ma.relu(X)[0] == 30
    assert ma.sigmoid(X)[0] == 20  # native lacks sigmoid: falls through
    assert ma.sigmoid(X.astype(np.float16))[0] == 10  # numba lacks float16
    assert "native skipped" in ma.explain("sigmoid", X)


def test_explicit_backend_is_strict(fakes):
    assert ma.relu(X, backend="numpy")[0] == 10
    with pytest.raises(ma.BackendError, match="no such device"):
        ma.relu(X, backend="cuda")
    with pytest.raises(ma.BackendError, match="no sigmoid forward kernel"):
        ma.sigmoid(X, backend="native")


def test_use_scopes_nest_and_fall_through(fakes):
    with ma.use("numpy"):
        assert ma.relu(X)[0] == 10
        with ma.use("numba"):
            assert ma.relu(X)[0] == 20
            assert ma.relu(X.astype(np.float16))[0] == 10  # numba can't: next preference
        assert ma.relu(X)[0] == 10
    assert ma.relu(X)[0] == 30
    with ma.use("numba", only=True), pytest.raises(ma.BackendError, match="only=True"):
        ma.relu(X.astype(np.float16))
    with ma.use("cuda"), pytest.raises(ma.BackendError, match="no such device"):
        ma.relu(X)
    with pytest.raises(ValueError, match="unknown backend"):
        with ma.use("tpu"):
            pass


def test_explicit_beats_use(fakes):
    with ma.use("numpy"):
        assert ma.relu(X, backend="numba")[0] == 20


def test_environment_variable(fakes, monkeypatch):
    monkeypatch.setenv("MULTIACT_BACKEND", "numba")
    registry.clear_cache()
    monkeypatch.setitem(registry._modules, "native", _fake("native", 30, ops={"relu"}))
    monkeypatch.setitem(registry._modules, "numba", _fake("numba", 20, dtypes=("float32",)))
    monkeypatch.setitem(registry._modules, "numpy", _fake("numpy", 10))
    assert ma.relu(X)[0] == 20
    with ma.use("numpy"):  # a scope beats the environment
        assert ma.relu(X)[0] == 10
    assert "MULTIACT_BACKEND" in ma.explain("relu", X)


def test_choice_is_cached(fakes):
    ma.relu(X)
    n = len(registry._kernels)
    ma.relu(X)
    assert len(registry._kernels) == n


def test_use_does_not_leak_across_threads(fakes):
    seen = {}
    barrier = threading.Barrier(2)

    def worker(name, pref):
        with ma.use(pref):
            barrier.wait()
            seen[name] = [ma.relu(X)[0] for _ in range(200)]

    ts = [threading.Thread(target=worker, args=("a", "numpy")), threading.Thread(target=worker, args=("b", "numba"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert set(seen["a"]) == {10} and set(seen["b"]) == {20}
    assert ma.relu(X)[0] == 30


def test_backends_reports_every_backend_with_a_reason():
    registry.clear_cache()
    infos = {b.name: b for b in ma.backends()}
    assert set(infos) == set(registry.BACKEND_NAMES)
    assert infos["numpy"].available
    for b in infos.values():
        assert b.reason, b


def test_import_does_not_pull_heavy_libraries():
    import subprocess
    import sys

    heavy = "('torch', 'cupy', 'dask', 'onnxruntime', 'onnx', 'numba.cuda')"
    code = (
        "import sys, multiact as ma, numpy as np; ma.relu(np.ones(3)); ma.gelu_grad(np.ones(3), np.ones(3));"
        f"print(sorted(m for m in {heavy} if m in sys.modules)); ma.backends();"
        "print(sorted(m for m in ('torch', 'cupy', 'dask') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "[]"], "a plain call imports only what it needs; detection never torch/cupy/dask"


def test_fast_path_respects_scope_changes_after_caching(fakes):
    assert ma.relu(X)[0] == 30
    with ma.use("numpy"):
        assert ma.relu(X)[0] == 10
    assert ma.relu(X)[0] == 30
    assert ma.relu(X, backend="numba")[0] == 20


def test_fast_path_still_validates_parameters(fakes):
    ma.leaky_relu(X, 1.0)
    with pytest.raises(TypeError, match="negative_slope"):
        ma.leaky_relu(X, True)  # equal to 1.0 as a key, but a bool is refused


def test_kernel_errors_name_the_backend(monkeypatch):
    registry.clear_cache()

    def broken(op, direction, dtype):
        def run(*args):
            raise RuntimeError("kernel exploded")

        return run

    mod = _fake("numba", 99)
    mod.kernel = broken
    monkeypatch.setitem(registry._modules, "numba", mod)
    try:
        for _ in range(2):  # the first call resolves, the second takes the cached fast path
            with pytest.raises(RuntimeError, match="kernel exploded") as e:
                ma.tanh(X, backend="numba")
            assert any("backend 'numba'" in n for n in getattr(e.value, "__notes__", []))
        assert ma.tanh(X, backend="numpy")[0] == np.tanh(np.float32(1))  # the registry stays usable
    finally:
        registry.clear_cache()


def test_fast_path_for_y_keeps_the_y_checks():
    """grad(dy, y=) is cached per direction, dtype and parameters: a cached call is the slow path's answer,
    and what the slow path refuses (x and y both, a y-form the parameters do not allow) stays refused."""
    registry.clear_cache()
    x = np.linspace(-3, 3, 37, dtype=np.float32)
    dy = np.cos(x)
    y = ma.elu(x, 0.5)
    first = ma.elu_grad(dy, y=y, alpha=0.5)
    assert any(k[0] == "backward_y" for k in hot.cache(ma.ops()["elu"].name))
    np.testing.assert_array_equal(ma.elu_grad(dy, y=y, alpha=0.5), first)
    out = np.empty_like(x)
    assert ma.elu_grad(dy, y=y, alpha=0.5, out=out) is out
    np.testing.assert_array_equal(out, first)
    np.testing.assert_allclose(first, ma.elu_grad(dy, x, alpha=0.5), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not both"):
        ma.elu_grad(dy, x, y=y, alpha=0.5)
    with pytest.raises(ValueError, match="y= is only supported"):
        ma.elu_grad(dy, y=y, alpha=-0.5)  # a negative alpha: y no longer tells the branch
    registry.clear_cache()


@pytest.mark.parametrize("name", registry.BACKEND_NAMES)
def test_every_backend_module_satisfies_the_backend_protocol(name):
    """The contract is a typing.Protocol (registry.Backend); each backend module keeps it, signatures too."""
    import importlib
    import inspect

    registry.module(name)  # makes multiact.backend importable from a source tree
    mod = importlib.import_module(f"multiact.backend.{name}_backend")
    assert isinstance(mod, registry.Backend), name
    assert mod.NAME == name and isinstance(mod.PRIORITY, int) and isinstance(mod.KINDS, tuple)
    for fn in ("supports", "kernel"):
        assert list(inspect.signature(getattr(mod, fn)).parameters)[:3] == ["key", "direction", "dtype"], (name, fn)
    ok, why = mod.available()
    assert isinstance(ok, bool) and isinstance(why, str) and why


def test_explain_reports_the_real_decision_for_every_input_kind():
    """A tensor is not called a NumPy array; Dask is per chunk; bfloat16 tensors run (zero-copy, as bfloat16)."""
    torch = pytest.importorskip("torch")
    da = pytest.importorskip("dask.array")
    registry.clear_cache()
    t = ma.explain("gelu", torch.ones(3))
    assert t.startswith("gelu forward on torch CPU float32 tensors -> ") and "zero-copy" in t
    b = ma.explain("gelu", torch.ones(3, dtype=torch.bfloat16))
    assert "bfloat16 tensors -> " in b and "cannot run" not in b and "zero-copy" in b
    ma.gelu(torch.ones(3, dtype=torch.bfloat16))  # and it does run
    d = ma.explain("gelu", da.ones(4, chunks=2, dtype=np.float32))
    assert "per chunk" in d and "NumPy float32 arrays -> " in d and "cannot run" not in d
    assert "NumPy >f4 arrays -> " in ma.explain("gelu", np.ones(3, ">f4"))
