"""multiact.torch's gated family (issue 17): mt.glu/swiglu/geglu/reglu and their modules, each against
its anchor's own formula in torch (values and gradients), gradcheck, a LLaMA-style MLP trained with
mt.swiglu, and bad input."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import multiact.torch as mt  # noqa: E402
from multiact._opdefs import COMPOSITES  # noqa: E402

# (rtol, atol) for values and gradients: float64 tight, float32 within a few ulp of torch's float32
TOL = {torch.float64: (1e-12, 1e-13), torch.float32: (2e-6, 2e-6)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])


def _randn(*shape, dtype=torch.float64, seed=0, scale=2.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _compare(ours, theirs, inputs, dtype, seed=7):
    """ours(*inputs) and theirs(*inputs) agree in value and in the gradient of every input."""
    rtol, atol = TOL[dtype]
    a = [t.clone().requires_grad_() for t in inputs]
    b = [t.clone().requires_grad_() for t in inputs]
    ya, yb = ours(*a), theirs(*b)
    assert ya.dtype == yb.dtype == dtype and ya.shape == yb.shape
    torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
    dy = _randn(*ya.shape, dtype=dtype, seed=seed, scale=1.0)
    ga = torch.autograd.grad(ya, a, dy)
    gb = torch.autograd.grad(yb, b, dy)
    for g, h in zip(ga, gb, strict=True):
        assert g.shape == h.shape and g.dtype == dtype
        torch.testing.assert_close(g, h, rtol=rtol, atol=atol)


def _halves(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


# ---- each convention against its anchor ------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_glu_is_torch_glu(dtype, dim):
    x = _randn(4, 6, 8, dtype=dtype)
    _compare(lambda t: mt.glu(t, dim), lambda t: F.glu(t, dim), [x], dtype)
    _compare(mt.GLU(dim), torch.nn.GLU(dim), [x], dtype)


@DTYPES
def test_swiglu_is_vllm_silu_and_mul(dtype):
    x = _randn(3, 5, 16, dtype=dtype)

    def vllm(t):
        d = t.shape[-1] // 2
        return F.silu(t[..., :d]) * t[..., d:]

    _compare(mt.swiglu, vllm, [x], dtype)
    _compare(mt.SwiGLU(), vllm, [x], dtype)
    # activate="second": the second half is the gate
    _compare(lambda t: mt.swiglu(t, activate="second"), lambda t: _halves(t)[0] * F.silu(_halves(t)[1]), [x], dtype)


@DTYPES
def test_two_input_form_is_liger_silu_mul(dtype):
    a, b = _randn(6, 10, dtype=dtype, seed=1), _randn(6, 10, dtype=dtype, seed=2)
    _compare(lambda g, u: mt.swiglu(g, up=u), lambda g, u: F.silu(g) * u, [a, b], dtype)
    _compare(mt.SwiGLU(), lambda g, u: F.silu(g) * u, [a, b], dtype)


def test_two_input_form_gradient_of_one_input_only():
    a, b = _randn(5, 4, seed=1), _randn(5, 4, seed=2).requires_grad_()
    mt.swiglu(a, up=b).sum().backward()
    torch.testing.assert_close(b.grad, F.silu(a), rtol=1e-14, atol=0)
    a2 = a.clone().requires_grad_()
    mt.swiglu(a2, up=b.detach()).sum().backward()
    bd = b.detach()
    want = (torch.sigmoid(a) * (1 + a * (1 - torch.sigmoid(a)))) * bd
    torch.testing.assert_close(a2.grad, want, rtol=1e-13, atol=1e-14)


@DTYPES
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu_is_gelu_mul(dtype, approximate):
    x = _randn(4, 12, dtype=dtype)

    def want(t):
        a, b = _halves(t)
        return F.gelu(a, approximate=approximate) * b

    _compare(lambda t: mt.geglu(t, approximate=approximate), want, [x], dtype)
    _compare(mt.GeGLU(approximate=approximate), want, [x], dtype)
    a, b = _halves(x)
    _compare(lambda g, u: mt.geglu(g, approximate=approximate, up=u),
             lambda g, u: F.gelu(g, approximate=approximate) * u, [a.contiguous(), b.contiguous()], dtype)


@DTYPES
def test_reglu_is_relu_mul(dtype):
    x = _randn(4, 12, dtype=dtype)
    x[x.abs() < 1e-3] = 0.5  # relu's kink: torch and multiact agree there too, but keep the check honest
    _compare(mt.reglu, lambda t: F.relu(_halves(t)[0]) * _halves(t)[1], [x], dtype)
    _compare(mt.ReGLU(), lambda t: F.relu(_halves(t)[0]) * _halves(t)[1], [x], dtype)


def _gpt_oss(x, alpha, limit):
    """GPT-OSS's swiglu, as its reference implementation writes it."""
    x_glu, x_linear = x[..., ::2], x[..., 1::2]
    x_glu = x_glu.clamp(min=None, max=limit)
    x_linear = x_linear.clamp(min=-limit, max=limit)
    return x_glu * torch.sigmoid(alpha * x_glu) * (x_linear + 1)


@DTYPES
def test_clipped_swiglu_is_gpt_oss(dtype):
    alpha, limit = 1.702, 7.0
    x = _randn(8, 32, dtype=dtype, scale=6.0)  # about a quarter of the values beyond the limit
    assert (x[..., ::2] > limit).any() and (x[..., 1::2] > limit).any() and (x[..., 1::2] < -limit).any()
    x[0, :4] = torch.tensor([limit, limit, -limit, -limit], dtype=dtype)  # exactly at the limit: clamp passes
    _compare(lambda t: mt.swiglu(t, layout="interleaved", alpha=alpha, limit=limit),
             lambda t: _gpt_oss(t, alpha, limit), [x], dtype)
    _compare(mt.SwiGLU(layout="interleaved", alpha=alpha, limit=limit), lambda t: _gpt_oss(t, alpha, limit), [x], dtype)


def test_clipped_gradients_are_zero_where_the_limit_is_hit():
    limit = 1.0
    # interleaved pairs (gate, up): (2.0, 0.5) gate clipped; (0.5, 3.0) up clipped; (-0.3, -0.5) neither
    x = torch.tensor([[2.0, 0.5, 0.5, 3.0, -0.3, -0.5]], dtype=torch.float64, requires_grad=True)
    mt.swiglu(x, layout="interleaved", alpha=1.702, limit=limit).sum().backward()
    g = x.grad[0]
    assert g[0] == 0 and g[3] == 0
    assert (g[[1, 2, 4, 5]] != 0).all()
    want = x.detach().clone().requires_grad_()
    _gpt_oss(want, 1.702, limit).sum().backward()
    torch.testing.assert_close(g, want.grad[0], rtol=1e-14, atol=1e-15)


# ---- layouts, views, dtypes ------------------------------------------------------------------------------


def test_non_contiguous_input_and_interleaved_glu():
    base = _randn(10, 8)
    x = base.t()  # (8, 10), non-contiguous
    assert not x.is_contiguous()
    _compare(lambda t: mt.glu(t, -1), lambda t: F.glu(t, -1), [x], torch.float64)
    _compare(lambda t: mt.glu(t, layout="interleaved"), lambda t: t[..., ::2] * torch.sigmoid(t[..., 1::2]),
             [x], torch.float64)
    # a view that requires grad through its base
    b = base.clone().requires_grad_()
    mt.swiglu(b.t()[1:]).sum().backward()
    b2 = base.clone().requires_grad_()
    v = b2.t()[1:]
    (F.silu(v[..., :5]) * v[..., 5:]).sum().backward()
    torch.testing.assert_close(b.grad, b2.grad, rtol=1e-13, atol=1e-14)


def test_zero_size_expanded_and_one_dimensional_inputs():
    x = torch.empty(0, 6, dtype=torch.float64, requires_grad=True)
    y = mt.swiglu(x)
    y.sum().backward()
    assert y.shape == (0, 3) and x.grad.shape == (0, 6)
    row = _randn(1, 6)
    _compare(lambda t: mt.swiglu(t.expand(4, 6)), lambda t: _torch_silu_mul(t.expand(4, 6)), [row], torch.float64)
    _compare(mt.glu, F.glu, [_randn(8)], torch.float64)


def _torch_silu_mul(t):
    a, b = _halves(t)
    return F.silu(a) * b


def test_glu_takes_any_activation_and_its_parameters():
    x = _randn(4, 10)
    _compare(lambda t: mt.glu(t, act="leaky_relu", negative_slope=0.2, activate="first"),
             lambda t: F.leaky_relu(_halves(t)[0], 0.2) * _halves(t)[1], [x], torch.float64)
    m = mt.GLU(act="softplus", beta=2.0)
    _compare(m, lambda t: _halves(t)[0] * F.softplus(_halves(t)[1], beta=2.0), [x], torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_keep_their_dtype(dtype):
    x = _randn(4, 8, dtype=torch.float32).to(dtype).requires_grad_()
    y = mt.swiglu(x)
    assert y.dtype == dtype
    y.backward(torch.ones_like(y))
    assert x.grad.dtype == dtype
    xf = x.detach().float().requires_grad_()
    yf = F.silu(xf[..., :4]) * xf[..., 4:]
    yf.backward(torch.ones_like(yf))
    # computed in float32, rounded once
    torch.testing.assert_close(y, yf.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, xf.grad.to(dtype), rtol=0, atol=0)


def test_without_grad_no_graph_is_built():
    x = _randn(3, 4)
    assert not mt.swiglu(x).requires_grad
    xg = x.clone().requires_grad_()
    with torch.no_grad():
        assert not mt.swiglu(xg).requires_grad
    assert mt.swiglu(xg).grad_fn is not None


def test_in_place_write_after_the_forward_makes_the_backward_raise():
    x = _randn(3, 4).requires_grad_()
    h = x * 1.0
    y = mt.swiglu(h)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    g, u = _randn(3, 4).requires_grad_(), _randn(3, 4, seed=3)
    y = mt.swiglu(g, up=u)
    u.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# ---- gradcheck, and second order -----------------------------------------------------------------------


def _away(x, points, gap=1e-3):
    """x with no value within gap of a kink."""
    for p in points:
        x = torch.where((x - p).abs() < gap, x + 4 * gap, x)
    return x


@pytest.mark.parametrize("name,kw,kinks", [
    ("glu", {}, ()),
    ("glu", {"dim": 0, "act": "tanh", "activate": "first"}, ()),
    ("swiglu", {}, ()),
    ("swiglu", {"layout": "interleaved", "alpha": 1.702, "limit": 1.5}, (1.5, -1.5)),
    ("geglu", {"approximate": "tanh"}, ()),
    ("geglu", {"dim": 1}, ()),
    ("reglu", {}, (0.0,)),
], ids=["glu", "glu-tanh-dim0", "swiglu", "swiglu-clipped", "geglu-tanh", "geglu-dim1", "reglu"])
def test_gradcheck_one_input(name, kw, kinks):
    x = _away(_randn(4, 6, 2), kinks).requires_grad_()
    f = getattr(mt, name)
    assert torch.autograd.gradcheck(lambda t: f(t, **kw), (x,))


@pytest.mark.parametrize("name", [c.name for c in COMPOSITES if c.name != "reglu"])
def test_gradcheck_two_inputs(name):
    g, u = _randn(5, 3, seed=1).requires_grad_(), _randn(5, 3, seed=2).requires_grad_()
    f = getattr(mt, name)
    assert torch.autograd.gradcheck(lambda a, b: f(a, up=b), (g, u))


@pytest.mark.parametrize("name,kw,kinks", [
    ("glu", {}, ()),
    ("glu", {"dim": 0, "act": "tanh", "activate": "first"}, ()),
    ("glu", {"act": "leaky_relu", "negative_slope": 0.2, "layout": "interleaved"}, (0.0,)),
    ("swiglu", {}, ()),
    ("swiglu", {"layout": "interleaved", "alpha": 1.702, "limit": 1.5}, (1.5, -1.5)),
    ("geglu", {"approximate": "tanh"}, ()),
    ("reglu", {}, (0.0,)),
], ids=["glu", "glu-tanh-dim0", "glu-leaky-interleaved", "swiglu", "swiglu-clipped", "geglu-tanh", "reglu"])
def test_gradgradcheck_one_input(name, kw, kinks):
    """Second order: the gated backward's own backward composes the activation's custom ops (its first
    backward and multiact.backward2), with the clip's masks."""
    x = _away(_randn(4, 6, 2), kinks).requires_grad_()
    f = getattr(mt, name)
    assert torch.autograd.gradgradcheck(lambda t: f(t, **kw), (x,))


@pytest.mark.parametrize("activate", ["first", "second"])
@pytest.mark.parametrize("name", [c.name for c in COMPOSITES])
def test_gradgradcheck_two_inputs(name, activate):
    g, u = _randn(5, 3, seed=1).requires_grad_(), _randn(5, 3, seed=2).requires_grad_()
    if name == "reglu":
        g = _away(g.detach(), (0.0,)).requires_grad_()
    f = getattr(mt, name)
    assert torch.autograd.gradgradcheck(lambda a, b: f(a, up=b, activate=activate), (g, u))


def test_gradgradcheck_clipped_two_inputs():
    g = _away(_randn(5, 3, seed=1, scale=3), (1.5,)).requires_grad_()
    u = _away(_randn(5, 3, seed=2, scale=3), (1.5, -1.5)).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda a, b: mt.swiglu(a, up=b, alpha=1.702, limit=1.5), (g, u))


def test_hessian_matches_torch_composition():
    x = _randn(2, 6)
    h = torch.autograd.functional.hessian(lambda t: mt.swiglu(t).sum(), x)
    want = torch.autograd.functional.hessian(lambda t: (F.silu(_halves(t)[0]) * _halves(t)[1]).sum(), x)
    torch.testing.assert_close(h, want, rtol=1e-12, atol=1e-13)


# ---- a LLaMA-style MLP ---------------------------------------------------------------------------------


class _MLP(torch.nn.Module):
    """LLaMA's feed-forward: w2(act(w1 x) * w3 x), with w1 and w3 fused into one w13."""

    def __init__(self, d, h, act, dtype):
        super().__init__()
        self.w13 = torch.nn.Linear(d, 2 * h, bias=False, dtype=dtype)
        self.w2 = torch.nn.Linear(h, d, bias=False, dtype=dtype)
        self.act = act

    def forward(self, x):
        return self.w2(self.act(self.w13(x)))


class _TorchSwiGLU(torch.nn.Module):
    def forward(self, t):
        a, b = t.chunk(2, dim=-1)
        return F.silu(a) * b


def _train(model, x, target, steps=5, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["float64", "float32"])
@pytest.mark.parametrize("act", ["function", "module"])
def test_llama_mlp_trains_like_silu_mul(dtype, rtol, act):
    torch.manual_seed(0)
    ours = _MLP(32, 64, mt.swiglu if act == "function" else mt.SwiGLU(), dtype)
    theirs = copy.deepcopy(ours)
    theirs.act = _TorchSwiGLU()
    x = _randn(4, 16, 32, dtype=dtype, seed=3, scale=1.0)
    target = _randn(4, 16, 32, dtype=dtype, seed=4, scale=0.5)
    a = _train(ours, x, target)
    b = _train(theirs, x, target)
    assert a[-1] < a[0]
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=0)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=10 * rtol, atol=10 * rtol)


# ---- modules and bad input ---------------------------------------------------------------------------


def test_every_gated_definition_has_a_function_and_a_module():
    for c in COMPOSITES:
        assert callable(getattr(mt, c.name)) and mt.FUNCTIONS[c.name] is getattr(mt, c.name)
        cls = mt.MODULES[c.name]
        assert cls.__name__ == c.module and getattr(mt, c.module) is cls and issubclass(cls, torch.nn.Module)
        assert c.name in mt.__all__ and c.module in mt.__all__


def test_module_repr():
    """As every multiact.torch module: torch's form, the backend, and [multiact] (issue 21)."""
    assert repr(mt.SwiGLU()) == "SwiGLU(dim=-1, activate='first', layout='halves', backend=auto) [multiact]"
    assert repr(mt.SwiGLU(layout="interleaved", alpha=1.702, limit=7.0)) == (
        "SwiGLU(dim=-1, activate='first', layout='interleaved', alpha=1.702, limit=7.0, backend=auto) [multiact]")
    assert repr(mt.GLU()) == "GLU(dim=-1, act='sigmoid', activate='second', layout='halves', backend=auto) [multiact]"
    assert repr(mt.GLU(1, act="leaky_relu", negative_slope=0.2)) == (
        "GLU(dim=1, act='leaky_relu', activate='second', layout='halves', negative_slope=0.2, backend=auto) [multiact]")
    assert repr(mt.GeGLU(approximate="tanh")) == (
        "GeGLU(dim=-1, approximate='tanh', activate='first', layout='halves', backend=auto) [multiact]")
    assert repr(mt.ReGLU(backend="numpy")) == (
        "ReGLU(dim=-1, activate='first', layout='halves', backend='numpy') [multiact]")
    assert mt.SwiGLU(limit=7.0).extra_repr() == "dim=-1, activate='first', layout='halves', limit=7.0, backend=auto"


def test_module_parameters_are_validated_when_built():
    with pytest.raises(ValueError, match=r"SwiGLU\(\).*limit"):
        mt.SwiGLU(limit=0.0)
    with pytest.raises(ValueError, match=r"GeGLU\(\).*approximate"):
        mt.GeGLU(approximate="fast")
    with pytest.raises(ValueError, match=r"GLU\(\).*act"):
        mt.GLU(act="prelu")
    with pytest.raises(ValueError, match="layout"):
        mt.ReGLU(layout="pairs")


@pytest.mark.parametrize("name", [c.name for c in COMPOSITES])
def test_odd_size_along_dim_is_a_clear_error(name):
    x = _randn(4, 5)
    for t in (x, x.clone().requires_grad_()):
        with pytest.raises(ValueError, match=rf"{name}\(\).*x\.shape\[1\] = 5 must be even"):
            getattr(mt, name)(t)
        with pytest.raises(ValueError, match=rf"{name}\(\).*x\.shape\[1\] = 5 must be even"):
            mt.MODULES[name]()(t)
    assert getattr(mt, name)(x, dim=0).shape == (2, 5)


def test_bad_two_input_calls():
    g = _randn(3, 4)
    with pytest.raises(ValueError, match=r"swiglu\(\).*up has shape"):
        mt.swiglu(g, up=_randn(3, 5))
    with pytest.raises(TypeError, match=r"multiact.torch.swiglu\(\).*dtype"):
        mt.swiglu(g, up=g.float())
    with pytest.raises(TypeError, match=r"multiact.torch.swiglu\(\).*dtype"):
        mt.swiglu(g.float(), up=g.bfloat16())
    with pytest.raises(TypeError, match=r"multiact.torch.swiglu\(\): up must be a torch.Tensor"):
        mt.swiglu(g, up=g.numpy())
    with pytest.raises(TypeError, match=r"multiact.torch.glu\(\): x must be a torch.Tensor"):
        mt.glu(g.numpy())
    with pytest.raises(ValueError, match="two-input form"):
        mt.swiglu(g, dim=0, up=g)


def test_backend_passes_through():
    x = _randn(4, 6).requires_grad_()
    mt.swiglu(x, backend="numpy").sum().backward()
    with pytest.raises(ValueError, match="unknown backend"):
        mt.swiglu(x, backend="nope")
