"""The float32 building blocks of multiact/backend/formulas.py that replaced its float64 steps (issue 22).

The float32 formulas carry a product, a quotient or an exponential tail as an error-free pair of float32
numbers; these check the pieces exactly (with fractions), on the plain-Python build that the CUDA simulator
runs: the simulator's fused multiply-add must round once, as the GPU's does, or the simulated accuracy would
not be the GPU's.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from multiact.backend import formulas as F

F32 = np.float32


def _nearest_f32(q: Fraction) -> np.float32:
    """q rounded to float32, to nearest, ties to even (no double rounding: the neighbours are compared exactly)."""
    guess = np.float32(float(q))
    cands = [np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf))]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - q), int(np.array(c).view(np.int32)) & 1))
    return best


def _operands(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 triples, with c close to -a*b (where a rounding of the product first would show) a third of the time."""
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(F32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(F32)
    c = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(F32)
    near = rng.random(n) < 1 / 3
    c[near] = (-(a[near].astype(np.float64) * b[near]) * (1 + rng.standard_normal(near.sum()) * 1e-7)).astype(F32)
    return np.stack([a, b, c], axis=1)


def test_the_simulators_fma_rounds_once():
    rng = np.random.default_rng(22)
    for a, b, c in _operands(rng, 3000):
        got = F._fma_numpy(a, b, c)
        want = _nearest_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))
        assert type(got) is F32 and got == want, (a, b, c, got, want)
    # a case where rounding through float64 twice goes wrong: a*b + c lies just past a float32 midpoint
    a, b = F32(1 + 2**-12), F32(1 + 2**-12)  # a*b = 1 + 2^-11 + 2^-24: a float32 midpoint plus 0
    c = F32(2.0**-60)  # just above the midpoint: rounds up (through float64, the sum is the midpoint: even, down)
    want = F32(1 + 2**-11 + 2**-23)
    assert F._fma_numpy(a, b, c) == _nearest_f32(Fraction(float(a)) ** 2 + Fraction(float(c))) == want
    assert F32(np.float64(a) * np.float64(b) + np.float64(c)) != want


def test_error_free_pairs_are_exact():
    ns = F.python(F32)
    rng = np.random.default_rng(7)
    for a, b, _ in _operands(rng, 2000):
        p, e = ns.two_prod(a, b)
        assert type(p) is F32 and type(e) is F32
        assert Fraction(float(p)) + Fraction(float(e)) == Fraction(float(a)) * Fraction(float(b)), (a, b)
        s, t = ns.two_sum(a, b)
        assert Fraction(float(s)) + Fraction(float(t)) == Fraction(float(a)) + Fraction(float(b)), (a, b)
        if b != 0:
            hi, lo = ns.div_hl(a, b)  # hi + lo = a / b to about 2^-48 (lo is the remainder's quotient, rounded)
            if abs(hi) < 1e5:
                err = Fraction(float(hi)) + Fraction(float(lo)) - Fraction(float(a)) / Fraction(float(b))
                assert abs(err) <= abs(Fraction(float(a)) / Fraction(float(b))) * Fraction(1, 2**46), (a, b)


def test_scaled_exponential_tail_is_relatively_accurate():
    """expk_hl carries e^u below -80 times 2^64, so x e^u is accurate where e^u alone is subnormal."""
    ns = F.python(F32)
    for u in np.linspace(-103.0, -79.0, 97).astype(F32):
        ek, sc = ns.expk_hl(u, F32(0.0))
        assert type(ek) is F32 and type(sc) is F32
        want = np.exp(np.float64(u))
        got = np.float64(ek) * np.float64(sc)
        assert abs(got - want) <= 3 * 2.0**-24 * want, (u, got, want)  # about float32's normal-range accuracy
    assert ns.expk_hl(F32(-np.inf), F32(0.0))[0] == 0 and np.isnan(ns.expk_hl(F32(np.nan), F32(0.0))[0])


def test_the_numba_cpu_fma_rounds_once():
    """numba_math.cpu()'s fma (llvm.fma.f32, what the CPU build's two_prod uses) against exact fractions, and
    the double-rounding case above, compiled in a loop."""
    from numba import njit

    from multiact.backend import numba_math as NM

    fma = NM.cpu().fma

    @njit
    def run(ops, out):
        for i in range(ops.shape[0]):
            out[i] = fma(ops[i, 0], ops[i, 1], ops[i, 2])

    ops = _operands(np.random.default_rng(23), 1000)
    ops = np.concatenate([ops, np.array([[1 + 2**-12, 1 + 2**-12, 2.0**-60]], F32)])
    out = np.empty(ops.shape[0], F32)
    run(ops, out)
    for (a, b, c), got in zip(ops, out, strict=True):
        assert got == _nearest_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))), (a, b, c, got)
