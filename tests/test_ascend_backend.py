"""The ascend backend here: honest detection, and its CANN code path run on the CPU provider."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from multiact.backends import ascend_backend as A

import multiact as ma
from multiact import reference as R


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
