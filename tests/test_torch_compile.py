"""multiact.torch under torch.compile and torch.library.opcheck (issue 15): every module in one
fullgraph-compiled model (one graph, no breaks, forward and backward equal to eager), opcheck on every
registered custom op, one sample each (every parameter case: scripts/opcheck_all.py), gradient
penalties (WGAN-GP, R1) on a small DCGAN discriminator against nn.LeakyReLU, version counters."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import multiact as ma  # noqa: E402
import multiact.torch as mt  # noqa: E402
from multiact import consistency as C  # noqa: E402
from multiact.optable import OPS  # noqa: E402


def _every_module():
    """One instance of every multiact.torch module (an op's last parameter case: its corner)."""
    mods = []
    for name, cls in mt.MODULES.items():
        if name == "swish":
            mods.append(mt.Swish(1.3))
        elif name == "prelu":
            mods.append(mt.PReLU(8))
        elif name in OPS:
            mods.append(cls(**C.param_cases(OPS[name])[-1]))
    mods += [mt.GLU(act="leaky_relu", negative_slope=0.2), mt.SwiGLU(layout="interleaved", alpha=1.702, limit=7.0),
             mt.GeGLU(approximate="tanh"), mt.ReGLU(), mt.BiasAct(8, "leaky_relu", negative_slope=0.2, gain=2**0.5,
                                                                    scale=True)]
    return mods


class _EveryModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.acts = torch.nn.ModuleList(_every_module())

    def forward(self, x):
        h = self.lin(x)
        return torch.stack([a(h).square().mean() for a in self.acts])


def test_every_module_is_covered():
    names = {type(m).__name__ for m in _every_module()}
    assert names == {cls.__name__ for cls in mt.MODULES.values()}


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    return _EveryModule(), torch.randn(6, 8)


def test_explain_reports_one_graph_and_no_breaks(model_and_input):
    torch._dynamo.reset()
    model, x = model_and_input
    ex = torch._dynamo.explain(model)(x)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons


def _compiled_matches_eager(model, x, backend):
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, fullgraph=True, backend=backend)
    want = model(x)
    got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    want.sum().backward()
    got.sum().backward()
    for (n, p), q in zip(model.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_compile_fullgraph_every_module_forward_and_backward_equal_eager(model_and_input):
    """Dynamo (fullgraph) and AOT autograd's joint graph over fake tensors; inductor on the whole model is
    scripts/torch_compile_check.py (a cold inductor compile of ~30 custom ops takes half a minute here)."""
    torch._dynamo.reset()
    model, x = model_and_input
    model.zero_grad()
    _compiled_matches_eager(model, x, "aot_eager")


def test_compile_inductor_small_model():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), mt.LeakyReLU(0.2), mt.SwiGLU(), mt.GELU(approximate="tanh"),
                                mt.Swish(1.0), torch.nn.Linear(8, 1))
    _compiled_matches_eager(model, torch.randn(5, 8), "inductor")


def test_custom_ops_see_through_fake_and_meta_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 6, 8)
        assert mt.gelu(x, approximate="tanh").shape == (4, 6, 8)
        assert mt.swiglu(x).shape == (4, 6, 4)
        assert mt.bias_act(x, torch.empty(6), "relu").shape == (4, 6, 8)
    y = torch.ops.multiact.leaky_relu(torch.empty(3, 5, device="meta"), 0.2)
    assert y.device.type == "meta" and y.shape == (3, 5)
    with pytest.raises(ValueError, match="approximate"):  # parameters are checked while tracing
        torch.ops.multiact.gelu(torch.empty(3, device="meta"), "fast")


def test_export_sees_through():
    ep = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), mt.GELU(approximate="tanh")),
                             (torch.randn(2, 4),))
    assert any("multiact.gelu" in str(n.target) for n in ep.graph.nodes)


# ---- opcheck: every registered op, one sample each (scripts/opcheck_all.py runs every parameter case) --------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_opcheck_every_op(dtype):
    """torch.library.opcheck (schema, fake tensors, autograd registration, aot_dispatch_dynamic) on the first
    sample of every custom op: inputs that require grad where the op has a backward (bias_act_grad's included:
    its second order)."""
    done, bad = set(), {}
    for name, op, args in mt.opcheck_samples(dtype):
        if name in done:
            continue
        done.add(name)
        result = torch.library.opcheck(op, args)
        if any(v != "SUCCESS" for v in result.values()):
            bad[name] = result
    assert done == set(mt.CUSTOM_OPS)
    assert not bad


def test_every_op_is_registered_with_fake_and_autograd():
    for name, op in mt.CUSTOM_OPS.items():
        assert getattr(torch.ops.multiact, name) is not None
        assert op._abstract_fn is not None, name
        if not name.endswith("_"):
            assert op._backward_fn is not None, name


# ---- gradient penalties on a small DCGAN discriminator ---------------------------------------------------


def _discriminator(act, dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 4, 2, 1), act(),
        torch.nn.Conv2d(4, 8, 4, 2, 1), act(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 1)).to(dtype)


def _penalty_steps(act, dtype, kind, steps=5):
    d = _discriminator(act, dtype)
    opt = torch.optim.Adam(d.parameters(), lr=1e-3, betas=(0.5, 0.9))
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        real = torch.randn(6, 1, 16, 16, generator=g, dtype=torch.float64).to(dtype)
        fake = torch.randn(6, 1, 16, 16, generator=g, dtype=torch.float64).to(dtype)
        opt.zero_grad()
        if kind == "wgan-gp":
            eps = torch.rand(6, 1, 1, 1, generator=g, dtype=torch.float64).to(dtype)
            mix = (eps * real + (1 - eps) * fake).requires_grad_()
            (gm,) = torch.autograd.grad(d(mix).sum(), mix, create_graph=True)
            pen = ((gm.flatten(1).norm(dim=1) - 1) ** 2).mean()
            loss = d(fake).mean() - d(real).mean() + 10 * pen
        else:  # R1: the squared gradient norm on real data
            real.requires_grad_()
            out = d(real)
            (gr,) = torch.autograd.grad(out.sum(), real, create_graph=True)
            loss = F.softplus(-out).mean() + F.softplus(d(fake)).mean() + 5 * gr.square().flatten(1).sum(1).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in d.parameters()]


@pytest.mark.parametrize("kind", ["wgan-gp", "r1"])
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["float64", "float32"])
def test_gradient_penalty_matches_nn_leaky_relu(kind, dtype, rtol):
    a, pa = _penalty_steps(lambda: mt.LeakyReLU(0.2), dtype, kind)
    b, pb = _penalty_steps(lambda: torch.nn.LeakyReLU(0.2), dtype, kind)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=0)
    for p, q in zip(pa, pb, strict=True):
        torch.testing.assert_close(p, q, rtol=rtol * 10, atol=rtol * 10)


def test_in_place_leaky_relu_in_a_gradient_penalty():
    """inplace=True starts the backward from y; leaky_relu's y-form is piecewise linear, so its second
    derivative is the zero term and the penalty trains as with torch's own in-place LeakyReLU."""
    a, _ = _penalty_steps(lambda: mt.LeakyReLU(0.2, inplace=True), torch.float64, "wgan-gp", steps=2)
    b, _ = _penalty_steps(lambda: torch.nn.LeakyReLU(0.2, inplace=True), torch.float64, "wgan-gp", steps=2)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-10, atol=0)


def test_hessian_of_silu_is_torchs():
    x = torch.linspace(-4, 4, 9, dtype=torch.float64)
    h = torch.autograd.functional.hessian(lambda t: mt.silu(t).sum(), x)
    torch.testing.assert_close(h, torch.autograd.functional.hessian(lambda t: F.silu(t).sum(), x), rtol=1e-12,
                               atol=1e-14)


# ---- writes into tensors are visible to autograd -----------------------------------------------------


def test_version_counters_move_on_every_write():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    w = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    z = (a * w).sum()
    with torch.no_grad():
        ma.relu(w, out=w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    w = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    z = (a * w).sum()
    v = w._version
    mt.relu(w, inplace=True)  # no grad needed: the mutating op multiact::relu_
    assert w._version > v
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    t = torch.randn(4, requires_grad=True)
    with pytest.raises(ValueError, match="requires grad"):
        ma.relu(torch.randn(4), out=t)


def test_explain_for_torch_inputs_and_composites():
    x = torch.randn(8)
    assert "torch CPU float32 tensors" in ma.explain("gelu", x)
    assert "bfloat16" in ma.explain("gelu", x.to(torch.bfloat16)) and "cannot run" not in ma.explain(
        "gelu", x.to(torch.bfloat16))
    for name in ("swiglu", "glu", "geglu", "reglu", "bias_act"):
        text = ma.explain(name, x)
        assert "unknown op" not in text and "cannot run" not in text, text
    assert "gated:silu" in ma.explain("swiglu", x)
    assert "gated:gelu_tanh" in ma.explain("geglu", x, approximate="tanh")
