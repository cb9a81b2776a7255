"""The worked example of adding an op (CONTRIBUTING.md): one definition and its float64 references,
through the public extension point, and nothing else; the numpy backend runs it from its references,
the other backends fall through, and the shared suite holds it to its reference."""

from __future__ import annotations

import numpy as np
import pytest

import multiact as ma
from multiact import api, consistency, registry
from multiact._opdefs import OpDef, Param
from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS, OPS, Tolerance


def _isru(x, alpha):
    """Inverse square root unit, x / sqrt(1 + alpha x^2): the throwaway op's reference."""
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.asarray(x, dtype=np.float64)
        big = np.abs(x) > 1e150  # alpha * x^2 would overflow: the limit sign(x) / sqrt(alpha)
        safe = np.where(big, 1.0, x)
        y = safe / np.sqrt(1.0 + alpha * safe * safe)
        return np.where(big, np.sign(x) / np.sqrt(alpha), y)


def _isru_grad(dy, x, alpha):
    """d/dx: (1 + alpha x^2)^(-3/2), 0 at +-inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.asarray(x, dtype=np.float64)
        big = np.abs(x) > 1e100
        safe = np.where(big, 0.0, x)
        g = (1.0 + alpha * safe * safe) ** -1.5
        return np.asarray(dy, dtype=np.float64) * np.where(big, 0.0, g)


DEFN = OpDef(
    "isru_example", "Inverse square root unit (a worked example of adding an op).", "x / sqrt(1 + alpha x^2)",
    (Param("alpha", 1.0, lo=0, lo_open=True),), cases=({"alpha": 0.25},),
)


@pytest.fixture
def isru():
    """Register the op for one test, and take it out again (every trace of it) afterwards."""
    spec = ma.register_op(DEFN, forward=_isru, backward=_isru_grad, tol=Tolerance(ulp32=2, ulp64=4))
    yield spec
    names = [n for n in api.FUNCTIONS if n == DEFN.name or n.startswith(DEFN.name + "_")]
    for n in names:
        del api.FUNCTIONS[n]
        delattr(ma, n)
        ma.__all__.remove(n)
    del OPS[DEFN.name]
    for k in DEFN.keys:
        del KEYS[k]
    for table in (FAMILY_KEYS, BIAS_ACT_KEYS):  # its gated:<key> and bias_act:<key> kernels
        for k in [k for k, (_, s, _) in table.items() if s is spec]:
            del table[k]
    registry.clear_cache()


def test_one_definition_gives_the_public_functions(isru):
    x = np.linspace(-4, 4, 33)
    np.testing.assert_allclose(ma.isru_example(x), x / np.sqrt(1 + x * x), rtol=1e-15)
    np.testing.assert_allclose(ma.isru_example(x, 0.25), x / np.sqrt(1 + 0.25 * x * x), rtol=1e-15)
    np.testing.assert_allclose(ma.isru_example_grad(np.ones_like(x), x), (1 + x * x) ** -1.5, rtol=1e-14)
    assert "alpha" in ma.isru_example.__doc__ and "isru_example" in ma.ops()
    np.testing.assert_array_equal(ma.forward("isru_example", x, alpha=0.5), ma.isru_example(x, 0.5))


def test_backends_without_its_kernels_fall_through_to_numpy(isru):
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    assert "-> numpy" in ma.explain("isru_example", x)
    for b in ("native", "numba"):
        with pytest.raises(ma.BackendError, match=f"backend '{b}'.*has no isru_example forward kernel"):
            ma.isru_example(x, backend=b)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_the_shared_suite_holds_it_to_its_reference(isru, dtype):
    for params in consistency.param_cases(isru):
        assert not consistency.case_failures("numpy", DEFN.name, params, dtype), params


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
    np.testing.assert_allclose(ma.glu(x, act="isru_example", activate="first", alpha=0.25),
                               _isru(a, 0.25) * b, rtol=1e-15)
    assert not consistency.gated_failures("numpy", "glu", {"act": "isru_example", "alpha": 0.25}, dtype)
    assert not consistency.gated_failures("numpy", "glu", {"act": "isru_example", "up": True}, dtype)
