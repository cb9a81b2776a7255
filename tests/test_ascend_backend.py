"""The ascend backend here: honest detection, and its CANN code path run on the CPU provider."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact import reference as R
from multiact.backend import ascend_backend as A


def test_detection_says_why_in_words_a_user_can_act_on():
    info = {b.name: b for b in ma.backends()}["ascend"]
    if info.available:
        pytest.skip(f"an Ascend NPU is usable here: {info.reason}")
    assert "no Ascend NPU usable here" in info.reason
    assert "CANNExecutionProvider" in info.reason or "libascendcl" in info.reason or "onnxruntime" in info.reason
    assert "torch_npu" in info.reason
    assert "pip install" in info.reason


def test_detection_imports_no_torch():
    code = "import sys, multiact as ma; ma.backends(); print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False", res.stderr


def test_a_session_that_falls_back_is_not_cann():
    pytest.importorskip("onnxruntime")
    ok, why = A._session_runs_on_cann(lambda: ["CPUExecutionProvider"])
    assert not ok and "fell back to CPUExecutionProvider" in why


def test_cann_provider_options_keep_float32():
    name, opts = A.provider_list()[0]
    assert name == "CANNExecutionProvider" and opts["precision_mode"] == "must_keep_origin_dtype"
    assert A.provider_list()[-1] == "CPUExecutionProvider"


@pytest.fixture
def cann_path_on_cpu(monkeypatch):
    """The ascend backend's ORT path with only the provider list swapped for the CPU provider."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(A, "provider_list", lambda: ["CPUExecutionProvider"])
    A._runner.clear()
    yield
    A._runner.clear()


@pytest.mark.parametrize("op, params", [("gelu", {"approximate": "none"}), ("fast_gelu", {}),
                                        ("softplus", {"beta": 1.0, "threshold": 20.0}), ("sigmoid", {})])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_cann_code_path_runs_on_cpu_provider(cann_path_on_cpu, op, params, dtype):
    spec = ma.ops()[op]
    x = np.linspace(-6, 6, 301).astype(dtype)[::-1]  # strided view
    out = np.empty_like(x)
    A.kernel(op, "forward", dtype)(x, out, params)
    ref = spec.forward(x.astype(np.float64), **params)
    tol = 2e-3 if dtype == "float16" else 2e-6
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * 1e-3)
    dy = np.ones_like(x)
    A.kernel(op, "backward", dtype)(dy, x, out, params)
    np.testing.assert_allclose(out, spec.backward(dy.astype(np.float64), x.astype(np.float64), **params),
                               rtol=tol, atol=tol)
    entry = A._runner.entry(op, "forward", dtype, tuple(params.values()), params)
    assert entry.sess.get_providers() == ["CPUExecutionProvider"]


def test_torch_path_on_cpu_tensors():
    """The torch_npu path's code on CPU tensors (on an NPU the same torch calls run CANN kernels)."""
    torch = pytest.importorskip("torch")
    x = torch.linspace(-5, 5, 101, dtype=torch.float32)
    x64 = x.double().numpy()
    cases = [("gelu", {"approximate": "tanh"}), ("fast_gelu", {}), ("swish", {"beta": 1.5}), ("mish", {}),
             ("threshold", {"threshold": 0.5, "value": -1.0}), ("softplus", {"beta": 2.0, "threshold": 5.0})]
    for op, p in cases:
        spec = ma.ops()[op]
        out = torch.empty_like(x)
        A.kernel(op, "forward", "float32")(x, out, p)
        np.testing.assert_allclose(out.numpy(), spec.forward(x64, **p), rtol=1e-5, atol=1e-6, err_msg=op)
        dy = torch.ones_like(x)
        A.kernel(op, "backward", "float32")(dy, x, out, p)
        np.testing.assert_allclose(out.numpy(), spec.backward(np.ones_like(x64), x64, **p), rtol=1e-5, atol=1e-5,
                                   err_msg=op)
    y = torch.sigmoid(x)
    out = torch.empty_like(x)
    A.kernel("elu", "backward_y", "float32")(torch.ones_like(x), torch.nn.functional.elu(x), out, {"alpha": 1.0})
    np.testing.assert_allclose(out.numpy(), R.elu_grad(np.ones_like(x64), x64, 1.0), rtol=1e-5)
    A.kernel("sigmoid", "backward_y", "float32")(torch.ones_like(x), y, out, {})
    np.testing.assert_allclose(out.numpy(), R.sigmoid_grad(np.ones_like(x64), x64), rtol=1e-5, atol=1e-7)
    w = np.array([0.1, 0.2, 0.3], np.float32).reshape(1, 3, 1)
    x3 = torch.randn(2, 3, 4)
    dy3 = torch.randn(2, 3, 4)
    got = A.kernel("prelu", "param_grad", "float32")(dy3, x3, {"weight": w, "axis": 1})
    want = R.prelu_weight_grad(dy3.double().numpy(), x3.double().numpy(), w, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# ---- bias_act (issue 16): ONNX Runtime for host arrays, torch ops for NPU tensors -------------------------------


def _bias_case(shape=(4, 5, 6), dtype=np.float32, seed=31):
    rng = np.random.default_rng(seed)
    x, dy = ((rng.standard_normal(shape) * 2).astype(dtype) for _ in range(2))
    return x, dy, rng.uniform(-1, 1, shape[1]).astype(dtype), rng.uniform(0.5, 1.5, shape[1]).astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_bias_act_cann_graphs_run_on_cpu_provider(cann_path_on_cpu, dtype):
    """Host arrays with backend="ascend" take the ORT graphs (here on the CPU provider): numpy's results."""
    x, dy, b, s = _bias_case(dtype=dtype)
    kw = {"gain": 2 ** 0.5, "clamp": 1.5, "negative_slope": 0.2}
    tol = 2e-3 if dtype == "float16" else 2e-6
    reg = ma.registry
    reg.clear_cache()
    try:
        reg._avail["ascend"] = (True, "test: the CANN path on the CPU provider")
        got = ma.bias_act(x, b, "leaky_relu", scale=s, backend="ascend", **kw)
        grads = ma.bias_act_grad(dy, x, b, "leaky_relu", scale=s, backend="ascend", **kw)
    finally:
        reg.clear_cache()
    np.testing.assert_allclose(got, ma.bias_act(x, b, "leaky_relu", scale=s, backend="numpy", **kw), rtol=tol,
                               atol=tol)
    for g, w in zip(grads, ma.bias_act_grad(dy, x, b, "leaky_relu", scale=s, backend="numpy", **kw), strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * 10)
    assert {e.sess.get_providers()[0] for e in A._runner._sessions.values()} == {"CPUExecutionProvider"}


def test_bias_act_is_refused_with_the_reason_when_no_npu_is_usable():
    info = {b.name: b for b in ma.backends()}["ascend"]
    if info.available:
        pytest.skip(f"an Ascend NPU is usable here: {info.reason}")
    x, _, b, _ = _bias_case()
    with pytest.raises(ma.BackendError, match=r"backend 'ascend' \(backend=\) is not available: no Ascend NPU "
                                              r"usable here: .*torch_npu"):
        ma.bias_act(x, b, "gelu", backend="ascend")


@pytest.fixture
def cpu_tensors_as_npu(monkeypatch):
    """CPU tensors that multiact sees as NPU tensors, and the ascend backend available: the dispatch of an NPU
    call (fused_bias_act's device route, registry, ascend.kernel) down to the torch ops, run by torch's CPU
    kernels where an NPU would run CANN's."""
    torch = pytest.importorskip("torch")
    from multiact import _arrays, registry

    real = _arrays.kind_of
    monkeypatch.setattr(_arrays, "kind_of", lambda a: "npu" if isinstance(a, torch.Tensor) and a.device.type ==
                        "cpu" else real(a))
    registry.clear_cache()
    registry._avail["ascend"] = (True, "test: CPU tensors as NPU tensors")
    yield torch
    registry.clear_cache()


def test_bias_act_dispatch_of_an_npu_call(cpu_tensors_as_npu):
    """Without backend=, an NPU tensor goes to ascend (the one backend for npu arrays), whose kernel takes the
    torch path (never ORT) and returns torch tensors; x is left as it was (no requires_grad, no write); ascend
    unavailable, the same call names why."""
    torch = cpu_tensors_as_npu
    from multiact import registry

    x, dy, b, s = _bias_case()
    xt = torch.from_numpy(x.copy())
    mod, _ = registry.select("bias_act:gelu", "backward", "float32", "npu")
    assert mod.NAME == "ascend"
    dx, db, ds = ma.bias_act_grad(torch.from_numpy(dy), xt, torch.from_numpy(b), "gelu", scale=torch.from_numpy(s))
    assert all(isinstance(t, torch.Tensor) for t in (dx, db, ds)) and not xt.requires_grad
    np.testing.assert_array_equal(xt.numpy(), x)
    # multiact.torch runs the kernels below autograd (custom ops): the backward must not need autograd there
    import multiact.torch as mt

    xg, bg = torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(b).requires_grad_()
    mt.bias_act(xg, bg, "gelu", clamp=1.0).backward(torch.from_numpy(dy))
    xr, br = torch.from_numpy(x).double().requires_grad_(), torch.from_numpy(b).double().requires_grad_()
    torch.clamp(torch.nn.functional.gelu(xr + br.view(1, -1, 1)), -1.0, 1.0).backward(torch.from_numpy(dy).double())
    np.testing.assert_allclose(xg.grad.numpy(), xr.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bg.grad.numpy(), br.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert not A._runner.session_count(), "the torch path built an ONNX Runtime session"
    registry.clear_cache()
    registry._avail["ascend"] = (False, "no Ascend NPU usable here: test")
    with pytest.raises(ma.BackendError, match=r"no backend can run bias_act:gelu forward in float32 on npu arrays "
                                              r"\(.*ascend skipped: not available \(no Ascend NPU usable here"):
        ma.bias_act(xt, torch.from_numpy(b), "gelu")


def test_elementwise_and_gated_backward_below_autograd(cpu_tensors_as_npu):
    """multiact.torch on NPU tensors: the ascend torch kernels' backward runs inside a custom op, below
    autograd, so it takes torch.func.vjp (autograd.grad there raised "does not require grad")."""
    torch = cpu_tensors_as_npu
    import multiact.torch as mt

    x = torch.linspace(-4, 4, 48).reshape(6, 8)
    dy = torch.linspace(-1, 1, 48).reshape(6, 8)
    for f, ref in ((mt.silu, torch.nn.functional.silu), (mt.swiglu, lambda t: (lambda g, u: torch.nn.functional
                                                                                   .silu(g) * u)(*t.chunk(2, -1)))):
        xg, xr = x.clone().requires_grad_(), x.double().requires_grad_()
        y = f(xg)
        y.backward(dy[:, : y.shape[-1]])
        ref(xr).backward(dy[:, : y.shape[-1]].double())
        np.testing.assert_allclose(xg.grad.numpy(), xr.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=f.__name__)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_bias_act_torch_path_against_the_float64_composition(cpu_tensors_as_npu, dtype):
    """Every form of the shared suite (dims 1, -1, 0; per-channel and full-shape b and scale; gain; clamp hit
    and 0) x the activations a transformer or a GAN calls, through the NPU dispatch: y, dx, db and dscale
    against the float64 composition (fused_bias_act's reference), clamped gradients exactly 0.  To torch's
    tolerances, not the suite's ulp bounds: these are torch's (on an NPU, CANN's) float32 kernels, and torch's
    float32 gelu and sigmoid are off by more than 4 ulp in the tails (a measured fact, not a choice here)."""
    torch = cpu_tensors_as_npu
    from multiact import fused_bias_act as B

    rtol, atol = (2e-3, 2e-3) if dtype == "float16" else (2e-5, 1e-5)  # torch's gelu tanh: 3e-6 off near -4
    rng = np.random.default_rng(32)
    shape = (3, 4, 5)
    failures = []
    for form in C._BIAS_FORMS:
        for act, ap in (("linear", {}), ("relu", {}), ("leaky_relu", {"negative_slope": 0.2}), ("gelu", {}),
                        ("gelu", {"approximate": "tanh"}), ("fast_gelu", {}), ("silu", {}), ("sigmoid", {})):
            form_ = dict(form)
            kinds = {k: form_.pop(k, None) for k in ("b", "scale")}
            dim = form_["dim"] % 3
            x, dy = ((rng.standard_normal(shape) * 3).astype(dtype) for _ in range(2))
            sides = {k: None if v is None else rng.uniform(-1.5, 1.5, shape[dim] if v == "c" else shape).astype(dtype)
                     for k, v in kinds.items()}
            kw = {**form_, **ap}
            call = B.resolve({**form_, "act": act}, ap, "bias_act()")
            full = {}
            for k, v in sides.items():
                if v is not None and v.ndim == 1:
                    view = [1, 1, 1]
                    view[dim] = shape[dim]
                    v = v.reshape(view)
                full[k] = v
            want_y = B.reference_forward(call, x, full["b"], full["scale"])
            want_dx, dz = B.reference_backward(call, dy, x, full["b"], full["scale"])
            t = {k: None if v is None else torch.from_numpy(v) for k, v in sides.items()}
            y = ma.bias_act(torch.from_numpy(x), t["b"], act, scale=t["scale"], **kw).numpy()
            grads = ma.bias_act_grad(torch.from_numpy(dy), torch.from_numpy(x), t["b"], act, scale=t["scale"], **kw)
            grads = grads if isinstance(grads, tuple) else (grads,)
            name = f"{C.case_id({**form, 'act': act, **ap})}"
            checks = [("y", y, want_y, np.abs(want_y)), ("dx", grads[0].numpy(), want_dx, np.abs(want_dx))]
            axes = tuple(a for a in range(3) if a != dim)
            for i, (k, term) in enumerate((("b", dz), ("scale", dz * x.astype(np.float64))), 1):
                if sides[k] is None:
                    continue
                got = grads[i].numpy()
                if got.shape == shape:
                    checks.append((f"d{k}", got, term, np.abs(term)))
                else:
                    checks.append((f"d{k}", got, term.sum(axis=axes), np.abs(term).sum(axis=axes)))
            for what, got, want, mag in checks:
                bad = ~(np.abs(got.astype(np.float64) - want) <= rtol * mag + atol)
                if bad.any():
                    failures.append(f"{name} {what}: {bad.sum()} bad, e.g. got {got[bad][0]!r} want {want[bad][0]!r}")
            if call.kp["clamp"] != float("inf"):
                hit = np.abs(call.forward_ref(np.asarray(B._z(x.astype(np.float64), full["b"], full["scale"]),
                                                         np.float64)) * call.kp["gain"]) > call.kp["clamp"] * 1.01
                if (grads[0].numpy()[hit] != 0).any():
                    failures.append(f"{name}: a clamped element has a nonzero dx")
    assert not failures, "\n".join(failures[:20])
