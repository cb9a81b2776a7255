"""The C hot path (multiact._hotpath, native/hotpath/hotpath.c): taken where it can vouch for a call, equal to
the Python paths where it is, and absent without harm (issue 41 item 2).  tests/test_warm.py and
tests/test_torch_hotpath.py hold it to every contract error, cold and warm; here: that it is the path the warm
calls take, that what it remembers follows the caches, and that the package works without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import multiact as ma
from multiact import elementwise, hot, registry
from multiact.optable import OPS

pytestmark = pytest.mark.skipif(hot.C is None, reason="multiact._hotpath is not built here")


def _native_f32() -> bool:
    return registry.module("native").supports("gelu_tanh", "forward", "float32")


def _clear():
    hot.clear()
    elementwise.clear_validated()


def _boom(*args):
    raise AssertionError("the Python hot path ran a call the C hot path should have run")


def _disarm(monkeypatch, op: str):
    """Every cached hit of op: its Python kernel and address entry replaced by ones that fail, so that only
    the C hot path (which runs `Hit.c`) can answer."""
    hits = list(hot.cache(OPS[op].name).values())
    assert hits
    for h in hits:
        assert isinstance(h.c, hot.C.Native), h.what
        monkeypatch.setattr(h, "kernel", _boom)
        monkeypatch.setattr(h, "at", None)


def test_warm_numpy_calls_take_the_c_path(monkeypatch):
    if not _native_f32():
        pytest.skip("no native float32 kernels here")
    _clear()
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    dy = np.cos(x)
    want = [ma.gelu(x, "tanh"), ma.gelu_grad(dy, x, "tanh"), ma.sigmoid_grad(dy, y=x)]
    o = np.empty_like(x)
    ma.gelu(x, "tanh", out=o), ma.sigmoid(x)
    _disarm(monkeypatch, "gelu")
    _disarm(monkeypatch, "sigmoid")
    for _ in range(2):
        np.testing.assert_array_equal(ma.gelu(x, "tanh"), want[0])
        np.testing.assert_array_equal(ma.gelu_grad(dy, x, "tanh"), want[1])
        np.testing.assert_array_equal(ma.sigmoid_grad(dy, y=x), want[2])
        o[...] = 0
        assert ma.gelu(x, "tanh", out=o) is o
        np.testing.assert_array_equal(o, want[0])
        z = x.copy()
        assert ma.gelu(z, "tanh", out=z) is z  # in place: the same view
        np.testing.assert_array_equal(z, want[0])
        g = dy.copy()
        assert ma.gelu_grad(g, x, "tanh", out=g) is g
        np.testing.assert_array_equal(g, want[1])


def test_what_the_c_path_leaves_to_python(monkeypatch):
    """Strided or misaligned arrays, an out= that overlaps, a non-native byte order: the Python paths decide (the
    disarmed kernel shows that the Python hot path ran the strided ones)."""
    if not _native_f32():
        pytest.skip("no native float32 kernels here")
    _clear()
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    ma.leaky_relu(x, 0.2)
    _disarm(monkeypatch, "leaky_relu")
    for call in (lambda: ma.leaky_relu(x[::2], 0.2), lambda: ma.leaky_relu(x.reshape(8, 8).T, 0.2),
                 lambda: ma.leaky_relu(x, 0.2, out=np.empty(128, np.float32)[::2])):
        with pytest.raises(AssertionError, match="the Python hot path ran"):
            call()
    monkeypatch.undo()
    buf = np.zeros(65 * 4 + 1, np.uint8)[1:].view(np.float32)  # misaligned
    assert not buf.flags.aligned
    buf[...] = np.linspace(-3, 3, 65, dtype=np.float32)
    want = ma.leaky_relu(buf.copy(), 0.2)
    for _ in range(2):
        np.testing.assert_array_equal(ma.leaky_relu(buf, 0.2), want)
        with pytest.raises(ValueError, match="out overlaps x"):
            ma.leaky_relu(buf[:-1], 0.2, out=buf[1:])


def test_the_use_scope_and_clear_cache_reach_the_c_path():
    if not _native_f32():
        pytest.skip("no native float32 kernels here")
    _clear()
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    cache = hot.cache(OPS["silu"].name)
    ma.silu(x), ma.silu(x)
    assert {k[-1] for k in cache} == {()}
    with ma.use("numpy"):  # another key: the C path's memory of the default scope must not answer
        np.testing.assert_allclose(ma.silu(x), ma.silu(x, backend="numpy"))
    assert {k[-1] for k in cache} == {(), (("numpy", False),)}
    registry.clear_cache()
    assert not cache
    ma.silu(x)  # the C path forgot what it remembered: the cold path runs and fills the cache again
    assert cache


def test_references_are_not_leaked():
    if not _native_f32():
        pytest.skip("no native float32 kernels here")
    _clear()
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    o = np.empty_like(x)
    calls = [lambda: ma.relu(x), lambda: ma.relu(x, out=o), lambda: ma.relu_grad(x, x),
             lambda: ma.leaky_relu(x, 0.2), lambda: ma.gelu(x, "tanh")]
    for c in calls:
        c(), c()
    before = sys.getrefcount(x), sys.getrefcount(o), sys.getrefcount(x.dtype)
    for _ in range(1000):
        for c in calls:
            c()
    assert (sys.getrefcount(x), sys.getrefcount(o), sys.getrefcount(x.dtype)) == before


@pytest.mark.parametrize("shape", [(0,), (), (1,), (3, 0, 2), (5, 1, 7)])
def test_empty_zero_d_and_odd_shapes(shape):
    _clear()
    x = np.linspace(-2, 2, int(np.prod(shape))).astype(np.float32).reshape(shape)
    cold = [ma.silu(x), ma.silu_grad(x, x)]
    for _ in range(2):
        warm = [ma.silu(x), ma.silu_grad(x, x)]
        for c, w in zip(cold, warm, strict=True):
            assert type(w) is np.ndarray and w.shape == shape and w.dtype == x.dtype
            np.testing.assert_array_equal(c, w)


# ---- tensors ------------------------------------------------------------------------------------------


def test_warm_tensor_calls_take_the_c_path(monkeypatch):
    torch = pytest.importorskip("torch")
    import multiact.torch as mt

    if not _native_f32():
        pytest.skip("no native float32 kernels here")
    _clear()
    x = torch.linspace(-3, 3, 1000)
    g = torch.linspace(2, -2, 1000)
    want = [ma.silu(x), ma.silu_grad(g, x)]
    mt.silu(x), mt.SiLU()(x)
    _disarm(monkeypatch, "silu")
    for _ in range(2):
        assert torch.equal(ma.silu(x), want[0])
        assert torch.equal(ma.silu_grad(g, x), want[1])
        assert torch.equal(mt.silu(x), want[0])
        assert torch.equal(mt.SiLU()(x), want[0])
        y = mt.silu(x)
        assert type(y) is torch.Tensor and y.dtype == x.dtype and not y.requires_grad and y._version == 0


def test_tensor_reads_and_results_agree_with_torch():
    """hot.py's probes chose how the C path reads and makes tensors; whichever it chose, and the Python
    attributes too, give the answers of the Python paths."""
    torch = pytest.importorskip("torch")
    import multiact.torch as mt

    x = torch.linspace(-3, 3, 300, dtype=torch.float64).reshape(3, 100)
    ma.gelu(x)
    chosen = hot.SHIM[0]
    assert chosen != "none"
    try:
        for shim in (True, False):
            if not shim:
                hot.C.set_shim()  # the Python attributes and torch.empty_like
            for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                t = x.to(dt)
                _clear()
                cold = [ma.gelu(t), ma.gelu_grad(t, t), mt.gelu(t)]
                for _ in range(2):
                    warm = [ma.gelu(t), ma.gelu_grad(t, t), mt.gelu(t), ma.gelu(t[:, 1:]), ma.gelu(t.t())]
                    for c, w in zip(cold, warm, strict=False):
                        assert w.dtype == dt and w.shape == t.shape and w.stride() == t.stride()
                        assert torch.equal(c, w), (shim, dt)
                    assert torch.equal(warm[3], cold[0][:, 1:]) and torch.equal(warm[4], cold[0].t())
    finally:
        hot._set_shim(torch)
    assert hot.SHIM[0] == chosen


def test_mt_autograd_and_modes_keep_their_paths():
    """The C path hands autograd calls to _Eager (a grad_fn of its own), and leaves torch function modes to
    the custom ops."""
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    import multiact.torch as mt

    x = torch.linspace(-3, 3, 64, dtype=torch.float32)
    for _ in range(3):
        xg = x.clone().requires_grad_()
        y = mt.LeakyReLU(0.2)(xg)
        y.backward(torch.ones_like(y))
    assert type(y.grad_fn).__name__ == "_EagerBackward"
    torch.testing.assert_close(xg.grad, torch.where(x > 0, 1.0, 0.2))

    seen = []

    class Log(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Log():
        mt.leaky_relu(x, 0.2)
    assert any("leaky_relu" in s for s in seen), seen


# ---- without the extension ------------------------------------------------------------------------------


def test_without_the_c_hot_path_the_python_one_does_the_work(tmp_path):
    """multiact._hotpath absent (not built, or failed to load): every contract error is still raised cold and
    warm, and warm calls equal cold ones."""
    code = (
        "import sys; sys.modules['multiact._hotpath'] = None\n"
        "import pytest\n"
        "from multiact import hot\n"
        "assert hot.C is None\n"
        "sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', '-p', 'no:randomly', '-n', '0',\n"
        "                      'tests/test_warm.py::test_every_contract_error_cold_and_warm',\n"
        "                      'tests/test_torch_hotpath.py']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
