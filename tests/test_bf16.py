"""bfloat16: the shared bit conversions, every entry point, and the exhaustive check of every op on every
host backend that claims bfloat16 (computed in float32, rounded once to nearest even; see multiact.dtypes).

The default run judges a fixed sample of the 65,536 patterns (every 13th, and every special value) for
every case; MULTIACT_TEST_FULL=1 judges all of them (`multiact check --dtype bfloat16` does the same on a
user's machine; the counts are in results/bf16-exhaustive.txt).
"""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from conftest import FULL, host_backends

import multiact as ma
from multiact import consistency as C
from multiact import dtypes as D
from multiact import registry

ml_dtypes = pytest.importorskip("ml_dtypes")
BF = np.dtype(ml_dtypes.bfloat16)
ALL = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def _boundary_f32() -> np.ndarray:
    """Every bfloat16 pattern's float32 with low halves at the rounding boundaries (ties, +-1 around them)."""
    lows = np.array([0, 1, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF], dtype=np.uint32)
    return ((ALL.astype(np.uint32) << 16)[:, None] | lows[None, :]).reshape(-1).view(np.float32)


def test_importing_multiact_does_not_import_ml_dtypes():
    code = ("import sys, multiact; assert 'ml_dtypes' not in sys.modules; "
            "t = multiact.dtypes.bfloat16; assert 'ml_dtypes' in sys.modules and t.__name__ == 'bfloat16'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_widening_is_exact_on_every_pattern():
    f = D.bf16_bits_to_f32(ALL)
    assert np.array_equal(f.view(np.uint32), ALL.astype(np.uint32) << 16)
    assert np.array_equal(f.view(np.uint32), ALL.view(BF).astype(np.float32).view(np.uint32))  # ml_dtypes agrees


def test_store_rounds_to_nearest_even_and_keeps_nan_quiet():
    f = _boundary_f32()
    with np.errstate(invalid="ignore"):
        got, theirs = D.f32_bits_to_bf16(f), f.astype(BF).view(np.uint16)
    nan = np.isnan(f)
    # ml_dtypes' float32 cast is round-to-nearest-even too (an independent oracle off NaN), but it makes
    # every NaN 0x7fc0 / 0xffc0; ours keeps the payload's high bits and the sign and sets the quiet bit
    assert np.array_equal(got[~nan], theirs[~nan])
    u = f.view(np.uint32)
    assert np.all((got[nan] & 0x7FC0) == 0x7FC0)
    assert np.array_equal(got[nan] >> 15, (u[nan] >> 31).astype(np.uint16))
    big = np.array([3.3895313e38, 3.3961776e38, 3.4028235e38, -3.4028235e38, np.inf], np.float32)
    assert [hex(v) for v in D.f32_bits_to_bf16(big)] == ["0x7f7f", "0x7f80", "0x7f80", "0xff80", "0x7f80"]


def test_float64_rounds_once():
    """f64 -> bf16 against exact rational rounding, at midpoints and next to them (double rounding through
    float32 goes wrong exactly there: ml_dtypes' float64 cast does)."""
    grid = D.bf16_bits_to_f32(np.arange(0, 0x7F80, 127, dtype=np.uint16)).astype(np.float64)
    mids = grid * (1 + 2.0 ** -8)
    xs = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), -mids,
                         [3.3961775292304e38, 3.39617753e38, 1e39, 1e-46, 0.0, -0.0]])
    allb = D.bf16_bits_to_f32(np.arange(0, 0x7F80, dtype=np.uint16)).astype(np.float64)
    over = 2 * Fraction(allb[-1]) - Fraction(allb[-2])  # where 0x7f80 (inf) would be: the overflow threshold
    got = D.f64_to_bf16_bits(xs)
    for x, g in zip(xs.tolist(), got.tolist(), strict=True):
        a = Fraction(abs(x))
        i = int(np.searchsorted(allb, abs(x)))
        hi_v = over if i == allb.size else Fraction(allb[i])
        if a == hi_v:
            want = i
        elif a > hi_v:
            want = 0x7F80  # beyond the overflow threshold
        else:
            lo, hi = a - Fraction(allb[i - 1]), hi_v - a
            want = i - 1 if lo < hi or (lo == hi and (i - 1) % 2 == 0) else i
        assert g == want | (0x8000 if np.signbit(x) else 0), (x, hex(g), hex(want))


def test_numba_conversions_are_the_shared_ones():
    if not registry.availability("numba")[0]:
        pytest.skip("numba is not available")
    from multiact.backend import numba_backend

    widen, store = numba_backend.bf16_codec()
    bits = np.empty(ALL.size, np.uint32)
    widen(numba_backend._ro(ALL), bits)
    assert np.array_equal(bits, D.bf16_bits_to_f32(ALL).view(np.uint32))
    f = _boundary_f32()
    out = np.empty(f.size, np.uint16)
    store(numba_backend._ro(f.view(np.uint32)), out)
    assert np.array_equal(out, D.f32_bits_to_bf16(f))


# ---- every entry point ------------------------------------------------------------------------------


def test_numpy_arrays_in_and_out_cold_and_warm():
    x = np.linspace(-3, 3, 301).astype(BF)
    dy = np.linspace(1, 2, 301).astype(BF)
    for _ in range(2):  # the first call takes the checked path, the second the cached one
        y = ma.gelu(x)
        assert y.dtype == BF and y.shape == x.shape and type(y) is np.ndarray
        g = ma.sigmoid_grad(dy, y=ma.sigmoid(x))
        assert g.dtype == BF
        out = np.empty_like(x)
        assert ma.gelu(x, out=out) is out and np.array_equal(out.view(np.uint16), y.view(np.uint16))
        with pytest.raises(TypeError, match=r"gelu\(\): out has dtype float32, expected bfloat16"):
            ma.gelu(x, out=np.empty(x.shape, np.float32))
        with pytest.raises(ValueError, match="out has shape"):
            ma.gelu(x, out=np.empty(5, BF))
        ro = np.empty_like(x)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="out is read-only"):
            ma.gelu(x, out=ro)
        with pytest.raises(TypeError, match="dy has dtype float32 but x has bfloat16|x has dtype"):
            ma.gelu_grad(dy.astype(np.float32), x)
        with pytest.raises(ValueError, match="overlaps"):
            big = np.zeros(400, BF)
            ma.gelu(big[:301], out=big[1:302])
    want = D.from_float32(np.asarray(ma.gelu(D.to_float32(x), backend="numpy")))
    assert np.array_equal(ma.gelu(x, backend="numpy").view(np.uint16), want.view(np.uint16))


def test_in_place_strided_and_empty():
    x = np.linspace(-3, 3, 64).astype(BF).reshape(8, 8)
    want = ma.silu(x).view(np.uint16)
    t = x.T.copy().T  # Fortran order
    assert np.array_equal(ma.silu(t).view(np.uint16), want)
    assert np.array_equal(ma.silu(x[:, ::2]).view(np.uint16), want[:, ::2])
    inplace = x.copy()
    assert ma.silu(inplace, out=inplace) is inplace and np.array_equal(inplace.view(np.uint16), want)
    assert ma.silu(np.empty((0, 3), BF)).shape == (0, 3)


def test_error_message_names_bfloat16():
    with pytest.raises(TypeError, match=r"relu\(\): x must have a float16, bfloat16, float32 or float64 dtype"):
        ma.relu(np.arange(3))


def test_parameter_gradients_accumulate_in_float64_and_round_once():
    x = C.bf16_all()[:0x7F80]  # positive finite values (and +0)
    dy = C.bf16_dy(x.size)
    got = ma.swish_beta_grad(dy, x, beta=1.25)
    ref = C.reference(ma.ops()["swish"], "param_grad", {"beta": 1.25}, np.float32, D.to_float32(dy),
                      D.to_float32(x))
    assert np.asarray(got).dtype == BF
    assert np.asarray(got).view(np.uint16) == D.f64_to_bf16_bits(ref)


def test_explain_names_the_bfloat16_kernel():
    x = np.ones(3, BF)
    text = ma.explain("gelu", x)
    assert "NumPy bfloat16 arrays" in text
    assert "onnxruntime" not in text.splitlines()[0]


# ---- the exhaustive check ------------------------------------------------------------------------------


def _sample() -> np.ndarray:
    """Every 13th pattern, and every special one: +-0, +-inf, NaNs, the largest, the subnormal edges."""
    special = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7F7F, 0xFF7F, 0x0001, 0x8001,
               0x007F, 0x0080, 0x8080]
    idx = np.union1d(np.arange(0, 1 << 16, 13), special)
    idx = idx[: idx.size - idx.size % 4]  # prelu takes it as (n, 4)
    return C.bf16_all()[idx]


_REFS: dict = {}


@pytest.mark.parametrize("backend", host_backends())
def test_every_op_exhaustively(backend):
    """Every op x parameter case x direction (y-forms, parameter gradients) the backend claims for bfloat16:
    equal to the float64 reference rounded once, or one ulp from it (counted, within the op's share)."""
    x = None if FULL else _sample()
    mod = registry.module(backend)
    failures, ran = [], 0
    for op, params, direction in C.bf16_cases():
        if not mod.supports(C.bf16_key(op, params), direction, "bfloat16"):
            continue
        ran += 1
        v = C.run_bf16_case(backend, op, params, direction, x=x, cache=_REFS)
        if not v.passed:
            failures.append(v.describe())
    if not ran:
        pytest.skip(f"{backend} claims no bfloat16 kernel (the registry falls through to the next backend)")
    assert not failures, "\n".join(failures)


def test_a_backend_without_bfloat16_is_passed_over():
    """onnxruntime has no bfloat16 arithmetic on the CPU: it claims none, so a preference for it falls
    through (and an explicit backend= says why)."""
    mod = registry.module("onnxruntime")
    assert not any(mod.supports(C.bf16_key(op, p), d, "bfloat16") for op, p, d in C.bf16_cases())
    x = np.ones(4, BF)
    if registry.availability("onnxruntime")[0]:
        with ma.use("onnxruntime"):
            assert ma.relu(x).dtype == BF
        with pytest.raises(ma.BackendError, match="has no relu forward kernel for bfloat16"):
            ma.relu(x, backend="onnxruntime")


def test_composites_on_every_host_backend():
    """glu/swiglu/... and bias_act in bfloat16 through the shared suites (a few cases per backend)."""
    for info in ma.backends():
        if not info.available or "numpy" not in info.kinds:
            continue
        mod = registry.module(info.name)
        # keys the rest of the suite compiles anyway on a compiled-per-key backend (conftest.composite_sample)
        for op, p in [c for c in C.gated_cases() if c[0] == "swiglu"][:2]:
            if mod.supports("gated:silu", "forward", "bfloat16"):
                assert not C.gated_failures(info.name, op, p, BF), (info.name, op, p)
        for p in [c for c in C.bias_act_cases() if c["act"] in ("relu", "linear")][:2]:
            if mod.supports(f"bias_act:{p['act']}", "forward", "bfloat16"):
                assert not C.bias_act_failures(info.name, p, BF), (info.name, p)
