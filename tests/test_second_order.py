"""Second order (issue 15 item 2): `ma.backward2(op, g, dy, x)` = g * dy * f''(x).

The float64 references against central differences of the first-order references and against torch's
double backward; every op x dtype on every host backend that runs backward2, through the shared suite
(`consistency.backward2_failures`); the public function's contract (checks, out=, kinds).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import COMPILED_PER_KEY, FULL, host_backends, supports

import multiact as ma
from multiact import consistency as C
from multiact.errors import BackendError
from multiact.optable import FLOAT_DTYPES, OPS

BACKENDS = host_backends()
CASES = [
    pytest.param(op, params, id=f"{op}[{C.case_id(params)}]")
    for op in OPS
    for params in C.param_cases(OPS[op])
]
SMOOTH_OPS = [op for op, s in OPS.items() if not s.exact and op not in ("hardswish", "hardsigmoid", "softshrink")]


def _params(op, params, dtype=np.float64):
    """Validated parameters; prelu's cases get a weight of 4 channels (x of shape (-1, 4))."""
    if op == "prelu":
        w = np.linspace(-0.5, 1.5, 4) if params["weight"] == "per-channel" else np.array([0.25])
        return {"weight": w.astype(dtype), "axis": params.get("axis", 1)}
    return OPS[op].validate(params)


def _grad2(op, g, dy, x, p):
    spec = OPS[op]
    if op == "prelu":
        w = p["weight"]
        return spec.backward2(g, dy, x, w.reshape(1, -1) if w.size > 1 else w.reshape(1, 1), 1)
    return spec.backward2(g, dy, x, **p)


# ---- the references -----------------------------------------------------------------------------------


def _away(spec, p, x, dist=1e-3):
    """x away from the op's kinks and from 0 (softsign's f'' jumps there; several ops' pieces meet there)."""
    kinks = np.array([*spec.kinks(p), 0.0])
    d = np.abs(x[:, None] - kinks[None, :]) / np.maximum(1, np.abs(kinks))[None, :]
    return x[d.min(axis=1) > dist]


@pytest.mark.parametrize("op,params", [c for c in CASES if c.values[0] != "prelu"])
def test_backward2_is_the_derivative_of_backward(op, params):
    """Central differences of the first-order reference (backward with dy = 1), in float64: on a grid
    over [-8, 8] (absolute and relative), and relatively in the tails, where f'' is tiny but not 0."""
    spec = OPS[op]
    p = spec.validate(params)
    x = _away(spec, p, np.linspace(-8, 8, 1601) + 1e-3 / 7)
    h = 1e-5 * np.maximum(1, np.abs(x))
    one = np.ones_like(x)
    fd = (spec.backward(one, x + h, **p) - spec.backward(one, x - h, **p)) / (2 * h)
    got = spec.backward2(one, one, x, **p)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8, err_msg=f"{op} {params}")
    tails = _away(spec, p, np.array([-60.0, -40, -30, -20, -15, -11, 11, 15, 20, 30, 40, 60]) * 1.013)
    h = 1e-6 * np.abs(tails)
    one = np.ones_like(tails)
    fd = (spec.backward(one, tails + h, **p) - spec.backward(one, tails - h, **p)) / (2 * h)
    got = spec.backward2(one, one, tails, **p)
    # where the difference is resolvable: f' * eps / h (its rounding) far below f'' (gelu's f' -> 1 is not)
    noise = np.abs(spec.backward(one, tails, **p)) * np.finfo(np.float64).eps / h
    keep = (noise < 1e-7 * np.abs(got)) & (np.abs(got) > 1e-280)
    np.testing.assert_allclose(got[keep], fd[keep], rtol=2e-5, err_msg=f"{op} {params} tails")


def test_backward2_is_g_times_dy_times_f2():
    """The reference is bilinear in (g, dy): g * dy * f''(x)."""
    rng = np.random.default_rng(5)
    x, g, dy = rng.standard_normal(200) * 3, rng.standard_normal(200), rng.standard_normal(200)
    one = np.ones_like(x)
    for op, spec in OPS.items():
        for params in C.param_cases(spec):
            if op == "prelu":
                continue
            p = spec.validate(params)
            np.testing.assert_allclose(spec.backward2(g, dy, x, **p), g * dy * spec.backward2(one, one, x, **p),
                                       rtol=1e-14, atol=1e-300, err_msg=f"{op} {params}")


def test_prelu_backward2_is_zero():
    x = np.array([[-2.0, -0.0, 0.0, 3.0], [np.nan, 1.0, -1.0, np.inf]])
    got = _grad2("prelu", np.full(x.shape, -3.0), np.full(x.shape, 2.0), x, _params("prelu", {"weight": "single"}))
    assert np.isnan(got[1, 0]) and not np.isnan(np.delete(got.reshape(-1), 4)).any()
    assert np.all(np.delete(got.reshape(-1), 4) == 0) and not np.signbit(got).any()


# f''(+-inf): every op's second derivative goes to 0 at both ends (never inf * 0 = NaN)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op,params", [c for c in CASES if c.values[0] != "prelu"])
def test_limits_at_infinity(op, params, dtype):
    spec = OPS[op]
    p = spec.validate(params)
    if dtype == "float32":
        p = {k: (float(np.float32(v)) if isinstance(v, float) else v) for k, v in p.items()}
    x = np.array([np.inf, -np.inf, np.finfo(dtype).max, -np.finfo(dtype).max], dtype=dtype)
    got = spec.backward2(np.ones_like(x), np.ones_like(x), x, **p)
    np.testing.assert_array_equal(got, np.zeros(4, dtype=dtype), err_msg=f"{op} {params}")
    assert got.dtype == np.dtype(dtype)


def test_references_raise_no_floating_point_warnings():
    x = np.concatenate([C.specials(np.float64), np.linspace(-1000, 1000, 101)])
    for dtype in (np.float32, np.float64):
        with np.errstate(over="ignore"):
            xd = x.astype(dtype)
        one = np.ones_like(xd)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for op, spec in OPS.items():
                for params in C.param_cases(spec):
                    if op == "prelu":
                        spec.backward2(one, one, xd, np.array([0.25], dtype), 0)
                        continue
                    spec.backward2(one, one, xd, **C._rounded(spec, params, dtype))


@pytest.mark.parametrize("op", [op for op, s in OPS.items() if s.exact])
def test_piecewise_linear_ops_give_plus_zero(op):
    """f'' = 0 almost everywhere, and 0 at the kinks (PyTorch's double backward of relu): +0 whatever g
    and dy are (inf and NaN too, as the first backward is +0 where f' is 0); NaN only where x is NaN."""
    spec = OPS[op]
    for params in C.param_cases(spec):
        x = C.sample_x(spec, params, np.float64) if op != "prelu" else np.linspace(-3, 3, 12)
        n = x.size - x.size % 4
        x = x[:n].reshape(-1, 4)
        g = np.resize([-1.0, np.inf, -0.0, 2.0, np.nan], x.shape)
        dy = np.resize([3.0, -2.0, -np.inf, -0.0], x.shape)
        got = _grad2(op, g, dy, x, _params(op, params))
        assert np.array_equal(np.isnan(got), np.isnan(x)), f"{op} {params}"
        fin = ~np.isnan(x)
        assert np.all(got[fin] == 0) and not np.signbit(got[fin]).any(), f"{op} {params}"


# ---- against PyTorch's double backward ------------------------------------------------------------------


def _torch_fn(op, p):
    """The op as a torch function of x (torch's own where it has one; swish and fast_gelu composed)."""
    torch = pytest.importorskip("torch")
    d = OPS[op].defn
    if op == "swish":
        return lambda t: t * torch.sigmoid(p["beta"] * t)
    if op == "fast_gelu":
        return lambda t: t * torch.sigmoid(1.702 * t)
    if op == "prelu":
        w = torch.as_tensor(p["weight"])
        return lambda t: torch.nn.functional.prelu(t, w)
    if op == "selu":  # torch's selu has PyTorch's constants only; multiact takes them as ONNX's Selu does
        return lambda t: p["scale"] * torch.nn.functional.elu(t, p["alpha"])  # elu's kink convention
    mod = torch if d.torch.namespace == "torch" else torch.nn.functional
    fn = getattr(mod, d.torch.fn)
    return lambda t: fn(t, *(p[a] for a in d.torch.args), **{k: p[k] for k in d.torch.kwargs})


@pytest.mark.parametrize("op,params", CASES)
def test_matches_torch_double_backward(op, params):
    """torch.autograd.grad(create_graph=True) of F.<op> in float64, then its gradient with respect to x
    for an upstream g: equal to backward2 on a grid, at large |x|, and at the kinks and their float64
    neighbours (the kink's convention: f'' = 0 there, as torch's double backward of relu, elu, hardswish)."""
    torch = pytest.importorskip("torch")
    spec = OPS[op]
    p = _params(op, params)
    ks = np.array([k for k in spec.kinks(p) if abs(k) < 1e300] if op != "prelu" else [0.0])
    x = np.concatenate([np.linspace(-8, 8, 161) + 1e-3 / 7, [-1000.0, -100, -30, 30, 100, 1000],
                        ks, np.nextafter(ks, np.inf), np.nextafter(ks, -np.inf)])
    x = x[: x.size - x.size % 4].reshape(-1, 4)
    rng = np.random.default_rng(3)
    dy, g = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    xt = torch.tensor(x, requires_grad=True)
    dyt = torch.tensor(dy, requires_grad=True)
    (dx,) = torch.autograd.grad(_torch_fn(op, p)(xt), xt, dyt, create_graph=True)
    if not dx.requires_grad:  # torch's backward of a linear op does not depend on x at all
        want = np.zeros_like(x)
    else:
        try:
            (gx,) = torch.autograd.grad(dx, xt, torch.tensor(g), allow_unused=True)
        except RuntimeError as e:  # hardsigmoid: "derivative for aten::hardsigmoid_backward is not implemented"
            if "not implemented" not in str(e):
                raise
            pytest.skip(f"torch has no double backward for {op}: {e}")
        want = np.zeros_like(x) if gx is None else gx.numpy()
    got = _grad2(op, g, dy, x, p)
    # softplus_backward (torch) takes exp(beta x) before its threshold: NaN once beta x > 709 (its
    # overflow, not a convention); celu's double backward is off by up to 2e-7 relative.
    keep = np.isfinite(want)
    rtol = 1e-6 if op == "celu" else 1e-7
    np.testing.assert_allclose(got[keep], want[keep], rtol=rtol, atol=1e-14, err_msg=f"{op} {params}")
    assert keep.mean() > 0.9


# ---- the shared suite: every op x dtype on every host backend that runs backward2 ---------------------


# float16 and bfloat16 run through the float32 loops (blocks): a compiled-per-key backend (numba) runs float16 and
# float64 (a compile per key) on these keys by default, every backend bfloat16 on them (every key with
# MULTIACT_TEST_FULL=1); float32 always runs on every key.
NARROW_SAMPLE = ("gelu_tanh", "mish", "softplus", "relu", "tanh")


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, "bfloat16"])
@pytest.mark.parametrize("op,params", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward2_matches_reference(backend, op, params, dtype):
    spec = OPS[op]
    key = spec.kernel_key(spec.validate(params)) if op != "prelu" else op
    if not supports(backend, key, "backward2", dtype):
        pytest.skip(f"{backend} has no {key} backward2 kernel for {dtype} (the registry falls through)")
    if dtype == "bfloat16":
        dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
        if not FULL and key not in NARROW_SAMPLE:
            pytest.skip("bfloat16 runs on a sample of the keys; all of them with MULTIACT_TEST_FULL=1")
    elif backend in COMPILED_PER_KEY and not FULL and dtype == "float16" and key not in NARROW_SAMPLE:
        pytest.skip(f"{backend}: {dtype} runs the float32 loop; this key runs with MULTIACT_TEST_FULL=1")
    elif backend in COMPILED_PER_KEY and not FULL and dtype == "float64" and key not in (*NARROW_SAMPLE, "silu"):
        pytest.skip(f"{backend}: float64 on a sample (test_torch's gradgradcheck runs every op's float64 loop "
                    "against torch); this key runs with MULTIACT_TEST_FULL=1")
    failures = C.backward2_failures(backend, op, params, dtype)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op,params", [c for c in CASES if c.values[0] != "prelu"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward2_is_relatively_accurate_in_the_tails(backend, op, params):
    """float32, 6 <= |x| <= 120, g = dy = 1, wherever f'' is a normal float32: within the op's backward2
    ulps of the reference.  The suite judges backward2 on the scale |g * dy|, under which a tail result
    (e^-|z|) is all floor; here the exponent's low part taken with the wrong sign (gelu_tanh, swish,
    fast_gelu: 150 ulps at x = -50) or an e^2 that is already subnormal (mish at x = 46: 170) fails."""
    spec = OPS[op]
    key = spec.kernel_key(spec.validate(params))
    if not supports(backend, key, "backward2", "float32"):
        pytest.skip(f"{backend} has no {key} backward2 kernel for float32 (the registry falls through)")
    x = np.concatenate([-np.geomspace(6, 120, 1501), np.geomspace(6, 120, 1501)]).astype(np.float32)
    one = np.ones_like(x)
    ref = C.backward2_reference(spec, spec.validate(params), np.float32, one, one, x)
    got = np.asarray(ma.backward2(op, one, one, x, backend=backend, **params)).astype(np.float64)
    normal = np.abs(ref) >= np.finfo(np.float32).tiny
    ulps = np.abs(got - ref)[normal] / np.spacing(np.abs(ref[normal]).astype(np.float32))
    bound = C.backward2_tolerance(spec).tol.ulp32
    assert not normal.any() or ulps.max() <= bound, (
        f"{op} {params}: {ulps.max():.1f} ulps at x = {x[normal][ulps.argmax()]} (bound {bound})")


# The parallel loops (numba: a prange over blocks calling the serial loop): two by default (a heavy formula in
# float32, the shared zero loop in float64), every key in both with MULTIACT_TEST_FULL=1 (each is a compile).
PARALLEL_SAMPLE = (("gelu_tanh", "float32"), ("relu", "float64"))


def _key(op, params):
    return OPS[op].kernel_key(OPS[op].validate(params)) if op != "prelu" else op


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op,params", CASES)
def test_numba_parallel_backward2_equals_serial(op, params, dtype):
    """Above numba's parallel threshold, with 2 threads: the parallel loop gives the serial loop's bits (the same
    machine code per element), strided and in place too; the suite's bound on the large array."""
    from multiact import registry

    if not any(v.values[0] == "numba" for v in BACKENDS if not v.marks):
        pytest.skip("numba is not available")
    if not FULL and (_key(op, params), dtype) not in PARALLEL_SAMPLE:
        pytest.skip("a parallel loop is a compile of its own: this one runs with MULTIACT_TEST_FULL=1")
    nb = registry.module("numba")
    spec = OPS[op]
    g, dy, x, call_params, ref_params = C.backward2_inputs(spec, params, dtype)
    reps = -(-(nb._PAR_MIN + 4097) // x.shape[0])
    g, dy, x = (np.concatenate([a] * reps) for a in (g, dy, x))
    old = ma.get_num_threads()
    try:
        ma.set_num_threads(1)
        want = ma.backward2(op, g, dy, x, backend="numba", **call_params)
        ma.set_num_threads(2)
        got = ma.backward2(op, g, dy, x, backend="numba", **call_params)
        xs = np.concatenate([x, x])[::2] if op != "prelu" else x
        gs, dys = (np.concatenate([a, a])[::2] for a in (g, dy)) if op != "prelu" else (g, dy)
        strided = ma.backward2(op, gs, dys, xs, backend="numba", **call_params)
        gc = g.copy()
        inplace = ma.backward2(op, gc, dy, x, out=gc, backend="numba", **call_params)
    finally:
        ma.set_num_threads(old)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(inplace.view(np.uint8), want.view(np.uint8))
    if op != "prelu":
        np.testing.assert_array_equal(strided.view(np.uint8), ma.backward2(
            op, gs.copy(), dys.copy(), xs.copy(), backend="numba", **call_params).view(np.uint8))
    ref = C.backward2_reference(spec, ref_params, dtype, g, dy, x)
    v = C.compare(got, ref, x, C.backward2_tolerance(spec), "backward2", scale=g.astype(np.float64) * dy,
                  params=params, zero_sign=C.backward2_zero_sign(spec, ref_params, dtype, g, dy, x))
    assert v.passed, v.describe()


def test_numba_runs_backward2_by_default_and_shares_the_zero_loop():
    """NumPy float32 and float64 run native's backward2 kernels where the extension is built, numba's where it
    is not (torch's float64 double backward through multiact.torch lands there then); the piecewise-linear
    keys share one compiled loop."""
    from multiact import registry

    if not any(v.values[0] == "numba" for v in BACKENDS if not v.marks):
        pytest.skip("numba is not available")
    nb = registry.module("numba")
    for dtype in ("float32", "float64"):
        x = np.linspace(-3, 3, 8, dtype=dtype)
        names = [registry.module(i.name) for i in ma.backends() if i.available and "numpy" in i.kinds]
        order = [m.NAME for m in sorted(names, key=lambda m: -m.PRIORITY) if m.supports("silu", "backward2", dtype)]
        want = ["native", "numba"] if "native" in order else ["numba"]
        assert order[: len(want)] == want, order
        assert order[0] in ma.explain("silu", x, direction="backward2")
    from multiact.backend import formulas

    zero = [k for (k, d), f in formulas.TABLE.items() if d == "backward2" and f == "zero_grad2"]
    assert len(zero) >= 9 and {nb._shared_key(k, "backward2") for k in zero} == {zero[0]}


def test_numpy_runs_backward2_for_every_key_and_others_fall_through():
    from multiact import registry

    numpy = registry.module("numpy")
    for key in {k for s in OPS.values() for k in s.keys}:
        for dtype in FLOAT_DTYPES:
            assert numpy.supports(key, "backward2", dtype)
    # The default choice runs wherever the faster backends have no backward2 kernel.
    x = np.linspace(-3, 3, 50, dtype=np.float32)
    got = ma.backward2("gelu", np.ones_like(x), np.ones_like(x), x, approximate="tanh")
    np.testing.assert_allclose(got, OPS["gelu"].backward2(np.ones(50), np.ones(50), x.astype(np.float64), "tanh"),
                               rtol=1e-5, atol=1e-6)


def test_the_suite_sees_a_wrong_second_derivative(monkeypatch):
    """A kernel off by a little (f'' * (1 + 1e-5)) or with the wrong sign of zero fails the suite."""
    from multiact import registry

    numpy = registry.module("numpy")
    real = numpy.kernel

    def off(key, direction, dtype):
        k = real(key, direction, dtype)
        if direction != "backward2":
            return k

        def run(g, dy, x, out, p):
            k(g, dy, x, out, p)
            out *= out.dtype.type(1 + 3e-4 if out.dtype == np.float16 else 1 + 1e-5)
        return run

    monkeypatch.setattr(numpy, "kernel", off)
    registry.clear_cache()
    try:
        assert C.backward2_failures("numpy", "gelu", {}, "float32")
        assert C.backward2_failures("numpy", "silu", {}, "float64")
        assert not C.backward2_failures("numpy", "relu", {}, "float32")  # zeros stay zeros
    finally:
        monkeypatch.undo()
        registry.clear_cache()

    def minus_zero(key, direction, dtype):
        k = real(key, direction, dtype)

        def run(g, dy, x, out, p):
            k(g, dy, x, out, p)
            out[out == 0] = -0.0
        return run

    monkeypatch.setattr(numpy, "kernel", minus_zero)
    registry.clear_cache()
    try:
        assert C.backward2_failures("numpy", "relu", {}, "float32")  # +0 on the linear pieces
    finally:
        monkeypatch.undo()
        registry.clear_cache()


# ---- the public function: ma.backward2 --------------------------------------------------------------------


def test_signature_and_export():
    import inspect

    assert "backward2" in ma.__all__
    sig = inspect.signature(ma.backward2)
    assert list(sig.parameters) == ["op", "g", "dy", "x", "out", "backend", "params"]
    assert sig.parameters["out"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["backend"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_out_in_place_layouts_and_sizes(dtype):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((5, 7)) * 3).astype(dtype)
    g, dy = rng.standard_normal((5, 7)).astype(dtype), rng.standard_normal((5, 7)).astype(dtype)
    want = ma.backward2("mish", g, dy, x)
    assert want.dtype == np.dtype(dtype) and want.shape == x.shape
    out = np.empty_like(x)
    assert ma.backward2("mish", g, dy, x, out=out) is out
    np.testing.assert_array_equal(out, want)
    for name in ("g", "dy", "x"):  # out= any input is in place
        arrs = {"g": g.copy(), "dy": dy.copy(), "x": x.copy()}
        res = ma.backward2("mish", arrs["g"], arrs["dy"], arrs["x"], out=arrs[name])
        assert res is arrs[name]
        np.testing.assert_array_equal(res, want)
    # transposed / strided views, 0-d and zero-size inputs
    np.testing.assert_array_equal(ma.backward2("mish", g.T, dy.T, x.T), want.T)
    np.testing.assert_array_equal(ma.backward2("mish", g[:, ::2], dy[:, ::2], x[:, ::2]), want[:, ::2])
    assert ma.backward2("mish", g[0, 0].reshape(()), dy[0, 0].reshape(()), x[0, 0].reshape(())).shape == ()
    assert ma.backward2("mish", g[:0], dy[:0], x[:0]).shape == (0, 7)
    big = np.resize(x, 70_001)  # past the numpy backend's block
    gb = np.resize(g, 70_001)
    ref = OPS["mish"].backward2(gb.astype(np.float64), gb.astype(np.float64), big.astype(np.float64))
    v = C.compare(ma.backward2("mish", gb, gb, big), ref, big, C.backward2_tolerance(OPS["mish"]), "backward2",
                  scale=gb.astype(np.float64) ** 2)
    assert v.passed, v.describe()


def test_parameters_and_prelu():
    x = np.linspace(-4, 4, 24).reshape(2, 3, 4)
    one = np.ones_like(x)
    # the default backend (numba's float64 formulas where it runs: a few ulps from the reference)
    np.testing.assert_allclose(ma.backward2("softplus", one, one, x, beta=2.0, threshold=5.0),
                               OPS["softplus"].backward2(one, one, x, 2.0, 5.0), rtol=1e-14, atol=1e-16)
    np.testing.assert_allclose(ma.backward2("swish", one, one, x, beta=-0.7),
                               OPS["swish"].backward2(one, one, x, -0.7), rtol=1e-14, atol=1e-16)
    got = ma.backward2("prelu", one, one, x, weight=np.array([0.1, 0.2, 0.3]))
    assert np.all(got == 0)
    with pytest.raises(ValueError, match="weight"):
        ma.backward2("prelu", one, one, x, weight=np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="backward2\\('softplus'\\).*beta"):
        ma.backward2("softplus", one, one, x, beta=-1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'alpha'"):
        ma.backward2("gelu", one, one, x, alpha=1.0)
    with pytest.raises(ValueError, match="approximate"):
        ma.backward2("gelu", one, one, x, approximate="fast")


def test_bad_calls_name_the_argument_and_write_nothing():
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    one = np.ones_like(x)
    out = np.full_like(x, 7.0)
    bad = [
        (TypeError, "dy has dtype float64 but g has float32", (one, one.astype(np.float64), x), {}),
        (TypeError, "x has dtype float16", (one, one, x.astype(np.float16)), {}),
        (ValueError, "dy has shape \\(4,\\) but g has \\(8,\\)", (one, one[:4], x), {}),
        (ValueError, "x has shape", (one, one, np.ones(9, np.float32)), {}),
        (TypeError, "must have a float", (one.astype(int), one.astype(int), x.astype(int)), {}),
        (TypeError, "out has dtype float64", (one, one, x), {"out": np.empty(8)}),
        (ValueError, "out has shape", (one, one, x), {"out": np.empty(9, np.float32)}),
        (ValueError, "unknown op 'nope'", None, {}),
        (ValueError, "valid backends", (one, one, x), {"backend": "nope"}),
    ]
    for exc, msg, args, kw in bad:
        with pytest.raises(exc, match=msg):
            if args is None:
                ma.backward2("nope", one, one, x)
            else:
                ma.backward2("gelu", *args, **kw)
    ro = np.full_like(x, 7.0)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ma.backward2("gelu", one, one, x, out=ro)
    buf = np.full(9, 7.0, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        ma.backward2("gelu", buf[:8], one, x, out=buf[1:])
    with pytest.raises(ValueError, match="shape"):
        ma.backward2("gelu", one, one[:4], x, out=out)
    assert np.all(out == 7.0) and np.all(buf == 7.0)  # nothing written on error


def test_explicit_backend_without_backward2_is_an_error():
    from multiact import registry

    x = np.linspace(-2, 2, 8, dtype=np.float32)
    for info in ma.backends():
        mod = registry.module(info.name)
        if info.available and "numpy" in info.kinds and not mod.supports("gelu", "backward2", "float32"):
            with pytest.raises(BackendError, match="backward2"):
                ma.backward2("gelu", x, x, x, backend=info.name)
    chosen = registry.select("gelu", "backward2", "float32", "numpy", None)[0].NAME  # native or numba where they run
    np.testing.assert_array_equal(ma.backward2("gelu", x, x, x, backend=chosen), ma.backward2("gelu", x, x, x))
    np.testing.assert_allclose(ma.backward2("gelu", x, x, x, backend="numpy"), ma.backward2("gelu", x, x, x),
                               rtol=1e-6, atol=1e-7)


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    x = torch.linspace(-3, 3, 10, dtype=torch.float32)
    got = ma.backward2("silu", torch.ones_like(x), torch.full_like(x, 2.0), x)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), 2 * OPS["silu"].backward2(np.ones(10), np.ones(10),
                                                                       x.numpy().astype(np.float64)), rtol=1e-5,
                               atol=1e-6)


# ---- second order in the learnable parameters: ma.param_grad2 -----------------------------------------------


def _swish_dp(x, beta):
    """d/dbeta of x sigmoid(beta x), elementwise (the summand of swish_beta_grad with dy = 1)."""
    s = 1 / (1 + np.exp(-beta * x))
    return x * x * s * (1 - s)


@pytest.mark.parametrize("beta", [1.0, 1.3, -0.7, 0.0])
def test_swish_param_grad2_is_the_derivative(beta):
    spec = OPS["swish"]
    x = np.linspace(-12, 12, 961) + 1e-3 / 7
    one = np.ones_like(x)
    mixed, pp = spec.param_grad2_ref
    h = 1e-6
    # d/dbeta of f'(x) and d/dx of df/dbeta: the same mixed partial
    fd_b = (spec.backward(one, x, beta + h) - spec.backward(one, x, beta - h)) / (2 * h)
    hx = 1e-6 * np.maximum(1, np.abs(x))
    fd_x = (_swish_dp(x + hx, beta) - _swish_dp(x - hx, beta)) / (2 * hx)
    got = mixed(one, one, x, beta)
    np.testing.assert_allclose(got, fd_b, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got, fd_x, rtol=1e-6, atol=1e-8)
    fd_bb = (_swish_dp(x, beta + h) - _swish_dp(x, beta - h)) / (2 * h)
    np.testing.assert_allclose(pp(one, one, x, beta), fd_bb, rtol=1e-6, atol=1e-7)
    # the tails: exact 0 at +-inf and huge |x| (never inf * 0)
    big = np.array([np.inf, -np.inf, 1e308, -1e308])
    want = big / 2 if beta == 0 else np.zeros(4)  # beta = 0: x / 2
    assert np.array_equal(mixed(np.ones(4), np.ones(4), big, beta), want)
    assert np.array_equal(pp(np.ones(4), np.ones(4), big, beta), np.zeros(4))


def test_prelu_param_grad2_is_the_derivative():
    spec = OPS["prelu"]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 3, 2))
    w = np.array([0.1, -0.2, 0.5]).reshape(1, 3, 1)
    one = np.ones_like(x)
    mixed, pp = spec.param_grad2_ref
    e = 1e-6
    fd = (spec.backward(one, x, w + e, 1) - spec.backward(one, x, w - e, 1)) / (2 * e)
    np.testing.assert_allclose(mixed(one, one, x, w, 1), fd, atol=1e-9)
    assert np.all(pp(one, one, x, w, 1) == 0)


def test_param_grad2_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x, dy, g = rng.standard_normal(40) * 3, rng.standard_normal(40), rng.standard_normal(40)
    for beta in (1.3, -0.7):
        xt = torch.tensor(x, requires_grad=True)
        bt = torch.tensor(beta, dtype=torch.float64, requires_grad=True)
        dyt = torch.tensor(dy)
        y = xt * torch.sigmoid(bt * xt)
        dx, db = torch.autograd.grad(y, (xt, bt), dyt, create_graph=True)
        (want_b,) = torch.autograd.grad(dx, bt, torch.tensor(g), retain_graph=True)  # d<g, dx>/dbeta
        gb = 0.37
        want_x, want_bb = torch.autograd.grad(db, (xt, bt), torch.tensor(gb, dtype=torch.float64))
        mixed = ma.param_grad2("swish", "beta", g, dy, x, beta=beta)
        np.testing.assert_allclose(mixed.sum(), want_b.item(), rtol=1e-10)
        np.testing.assert_allclose(ma.param_grad2("swish", "beta", np.full(40, gb), dy, x, beta=beta),
                                   want_x.numpy(), rtol=1e-10, atol=1e-15)
        pp = ma.param_grad2("swish", "beta", np.full(40, gb), dy, x, wrt="beta", beta=beta)
        np.testing.assert_allclose(pp.sum(), want_bb.item(), rtol=1e-10)
    xt = torch.tensor(x.reshape(4, 2, 5), requires_grad=True)
    wt = torch.tensor([0.2, -0.4], dtype=torch.float64, requires_grad=True)
    (dx,) = torch.autograd.grad(torch.nn.functional.prelu(xt, wt), xt, torch.tensor(dy.reshape(4, 2, 5)),
                                create_graph=True)
    (want_w,) = torch.autograd.grad(dx, wt, torch.tensor(g.reshape(4, 2, 5)))
    got = ma.param_grad2("prelu", "weight", g.reshape(4, 2, 5), dy.reshape(4, 2, 5), x.reshape(4, 2, 5),
                         weight=np.array([0.2, -0.4]))
    np.testing.assert_allclose(got.sum(axis=(0, 2)), want_w.numpy(), rtol=1e-12)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_param_grad2_in_every_dtype(dtype):
    spec = OPS["swish"]
    for params in C.param_cases(spec):
        g, dy, x, _, _ = C.backward2_inputs(spec, params, dtype)
        p = C._rounded(spec, params, dtype)
        for wrt, ref in zip(("x", "beta"), spec.param_grad2_ref, strict=True):
            got = ma.param_grad2("swish", "beta", g, dy, x, wrt=wrt, **params)
            assert got.dtype == np.dtype(dtype)
            want = ref(*(a.astype(np.float64) for a in (g, dy, x)), **p)
            with np.errstate(over="ignore"):  # |x|^3: the bound's floor grows like the formula's terms
                scale = g.astype(np.float64) * dy.astype(np.float64) * np.maximum(1, np.abs(x.astype(np.float64))) ** 3
            v = C.compare(got, want, x, C.backward2_tolerance(spec), "backward2", scale=scale, params=params,
                          zero_sign=np.zeros(x.shape, bool))
            assert v.passed, f"{params} wrt={wrt}: {v.describe()}"


def test_param_grad2_errors():
    x = np.linspace(-2, 2, 8)
    with pytest.raises(ValueError, match="no second derivative in parameter 'alpha'"):
        ma.param_grad2("swish", "alpha", x, x, x)
    with pytest.raises(ValueError, match="no second derivative"):
        ma.param_grad2("gelu", "approximate", x, x, x)
    with pytest.raises(ValueError, match="wrt must be"):
        ma.param_grad2("swish", "beta", x, x, x, wrt="dy")
    with pytest.raises(ValueError, match="param_grad2\\('swish', 'beta'\\): dy has shape"):
        ma.param_grad2("swish", "beta", x, x[:3], x)
    assert "param_grad2" in ma.__all__
