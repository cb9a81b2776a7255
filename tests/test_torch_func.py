"""torch.func transforms through multiact.torch (issue 15): grad, jacrev, vjp, vmap, jvp, hessian.

torch.library's custom ops alone refuse every functorch transform (their generated autograd.Function has no
setup_context: pytorch/pytorch#168393); multiact/_torch_func.py gives each op a Function of its own.  Every
op of the table is held to eager autograd through the same ops (the derivative multiact defines), and a few to
torch's own functions.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
mt = pytest.importorskip("multiact.torch")
from multiact import consistency  # noqa: E402
from multiact.optable import OPS  # noqa: E402

SIMPLE = [n for n, s in OPS.items() if all(p.kind != "array" for p in s.params)]


def _x(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 6 - 3)


def _call(name):
    p = {k: v for k, v in consistency.param_cases(OPS[name])[0].items() if not isinstance(v, (list, tuple))}
    return lambda t: mt.FUNCTIONS[name](t, **p)


@pytest.mark.parametrize("name", SIMPLE)
def test_func_grad_and_vmap_equal_eager_autograd(name):
    f, x = _call(name), _x()
    xe = x.clone().requires_grad_()
    (want,) = torch.autograd.grad((f(xe) * x).sum(), xe)
    got = torch.func.grad(lambda t: (f(t) * x).sum())(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not torch's per-element fallback ("performance drop")
        batched = torch.func.vmap(f)(x.reshape(3, 4))
    torch.testing.assert_close(batched, f(x).reshape(3, 4), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["silu", "gelu", "leaky_relu", "tanh", "softplus", "mish"])
def test_second_order_transforms_match_torch(name):
    ours, theirs = getattr(mt, name), getattr(F, name, None) or getattr(torch, name)
    x = _x()
    want = torch.func.hessian(lambda t: (theirs(t) ** 2).sum())(x)
    torch.testing.assert_close(torch.func.hessian(lambda t: (ours(t) ** 2).sum())(x), want)
    gg = torch.func.grad(lambda t: torch.func.grad(lambda u: ours(u).sum())(t).sum())(x)
    torch.testing.assert_close(gg, torch.func.grad(lambda t: torch.func.grad(lambda u: theirs(u).sum())(t).sum())(x))
    t = torch.ones_like(x)
    torch.testing.assert_close(torch.func.jvp(ours, (x,), (t,))[1], torch.func.jvp(theirs, (x,), (t,))[1])
    per_row = torch.func.vmap(torch.func.grad(lambda r: ours(r).sum()))(x.reshape(3, 4))
    torch.testing.assert_close(per_row, torch.func.vmap(torch.func.grad(lambda r: theirs(r).sum()))(x.reshape(3, 4)))


def test_tensor_parameters_under_transforms():
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    w = torch.rand(3, dtype=torch.float64)
    torch.testing.assert_close(torch.func.grad(lambda v: mt.prelu(x, v).sum())(w),
                               torch.func.grad(lambda v: F.prelu(x, v).sum())(w))
    torch.testing.assert_close(torch.func.grad(lambda a: (mt.prelu(a, w) ** 2).sum())(x),
                               torch.func.grad(lambda a: (F.prelu(a, w) ** 2).sum())(x))
    batched = torch.func.vmap(lambda a: mt.prelu(a, w))(x.reshape(2, 1, 3, 4))  # one call per batch element
    torch.testing.assert_close(batched, F.prelu(x, w).reshape(2, 1, 3, 4))
    beta, xs = torch.tensor(1.3, dtype=torch.float64), x.reshape(-1)
    torch.testing.assert_close(torch.func.grad(lambda b: mt.swish(xs, beta=b).sum())(beta),
                               torch.func.grad(lambda b: (xs * torch.sigmoid(b * xs)).sum())(beta))
    with pytest.raises(RuntimeError, match="forward-mode .* with respect to beta"):
        torch.func.jvp(lambda b: mt.swish(xs, beta=b), (beta,), (torch.ones_like(beta),))


def test_gated_ops_under_grad():
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(torch.func.grad(lambda t: (mt.swiglu(t) ** 2).sum())(x),
                               torch.func.grad(lambda t: ((F.silu(t[:, :4]) * t[:, 4:]) ** 2).sum())(x))


def test_eager_and_compile_paths_do_not_take_the_transform_function(monkeypatch):
    """Outside a transform the op is the custom op itself (the Function is only for functorch)."""
    op = mt.CUSTOM_OPS["silu"]
    monkeypatch.setattr(op._func, "apply", lambda *a: pytest.fail("Function used outside a transform"))
    x = _x().requires_grad_()
    mt.silu(x, backend="numpy").sum().backward()
    assert x.grad is not None
