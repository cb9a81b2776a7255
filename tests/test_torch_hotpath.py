"""The tensor hot path (issue 15 item 4): a CPU tensor whose call was seen before skips the generic
dispatch (ma.<op>(t)) and the custom op (mt.<op>(t) in eager mode), and every contract error is raised
the same cold and warm, twice, with nothing written (as tests/test_warm.py does for NumPy arrays)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import multiact as ma  # noqa: E402
import multiact.torch as mt  # noqa: E402
from multiact import elementwise, hot  # noqa: E402
from multiact.optable import OPS  # noqa: E402

N = 64
SENTINEL = 12345.0


def _x(dtype=torch.float32, n=N):
    return torch.linspace(-3, 3, n, dtype=dtype)


def _out(dtype=torch.float32, n=N):
    return torch.full((n,), SENTINEL, dtype=dtype)


def _warm():
    """Good calls that fill the tensor hot path for the ops and dtypes the cases use."""
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        x = _x(dt)
        ma.relu(x), ma.leaky_relu(x, 0.2), ma.gelu_grad(x, x), ma.sigmoid_grad(x, y=x)
        ma.relu(x, out=torch.empty_like(x)), ma.gelu_grad(x, x, out=torch.empty_like(x))


def _untouched(make, call):
    def bad():
        arrays = make()
        before = [a.clone() for a in arrays]
        try:
            call(*arrays)
        finally:
            for a, was in zip(arrays, before, strict=True):
                assert torch.equal(a, was)
    return bad


X = _x()
CASES = [
    ("out-dtype", _untouched(lambda: [_out(torch.float64)], lambda o: ma.relu(X, out=o)), TypeError,
     r"relu\(\): out has dtype float64, expected float32"),
    ("out-shape", _untouched(lambda: [_out(n=N + 1)], lambda o: ma.relu(X, out=o)), ValueError,
     r"relu\(\): out has shape \(65,\), expected \(64,\)"),
    ("out-requires-grad", _untouched(lambda: [_out().requires_grad_()], lambda o: ma.relu(X, out=o)),
     ValueError, r"relu\(\): out requires grad"),
    ("out-bfloat16-for-float32", _untouched(lambda: [_out(torch.bfloat16)], lambda o: ma.relu(X, out=o)),
     TypeError, r"relu\(\): out has dtype bfloat16, expected float32"),
    ("bfloat16-out-shape", _untouched(lambda: [_out(torch.bfloat16, n=N + 1)],
                                      lambda o: ma.relu(_x(torch.bfloat16), out=o)),
     ValueError, r"relu\(\): out has shape \(65,\), expected \(64,\)"),
    ("out-ndarray-for-tensor", lambda: ma.relu(X, out=np.empty(N, np.float32)), TypeError, "one library"),
    ("out-overlaps-x", _untouched(lambda: [_x(n=N + 1)], lambda b: ma.relu(b[:-1], out=b[1:])), ValueError,
     r"relu\(\): out overlaps x"),
    ("grad-out-overlaps-x", _untouched(lambda: [_x(n=N + 1)], lambda b: ma.gelu_grad(b[1:], b[:-1], out=b[1:])),
     ValueError, r"gelu_grad\(\): out overlaps x"),
    ("grad-shape", _untouched(lambda: [_out()], lambda o: ma.gelu_grad(X[:-1], X, out=o)), ValueError,
     r"gelu_grad\(\): x has shape \(64,\) but dy has \(63,\)"),
    ("grad-dtype", _untouched(lambda: [_out()], lambda o: ma.gelu_grad(X.double(), X, out=o)), TypeError,
     r"gelu_grad\(\): x has dtype float32 but dy has float64"),
    ("grad-bfloat16-beside-float32", lambda: ma.gelu_grad(X.bfloat16(), X), TypeError, "bfloat16"),
    ("grad-mixed-libraries", lambda: ma.gelu_grad(X, X.numpy()), TypeError, "one library"),
    ("int-tensor", lambda: ma.relu(torch.arange(N)), TypeError, "float16, bfloat16, float32 or float64"),
    ("param-nan", _untouched(lambda: [_out()], lambda o: ma.leaky_relu(X, float("nan"), out=o)), ValueError,
     "negative_slope"),
    ("param-list", lambda: ma.leaky_relu(X, [0.2]), TypeError, "'negative_slope' must be a real number"),
    ("param-beyond-float32", lambda: ma.leaky_relu(X, 1e300), ValueError, "does not fit float32"),
    ("y-condition", lambda: ma.leaky_relu_grad(X, y=X, negative_slope=-0.1), ValueError, "negative_slope > 0"),
    ("backend-list", lambda: ma.relu(X, backend=["numpy"]), TypeError, "backend must be a backend name"),
    ("meta-device", lambda: ma.relu(X.to("meta")), ma.BackendError, "on torch-meta arrays"),
    # tensors whose memory is not one plain address: the address path (_Fast.at) must leave them to the views
    ("negative-bit", lambda: ma.relu(torch._neg_view(X)), RuntimeError, "negative bit"),
    ("grad-negative-bit", lambda: ma.gelu_grad(torch._neg_view(X), X), RuntimeError, "negative bit"),
    ("sparse", lambda: ma.relu(X.to_sparse()), TypeError, "Sparse layout"),
    ("mt-param-nan", lambda: mt.leaky_relu(X, float("nan")), ValueError, "negative_slope"),
    ("mt-param-list", lambda: mt.leaky_relu(X.clone().requires_grad_(), [0.2]), Exception, "negative_slope"),
    ("mt-backend-unknown", lambda: mt.relu(X, backend="tpu"), ValueError, "unknown backend"),
    ("mt-not-a-tensor", lambda: mt.relu(X.numpy()), TypeError, "x must be a torch.Tensor"),
]


@pytest.mark.parametrize("warm", ["cold", "warm"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_every_contract_error_cold_and_warm(case, warm):
    _, bad, exc, match = case
    hot.clear()
    elementwise.clear_validated()
    if warm == "warm":
        _warm()
        _warm()
    for _ in range(2):
        with pytest.raises(exc, match=match):
            bad()


def test_the_good_calls_fill_the_tensor_hot_path():
    """The warm half above means something only if tensors are cached under their torch dtype."""
    hot.clear()
    elementwise.clear_validated()
    _warm()
    keys = {k[:2] for op in ("relu", "gelu", "sigmoid") for k in hot.cache(OPS[op].name)}
    assert {("forward", torch.float32), ("backward", torch.float32), ("backward_y", torch.bfloat16),
            ("forward", torch.bfloat16), ("backward", torch.float64)} <= keys


def _layouts():
    base = torch.linspace(-3, 3, 4 * 6, dtype=torch.float64).reshape(4, 6)
    yield "contiguous", base
    yield "strided", base[:, ::2]
    yield "transposed", base.t()
    yield "expanded", base[:1].expand(4, 6)
    yield "channels-last", torch.linspace(-3, 3, 2 * 3 * 4 * 5, dtype=torch.float64).reshape(2, 3, 4, 5).to(
        memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.bfloat16])
def test_warm_calls_equal_cold_calls_for_every_layout(dtype):
    for name, base in _layouts():
        x = base.to(dtype)
        hot.clear()
        elementwise.clear_validated()
        cold = [ma.gelu(x, "tanh"), ma.gelu_grad(x, x, "tanh"), mt.gelu(x, "tanh")]
        for _ in range(2):
            warm = [ma.gelu(x, "tanh"), ma.gelu_grad(x, x, "tanh"), mt.gelu(x, "tanh")]
            for c, w in zip(cold, warm, strict=True):
                assert w.dtype == dtype and w.shape == x.shape, name
                assert torch.equal(c, w), name
        ref = ma.gelu(x.float().numpy() if dtype == torch.bfloat16 else x.numpy(), "tanh")
        np.testing.assert_array_equal(warm[0].float().numpy(), torch.from_numpy(np.asarray(ref)).to(dtype).float())


def test_out_writes_bump_the_version_counter_warm():
    x = _x()
    ma.relu(x, out=torch.empty_like(x))
    out = torch.empty_like(x)
    for _ in range(2):
        v = out._version
        assert ma.relu(x, out=out) is out
        assert out._version > v
    h = _x().requires_grad_()
    w = h * 1
    z = mt.silu(w)
    z = mt.silu(w)
    with torch.no_grad():
        ma.relu(w, out=w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_a_tensor_that_requires_grad_is_read_not_recorded_by_ma():
    x = _x().requires_grad_()
    for _ in range(3):
        y = ma.silu(x)
        assert not y.requires_grad
        torch.testing.assert_close(y, F.silu(x.detach()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_mt_eager_path_forward_backward_and_second_order(dtype):
    hot.clear()
    elementwise.clear_validated()
    x0 = torch.linspace(-3, 3, 50, dtype=dtype)
    kinds = []
    for _ in range(3):
        x = x0.clone().requires_grad_()
        y = mt.leaky_relu(x, 0.2)
        kinds.append(type(y.grad_fn).__name__)
        g = torch.ones_like(y)
        (dx,) = torch.autograd.grad(y, x, g)
        assert y.dtype == dtype and dx.dtype == dtype
        torch.testing.assert_close(y, F.leaky_relu(x0, 0.2), rtol=0, atol=0)
        slope = torch.where(x0 > 0, torch.tensor(1.0, dtype=dtype), torch.tensor(0.2, dtype=dtype))
        torch.testing.assert_close(dx, slope, rtol=0, atol=0)
    assert kinds[0] != "_EagerBackward" and kinds[-1] == "_EagerBackward"  # cold: the custom op; warm: hot
    if dtype == torch.float64:
        x = x0.clone().requires_grad_()
        for _ in range(2):
            torch.autograd.gradgradcheck(lambda t: mt.silu(t), (x,))
            h = torch.autograd.functional.hessian(lambda t: mt.silu(t).sum(), x)
            torch.testing.assert_close(h, torch.autograd.functional.hessian(lambda t: F.silu(t).sum(), x))


def test_mt_without_grad_returns_a_plain_result():
    x = _x().requires_grad_()
    mt.gelu(x)
    with torch.no_grad():
        for _ in range(2):
            y = mt.gelu(x)
            assert not y.requires_grad and y.grad_fn is None
    with torch.inference_mode():
        torch.testing.assert_close(mt.gelu(_x()), F.gelu(_x()))


def test_mt_under_a_dispatch_mode_takes_the_custom_op():
    """A mode (a flop counter, a logger) sees torch.ops.multiact.<op>, warm or not."""
    x = _x(torch.float64)
    mt.silu(x), mt.silu(x.clone().requires_grad_())  # warm
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Log():
        mt.silu(x)
    assert any("multiact" in s and "silu" in s for s in seen), seen


def test_mt_parameter_subclass_and_inplace_keep_their_paths():
    p = torch.nn.Parameter(_x())
    for _ in range(2):
        y = mt.relu(p)
        y.sum().backward()
    torch.testing.assert_close(p.grad, 2 * (p.detach() > 0).float())
    x = _x()
    mt.relu(x), mt.relu(x)
    v = x._version
    assert mt.relu(x, inplace=True) is x and x._version > v


def _native_f32() -> bool:
    return ma.registry.module("native").supports("gelu_tanh", "forward", "float32")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_contiguous_tensors_reach_the_native_kernels_as_addresses(dtype):
    """The address path (one C call on the tensors' data pointers, no NumPy views) is taken where it can
    be, and equals the views' path bit for bit: forward, backward, mt's autograd, threads and empty tensors."""
    if not ma.registry.module("native").supports("gelu_tanh", "forward", str(dtype).replace("torch.", "")):
        pytest.skip("no native kernel for this dtype here")
    hot.clear()
    elementwise.clear_validated()
    x = torch.linspace(-4, 4, 1000, dtype=dtype)
    g = torch.linspace(2, -2, 1000, dtype=dtype)
    cold = [ma.gelu(x, "tanh"), ma.gelu_grad(g, x, "tanh")]
    hits = [h for k, h in hot.cache(OPS["gelu"].name).items() if k[1] is dtype]
    assert hits and all(h.at is not None for h in hits)
    for _ in range(2):
        warm = [ma.gelu(x, "tanh"), ma.gelu_grad(g, x, "tanh")]
        for c, w in zip(cold, warm, strict=True):
            assert w.dtype == dtype and torch.equal(c, w)
    if dtype == torch.float32:  # the same kernel on NumPy arrays
        np.testing.assert_array_equal(warm[0].numpy(), ma.gelu(x.numpy(), "tanh"))
    for backward in ("dense", "expanded"):  # autograd's g: contiguous, or sum()'s stride-0 ones
        for _ in range(3):
            xg = x.clone().requires_grad_()
            y = mt.gelu(xg, "tanh")
            (y * g).sum().backward() if backward == "dense" else y.sum().backward()
            assert torch.equal(y.detach(), cold[0])
            want = cold[1] if backward == "dense" else ma.gelu_grad(torch.ones_like(x), x, "tanh")
            assert torch.equal(xg.grad, want), backward
    assert type(y.grad_fn).__name__ == "_EagerBackward"
    for n in (0, 1, 3):
        e = torch.linspace(-1, 1, n, dtype=dtype)
        hot.clear()
        elementwise.clear_validated()
        c = ma.gelu(e, "tanh")
        for _ in range(2):
            assert torch.equal(ma.gelu(e, "tanh"), c)


def test_the_address_path_splits_large_calls_over_threads_like_the_views():
    if not _native_f32():
        pytest.skip("no native float32 kernels here")
    x = torch.linspace(-5, 5, 1 << 19)
    one = ma.silu(x.numpy())
    before = ma.get_num_threads()
    ma.set_num_threads(2)
    try:
        ma.silu(x)
        for _ in range(2):
            np.testing.assert_array_equal(ma.silu(x).numpy(), one)
    finally:
        ma.set_num_threads(before)


def test_mt_computes_a_lazily_negated_tensor_cold_and_warm():
    """torch's own ops compute on a negative-bit view's value (ma's NumPy view refuses it: see CASES)."""
    hot.clear()
    elementwise.clear_validated()
    for _ in range(3):
        v = torch._neg_view(_x())
        torch.testing.assert_close(mt.leaky_relu(v, 0.2), F.leaky_relu(-_x(), 0.2), rtol=0, atol=0)
        xg = _x().requires_grad_()
        y = mt.leaky_relu(torch._neg_view(xg), 0.2)
        y.backward(torch._neg_view(torch.ones(N)))
        torch.testing.assert_close(y, F.leaky_relu(-_x(), 0.2), rtol=0, atol=0)
        torch.testing.assert_close(xg.grad, torch.where(_x() < 0, 1.0, 0.2), rtol=0, atol=0)
