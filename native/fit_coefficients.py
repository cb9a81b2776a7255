"""Fit the polynomial coefficients used by native/src/ma_math.h and print their float32 errors.

Run by hand (`python native/fit_coefficients.py`); the printed coefficients are pasted into
ma_math.h.  Each fit is a weighted least-squares fit on Chebyshev nodes against mpmath at 40
digits (close to minimax), rounded to float32; the error reported is measured by evaluating
the float32 polynomial (Horner, float32 arithmetic) on a dense grid against mpmath.
"""

from __future__ import annotations

import mpmath as mp
import numpy as np

mp.mp.dps = 40


def nodes(a: float, b: float, n: int = 1500) -> np.ndarray:
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos(np.pi * (k + 0.5) / n)


def fit(f, a, b, deg, rel=True, var=lambda x: x):
    """Coefficients c0..cdeg of p(var(x)) ~ f(x) on [a, b]."""
    xs = nodes(a, b)
    ys = np.array([float(f(mp.mpf(float(x)))) for x in xs])
    v = var(xs)
    A = np.vander(v, deg + 1, increasing=True)
    w = 1 / np.abs(ys) if rel else np.ones_like(ys)
    c, *_ = np.linalg.lstsq(A * w[:, None], ys * w, rcond=None)
    return c.astype(np.float32)


def horner32(c, v):
    v = v.astype(np.float32)
    acc = np.full_like(v, c[-1])
    for ck in c[-2::-1]:
        acc = acc * v + np.float32(ck)
    return acc


def report(name, c):
    print(f"{name}: " + ", ".join(f"{float(x):.9e}f" for x in c))


def main() -> None:
    # e^r - 1 = r + r^2 P(r), |r| <= 0.3466 (+ margin for non-FMA rounding of n).
    P = fit(lambda r: (mp.expm1(r) - r) / r**2 if r != 0 else mp.mpf(0.5), -0.36, 0.36, 4)
    report("expm1 P", P)
    r = np.linspace(-0.36, 0.36, 200001).astype(np.float32)
    got = r + r * r * horner32(P, r)
    ref = np.array([float(mp.expm1(mp.mpf(float(x)))) for x in r[::50]])
    err = np.abs(got[::50].astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32))
    print("  expm1(r) max err ulp", err.max())

    # log1p(u) = 2 atanh(s), s = u / (2 + u) in [0, 1/3]: 2s + s^3 R(s^2)
    R = fit(lambda s: (2 * mp.atanh(s) - 2 * s) / s**3 if s != 0 else mp.mpf(2) / 3, 1e-6, 0.34, 4, var=lambda s: s * s)
    report("log1p R", R)
    u = np.linspace(0, 1, 20001).astype(np.float32)
    s = u / (np.float32(2) + u)
    got = 2 * s + s * s * s * horner32(R, s * s)
    ref = np.array([float(mp.log1p(mp.mpf(float(v)))) for v in u])
    print("  log1p max err ulp", (np.abs(got - ref)[1:] / np.spacing(ref[1:].astype(np.float32))).max())

    # x - tanh(x) = x^3 T(x^2), |x| < 1
    T = fit(lambda x: (x - mp.tanh(x)) / x**3 if x != 0 else mp.mpf(1) / 3, 1e-6, 1.0, 10, var=lambda x: x * x)
    report("tanhshrink T", T)
    x = np.linspace(1e-3, 1, 20001).astype(np.float32)
    got = x * x * x * horner32(T, x * x)
    ref = np.array([float(mp.mpf(float(v)) - mp.tanh(mp.mpf(float(v)))) for v in x])
    print("  tanhshrink max err ulp", (np.abs(got - ref) / np.spacing(ref.astype(np.float32))).max())

    # erfc(x) = exp(-x^2) g(t) / (1 + 2x), t = (x - 2) / (x + 2), x in [0, 10.1]
    def g_of_t(t):
        xx = 2 * (1 + t) / (1 - t)
        return mp.erfc(xx) * mp.exp(xx * xx) * (1 + 2 * xx)

    G = fit(g_of_t, -1.0, 0.67, 14)
    report("erfc G", G)
    x = np.linspace(0, 10.0, 20001).astype(np.float32)
    t = (x - np.float32(2)) / (x + np.float32(2))
    gv = horner32(G, t)
    got = np.exp(-(x.astype(np.float64) ** 2)) * gv / (1 + 2 * x.astype(np.float64))
    ref = np.array([float(mp.erfc(mp.mpf(float(v)))) for v in x])
    print("  erfc (exact exp) max rel err in float32 ulps", (np.abs(got - ref) / ref / 2**-24).max())

    # The fast paths' G (gelu with |x| <= 12, so a = |x| / sqrt2 <= 8.49): degree 9 is enough there.
    G9 = fit(g_of_t, -1.0, (8.49 - 2) / (8.49 + 2), 9)
    report("erfc G fast", G9)
    x = np.linspace(0, 8.49, 20001).astype(np.float32)
    t = (x - np.float32(2)) / (x + np.float32(2))
    got = np.exp(-(x.astype(np.float64) ** 2)) * horner32(G9, t) / (1 + 2 * x.astype(np.float64))
    ref = np.array([float(mp.erfc(mp.mpf(float(v)))) for v in x])
    print("  erfc fast (exact exp) max rel err in float32 ulps", (np.abs(got - ref) / ref / 2**-24).max())


if __name__ == "__main__":
    main()
