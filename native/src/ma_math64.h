/* Vector math in float64 lanes (the f64_<isa>.c units, ma_simd64.h): exp, expm1, log1p on [0, 1], tanh, the
 * sigmoid pair and sech^2, for the float64 bodies of ma_ops64.h.  The polynomials are Taylor series, not fits:
 * their truncation error is stated by each (a bound, below 0.15 ulp everywhere), so that the error is the
 * evaluation's, about an ulp per function (measured: native/README.md).  The conventions of ma_math.h hold:
 * NaN in gives NaN out, +-inf give the limits, overflow gives inf, results in the subnormal range are rounded
 * once from a normal intermediate.
 */
#ifndef MA_MATH64_H
#define MA_MATH64_H

#include "ma_simd.h"
#include "ma_coeffs.h" /* M64_ERFCX*, M64_ERFC_ASYM: the fitted erfcx pieces and the series (fit_coefficients.py) */

#define M64_MAGIC 6755399441055744.0 /* 1.5 * 2^52: adding it rounds to an integer in the low bits */
#define M64_LOG2E 1.4426950408889634
/* ln 2 = LN2_HI + LN2_LO, LN2_HI with 21 trailing zero bits (fdlibm's split): n * LN2_HI is exact for |n| < 2^21 */
#define M64_LN2_HI 6.93147180369123816490e-01
#define M64_LN2_LO 1.90821492927058770002e-10

/* e^r - 1 = r + r^2 Q(r), Q the Taylor series to r^11 / 13!.  On |r| <= 0.3466 (the reduced range) the first
 * term left out, r^14 / 14!, is below 4.2e-18, 0.1 ulp of e^r - 1. */
MA_INLINE V m64_em1_poly(V r) {
    V q = VSPLAT(1.0 / 6227020800.0);
    q = VFMA(q, r, VSPLAT(1.0 / 479001600.0));
    q = VFMA(q, r, VSPLAT(1.0 / 39916800.0));
    q = VFMA(q, r, VSPLAT(1.0 / 3628800.0));
    q = VFMA(q, r, VSPLAT(1.0 / 362880.0));
    q = VFMA(q, r, VSPLAT(1.0 / 40320.0));
    q = VFMA(q, r, VSPLAT(1.0 / 5040.0));
    q = VFMA(q, r, VSPLAT(1.0 / 720.0));
    q = VFMA(q, r, VSPLAT(1.0 / 120.0));
    q = VFMA(q, r, VSPLAT(1.0 / 24.0));
    q = VFMA(q, r, VSPLAT(1.0 / 6.0));
    q = VFMA(q, r, VSPLAT(0.5));
    return VFMA(r * r, q, r);
}

/* n = round(x / ln2) as a double and as the integer bit pattern; r = x - n ln2 (Cody-Waite). */
#define M64_REDUCE(x, nf, n, r)                                     \
    do {                                                            \
        V t_ = VFMA((x), VSPLAT(M64_LOG2E), VSPLAT(M64_MAGIC));     \
        nf = t_ - VSPLAT(M64_MAGIC);                                \
        n = v_as_i(t_) - v_as_i(VSPLAT(M64_MAGIC));                 \
        r = VFMA(nf, VSPLAT(-M64_LN2_HI), (x));                     \
        r = VFMA(nf, VSPLAT(-M64_LN2_LO), r);                       \
    } while (0)

MA_INLINE V m64_pow2i(VI n) { return i_as_v((n + 1023ull) << 52); } /* n in [-1022, 1023] */

/* e^x for any x: inf above 709.78, gradual underflow below -708.4 (2^n applied as two normal factors, so
 * that a subnormal result is rounded once). */
MA_INLINE V m64_exp(V x) {
    V xc = ma_clampv(x, -746.0, 710.0);
    V nf, r;
    VI n;
    M64_REDUCE(xc, nf, n, r);
    V p = VSPLAT(1.0) + m64_em1_poly(r);
    VI n1 = v_as_i(VFMA(nf, VSPLAT(0.5), VSPLAT(M64_MAGIC))) - v_as_i(VSPLAT(M64_MAGIC)); /* about n / 2 */
    return (p * m64_pow2i(n1)) * m64_pow2i(n - n1);
}

/* e^x - 1 for any x, without cancellation near 0; the result takes x's sign (expm1(-0) = -0). */
MA_INLINE V m64_expm1(V x) {
    V xc = ma_clampv(x, -40.0, 710.0);
    V nf, r;
    VI n;
    M64_REDUCE(xc, nf, n, r);
    V em = m64_em1_poly(r);
    V t = m64_pow2i(n - 1ull); /* 2^(n-1) in [2^-59, 2^1023]; the final * 2 overflows to inf */
    return ma_copysign((t * em + (t - VSPLAT(0.5))) * VSPLAT(2.0), x);
}

/* log1p(u) for u in [0, 1] (and NaN): 2 atanh(s), s = u / (2 + u) carried as s + sl (the rounding of 2 + u and
 * of the quotient taken back), atanh(s) / s = 1 + w / 3 + ... + w^15 / 31, w = s^2 <= 1/9: the first term left
 * out, w^16 / 33, is below 1.6e-17. */
MA_INLINE V m64_log1p01(V u) {
    V two = VSPLAT(2.0);
    V d = two + u;
    V dl = u - (d - two); /* exact (u <= 2): 2 + u = d + dl */
    V s = u / d;
    V sl = (VFMA(-s, d, u) - s * dl) / d;
    V w = s * s;
    V p = VSPLAT(1.0 / 33.0);
    p = VFMA(p, w, VSPLAT(1.0 / 31.0));
    p = VFMA(p, w, VSPLAT(1.0 / 29.0));
    p = VFMA(p, w, VSPLAT(1.0 / 27.0));
    p = VFMA(p, w, VSPLAT(1.0 / 25.0));
    p = VFMA(p, w, VSPLAT(1.0 / 23.0));
    p = VFMA(p, w, VSPLAT(1.0 / 21.0));
    p = VFMA(p, w, VSPLAT(1.0 / 19.0));
    p = VFMA(p, w, VSPLAT(1.0 / 17.0));
    p = VFMA(p, w, VSPLAT(1.0 / 15.0));
    p = VFMA(p, w, VSPLAT(1.0 / 13.0));
    p = VFMA(p, w, VSPLAT(1.0 / 11.0));
    p = VFMA(p, w, VSPLAT(1.0 / 9.0));
    p = VFMA(p, w, VSPLAT(1.0 / 7.0));
    p = VFMA(p, w, VSPLAT(1.0 / 5.0));
    p = VFMA(p, w, VSPLAT(1.0 / 3.0));
    return two * (s + VFMA(s * w, p, sl));
}

/* tanh(x) = -sign(x) m / (2 + m), m = e^-2a - 1, a = min(|x|, 20) (tanh(20) rounds to 1): one expm1 for every
 * |x|, no cancellation near 0. */
MA_INLINE V m64_tanh(V x) {
    V m = m64_expm1(VSPLAT(-2.0) * VLT_SEL(VSPLAT(20.0), ma_abs(x)));
    return ma_copysign(m / (VSPLAT(-2.0) - m), x);
}

/* sigmoid(z) and sigmoid(-z), from e = e^-|z|: 1 / (1 + e) and e / (1 + e), each one division (the reference's
 * forms). */
MA_INLINE void m64_sigmoid2(V z, V *s, V *sn) {
    V e = m64_exp(-ma_abs(z));
    V d = VSPLAT(1.0) + e;
    V big = VSPLAT(1.0) / d, small = e / d;
    VM neg = z < VSPLAT(0.0);
    *s = VSEL(neg, small, big);
    *sn = VSEL(neg, big, small);
}
MA_INLINE V m64_sigmoid(V z) {
    V s, sn;
    m64_sigmoid2(z, &s, &sn);
    return s;
}

/* 1 / (1 + e)^2 for e in [0, 1], with 1 + e carried exactly (d + c): squaring the rounded d would double its
 * rounding error */
MA_INLINE V m64_inv_sq_1pe(V e) {
    V d = VSPLAT(1.0) + e;
    V c = e - (d - VSPLAT(1.0));
    V r = VSPLAT(1.0) / (d * d);
    return r - (VSPLAT(2.0) * c) * (r / d);
}

/* 1 - tanh(x)^2 as 4e / (1 + e)^2, e = e^-2|x|: relatively accurate where tanh(x) is near 1. */
MA_INLINE V m64_sech2(V x) {
    V e = m64_exp(VSPLAT(-2.0) * ma_abs(x));
    return (VSPLAT(4.0) * e) * m64_inv_sq_1pe(e);
}

/* log(1 + e^z) without overflow: max(z, 0) + log1p(e^-|z|). */
MA_INLINE V m64_softplus0(V z) { return VGT_SEL(VSPLAT(0.0), z) + m64_log1p01(m64_exp(-ma_abs(z))); }

/* ---- erfc ----
 * erfc(a) = e^(-a^2) erfcx(a), a = |x|: erfcx as the pieces of ma_coeffs.h (polynomials in s = (a - OFF) /
 * HALF, exact, on [0, 2), [2, 4), [4, 8); then the asymptotic series in 1 / a^2; 1 to 2 ulp each, stated
 * there).  a^2 is carried as h + l (Dekker's product, exact without FMA): e^(-h) alone would be off by l, a^2
 * ulps of a at a = 26.  Each piece runs only where a lane needs it. */
MA_INLINE V m64_horner(const double *c, int n, V s) {
    V acc = VSPLAT(c[n - 1]);
    for (int k = n - 2; k >= 0; k--) acc = VFMA(acc, s, VSPLAT(c[k]));
    return acc;
}
#define M64_ANY(m) (!VALL(MNOT(m)))
#define M64_NCOEF(arr) ((int)(sizeof(arr) / sizeof((arr)[0])))

/* the piece c (n coefficients) in the lanes of m, where any lane is in m */
MA_INLINE V m64_piece(V h, VM m, const double *c, int n, V s) { return M64_ANY(m) ? VSEL(m, m64_horner(c, n, s), h) : h; }
#define M64_ERFCX_PIECE(h, lo, i, a)                                                                              \
    m64_piece((h), MAND((a) >= VSPLAT(lo), (a) < VSPLAT(M64_ERFCX##i##_HI)), p##i, M64_NCOEF(p##i),             \
              ((a) - VSPLAT(M64_ERFCX##i##_OFF)) * VSPLAT(M64_ERFCX##i##_INV_HALF))

MA_INLINE V m64_erfcx(V a) { /* a >= 0; NaN stays NaN (no piece takes it) */
    static const double p0[] = M64_ERFCX0, p1[] = M64_ERFCX1, p2[] = M64_ERFCX2, asym[] = M64_ERFC_ASYM;
    V h = M64_ERFCX_PIECE(a, 0.0, 0, a);
    h = M64_ERFCX_PIECE(h, M64_ERFCX0_HI, 1, a);
    h = M64_ERFCX_PIECE(h, M64_ERFCX1_HI, 2, a);
    VM m = a >= VSPLAT(M64_ERFC_ASYM_FROM);
    if (M64_ANY(m)) {
        V r = VSPLAT(1.0) / VGT_SEL(VSPLAT(M64_ERFC_ASYM_FROM), a); /* (the other lanes kept finite) */
        h = VSEL(m, (VSPLAT(M64_INV_SQRTPI) * r) * m64_horner(asym, M64_NCOEF(asym), r * r), h);
    }
    return h;
}

/* a * a - fl(a * a), exactly (Veltkamp's split; |a| < 2^996) */
MA_INLINE V m64_sq_err(V a, V h) {
    V c = VSPLAT(134217729.0) * a; /* 2^27 + 1 */
    V ah = c - (c - a), al = a - ah;
    return ((ah * ah - h) + (ah + ah) * al) + al * al;
}

/* erfc(x) for any x: a clamped to 27.5 (erfc(27.5) < 2^-1075 rounds to 0; inf out of the split), the result
 * 2 - erfc(a) below 0; NaN gives NaN. */
MA_INLINE V m64_erfc(V x) {
    V a = VLT_SEL(VSPLAT(27.5), ma_abs(x));
    V h = a * a, l = m64_sq_err(a, h);
    V q = m64_exp(-h) * m64_erfcx(a);
    q = q - q * l; /* e^(-h - l) = e^(-h) (1 - l), |l| <= 2^-53 h */
    return VSEL(x < VSPLAT(0.0), VSPLAT(2.0) - q, q);
}

#endif
