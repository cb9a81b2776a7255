"""The gated family (glu, swiglu, geglu, reglu) on ONNX Runtime: the onnxruntime backend's gated:<act>
kernels through the public functions (every kernel key, forward and backward, float16 and float32,
layouts, the clipped form, views and in place), the exported models of `ma.to_onnx`, and what ONNX's own
SwiGLU does on the installed ONNX Runtime."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import multiact as ma  # noqa: E402
from multiact import consistency as C  # noqa: E402
from multiact import gated  # noqa: E402
from multiact._opdefs import COMPOSITE_DEFINITIONS, GATED  # noqa: E402
from multiact.backend import _ort_sessions  # noqa: E402
from multiact.optable import FAMILY_KEYS  # noqa: E402

B = "onnxruntime"
DTYPES = ("float16", "float32")  # the onnxruntime backend's dtypes (float64: no, as for every op)
GATED_KEYS = sorted(k for k, (f, _, _) in FAMILY_KEYS.items() if f is GATED)


def _split_params(op: str, params: dict) -> tuple[dict, dict]:
    cdef = COMPOSITE_DEFINITIONS[op]
    own = {k: v for k, v in params.items() if k in cdef.param_names}
    return own, {k: v for k, v in params.items() if k not in cdef.param_names and k != "up"}


def _call(op: str, params: dict) -> gated.GatedCall:
    own, extra = _split_params(op, params)
    return gated.resolve(COMPOSITE_DEFINITIONS[op], own, extra, f"{op}()")


def _case_per_key() -> dict[str, tuple[str, dict]]:
    """One suite case (op, params) per gated kernel key; the clipped form and the two-input form join in."""
    out: dict[str, tuple[str, dict]] = {}
    for op, params in C.gated_cases():
        out.setdefault(_call(op, params).key, (op, params))
    return out


KEY_CASES = _case_per_key()


def test_every_gated_key_has_a_case_and_a_kernel():
    assert set(KEY_CASES) == set(GATED_KEYS)
    for key in GATED_KEYS:
        for direction in ("forward", "backward"):
            assert all(_ort_sessions.supports(key, direction, d) for d in DTYPES)
            assert not _ort_sessions.supports(key, direction, "float64")
        assert not _ort_sessions.supports(key, "backward_y", "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", GATED_KEYS)
def test_backend_kernel_of_every_gated_key(key, dtype):
    """Forward and backward through ma.<op>(..., backend="onnxruntime") against the composed reference."""
    op, params = KEY_CASES[key]
    failures = C.gated_failures(B, op, params, dtype)
    assert not failures, "\n".join(failures)


FORMS = [
    ("swiglu", {"alpha": 1.702, "limit": 7.0, "layout": "interleaved"}),  # GPT-OSS, limit hit
    ("swiglu", {"limit": 1000.0, "dim": 0}),  # clipped form, hit by the specials only
    ("swiglu", {"layout": "interleaved", "activate": "second", "dim": 0}),
    ("geglu", {"approximate": "tanh", "layout": "interleaved"}),
    ("reglu", {"activate": "second"}),
    ("glu", {}),
    ("glu", {"act": "tanh", "layout": "interleaved", "dim": 0}),
    ("swiglu", {"up": True, "activate": "second"}),
    ("glu", {"up": True, "act": "softplus", "beta": 2.0, "threshold": 5.0}),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,params", [pytest.param(o, p, id=f"{o}[{C.case_id(p)}]") for o, p in FORMS])
def test_backend_layouts_and_clipped_form(op, params, dtype):
    failures = C.gated_failures(B, op, params, dtype)
    assert not failures, "\n".join(failures)


@pytest.fixture
def bound(monkeypatch):
    """The output buffers every gated session run binds."""
    seen = []
    real = _ort_sessions._Entry.run_into

    def spy(self, arrays, outs):
        seen.append(list(outs))
        return real(self, arrays, outs)

    monkeypatch.setattr(_ort_sessions._Entry, "run_into", spy)
    return seen


def _x(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)


def test_contiguous_halves_bind_the_callers_buffers(bound):
    """dim=0 halves are contiguous: no copies, the results written straight into out / dx."""
    x = _x((8, 33))
    out = np.empty((4, 33), np.float32)
    assert ma.swiglu(x, dim=0, out=out, backend=B) is out
    assert bound[-1][0].ctypes.data == out.ctypes.data
    np.testing.assert_array_equal(out, ma.swiglu(x, dim=0, backend=B))
    dx = np.empty_like(x)
    ma.swiglu_grad(_x((4, 33), seed=1), x, dim=0, out=dx, backend=B)
    assert [o.ctypes.data for o in bound[-1]] == [dx.ctypes.data, dx[4:].ctypes.data]


def test_strided_views_and_in_place_two_input_backward():
    """Views of x (halves along the last dim, interleaved) are copied; a backward in place into its inputs
    (Liger's style: dgate into gate, dup into up) gives what a fresh one gives."""
    x = _x((6, 40))
    dy = _x((6, 20), seed=2)
    for layout in ("halves", "interleaved"):
        want = ma.swiglu(x, layout=layout, backend="numpy")
        got = ma.swiglu(x, layout=layout, backend=B)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
        out = np.full((6, 40), np.nan, np.float32)[:, ::2]  # a strided destination
        ma.swiglu(x, layout=layout, out=out, backend=B)
        np.testing.assert_array_equal(out, got)
    gate, up = _x((5, 30), seed=3), _x((5, 30), seed=4)
    dy = _x((5, 30), seed=5)
    want_g, want_u = ma.geglu_grad(dy, gate, up=up, backend=B)
    g2, u2 = gate.copy(), up.copy()
    res = ma.geglu_grad(dy, g2, up=u2, out=(g2, u2), backend=B)
    assert res[0] is g2 and res[1] is u2
    np.testing.assert_array_equal(g2, want_g)
    np.testing.assert_array_equal(u2, want_u)
    y2 = gate.copy()
    ma.geglu(y2, up=up, out=y2, backend=B)  # forward in place: one output, written last
    np.testing.assert_array_equal(y2, ma.geglu(gate, up=up, backend=B))


def test_sessions_are_cached_per_parameters():
    runner = __import__("multiact.backend.onnxruntime_backend", fromlist=["_runner"])._runner
    runner.clear()  # the cache holds at most 256 sessions: earlier tests of this worker may have filled it
    x = _x((4, 8))
    ma.swiglu(x, alpha=1.5, backend=B)
    n = runner.session_count()
    ma.swiglu(x, alpha=1.5, backend=B)
    assert runner.session_count() == n
    ma.swiglu(x, alpha=1.25, backend=B)
    ma.swiglu(x, alpha=1.25, limit=3.0, backend=B)
    assert runner.session_count() == n + 2


# ---- ma.to_onnx of the gated ops -----------------------------------------------------------------------


def _session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _widened(spec):
    """The activation's bound, one more ulp for the product (as the shared suite judges the gated ops)."""
    t = spec.tol
    return replace(spec, tol=replace(t, ulp32=t.ulp32 + 1, ulp16=t.ulp16 + 1, ulp64=t.ulp64 + 1))


def _inputs(call, dtype, half, limit_hit):
    """gate from the activation's sample (kinks and specials), up random with +-0, NaN and (clipped form)
    values beyond the limit, dy random: moderate magnitudes, so no float32 intermediate overflows."""
    n = int(np.prod(half))
    rng = np.random.default_rng(7)
    g = np.resize(C.sample_x(call.act, call.act_p, dtype, n=200), n)
    g = np.where(np.abs(g.astype(np.float64)) > 1e4, np.float64(np.sign(g)) * 50, g)  # keep NaN and the rest
    g[:4] = [np.inf, -np.inf, np.nan, -0.0]
    u = rng.standard_normal(n) * (4 * limit_hit if limit_hit else 3)
    u[:6] = [0.0, -0.0, np.nan, 1.0, -2.0, 0.5]
    dy = rng.standard_normal(n)
    return (a.reshape(half).astype(dtype) for a in (g, u, dy))


EXPORTS = [
    ("swiglu", {}, 2),
    ("swiglu", {"alpha": 1.702, "limit": 7.0, "layout": "interleaved"}, 2),
    ("swiglu", {"activate": "second", "dim": 0}, 3),
    ("glu", {}, 2),  # PyTorch's F.glu: a * sigmoid(b)
    ("glu", {"act": "leaky_relu", "negative_slope": 0.2, "layout": "interleaved", "dim": 1}, 3),
    ("glu", {"act": "elu", "alpha": 0.5, "activate": "first"}, 1),
    ("geglu", {}, 3),
    ("geglu", {"approximate": "tanh", "dim": -2}, 3),
    ("reglu", {"layout": "interleaved", "dim": 0}, 2),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,params,ndim", [pytest.param(o, p, n, id=f"{o}[{C.case_id(p)}]-{n}d")
                                            for o, p, n in EXPORTS])
def test_exported_model_matches_the_reference(op, params, ndim, dtype):
    call = _call(op, params)
    dim = call.dim % ndim
    half = (6, 5, 7)[:ndim]
    kp = {**call.kp, **{k: float(np.float32(v)) for k, v in call.act_p.items() if isinstance(v, float)}}
    if kp["limit"] != math.inf:
        kp["limit"] = float(np.float32(kp["limit"]))
    gate, up, dy = _inputs(call, dtype, half, kp["limit"] if kp["limit"] != math.inf else 0)
    full = list(half)
    full[dim] *= 2
    x = np.empty(full, dtype)
    a, b = gated.split(x, dim, call.layout)
    (a if call.gate_first else b)[...] = gate
    (b if call.gate_first else a)[...] = up

    model = ma.to_onnx(op, dtype=dtype, ndim=ndim, **params)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["y"]
    assert model.opset_import[0].version == 20 and "SwiGLU" not in {n.op_type for n in model.graph.node}
    (y,) = _session(model).run(None, {"x": x})
    gmodel = ma.to_onnx(op, dtype=dtype, grad=True, ndim=ndim, **params)
    onnx.checker.check_model(gmodel, full_check=True)
    assert [i.name for i in gmodel.graph.input] == ["dy", "x"] and gmodel.graph.output[0].name == "dx"
    (dx,) = _session(gmodel).run(None, {"dy": dy, "x": x})
    assert y.dtype == np.dtype(dtype) and y.shape == gate.shape
    assert dx.dtype == np.dtype(dtype) and dx.shape == x.shape
    da, db = gated.split(dx, dim, call.layout)
    dgate, dup = (da, db) if call.gate_first else (db, da)

    spec = _widened(call.act)
    ref_y = gated.reference_forward(call.act, kp, gate, up)
    ref_dg, ref_du = gated.reference_backward(call.act, kp, dy, gate, up)
    with np.errstate(all="ignore"):
        g64, u64 = gated.clipped(gate.astype(np.float64), up.astype(np.float64), kp)
        dy64 = dy.astype(np.float64)
        g = g64.astype(dtype)
        checks = (("y", y, ref_y, "forward", g64 * u64), ("dgate", dgate, ref_dg, "backward", dy64 * u64),
                  ("dup", dup, ref_du, "forward", dy64 * g64))
        for what, got, ref, direction, scale in checks:
            v = C.compare(np.ascontiguousarray(got), ref, g, spec, direction, scale=scale, params=call.act_p)
            assert v.passed, f"{what}: {v.describe()}"


def test_exported_model_equals_the_backend_and_takes_any_leading_size():
    """The exported graph is the backend's kernel graph around a split: the same values, for any leading dims."""
    model = _session(ma.to_onnx("swiglu", alpha=1.702, limit=7.0, layout="interleaved", ndim=3))
    gmodel = _session(ma.to_onnx("swiglu", grad=True, alpha=1.702, limit=7.0, layout="interleaved", ndim=3))
    kw = {"alpha": 1.702, "limit": 7.0, "layout": "interleaved"}
    for shape in ((1, 1, 2), (3, 4, 16), (2, 0, 8)):
        x = _x(shape, seed=sum(shape))
        (y,) = model.run(None, {"x": x})
        np.testing.assert_array_equal(y, ma.swiglu(x, backend=B, **kw))
        dy = _x(y.shape, seed=1)
        (dx,) = gmodel.run(None, {"dy": dy, "x": x})
        np.testing.assert_array_equal(dx, ma.swiglu_grad(dy, x, backend=B, **kw))


def test_export_declares_dynamic_dims_and_refuses_bad_arguments():
    model = ma.to_onnx("geglu", ndim=3, dim=1)
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["d0", "D", "d2"]
    assert [d.dim_param for d in model.graph.output[0].type.tensor_type.shape.dim] == ["d0", "H", "d2"]
    assert len(ma.to_onnx("swiglu").graph.input[0].type.tensor_type.shape.dim) == 2  # default: (tokens, 2*hidden)
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        ma.to_onnx("swiglu", dim=2)
    with pytest.raises(ValueError, match="ndim"):
        ma.to_onnx("swiglu", ndim=0)
    with pytest.raises(ValueError, match="limit"):
        ma.to_onnx("swiglu", limit=-1.0)
    with pytest.raises(ValueError, match="act"):
        ma.to_onnx("glu", act="prelu")
    with pytest.raises(TypeError):
        ma.to_onnx("swiglu", beta=2.0)  # the named forms fix their activation
    with pytest.raises(ValueError, match="grad=True"):
        ma.to_onnx("swiglu", grad="beta")
    with pytest.raises(ValueError, match="dtype"):
        ma.to_onnx("reglu", dtype="float64")
    (y,) = _session(ma.to_onnx("reglu", ndim=1)).run(None, {"x": np.float32([1, 2, -3, 4])})
    np.testing.assert_array_equal(y, [-3, 8])
    with pytest.raises(Exception, match="(?i)shape|broadcast|dimension"):  # an odd length fails in the session
        _session(ma.to_onnx("reglu", ndim=1)).run(None, {"x": np.float32([1, 2, 3])})


def test_onnx_swiglu_op_is_not_run_by_this_onnx_runtime():
    """ONNX's SwiGLU (opset 28) and why the graphs do not use it: ONNX Runtime expands the function into
    Swish (opset 24) and has no kernel for that.  When this fails, ORT runs it: measure its accuracy
    against the composite (multiact.onnx_export, the gated section) before using it."""
    if onnx.defs.onnx_opset_version() < 28 or not onnx.defs.has("SwiGLU"):
        pytest.skip(f"onnx {onnx.__version__} has no SwiGLU")
    from onnx import TensorProto, helper

    for elem in (TensorProto.FLOAT16, TensorProto.FLOAT):
        node = helper.make_node("SwiGLU", ["A", "B"], ["Y"], alpha=1.0)
        graph = helper.make_graph([node], "swiglu", [helper.make_tensor_value_info(n, elem, ["N"]) for n in "AB"],
                                  [helper.make_tensor_value_info("Y", elem, ["N"])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
        model.ir_version = 11
        with pytest.raises(Exception, match="NOT_IMPLEMENTED|Swish"):
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# ---- the ascend backend: the same sessions on another provider list, and its torch path ----------------


@pytest.fixture
def cann_path_on_cpu(monkeypatch):
    """The ascend backend's ORT path with only the provider list swapped for the CPU provider."""
    from multiact.backend import ascend_backend as A

    monkeypatch.setattr(A, "provider_list", lambda: ["CPUExecutionProvider"])
    A._runner.clear()
    yield A
    A._runner.clear()


@pytest.mark.parametrize("op,params", [("swiglu", {"alpha": 1.702, "limit": 7.0}), ("geglu", {"approximate": "tanh"}),
                                       ("glu", {"act": "softplus", "beta": 2.0, "threshold": 5.0})])
def test_ascend_runs_the_gated_kernels_on_both_paths(cann_path_on_cpu, op, params):
    """NumPy arrays: the ORT graphs (here on the CPU provider), the onnxruntime backend's values exactly;
    torch tensors (CPU here; on an NPU the same torch calls run CANN kernels): near the reference."""
    A = cann_path_on_cpu
    call = _call(op, params)
    assert all(A.supports(call.key, d, "float32") for d in ("forward", "backward"))
    gate, up, dy = (_x(300, seed=s)[::-1] for s in (1, 2, 3))  # strided views
    gate[:3] = [8.0, np.nan, -np.inf]
    out = np.empty_like(gate)
    A.kernel(call.key, "forward", "float32")(gate, up, out, call.kp)
    first, second = (gate, up) if call.gate_first else (up, gate)  # the public form's argument order
    np.testing.assert_array_equal(out, getattr(ma, op)(first, up=second, backend=B, **params))
    dg, du = np.empty_like(gate), np.empty_like(gate)
    A.kernel(call.key, "backward", "float32")(dy, gate, up, dg, du, call.kp)
    dfirst, dsecond = getattr(ma, f"{op}_grad")(dy, first, up=second, backend=B, **params)
    np.testing.assert_array_equal(dg, dfirst if call.gate_first else dsecond)
    np.testing.assert_array_equal(du, dsecond if call.gate_first else dfirst)
    entry = A._runner.entry(call.key, "forward", "float32", tuple(call.kp.values()), call.kp)
    assert entry.sess.get_providers() == ["CPUExecutionProvider"]

    torch = pytest.importorskip("torch")
    gate[2] = -50.0  # torch's swish composite, x * sigmoid(beta * x), is NaN at -inf (the elementwise path's too)
    tg, tu, tdy = (torch.from_numpy(a.copy()) for a in (gate, up, dy))
    tout = torch.empty_like(tg)
    A.kernel(call.key, "forward", "float32")(tg, tu, tout, call.kp)
    ref = gated.reference_forward(call.act, call.kp, gate, up)
    np.testing.assert_allclose(tout.numpy(), ref, rtol=1e-5, atol=1e-6)
    tdg, tdu = torch.empty_like(tg), torch.empty_like(tg)
    A.kernel(call.key, "backward", "float32")(tdy, tg, tu, tdg, tdu, call.kp)
    rdg, rdu = gated.reference_backward(call.act, call.kp, dy, gate, up)
    np.testing.assert_allclose(tdg.numpy(), rdg, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tdu.numpy(), rdu, rtol=1e-5, atol=1e-5)
