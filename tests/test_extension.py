"""The worked example of adding an op (CONTRIBUTING.md, "Adding an op"), through the public extension point
`ma.register_op` and nothing else: a throwaway op, isru_example (x / sqrt(1 + alpha x^2)), first with its
definition and float64 references alone (the numpy backend runs it from them, the other backends fall through),
then with its kernels for the backends that take them at run time: numba's scalar formulas (forward, backward,
backward2: `multiact.backend.formulas.register`, which the cuda backend compiles too) and the ONNX graph bodies
of the onnxruntime backend (forward, backward: `multiact.backend.onnx_graphs.register`, the ascend backend's and
`to_onnx`'s too).  The shared suite holds each backend to the float64 reference, in float32 and float64 on numba,
float16 and float32 on onnxruntime (it has no float64 kernel for any op), and the composite ops (glu's act=) run
the same kernels.  Every trace of the op is taken out afterwards, its numba loops never reach the on-disk cache,
and a second registration under the same name is what runs, not a kernel cached from the first.

The cuda backend compiles the same formulas: a child process runs them under the CUDA simulator (on the GPU with
MULTIACT_CUDA_REAL=1).  Not proved here: the native backend's C kernels (native/src/ma_ops.h, ma_ops2.h,
ma_ops64.h) are compiled at install and cannot be added at run time, so it falls through to the next backend; the
ascend backend runs the same ONNX graphs on CANN's provider, which needs an NPU.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import multiact as ma
from multiact import api, consistency, optable, registry
from multiact._opdefs import OpDef, Param
from multiact.backend import formulas, onnx_graphs

# The names the scalar formulas use are formulas.py's (its placeholders here, for linters: a formula is compiled
# against formulas.py's globals, never its own module's).
from multiact.backend.formulas import ONE, THREE, TWO, ZERO, T, clampbig
from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS, OPS, Tolerance

NAME = "isru_example"
DEFN = OpDef(
    NAME, "Inverse square root unit (a worked example of adding an op).", "x / sqrt(1 + alpha x^2)",
    (Param("alpha", 1.0, lo=0, lo_open=True),), cases=({"alpha": 0.25}, {"alpha": 7.0}),
)
TOL = Tolerance(ulp32=4, ulp64=5)  # see isru_backward: 3.75 ulp by its roundings, + the float64 reference's own


# ---- the float64 references (extended precision where the platform has it) -----------------------------------


def _parts(x):
    """(x, |x| <= 1, r = 1 / x beyond it) in long double: a x^2 would overflow far out, so there the formulas
    are written with r (1 + a x^2 = x^2 (a + r^2))."""
    x = np.asarray(x, dtype=np.longdouble)
    near = np.abs(x) <= 1
    with np.errstate(divide="ignore", invalid="ignore"):
        return x, near, 1 / np.where(near, 1, x)


def _isru(x, alpha):
    x, near, r = _parts(x)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.where(near, x / np.sqrt(1 + alpha * x * x), np.sign(x) / np.sqrt(alpha + r * r))
    return y.astype(np.float64)


def _isru_grad(dy, x, alpha):
    """d/dx: (1 + alpha x^2)^(-3/2), 0 at +-inf."""
    x, near, r = _parts(x)
    with np.errstate(over="ignore", invalid="ignore"):
        t, u = 1 + alpha * x * x, alpha + r * r
        d = np.where(near, 1 / (t * np.sqrt(t)), (r * r / u) * (np.abs(r) / np.sqrt(u)))
    return np.asarray(dy, dtype=np.float64) * d.astype(np.float64)


def _isru_grad2(g, dy, x, alpha):
    """g * dy * f''(x), f'' = -3 alpha x (1 + alpha x^2)^(-5/2)."""
    x, near, r = _parts(x)
    with np.errstate(over="ignore", invalid="ignore"):
        t, u = 1 + alpha * x * x, alpha + r * r
        d = np.where(near, -3 * alpha * x / (t * t * np.sqrt(t)),
                     -3 * alpha * np.sign(x) * (r * r / u) * (r * r / u) / np.sqrt(u))
    return np.asarray(g, dtype=np.float64) * np.asarray(dy, dtype=np.float64) * d.astype(np.float64)


# ---- numba/cuda scalar formulas (as formulas.py writes them: T arithmetic, typed constants) --------------------


def isru_forward(x, a, b):
    """x / sqrt(1 + a x^2); beyond |x| = 1 as sign(x) / sqrt(a + 1/x^2), where a x^2 cannot overflow."""
    if abs(x) <= ONE:
        return x / T(math.sqrt(ONE + (T(a) * x) * x))
    r = ONE / x
    return (ONE if x > ZERO else -ONE) / T(math.sqrt(T(a) + r * r))


def isru_backward(dy, x, a, b):
    """dy (1 + a x^2)^(-3/2), divided twice (t^(3/2) would overflow before t does); 0 where t overflows, as it is
    below the smallest subnormal there."""
    t = ONE + (T(a) * x) * x
    return (dy / t) / T(math.sqrt(t))


def isru_backward2(g, dy, x, a, b):
    """g dy f''(x) = -3 a x g dy / t^(5/2), t = 1 + a x^2, divided stepwise; 0 at +-inf (x clamped to the finite
    range, so x / t is 0 there and not inf / inf)."""
    xc = clampbig(x)
    t = ONE + (T(a) * xc) * xc
    return -((g * dy) * ((THREE * T(a)) * (xc / t))) / t / T(math.sqrt(t))


# ---- ONNX graph bodies (as onnx_graphs.py writes them, on its Graph builder) ----------------------------------


def isru_forward_graph(g, x, p, w):
    near = g.le(g.abs(x), 1.0)
    y_near = g.div(x, g.op("Sqrt", g.add(g.mul(g.mul(x, p["alpha"]), x), 1.0)))
    r = g.div(1.0, x)
    y_far = g.div(g.op("Sign", x), g.op("Sqrt", g.add(g.mul(r, r), p["alpha"])))
    return g.select(near, y_near, y_far)  # select: -0 from x = -0 survives ORT's Where


def isru_backward_graph(g, dy, x, p, w):
    t = g.add(g.mul(g.mul(x, p["alpha"]), x), 1.0)
    return g.div(g.div(dy, t), g.op("Sqrt", t))


FORMULAS = {"forward": isru_forward, "backward": isru_backward, "backward2": isru_backward2}
GRAPHS = {"forward": isru_forward_graph, "backward": isru_backward_graph}
KERNEL_BACKENDS = [("numba", "float16"), ("numba", "float32"), ("numba", "float64"),
                   ("onnxruntime", "float16"), ("onnxruntime", "float32")]


# ---- registering and taking out again -------------------------------------------------------------------------


def _remove(spec: optable.OpSpec) -> None:
    """Every trace of the op: its public functions, its kernels, its table entries, the registry's choices."""
    for n in [n for n in api.FUNCTIONS if n == spec.name or n.startswith(spec.name + "_")]:
        del api.FUNCTIONS[n]
        delattr(ma, n)
        ma.__all__.remove(n)
    for key in spec.keys:
        formulas.unregister(key)  # and the numba loops built on them (formulas.on_change)
        onnx_graphs.unregister(key)  # and the ONNX Runtime sessions of its graphs (onnx_graphs.on_change)
    optable.unregister(spec.name)  # OPS, KEYS, its gated:<key> and bias_act:<key> kernels
    registry.clear_cache()
    _assert_gone(spec.name)


def _assert_gone(name: str) -> None:
    assert name not in OPS and name not in KEYS and not hasattr(ma, name) and name not in ma.__all__
    assert not any(k.split(":", 1)[1] == name for k in (*FAMILY_KEYS, *BIAS_ACT_KEYS))
    assert not any(k == name for k, _ in (*formulas.TABLE, *onnx_graphs.GRAPHS)) and name not in formulas.PARAMS


@contextmanager
def registered(**kernels) -> Iterator[optable.OpSpec]:
    spec = ma.register_op(DEFN, forward=_isru, backward=_isru_grad, backward2=_isru_grad2, tol=TOL, **kernels)
    try:
        yield spec
    finally:
        _remove(spec)


@pytest.fixture
def isru():
    """The op with its references alone."""
    with registered() as spec:
        yield spec


@pytest.fixture
def isru_kernels():
    """The op with its numba formulas and ONNX graphs."""
    with registered(formulas=FORMULAS, graphs=GRAPHS) as spec:
        yield spec


# ---- the op from its definition and references alone ----------------------------------------------------------


def test_one_definition_gives_the_public_functions(isru):
    x = np.linspace(-4, 4, 33)
    np.testing.assert_allclose(ma.isru_example(x), x / np.sqrt(1 + x * x), rtol=1e-15)
    np.testing.assert_allclose(ma.isru_example(x, 0.25), x / np.sqrt(1 + 0.25 * x * x), rtol=1e-15)
    np.testing.assert_allclose(ma.isru_example_grad(np.ones_like(x), x), (1 + x * x) ** -1.5, rtol=1e-14)
    assert "alpha" in ma.isru_example.__doc__ and NAME in ma.ops()
    np.testing.assert_array_equal(ma.forward(NAME, x, alpha=0.5), ma.isru_example(x, 0.5))


def test_backends_without_its_kernels_fall_through_to_numpy(isru):
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    assert "-> numpy" in ma.explain(NAME, x)
    for b in ("native", "numba", "onnxruntime"):
        if registry.availability(b)[0]:
            with pytest.raises(ma.BackendError, match=f"backend '{b}'.*has no isru_example forward kernel"):
                ma.isru_example(x, backend=b)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_the_shared_suite_holds_it_to_its_reference(isru, dtype):
    for params in consistency.param_cases(isru):
        assert not consistency.case_failures("numpy", NAME, params, dtype), params
        assert not consistency.backward2_failures("numpy", NAME, params, dtype), params


@pytest.mark.parametrize("warm", [False, True])
def test_its_parameter_is_checked_cold_and_warm(isru, warm):
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    out = np.full_like(x, 7.0)
    if warm:
        ma.isru_example(x, 0.5, out=np.empty_like(x))
    for bad in (0.0, -1.0, float("nan"), 1e300):
        with pytest.raises(ValueError, match="isru_example\\(\\): parameter 'alpha'"):
            ma.isru_example(x, bad, out=out)
    assert np.all(out == 7.0)


def test_a_name_that_exists_is_refused():
    with pytest.raises(ValueError, match="exists already"):
        ma.register_op(OPS["relu"].defn, forward=OPS["relu"].forward, backward=OPS["relu"].backward,
                       backward_y=OPS["relu"].backward_y)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_composite_ops_take_it_at_once(isru, dtype):
    """A fused op names its activation: glu(act="isru_example") needs no kernel or definition of its own
    (the numpy backend composes the reference), and the gated suite holds it to the composition."""
    x = np.linspace(-3, 3, 24).reshape(3, 8)
    a, b = x[:, :4], x[:, 4:]
    np.testing.assert_allclose(ma.glu(x, act=NAME, activate="first", alpha=0.25),
                               _isru(a, 0.25) * b, rtol=1e-15)
    assert not consistency.gated_failures("numpy", "glu", {"act": NAME, "alpha": 0.25}, dtype)
    assert not consistency.gated_failures("numpy", "glu", {"act": NAME, "up": True}, dtype)


# ---- the op with its kernels on numba and the ONNX graphs -----------------------------------------------------


def _available(backend: str) -> None:
    ok, why = registry.availability(backend)
    if not ok:
        pytest.skip(f"{backend}: {why}")


def test_its_kernels_are_chosen(isru_kernels):
    """numba runs NumPy arrays now (native, ahead of it, has no C kernel of a run-time op); onnxruntime on request;
    float64 is no onnxruntime kernel, for this op as for every other."""
    _available("numba")
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    assert "-> numba" in ma.explain(NAME, x) and "-> numba" in ma.explain(NAME, x, direction="backward2")
    assert "native skipped: it has no isru_example forward kernel" in ma.explain(NAME, x)
    _available("onnxruntime")
    np.testing.assert_allclose(ma.isru_example(x, 0.25, backend="onnxruntime"), _isru(x, 0.25), rtol=1e-6)
    with pytest.raises(ma.BackendError, match="has no isru_example forward kernel for float64"):
        ma.isru_example(x.astype(np.float64), backend="onnxruntime")


@pytest.mark.parametrize("backend,dtype", KERNEL_BACKENDS)
def test_the_shared_suite_holds_its_kernels_to_its_reference(isru_kernels, backend, dtype):
    _available(backend)
    for params in consistency.param_cases(isru_kernels):
        for direction in consistency.directions(isru_kernels, params):
            assert registry.module(backend).supports(NAME, direction, dtype), direction
        assert not consistency.case_failures(backend, NAME, params, dtype), params


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_its_second_derivative_runs_on_numba(isru_kernels, dtype):
    _available("numba")
    for params in consistency.param_cases(isru_kernels):
        assert not consistency.backward2_failures("numba", NAME, params, dtype), params


@pytest.mark.parametrize("backend", ["numba", "onnxruntime"])
def test_the_composite_ops_run_its_kernels(isru_kernels, backend):
    """glu(act="isru_example") on the backend's gated kernel, built from the op's own forward and backward."""
    _available(backend)
    assert registry.module(backend).supports(f"gated:{NAME}", "forward", "float32")
    assert not consistency.gated_failures(backend, "glu", {"act": NAME, "alpha": 0.25}, "float32")
    assert not consistency.gated_failures(backend, "glu", {"act": NAME, "up": True}, "float32")


# The cuda backend compiles the same formulas: in a child process, under the CUDA simulator (which must be on before
# numba is imported), or on the GPU where MULTIACT_CUDA_REAL=1 says there is one (as tests/cuda runs).
CUDA_CHILD = """
import sys
sys.path.insert(0, {tests!r})
from numba import cuda
import test_extension as T
from multiact import consistency as C, registry
assert registry.availability("cuda")[0], registry.availability("cuda")
kind = dict(to_kind=cuda.to_device, from_kind=lambda a: a.copy_to_host(), n=60)
with T.registered(formulas=T.FORMULAS) as spec:
    for dtype in ("float32", "float64"):
        for p in C.param_cases(spec):
            assert not C.case_failures("cuda", T.NAME, p, dtype, **kind), (dtype, p)
            assert not C.backward2_failures("cuda", T.NAME, p, dtype, **kind), (dtype, p)
print("ok")
"""


def test_the_cuda_backend_runs_its_formulas():
    pytest.importorskip("numba.cuda")
    env = dict(os.environ)
    if env.get("MULTIACT_CUDA_REAL") != "1":
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run([sys.executable, "-c", CUDA_CHILD.format(tests=str(Path(__file__).parent))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (proc.stdout + proc.stderr)[-3000:]


def test_to_onnx_exports_its_graphs(isru_kernels):
    pytest.importorskip("onnx")
    assert ma.to_onnx(NAME, grad=True, alpha=0.25).graph.name == f"multiact_{NAME}_backward"


# ---- the caches: nothing on disk, nothing stale ---------------------------------------------------------------


def isru_forward_twice(x, a, b):
    """Another formula under the same op name (twice the op), to see which one runs."""
    return TWO * (x / T(math.sqrt(ONE + (T(a) * x) * x)))


def isru_forward_graph_twice(g, x, p, w):
    return g.mul(g.div(x, g.op("Sqrt", g.add(g.mul(g.mul(x, p["alpha"]), x), 1.0))), 2.0)


def test_a_second_registration_runs_its_own_kernels_and_nothing_is_cached_on_disk():
    """The numba loops and ONNX Runtime sessions of the first registration are dropped with it (they are keyed by
    the op's name, which the second one reuses), and no numba loop around a formula of this module reaches the
    on-disk cache, whose keys hash formulas.py: a changed formula here would be served from a stale entry."""
    _available("numba")
    backends = ["numba"] + (["onnxruntime"] if registry.availability("onnxruntime")[0] else [])
    x = np.linspace(-3, 3, 16, dtype=np.float32)
    with registered(formulas=FORMULAS, graphs=GRAPHS):
        first = {b: ma.isru_example(x, backend=b) for b in backends}
    with registered(formulas={"forward": isru_forward_twice, "backward": isru_backward},
                    graphs={"forward": isru_forward_graph_twice, "backward": isru_backward_graph}):
        for b in backends:
            np.testing.assert_allclose(ma.isru_example(x, backend=b), 2 * first[b], rtol=1e-6, err_msg=b)
    cache = registry.module("numba").info()["cache"]
    if cache.startswith("on: "):
        assert not list(Path(cache[4:]).glob(f"*{NAME}*"))


def test_a_refused_kernel_leaves_nothing_of_the_op():
    with pytest.raises(ValueError, match="isru_example has no backward_y"):
        ma.register_op(DEFN, forward=_isru, backward=_isru_grad, formulas={"backward_y": isru_backward})
    with pytest.raises(ValueError, match="unknown kernel key"):
        ma.register_op(DEFN, forward=_isru, backward=_isru_grad, graphs={("isru", "forward"): isru_forward_graph})
    _assert_gone(NAME)
    with pytest.raises(ValueError, match="unknown kernel key"):
        formulas.register(NAME, "forward", isru_forward)
    with pytest.raises(ValueError, match="has a formula already"):
        formulas.register("relu", "forward", isru_forward)
