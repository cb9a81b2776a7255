"""ma.to_onnx as a deployment uses it: any rank with dynamic dims, dtype in any spelling, accuracy="contract"
(judged by multiact.consistency.compare, as every backend is) and accuracy="runtime" (ORT's own operators,
RUNTIME_ERRORS where they break the contract), and ONNX's own node test cases mapped onto multiact."""

from __future__ import annotations

import math

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from multiact import onnx_export as X  # noqa: E402
from multiact.backend import onnx_graphs as G  # noqa: E402

SHAPES = {0: (), 1: (30,), 2: (5, 6), 3: (2, 3, 5), 4: (2, 3, 1, 5)}  # small: one session per op and rank


def _session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=["NoopElimination"])


def _params(op):
    return {"threshold": 0.3, "value": -2.0} if op == "threshold" else {}


@pytest.mark.parametrize("dtype", X.DTYPES)
@pytest.mark.parametrize("op", list(OPS))
def test_every_rank_with_dynamic_dims(op, dtype):
    """Forward and backward at ranks 0-4, every dim dynamic: the shape comes through, and the values are within
    the contract of the reference and the same as ma.<op> computes (also within the contract)."""
    spec = OPS[op]
    p = _params(op)
    x0, dy0 = C.zero_pairs(np.dtype(dtype))
    sample_p = {"weight": "single"} if op == "prelu" else p
    pool = np.concatenate([x0, C.sample_x(spec, sample_p, dtype, n=120)]).astype(dtype)
    rng = np.random.default_rng(0)
    for rank, shape in SHAPES.items():
        n = math.prod(shape)
        x = rng.permutation(pool)[:n].reshape(shape)
        dy = rng.standard_normal(shape).astype(dtype)
        feeds, kw, rp = {"x": x}, dict(p), spec.validate(p) if op != "prelu" else None
        if op == "prelu":
            w = np.resize(np.array([0.25, -0.5, 2.0], dtype), x.shape[1] if rank >= 2 else 1)
            feeds["weight"], kw = w, {"axis": 1} if rank >= 2 else {"axis": 0}
            wshape = [1] * rank
            if rank >= 2:
                wshape[1] = w.size
            rp = {"weight": w.astype(np.float64).reshape(wshape), "axis": kw["axis"]}
        for grad in (False, True):
            model = X.to_onnx(op, dtype=dtype, grad=grad, shape=rank, **kw)
            assert [len(i.type.tensor_type.shape.dim) for i in model.graph.input][:1] == [rank]
            (got,) = _session(model).run(None, {**feeds, "dy": dy} if grad else feeds)
            assert got.shape == shape and got.dtype == np.dtype(dtype)
            direction = "backward" if grad else "forward"
            args = (dy, x) if grad else (x,)
            ref = C.reference(spec, direction, rp, np.dtype(dtype), *args)
            v = C.compare(got, ref, x, spec, direction, scale=dy if grad else None, params=p)
            assert v.passed, f"{op} rank {rank} {direction} {dtype}: {v.describe()}"
            mine = (ma.backward(op, dy, x, weight=feeds["weight"], axis=kw["axis"]) if op == "prelu" and grad
                    else ma.forward(op, x, weight=feeds["weight"], axis=kw["axis"]) if op == "prelu"
                    else ma.backward(op, dy, x, **p) if grad else ma.forward(op, x, **p))
            assert np.asarray(mine).shape == shape
            v = C.compare(np.asarray(mine), ref, x, spec, direction, scale=dy if grad else None, params=p)
            assert v.passed, f"ma.{op} rank {rank} {direction} {dtype}: {v.describe()}"


def test_shapes_names_and_fixed_dims():
    m = X.to_onnx("gelu", shape=["N", None, 224])
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["N", "d1", 224]
    assert [d.dim_param or d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == ["N", "d1", 224]
    x = np.linspace(-3, 3, 2 * 3 * 224, dtype=np.float32).reshape(2, 3, 224)
    (y,) = _session(m).run(None, {"x": x})
    assert y.shape == x.shape
    assert len(X.to_onnx("relu").graph.input[0].type.tensor_type.shape.dim) == 1  # the default: 1-D ["N"]
    for bad in (-1, "N", [1.5], [True], ["N", -2], 2.0):
        with pytest.raises(ValueError, match=r"to_onnx\(\): shape"):
            X.to_onnx("relu", shape=bad)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        X.to_onnx("prelu", shape=2, axis=3)
    with pytest.raises(ValueError, match="ndim="):
        X.to_onnx("swiglu", shape=2)


@pytest.mark.parametrize("dtype", ["float32", np.float32, np.dtype("float32"), "float16", np.float16])
def test_dtype_as_a_name_a_numpy_dtype_or_a_scalar_type(dtype):
    m = X.to_onnx("silu", dtype=dtype)
    want = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    assert m.graph.input[0].type.tensor_type.elem_type == want == m.graph.output[0].type.tensor_type.elem_type
    assert X.to_onnx("swiglu", dtype=dtype).graph.input[0].type.tensor_type.elem_type == want
    assert X.to_onnx("bias_act", act="relu", dtype=dtype).graph.input[0].type.tensor_type.elem_type == want


@pytest.mark.parametrize("dtype", ["int8", np.float64, bool, "bfloat16x", None])
def test_other_dtypes_are_refused_by_name(dtype):
    with pytest.raises(ValueError, match=r"to_onnx\(\): dtype must be float16, float32 or bfloat16 .*, got "):
        X.to_onnx("relu", dtype=dtype)


def test_accuracy_is_checked_and_recorded():
    with pytest.raises(ValueError, match="accuracy must be one of"):
        X.to_onnx("gelu", accuracy="fast")
    with pytest.raises(ValueError, match="accuracy='contract' only"):
        X.to_onnx("geglu", accuracy="runtime")
    assert "accuracy=runtime" in X.to_onnx("gelu", accuracy="runtime").graph.doc_string
    for word in ("Returns", "accuracy", "contract", "runtime", "shape", "dtype", "float64"):
        assert word.lower() in X.to_onnx.__doc__.lower(), word  # help(ma.to_onnx) says it
    assert ma.to_onnx is X.to_onnx


def test_contract_graphs_compute_in_float64_only_where_measured_necessary():
    for op in OPS:
        for grad in (False, True):
            nodes = X.to_onnx(op, grad=grad, **_params(op)).graph.node
            f64 = any(n.op_type == "Cast" and n.attribute[0].i == onnx.TensorProto.DOUBLE for n in nodes)
            need = op in (G.F64_BACKWARD if grad else G.F64_FORWARD)
            assert f64 == need, f"{op} {'backward' if grad else 'forward'}: float64 inside is {f64}"


def _runtime_cases():
    for op, spec in OPS.items():
        if op != "prelu":
            for p in C.param_cases(spec):
                yield pytest.param(op, p, id=f"{op}{p}")


@pytest.mark.parametrize("op, p", list(_runtime_cases()))
def test_runtime_graphs_are_orts_own_operators_and_the_unlisted_meet_the_contract(op, p):
    spec = OPS[op]
    full = spec.validate(dict(p))
    model = X.to_onnx(op, accuracy="runtime", **p)
    kinds = {n.op_type for n in model.graph.node}
    onnx_op = spec.defn.onnx
    if onnx_op and not (op == "threshold" and full["value"] != 0.0):
        assert onnx_op in kinds or (onnx_op == "Shrink" and "Shrink" in kinds), (op, kinds)
    if op in ("silu", "swish", "fast_gelu"):
        assert "Sigmoid" in kinds
    for dtype in X.DTYPES:
        x0, _ = C.zero_pairs(np.dtype(dtype))
        x = np.concatenate([x0, C.sample_x(spec, p, dtype, n=400)])
        (got,) = _session(X.to_onnx(op, accuracy="runtime", dtype=dtype, **p)).run(None, {"x": x})
        v = C.compare(got, C.reference(spec, "forward", full, np.dtype(dtype), x), x, spec, "forward", params=full)
        if op not in X.RUNTIME_ERRORS:
            assert v.passed, f"{op}{p} {dtype} runtime: {v.describe()} (not in RUNTIME_ERRORS)"


def test_runtime_errors_name_real_ops():
    assert set(X.RUNTIME_ERRORS) <= set(OPS)
    assert set(X.deviations()) <= set(OPS)
    assert set(X.RUNTIME_ULPS) <= set(X.RUNTIME_ERRORS)


@pytest.mark.parametrize("op", sorted(X.RUNTIME_ULPS))
def test_runtime_error_figures_hold(op):
    """RUNTIME_ULPS measured again on the documented inputs (the suite's and a grid on [-30, 30]): no error
    above twice its figure (the figures round up; other CPUs' MLAS kernels may differ a little), and none of
    the large figures a hundred times too high (an ORT that fixed its tails makes the docs wrong)."""
    spec = OPS[op]
    for dtype, figure in X.RUNTIME_ULPS[op].items():
        worst = 0.0
        for p in C.param_cases(spec):
            full = spec.validate(dict(p))
            x = np.concatenate([C.zero_pairs(np.dtype(dtype))[0], C.sample_x(spec, p, dtype, n=400),
                                np.linspace(-30, 30, 60001).astype(dtype)])
            (got,) = _session(X.to_onnx(op, accuracy="runtime", dtype=dtype, **p)).run(None, {"x": x})
            v = C.compare(got, C.reference(spec, "forward", full, np.dtype(dtype), x), x, spec, "forward", params=full)
            worst = max(worst, v.max_ulp if math.isfinite(v.max_ulp) else 0.0)
        assert worst <= 2 * figure, f"{op} {dtype}: measured {worst:.3g} ulp, RUNTIME_ULPS says {figure:g}"
        if figure >= 1e3:
            assert worst >= figure / 100, f"{op} {dtype}: measured {worst:.3g} ulp, RUNTIME_ULPS says {figure:g}"


# ---- ONNX's own node test cases ---------------------------------------------------------------------------

ONNX_OPS = ("Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Gelu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Mish",
            "HardSigmoid", "HardSwish", "PRelu", "Shrink", "ThresholdedRelu", "Clip")


def _node_cases():
    """ONNX's node test cases of ONNX_OPS: each operator's module of onnx.backend.test.case.node, imported
    alone, registers its cases (collect_testcases imports every operator's: ~10 s here; this ~1 s)."""
    import importlib
    import warnings

    import onnx.backend.test.case.node as N

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for t in ONNX_OPS:
            importlib.import_module(f"onnx.backend.test.case.node.{t.lower()}")
    cases = getattr(N, "_NodeTestCases", None)
    if cases is None:  # a later onnx: the public, slower way
        cases = N.collect_testcases("")
    found = [c for c in cases
             if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in ONNX_OPS and c.data_sets]
    missing = set(ONNX_OPS) - {c.model.graph.node[0].op_type for c in found}
    assert not missing, f"no ONNX node test cases found for {missing}"
    return [pytest.param(c, id=c.name) for c in found]


@pytest.mark.parametrize("case", _node_cases())
def test_onnx_node_cases_map_onto_multiact(case):
    node = case.model.graph.node[0]
    inputs, outputs = case.data_sets[0]
    x = inputs[0]
    if x.dtype not in (np.float16, np.float32, np.float64):
        pytest.skip(f"{case.name}: {x.dtype} data; multiact's activations take float16, float32 and float64 arrays")
    named = dict(zip([n for n in node.input if n], inputs, strict=True))  # "" marks an input left out
    op, params = X.from_onnx_node(node, *[named.get(n) if n else None for n in node.input[1:]])
    if op is None:  # Clip with min > max: ONNX's result is max everywhere, which hardtanh refuses
        with pytest.raises(ValueError, match="ONNX's Clip"):
            ma.hardtanh(x, **params)
        got = np.full_like(x, params["max_val"])
    else:
        got = ma.forward(op, x, **params)
    np.testing.assert_allclose(got, outputs[0], rtol=1e-5 if x.dtype != np.float16 else 2e-3, atol=1e-6,
                               err_msg=f"{case.name}: {op}{params}")


# ---- the ONNX operators' own parameters (issue 21 item 2) ---------------------------------------------------


@pytest.mark.parametrize("wshape", [(3, 4, 5), (5,), (3, 1, 5), (4, 1), (1, 4, 1)])
def test_prelu_weight_broadcasts_as_numpy_does(wshape):
    """A weight that broadcasts to x (ONNX's PRelu slope): forward, backward (into out=, in place too) and
    the weight gradient summed over the broadcast dims, as NumPy computes them."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x.flat[:3] = [0.0, -0.0, np.nan]
    dy = rng.standard_normal(x.shape).astype(np.float32)
    w = rng.standard_normal(wshape).astype(np.float32)
    wide = (x.astype(np.float64), dy.astype(np.float64), w.astype(np.float64))
    with np.errstate(invalid="ignore"):
        want_y = np.where(wide[0] > 0, wide[0], wide[0] * wide[2]).astype(np.float32)
        want_dx = np.where(np.isnan(wide[0]), np.nan, np.where(wide[0] > 0, wide[1], wide[1] * wide[2]))
    np.testing.assert_array_equal(ma.prelu(x, w), want_y)
    np.testing.assert_array_equal(np.signbit(ma.prelu(x, w)), np.signbit(want_y))
    out = np.empty_like(x)
    assert ma.backward("prelu", dy, x, weight=w, out=out) is out
    np.testing.assert_allclose(out, want_dx, rtol=1e-7)
    dy2 = dy.copy()
    ma.backward("prelu", dy2, x, weight=w, out=dy2)  # in place
    np.testing.assert_array_equal(dy2, out)
    aligned = (1,) * (3 - len(wshape)) + wshape
    contrib = np.where(wide[0] > 0, 0.0, wide[0] * wide[1])
    want_g = contrib.sum(axis=tuple(k for k in range(3) if aligned[k] == 1), keepdims=True).reshape(wshape)
    g = ma.param_grad("prelu", "weight", dy, x, weight=w)
    assert g.shape == wshape
    np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-6)


def test_prelu_weight_that_does_not_broadcast_is_refused_by_name():
    x = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(ValueError, match=r"prelu\(\): weight has shape \(2, 5\).*broadcasts to x's \(3, 4, 5\)"):
        ma.prelu(x, np.ones((2, 5), np.float32))


def test_hardtanh_min_above_max_is_refused_with_onnx_clips_rule():
    with pytest.raises(ValueError, match=r"hardtanh\(\): min_val \(2.0\) must be <= max_val \(1.0\).*ONNX's Clip"):
        ma.hardtanh(np.zeros(3, np.float32), min_val=2.0, max_val=1.0)


def test_onnx_parameters_with_pytorchs_defaults():
    x = np.linspace(-4, 4, 81).astype(np.float32)
    np.testing.assert_array_equal(ma.hardsigmoid(x), ma.hardsigmoid(x, alpha=1 / 6, beta=0.5))
    np.testing.assert_allclose(ma.hardsigmoid(x, alpha=0.2, beta=0.5), np.clip(0.2 * x + 0.5, 0, 1), atol=1e-7)
    np.testing.assert_array_equal(ma.selu(x), ma.selu(x, alpha=1.6732632423543772, scale=1.0507009873554805))
    np.testing.assert_allclose(ma.selu(x, alpha=2.0, scale=3.0), 3 * np.where(x > 0, x, 2 * np.expm1(x)), rtol=1e-6)
    big = np.array([30.0, 100.0], np.float32)
    np.testing.assert_allclose(ma.softplus(big, threshold=math.inf), big, rtol=1e-7)  # log1p(exp(x)) itself
    with pytest.raises(ValueError, match="finite or \\+inf"):
        ma.softplus(x, threshold=-math.inf)
    with pytest.raises(ValueError, match="alpha"):
        ma.hardsigmoid(x, alpha=0.0)
