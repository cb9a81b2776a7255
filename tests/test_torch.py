"""PyTorch: CPU tensors through the plain API, and multiact.torch's autograd functions and modules."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import multiact as ma  # noqa: E402
import multiact.torch as mt  # noqa: E402
from multiact import consistency as C  # noqa: E402
from multiact.optable import FLOAT_DTYPES, OPS  # noqa: E402

CASES = [pytest.param(op, params, id=f"{op}[{C.case_id(params)}]") for op in OPS for params in C.param_cases(OPS[op])]
TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


# ---- the plain API with CPU tensors ------------------------------------------------------------


def _tensor_back(dtype):
    def back(t):
        assert isinstance(t, torch.Tensor), f"expected a tensor result, got {type(t).__name__}"
        assert t.dtype == TORCH_DTYPES[dtype]
        return t.numpy()

    return back


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,params", CASES)
def test_shared_suite_with_tensors(op, params, dtype):
    """The shared consistency comparison, with torch tensors in and tensors (same dtype) out."""
    failures = C.case_failures(None, op, params, dtype, to_kind=torch.from_numpy, from_kind=_tensor_back(dtype))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_out_tensor_is_written_in_place(dtype):
    x = torch.linspace(-3, 3, 24, dtype=dtype).reshape(4, 6)
    want = ma.gelu(x.numpy())
    out = torch.full_like(x, 7.0)
    assert ma.gelu(x, out=out) is out
    np.testing.assert_array_equal(out.numpy(), want)
    ptr = x.data_ptr()
    assert ma.gelu(x, out=x) is x and x.data_ptr() == ptr
    np.testing.assert_array_equal(x.numpy(), want)


def test_non_contiguous_tensors_and_out():
    base = torch.randn(6, 8, dtype=torch.float32)
    x = base.t()[::2]  # transposed and strided
    assert not x.is_contiguous()
    y = ma.silu(x)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    np.testing.assert_array_equal(y.numpy(), ma.silu(x.contiguous().numpy()))
    out = torch.zeros(8, 6).t()
    ma.silu(base, out=out)
    np.testing.assert_array_equal(out.numpy(), ma.silu(base.numpy()))
    dy = torch.randn(8, 6).t()
    np.testing.assert_array_equal(ma.silu_grad(dy, base).numpy(), ma.silu_grad(dy.contiguous().numpy(), base.numpy()))


def test_tensor_that_requires_grad_goes_through_plain_functions():
    x = torch.randn(10, requires_grad=True)
    y = ma.tanh(x)
    assert isinstance(y, torch.Tensor) and not y.requires_grad
    np.testing.assert_array_equal(y.numpy(), ma.tanh(x.detach().numpy()))


def test_bfloat16_is_computed_in_float32_and_rounded_once():
    x = torch.linspace(-4, 4, 101, dtype=torch.bfloat16)
    dy = torch.linspace(1, 2, 101, dtype=torch.bfloat16)
    y = ma.gelu(x, approximate="tanh")
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, ma.gelu(x.float(), approximate="tanh").to(torch.bfloat16))
    g = ma.gelu_grad(dy, x)
    assert g.dtype == torch.bfloat16 and torch.equal(g, ma.gelu_grad(dy.float(), x.float()).to(torch.bfloat16))


def test_bfloat16_out_is_written_in_place():
    """bfloat16 tensors are zero-copy views (issue 18): out= a bfloat16 tensor is written, in place too."""
    x = torch.ones(5, dtype=torch.bfloat16)
    ptr = x.data_ptr()
    assert ma.relu(-x, out=x) is x and x.data_ptr() == ptr
    assert torch.equal(x, torch.zeros(5, dtype=torch.bfloat16))


def test_param_grads_with_tensors():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    dy = rng.standard_normal((5, 3)).astype(np.float32)
    w = np.array([0.1, -0.2, 0.3], dtype=np.float32)
    got = ma.prelu_weight_grad(torch.from_numpy(dy), torch.from_numpy(x), torch.from_numpy(w))
    assert isinstance(got, torch.Tensor) and got.shape == (3,)
    np.testing.assert_array_equal(got.numpy(), ma.prelu_weight_grad(dy, x, w))
    b = ma.swish_beta_grad(torch.from_numpy(dy), torch.from_numpy(x), beta=1.3)
    assert float(b) == float(ma.swish_beta_grad(dy, x, beta=1.3))


# ---- autograd: gradcheck in float64 --------------------------------------------------------------


def _away_from_kinks(spec, params, n=12, seed=0, dtype=torch.float64, shape=None):
    """Values in [-3.5, 3.5] at least 0.05 from every kink (finite differences straddle nothing)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3.5, 3.5, n)
    plain = {k: v for k, v in params.items() if k != "weight"}
    kinks = spec.kinks(spec.validate(plain)) if spec.name != "prelu" else (0.0,)
    for k in kinks:
        near = np.abs(x - k) < 0.05
        x[near] = k + np.where(x[near] >= k, 0.05, -0.05) + 0.01 * np.sign(x[near] - k + 1e-9)
    t = torch.tensor(x, dtype=dtype)
    return t.reshape(shape) if shape else t


def _call_args(op, params, dtype, learn_grad=True):
    """(kwargs for mt.<op>, list of learnable tensors) for one parameter case."""
    kw = dict(params)
    learn = []
    if op == "prelu":
        w = C.prelu_weight(np.zeros((3, 4)), params["weight"])
        kw["weight"] = torch.tensor(w, dtype=dtype, requires_grad=learn_grad)
        learn.append(kw["weight"])
    if op == "swish":
        kw["beta"] = torch.tensor(params.get("beta", 1.0), dtype=dtype, requires_grad=learn_grad)
        learn.append(kw["beta"])
    return kw, learn


@pytest.mark.parametrize("op,params", CASES)
def test_gradcheck(op, params):
    spec = OPS[op]
    kw, learn = _call_args(op, params, torch.float64)
    x = _away_from_kinks(spec, params, shape=(3, 4)).requires_grad_()
    names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]

    def f(x, *ps):
        return getattr(mt, op)(x, **{**kw, **dict(zip(names, ps, strict=True))})

    assert torch.autograd.gradcheck(f, (x, *learn))


@pytest.mark.parametrize("op", [op for op in OPS if op not in ("prelu",)])
def test_gradcheck_in_place(op):
    """inplace=True: gradients through the output (supports_y) or a saved copy of the input."""
    spec = OPS[op]
    params = C.param_cases(spec)[0]
    kw, learn = _call_args(op, params, torch.float64)
    x = _away_from_kinks(spec, params).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, *ps: getattr(mt, op)(x * 1.0, inplace=True, **kw), (x, *learn))


def _saved(fn):
    """The tensors autograd saves while running fn()."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn()
    return out, saved


@pytest.mark.parametrize("op", ["sigmoid", "tanh", "relu", "elu", "leaky_relu", "gelu"])
def test_in_place_saves_the_output_where_the_op_allows(op):
    spec = OPS[op]
    x = torch.randn(50, requires_grad=True)
    h = x * 2.0
    y, saved = _saved(lambda: getattr(mt, op)(h, inplace=True))
    assert y is h
    ours = [t for t in saved if t.shape == h.shape and t.data_ptr() != x.data_ptr()]
    from_y = spec.supports_y(spec.validate({}))
    assert len(ours) == 1
    assert (ours[0].data_ptr() == y.data_ptr()) == from_y
    y.sum().backward()
    ref = torch.autograd.grad(getattr(mt, op)(x * 2.0).sum(), x)[0]
    torch.testing.assert_close(x.grad, ref)


def test_in_place_on_a_leaf_that_requires_grad_is_refused():
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        mt.relu(x, inplace=True)


def test_in_place_without_grad_writes_input():
    x = torch.linspace(-1, 1, 9)
    want = ma.relu(x.numpy().copy())
    assert mt.ReLU(inplace=True)(x) is x
    np.testing.assert_array_equal(x.numpy(), want)


@pytest.mark.parametrize("op,params", CASES)
def test_gradgradcheck(op, params):
    """Second order through torch.ops.multiact.<op>_grad's autograd: d(dy) is the first backward again, d(x)
    runs multiact.backward2 (f''), and the learnable swish beta / prelu weight get their mixed terms."""
    spec = OPS[op]
    kw, learn = _call_args(op, params, torch.float64)
    x = _away_from_kinks(spec, params, shape=(3, 4)).requires_grad_()
    names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]

    def f(x, *ps):
        return getattr(mt, op)(x, **{**kw, **dict(zip(names, ps, strict=True))})

    assert torch.autograd.gradgradcheck(f, (x, *learn))


def test_create_graph_gives_a_graph_and_the_hessian_is_torchs():
    x = torch.linspace(-3, 3, 7, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(mt.gelu(x).sum(), x, create_graph=True)
    assert g.requires_grad and g.grad_fn is not None
    h = torch.autograd.functional.hessian(lambda t: mt.silu(t).sum(), x.detach())
    want = torch.autograd.functional.hessian(lambda t: F.silu(t).sum(), x.detach())
    assert h.abs().sum() > 0
    torch.testing.assert_close(h, want, rtol=1e-12, atol=1e-14)


def test_double_backward_through_an_in_place_own_y_form_is_refused_clearly():
    """The in-place backward starts from y; where f' in terms of y has no derivative in the table, a second
    backward raises (never a gradient without a graph); piecewise-linear y-forms give their zero term."""
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(mt.sigmoid(x * 1.0, inplace=True).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        g.sum().backward()
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(mt.leaky_relu(x * 2.0, 0.2, inplace=True).sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.tensor([0.4, 2.0, 0.4, 2.0], dtype=torch.float64))
    (h,) = torch.autograd.grad(g.sum(), x, allow_unused=True)
    assert h is None or not h.any()


# ---- against torch's own modules in float32 ------------------------------------------------------


def _fast_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def _torch_module(op, params, learn):
    """PyTorch's own module for op (or the formula where torch has none), with the same parameters."""
    if op == "prelu":
        m = torch.nn.PReLU(learn[0].numel())
        with torch.no_grad():
            m.weight.copy_(learn[0])
        return m
    if op == "swish":
        beta = float(learn[0])
        return lambda x: x * torch.sigmoid(beta * x)
    if op == "fast_gelu":
        return _fast_gelu
    cls = getattr(torch.nn, mt.module_name(op))
    extra = set(params) - set(inspect.signature(cls).parameters)
    if extra:  # ONNX's parameters (selu's alpha/scale, hardsigmoid's alpha/beta): torch's module has none
        pytest.skip(f"torch.nn.{cls.__name__} takes no {', '.join(sorted(extra))} (checked against the reference)")
    return cls(**params)


def _our_module(op, params, learn):
    if op == "prelu":
        m = mt.PReLU(learn[0].numel())
        with torch.no_grad():
            m.weight.copy_(learn[0])
        return m
    if op == "swish":
        return mt.Swish(float(learn[0]))
    return mt.MODULES[op](**params)


@pytest.mark.parametrize("op,params", CASES)
def test_matches_torch_modules_float32(op, params):
    spec = OPS[op]
    _, learn = _call_args(op, params, torch.float32, learn_grad=False)
    x0 = _away_from_kinks(spec, params, n=240, seed=5, dtype=torch.float32, shape=(60, 4))
    dy = torch.randn(60, 4, generator=torch.Generator().manual_seed(1))
    got_x = x0.clone().requires_grad_()
    want_x = x0.clone().requires_grad_()
    got = _our_module(op, params, learn)(got_x)
    want = _torch_module(op, params, learn)(want_x)
    # The absolute floor is ~4 eps * max|x|: torch's float32 gelu computes 1 + erf(x/sqrt2), which
    # cancels for negative x (2.6e-7 abs error there, against 3e-8 for multiact's erfc form).
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
    got.backward(dy)
    want.backward(dy)
    torch.testing.assert_close(got_x.grad, want_x.grad, rtol=2e-6, atol=2e-6)


# ---- training ------------------------------------------------------------------------------------


def _mlp(act_a, act_b, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), act_a, torch.nn.Linear(32, 16), act_b, torch.nn.Linear(16, 1))


def _train(model, steps, lr=0.05, opt="sgd"):
    g = torch.Generator().manual_seed(11)
    X = torch.randn(64, 8, generator=g)
    Y = torch.sin(X.sum(1, keepdim=True))
    o = torch.optim.SGD(model.parameters(), lr=lr) if opt == "sgd" else torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        o.zero_grad()
        loss = F.mse_loss(model(X), Y)
        loss.backward()
        o.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(
    "ours,theirs",
    [
        ((mt.GELU(approximate="tanh"), mt.SiLU()), (torch.nn.GELU(approximate="tanh"), torch.nn.SiLU())),
        ((mt.LeakyReLU(0.1), mt.ELU(inplace=True)), (torch.nn.LeakyReLU(0.1), torch.nn.ELU())),
        ((mt.Mish(), mt.Tanh()), (torch.nn.Mish(), torch.nn.Tanh())),
        ((mt.Sigmoid(inplace=True), mt.ReLU()), (torch.nn.Sigmoid(), torch.nn.ReLU())),
    ],
    ids=["gelu-silu", "leaky-elu_inplace", "mish-tanh", "sigmoid_inplace-relu"],
)
def test_tiny_training_loop_matches_torch(ours, theirs):
    a = _train(_mlp(*ours), steps=6)
    b = _train(_mlp(*theirs), steps=6)
    assert a[-1] < a[0]
    np.testing.assert_allclose(a, b, rtol=1e-4)


class _TorchSwish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)


def test_swish_beta_and_prelu_weight_learn():
    ours = _mlp(mt.Swish(beta=1.0, learnable=True), mt.PReLU(16, init=0.25))
    theirs = _mlp(_TorchSwish(), torch.nn.PReLU(16, init=0.25))
    a = _train(ours, steps=25, lr=0.02, opt="adam")
    b = _train(theirs, steps=25, lr=0.02, opt="adam")
    swish, prelu = ours[1], ours[3]
    assert abs(swish.beta.item() - 1.0) > 1e-3, "beta did not move"
    assert not torch.allclose(prelu.weight, torch.full((16,), 0.25)), "PReLU weight did not move"
    assert a[-1] < 0.8 * a[0]
    np.testing.assert_allclose(a, b, rtol=1e-3)
    torch.testing.assert_close(swish.beta, theirs[1].beta, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(prelu.weight, theirs[3].weight, rtol=1e-3, atol=1e-4)


def test_swish_not_learnable_keeps_beta():
    m = mt.Swish(beta=1.5, learnable=False)
    assert not list(m.parameters())
    x = torch.randn(6, requires_grad=True)
    m(x).sum().backward()
    assert float(m.beta) == 1.5 and x.grad is not None


# ---- generated API ---------------------------------------------------------------------------------


def test_every_op_has_a_function_and_a_module():
    for op in OPS:
        assert callable(getattr(mt, op))
        assert issubclass(mt.MODULES[op], torch.nn.Module)
        assert getattr(mt, mt.MODULES[op].__name__) is mt.MODULES[op]
    for name in ["GELU", "LeakyReLU", "Swish", "PReLU", "SiLU", "Mish", "ELU", "Tanh", "Sigmoid", "ReLU"]:
        assert hasattr(mt, name)


def test_module_parameters_are_validated_when_built():
    with pytest.raises(ValueError, match="approximate"):
        mt.GELU(approximate="fast")
    with pytest.raises(ValueError, match="min_val"):
        mt.Hardtanh(1.0, -1.0)


def test_backend_passes_through():
    x = torch.randn(8, requires_grad=True)
    mt.gelu(x, backend="numpy").sum().backward()
    with pytest.raises(ValueError, match="unknown backend"):
        mt.gelu(x, backend="nope")


def test_writing_into_a_tensor_bumps_its_version_so_autograd_raises():
    """`ma.relu(w, out=w)` on a tensor saved for a backward: torch's own error, not a silent wrong grad."""
    a = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    w = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    z = (a * w).sum()
    before = w._version
    with torch.no_grad():
        ma.relu(w, out=w)
    assert w._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    # a saved sigmoid output overwritten under no_grad
    x = torch.linspace(-2, 2, 8, requires_grad=True)
    y = torch.sigmoid(x)
    with torch.no_grad():
        ma.tanh(y.detach(), out=y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    # a grad written into a tensor: the same
    dy = torch.ones(4)
    before = dy._version
    ma.relu_grad(dy, torch.tensor([1.0, -1.0, 2.0, -2.0]), out=dy)
    assert dy._version > before


# ---- readable objects (issue 21 item 4) ---------------------------------------------------------------


def test_every_module_says_multiact_when_printed():
    made = [mt.BiasAct(4, "gelu")]
    for name, cls in mt.MODULES.items():
        if name in OPS and name not in ("swish", "prelu"):
            spec = OPS[name]
            made.append(cls(**{**spec.defaults(), **C.param_cases(spec)[0]}))
        elif name != "bias_act":
            made.append(cls())
    for m in made:
        text = repr(m)
        assert text.endswith(" [multiact]") and "backend=auto" in text, text
        assert text.startswith(type(m).__name__ + "("), text
    assert repr(mt.GELU(approximate="tanh")) == "GELU(approximate='tanh', backend=auto) [multiact]"
    assert repr(mt.LeakyReLU(0.2, backend="numpy")) == "LeakyReLU(negative_slope=0.2, backend='numpy') [multiact]"
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), mt.SiLU(), torch.nn.ReLU())
    lines = repr(model).splitlines()
    assert lines[2].strip() == "(1): SiLU(backend=auto) [multiact]" and "multiact" not in lines[3], lines


def test_dir_lists_only_public_names():
    names = dir(mt)
    for hidden in ("Any", "torch", "nn", "np", "dispatch", "math", "inspect", "ast", "api", "registry", "OPS"):
        assert hidden not in names
    assert not [n for n in names if n.startswith("_")]
    assert set(mt.__all__) <= set(names)
    assert {*mt.FUNCTIONS, *(cls.__name__ for cls in mt.MODULES.values())} == set(mt.__all__)
    for n in names:
        getattr(mt, n)
