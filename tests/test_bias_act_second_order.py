"""Second order through bias_act (issue 43): mt.bias_act / mt.BiasAct differentiable twice, the activation's f''
(multiact.backward2) composed with scale and gain, clamp's mask kept.  gradgradcheck in float64 over b and scale
per channel, of x's shape and absent, with and without clamp; StyleGAN2's R1 penalty with mt.BiasAct against the
unfused torch composition over 5 steps (float64 to 1e-10); every host backend that runs backward2."""

from __future__ import annotations

import math

import pytest
from conftest import host_backends, require

torch = pytest.importorskip("torch")
F = torch.nn.functional

import multiact.torch as mt  # noqa: E402

# (activation, its parameters, b and scale: per channel / of x's shape / absent, clamp): each activation once,
# the forms and the clamp spread over them (each case is a few seconds of gradgradcheck)
CASES = [("linear", {}, "channel", None), ("leaky_relu", {"negative_slope": 0.2}, "channel", 0.8),
         ("leaky_relu", {"negative_slope": 0.2}, "full", None), ("gelu", {"approximate": "tanh"}, "none", 0.8),
         ("gelu", {}, "full", None), ("silu", {}, "channel", None), ("elu", {"alpha": 0.5}, "full", 0.8),
         ("softplus", {"beta": 2.0, "threshold": 5.0}, "none", None)]


def _sides(form, shape, dim, dtype, gen):
    if form == "none":
        return None, None
    s = (shape[dim],) if form == "channel" else shape
    b = torch.randn(s, dtype=dtype, generator=gen).requires_grad_()
    scale = (torch.rand(s, dtype=dtype, generator=gen) + 0.5).requires_grad_()
    return b, scale


@pytest.mark.parametrize("act,kw,form,clamp", CASES, ids=[f"{a}-{f}-{c}" for a, _, f, c in CASES])
def test_gradgradcheck_of_the_function(act, kw, form, clamp):
    gen = torch.Generator().manual_seed(3)
    shape, dim = (2, 3, 2), 1
    x = torch.randn(shape, dtype=torch.float64, generator=gen).requires_grad_()
    b, scale = _sides(form, shape, dim, torch.float64, gen)

    def f(x, b, scale):
        return mt.bias_act(x, b, act, dim=dim, scale=scale, gain=1.3, clamp=clamp, **kw)

    assert torch.autograd.gradcheck(f, (x, b, scale))
    assert torch.autograd.gradgradcheck(f, (x, b, scale))


@pytest.mark.parametrize("backend", host_backends())
def test_second_order_on_each_backend_with_backward2(backend):
    """The module (learned bias and scale, last dim, clamped) with backend=: bias_act's forward and backward and
    the activation's backward2 all on that backend, float32, against the float64 result of the default choice."""
    dtype = "float32"
    for key, direction in (("bias_act:leaky_relu", "forward"), ("bias_act:leaky_relu", "backward"),
                           ("leaky_relu", "backward2")):
        require(backend, key, direction, dtype)
    gen = torch.Generator().manual_seed(1)
    x64 = torch.randn(5, 4, dtype=torch.float64, generator=gen)

    def hvp(dtype, backend):
        m = mt.BiasAct(4, "leaky_relu", dim=-1, negative_slope=0.2, gain=2 ** 0.5, clamp=1.5, scale=True,
                       backend=backend, dtype=dtype)
        with torch.no_grad():
            m.bias.copy_(torch.linspace(-0.5, 0.5, 4))
            m.scale.copy_(torch.linspace(0.5, 2.0, 4))
        x = x64.to(dtype).requires_grad_()
        (gx,) = torch.autograd.grad(m(x).square().sum(), x, create_graph=True)
        return torch.autograd.grad((gx.square() * torch.arange(4, dtype=dtype)).sum(), (x, m.bias, m.scale))

    want = hvp(torch.float64, None)
    for g, w in zip(hvp(torch.float32, backend), want, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5 * w.abs().max().item())


def test_second_order_in_float32_and_bfloat16_is_the_float64_one_rounded():
    gen = torch.Generator().manual_seed(5)
    x64 = torch.randn(4, 6, 5, dtype=torch.float64, generator=gen)
    b64 = torch.randn(6, dtype=torch.float64, generator=gen)

    def hvp(dtype):
        x = x64.to(dtype).requires_grad_()
        b = b64.to(dtype).requires_grad_()
        (gx,) = torch.autograd.grad(mt.bias_act(x, b, "gelu", gain=2.0).square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, b))

    want = hvp(torch.float64)
    for dtype, rtol in ((torch.float32, 1e-4), (torch.bfloat16, 6e-2)):
        for g, w in zip(hvp(dtype), want, strict=True):
            assert g.dtype == dtype
            torch.testing.assert_close(g.double(), w, rtol=rtol, atol=rtol * w.abs().max().item())


# ---- StyleGAN2's R1 penalty -----------------------------------------------------------------------------------


class _Disc(torch.nn.Module):
    """A StyleGAN2-like discriminator block: convolutions without bias, then bias + lrelu * sqrt(2), clamped at
    256 (conv_clamp), fused (mt.BiasAct) or unfused (torch's own ops)."""

    def __init__(self, fused: bool, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.fused = fused
        self.convs = torch.nn.ModuleList([torch.nn.Conv2d(1, 4, 3, padding=1, bias=False),
                                          torch.nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False)])
        self.biases = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4) * 0.1),
                                              torch.nn.Parameter(torch.randn(8) * 0.1)])
        self.acts = torch.nn.ModuleList([mt.BiasAct(c, "leaky_relu", negative_slope=0.2, gain=math.sqrt(2),
                                                    clamp=256.0) for c in (4, 8)])
        self.out = torch.nn.Linear(8 * 4 * 4, 1)
        for a, b in zip(self.acts, self.biases, strict=True):
            a.bias = b  # one parameter, used by whichever path runs
        self.to(dtype)

    def forward(self, x):
        for conv, b, act in zip(self.convs, self.biases, self.acts, strict=True):
            x = conv(x)
            if self.fused:
                x = act(x)
            else:
                x = (F.leaky_relu(x + b.view(1, -1, 1, 1), 0.2) * math.sqrt(2)).clamp(-256.0, 256.0)
        return self.out(x.flatten(1))


def _r1_steps(fused: bool, dtype, steps: int = 5):
    d = _Disc(fused, dtype)
    opt = torch.optim.Adam(d.parameters(), lr=2e-3, betas=(0.0, 0.99))
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        real = torch.randn(6, 1, 8, 8, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        fake = torch.randn(6, 1, 8, 8, generator=g, dtype=torch.float64).to(dtype)
        opt.zero_grad()
        out = d(real)
        (gr,) = torch.autograd.grad(out.sum(), real, create_graph=True)
        r1 = gr.square().sum([1, 2, 3]).mean()
        loss = F.softplus(-out).mean() + F.softplus(d(fake)).mean() + 10 / 2 * r1
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in d.parameters()]


def test_stylegan2_r1_penalty_matches_the_unfused_composition():
    a, pa = _r1_steps(True, torch.float64)
    b, pb = _r1_steps(False, torch.float64)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-10, atol=0)
    for p, q in zip(pa, pb, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-10)
