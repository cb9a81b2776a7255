"""to_onnx(dtype="bfloat16"): the float32 graph between Casts (ONNX Runtime's CPU provider has no bfloat16
arithmetic, but it runs Cast), checked by onnx.checker and run in ONNX Runtime on bfloat16 bits against
multiact's own bfloat16 results (within one bfloat16 ulp: the float32 graphs are not multiact's kernels)."""

from __future__ import annotations

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto  # noqa: E402

X = C.bf16_all()[::16].copy()  # 4,096 patterns (contiguous: ORT reads the buffer as it is), NaNs among them
DY = C.bf16_dy(X.size)


def _run(model, feeds: dict[str, np.ndarray], out: str) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    b = sess.io_binding()
    for name, a in feeds.items():
        b.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16),
                                                                                     TensorProto.BFLOAT16))
    res = np.empty(X.size, np.uint16)
    b.bind_ortvalue_output(out, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(res, TensorProto.BFLOAT16))
    sess.run_with_iobinding(b)
    return res


@pytest.mark.parametrize("op", [op for op in OPS if op != "prelu"])
def test_bfloat16_models_run_in_onnxruntime(op):
    spec = OPS[op]
    p = C.param_cases(spec)[0]
    for grad in (False, True):
        model = ma.to_onnx(op, dtype="bfloat16", grad=grad, **p)
        bf = TensorProto.BFLOAT16
        assert all(v.type.tensor_type.elem_type == bf for v in (*model.graph.input, *model.graph.output))
        assert [n.op_type for n in model.graph.node].count("Cast") >= 2
        if grad:
            got = _run(model, {"dy": DY, "x": X}, "dx")
            want = ma.backward(op, DY, X, **p).view(np.uint16)
        else:
            got = _run(model, {"x": X}, "y")
            want = ma.forward(op, X, **p).view(np.uint16)
        nan_g, nan_w = (got & 0x7FFF) > 0x7F80, (want & 0x7FFF) > 0x7F80
        assert np.array_equal(nan_g, nan_w), f"{op} grad={grad}: NaN at different inputs"
        off = np.abs(C._ordered(got) - C._ordered(want))[~nan_w]
        assert off.max(initial=0) <= 1, f"{op} grad={grad}: {int((off > 1).sum())} results more than 1 ulp apart"


def test_parameter_gradient_model_stays_float64():
    model = ma.to_onnx("swish", dtype="bfloat16", grad="beta")
    assert [v.type.tensor_type.elem_type for v in model.graph.input] == [TensorProto.BFLOAT16] * 2
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE


def test_bad_dtype_names_bfloat16():
    with pytest.raises(ValueError, match="dtype must be float16, float32 or bfloat16"):
        ma.to_onnx("relu", dtype="int8")
