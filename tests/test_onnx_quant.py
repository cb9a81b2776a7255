"""ma.to_onnx(op, quant=Q): the activation's graph, then QuantizeLinear (opset 21), against the contract.

The reference is multiact.quantize of the exported float32 model's own result, on every bfloat16 input (65,536
values as a (512, 128) array: rows for token, groups of 32 to 128, MX blocks).  Codes and scales are bit for bit
the contract's but for one thing ONNX Runtime decides: a NaN float8_e5m2 code is 0x7F / 0xFF where ml_dtypes (the
contract's NumPy results) writes 0x7E / 0xFE; both are NaN, and the tests count them (every NaN code, no other).
"""

from __future__ import annotations

import numpy as np
import pytest

import multiact as ma

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
ml_dtypes = pytest.importorskip("ml_dtypes")

from multiact.backend import onnx_quant as OQ  # noqa: E402
from multiact.backend.onnx_graphs import Graph, make_model  # noqa: E402
from multiact.onnx_export import bias_act_model, to_onnx  # noqa: E402
from multiact.optable import OPS  # noqa: E402

BF16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
X = BF16.astype(np.float32).reshape(512, 128)

QUANTS = {
    "e4m3-tensor": ma.Quant("float8_e4m3fn"),
    "e5m2-static": ma.Quant("float8_e5m2", scale=0.05),
    "int8-static": ma.Quant("int8", scale=0.01),
    "int8-token": ma.Quant("int8", "token"),
    "e4m3-token-pow2": ma.Quant("float8_e4m3fn", "token", pow2=True),
    "e5m2-group64": ma.Quant("float8_e5m2", "group", group_size=64),
    "int8-group128-ub": ma.Quant("int8", "group", group_size=128, scale_ub=2.0),
    "e4m3-group32-floor": ma.Quant("float8_e4m3fn", "group", group_size=32, amax_floor=1e-3),
    "e4m3-mx": ma.Quant("float8_e4m3fn", "mx"),
    "e5m2-mx-floor": ma.Quant("float8_e5m2", "mx", rule="floor"),
    "int8-azp-token": ma.Quant("int8", "token", symmetric=False),
    "int8-azp-group32": ma.Quant("int8", "group", group_size=32, symmetric=False),
    "int8-azp-tensor": ma.Quant("int8", symmetric=False),
}
PARAMS = {"prelu": {"axis": 1}, "threshold": {"threshold": 0.5, "value": -2.0}}
_ONNX_TYPES = {"float8_e4m3fn": onnx.TensorProto.FLOAT8E4M3FN, "float8_e5m2": onnx.TensorProto.FLOAT8E5M2,
               "bfloat16": onnx.TensorProto.BFLOAT16}


def session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(sess, feeds: dict, q: ma.Quant, code_shape: tuple, scale_shape: tuple):
    """(codes, scales[, zero points]) bound into NumPy arrays (ORT's Python has no NumPy type for float8_e5m2 or
    bfloat16)."""
    b = sess.io_binding()
    for name, a in feeds.items():
        a = np.ascontiguousarray(a)
        if a.dtype.name in _ONNX_TYPES:
            v = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), _ONNX_TYPES[a.dtype.name])
        else:
            v = ort.OrtValue.ortvalue_from_numpy(a)
        b.bind_ortvalue_input(name, v)
    codes = np.empty(code_shape, np.int8 if q.dtype == "int8" else np.uint8)
    scale = np.empty(scale_shape, np.uint8 if q.granularity == "mx" else np.float32)
    zps = [] if q.symmetric else [("zero_points", np.empty(scale_shape, np.int32), None)]
    for name, a, t in (("codes", codes, q.dtype), ("scales", scale, None), *zps):
        v = (ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, _ONNX_TYPES[t]) if t in _ONNX_TYPES
             else ort.OrtValue.ortvalue_from_numpy(a))
        b.bind_ortvalue_output(name, v)
    sess.run_with_iobinding(b)
    if q.dtype != "int8":
        codes = codes.view(getattr(ml_dtypes, q.dtype))
    return codes, (scale.view(ml_dtypes.float8_e8m0fnu) if q.granularity == "mx" else scale), *[a for _, a, _ in zps]


def differing(got: np.ndarray, want: np.ndarray, q: ma.Quant) -> int:
    """The codes whose bits differ, asserted to be NaN in both (float8_e5m2's NaN encoding only); their count."""
    g, w = np.ascontiguousarray(got), np.ascontiguousarray(want)
    diff = g.view(np.uint8) != w.view(np.uint8)
    if not diff.any():
        return 0
    assert q.dtype == "float8_e5m2", f"{int(diff.sum())} codes differ"
    nan_g, nan_w = np.isnan(g.astype(np.float32)), np.isnan(w.astype(np.float32))
    assert (nan_g[diff] & nan_w[diff]).all(), "a differing code is not NaN in both"
    assert np.isin(g.view(np.uint8)[diff], (0x7F, 0xFF)).all() and np.isin(w.view(np.uint8)[diff], (0x7E, 0xFE)).all()
    assert int(diff.sum()) == int(nan_w.sum()), "every NaN code differs in encoding, no other"
    return int(diff.sum())


def same_scales(got: np.ndarray, want: np.ndarray) -> None:
    g, w = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    assert g.shape == w.shape
    assert (g.view(np.uint8) == w.view(np.uint8)).all(), "scales differ"


def check(base, quantized, feeds: dict, q: ma.Quant) -> int:
    """The quantized model against multiact.quantize of the float32 model's result: the scales bit for bit, the
    codes but for float8_e5m2's NaN encoding (counted)."""
    y = session(base).run(None, {k: np.asarray(v).astype(np.float32) for k, v in feeds.items()})[0]
    want_c, want_s, *want_zp = ma.quantize(y, q)
    got_c, got_s, *got_zp = run(session(quantized), feeds, q, want_c.shape, np.shape(want_s))
    same_scales(got_s, want_s)
    for g, w in zip(got_zp, want_zp, strict=True):  # the zero points (int32) of symmetric=False
        assert g.shape == np.shape(w) and g.dtype == np.asarray(w).dtype and (g == w).all()
    return differing(got_c, want_c, q)


def _ops():
    return list(OPS)


@pytest.mark.parametrize("qid", list(QUANTS))
@pytest.mark.parametrize("op", _ops())
def test_every_op_every_bfloat16_input(op, qid):
    q = QUANTS[qid]
    p = PARAMS.get(op, {})
    feeds = {"x": X}
    if op == "prelu":
        feeds["weight"] = np.linspace(-1.5, 1.5, 128).astype(np.float32)
    check(to_onnx(op, shape=2, **p), to_onnx(op, shape=2, quant=q, **p), feeds, q)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("qid", ["e4m3-tensor", "int8-token", "e5m2-group64", "e4m3-mx"])
@pytest.mark.parametrize("op", ["gelu", "silu", "elu", "tanh"])
def test_half_inputs_widen_exactly(op, qid, dtype):
    """A float16 or bfloat16 model quantizes the float32 graph's result on its inputs widened (the contract)."""
    q = QUANTS[qid]
    x = X.astype(np.float16) if dtype == "float16" else BF16.reshape(512, 128)
    model = to_onnx(op, shape=2, dtype=dtype, quant=q)
    want = onnx.TensorProto.FLOAT16 if dtype == "float16" else onnx.TensorProto.BFLOAT16
    assert model.graph.input[0].type.tensor_type.elem_type == want
    check(to_onnx(op, shape=2), model, {"x": x}, q)


@pytest.mark.parametrize("qid", ["e4m3-tensor", "int8-static", "int8-token", "e5m2-group64", "e4m3-group32-floor",
                                 "e4m3-mx", "e5m2-mx-floor"])
@pytest.mark.parametrize("op,kw", [("swiglu", {}), ("geglu", {"approximate": "tanh"}), ("glu", {}),
                                   ("reglu", {})])
def test_gated(op, kw, qid):
    q = QUANTS[qid]
    x = X.reshape(256, 256)
    check(to_onnx(op, ndim=2, **kw), to_onnx(op, ndim=2, quant=q, **kw), {"x": x}, q)


@pytest.mark.parametrize("qid", ["e4m3-tensor", "int8-token", "e5m2-group64", "e4m3-mx"])
def test_bias_act(qid):
    q = QUANTS[qid]
    b = np.linspace(-2, 2, 128).astype(np.float32)
    s = np.linspace(0.5, 1.5, 128).astype(np.float32)
    check(to_onnx("bias_act", act="gelu", ndim=2, dim=1), to_onnx("bias_act", act="gelu", ndim=2, dim=1, quant=q),
          {"x": X, "b": b}, q)
    kw = {"ndim": 2, "forms": ("c", "c"), "act": "silu", "dim": -1, "clamp": 3.0}
    check(bias_act_model(dtype="float32", **kw), bias_act_model(dtype="float32", quant=q, **kw),
          {"x": X, "b": b, "scale": s}, q)


def _special_rows() -> np.ndarray:
    """Groups of 32 that hit every rule: all zero, an amax whose scale underflows (2^-149), subnormals, NaN first,
    last or alone, inf with and without NaN, MX's boundaries (amax = qmax * 2^k and a step either side), float32's
    largest values."""
    f32 = np.float32
    rows = []
    base = np.linspace(-1, 1, 32, dtype=f32)
    rows.append(np.zeros(32, f32))
    rows.append(np.full(32, -0.0, f32))
    rows.append(base * f32(1e-44))
    rows.append(base * f32(2.0 ** -126))
    for where in (0, 17, 31):
        r = base.copy()
        r[where] = np.nan
        rows.append(r)
    r = base.copy()
    r[3] = np.inf
    rows.append(r)
    r = base.copy()
    r[3], r[9] = -np.inf, np.nan
    rows.append(r)
    for qmax in (448.0, 57344.0, 127.0):
        for k in (-140, -130, -20, 0, 1, 20, 100):
            a = f32(qmax) * f32(2.0 ** k) if k > -127 else f32(2.0 ** k)
            for step in (-1, 0, 1):
                r = base * f32(0.5)
                r[5] = np.nextafter(a, f32(np.inf) if step > 0 else f32(0)) if step else a
                rows.append(r)
    r = base.copy()
    r[0] = np.finfo(f32).max
    rows.append(r)
    rows.append(np.full(32, np.finfo(f32).max, f32))
    out = np.stack(rows)
    return np.concatenate([out, out[:, ::-1]]).reshape(-1, 128)


@pytest.mark.parametrize("qid", list(QUANTS))
def test_specials(qid):
    """An identity activation (leaky_relu with slope 1: ORT's LeakyRelu, exact) on hand-made groups."""
    q = QUANTS[qid]
    x = _special_rows()
    check(to_onnx("leaky_relu", shape=2, negative_slope=1.0), to_onnx("leaky_relu", shape=2, negative_slope=1.0,
          quant=q), {"x": x}, q)


def test_floor_log2_is_exact():
    """MX and pow2 take floor(log2 a) as Floor(Log(a) / ln 2) corrected by Pow(2, e): exact on every power of two,
    its neighbours, subnormals, and a sample of all positive finite float32."""
    from onnx import TensorProto, helper

    g = Graph("float32")
    e, p = OQ._floor_log2(g, g.op("Cast", "a", to=TensorProto.DOUBLE))
    g.nodes.append(helper.make_node("Identity", [e], ["e"]))
    graph = helper.make_graph(g.nodes, "log2", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N"])],
                              [helper.make_tensor_value_info("e", TensorProto.DOUBLE, ["N"])], g.inits)
    sess = session(make_model(graph, 21))
    rng = np.random.default_rng(7)
    pw = np.arange(0, 255, dtype=np.uint32) << 23
    bits = np.concatenate([pw, pw + 1, pw + 2, pw - 1, np.uint32(1) << np.arange(23, dtype=np.uint32),
                           (np.uint32(1) << np.arange(1, 24, dtype=np.uint32)) - 1,
                           rng.integers(1, 0x7F800000, 2_000_000, dtype=np.uint32)])
    bits = np.unique(bits[(bits > 0) & (bits < 0x7F800000)])
    a = bits.view(np.float32)
    got = sess.run(None, {"a": a})[0]
    _, ex = np.frexp(a)
    assert np.array_equal(got, (ex - 1).astype(np.float64))


def test_graph_shape():
    """Opset 21, QuantizeLinear with output_dtype; blocked (block_size, the last axis) for groups and MX,
    per axis for tokens; outputs codes and scales; E8M0 scales as uint8 bits."""
    m = to_onnx("gelu", quant=QUANTS["e5m2-group64"])
    assert [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] == [21]
    ql = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
    assert len(ql) == 1
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in ql[0].attribute}
    assert attrs["block_size"] == 64 and attrs["axis"] == 1 and attrs["output_dtype"] == _ONNX_TYPES["float8_e5m2"]
    assert attrs["saturate"] == 1
    assert [o.name for o in m.graph.output] == ["codes", "scales"]
    mx = to_onnx("relu", quant=QUANTS["e4m3-mx"])
    assert mx.graph.output[1].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    tok = to_onnx("relu", quant=QUANTS["int8-token"])
    attrs = {a.name: onnx.helper.get_attribute_value(a) for n in tok.graph.node if n.op_type == "QuantizeLinear"
             for a in n.attribute}
    assert attrs["axis"] == 0 and "block_size" not in attrs
    static = to_onnx("relu", quant=QUANTS["int8-static"], opset=22)
    assert not any(n.op_type in ("ReduceMax", "Abs") for n in static.graph.node)
    assert [o.version for o in static.opset_import if o.domain in ("", "ai.onnx")] == [22]


def test_any_rank_and_shapes():
    """Without shape= the model takes any rank >= 1: codes of x's shape, scales x.shape[:-1] + (groups,)."""
    q = QUANTS["e4m3-group32-floor"]
    x = X.reshape(4, 8, 16, 128)
    check(to_onnx("silu"), to_onnx("silu", quant=q), {"x": x}, q)
    qt = QUANTS["int8-token"]
    check(to_onnx("silu"), to_onnx("silu", quant=qt), {"x": X.reshape(2, 256, 128)}, qt)
    check(to_onnx("silu"), to_onnx("silu", quant=QUANTS["e4m3-tensor"]), {"x": X.reshape(-1)}, QUANTS["e4m3-tensor"])


def test_refusals():
    q = QUANTS["e4m3-tensor"]
    with pytest.raises(ValueError, match=r"to_onnx\(\): quant= needs opset >= 21.*opset=20"):
        to_onnx("gelu", quant=q, opset=20)
    with pytest.raises(ValueError, match=r"bias_act_model\(\): quant= needs opset >= 21"):
        bias_act_model(dtype="float32", ndim=2, forms=("c", None), act="relu", quant=q, opset=19)
    with pytest.raises(ValueError, match="grad="):
        to_onnx("gelu", quant=q, grad=True)
    with pytest.raises(TypeError, match="quant must be a multiact.Quant"):
        to_onnx("gelu", quant="float8_e4m3fn")
    zp = to_onnx("gelu", quant=QUANTS["int8-azp-token"])
    assert [o.name for o in zp.graph.output] == ["codes", "scales", "zero_points"]
    assert zp.graph.output[2].type.tensor_type.elem_type == onnx.TensorProto.INT32


def test_accuracy_modes_pass_through():
    """accuracy= chooses the float graph as without quant= (runtime: ORT's Sigmoid)."""
    q = QUANTS["e4m3-tensor"]
    rt = to_onnx("sigmoid", quant=q, accuracy="runtime")
    assert any(n.op_type == "Sigmoid" for n in rt.graph.node)
    check(to_onnx("sigmoid", accuracy="runtime", shape=2), to_onnx("sigmoid", accuracy="runtime", shape=2, quant=q),
          {"x": X}, q)


# ---- the onnxruntime backend: quant= through one session (Runner.quantized) --------------------------------

BACKEND_QUANTS = ["e4m3-tensor", "e5m2-static", "int8-token", "e5m2-group64", "int8-group128-ub", "e4m3-mx",
                  "e5m2-mx-floor", "int8-azp-group32"]


def _same(got: tuple, want: tuple) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.ascontiguousarray(g), np.ascontiguousarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert (np.atleast_1d(g).view(np.uint8) == np.atleast_1d(w).view(np.uint8)).all()


@pytest.fixture
def fused(monkeypatch):
    """Records whether each quant= call of the onnxruntime backend ran its one session (True) or fell back."""
    from multiact.backend import onnxruntime_backend as ob

    seen: list[bool] = []
    real = ob._runner.quantized

    def spy(*args):
        r = real(*args)
        seen.append(r is not None)
        return r

    monkeypatch.setattr(ob._runner, "quantized", spy)
    return seen


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("qid", BACKEND_QUANTS)
@pytest.mark.parametrize("op", list(OPS))
def test_backend_bit_identical(op, qid, dtype, fused):
    """ma.<op>(x, quant=Q, backend="onnxruntime") is ma.quantize of the backend's float32 result, bit for bit
    (the e5m2 NaN code set to the contract's on the host), on every bfloat16 input."""
    q = QUANTS[qid]
    x = X.astype(dtype)
    p = dict(PARAMS.get(op, {}))
    if op == "prelu":
        p["weight"] = np.linspace(-1.5, 1.5, 512)
        p["axis"] = 0
    with np.errstate(over="ignore"):
        want = ma.quantize(ma.forward(op, x.astype(np.float32), backend="onnxruntime", **p), q)
    _same(ma.forward(op, x, backend="onnxruntime", quant=q, **p), want)
    assert fused == [op != "prelu" or dtype == "float32"]  # prelu on float16: its weight comes cast to float16


@pytest.mark.parametrize("qid", BACKEND_QUANTS)
def test_backend_gated_and_bias_act(qid, fused):
    q = QUANTS[qid]
    for dtype in ("float32", "float16"):
        x = X.reshape(256, 256).astype(dtype)
        x32 = x.astype(np.float32)
        _same(ma.swiglu(x, quant=q, backend="onnxruntime"), ma.quantize(ma.swiglu(x32, backend="onnxruntime"), q))
        _same(ma.geglu(x[:, ::2], up=x[:, 1::2], quant=q, backend="onnxruntime"),
              ma.quantize(ma.geglu(x32[:, ::2], up=x32[:, 1::2], backend="onnxruntime"), q))
        _same(ma.glu(x, dim=-1, quant=q, backend="onnxruntime"),
              ma.quantize(ma.glu(x32, dim=-1, backend="onnxruntime"), q))
        xb = X.astype(dtype)
        b = np.linspace(-2, 2, 512).astype(dtype)
        s = np.linspace(0.5, 1.5, 128).astype(dtype)
        full = np.linspace(-1, 1, xb.size).reshape(xb.shape).astype(dtype)
        for kw, kw32 in (({"b": b, "dim": 0}, {"b": b.astype(np.float32), "dim": 0}),
                         ({"b": full, "scale": s, "dim": 1, "clamp": 2.0},
                          {"b": full.astype(np.float32), "scale": s.astype(np.float32), "dim": 1, "clamp": 2.0})):
            _same(ma.bias_act(xb, act="gelu", quant=q, backend="onnxruntime", **kw),
                  ma.quantize(ma.bias_act(xb.astype(np.float32), act="gelu", backend="onnxruntime", **kw32), q))
    assert fused and all(fused)


def test_backend_prelu_weights(fused):
    """prelu's weight per channel along any axis, one weight, and one broadcast over two dims (ONNX's PRelu)."""
    x = X.reshape(8, 64, 128)
    q = QUANTS["int8-token"]
    for w, kw in ((np.linspace(-1, 1, 64), {"axis": 1}), (np.linspace(-1, 1, 128), {"axis": -1}),
                  (np.array([0.3]), {}), (np.linspace(-1, 1, 64 * 128).reshape(64, 128), {})):
        _same(ma.prelu(x, w, quant=q, backend="onnxruntime", **kw),
              ma.quantize(ma.prelu(x, w, backend="onnxruntime", **kw), q))
    assert fused == [True] * 4


def test_backend_layouts_and_fallbacks(fused):
    """Strided and 3-D inputs and int8 with a zero point run the one session; bfloat16 (no bfloat16 graphs), a
    zero-size result and a last axis that the groups do not divide fall back to the two passes (which raise for the
    last)."""
    q = QUANTS["e4m3-group32-floor"]
    x = X.reshape(8, 64, 128)
    _same(ma.silu(x[:, ::2], quant=q, backend="onnxruntime"),
          ma.quantize(ma.silu(x[:, ::2], backend="onnxruntime"), q))
    assert fused == [True]
    fused.clear()
    azp = ma.Quant("int8", "token", symmetric=False)
    _same(ma.silu(X, quant=azp, backend="onnxruntime"), ma.quantize(ma.silu(X, backend="onnxruntime"), azp))
    _same(ma.silu(np.zeros((0, 128), np.float32), quant=q, backend="onnxruntime"),
          ma.quantize(np.zeros((0, 128), np.float32), q))
    assert fused == [True, False]
    fused.clear()
    _same(ma.silu(BF16.reshape(512, 128), quant=q, backend="onnxruntime"),
          ma.quantize(ma.silu(X, backend="onnxruntime"), q))
    assert fused == []  # no bfloat16 kernel on this backend: the call core widens to float32 first
    with pytest.raises(ValueError, match="multiple of the group size"):
        ma.silu(np.ones((4, 48), np.float32), quant=q, backend="onnxruntime")
    assert fused == [False]


def test_backend_threads_and_specials(fused):
    """Two threads and the special groups: the same bits."""
    x = _special_rows()
    before = ma.get_num_threads()
    ma.set_num_threads(2)
    try:
        for qid in ("int8-token", "int8-static", "e5m2-mx-floor", "e4m3-group32-floor"):
            q = QUANTS[qid]
            _same(ma.leaky_relu(x, 1.0, quant=q, backend="onnxruntime"),
                  ma.quantize(ma.leaky_relu(x, 1.0, backend="onnxruntime"), q))
    finally:
        ma.set_num_threads(before)
    assert fused and all(fused)


def test_ascend_onnx_path_runs_the_same_graph(monkeypatch):
    """The ascend backend's quant= for host arrays is the shared Runner's (its CANN provider list swapped for the
    CPU provider here, as tests/test_ascend_backend.py runs its graphs): the same bits."""
    from multiact.backend import ascend_backend as A
    from multiact.backend import onnxruntime_backend as ob

    q = QUANTS["e5m2-group64"]
    monkeypatch.setattr(A, "provider_list", lambda: ["CPUExecutionProvider"])
    A._runner.clear()
    calls: list = []
    real = A._runner.quantized
    monkeypatch.setattr(A._runner, "quantized", lambda *a: calls.append(a[2:]) or real(*a))
    monkeypatch.setattr(ob, "_runner", A._runner)  # the onnxruntime backend's hook on the ascend Runner
    _same(ma.gelu(X, quant=q, backend="onnxruntime"), ma.quantize(ma.gelu(X, backend="onnxruntime"), q))
    assert calls == [("float32", q)] and A._runner.session_count() >= 1  # the quantized session is the ascend one
    assert A.quantized.__module__ == A.__name__
    calls.clear()
    assert A.quantized(None, None, None, "bfloat16", q) is None and calls == [("bfloat16", q)]
    A._runner.clear()
