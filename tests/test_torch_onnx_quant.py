"""torch.onnx.export of multiact.torch calls with quant= (torch.ops.multiact.quantized): the dynamo exporter
replays ma.to_onnx's quantized model (opset 21), and ONNX Runtime's codes and scales are the onnxruntime backend's
bit for bit (the same graphs).  The TorchScript exporter stops at opset 20, below QuantizeLinear's float8 outputs:
it says so, as does MX (torch's float8_e8m0fnu scales have no ONNX type before opset 24)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
ml_dtypes = pytest.importorskip("ml_dtypes")

import multiact as ma  # noqa: E402
import multiact.torch as mt  # noqa: E402

Q = {
    "gelu": ma.Quant("float8_e4m3fn"),
    "silu": ma.Quant("int8", "token"),
    "swiglu": ma.Quant("float8_e5m2", "group", group_size=32),
    "geglu_up": ma.Quant("float8_e4m3fn", "token", pow2=True),
    "bias_act": ma.Quant("int8", scale=0.02),
    "prelu": ma.Quant("float8_e4m3fn", "group", group_size=64, scale_ub=3.0),
    "tanh": ma.Quant("int8", "group", group_size=32, symmetric=False),
}
W = torch.linspace(-0.5, 2.0, 64)
B = torch.linspace(-1.0, 1.0, 64)


class Quantizing(torch.nn.Module):
    """One quant= call of each family: activations (prelu with its weight), a gated op (one- and two-input forms)
    and bias_act; every codes and scales an output."""

    def forward(self, x):
        outs = []
        outs += mt.gelu(x, approximate="tanh", quant=Q["gelu"])
        outs += mt.silu(x, quant=Q["silu"])
        outs += mt.swiglu(x, quant=Q["swiglu"])
        outs += mt.geglu(x[:, :32], up=x[:, 32:], quant=Q["geglu_up"])
        outs += mt.bias_act(x, B, act="leaky_relu", dim=1, quant=Q["bias_act"])
        outs += mt.prelu(x, W, quant=Q["prelu"])
        outs += mt.tanh(x, quant=Q["tanh"])  # int8 with a zero point: (codes, scales, zero points)
        return tuple(outs)


def _expected(x: np.ndarray) -> list[np.ndarray]:
    """The onnxruntime backend's quant= results: the same graphs in one session each."""
    be = {"backend": "onnxruntime"}
    res = []
    res += ma.gelu(x, approximate="tanh", quant=Q["gelu"], **be)
    res += ma.silu(x, quant=Q["silu"], **be)
    res += ma.swiglu(x, quant=Q["swiglu"], **be)
    res += ma.geglu(x[:, :32], up=x[:, 32:], quant=Q["geglu_up"], **be)
    res += ma.bias_act(x, B.numpy(), act="leaky_relu", dim=1, quant=Q["bias_act"], **be)
    res += ma.prelu(x, W.numpy(), quant=Q["prelu"], **be)
    res += ma.tanh(x, quant=Q["tanh"], **be)
    return res


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    """Every output, float8 ones as their bytes (ORT's Python has no NumPy float8_e5m2)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    types = {onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn", onnx.TensorProto.FLOAT8E5M2: "float8_e5m2"}
    b = sess.io_binding()
    b.bind_ortvalue_input(sess.get_inputs()[0].name, ort.OrtValue.ortvalue_from_numpy(x))
    outs = []
    for o in model.graph.output:
        t = o.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type in types:
            a = np.empty(shape, np.uint8)
            b.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, t.elem_type))
            outs.append(a.view(getattr(ml_dtypes, types[t.elem_type])))
        else:
            a = np.empty(shape, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
            b.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_numpy(a))
            outs.append(a)
    sess.run_with_iobinding(b)
    return outs


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 64, generator=g) * 3
    x[0, :32] = 0.0  # an all-zero group
    x[1, 5] = 1e-42  # a subnormal
    return x


def test_dynamo_export_runs_in_ort_bit_for_bit():
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(Quantizing().eval(), (x,), dynamo=True, opset_version=21)
    model = prog.model_proto
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [21]
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)  # standard operators only
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) == 7
    got = _run(model, x.numpy())
    want = _expected(x.numpy())
    assert len(got) == len(want) == 15
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, i
        assert (np.atleast_1d(g).view(np.uint8) == np.atleast_1d(w).view(np.uint8)).all(), i
    # and eager multiact.torch (its default backend) agrees on the shapes and types of every result
    eager = Quantizing()(x)
    for g, e in zip(got, eager, strict=True):
        assert tuple(g.shape) == tuple(e.shape)


class _One(torch.nn.Module):
    def __init__(self, q):
        super().__init__()
        self.q = q

    def forward(self, x):
        return mt.relu(x, quant=self.q)


def test_refusals():
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match="from opset 21"):
            torch.onnx.export(_One(Q["gelu"]), (x,), dynamo=True, opset_version=20)
        with pytest.raises(Exception, match="float8_e8m0fnu"):
            torch.onnx.export(_One(ma.Quant("float8_e4m3fn", "mx")), (x,), dynamo=True, opset_version=21)
        with pytest.raises(Exception, match="from opset 21"):  # the TorchScript exporter's newest opset is 20
            torch.onnx.export(_One(Q["gelu"]), (x,), io.BytesIO(), dynamo=False, opset_version=20)
