"""The public functions are generated from the op table, with real signatures and docs."""

from __future__ import annotations

import inspect
import tracemalloc

import numpy as np
import pytest

import multiact as ma
from multiact.optable import OPS, REQUIRED


@pytest.mark.parametrize("op", list(OPS))
def test_every_op_has_forward_and_grad_with_its_parameters(op):
    spec = OPS[op]
    fwd, grad = getattr(ma, op), getattr(ma, f"{op}_grad")
    fsig = inspect.signature(fwd)
    assert list(fsig.parameters)[: 1 + len(spec.params)] == ["x", *spec.param_names]
    for p in spec.params:
        want = inspect.Parameter.empty if p.default is REQUIRED else p.default
        assert fsig.parameters[p.name].default == want
        assert p.name in fwd.__doc__
    gsig = inspect.signature(grad)
    assert list(gsig.parameters)[:2] == ["dy", "x"]
    # every backward takes y=, so that an op whose derivative needs x can say so (a YFormError)
    assert gsig.parameters["y"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ("Pass y=" in grad.__doc__) == (spec.backward_y is not None)
    assert {"out", "backend"} <= set(fsig.parameters) and {"out", "backend"} <= set(gsig.parameters)
    if spec.param_grad:
        assert callable(getattr(ma, f"{op}_{spec.param_grad[0]}_grad"))


def test_all_lists_every_generated_function():
    names = {n for op, s in OPS.items() for n in (op, f"{op}_grad")}
    names |= {f"{op}_{s.param_grad[0]}_grad" for op, s in OPS.items() if s.param_grad}
    assert names <= set(ma.__all__)
    assert len(OPS) == 24


def test_generic_forms_match_named_functions():
    x = np.linspace(-3, 3, 50, dtype=np.float32)
    np.testing.assert_array_equal(ma.forward("gelu", x, approximate="tanh"), ma.gelu(x, approximate="tanh"))
    np.testing.assert_array_equal(ma.backward("leaky_relu", x, x, negative_slope=0.2), ma.leaky_relu_grad(x, x, 0.2))
    assert ma.param_grad("swish", "beta", x, x, beta=1.3) == ma.swish_beta_grad(x, x, 1.3)


def test_examples_of_the_issue():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    y = ma.leaky_relu(x, 0.2)
    assert y.dtype == np.float32 and y.shape == x.shape
    dx = ma.leaky_relu_grad(np.ones_like(x), x, 0.2)
    assert set(np.unique(dx)) <= {np.float32(1), np.float32(0.2)}
    dy = np.ones_like(x)
    np.testing.assert_allclose(ma.sigmoid_grad(dy, y=ma.sigmoid(x)), ma.sigmoid_grad(dy, x), rtol=1e-5, atol=1e-7)
    assert isinstance(ma.swish_beta_grad(dy, x, beta=1.3), np.float32)


@pytest.mark.parametrize("op", ["gelu", "mish", "relu", "swish"])
def test_in_place_allocates_nothing_result_sized(op):
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)  # 16 MiB
    dy = np.ones_like(x)
    ma.forward(op, x, out=x)  # warm caches and compile
    ma.backward(op, dy, x, out=dy)
    tracemalloc.start()
    ma.forward(op, x, out=x)
    ma.backward(op, dy, x, out=dy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < x.nbytes // 4, f"{op} in place peaked at {peak} bytes"


def test_backends_state_whether_their_threads_follow_the_callers_denormal_mode():
    """Issue 44 item 4: numba's and ONNX Runtime's threads take the caller's FTZ/DAZ mode (tests/test_fp_mode.py);
    ma.backends() says how."""
    for b in ma.backends():
        if b.available and b.name in ("numba", "onnxruntime"):
            assert "caller's flush-to-zero" in b.details["fp_mode"], b.name
