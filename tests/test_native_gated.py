"""The native gated kernels (gated:<act>, issue 17): every activation x direction x dtype against the
float64 reference composed from the table (multiact.gated.reference_forward / reference_backward),
on every layout the dispatcher hands over (halves along the last dim, along dim 0 and 1 of a 3-D
array, interleaved, the two-input form), clipped (limit 7, shift 1), in place, odd sizes, threads.
Also: with up = 1 a gated kernel gives its activation's own kernel bits (the bodies are shared).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact import gated as G
from multiact import registry
from multiact._opdefs import COMPOSITE_DEFINITIONS, GATED
from multiact.optable import FAMILY_KEYS, in_float32

native = pytest.importorskip("multiact._native", reason="the native extension is not built")
nb = registry.module("native")
if not nb.available()[0]:
    pytest.skip(f"native backend unavailable: {nb.available()[1]}", allow_module_level=True)

KEYS = list(FAMILY_KEYS)
DTYPES = ("float32", "float16")
GLU = COMPOSITE_DEFINITIONS["glu"]
CLIP = {"limit": 7.0, "shift": 1.0}


def _act(key):
    _, spec, act_key = FAMILY_KEYS[key]
    return spec, act_key


def _case(key) -> dict:
    """The first suite case of the activation that selects this kernel key (raw, as a user passes it)."""
    spec, act_key = _act(key)
    return dict(C.key_cases(spec, act_key)[0])


def _call_params(key, case=None, clip=False):
    """The kernel's parameters as the dispatcher builds them (glu with this act and case)."""
    spec, _ = _act(key)
    case = _case(key) if case is None else case
    kp = G.resolve(GLU, {"act": spec.name, "activate": "first"}, case, "glu()").kp
    return {**kp, **CLIP} if clip else kp


# ---- inputs -----------------------------------------------------------------------------------------------


def _pools(key, dtype, seed=0):
    """Gate values (the activation's sample: normal, sweep, kinks, specials), up values (normal, specials,
    huge), and values around the clip limit for both."""
    spec, _ = _act(key)
    dt = np.dtype(dtype)
    p = spec.validate(_case(key))
    rng = np.random.default_rng(seed)
    near = np.array([7.0, -7.0, 6.99, 7.01, -7.01, 8.0, -8.0, 1e4, -1e4], np.float64)
    with np.errstate(over="ignore"):
        gate = np.concatenate([C.sample_x(spec, p, dt, n=300, seed=seed), near.astype(dt)])
        up = np.concatenate([(rng.standard_normal(300) * 3).astype(dt), C.specials(dt), near.astype(dt),
                             np.array([1e30, -1e30, 3e38, -3e38], np.float64).astype(dt)])
    return rng.permutation(gate), rng.permutation(up)


def _fill(shape, dim, layout, key, dtype, seed=0) -> np.ndarray:
    """x of `shape` whose gate view (first along dim) holds the gate pool and whose up view the up pool."""
    gp, up = _pools(key, dtype, seed)
    x = np.empty(shape, dtype)
    g, u = G.split(x, dim % x.ndim, layout)
    g[...] = np.resize(gp, g.shape)
    u[...] = np.resize(up, u.shape)
    return x


def _dy(shape, up, dtype, seed=1):
    """|dy| <= 6, and <= 1 where |up| is huge: dy * up must not overflow float32 (the kernels compute
    act'(g) * (dy * u) in float32, the reference in float64)."""
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal(shape) * 2
    dy = np.where(np.abs(up.astype(np.float64)) > 1e4, np.clip(dy, -1, 1), dy)
    return dy.astype(dtype)


# ---- the tolerance: the activation's bound (multiact.consistency.compare) carried through the product -------


def _act_bound(spec, direction, kp, dtype, x, r, scale):
    """The activation's own bound at x (float64), for its float64 result r, scale |x| or |dy|."""
    tol = spec.tol
    eps = float(np.finfo(dtype).eps)
    p = in_float32({k: kp[k] for k in spec.param_names})
    with np.errstate(all="ignore"):
        spacing = np.spacing(np.abs(r.astype(dtype))).astype(np.float64)
        atol = tol.fwd_atol if direction == "forward" else tol.bwd_atol
        sc = np.abs(scale)
        sc = np.where(np.isfinite(sc), sc, 0.0)
        b = tol.ulp(np.dtype(dtype).name) * spacing + atol * eps * sc
        if tol.cond is not None:
            cond = tol.cond(x, p)
            b = b + np.where(np.isfinite(cond), cond, 0.0) * eps * np.abs(r)
        b = np.where(np.isfinite(b), b, 0.0)
    # results below the smallest normal (of float32, where everything is computed) may lose their bits
    return np.where(np.abs(r) < float(np.finfo(np.float32).tiny) * 2, np.maximum(b, float(np.finfo(dtype).tiny)), b)


def _judge(got, ref, bound, what):
    dtype = got.dtype
    g = got.astype(np.float64).reshape(-1)
    r = np.asarray(ref, np.float64).reshape(-1)
    bound = np.broadcast_to(bound, np.shape(ref)).reshape(-1)
    with np.errstate(all="ignore"):
        r_round = r.astype(dtype).astype(np.float64)
        spacing = np.spacing(np.abs(r_round.astype(dtype))).astype(np.float64)
        tiny = float(np.finfo(dtype).tiny)
        bound = np.maximum(bound + spacing, np.where(np.abs(r) < tiny, tiny, 0.0))  # + 1 ulp: the product
        nan_ok = np.isnan(g) == np.isnan(r)
        inf_ref = np.isinf(r_round)
        inf_ok = np.where(inf_ref, g == r_round, ~np.isinf(g) | (g == r))
        finite = ~np.isnan(r) & ~inf_ref
        val_ok = np.where(finite, np.abs(g - r) <= bound, True)
    bad = np.flatnonzero(~(nan_ok & inf_ok & val_ok))
    assert bad.size == 0, f"{what}: {bad.size} bad, e.g. " + ", ".join(
        f"[{i}] got {g[i]!r} want {r[i]!r} (bound {bound[i]:.3g})" for i in bad[:6])


def _clipped(gate, up, kp):
    g = gate.astype(np.float64)
    u = up.astype(np.float64)
    if kp["limit"] == math.inf:
        return g, u
    lim = kp["limit"]
    return np.where(g > lim, lim, g), np.where(u > lim, lim, np.where(u < -lim, -lim, u)) + kp["shift"]


def _act_overflow(ract, ref, factor, got):
    """Where act(g) itself overflows float32 (selu's scale at 3e38), the kernels' float32 act(g) is inf:
    the product with a small factor is then inf (or NaN at 0), as float32 arithmetic has it; where it
    underflows (gelu at -16.7: 1e-61), times an infinite factor, NaN (0 * inf) is what float32 gives."""
    with np.errstate(all="ignore"):
        r32 = ract.astype(np.float32).astype(np.float64)
        ref = np.where(np.isinf(r32) & np.isfinite(ract), r32 * factor, ref)
        under = (np.abs(ract) < 2.0**-148) & (ract != 0) & np.isinf(factor) & np.isnan(got.astype(np.float64))
        return np.where(under, np.nan, ref)


def check_forward(key, kp, gate, up, y, what):
    spec, _ = _act(key)
    kp32 = in_float32(kp)
    ref = G.reference_forward(spec, kp32, gate, up)
    g, u = _clipped(gate, up, kp32)
    p = {k: kp32[k] for k in spec.param_names}
    with np.errstate(all="ignore"):
        ract = np.asarray(spec.forward(g, **p), np.float64)
        bound = _act_bound(spec, "forward", kp32, y.dtype, g, ract, g) * np.abs(u)
    ref = _act_overflow(ract, ref, u, y)
    _judge(y, ref, bound, f"{key} forward {what}")


def check_backward(key, kp, dy, gate, up, dgate, dup, what):
    spec, _ = _act(key)
    kp32 = in_float32(kp)
    rg, ru = G.reference_backward(spec, kp32, dy, gate, up)
    g, u = _clipped(gate, up, kp32)
    d = dy.astype(np.float64)
    p = {k: kp32[k] for k in spec.param_names}
    with np.errstate(all="ignore"):
        ract = np.asarray(spec.forward(g, **p), np.float64)
        bg = _act_bound(spec, "backward", kp32, dgate.dtype, g, np.asarray(rg, np.float64), d * u)
        bu = _act_bound(spec, "forward", kp32, dup.dtype, g, ract, g) * np.abs(d)
    ru = _act_overflow(ract, ru, d, dup)
    ru = np.where(np.abs(up.astype(np.float64)) > kp32["limit"], 0.0, ru)
    with np.errstate(all="ignore"):
        slope = np.asarray(spec.backward(np.ones_like(g), g, **p), np.float64)
    rg = _act_overflow(slope, np.asarray(rg, np.float64), d * u, dgate)  # act'(g) underflows, dy * u inf
    _judge(dgate, rg, bg, f"{key} backward dgate {what}")
    _judge(dup, ru, bu, f"{key} backward dup {what}")


def _glu(x, key, case, **kw):
    spec, _ = _act(key)
    return ma.glu(x, act=spec.name, activate="first", backend="native", **kw, **case)


def _glu_grad(dy, x, key, case, **kw):
    spec, _ = _act(key)
    return ma.glu_grad(dy, x, act=spec.name, activate="first", backend="native", **kw, **case)


# ---- the table ---------------------------------------------------------------------------------------------


def test_every_gated_key_has_native_kernels():
    for key in KEYS:
        spec, act_key = _act(key)
        for dtype in DTYPES:
            for direction in ("forward", "backward"):
                assert nb.supports(key, direction, dtype), (key, direction, dtype)
        assert not nb.supports(key, "forward", "float64")
        assert not nb.supports(key, "backward_y", "float32")
        row = nb._load()["table"][(key, "forward", "float32")]
        assert row[0] == GATED.cname(act_key, "forward")
        assert nb._load()["table"][(key, "backward", "float16")][0] == GATED.cname(act_key, "backward")
    assert not any(k.endswith(":prelu") for k in KEYS) and len(KEYS) == len(FAMILY_KEYS)


# ---- against the reference, every key x dtype, every layout -------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", KEYS)
def test_layouts_match_reference(key, dtype):
    spec, act_key = _act(key)
    cases = C.key_cases(spec, act_key)
    layouts = [((7, 2 * 61), -1, "halves"), ((6, 5, 7), 0, "halves"), ((3, 10, 9), 1, "halves"),
               ((5, 2 * 37), -1, "interleaved"), ((4, 6, 5), 1, "interleaved")]
    for li, (shape, dim, layout) in enumerate(layouts):
        for case in cases if li == 0 else cases[:1]:
            kp = _call_params(key, case)
            x = _fill(shape, dim, layout, key, dtype, seed=li)
            gate, up = G.split(x, dim % x.ndim, layout)
            what = f"{case} {shape} dim={dim} {layout}"
            y = _glu(x, key, case, dim=dim, layout=layout)
            check_forward(key, kp, gate, up, y, what)
            dy = _dy(gate.shape, up, dtype)
            dx = _glu_grad(dy, x, key, case, dim=dim, layout=layout)
            dg, du = G.split(dx, dim % x.ndim, layout)
            check_backward(key, kp, dy, gate, up, dg, du, what)
            # in place: dx written over x, both halves in one pass
            buf = x.copy()
            _glu_grad(dy, buf, key, case, dim=dim, layout=layout, out=buf)
            np.testing.assert_array_equal(buf.view(np.uint16 if dtype == "float16" else np.uint32),
                                          dx.view(np.uint16 if dtype == "float16" else np.uint32), err_msg=what)
    # the two-input form: separate contiguous arrays, odd size
    x = _fill((2, 2 * 501), -1, "halves", key, dtype, seed=9)
    gate, up = x[:, :501].copy(), x[:, 501:].copy()
    case = cases[0]
    kp = _call_params(key, case)
    check_forward(key, kp, gate, up, _glu(gate, key, case, up=up), "two-input")
    dy = _dy(gate.shape, up, dtype)
    dg, du = _glu_grad(dy, gate, key, case, up=up)
    check_backward(key, kp, dy, gate, up, dg, du, "two-input")
    g2, u2 = gate.copy(), up.copy()
    _glu_grad(dy, g2, key, case, up=u2, out=(g2, u2))  # in place: dgate is gate, dup is up
    np.testing.assert_array_equal(g2, dg)
    np.testing.assert_array_equal(u2, du)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", KEYS)
def test_clipped_form_matches_reference(key, dtype):
    """limit 7, shift 1 (GPT-OSS) on every activation, through the kernel directly (the public clipped
    form is swiglu's), interleaved and halves, the clip hit and not."""
    kp = _call_params(key, clip=True)
    fwd, bwd = nb.kernel(key, "forward", dtype), nb.kernel(key, "backward", dtype)
    for layout in ("interleaved", "halves"):
        x = _fill((3, 2 * 45), -1, layout, key, dtype, seed=3)
        gate, up = G.split(x, 1, layout)
        y = np.empty(gate.shape, dtype)
        fwd(gate, up, y, kp)
        check_forward(key, kp, gate, up, y, f"clipped {layout}")
        dy = _dy(gate.shape, up, dtype)
        dx = np.empty_like(x)
        dg, du = G.split(dx, 1, layout)
        bwd(dy, gate, up, dg, du, kp)
        check_backward(key, kp, dy, gate, up, dg, du, f"clipped {layout}")
        assert (dg[gate > 7] == 0).all() and (du[np.abs(up) > 7] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_public_clipped_swiglu(dtype):
    x = _fill((4, 2 * 33), -1, "interleaved", "gated:swish", dtype, seed=5)
    kp = G.resolve(COMPOSITE_DEFINITIONS["swiglu"], {"alpha": 1.702, "limit": 7.0}, {}, "swiglu()").kp
    gate, up = G.split(x, 1, "interleaved")
    y = ma.swiglu(x, alpha=1.702, limit=7.0, layout="interleaved", backend="native")
    check_forward("gated:swish", kp, gate, up, y, "swiglu clipped")
    want = ma.swiglu(x, alpha=1.702, limit=7.0, layout="interleaved", backend="numpy")
    np.testing.assert_allclose(y.astype(np.float64), want.astype(np.float64), rtol=4e-3 if dtype == "float16" else
                               1e-5, atol=1e-6)
    dy = _dy(gate.shape, up, dtype)
    dx = ma.swiglu_grad(dy, x, alpha=1.702, limit=7.0, layout="interleaved", backend="native")
    check_backward("gated:swish", kp, dy, gate, up, *G.split(dx, 1, "interleaved"), "swiglu clipped")


# ---- the activation's own bits ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", KEYS)
def test_up_one_gives_the_activation_kernel(key, dtype):
    """act(g) * 1 and act_grad(dy * 1, g): the activation's own native kernels, bit for bit."""
    spec, act_key = _act(key)
    kp = _call_params(key)
    p = {k: kp[k] for k in kp if k not in ("limit", "shift")}
    gate, _ = _pools(key, dtype)
    gate = np.resize(gate, 2 * 203 + 5)
    ones = np.ones_like(gate)
    dy = _dy(gate.shape, ones, dtype)
    y, ya = np.empty_like(gate), np.empty_like(gate)
    nb.kernel(key, "forward", dtype)(gate, ones, y, kp)
    nb.kernel(act_key, "forward", dtype)(gate, ya, p)
    np.testing.assert_array_equal(y, ya)
    dg, du, da = np.empty_like(gate), np.empty_like(gate), np.empty_like(gate)
    nb.kernel(key, "backward", dtype)(dy, gate, ones, dg, du, kp)
    nb.kernel(act_key, "backward", dtype)(dy, gate, da, p)
    np.testing.assert_array_equal(dg, da)
    if dtype == "float32":  # dup = dy * act(g) rounded once
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(du, dy * ya)


# ---- tails, strides, copies, threads ------------------------------------------------------------------------

SOME = ("gated:silu", "gated:gelu", "gated:leaky_relu", "gated:softplus")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", SOME)
def test_tails_and_layouts_give_the_same_bits(key, dtype):
    """Every row length around the vector width and the unrolled step, contiguous, interleaved and
    strided (a gathered path), gives the bits of one long contiguous run."""
    kp = _call_params(key, clip=key == "gated:silu")
    fwd, bwd = nb.kernel(key, "forward", dtype), nb.kernel(key, "backward", dtype)
    gp, upool = _pools(key, dtype)
    m = 80
    g0, u0 = np.resize(gp, m), np.resize(upool, m)
    d0 = _dy(m, u0, dtype)
    y0, dg0, du0 = np.empty(m, dtype), np.empty(m, dtype), np.empty(m, dtype)
    fwd(g0, u0, y0, kp)
    bwd(d0, g0, u0, dg0, du0, kp)
    for n in (1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 79):
        for layout in ("contig", "interleaved", "swapped", "strided"):
            x = np.zeros((2, 3 * n), dtype)  # two rows
            if layout == "contig":
                g, u = x[:, :n], x[:, n : 2 * n]
            elif layout == "interleaved":
                g, u = x[:, 0 : 2 * n : 2], x[:, 1 : 2 * n : 2]
            elif layout == "swapped":  # up first in each pair (activate="second")
                g, u = x[:, 1 : 2 * n : 2], x[:, 0 : 2 * n : 2]
            else:
                g, u = x[:, 0 : 3 * n : 3], x[:, 2 : 3 * n : 3]
            g[...] = g0[:n]
            u[...] = u0[:n]
            dy = np.broadcast_to(d0[:n], g.shape)  # a zero row stride
            y = np.empty((2, 2 * n), dtype)[:, ::2]
            fwd(g, u, y, kp)
            for row in y:
                np.testing.assert_array_equal(row, y0[:n], err_msg=f"forward n={n} {layout}")
            dx = np.empty_like(x)
            dg, du = (dx[:, :n], dx[:, n : 2 * n]) if layout in ("contig", "strided") else (
                (dx[:, 0 : 2 * n : 2], dx[:, 1 : 2 * n : 2]))
            bwd(dy, g, u, dg, du, kp)
            for a, b in ((dg, dg0), (du, du0)):
                for row in a:
                    np.testing.assert_array_equal(row, b[:n], err_msg=f"backward n={n} {layout}")
            # in place: dgate is gate, dup is up
            bwd(dy, g, u, g, u, kp)
            np.testing.assert_array_equal(g, dg)
            np.testing.assert_array_equal(u, du)


@pytest.mark.parametrize("dtype", DTYPES)
def test_views_without_a_2d_form_and_misaligned_arrays(dtype):
    """A transposed 3-D input (no rows x n form: copied) and arrays off their alignment (copied) give the
    contiguous result."""
    key = "gated:gelu_tanh"
    case = _case(key)
    x = _fill((5, 6, 2 * 7), -1, "halves", key, dtype, seed=2)
    want = _glu(x, key, case)
    xt = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)  # same values, permuted memory
    np.testing.assert_array_equal(_glu(xt, key, case), want)
    dy = _dy(want.shape, x[..., 7:], dtype)
    np.testing.assert_array_equal(_glu_grad(dy, xt, key, case), _glu_grad(dy, x, key, case))
    raw = np.zeros(x.size * x.itemsize + 1, np.uint8)
    mis = raw[1:].view(dtype).reshape(x.shape)
    mis[...] = x
    assert not mis.flags.aligned
    np.testing.assert_array_equal(_glu(mis, key, case), want)
    buf = mis.copy()
    assert buf.flags.aligned
    _glu_grad(dy, mis, key, case, out=mis)
    np.testing.assert_array_equal(mis, _glu_grad(dy, buf, key, case))


@pytest.mark.parametrize("dtype", DTYPES)
def test_threads_give_the_one_thread_bits(dtype):
    """Past the parallel minimum the rows (or one long row, the two-input form) are cut in chunks on the
    pool: the same bits as one thread, in every layout, both directions, in place too."""
    lib = native.lib
    key = "gated:silu"
    case = _case(key)
    old_threads, old_min = ma.get_num_threads(), lib.ma_get_parallel_min()
    x = _fill((38, 2 * 2053), -1, "halves", key, dtype, seed=4)  # 78K outputs x cost 6 > 2^18
    gate, up = x[:, :2053], x[:, 2053:]
    dy = _dy(gate.shape, up, dtype)
    flat_g, flat_u, flat_d = gate.copy().reshape(-1), up.copy().reshape(-1), dy.reshape(-1)
    runs = {}
    try:
        for nt, pmin in ((1, old_min), (2, old_min), (2, 1000), (3, 1000)):
            ma.set_num_threads(nt)
            lib.ma_set_parallel_min(pmin)
            res = []
            for dim, layout in ((-1, "halves"), (-1, "interleaved"), (0, "halves")):
                res.append(_glu(x, key, case, dim=dim, layout=layout))
                res.append(_glu_grad(dy.reshape(res[-1].shape), x, key, case, dim=dim, layout=layout))
            res.append(_glu(flat_g, key, case, up=flat_u))
            res.extend(_glu_grad(flat_d, flat_g, key, case, up=flat_u))
            buf = x.copy()
            _glu_grad(dy, buf, key, case, out=buf)
            res.append(buf)
            runs[(nt, pmin)] = res
    finally:
        ma.set_num_threads(old_threads)
        lib.ma_set_parallel_min(old_min)
    base = runs[(1, old_min)]
    for k, res in runs.items():
        for i, (a, b) in enumerate(zip(res, base, strict=True)):
            np.testing.assert_array_equal(a, b, err_msg=f"{k} result {i}")
    check_forward(key, _call_params(key), gate, up, base[0], "threaded")


def test_required_layouts_reach_c_without_copies():
    """Halves along any dim of a C-contiguous array, interleaved along the last dim (and dim 1), two
    contiguous arrays: one rows x n form addresses all the views (no copy); a transposed input has none."""
    plane = nb._plane
    for shape, dim, layout in (((8, 6), -1, "halves"), ((6, 5, 7), 0, "halves"), ((3, 10, 9), 1, "halves"),
                               ((3, 4, 10), 2, "halves"), ((5, 12), -1, "interleaved"), ((4, 6, 5), 1, "interleaved"),
                               ((2, 3, 8), -1, "interleaved")):
        x = np.zeros(shape, np.float32)
        g, u = G.split(x, dim % x.ndim, layout)
        dx = np.zeros_like(x)
        dg, du = G.split(dx, dim % x.ndim, layout)
        dy = np.zeros(g.shape, np.float32)
        assert plane((g, u, dy)) is not None, (shape, dim, layout)
        assert plane((dy, g, u, dg, du)) is not None, (shape, dim, layout)
    a, b = np.zeros((3, 4, 5), np.float16), np.zeros((3, 4, 5), np.float16)
    assert plane((a, b, a)) == (1, 60, [0, 0, 0], [1, 1, 1])
    x = np.zeros((4, 6, 14), np.float32).transpose(1, 0, 2)
    assert plane((x[..., :7], x[..., 7:], np.zeros((6, 4, 7), np.float32))) is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_forward_with_streaming_stores(dtype):
    """Above the cache size the contiguous forward stores around the caches (ISAs that have it): the same
    bits as small calls, at any alignment of the output."""
    n = (8 << 20) // np.dtype(dtype).itemsize + 37
    rng = np.random.default_rng(12)
    g = (rng.standard_normal(n + 8) * 4).astype(dtype)
    u = rng.standard_normal(n + 8).astype(dtype)
    for og, oy in ((0, 0), (1, 3)):
        gg, uu = g[og : og + n], u[og : og + n]
        y = np.empty(n + 8, dtype)[oy : oy + n]
        ma.swiglu(gg, up=uu, out=y, backend="native")
        step = 1 << 16
        want = np.concatenate([ma.swiglu(gg[i : i + step], up=uu[i : i + step], backend="native")
                               for i in range(0, n, step)])
        np.testing.assert_array_equal(y, want)
