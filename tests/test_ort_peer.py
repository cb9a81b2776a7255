"""ONNX Runtime's own operators as an independent peer: every backend agrees with them in float32.

These are ORT's kernels for ONNX's ops (not multiact's graphs), so a formula error shared by our
reference and our backends would show here.  Inputs stay finite and moderate, where ORT is accurate
(its documented deviations at +-inf, NaN and deep tails are in `multiact.onnx_export.deviations()`).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_backends, require

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

# op -> (ONNX op type, attributes, extra inputs) for ONNX's own operator of that op, with our params.
ONNX_OWN = {
    "relu": lambda p: ("Relu", {}, ()),
    "relu6": lambda p: ("Clip", {}, (0.0, 6.0)),
    "hardtanh": lambda p: ("Clip", {}, (p["min_val"], p["max_val"])),
    "leaky_relu": lambda p: ("LeakyRelu", {"alpha": p["negative_slope"]}, ()),
    "elu": lambda p: ("Elu", {"alpha": p["alpha"]}, ()),
    "selu": lambda p: ("Selu", {"alpha": p["alpha"], "gamma": p["scale"]}, ()),
    "celu": lambda p: ("Celu", {"alpha": p["alpha"]}, ()),
    "gelu": lambda p: ("Gelu", {"approximate": p["approximate"]}, ()),
    "sigmoid": lambda p: ("Sigmoid", {}, ()),
    "hardsigmoid": lambda p: ("HardSigmoid", {"alpha": p["alpha"], "beta": p["beta"]}, ()),
    "hardswish": lambda p: ("HardSwish", {}, ()),
    "tanh": lambda p: ("Tanh", {}, ()),
    "softplus": lambda p: ("Softplus", {}, ()),
    "softsign": lambda p: ("Softsign", {}, ()),
    "mish": lambda p: ("Mish", {}, ()),
    "softshrink": lambda p: ("Shrink", {"lambd": p["lambd"], "bias": p["lambd"]}, ()),
    "hardshrink": lambda p: ("Shrink", {"lambd": p["lambd"], "bias": 0.0}, ()),
}


def _ort_own(op: str, params: dict, x: np.ndarray) -> np.ndarray:
    op_type, attrs, extra = ONNX_OWN[op](params)
    inits = [helper.make_tensor(f"c{i}", TensorProto.FLOAT, [], [v]) for i, v in enumerate(extra)]
    node = helper.make_node(op_type, ["x", *(t.name for t in inits)], ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


PEERS = [b for b in host_backends() if b.values[0] not in ("onnxruntime", "ascend")]


@pytest.mark.parametrize("op", list(ONNX_OWN))
@pytest.mark.parametrize("backend", PEERS)
def test_agrees_with_onnxruntime_own_operator(backend, op):
    require(backend, op, "forward", "float32")
    spec = OPS[op]
    x = np.concatenate([np.linspace(-20, 20, 4001), [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    for params in C.param_cases(spec):
        if op == "softplus" and params:
            continue  # ONNX's Softplus has neither beta nor threshold
        p = spec.validate(params)
        want = _ort_own(op, p, x)
        got = ma.forward(op, x, backend=backend, **params)
        # atol: ORT cancels in 1 + tanh(u) for gelu tanh near x = -5 (4e-7 absolute there)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{op} {params}")
