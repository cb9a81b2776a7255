"""Every op x direction x dtype exported to ONNX: the checker passes and ONNX Runtime matches the reference."""

from __future__ import annotations

import numpy as np
import pytest

from multiact.consistency import compare, reference
from multiact.optable import OPS, OpSpec, Tolerance

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from multiact.onnx_export import DTYPES, deviations, to_onnx  # noqa: E402

# Non-default settings exercise the parameters; float params are already exact in float32 or get rounded.
PARAM_CASES: dict[str, list[dict]] = {
    "leaky_relu": [{}, {"negative_slope": 0.2}, {"negative_slope": -0.7}],
    "prelu": [{"weight": np.array([0.25, -0.5, 2.0])}, {"weight": np.array([0.1])}],
    "elu": [{}, {"alpha": 0.3}, {"alpha": -0.5}],
    "celu": [{}, {"alpha": 0.3}, {"alpha": -2.0}],
    "gelu": [{}, {"approximate": "tanh"}],
    "swish": [{}, {"beta": 1.7}, {"beta": -0.3}],
    "hardtanh": [{}, {"min_val": -0.3, "max_val": 2.5}],
    "softplus": [{}, {"beta": 2.0, "threshold": 5.0}, {"beta": 0.7, "threshold": 20.0}],
    "softshrink": [{}, {"lambd": 0.3}, {"lambd": 0.0}],
    "hardshrink": [{}, {"lambd": 0.3}, {"lambd": 0.0}],
    "threshold": [{"threshold": 0.3, "value": -2.0}, {"threshold": -1.0, "value": 0.0}],
}


def cases():
    for name in OPS:
        for i, params in enumerate(PARAM_CASES.get(name, [{}])):
            for grad in (False, True):
                for dtype in DTYPES:
                    yield pytest.param(name, params, grad, dtype, id=f"{name}{i}-{'bwd' if grad else 'fwd'}-{dtype}")


def special_inputs(spec: OpSpec, params: dict, dtype: str) -> np.ndarray:
    """Specials, kinks and their neighbours, the float32 tails, random values: exactly representable."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(7)
    fixed = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1e-3, -1e-3, 0.5, -0.5, 1, -1,
             3, -3, 6, 17, -17, 20, -20, 30, -30, 88, -88, 100, -100, 1e4, -1e4, 1e30, -1e30, 3e38, -3e38]
    p = {k: v for k, v in params.items() if k != "weight"}
    kinks = []
    for k in spec.kinks(spec.defaults() | p):
        kk = np.float32(k)
        kinks += [kk, np.nextafter(kk, np.float32(np.inf)), np.nextafter(kk, np.float32(-np.inf))]
    x = np.concatenate([
        np.array(fixed + kinks, dtype=np.float32),
        (rng.standard_normal(3000) * 4).astype(np.float32),
        (rng.standard_normal(500) * 1e-3).astype(np.float32),
        np.linspace(-12, 12, 2401, dtype=np.float32),
    ])
    with np.errstate(over="ignore"):
        return x.astype(dt)


def check_close(got: np.ndarray, ref: np.ndarray, dtype: str, tol: Tolerance, atol: float,
                scale: np.ndarray, what: str) -> None:
    """|got - ref| <= ulp * spacing(ref) + atol * eps * scale; NaN exactly where ref is NaN."""
    dt = np.dtype(dtype)
    g = got.astype(np.float64)
    with np.errstate(all="ignore"):
        rounded = ref.astype(dt).astype(np.float64)
        spacing = np.spacing(np.abs(rounded).astype(dt)).astype(np.float64)
        bound = tol.ulp(dtype) * spacing
        if atol:
            bound = bound + atol * float(np.finfo(dt).eps) * np.abs(scale)
        ok = (np.abs(g - ref) <= bound) | (g == rounded) | (np.isnan(ref) & np.isnan(g))
    bad = np.flatnonzero(~ok | (np.isnan(ref) != np.isnan(g)))
    if bad.size:
        rows = [f"  at {i}: got {g.flat[i]!r}, ref {ref.flat[i]!r}" for i in bad[:5]]
        pytest.fail(f"{what}: {bad.size} of {g.size} outside tolerance\n" + "\n".join(rows))


def session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ref_params(spec: OpSpec, params: dict) -> dict:
    p = spec.defaults() | params
    return {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in p.items()}


@pytest.mark.parametrize("name, params, grad, dtype", list(cases()))
def test_export_matches_reference(name, params, grad, dtype):
    """The accuracy="contract" graph within the op's Tolerance, judged as every backend is
    (multiact.consistency.compare: ulps, atol, the condition of the op's argument, NaN, inf, sign of zero)."""
    spec = OPS[name]
    model = to_onnx(name, dtype=dtype, grad=grad, **{k: v for k, v in params.items() if k != "weight"})
    onnx.checker.check_model(model, full_check=True)
    x = special_inputs(spec, params, dtype)
    feeds = {}
    rp = ref_params(spec, params)
    if name == "prelu":
        n = x.size // 3 * 3
        x = x[:n].reshape(1, 3, -1) if rp["weight"].size == 3 else x.reshape(1, 1, -1)
        w = rp["weight"].astype(dtype)
        feeds["weight"] = w.reshape(-1)
        rp = {"weight": w.astype(np.float64).reshape(1, -1, 1), "axis": 1}
    else:
        x = x.reshape(-1)
    feeds["x"] = x
    if grad:
        dy = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
        dy.reshape(-1)[:40] = 1
        feeds["dy"] = dy
        ref = reference(spec, "backward", rp, np.dtype(dtype), dy, x)
    else:
        ref = reference(spec, "forward", rp, np.dtype(dtype), x)
    (got,) = session(model).run(None, feeds)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    v = compare(got, ref, x, spec, "backward" if grad else "forward", scale=dy if grad else None,
                params={k: v for k, v in params.items() if k != "weight"})
    assert v.passed, f"{name}{params} {'grad' if grad else 'forward'} {dtype}: {v.describe()}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_swish_beta_grad_graph(dtype):
    spec = OPS["swish"]
    x = special_inputs(spec, {"beta": 1.5}, dtype)
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    (got,) = session(to_onnx("swish", dtype=dtype, grad="beta", beta=1.5)).run(None, {"dy": dy, "x": x})
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    fin = np.isfinite(x64)
    ref = spec.param_grad[1](dy64[fin], x64[fin], 1.5)
    (got_fin,) = session(to_onnx("swish", dtype=dtype, grad="beta", beta=1.5)).run(None, {"dy": dy[fin], "x": x[fin]})
    assert got.dtype == np.float64 and got.shape == ()
    assert np.isnan(got)  # the NaN input poisons the sum, as in the reference
    assert abs(float(got_fin) - ref) <= 1e-9 * np.sum(np.abs(dy64[fin] * x64[fin] ** 2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_prelu_weight_grad_graph(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 50)).astype(dtype)
    dy = rng.standard_normal((4, 3, 50)).astype(dtype)
    (got,) = session(to_onnx("prelu", dtype=dtype, grad="weight")).run(None, {"dy": dy, "x": x})
    ref = OPS["prelu"].param_grad[1](dy, x, np.ones((1, 3, 1), dtype), 1)
    np.testing.assert_allclose(got, ref.reshape(-1), rtol=1e-12, atol=1e-12)


def test_one_node_graphs_where_onnx_has_the_op():
    assert [n.op_type for n in to_onnx("gelu", approximate="tanh").graph.node] != ["Gelu"]  # see deviations()
    assert [n.op_type for n in to_onnx("leaky_relu", negative_slope=0.2).graph.node] == ["LeakyRelu"]
    assert [n.op_type for n in to_onnx("relu6").graph.node] == ["Clip"]
    assert [n.op_type for n in to_onnx("elu", dtype="float16").graph.node] == ["Elu"]
    assert "Softplus" not in [n.op_type for n in to_onnx("softplus", beta=2.0).graph.node]
    for name, spec in OPS.items():
        model = to_onnx(name, **({"threshold": 0.0, "value": 0.0} if name == "threshold" else {}))
        if spec.onnx and len(model.graph.node) > 1:
            assert name in deviations(), f"{name}: composite without a stated reason"
        assert model.opset_import[0].version == 20


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="dtype"):
        to_onnx("relu", dtype="int8")
    with pytest.raises(ValueError, match="valid ops"):
        to_onnx("nope")
    with pytest.raises(ValueError, match="lambd"):
        to_onnx("softshrink", lambd=-1.0)
    with pytest.raises(ValueError, match="parameter 'beta'"):
        to_onnx("relu", grad="beta")


def test_erfc_fit_of_the_graphs_is_accurate_for_float32():
    import math

    from multiact.backend.onnx_graphs import erfc_coeffs

    z = np.linspace(0, 26, 20001)
    t = 1 / (1 + z / 2)
    got = t * np.exp(-z * z + np.polynomial.polynomial.polyval(t, erfc_coeffs()))
    want = np.array([math.erfc(v) for v in z])
    assert np.max(np.abs(got - want) / want) < 1e-9
