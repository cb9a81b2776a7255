"""ma.bias_act: the shared suite on every host backend, the anchors' conventions (multiact.compat), and the
contract's errors cold and warm with nothing written."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import host_backends, skip_unless_sampled, supports

import multiact as ma
from multiact import compat, registry
from multiact import consistency as C
from multiact import fused_bias_act as B
from multiact.optable import BIAS_ACT_KEYS, FLOAT_DTYPES, OPS

BACKENDS = host_backends()
CASES = [pytest.param(p, id=C.case_id(p)) for p in C.bias_act_cases()]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("params", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_the_composed_reference(backend, params, dtype):
    own = {k: v for k, v in params.items() if k in B.DEFN.param_names}
    extra = {k: v for k, v in params.items() if k not in B.DEFN.param_names and k not in ("b", "scale")}
    key = B.resolve(own, extra, "bias_act()").key
    skip_unless_sampled(backend, key, list(BIAS_ACT_KEYS))
    for direction in ("forward", "backward"):
        if not supports(backend, key, direction, dtype):
            pytest.skip(f"{backend} has no {key} {direction} kernel for {dtype}")
    failures = C.bias_act_failures(backend, params, dtype)
    assert not failures, "\n".join(failures)


def test_the_suite_catches_a_wrong_kernel(monkeypatch):
    """A backward that forgets the gain, or a forward that adds the bias of the wrong channel, fails."""
    from multiact.backend import numpy_backend

    real = numpy_backend._bias_act

    def no_gain(key, direction):
        k = real(key, direction)
        return lambda *a: k(*a[:-1], {**a[-1], "gain": 1.0}) if direction == "backward" else k(*a)

    def rolled(key, direction):
        k = real(key, direction)
        if direction != "forward":
            return k
        return lambda x, b, s, o, p: k(x, None if b is None else np.roll(b, 1), s, o, p)

    try:
        for fake, case in ((no_gain, {"act": "relu", "b": "c", "gain": 2.0}), (rolled, {"act": "relu", "b": "c"})):
            monkeypatch.setattr(numpy_backend, "_bias_act", fake)
            registry.clear_cache()
            assert C.bias_act_failures("numpy", case, "float64"), fake
    finally:
        monkeypatch.setattr(numpy_backend, "_bias_act", real)
        registry.clear_cache()


# ---- the anchors -------------------------------------------------------------------------------------


@pytest.fixture
def nchw():
    rng = np.random.default_rng(2)
    return rng.standard_normal((2, 3, 4, 5)), rng.standard_normal(3)


def _lrelu(z, a):
    return np.where(z > 0, z, a * z)


@pytest.mark.parametrize("act,want", [
    ("linear", lambda z: z), ("relu", lambda z: np.maximum(z, 0) * math.sqrt(2)),
    ("lrelu", lambda z: _lrelu(z, 0.2) * math.sqrt(2)), ("tanh", np.tanh),
    ("sigmoid", lambda z: 1 / (1 + np.exp(-z))), ("swish", lambda z: z / (1 + np.exp(-z)) * math.sqrt(2)),
    ("softplus", lambda z: np.log1p(np.exp(z))), ("elu", lambda z: np.where(z > 0, z, np.expm1(z))),
])
def test_stylegan_defaults(nchw, act, want):
    """StyleGAN's bias_act reference: x + b along dim 1, its activation with the default alpha and gain."""
    x, b = nchw
    z = x + b.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(compat.stylegan_bias_act(x, b, act=act), want(z), rtol=1e-13, atol=1e-15)


def test_stylegan_clamp_and_its_zero_gradient(nchw):
    x, b = nchw
    z = x + b.reshape(1, 3, 1, 1)
    y = compat.stylegan_bias_act(x, b, act="lrelu", clamp=0.5)
    full = _lrelu(z, 0.2) * math.sqrt(2)
    np.testing.assert_allclose(y, np.clip(full, -0.5, 0.5), rtol=1e-14)
    dx, db = compat.stylegan_bias_act_grad(np.ones_like(x), x, b, act="lrelu", clamp=0.5)
    want = np.where(np.abs(full) > 0.5, 0.0, np.where(z > 0, 1.0, 0.2) * math.sqrt(2))
    np.testing.assert_allclose(dx, want, rtol=1e-14)
    np.testing.assert_allclose(db, want.sum(axis=(0, 2, 3)), rtol=1e-13)
    np.testing.assert_array_equal(compat.stylegan_bias_act(x, b, act="relu", clamp=-1),
                                  compat.stylegan_bias_act(x, b, act="relu"))  # its "no clamp"


def test_cann_fused_bias_leaky_relu():
    rng = np.random.default_rng(3)
    x, bias = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    z = (x + bias).astype(np.float64)
    np.testing.assert_allclose(compat.fused_bias_leaky_relu(x, bias), _lrelu(z, 0.2) * math.sqrt(2), rtol=2e-7)
    dx = compat.fused_bias_leaky_relu_grad(np.ones_like(x), x, bias)
    np.testing.assert_allclose(dx, np.where(z > 0, 1.0, 0.2) * math.sqrt(2), rtol=2e-7)


def test_ort_bias_gelu_and_fast_gelu():
    rng = np.random.default_rng(4)
    x, bias = rng.standard_normal((3, 16)), rng.standard_normal(16)
    np.testing.assert_allclose(compat.bias_gelu(x, bias), ma.gelu(x + bias), rtol=1e-15)
    k = math.sqrt(2 / math.pi)
    z = x + bias
    np.testing.assert_allclose(compat.fast_gelu(x, bias), 0.5 * z * (1 + np.tanh(k * (z + 0.044715 * z**3))),
                               rtol=1e-13)
    np.testing.assert_allclose(compat.fast_gelu(x), ma.gelu(x, approximate="tanh"), rtol=1e-15)


def test_full_shape_b_and_scale_give_elementwise_gradients():
    rng = np.random.default_rng(5)
    x, b, s, dy = (rng.standard_normal((3, 4)) for _ in range(4))
    dx, db, ds = ma.bias_act_grad(dy, x, b, "tanh", scale=s)
    dz = dy * (1 - np.tanh(x * s + b) ** 2)
    np.testing.assert_allclose(db, dz, rtol=1e-13)
    np.testing.assert_allclose(dx, dz * s, rtol=1e-13)
    np.testing.assert_allclose(ds, dz * x, rtol=1e-13)
    dx, db_none, ds = ma.bias_act_grad(dy, x, act="tanh", scale=s[0], dim=1)
    assert db_none is None and ds.shape == (4,)


def test_in_place_and_out_tuple():
    rng = np.random.default_rng(6)
    x, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    want = ma.bias_act(x, b, "silu", dim=1)
    xc = x.copy()
    assert ma.bias_act(xc, b, "silu", dim=1, out=xc) is xc
    np.testing.assert_array_equal(xc, want)
    dy = np.ones_like(x)
    dx_want, db_want = ma.bias_act_grad(dy, x, b, "silu", dim=1)
    dx, db = np.empty_like(x), np.empty_like(b)
    got = ma.bias_act_grad(dy, x, b, "silu", dim=1, out=(dx, db))
    assert got[0] is dx and got[1] is db
    np.testing.assert_array_equal(dx, dx_want)
    np.testing.assert_array_equal(db, db_want)


def test_db_is_summed_in_float64():
    """float16 channels of 64K ones: a float16 accumulator would stop at 2048."""
    x = np.zeros((1, 2, 65536 // 2), np.float16)
    _, db = ma.bias_act_grad(np.ones_like(x), x, np.zeros(2, np.float16), dim=1)
    np.testing.assert_array_equal(db, np.full(2, 32768, np.float16))


# ---- the contract ------------------------------------------------------------------------------------

BAD = [
    ("b of the wrong length", lambda x, o: ma.bias_act(x, np.ones(4, np.float32), out=o), ValueError,
     r"bias_act\(\): b has shape \(4,\); expected \(5,\)"),
    ("b of another dtype", lambda x, o: ma.bias_act(x, np.ones(5), out=o), TypeError, r"bias_act\(\): b has dtype"),
    ("scale of the wrong shape", lambda x, o: ma.bias_act(x, scale=np.ones((2, 5), np.float32), out=o), ValueError,
     r"bias_act\(\): scale has shape"),
    ("dim out of range", lambda x, o: ma.bias_act(x, np.ones(5, np.float32), dim=2, out=o), ValueError,
     r"bias_act\(\): dim 2 is out of range"),
    ("unknown act", lambda x, o: ma.bias_act(x, act="lrelu", out=o), ValueError,
     r"bias_act\(\): parameter 'act' must be 'linear' or an activation.*valid: linear, relu"),
    ("prelu", lambda x, o: ma.bias_act(x, act="prelu", out=o), ValueError, r"bias_act\(\): parameter 'act'"),
    ("another activation's parameter", lambda x, o: ma.bias_act(x, act="relu", alpha=0.2, out=o), TypeError,
     r"bias_act\(\): unexpected keyword argument 'alpha'; relu's parameters: none"),
    ("linear with a parameter", lambda x, o: ma.bias_act(x, negative_slope=0.2, out=o), TypeError,
     r"bias_act\(\): unexpected keyword argument 'negative_slope'; linear's"),
    ("negative clamp", lambda x, o: ma.bias_act(x, clamp=-1.0, out=o), ValueError, r"bias_act\(\): parameter 'clamp'"),
    ("NaN gain", lambda x, o: ma.bias_act(x, gain=float("nan"), out=o), ValueError,
     r"bias_act\(\): parameter 'gain' must be finite"),
    ("gain beyond float32", lambda x, o: ma.bias_act(x, gain=1e300, out=o), ValueError,
     r"bias_act\(\): parameter 'gain'.*float32"),
    ("out of another shape", lambda x, o: ma.bias_act(x, out=o[:, :4]), ValueError, r"bias_act\(\): out has shape"),
    ("out overlapping x", lambda x, o: ma.bias_act(x[:, 1:], out=x[:, :4]), ValueError,
     r"bias_act\(\): out overlaps x"),
    ("integer x", lambda x, o: ma.bias_act(x.astype(np.int64), out=o), TypeError, r"bias_act\(\): x"),
    ("grad: dy of another shape", lambda x, o: ma.bias_act_grad(x[:, :4], x, out=o), ValueError,
     r"bias_act_grad\(\): dy has shape"),
    ("grad: out not a tuple", lambda x, o: ma.bias_act_grad(x, x, np.ones(5, np.float32), out=o), TypeError,
     r"bias_act_grad\(\): out must be a tuple \(dx, db\)"),
    ("grad: db out of the wrong shape", lambda x, o: ma.bias_act_grad(x, x, np.ones(5, np.float32),
                                                                      out=(o, np.empty(4, np.float32))),
     ValueError, r"bias_act_grad\(\): out has shape \(4,\), expected \(5,\)"),
]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("what,call,exc,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_anything_is_written(what, call, exc, match, warm):
    x = np.random.default_rng(8).standard_normal((3, 5)).astype(np.float32)
    out = np.full((3, 5), 7.0, np.float32)
    if warm:
        ma.bias_act(x, np.ones(5, np.float32), "leaky_relu", negative_slope=0.2, out=np.empty_like(out))
        ma.bias_act_grad(x, x, np.ones(5, np.float32))
    x0 = x.copy()
    with pytest.raises(exc, match=match):
        call(x, out)
    assert np.all(out == 7.0) and np.array_equal(x, x0)


def test_stylegan_names_its_own_activations():
    with pytest.raises(ValueError, match="stylegan_bias_act\\(\\): act must be one of linear, relu, lrelu"):
        compat.stylegan_bias_act(np.ones((1, 2)), act="gelu")


# ---- the y= form ---------------------------------------------------------------------------------------

Y_ACTS = ["linear"] + [n for n, s in OPS.items() if s.backward_y is not None and n != "prelu"]


def _y_gain(act: str) -> float:
    """StyleGAN's sqrt(2) where any gain gives act(z) back from y; 2 for relu6 and hardtanh (fused_bias_act:
    their y form reads y / gain at breakpoints away from 0, exact for a power of two)."""
    return 2.0 if act in ("relu6", "hardtanh") else math.sqrt(2)


@pytest.mark.parametrize("clamp", [None, 1.0], ids=["no-clamp", "clamp"])
@pytest.mark.parametrize("act", Y_ACTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_y_form_equals_the_x_form(backend, act, clamp):
    """float64: dx and db from y equal the x form's (exactly for the piecewise-linear activations, whose
    derivative y / gain keeps; to a few ulps for the smooth ones), per-channel and full-shape b."""
    key = B.resolve({"act": act}, {}, "t").key
    skip_unless_sampled(backend, key, list(BIAS_ACT_KEYS))
    if not supports(backend, key, "backward_y", "float64"):
        pytest.skip(f"{backend} has no {key} backward_y kernel (the registry falls through)")
    rng = np.random.default_rng(11)
    x, dy = rng.standard_normal((3, 4, 5)) * 2, rng.standard_normal((3, 4, 5))
    kw = {"gain": _y_gain(act), "clamp": clamp, "backend": backend}
    for b in (rng.standard_normal(4), rng.standard_normal((3, 4, 5))):
        y = ma.bias_act(x, b, act, **kw)
        dx, db = ma.bias_act_grad(dy, x, b, act, **kw)
        dxy, dby = ma.bias_act_grad(dy, None, b, act, y=y, **kw)
        if OPS.get(act) is None or OPS[act].defn.y_form == "same":
            np.testing.assert_array_equal(dxy, dx)
            np.testing.assert_array_equal(dby, db)
        else:
            np.testing.assert_allclose(dxy, dx, rtol=1e-13, atol=1e-15)
            np.testing.assert_allclose(dby, db, rtol=1e-12, atol=1e-14)
        if clamp is not None:
            hit = np.abs(y) >= clamp
            assert hit.any() and not dxy[hit].any()  # clamped elements: zero gradient


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_y_form_in_narrow_dtypes_and_its_clamp_rounding(dtype):
    """clamp = 0.1 is no float16 value: the clipped y holds float16(0.1), and the y form still zeroes it."""
    rng = np.random.default_rng(12)
    x, dy = rng.standard_normal((2, 3, 8)).astype(dtype), rng.standard_normal((2, 3, 8)).astype(dtype)
    b = rng.standard_normal(3).astype(dtype)
    y = ma.bias_act(x, b, "sigmoid", clamp=0.1)
    dx, db = ma.bias_act_grad(dy, None, b, "sigmoid", clamp=0.1, y=y)
    dxx, _ = ma.bias_act_grad(dy, x, b, "sigmoid", clamp=0.1)
    assert dx.dtype == db.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(dx == 0, dxx == 0)
    assert (dx == 0).any()


def _y_case(x, o, kw, b=None):
    y = ma.bias_act(x, b, **kw)
    return ma.bias_act_grad(x, None, b, y=y, out=o, **kw)


Y_BAD = [
    ("an activation without a y form", {"act": "gelu"}, ma.YFormError,
     r"bias_act_grad\(\): y= is not supported with act='gelu'.*linear, relu"),
    ("its y condition not holding", {"act": "leaky_relu", "negative_slope": -0.3}, ma.YFormError,
     r"bias_act_grad\(\): y= with act='leaky_relu' is only supported when negative_slope > 0"),
    ("gain 0", {"act": "relu", "gain": 0.0}, ma.YFormError,
     r"bias_act_grad\(\): y= needs a finite nonzero gain.*'gain'"),
    ("relu6 with gain sqrt(2)", {"act": "relu6", "gain": math.sqrt(2)}, ma.YFormError,
     r"bias_act_grad\(\): y= with act='relu6' needs parameter 'gain' to be a power of two"),
]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("what,kw,exc,match", Y_BAD, ids=[b[0] for b in Y_BAD])
def test_y_form_refused_where_it_cannot_hold(what, kw, exc, match, warm):
    x = np.random.default_rng(13).standard_normal((3, 5)).astype(np.float32)
    out = np.full((3, 5), 7.0, np.float32)
    if warm:
        _y_case(x, np.empty_like(out), {"act": "relu"})
        ma.bias_act_grad(x, x, **kw)  # the x form of the very call runs
    with pytest.raises(exc, match=match):
        _y_case(x, out, kw)
    assert np.all(out == 7.0)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_y_form_argument_errors(warm):
    x = np.random.default_rng(14).standard_normal((3, 5)).astype(np.float32)
    b, s = np.ones(5, np.float32), np.ones(5, np.float32)
    out = (np.full((3, 5), 7.0, np.float32), np.full(5, 7.0, np.float32), np.full(5, 7.0, np.float32))
    if warm:
        ma.bias_act_grad(x, None, b, "relu", y=x)
    with pytest.raises(ma.YFormError, match=r"bias_act_grad\(\): y= with scale= is not supported.*needs the input x"):
        ma.bias_act_grad(x, None, b, "relu", scale=s, y=x, out=out)
    with pytest.raises(ma.YFormError, match=r"act='hardtanh' on float16 needs parameter 'max_val' to be a float16"):
        ma.bias_act_grad(x.astype(np.float16), None, act="hardtanh", max_val=0.1, y=x.astype(np.float16))
    with pytest.raises(ValueError, match=r"bias_act_grad\(\): pass the input x or the forward's output y=, not both"):
        ma.bias_act_grad(x, x, b, "relu", y=x, out=out[:2])
    with pytest.raises(TypeError, match=r"bias_act_grad\(\) needs the input x \(or"):
        ma.bias_act_grad(x, None, b, "relu")
    with pytest.raises(TypeError, match=r"bias_act_grad\(\): y has dtype|b has dtype"):
        ma.bias_act_grad(x, None, b.astype(np.float64), "relu", y=x)
    assert all(np.all(o == 7.0) for o in out)
