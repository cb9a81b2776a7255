"""The gated family (glu, swiglu, geglu, reglu): the shared suite on every host backend, each convention
against its anchor's formula, and the contract's errors cold and warm with nothing written."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import host_backends, skip_unless_sampled, supports

import multiact as ma
from multiact import consistency as C
from multiact import gated
from multiact._opdefs import COMPOSITE_DEFINITIONS
from multiact.optable import FAMILY_KEYS, FLOAT_DTYPES

BACKENDS = host_backends()
CASES = [pytest.param(op, p, id=f"{op}[{C.case_id(p)}]") for op, p in C.gated_cases()]


def _key(op: str, params: dict) -> str:
    cdef = COMPOSITE_DEFINITIONS[op]
    own = {k: v for k, v in params.items() if k in cdef.param_names}
    extra = {k: v for k, v in params.items() if k not in cdef.param_names and k != "up"}
    return gated.resolve(cdef, own, extra, f"{op}()").key


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,params", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_the_composed_reference(backend, op, params, dtype):
    key = _key(op, params)
    skip_unless_sampled(backend, key, list(FAMILY_KEYS))
    for direction in ("forward", "backward"):
        if not supports(backend, key, direction, dtype):
            pytest.skip(f"{backend} has no {key} {direction} kernel for {dtype}")
    failures = C.gated_failures(backend, op, params, dtype)
    assert not failures, "\n".join(failures)


def test_the_suite_catches_a_wrong_kernel(monkeypatch):
    """A kernel that forgets the clipped form's shift, or swaps the halves, fails the suite."""
    from multiact.backend import numpy_backend

    real = numpy_backend._gated

    def no_shift(key, direction):
        k = real(key, direction)
        return lambda *a: k(*a[:-1], {**a[-1], "shift": 0.0})

    monkeypatch.setattr(numpy_backend, "_gated", no_shift)
    from multiact import registry

    registry.clear_cache()
    try:
        assert C.gated_failures("numpy", "swiglu", {"alpha": 1.702, "limit": 7.0}, "float32")

        def swapped(key, direction):
            k = real(key, direction)
            if direction == "forward":
                return lambda g, u, o, p: k(u, g, o, p)
            return lambda dy, g, u, dg, du, p: k(dy, u, g, du, dg, p)

        monkeypatch.setattr(numpy_backend, "_gated", swapped)
        registry.clear_cache()
        assert C.gated_failures("numpy", "swiglu", {}, "float64")
    finally:
        monkeypatch.setattr(numpy_backend, "_gated", real)
        registry.clear_cache()


# ---- each convention against its anchor's formula (float64, NumPy written out) ----------------------


def _silu(a):
    return a / (1 + np.exp(-a))


def _sigmoid(a):
    return 1 / (1 + np.exp(-a))


@pytest.fixture
def x():
    return np.random.default_rng(3).standard_normal((4, 6, 10))


def test_glu_is_torch_glu(x):
    """F.glu(x, dim): a * sigmoid(b), the second half gated."""
    a, b = x[..., :5], x[..., 5:]
    np.testing.assert_allclose(ma.glu(x), a * _sigmoid(b), rtol=1e-14)
    a, b = x[:2], x[2:]
    np.testing.assert_allclose(ma.glu(x, 0), a * _sigmoid(b), rtol=1e-14)


def test_swiglu_is_vllm_silu_and_mul(x):
    d = x.shape[-1] // 2
    np.testing.assert_allclose(ma.swiglu(x), _silu(x[..., :d]) * x[..., d:], rtol=1e-14)


def test_two_input_form_is_liger(x):
    a, b = x, x[::-1].copy()
    np.testing.assert_allclose(ma.swiglu(a, up=b), _silu(a) * b, rtol=1e-14)
    dy = np.ones_like(a)
    da, db = ma.swiglu_grad(dy, a, up=b)
    s = _sigmoid(a)
    np.testing.assert_allclose(da, b * s * (1 + a * (1 - s)), rtol=1e-13)
    np.testing.assert_allclose(db, _silu(a), rtol=1e-14)
    # activate="second": x multiplies act(up), and the gradients still come in the order (x, up)
    dx, dup = ma.glu_grad(dy, a, up=b)
    np.testing.assert_allclose(dx, _sigmoid(b), rtol=1e-14)
    np.testing.assert_allclose(dup, a * _sigmoid(b) * (1 - _sigmoid(b)), rtol=1e-13)


def _gpt_oss(x, alpha, limit):
    """GPT-OSS's swiglu: interleaved, gate clamped above, up clamped both ways, plus one."""
    g, u = x[..., ::2], x[..., 1::2]
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return g * _sigmoid(alpha * g) * (u + 1)


def test_clipped_form_is_gpt_oss():
    x = np.random.default_rng(4).standard_normal((8, 16)) * 6  # both limits hit
    y = ma.swiglu(x, layout="interleaved", alpha=1.702, limit=7.0)
    np.testing.assert_allclose(y, _gpt_oss(x, 1.702, 7.0), rtol=1e-13)
    dx = ma.swiglu_grad(np.ones_like(y), x, layout="interleaved", alpha=1.702, limit=7.0)
    h = 1e-6  # central differences, away from the clamps' edges
    for i, j in [(0, 0), (0, 1), (3, 5), (7, 14), (7, 15)]:
        e = np.zeros_like(x)
        e[i, j] = h
        fd = (_gpt_oss(x + e, 1.702, 7.0) - _gpt_oss(x - e, 1.702, 7.0)).sum() / (2 * h)
        assert math.isclose(dx[i, j], fd, rel_tol=1e-6, abs_tol=1e-8), (i, j, dx[i, j], fd)
    assert (dx[:, ::2][x[:, ::2] > 7] == 0).all() and (dx[:, 1::2][np.abs(x[:, 1::2]) > 7] == 0).all()


def test_geglu_and_reglu(x):
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    np.testing.assert_allclose(ma.geglu(x), ma.gelu(a) * b, rtol=1e-15)
    np.testing.assert_allclose(ma.geglu(x, approximate="tanh"), ma.gelu(a, approximate="tanh") * b, rtol=1e-15)
    np.testing.assert_array_equal(ma.reglu(x), np.maximum(a, 0) * b)


def test_glu_takes_any_activation_with_its_parameters(x):
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    np.testing.assert_allclose(ma.glu(x, act="softplus", activate="first", beta=2.0),
                               ma.softplus(a, 2.0) * b, rtol=1e-15)


def test_backward_writes_both_halves_in_place(x):
    """out=x: dx replaces x (the Liger pattern, opt-in); the same values as a fresh dx."""
    dy = np.random.default_rng(5).standard_normal(x[..., :5].shape)
    want = ma.geglu_grad(dy, x)
    xc = x.copy()
    got = ma.geglu_grad(dy, xc, out=xc)
    assert got is xc
    np.testing.assert_array_equal(xc, want)


def test_float16_is_computed_in_float32_and_rounded_once():
    x = np.random.default_rng(6).standard_normal((64, 32)).astype(np.float16)
    y32 = ma.swiglu(x.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(ma.swiglu(x, backend="numpy"), y32)


def test_torch_cpu_tensors_in_tensors_out():
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 8, dtype=torch.float64)
    y = ma.swiglu(t)
    assert isinstance(y, torch.Tensor) and y.shape == (3, 4)
    torch.testing.assert_close(y, torch.nn.functional.silu(t[:, :4]) * t[:, 4:], rtol=1e-14, atol=0)


# ---- the contract: clear errors naming the argument and the function, cold and warm, nothing written --


BAD = [
    ("odd size along dim", lambda x, o: ma.swiglu(x[:, :7], out=o[:, :3]), ValueError,
     r"swiglu\(\): x.shape\[1\] = 7 must be even"),
    ("dim out of range", lambda x, o: ma.swiglu(x, 2, out=o), ValueError, r"swiglu\(\): dim 2 is out of range"),
    ("unknown act", lambda x, o: ma.glu(x, act="gelux", out=o), ValueError,
     r"glu\(\): parameter 'act' must be an activation.*valid: relu"),
    ("prelu as act", lambda x, o: ma.glu(x, act="prelu", out=o), ValueError, r"glu\(\): parameter 'act'"),
    ("act given as non-str", lambda x, o: ma.glu(x, act=3, out=o), TypeError,
     r"glu\(\): parameter 'act' must be a str"),
    ("another activation's parameter", lambda x, o: ma.glu(x, act="relu", beta=1.0, out=o), TypeError,
     r"glu\(\): unexpected keyword argument 'beta'; relu's parameters: none"),
    ("act parameter out of range", lambda x, o: ma.glu(x, act="softplus", beta=-1.0, out=o), ValueError,
     r"glu\(\): parameter 'beta'"),
    ("limit <= 0", lambda x, o: ma.swiglu(x, limit=0.0, out=o), ValueError, r"swiglu\(\): parameter 'limit'"),
    ("limit NaN", lambda x, o: ma.swiglu(x, limit=float("nan"), out=o), ValueError,
     r"swiglu\(\): parameter 'limit' must be finite"),
    ("limit beyond float32", lambda x, o: ma.swiglu(x, limit=1e300, out=o), ValueError,
     r"swiglu\(\): parameter 'limit'.*float32"),
    ("bad activate", lambda x, o: ma.swiglu(x, activate="left", out=o), ValueError,
     r"swiglu\(\): parameter 'activate'"),
    ("bad layout", lambda x, o: ma.swiglu(x, layout="strided", out=o), ValueError, r"swiglu\(\): parameter 'layout'"),
    ("up of another shape", lambda x, o: ma.swiglu(x, up=x[:, :4], out=o), ValueError, r"swiglu\(\): up has shape"),
    ("up of another dtype", lambda x, o: ma.swiglu(x, up=x.astype(np.float64), out=o), TypeError,
     r"swiglu\(\): up has dtype"),
    ("up with a layout", lambda x, o: ma.swiglu(x, up=x, layout="interleaved", out=o), ValueError,
     r"swiglu\(\): with up="),
    ("out of the input's shape", lambda x, o: ma.swiglu(x, out=np.empty_like(x)), ValueError,
     r"swiglu\(\): out has shape"),
    ("out of another dtype", lambda x, o: ma.swiglu(x, out=o.astype(np.float64)), TypeError,
     r"swiglu\(\): out has dtype"),
    ("out overlapping x", lambda x, o: ma.swiglu(x, out=x[:, 2:6]), ValueError, r"swiglu\(\): out overlaps x"),
    ("integer x", lambda x, o: ma.swiglu(x.astype(np.int32), out=o), TypeError, r"swiglu\(\): x"),
    ("None x", lambda x, o: ma.swiglu(None, out=o), TypeError, r"swiglu\(\): x"),
    ("backend not a name", lambda x, o: ma.swiglu(x, out=o, backend=["numpy"]), TypeError,
     r"swiglu\(\): backend must be"),
    ("grad: dy of the input's shape", lambda x, o: ma.swiglu_grad(x, x, out=np.empty_like(x)), ValueError,
     r"swiglu_grad\(\): dy has shape"),
    ("grad: out pair not a pair", lambda x, o: ma.swiglu_grad(x, x, up=x, out=np.empty_like(x)), TypeError,
     r"swiglu_grad\(\): with up= out must be a pair"),
    ("grad: read-only out", lambda x, o: ma.swiglu_grad(o, x, out=_readonly(x)), ValueError,
     r"swiglu_grad\(\): out is read-only"),
]


def _readonly(a):
    a = np.empty_like(a)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("what,call,exc,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_anything_is_written(what, call, exc, match, warm):
    x = np.random.default_rng(8).standard_normal((5, 8)).astype(np.float32)
    out = np.full((5, 4), 7.0, np.float32)
    if warm:  # the same call shapes, valid, first
        ma.swiglu(x, out=np.empty_like(out))
        ma.swiglu_grad(out.copy(), x)
        ma.glu(x, act="softplus", beta=2.0)
    x0 = x.copy()
    with pytest.raises(exc, match=match):
        call(x, out)
    assert np.all(out == 7.0) and np.array_equal(x, x0)


def test_unknown_keyword_of_a_named_form_is_python_s_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):
        ma.swiglu(np.ones((2, 4)), beta=1.0)


def test_masked_arrays_are_refused_by_name():
    x = np.ma.masked_array(np.ones((2, 4)), mask=[[0, 1, 0, 0]] * 2)
    with pytest.raises(TypeError, match=r"swiglu\(\): masked arrays"):
        ma.swiglu(x)


def test_docstrings_come_from_the_definitions():
    for name, cdef in COMPOSITE_DEFINITIONS.items():
        f = getattr(ma, name)
        assert cdef.summary in f.__doc__ and all(p.name in f.__doc__ for p in cdef.params)
        assert name in ma.__all__ and f"{name}_grad" in ma.__all__
