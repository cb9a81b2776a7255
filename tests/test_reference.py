"""The float64 references themselves: backward against central differences, limits at +-inf."""

from __future__ import annotations

import numpy as np
import pytest

from multiact import consistency as C
from multiact.optable import OPS


def _away_from_kinks(spec, p, x):
    kinks = np.array(spec.kinks(p) or [np.inf])
    return x[np.min(np.abs(x[:, None] - kinks[None, :]), axis=1) > 1e-3]


@pytest.mark.parametrize("op", [op for op in OPS if op != "prelu"])
def test_backward_is_the_derivative(op):
    spec = OPS[op]
    x = np.linspace(-8, 8, 1601) + 1e-3 / 7
    for params in C.param_cases(spec):
        p = spec.validate(params)
        xs = _away_from_kinks(spec, p, x)
        h = 1e-6 * np.maximum(1, np.abs(xs))
        fd = (spec.forward(xs + h, **p) - spec.forward(xs - h, **p)) / (2 * h)
        got = spec.backward(np.ones_like(xs), xs, **p)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8, err_msg=f"{op} {params}")
        if spec.supports_y(p):
            y = spec.forward(xs, **p)
            np.testing.assert_allclose(spec.backward_y(np.ones_like(xs), y, **p), got, rtol=1e-9, atol=1e-12)


def test_swish_beta_grad_is_the_derivative():
    spec = OPS["swish"]
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal(1000) * 3, rng.standard_normal(1000)
    for beta in (1.0, 1.3, -0.7, 0.0):
        h = 1e-6
        fd = (np.sum(dy * spec.forward(x, beta + h)) - np.sum(dy * spec.forward(x, beta - h))) / (2 * h)
        assert np.isclose(spec.param_grad[1](dy, x, beta), fd, rtol=1e-6, atol=1e-8)


def test_prelu_weight_grad_is_the_derivative():
    spec = OPS["prelu"]
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 3, 5))
    w = np.array([0.1, -0.2, 0.5])
    got = spec.param_grad[1](dy, x, w.reshape(1, 3, 1), 1)
    for c in range(3):
        e = np.zeros(3)
        e[c] = 1e-6
        up = np.sum(dy * spec.forward(x, (w + e).reshape(1, 3, 1), 1))
        down = np.sum(dy * spec.forward(x, (w - e).reshape(1, 3, 1), 1))
        assert np.isclose(got.reshape(-1)[c], (up - down) / 2e-6, rtol=1e-6)


# The limits at +-inf that a formula would turn into inf*0 = NaN.
LIMITS = {
    ("gelu", "forward"): (np.inf, 0.0), ("gelu", "backward"): (1.0, 0.0),
    ("silu", "forward"): (np.inf, 0.0), ("silu", "backward"): (1.0, 0.0),
    ("fast_gelu", "backward"): (1.0, 0.0), ("mish", "forward"): (np.inf, 0.0), ("mish", "backward"): (1.0, 0.0),
    ("softsign", "forward"): (1.0, -1.0), ("softsign", "backward"): (0.0, 0.0),
    ("sigmoid", "backward"): (0.0, 0.0), ("tanh", "backward"): (0.0, 0.0), ("logsigmoid", "forward"): (0.0, -np.inf),
    ("softplus", "forward"): (np.inf, 0.0), ("hardswish", "forward"): (np.inf, 0.0), ("elu", "forward"): (np.inf, -1.0),
}


@pytest.mark.parametrize("op,direction", list(LIMITS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_limits_at_infinity(op, direction, dtype):
    spec = OPS[op]
    x = np.array([np.inf, -np.inf], dtype=dtype)
    p = spec.validate({})
    got = spec.forward(x, **p) if direction == "forward" else spec.backward(np.ones_like(x), x, **p)
    np.testing.assert_array_equal(got, np.array(LIMITS[op, direction], dtype=dtype))


def test_gelu_tanh_grad_at_huge_inputs_is_dy():
    spec = OPS["gelu"]
    for dtype in ("float32", "float64"):
        x = np.array([1e30, 3e38], dtype=dtype)
        np.testing.assert_array_equal(spec.backward(np.full(2, 2.5, dtype), x, "tanh"), [2.5, 2.5])


def test_references_raise_no_floating_point_warnings():
    import warnings

    x = np.concatenate([C.specials(np.float64), np.linspace(-1000, 1000, 101)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for op, spec in OPS.items():
            if op == "prelu":
                continue
            for params in C.param_cases(spec):
                p = spec.validate(params)
                spec.forward(x, **p)
                spec.backward(np.ones_like(x), x, **p)


@pytest.mark.parametrize("op", [op for op in OPS if op != "prelu"])
def test_kink_conventions_are_pytorchs(op):
    """At each kink (and its float64 neighbours) the reference's derivative is the one PyTorch's autograd uses."""
    pytest.importorskip("torch")
    from multiact.cli import peers

    spec = OPS[op]
    for params in C.param_cases(spec):
        p = spec.validate(params)
        ks = np.array(spec.kinks(p) or [0.0], dtype=np.float64)
        x = np.concatenate([ks, np.nextafter(ks, np.inf), np.nextafter(ks, -np.inf), [-2.5, 0.5, 4.0]])
        dy = np.linspace(0.5, 1.5, x.size)
        out = np.empty_like(x)
        bound = peers.make("torch", op, "backward", p, (dy, x), out, 1)
        if isinstance(bound, str) or op in ("sigmoid", "tanh"):
            continue  # no torch peer, or torch's backward starts from y (no kinks there anyway)
        want = np.asarray(bound.alloc())
        # torch's softplus_backward takes exp(beta * x) before its threshold test: NaN (inf / inf)
        # once beta * x > 709 below a large threshold.  An overflow of torch's, not a convention.
        keep = ~(np.isnan(want) & (op == "softplus") & (p.get("beta", 1.0) * x > 709))
        # Loose enough for torch's own roundings (its float64 hardsigmoid_backward uses a float32 1/6,
        # its gelu/silu cancel near their zero crossing), tight enough to tell a kink's piece apart.
        np.testing.assert_allclose(spec.backward(dy, x, **p)[keep], want[keep], rtol=1e-7, atol=1e-14,
                                   err_msg=f"{op} {params}")


@pytest.mark.parametrize("op", [op for op in OPS if op != "prelu"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_zero_signs_are_pytorchs(op, direction):
    """Where a result is zero at x = +-0 (or dy = +-0) the reference has PyTorch's sign.

    64 float64 elements: torch's vectorised CPU loop (its scalar tail differs for softshrink,
    x * 0 there, and its float32 vector body for gelu, +0 at -0 there; see reference.py).
    """
    pytest.importorskip("torch")
    from multiact.cli import peers

    x0, dy0 = C.zero_pairs(np.float64)
    x, dy = np.resize(x0, 64), np.resize(dy0, 64)
    arrays = (x,) if direction == "forward" else (dy, x)
    for params in C.param_cases(OPS[op]):
        p = OPS[op].validate(params)
        bound = peers.make("torch", op, direction, p, arrays, np.empty_like(x), 1)
        if isinstance(bound, str):
            continue  # no torch kernel: a composite in torch (softsign, tanhshrink backward: dy * f'(x))
        want = np.asarray(bound.alloc())
        fn = OPS[op].forward if direction == "forward" else OPS[op].backward
        got = fn(*arrays, **p)
        bad = (want == 0) & ((got != 0) | (np.signbit(got) != np.signbit(want)))
        rows = [f"x={float(x[i])!r} dy={float(dy[i])!r}: torch {float(want[i])!r}, reference {float(got[i])!r}"
                for i in np.flatnonzero(bad)[:8]]
        assert not rows, f"{op} {params} {direction}:\n" + "\n".join(rows)
