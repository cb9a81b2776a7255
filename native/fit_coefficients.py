"""Every polynomial and constant table of the two float32 math libraries: fitted (or carried), measured, written.

    python native/fit_coefficients.py           # fit, measure, write the two files below (about 10 s)
    python native/fit_coefficients.py --check   # the same in memory; exit status 1 if a file on disk differs

writes
    native/src/ma_coeffs.h      the native library's tables (included by ma_math.h; ma_ops.h uses one)
    multiact/backend/_numba_coeffs.py   multiact/backend/numba_math.py's tables

Nothing in either file is typed by hand.  Each table says where its values come from and its maximum
error as measured here (against mpmath at 40 digits, on the dense grid named in the comment).  Values
are written exactly: C99 hex float literals in the header, shortest round-trip decimals in Python,
each with its bit pattern.

Fitted tables: weighted least squares (numpy lstsq) on Chebyshev nodes against mpmath, rounded to
float32; "relative to P" weights the residual by the fitted function itself, "relative to f" by the
function the polynomial serves (the numba tables).  A float32 coefficient is as stable as its distance
from a rounding tie, which is stated (in float32 ulps) with each fit.  Carried tables are inputs: the
values in use before this script existed, whose fit was not recorded and cannot be reproduced to the
bit (float64 coefficients of ill-conditioned fits; a refit moves the last digits), kept verbatim.

Every file written carries the sha256 of this script (its inputs: specifications, carried values,
the fitting and measuring code) and of its own text; tests/test_coefficients.py checks both, and
refits every fitted table (fast) to check its bits.  Editing this script therefore means rerunning it.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
C_HEADER = "native/src/ma_coeffs.h"
PY_MODULE = "multiact/backend/_numba_coeffs.py"
NODES = 1500
DPS = 40

F32 = np.float32


def _mp():
    import mpmath

    mpmath.mp.dps = DPS
    return mpmath


# ---- fitting --------------------------------------------------------------------------------------


def nodes(a: float, b: float, n: int = NODES) -> np.ndarray:
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos(np.pi * (k + 0.5) / n)


def fit(f, a, b, deg, var=lambda x: x, mult=None, base=None, n=NODES):
    """float64 coefficients c0..cdeg.

    mult is None: p(var(x)) ~ f(x), residual relative to f (the polynomial is the whole function).
    otherwise:    base(x) + mult(x) p(var(x)) ~ f(x), residual relative to f.
    """
    mp = _mp()
    xs = nodes(a, b, n)
    ys = np.array([float(f(mp.mpf(float(x)))) for x in xs])
    A = np.vander(var(xs), deg + 1, increasing=True)
    w = 1 / np.abs(ys)
    if mult is None:
        target = ys
    else:
        A = A * mult(xs)[:, None]
        target = ys - base(xs)
    c, *_ = np.linalg.lstsq(A * w[:, None], target * w, rcond=None)
    return c


def tie_margin(c64: np.ndarray) -> float:
    """How far (in float32 ulps) the closest coefficient lies from a float32 rounding tie."""
    c32 = c64.astype(np.float32)
    frac = np.abs(c64 - c32.astype(np.float64)) / np.spacing(np.abs(c32)).astype(np.float64)
    return float((0.5 - frac).min())


def horner32(c, v):
    v = v.astype(np.float32)
    acc = np.full_like(v, c[-1])
    for ck in c[-2::-1]:
        acc = acc * v + np.float32(ck)
    return acc


def horner64(c, v):
    acc = np.full_like(v, float(c[-1]), dtype=np.float64)
    for ck in c[-2::-1]:
        acc = acc * v + float(ck)
    return acc


_REF: dict[tuple, np.ndarray] = {}


def ref(name: str, f, xs: np.ndarray) -> np.ndarray:
    """mpmath f at every point of xs, as float64 (cached: several tables share grids)."""
    key = (name, xs.dtype.str, xs.size, float(xs[0]), float(xs[-1]))
    if key not in _REF:
        mp = _mp()
        _REF[key] = np.array([float(f(mp, mp.mpf(float(v)))) for v in xs])
    return _REF[key]


def ulp_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    return float((np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)).max())


def rel_err(got, want) -> float:
    return float((np.abs(np.asarray(got, dtype=np.float64) - want) / np.abs(want)).max())


def _g_of_t(mp, t):
    """erfc(x) e^(x^2) (1 + 2x) at x = 2 (1 + t) / (1 - t)."""
    xx = 2 * (1 + t) / (1 - t)
    return mp.erfc(xx) * mp.exp(xx * xx) * (1 + 2 * xx)


def _f(g):
    """A function of one mpf from a function of (mpmath, mpf)."""
    return lambda x: g(_mp(), x)


# ---- the tables -----------------------------------------------------------------------------------


@dataclass
class Table:
    lib: str  # "native" (ma_coeffs.h) or "numba" (_numba_coeffs.py)
    names: tuple[str, ...]
    doc: str  # what the values are for (comment text)
    kind: str  # "f32" or "f64"
    source: str  # where the values come from (comment text)
    make: Callable[[], tuple[np.ndarray, str]]  # -> (values before scaling, extra note for the source line)
    measure: Callable[[np.ndarray], str]  # values -> the error statement
    scale: float = 1.0  # written values are scale * values (a power of two: checked exact)
    fitted: bool = True  # False: carried input or derived exactly
    array: str | None = None  # native: also #define this name as the values' initializer list, in order
    defines: tuple[tuple[str, float], ...] = ()  # native: constants that say where the table applies

    def values(self) -> tuple[np.ndarray, str]:
        v, note = self.make()
        v = np.asarray(v, dtype=np.float32 if self.kind == "f32" else np.float64)
        assert v.shape == (len(self.names),), (self.names, v.shape)
        return v, note


def _fitted32(*args, **kw):
    def make():
        c = fit(*args, **kw)
        return c.astype(np.float32), f"; closest rounding tie {tie_margin(c):.2g} ulp away"

    return make


def _given(*vals):
    return lambda: (np.array(vals), "")


def _names(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{k}" for k in range(n))


# --- native (ma_math.h / ma_ops.h)


def _ln2_split(bits: int):
    mp = _mp()
    ln2 = mp.log(2)
    hi = mp.nint(ln2 * 2**bits) / 2**bits  # ln 2 in [1/2, 1): `bits` significant bits
    return np.array([float(hi), float(ln2 - hi)]), ""


def _m_const(v, exact) -> str:
    mp = _mp()
    x = exact(mp)
    return f"error {float(abs(mp.mpf(float(v[0])) - x) / x):.2g} relative"


def _m_ln2(v):
    mp = _mp()
    hi, lo = (mp.mpf(float(x)) for x in v)
    nbits = len(bin(int(hi * 2**24)).rstrip("0")) - 2
    err = float(abs(hi + lo - mp.log(2)) / mp.log(2))
    return f"HI has {nbits} significant bits; |HI + LO - ln 2| / ln 2 = {err:.2g}"


def _m_em1(P):
    r = np.linspace(-0.36, 0.36, 200001).astype(np.float32)[::50]
    want = ref("expm1", lambda mp, v: mp.expm1(v), r)
    got = r + r * r * horner32(P, r)
    return f"max error {ulp_err(got, want):.3g} ulp of expm1(r) (float32 Horner, no FMA; {r.size} points)"


def _m_log1p(R):
    u = np.linspace(0, 1, 20001).astype(np.float32)
    s = u / (np.float32(2) + u)
    got = 2 * s + s * s * s * horner32(R, s * s)
    want = ref("log1p", lambda mp, v: mp.log1p(v), u)
    return (f"max error {ulp_err(got[1:], want[1:]):.3g} ulp of log1p(u) (float32, no FMA; {u.size - 1} points of "
            "(0, 1])")


def _m_tanhshrink(T):
    x = np.linspace(1e-3, 1, 20001).astype(np.float32)
    got = x * x * x * horner32(T, x * x)
    want = ref("x-tanh", lambda mp, v: v - mp.tanh(v), x)
    return f"max error {ulp_err(got, want):.3g} ulp of x - tanh(x) (float32, no FMA; {x.size} points of [1e-3, 1])"


def _m_erfc(G, hi):
    x = np.linspace(0, hi, 20001).astype(np.float32)
    t = (x - np.float32(2)) / (x + np.float32(2))
    got = np.exp(-(x.astype(np.float64) ** 2)) * horner32(G, t) / (1 + 2 * x.astype(np.float64))
    want = ref("erfc", lambda mp, v: mp.erfc(v), x)
    err = float((np.abs(got - want) / want / 2**-24).max())
    return (f"max error {err:.3g} float32 ulps (2^-24 relative) of erfc(x), x in [0, {hi}], with an exact exponential "
            f"(float32 t and Horner, no FMA; {x.size} points)")


def _mish_grad(mp, x):
    """mish'(x) = tanh(sp) + x sech^2(sp) sigmoid(x), sp = log(1 + e^x)."""
    t = mp.tanh(mp.log1p(mp.exp(x)))
    return t + x * (1 - t * t) / (1 + mp.exp(-x))


_MISH_MID = -0.52  # mish's backward takes the polynomial on (_MISH_MID, 0)


def _m_mish_grad(D):
    x = np.linspace(_MISH_MID, 0, 20001).astype(np.float32)
    want = ref("mish'", _mish_grad, x)
    return (f"max error {ulp_err(horner32(D, x), want):.3g} ulp of mish'(x) (float32 Horner, no FMA; {x.size} "
            f"points of [{_MISH_MID:g}, 0])")


def _cheb_mono(f, deg: int) -> np.ndarray:
    """float64 coefficients, in powers of s, of the degree-deg Chebyshev interpolant of f on s in [-1, 1]: the
    values at deg + 1 first-kind nodes, the series and its monomial form all in mpmath, so that a float64 table's
    only rounding is each coefficient's own (a float64 least squares would add its conditioning noise)."""
    mp = _mp()
    n = deg + 1
    th = [mp.pi * (k + mp.mpf(1) / 2) / n for k in range(n)]
    fs = [f(mp.cos(t)) for t in th]
    cheb = [2 * mp.fsum(fk * mp.cos(j * t) for fk, t in zip(fs, th, strict=True)) / n for j in range(n)]
    cheb[0] /= 2
    mono, t_prev, t_cur = [mp.mpf(0)] * n, [mp.mpf(0)] * n, [mp.mpf(1)] + [mp.mpf(0)] * (n - 1)  # T_-1, T_0
    t_prev[1] = mp.mpf(1)  # T_-1 = T_1 = s, so that T_1 = 2s T_0 - T_-1 (deg >= 1)
    for j in range(n):
        for i in range(n):
            mono[i] += cheb[j] * t_cur[i]
        t_prev, t_cur = t_cur, [2 * (t_cur[i - 1] if i else 0) - t_prev[i] for i in range(n)]
    return np.array([float(c) for c in mono])


def _erfcx(mp, a):
    return mp.erfc(a) * mp.exp(a * a)


# erfc(a) = e^(-a^2) erfcx(a) in float64 (ma_math64.h m64_erfc): erfcx on (lo, hi) as a polynomial in
# s = (a - OFF) / HALF (exact: a - OFF by Sterbenz on each piece, HALF a power of two), then the asymptotic series.
ERFCX64 = ((0.0, 2.0, 1.0, 1.0, 22), (2.0, 4.0, 3.0, 1.0, 18), (4.0, 8.0, 6.0, 2.0, 20))  # lo, hi, OFF, HALF, degree
assert all(p[1] == q[0] for p, q in pairwise(ERFCX64)) and ERFCX64[0][0] == 0.0  # (m64_erfcx reads the HIs)
ERFCX64_ASYM = 18  # terms of the asymptotic series, from the last piece's hi on
_ASYM_FROM = ERFCX64[-1][1]


def _fitted64_erfcx(off: float, half: float, deg: int):
    def make():
        return _cheb_mono(lambda s: _erfcx(_mp(), off + half * s), deg), ""

    return make


def _ulp64_err(got, want) -> float:
    return float((np.abs(np.asarray(got) - want) / np.spacing(np.abs(want))).max())


def _m_erfcx64(lo, hi, off, half):
    def measure(C):
        a = np.linspace(lo, hi, 20001)
        want = ref("erfcx64", _erfcx, a)
        return (f"max error {_ulp64_err(horner64(C, (a - off) / half), want):.3g} float64 ulps of erfcx(a), a in "
                f"[{lo:g}, {hi:g}] (float64 Horner, no FMA; {a.size} points)")

    return measure


def _asym_terms(n: int) -> np.ndarray:
    """(-1)^k (2k-1)!! / 2^k, k < n: erfcx(a) a sqrt(pi) = sum A_k / a^(2k)."""
    c, out = 1.0, []
    for k in range(n):
        out.append(c)
        c *= -(2 * k + 1) / 2
    return np.array(out)


_INV_SQRTPI = 0.5641895835477563  # 1 / sqrt(pi) rounded to float64 (checked where the table is measured)


def _m_erfc_asym(A):
    mp = _mp()
    assert _INV_SQRTPI == float(1 / mp.sqrt(mp.pi))
    a = np.linspace(_ASYM_FROM, 27.3, 20001)
    want = ref("erfcx64", _erfcx, a)
    r = 1.0 / a
    got = _INV_SQRTPI * r * horner64(A, r * r)
    first_left_out = abs(float(_asym_terms(len(A) + 1)[-1])) / _ASYM_FROM ** (2 * len(A))
    return (f"the first term left out is below {first_left_out:.2g} relative at a = {_ASYM_FROM:g} (the series' "
            f"remainder is bounded by it); max error {_ulp64_err(got, want):.3g} float64 ulps of erfcx(a) = "
            f"M64_INV_SQRTPI A(1 / a^2) / a, a in [{_ASYM_FROM:g}, 27.3] (float64, no FMA; {a.size} points; mpmath at "
            f"{mp.mp.dps} digits)")


_FAST_HI = 8.49  # gelu's fast paths: |x| <= 12, so a = |x| / sqrt2 <= 8.49

NATIVE = [
    Table("native", ("MA_LOG2E",), "1 / ln 2, for n = round(x / ln 2)", "f32",
          "derived: log2(e) rounded to float32", lambda: (np.array([float(1 / _mp().log(2))]), ""),
          lambda v: _m_const(v, lambda mp: 1 / mp.log(2)), fitted=False),
    Table("native", ("MA_LN2_HI", "MA_LN2_LO"), "Cody-Waite split of ln 2: x - n ln 2 = (x - n HI) - n LO",
          "f32", "derived: HI = ln 2 rounded to 9 significant bits (n * HI exact for |n| < 2^15), "
          "LO = ln 2 - HI rounded to float32",
          lambda: _ln2_split(9), _m_ln2, fitted=False),
    Table("native", _names("MA_EM1_P", 5),
          "expm1(r) = r + r^2 P(r), |r| <= 0.3466 (+ margin for non-FMA rounding of n): ma_em1_poly", "f32",
          f"fitted: P(r) = (expm1(r) - r) / r^2 on {NODES} Chebyshev nodes of [-0.36, 0.36], relative to P",
          _fitted32(_f(lambda mp, r: (mp.expm1(r) - r) / r**2 if r != 0 else mp.mpf(0.5)), -0.36, 0.36, 4),
          _m_em1),
    Table("native", _names("MA_LOG1P_R", 5),
          "log1p(u) = 2 atanh(s) = 2s + s^3 R(s^2), s = u / (2 + u) in [0, 1/3]: ma_log1p01", "f32",
          f"fitted: R on {NODES} Chebyshev nodes of s in [1e-6, 0.34] (polynomial in s^2), relative to R",
          _fitted32(_f(lambda mp, s: (2 * mp.atanh(s) - 2 * s) / s**3 if s != 0 else mp.mpf(2) / 3), 1e-6, 0.34, 4,
                    var=lambda s: s * s),
          _m_log1p),
    Table("native", _names("MA_TANHSHRINK_T", 11), "x - tanh(x) = x^3 T(x^2), |x| < 1: op_tanhshrink (ma_ops.h)",
          "f32", f"fitted: T on {NODES} Chebyshev nodes of [1e-6, 1] (polynomial in x^2), relative to T",
          _fitted32(_f(lambda mp, x: (x - mp.tanh(x)) / x**3 if x != 0 else mp.mpf(1) / 3), 1e-6, 1.0, 10,
                    var=lambda x: x * x),
          _m_tanhshrink),
    Table("native", _names("MA_ERFC_G", 15),
          "erfc(a) = e^(-a^2) G(t) / (1 + 2a), t = (a - 2) / (a + 2), a in [0, 10.1]: ma_erfc_g (gelu general bodies)",
          "f32",
          f"fitted: G on {NODES} Chebyshev nodes of t in [-1, 0.67], relative to G",
          _fitted32(_f(_g_of_t), -1.0, 0.67, 14), lambda G: _m_erfc(G, 10.0)),
    Table("native", _names("MA_ERFC_HG_FAST", 10),
          "0.5 G(t) for gelu's fast paths (a <= 8.49): ma_half_erfc_g_fast, Horner's order", "f32",
          f"fitted: G of degree 9 on {NODES} Chebyshev nodes of t in [-1, {(_FAST_HI - 2) / (_FAST_HI + 2):.4f}] "
          "(a <= 8.49), relative to G, then multiplied by 0.5 (exact)",
          _fitted32(_f(_g_of_t), -1.0, (_FAST_HI - 2) / (_FAST_HI + 2), 9), lambda G: _m_erfc(G, _FAST_HI), scale=0.5),
    Table("native", _names("MA_MISH_D", 8),
          f"mish'(x) = D(x) on ({_MISH_MID:g}, 0): the backward's middle piece (op_mish_grad, ma_ops.h), where the "
          "rational form in e = e^x would take e's rounding |f'' / f'| (up to 2.5) times", "f32",
          f"fitted: D of degree 7 on {NODES} Chebyshev nodes of [{_MISH_MID:g}, 0], relative to D",
          _fitted32(_f(_mish_grad), _MISH_MID, 0.0, 7), _m_mish_grad, defines=(("MA_MISH_MID", _MISH_MID),)),
    *(Table("native", _names(f"M64_ERFCX{i}_", deg + 1),
            f"erfcx(a) = erfc(a) e^(a^2), a in [{lo:g}, {hi:g}], as a polynomial in s = (a - {off:g}) / {half:g}: "
            "m64_erfcx (float64 gelu, ma_math64.h)", "f64",
            f"fitted: the degree-{deg} Chebyshev interpolant of erfcx on the piece, in mpmath, in powers of s",
            _fitted64_erfcx(off, half, deg), _m_erfcx64(lo, hi, off, half), array=f"M64_ERFCX{i}",
            defines=((f"M64_ERFCX{i}_HI", hi), (f"M64_ERFCX{i}_OFF", off), (f"M64_ERFCX{i}_INV_HALF", 1 / half)))
      for i, (lo, hi, off, half, deg) in enumerate(ERFCX64)),
    Table("native", _names("M64_ERFC_ASYM", ERFCX64_ASYM),
          f"erfcx(a) a sqrt(pi) = sum A_k a^(-2k), a >= {_ASYM_FROM:g}: the asymptotic series, m64_erfcx's last piece",
          "f64",
          "derived: A_k = (-1)^k (2k - 1)!! / 2^k rounded to float64", lambda: (_asym_terms(ERFCX64_ASYM), ""),
          _m_erfc_asym, fitted=False, array="M64_ERFC_ASYM",
          defines=(("M64_ERFC_ASYM_FROM", _ASYM_FROM), ("M64_INV_SQRTPI", _INV_SQRTPI))),
]


# --- numba (multiact/backend/numba_math.py)


def _m_e5(E):
    r = np.linspace(-0.36, 0.36, 200001).astype(np.float32)[::50]
    want = ref("expm1", lambda mp, v: mp.expm1(v), r)
    r64 = r.astype(np.float64)
    nz = r != 0
    approx = rel_err((r64 + r64 * r64 * horner64(E, r64))[nz], want[nz])
    got = r + r * r * horner32(E, r)
    return (f"max error {approx:.2g} relative (evaluated in float64), {ulp_err(got, want):.3g} ulp of expm1(r) "
            f"(float32 Horner, no FMA; {r.size} points)")


def _m_tanh5(T):
    x = np.linspace(0, 0.625, 20001).astype(np.float32)[1:]
    want = ref("tanh", lambda mp, v: mp.tanh(v), x)
    x64 = x.astype(np.float64)
    approx = rel_err(x64 + x64 * (x64 * x64 * horner64(T, x64 * x64)), want)
    x2 = x * x
    got = x + x * (x2 * horner32(T, x2))
    return (f"max error {approx:.2g} relative (evaluated in float64), {ulp_err(got, want):.3g} ulp of tanh(x) "
            f"(float32 Horner, no FMA; {x.size} points of (0, 0.625])")


def _m_erf_small(R):
    z = np.linspace(0, 0.5, 20001)[1:]
    want = ref("erf", lambda mp, v: mp.erf(v), z)
    err = rel_err(z * horner64(R, z * z), want)
    return f"max error {err:.2g} relative (float64 Horner; {z.size} points of (0, 0.5])"


def _m_erfcx(C):
    z = np.linspace(0.5, 12, 20001)
    want = ref("erfcx", lambda mp, v: mp.erfc(v) * mp.exp(v * v), z)
    t = 1.0 / (1.0 + 0.5 * z)
    return (f"max error {rel_err(t * horner64(C, t), want):.2g} relative (float64 Horner; {z.size} points of "
            "[0.5, 12])")


def _m_atanh_series(S):
    f = np.linspace(np.sqrt(0.5), np.sqrt(2.0), 20001)
    want = ref("log", lambda mp, v: mp.log(v), f)
    s = (f - 1.0) / (f + 1.0)
    s2 = s * s
    p = (((s2 * S[3] + S[2]) * s2 + S[1]) * s2 + S[0]) * s2
    logf = (s + s) + (s + s) * p
    keep = want != 0
    return (f"max error {rel_err(logf[keep], want[keep]):.2g} relative, of log f (float64; {f.size} points of "
            "[sqrt(1/2), sqrt(2)], |s| <= 0.1716)")


NUMBA = [
    Table("numba", _names("_MD", 8),
          f"mish'(x) = D(x) on ({_MISH_MID:g}, 0): the float32 backward's middle piece (formulas.py's mish_grad)",
          "f32",
          f"fitted: D of degree 7 on {NODES} Chebyshev nodes of [{_MISH_MID:g}, 0], relative to D (native's "
          "MA_MISH_D)", _fitted32(_f(_mish_grad), _MISH_MID, 0.0, 7), _m_mish_grad),
    Table("numba", ("_MISH_MID",), "where mish's float32 backward takes _MD: x in (_MISH_MID, 0)", "f32",
          "derived: the end of _MD's interval (native's MA_MISH_MID)", lambda: (np.array([_MISH_MID]), ""),
          lambda v: f"{float(v[0]):g} in float32", fitted=False),
    Table("numba", ("_LOG2E",), "1 / ln 2, for k = floor(x / ln 2 + 1/2)", "f32",
          "derived: log2(e) rounded to float32", lambda: (np.array([float(1 / _mp().log(2))]), ""),
          lambda v: _m_const(v, lambda mp: 1 / mp.log(2)), fitted=False),
    Table("numba", ("_LN2_HI", "_LN2_LO"), "Cody-Waite split of ln 2: x - k ln 2 = (x - k HI) - k LO", "f32",
          "derived: HI = ln 2 rounded to 15 significant bits (k * HI exact for |k| <= 256), LO = ln 2 - HI "
          "rounded to float32", lambda: _ln2_split(15), _m_ln2, fitted=False),
    Table("numba", ("_LN2_64",), "ln 2 in float64 (log1p's k ln 2)", "f64", "derived: ln 2 rounded to float64",
          lambda: (np.array([float(_mp().log(2))]), ""),
          lambda v: _m_const(v, lambda mp: mp.log(2)), fitted=False),
    Table("numba", _names("_E", 6), "expm1(r) = r + r^2 P(r), |r| <= 0.36: expm1_reduced", "f32",
          f"fitted: P (degree 5) on {NODES} Chebyshev nodes of [-0.36, 0.36], relative to expm1(r)",
          _fitted32(_f(lambda mp, r: mp.expm1(r)), -0.36, 0.36, 5, mult=lambda r: r * r, base=lambda r: r), _m_e5),
    Table("numba", _names("_T", 6), "tanh(x) = x + x^3 P(x^2), |x| < 0.625: tanh's small branch", "f32",
          f"fitted: P on {NODES} Chebyshev nodes of [0, 0.625] (polynomial in x^2), relative to tanh(x)",
          _fitted32(_f(lambda mp, x: mp.tanh(x)), 0.0, 0.625, 5, var=lambda x: x * x, mult=lambda x: x**3,
                    base=lambda x: x), _m_tanh5),
    Table("numba", _names("_R", 7), "erf(z) = z P(z^2), 0 <= z <= 0.5, evaluated in float64: erf_small", "f64",
          "carried: the float64 values in use since numba_math.py was written (a least-squares fit against "
          "mpmath whose recipe was not recorded; a relative refit on Chebyshev nodes of [0, 0.5] agrees to "
          "within 1e-15 in R0 to 2e-6 in R6, the fit's conditioning noise, so the values are inputs, kept verbatim)",
          _given(1.12837916709547, -0.37612638900139134, 0.11283791450806885, -0.02686611453288725,
                 0.005223310645981982, -0.0008507921622429884, 0.00010837365645863876),
          _m_erf_small, fitted=False),
    Table("numba", _names("_C", 10),
          "erfc(z) e^(z^2) = t P(t), t = 1 / (1 + z / 2), 0.5 <= z <= 12, evaluated in float64 (in float32 "
          "the rounding of t alone costs 2 ulp near z = 1): erfcx_tail", "f64",
          "carried: the float64 values in use since numba_math.py was written (fit recipe not recorded; a "
          "relative refit on Chebyshev nodes of [0.5, 12] agrees to within 5e-10 relative, not to the bit), kept "
          "verbatim",
          _given(0.28209089154129807, 0.2822089106521356, 0.24542116923229512, 0.18592734166422165,
                 0.04459153725518103, 0.09067362788909246, -0.17837254489691498, -0.025513389121471684,
                 0.11428935178866091, -0.041356700730726906),
          _m_erfcx, fitted=False),
    Table("numba", ("_S3", "_S5", "_S7", "_S9"),
          "log f = 2 atanh(s) = 2s (1 + s^2 S3 + s^4 S5 + s^6 S7 + s^8 S9), s = (f - 1) / (f + 1): log1p", "f64",
          "derived: the Taylor series of atanh, S(2k+1) = 1 / (2k+1) rounded to float64",
          lambda: (np.array([1 / 3, 1 / 5, 1 / 7, 1 / 9]), ""), _m_atanh_series, fitted=False),
]

TABLES = NATIVE + NUMBA


# ---- writing ----------------------------------------------------------------------------------------


def _hex(v) -> str:
    """A value's exact hex float form, without trailing zeros (C99 and float.fromhex read it)."""
    h = float(v).hex()  # [-]0x1.<13 hex digits>p<exp>
    m = re.fullmatch(r"(-?0x[01])\.?([0-9a-f]*)p([+-]\d+)", h)
    assert m, h
    frac = m.group(2).rstrip("0")
    return f"{m.group(1)}{'.' + frac if frac else ''}p{m.group(3)}"


def _bits32(v: np.float32) -> str:
    return f"0x{int(np.float32(v).view(np.uint32)):08x}"


def _bits64(v: float) -> str:
    return f"0x{int(np.float64(v).view(np.uint64)):016x}"


def _scaled(t: Table, v: np.ndarray) -> np.ndarray:
    if t.scale == 1.0:
        return v
    out = (v * v.dtype.type(t.scale)).astype(v.dtype)
    assert np.array_equal(out.astype(np.float64), v.astype(np.float64) * t.scale), "scaling must be exact"
    return out


def value_lines(t: Table, v: np.ndarray) -> list[str]:
    """The lines that hold a table's values (what tests/test_coefficients.py compares after a refit)."""
    pairs = list(zip(t.names, _scaled(t, v), strict=True))
    if t.lib == "native" and t.kind == "f64":
        return [f"#define {n} ({_hex(x)}) /* {float(x):.17e} {_bits64(x)} */" for n, x in pairs]
    if t.lib == "native":
        return [f"#define {n} ({_hex(x)}f) /* {float(x):.9e} {_bits32(x)} */" for n, x in pairs]
    if t.kind == "f32":
        return [f"{n} = F32({float(x)!r})  # {_hex(x)}, bits {_bits32(x)}" for n, x in pairs]
    return [f"{n} = {float(x)!r}  # {_hex(x)}, bits {_bits64(x)}" for n, x in pairs]


def _wrap(text: str, prefix: str, width: int = 110) -> list[str]:
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width - len(prefix):
            lines.append(prefix + cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return lines + [prefix + cur] if cur else lines


def _block(t: Table, v: np.ndarray, note: str, err: str, prefix: str) -> list[str]:
    head = f"{t.names[0]}..{t.names[-1]}" if len(t.names) > 2 else ", ".join(t.names)
    return (_wrap(f"{head}: {t.doc}.", prefix) + _wrap(f"{t.source}{note}.", prefix)
            + _wrap(f"{err}.", prefix))


def inputs_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def outputs_digest(text: str) -> str:
    """sha256 of a generated file's text without its stamp line."""
    return hashlib.sha256("".join(ln for ln in text.splitlines(True) if not _is_stamp(ln)).encode()).hexdigest()


def _is_stamp(line: str) -> bool:
    return re.search(r"fit_coefficients\.py (in|out)puts sha256", line) is not None or line.strip() == _MARK


def stamp_of(text: str) -> tuple[str, str] | None:
    """(inputs sha256, outputs sha256) recorded in a generated file, or None."""
    m = re.search(r"fit_coefficients\.py inputs sha256 ([0-9a-f]{64})\n.*fit_coefficients\.py outputs sha256 "
                  r"([0-9a-f]{64})\n", text)
    return (m.group(1), m.group(2)) if m else None


def _stamped(text: str, marker: str, comment: str) -> str:
    stamp = (f"{comment}fit_coefficients.py inputs sha256 {inputs_digest()}\n"
             f"{comment}fit_coefficients.py outputs sha256 {outputs_digest(text)}")
    return text.replace(marker, stamp, 1)


_MARK = "@@STAMP@@"


def _array_lines(t: Table) -> list[str]:
    """#define <array> {name0, name1, ...}: the table as a C initializer, in index order; then its defines."""
    consts = [f"#define {n} {_hex(v)} /* {v:g} */" for n, v in t.defines]
    if not t.array:
        return consts
    rows = [", ".join(t.names[i : i + 6]) for i in range(0, len(t.names), 6)]
    return [f"#define {t.array} {{ \\"] + [f"    {r}{',' if i < len(rows) - 1 else ''} \\" for i, r in
                                            enumerate(rows)] + ["}"] + consts


def render_c(tables: list[tuple[Table, np.ndarray, str, str]]) -> str:
    out = [
        "/* Generated by native/fit_coefficients.py: do not edit; rerun `python native/fit_coefficients.py`.",
        _MARK,
        " *",
        " * The polynomial and constant tables of the native float32 math (ma_math.h; ma_ops.h uses the",
        " * tanhshrink one) and the float64 erfc's (M64_*, ma_math64.h).  Values are C99 hex float literals",
        " * (exact); each comment gives the value in decimal (%.9e, or %.17e for a double: either round-trips)",
        " * and its bit pattern.  Errors are measured",
        " * by that script against mpmath, for the table as the comment says (not for whole functions,",
        " * whose errors ma_math.h states). */",
        "#ifndef MA_COEFFS_H",
        "#define MA_COEFFS_H",
    ]
    for t, v, note, err in tables:
        out += ["", "/*"] + _block(t, v, note, err, " * ") + [" */"] + value_lines(t, v) + _array_lines(t)
    out += ["", "#endif", ""]
    return _stamped("\n".join(out), _MARK, " * ")


def render_py(tables: list[tuple[Table, np.ndarray, str, str]]) -> str:
    out = [
        '"""Generated by native/fit_coefficients.py: do not edit; rerun `python native/fit_coefficients.py`.',
        "",
        "The polynomial and constant tables of multiact/backend/numba_math.py.  Values are exact: shortest",
        "round-trip decimals, then hex and (float32) bit pattern.  float32 values are numpy float32 scalars and",
        "float64 values Python floats, which numba freezes as typed constants.  Errors are measured by that",
        "script against mpmath, for the table as the comment says.",
        '"""',
        "",
        _MARK,
        "",
        "import numpy as np",
        "",
        "F32 = np.float32",
    ]
    for t, v, note, err in tables:
        out += [""] + _block(t, v, note, err, "# ") + value_lines(t, v)
    out += [""]
    return _stamped("\n".join(out), _MARK, "# ")


def fitted_values(tables: list[Table] = TABLES) -> list[tuple[Table, np.ndarray, str]]:
    """Every table's values (fits run here; no error measurement): the fast part."""
    return [(t, *t.values()) for t in tables]


def generate() -> dict[str, str]:
    """{path relative to the project root: text} of every generated file (fits and measures: slow)."""
    done = [(t, v, note, t.measure(v)) for t, v, note in fitted_values()]
    return {
        C_HEADER: render_c([d for d in done if d[0].lib == "native"]),
        PY_MODULE: render_py([d for d in done if d[0].lib == "numba"]),
    }


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for rel, text in generate().items():
        path = ROOT / rel
        old = path.read_text() if path.exists() else None
        if old == text:
            continue
        stale.append(rel)
        if not check:
            path.write_text(text)
    if check:
        print("out of date: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    print("wrote " + ", ".join(stale) if stale else "unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
