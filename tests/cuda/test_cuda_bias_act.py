"""ma.bias_act / bias_act_grad on the cuda backend (issue 16): the shared suite (forward, dx, db, dscale and the
y= form against the float64 composition) on a sample of its cases, layouts the kernels see as 5-D strided
views (strided, transposed, negative strides, more than two dims each side of dim), in place and out tuples,
and the device-side contract.  Under the simulator every GPU thread runs in Python: tiny arrays, a sample of
activations (every form of the suite, the heaviest formulas, each y-form kind); on a GPU
(MULTIACT_CUDA_REAL=1) the same tests run per array library."""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_backend import Kind, _kinds

import multiact as ma
from multiact import consistency as C
from multiact import registry

OK, WHY = registry.availability("cuda")
pytestmark = pytest.mark.skipif(not OK, reason=f"cuda: {WHY}")

# every form of the suite once (dims 1, -1, 0; per-channel and full-shape b and scale; gain; clamp hit, 0)
# with an activation each, then heavy formulas and the y-form kinds (same / own / linear) on other forms
_ALL = C.bias_act_cases()
_FORMS = _ALL[-3 * len(C._BIAS_FORMS):]  # the forms x (leaky_relu, gelu, sigmoid), in that order
SAMPLE = [_FORMS[3 * i + i % 3] for i in range(len(C._BIAS_FORMS))]
_FIRST = {}
for _c in _ALL[:-3 * len(C._BIAS_FORMS)]:
    _FIRST.setdefault(_c["act"], _c)
SAMPLE += [_FIRST[a] for a in ("linear", "relu6", "tanh", "softplus", "mish", "elu", "swish") if a in _FIRST]


@pytest.fixture(params=_kinds(), scope="module")
def kind(request) -> Kind:
    return Kind(request.param)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("params", [pytest.param(p, id=C.case_id(p)) for p in SAMPLE])
def test_suite_sample(kind, params, dtype):
    if dtype != "float32" and SAMPLE.index(params) % 3:  # every case in float32, a third in the others
        pytest.skip("sampled: float16 / float64 run for every third case")
    failures = C.bias_act_failures("cuda", params, dtype, to_kind=kind.to, from_kind=kind.host)
    assert not failures, "\n".join(failures)


def _flip(kind, a, axis: int):
    """a reversed along axis: a negative-stride view (torch tensors have none: a flipped copy there)."""
    if kind.name == "torch":
        return a.flip(axis)
    return a[(slice(None),) * axis + (slice(None, None, -1),)]


def _host_ref(fn, *arrays, **kw):
    out = fn(*[np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a for a in arrays], backend="numpy", **kw)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("dtype", ["float32"])
def test_layouts_in_place_and_out(kind, dtype):
    """Strided and transposed x, b with a negative stride, 6-D x (launches over the dims beyond two a side),
    NHWC-like dim=-1: equal to the numpy backend on contiguous copies, in place and into out tuples."""
    rng = np.random.default_rng(21)
    six = (rng.standard_normal((2, 3, 2, 5, 2, 3)) * 2).astype(dtype)
    base = (rng.standard_normal((6, 10)) * 2).astype(dtype)
    cases = [("strided", base[:, ::2], 1), ("transposed", base.T, 1), ("6-d dim 3", six, 3), ("6-d dim -1", six, -1),
             ("6-d dim 0", six[:, :, ::-1], 0)]
    for name, xh, dim in cases:
        x = kind.to(base)[:, ::2] if name == "strided" else kind.to(base).T if name == "transposed" else \
            kind.to(six) if name != "6-d dim 0" else _flip(kind, kind.to(six), 2)
        c = xh.shape[dim]
        bh = rng.standard_normal(2 * c).astype(dtype)[::-2]
        sh = rng.standard_normal(c).astype(dtype)
        b = _flip(kind, kind.to(bh[::-1].copy()), 0)  # a negative stride on the device too
        s = kind.to(sh)
        dyh = rng.standard_normal(xh.shape).astype(dtype)
        kw = {"dim": dim, "gain": 1.5, "clamp": 2.0}
        (want,) = _host_ref(ma.bias_act, xh, bh, "silu", scale=sh, **kw)
        np.testing.assert_allclose(kind.host(ma.bias_act(x, b, "silu", scale=s, **kw)), want, rtol=2e-6, atol=1e-6,
                                   err_msg=name)
        gwant = _host_ref(ma.bias_act_grad, dyh, xh, bh, "silu", scale=sh, **kw)
        got = ma.bias_act_grad(kind.to(dyh), x, b, "silu", scale=s, **kw)
        for g, w, what in zip(got, gwant, ("dx", "db", "dscale"), strict=True):
            np.testing.assert_allclose(kind.host(g), w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {what}")
        # in place on dy, into an out tuple
        dy = kind.to(dyh)
        db, ds = kind.to(np.full(c, 7.0, dtype)), kind.to(np.full(c, 7.0, dtype))
        res = ma.bias_act_grad(dy, x, b, "silu", scale=s, out=(dy, db, ds), **kw)
        assert res[0] is dy and res[1] is db and res[2] is ds
        for g, w in zip((dy, db, ds), gwant, strict=True):
            np.testing.assert_allclose(kind.host(g), w, rtol=2e-5, atol=2e-5, err_msg=f"{name} out=")
        xi = kind.to(np.ascontiguousarray(xh))
        assert ma.bias_act(xi, b, "silu", scale=s, out=xi, **kw) is xi
        np.testing.assert_allclose(kind.host(xi), want, rtol=2e-6, atol=1e-6, err_msg=f"{name} in place")


def test_rows_layout_where_channels_are_innermost(kind, monkeypatch):
    """dim=-1 of a C-contiguous x (the transformer's (T, hidden)), reversed channels and (N, C) with dim=1 run
    the "rows" kernels (a warp on consecutive channels of a row; more channels than a block: tiles, several row
    chunks, more blocks than the grid; narrow C: row groups reduced in shared memory); NCHW keeps the strided
    ones, and so does a transposed (N, C) into a transposed out (the layout follows the output: a transposed x
    into a new, C-contiguous dx runs rows).  Each equal to the numpy backend, db / dscale the same bits run to
    run."""
    cb = registry.module("cuda")
    seen = []
    jit = cb._bias_jit
    monkeypatch.setattr(cb, "_bias_jit", lambda *a: seen.append(a[3]) or jit(*a))
    rng = np.random.default_rng(24)
    wide = cb._bias_block() + 8  # two channel tiles
    r = lambda *shape: (rng.standard_normal(shape) * 2).astype(np.float32)  # noqa: E731
    cases = [("(T, C) dim -1", r(17, wide), -1, "rows"), ("reversed channels", r(3, wide)[:, ::-1], -1, "rows"),
             ("(N, C) dim 1", r(130, 3), 1, "rows"), ("NCHW", r(2, 3, 4, 2), 1, "strided"),
             ("transposed", r(5, 4).T, 1, "strided")]
    for name, xh, dim, fwd in cases:
        c = xh.shape[dim]
        bh, sh, dyh = r(c), r(c), r(*xh.shape)
        x = _flip(kind, kind.to(np.ascontiguousarray(xh[:, ::-1])), 1) if name == "reversed channels" else \
            kind.to(np.ascontiguousarray(xh.T)).T if name == "transposed" else kind.to(xh)
        kw = {"dim": dim, "gain": 1.5, "clamp": 2.5}
        out = kind.to(np.zeros(xh.shape[::-1], np.float32)).T if name == "transposed" else None
        seen.clear()
        got = kind.host(ma.bias_act(x, kind.to(bh), "gelu", scale=kind.to(sh), out=out, **kw))
        np.testing.assert_allclose(got, _host_ref(ma.bias_act, xh, bh, "gelu", scale=sh, **kw)[0], rtol=2e-6,
                                   atol=1e-6, err_msg=name)
        assert seen == [fwd], (name, seen)
        runs = [ma.bias_act_grad(kind.to(dyh), x, kind.to(bh), "gelu", scale=kind.to(sh), **kw) for _ in range(2)]
        assert set(seen[1:]) == {"strided" if name == "NCHW" else "rows"}, (name, seen)
        for g, w, what in zip(runs[0], _host_ref(ma.bias_act_grad, dyh, xh, bh, "gelu", scale=sh, **kw),
                              ("dx", "db", "dscale"), strict=True):
            np.testing.assert_allclose(kind.host(g), w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {what}")
        for a, b in zip(*runs, strict=True):
            np.testing.assert_array_equal(kind.host(a), kind.host(b), err_msg=f"{name}: not deterministic")


def test_full_shape_sides_no_sides_and_empty(kind):
    rng = np.random.default_rng(22)
    xh, bh, dyh = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    dx, db = ma.bias_act_grad(kind.to(dyh), kind.to(xh), kind.to(bh), "tanh")
    wdx, wdb = _host_ref(ma.bias_act_grad, dyh, xh, bh, "tanh")
    np.testing.assert_allclose(kind.host(dx), wdx, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(kind.host(db), wdb, rtol=1e-6, atol=1e-7)
    only = ma.bias_act_grad(kind.to(dyh), kind.to(xh), act="tanh")  # neither b nor scale: dx alone
    np.testing.assert_allclose(kind.host(only), _host_ref(ma.bias_act_grad, dyh, xh, None, "tanh")[0], rtol=1e-6)
    e = np.zeros((0, 3), np.float32)
    dx, db = ma.bias_act_grad(kind.to(e), kind.to(e), kind.to(np.ones(3, np.float32)), "relu")
    assert tuple(dx.shape) == (0, 3)
    np.testing.assert_array_equal(kind.host(db), np.zeros(3, np.float32))  # a sum over nothing


def test_y_form_on_the_device(kind):
    rng = np.random.default_rng(23)
    xh, dyh = (rng.standard_normal((2, 3, 5)).astype(np.float32) for _ in range(2))
    bh = rng.standard_normal(3).astype(np.float32)
    kw = {"gain": 2 ** 0.5, "clamp": 1.0, "negative_slope": 0.2}
    y = ma.bias_act(kind.to(xh), kind.to(bh), "leaky_relu", **kw)
    dx, db = ma.bias_act_grad(kind.to(dyh), None, kind.to(bh), "leaky_relu", y=y, **kw)
    wdx, wdb = _host_ref(ma.bias_act_grad, dyh, xh, bh, "leaky_relu", **kw)
    np.testing.assert_array_equal(kind.host(dx), wdx)
    np.testing.assert_allclose(kind.host(db), wdb, rtol=1e-6)
    with pytest.raises(ma.YFormError, match=r"bias_act_grad\(\): y= is not supported with act='gelu'"):
        ma.bias_act_grad(kind.to(dyh), None, kind.to(bh), "gelu", y=y)
    with pytest.raises(ma.YFormError, match=r"y= with scale= is not supported"):
        ma.bias_act_grad(kind.to(dyh), None, kind.to(bh), "relu", scale=kind.to(bh), y=y)


def test_device_contract(kind):
    x = kind.to(np.ones((3, 5), np.float32))
    out = kind.to(np.full((3, 5), 7.0, np.float32))
    bad = [
        (lambda: ma.bias_act(x, kind.to(np.ones(4, np.float32)), out=out), ValueError,
         r"bias_act\(\): b has shape \(4,\); expected \(5,\)"),
        (lambda: ma.bias_act(x, kind.to(np.ones(5)), out=out), TypeError, r"bias_act\(\): b has dtype float64"),
        (lambda: ma.bias_act(x, np.ones(5, np.float32), out=out), TypeError,
         r"bias_act\(\): arrays must come from one"),
        (lambda: ma.bias_act(x, kind.to(np.ones(5, np.float32)), dim=2, out=out), ValueError, r"dim 2 is out of range"),
        (lambda: ma.bias_act(x, out=kind.to(np.ones((3, 4), np.float32))), ValueError, r"bias_act\(\): out has shape"),
        (lambda: ma.bias_act_grad(x, x, kind.to(np.ones(5, np.float32)), out=out), TypeError,
         r"out must be a tuple \(dx, db\)"),
    ]
    for _ in range(2):  # cold and warm
        for call, exc, match in bad:
            with pytest.raises(exc, match=match):
                call()
    np.testing.assert_array_equal(kind.host(out), np.full((3, 5), 7.0, np.float32))
