"""torch.onnx.export of multiact.torch models (issue 43): both of torch's exporters (dynamo=True, the onnxscript
translations; dynamo=False, the TorchScript symbolics) on a model holding every multiact.torch module and a
functional call of each gated op and of bias_act, float32, with a dynamic batch dimension.  The graph holds
standard ONNX operators only; ONNX Runtime's outputs match eager (every activation within its contract of the
float64 reference); the opset asked for is the model's, and an operator it lacks gives way to the composite."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import multiact.torch as mt  # noqa: E402
from multiact import consistency as C  # noqa: E402
from multiact.optable import OPS  # noqa: E402

WIDTH = 8


def _activation_modules():
    """(op, params, module): every op's module at its last parameter case (its corner), Swish with a learned
    beta and PReLU with a weight per channel, one in-place module."""
    out = []
    for name, cls in mt.MODULES.items():
        if name not in OPS:
            continue
        if cls is mt.Swish:
            m = mt.Swish(1.3)
            out.append((name, {"beta": 1.3}, m))
        elif cls is mt.PReLU:
            m = mt.PReLU(WIDTH)
            with torch.no_grad():
                m.weight.copy_(torch.linspace(-0.5, 2.0, WIDTH))
            out.append((name, {"weight": m.weight.detach().numpy().astype(np.float64).reshape(1, -1), "axis": 1},
                        m))
        else:
            p = C.param_cases(OPS[name])[-1]
            out.append((name, p, cls(**p)))
    out.append(("relu", {}, mt.ReLU(inplace=True)))
    return out


class EveryOp(torch.nn.Module):
    """Every activation module on x, the gated ops (modules, functions, one- and two-input forms) and bias_act
    (module and function, b per channel and of x's shape), each its own output."""

    def __init__(self):
        super().__init__()
        self.cases = _activation_modules()
        self.acts = torch.nn.ModuleList([m for _, _, m in self.cases])
        self.gated = torch.nn.ModuleList([mt.GLU(act="leaky_relu", negative_slope=0.2),
                                          mt.SwiGLU(layout="interleaved", alpha=1.702, limit=7.0),
                                          mt.GeGLU(approximate="tanh"), mt.ReGLU()])
        self.bias_act = mt.BiasAct(WIDTH, "leaky_relu", negative_slope=0.2, gain=2 ** 0.5, clamp=256.0,
                                   scale=True)
        with torch.no_grad():
            self.bias_act.bias.copy_(torch.linspace(-1, 1, WIDTH))
            self.bias_act.scale.copy_(torch.linspace(0.5, 2, WIDTH))
        self.register_buffer("b", torch.linspace(-0.3, 0.4, WIDTH))

    def forward(self, x):
        outs = [a(x.clone()) for a in self.acts]
        outs += [g(x) for g in self.gated]
        half = WIDTH // 2
        outs += [mt.swiglu(x), mt.glu(x, act="gelu", approximate="tanh"), mt.geglu(x[:, :half], up=x[:, half:]),
                 mt.reglu(x[:, half:], up=x[:, :half])]
        outs += [self.bias_act(x), mt.bias_act(x, self.b, "gelu"), mt.bias_act(x, None, "tanh", gain=2.0),
                 mt.bias_act(x, x * 0.5, "relu", clamp=1.0)]
        return tuple(outs)


def _inputs(n: int, seed: int) -> torch.Tensor:
    """(n, WIDTH) float32: the consistency suite's specials and kinks first, then values over the ops' ranges."""
    x0, _ = C.zero_pairs(np.dtype("float32"))
    pool = np.concatenate([x0, C.specials(np.dtype("float32")), np.linspace(-8, 8, 97, dtype=np.float32)])
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.permutation(np.resize(pool, n * WIDTH)).reshape(n, WIDTH).astype(np.float32))


def _export(model, x, dynamo: bool, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            prog = torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=({0: torch.export.Dim("batch")},),
                                     verbose=False, **kw)
            return prog.model_proto
        f = io.BytesIO()
        torch.onnx.export(model, (x,), f, dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}}, **kw)
        return onnx.load_from_string(f.getvalue())


def _run(model_proto, x: torch.Tensor) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model_proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x.numpy()})


@pytest.fixture(scope="module")
def every():
    torch.manual_seed(0)
    return EveryOp().eval()


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_every_op_exports_and_matches_eager(every, dynamo):
    model = _export(every, _inputs(5, 0), dynamo)
    assert {n.domain for n in model.graph.node} <= {""}, "a node of a custom domain"
    assert not model.functions
    assert [o.domain for o in model.opset_import] == [""]
    x = _inputs(11, 1)  # another batch size: the batch dimension is dynamic
    got = _run(model, x)
    with torch.no_grad():
        want = [w.numpy() for w in every(x)]
    assert len(got) == len(want)
    xs = x.numpy().astype(np.float32)
    for (op, p, m), g in zip(every.cases, got, strict=False):  # the activations: within the contract
        spec = OPS[op]
        ref = C.reference(spec, "forward", spec.validate({**p}) if op != "prelu" else p, np.dtype("float32"), xs)
        v = C.compare(g, ref, xs, spec, "forward", params={k: v for k, v in p.items() if k != "weight"})
        assert v.passed, f"{m} exported with dynamo={dynamo}: {v.describe()}"
    for i in range(len(every.cases), len(want)):  # the gated ops and bias_act: eager's values, a few ulp apart
        np.testing.assert_allclose(got[i], want[i], rtol=2e-6, atol=1e-37, err_msg=f"output {i}, dynamo={dynamo}")


def test_the_default_graph_is_the_contracts_and_accuracy_is_a_choice():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), mt.GELU(), mt.ReLU()).eval()
    x = torch.randn(3, 4)
    kinds = {n.op_type for n in _export(model, x, True).graph.node}
    assert "Gelu" not in kinds and "Erf" not in kinds and "Relu" in kinds  # ORT's Gelu misses the contract
    prog = mt.export_onnx(model, (x,), accuracy="runtime", dynamo=True, verbose=False)
    assert "Gelu" in {n.op_type for n in prog.model_proto.graph.node}
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mt.export_onnx(model, (x,), f, accuracy="runtime", dynamo=False)
    assert "Gelu" in {n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node}
    with pytest.raises(ValueError, match="accuracy must be one of"):
        mt.export_onnx(model, (x,), accuracy="fast")
    table = mt.onnx_translations()
    assert torch.ops.multiact.gelu.default in table and torch.ops.multiact.bias_act.default in table


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("opset", [17, 20])
def test_opset_version_is_honoured(dynamo, opset):
    """Below opset 20 (no Gelu) even accuracy="runtime" exports gelu as the composite; below 18, mish."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), mt.GELU(approximate="tanh"), mt.Mish()).eval()
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            m = mt.export_onnx(model, (x,), accuracy="runtime", opset_version=opset, verbose=False).model_proto
        else:
            f = io.BytesIO()
            mt.export_onnx(model, (x,), f, accuracy="runtime", dynamo=False, opset_version=opset)
            m = onnx.load_from_string(f.getvalue())
    assert [o.version for o in m.opset_import if o.domain == ""] == [opset]
    kinds = {n.op_type for n in m.graph.node}
    assert ("Gelu" in kinds) == (opset >= 20) and ("Mish" in kinds) == (opset >= 18)
    (got,) = _run(m, x)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_an_opset_below_the_graphs_is_refused_by_name():
    model = torch.nn.Sequential(mt.SiLU()).eval()
    with pytest.raises(Exception, match="from opset 15"):
        _export(model, torch.randn(2, 3), False, opset_version=13)
