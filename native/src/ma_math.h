/* Vector math written against ma_simd.h: exp, expm1, log1p, tanh, erfc and the pieces the ops
 * share.  Every coefficient and split constant is in ma_coeffs.h, which native/fit_coefficients.py
 * writes (fits against mpmath, rounded to float32; each table's error stated there).  Errors below
 * are the functions', measured over dense grids against mpmath, in float32 ULPs of the result, for
 * the non-FMA (scalar) evaluation order.
 *
 * Conventions every function keeps: NaN in gives NaN out; +-inf give the limits; overflow gives
 * inf; results in the subnormal range are rounded once from a normal intermediate.
 *
 * "Scaled" results: deep in an exponential tail (exp argument below -80) a factor e^u is
 * returned as eK = e^u * 2^64 together with sc = 2^-64 (elsewhere sc = 1).  Kernels multiply
 * every other factor into eK first and apply sc last, so x * e^u stays accurate where e^u alone
 * would be subnormal (e.g. silu(-90)), and a single rounding takes the result into the
 * subnormal range.
 */
#ifndef MA_MATH_H
#define MA_MATH_H

#include "ma_simd.h"
#include "ma_coeffs.h" /* MA_LOG2E, MA_LN2_HI + MA_LN2_LO (n * LN2_HI exact for |n| < 2^15), the polynomials */

#define MA_MAGIC 12582912.0f        /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
#define MA_FLT_MAX 3.40282347e+38f
#define ONE_F VSPLAT(1.0f)

/* expm1(r) = r + r^2 P(r) on |r| <= 0.36 (MA_EM1_P; its error in ma_coeffs.h). */
MA_INLINE V ma_em1_poly(V r) {
    V p = VSPLAT(MA_EM1_P4);
    p = VFMA(p, r, VSPLAT(MA_EM1_P3));
    p = VFMA(p, r, VSPLAT(MA_EM1_P2));
    p = VFMA(p, r, VSPLAT(MA_EM1_P1));
    p = VFMA(p, r, VSPLAT(MA_EM1_P0));
    return VFMA(r * r, p, r);
}

/* n = round(x / ln2) as a float and as the integer bit pattern; r = x - n ln2 (Cody-Waite). */
#define MA_REDUCE(x, nf, n, r)                                  \
    do {                                                        \
        V t_ = VFMA((x), VSPLAT(MA_LOG2E), VSPLAT(MA_MAGIC));   \
        nf = t_ - VSPLAT(MA_MAGIC);                             \
        n = v_as_i(t_) - v_as_i(VSPLAT(MA_MAGIC));              \
        r = ((x) - nf * VSPLAT(MA_LN2_HI)) - nf * VSPLAT(MA_LN2_LO); \
    } while (0)

MA_INLINE V ma_abs(V x) { return i_as_v(v_as_i(x) & 0x7fffffffu); }
MA_INLINE V ma_copysign(V mag, V sgn) { return i_as_v((v_as_i(mag) & 0x7fffffffu) | (v_as_i(sgn) & 0x80000000u)); }
MA_INLINE V ma_pow2i(VI n) { return i_as_v((n + 127u) << 23); } /* n in [-126, 127] */

MA_INLINE V ma_clampv(V x, float lo, float hi) {
    x = VGT_SEL(VSPLAT(lo), x); /* NaN compares false: stays NaN */
    return VLT_SEL(VSPLAT(hi), x);
}

/* e^(u + lo) for u <= 0 (lo a tiny correction, |lo| << ulp(u)), scaled as described above.
 * Error 1.5 ULP.  u = -inf or u < -132 gives eK = 0. */
MA_INLINE V ma_expneg_k2(V u, V lo, V *sc) {
    VM big = u < VSPLAT(-80.0f);
    V nf, r;
    VI n;
    MA_REDUCE(u, nf, n, r);
    r = r + lo;
    V p = VSPLAT(1.0f) + ma_em1_poly(r);
    V eK = p * ma_pow2i(n + MASK_I(big, 64));
    *sc = VSEL(big, VSPLAT(0x1p-64f), VSPLAT(1.0f));
    return VSEL(u < VSPLAT(-132.0f), VSPLAT(0.0f), eK);
}

/* The fast paths' exponential (no clamp, no scaling), for |u| <= 87 and not NaN, d a correction
 * below ulp(u) (d = 0 folds away): u - d = n ln2 + r; returns e^r - 1 and sets s = 2^n, so that
 * e^(u - d) = s + s (e^r - 1) (1.5 ULP) and e^(u - d) - 1 = s (e^r - 1) + (s - 1). */
MA_INLINE V ma_exp_split(V u, V d, V *s) {
    /* the magic number carries the exponent bias: t's low bits hold n + 127, 2^n is one shift away */
    V t = VFMA(u, VSPLAT(MA_LOG2E), VSPLAT(MA_MAGIC + 127.0f));
    V nf = t - VSPLAT(MA_MAGIC + 127.0f);
    V r = VFMA(nf, VSPLAT(-MA_LN2_HI), u); /* exact: nf * LN2_HI has at most 17 bits */
    r = VFMA(nf, VSPLAT(-MA_LN2_LO), r) - d;
    *s = i_as_v(v_as_i(t) << 23);
    return ma_em1_poly(r);
}
MA_INLINE V ma_exp_fast2(V u, V d) {
    V s, em = ma_exp_split(u, d, &s);
    return (VSPLAT(1.0f) + em) * s;
}
MA_INLINE V ma_exp_fast(V u) { return ma_exp_fast2(u, VSPLAT(0.0f)); }

MA_INLINE V ma_expneg_k(V u, V *sc) { return ma_expneg_k2(u, VSPLAT(0.0f), sc); }

/* e^x for any x: overflow to inf above 88.72, gradual underflow below -87.3.  1.5 ULP. */
MA_INLINE V ma_exp(V x) {
    V xc = ma_clampv(x, -104.0f, 89.0f);
    V nf, r;
    VI n;
    MA_REDUCE(xc, nf, n, r);
    V p = VSPLAT(1.0f) + ma_em1_poly(r);
    VI n1 = vi_sar1(n), n2 = n - n1; /* both in [-75, 65] */
    return (p * ma_pow2i(n1)) * ma_pow2i(n2);
}

/* e^x - 1 for any x, accurate near 0 (no cancellation): 2 ULP.  The result takes x's sign, which
 * it has anyway, so that expm1(-0) = -0 (the reduction's r would come out +0 there). */
MA_INLINE V ma_expm1(V x) {
    V xc = ma_clampv(x, -30.0f, 89.0f);
    V nf, r;
    VI n;
    MA_REDUCE(xc, nf, n, r);
    V em = ma_em1_poly(r);
    V t = ma_pow2i(n - 1u); /* 2^(n-1) in [2^-44, 2^127]; the final *2 overflows to inf */
    return ma_copysign((t * em + (t - VSPLAT(0.5f))) * VSPLAT(2.0f), x);
}

/* log1p(u) for u in [0, 1] (and NaN): 2 atanh(s), s = u / (2 + u).  1.8 ULP; log1p(u) = u for tiny u. */
MA_INLINE V ma_log1p01(V u) {
    V s = u / (VSPLAT(2.0f) + u);
    V w = s * s;
    V p = VSPLAT(MA_LOG1P_R4); /* MA_LOG1P_R: R(s^2) */
    p = VFMA(p, w, VSPLAT(MA_LOG1P_R3));
    p = VFMA(p, w, VSPLAT(MA_LOG1P_R2));
    p = VFMA(p, w, VSPLAT(MA_LOG1P_R1));
    p = VFMA(p, w, VSPLAT(MA_LOG1P_R0));
    return VFMA(s * w, p, s + s);
}

MA_INLINE VM ma_isnan(V x) { return x != x; }
/* +-inf to +-FLT_MAX, NaN kept: stops inf * 0 where a factor underflows to 0. */
MA_INLINE V ma_finite(V x) { return ma_clampv(x, -MA_FLT_MAX, MA_FLT_MAX); }

/* tanh(x) = -sign(x) m / (2 + m), m = e^-2a - 1, a = min(|x|, 9.5) (tanh(9.5) rounds to 1):
 * one expm1 serves every |x| (no cancellation near 0), NaN passes through.  2.5 ULP. */
MA_INLINE V ma_tanh(V x) {
    V a = ma_abs(x);
    V s, em = ma_exp_split(VSPLAT(-2.0f) * VLT_SEL(VSPLAT(9.5f), a), VSPLAT(0.0f), &s);
    V m = VFMA(s, em, s - VSPLAT(1.0f)); /* s = 2^n, n in [-28, 0] */
    return ma_copysign(m / (VSPLAT(-2.0f) - m), x);
}

/* erfc(a) * e^(a^2) / ... : for a >= 0, erfc(a) = e^(-a^2) G(t) / (1 + 2a), t = (a - 2) / (a + 2).
 * Returns q = G(t) / (1 + 2a); 3 ULP before the exponential factor (a <= 7.1e4, so (a + 2)(1 + 2a) is finite). */
MA_INLINE V ma_erfc_q(V a) {
    /* one division gives both t = (a - 2) / (a + 2) and 1 / (1 + 2a) */
    V ap2 = a + VSPLAT(2.0f), den = VFMA(VSPLAT(2.0f), a, VSPLAT(1.0f));
    V r = ONE_F / (ap2 * den);
    V t = (a - VSPLAT(2.0f)) * (den * r);
    V g = VSPLAT(MA_ERFC_G14); /* MA_ERFC_G: G(t) */
    g = VFMA(g, t, VSPLAT(MA_ERFC_G13));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G12));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G11));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G10));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G9));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G8));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G7));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G6));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G5));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G4));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G3));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G2));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G1));
    g = VFMA(g, t, VSPLAT(MA_ERFC_G0));
    return g * (ap2 * r);
}

/* 0.5 erfc(b / sqrt2) e^(b^2 / 2) for 0 <= b <= 12 (gelu's fast paths): ma_erfc_q at a = b / sqrt2
 * with a degree-9 G fitted on t in [-1, 0.62] (MA_ERFC_HG_FAST = 0.5 G; its error in ma_coeffs.h),
 * 1 / sqrt2 folded into t's constants and 0.5 into G's coefficients (exact scalings), in Estrin's
 * order (the chain is 4 FMAs deep, not 9: gelu is bound by latency, not by FMAs). */
MA_INLINE V ma_half_erfc_q_fast(V b) {
    V ap2 = b + VSPLAT(2.82842712474619010f), den = VFMA(VSPLAT(1.41421356237309505f), b, VSPLAT(1.0f));
    V r = ONE_F / (ap2 * den); /* t = (b - 2 sqrt2) / (b + 2 sqrt2), 1 / (1 + sqrt2 b): one division */
    V t = (b - VSPLAT(2.82842712474619010f)) * (den * r);
    V t2 = t * t, t4 = t2 * t2;
    V p0 = VFMA(VSPLAT(MA_ERFC_HG_FAST1), t, VSPLAT(MA_ERFC_HG_FAST0));
    V p1 = VFMA(VSPLAT(MA_ERFC_HG_FAST3), t, VSPLAT(MA_ERFC_HG_FAST2));
    V p2 = VFMA(VSPLAT(MA_ERFC_HG_FAST5), t, VSPLAT(MA_ERFC_HG_FAST4));
    V p3 = VFMA(VSPLAT(MA_ERFC_HG_FAST7), t, VSPLAT(MA_ERFC_HG_FAST6));
    V p4 = VFMA(VSPLAT(MA_ERFC_HG_FAST9), t, VSPLAT(MA_ERFC_HG_FAST8));
    V g = VFMA(VFMA(p4, t4, VFMA(p3, t2, p2)), t4, VFMA(p1, t2, p0));
    return g * (ap2 * r);
}

/* x*x = h + l exactly (Dekker's split; no FMA needed).  Valid for |x| < 1e19. */
MA_INLINE V ma_sq_lo(V x, V h) {
    V c = x * VSPLAT(4097.0f);
    V hi = c - (c - x);
    V lo = x - hi;
    return ((hi * hi - h) + VSPLAT(2.0f) * hi * lo) + lo * lo;
}

/* The exact rounding errors of a product and a quotient, a b - p for p = a * b rounded, and x - q b for
 * q = x / b rounded (both representable): one fused multiply-add where the ISA has it, else in double
 * (exact there: a float product has at most 48 bits). They let an exponential's argument carry what
 * its float rounding lost (exp(z + zlo)), which in a tail is |z| ULPs of the result. */
#if defined(MA_ISA_SCALAR)
MA_INLINE V ma_mul_err(V a, V b, V p) { return (float)((double)a * (double)b - (double)p); }
MA_INLINE V ma_div_err(V x, V b, V q) { return (float)((double)x - (double)q * (double)b); }
#else
MA_INLINE V ma_mul_err(V a, V b, V p) { return VFMA(a, b, -p); }
MA_INLINE V ma_div_err(V x, V b, V q) { return VFMA(-q, b, x); }
#endif

/* The standard normal at x, for gelu: cdf and pdf sharing e^(-x^2/2) (scaled by sc).
 * left: x <= 0, where cdf = cdfK * sc; elsewhere cdf = 1 - (cdfK * sc) is returned as cdf_right. */
MA_INLINE void ma_normal_parts(V x, V *cdfK, V *pdfK, V *sc) {
    V xc = ma_clampv(x, -1e5f, 1e5f);
    V h = xc * xc;
    V l = ma_sq_lo(xc, h);
    V eK = ma_expneg_k2(VSPLAT(-0.5f) * h, VSPLAT(-0.5f) * l, sc);
    V a = ma_abs(xc) * VSPLAT(0.70710678118654752f);
    *cdfK = VSPLAT(0.5f) * (eK * ma_erfc_q(a)); /* 0.5 erfc(|x|/sqrt2), scaled */
    *pdfK = eK * VSPLAT(0.39894228040143268f);
}

#endif
