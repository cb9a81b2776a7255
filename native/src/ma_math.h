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

/* e^(u + lo) for u <= 0 (lo a tiny correction, |lo| << ulp(u)), scaled as described above, as its two
 * factors: returns the scaled power of two pK and sets em = e^r - 1, so that eK = pK (1 + em) without the
 * rounding of 1 + em (callers that fold em into a later product save half an ulp).  u = -inf or u < -132
 * gives pK = 0 and em = 0. */
MA_INLINE V ma_expneg_k2s(V u, V lo, V *sc, V *em) {
    VM big = u < VSPLAT(-80.0f);
    V nf, r;
    VI n;
    MA_REDUCE(u, nf, n, r);
    VM zero = u < VSPLAT(-132.0f); /* -inf included, whose r is NaN */
    *em = VSEL(zero, VSPLAT(0.0f), ma_em1_poly(r + lo));
    *sc = VSEL(big, VSPLAT(0x1p-64f), VSPLAT(1.0f));
    return VSEL(zero, VSPLAT(0.0f), ma_pow2i(n + MASK_I(big, 64)));
}

/* e^(u + lo) as one scaled value, eK = pK (1 + em).  Error 1.5 ULP. */
MA_INLINE V ma_expneg_k2(V u, V lo, V *sc) {
    V em, pK = ma_expneg_k2s(u, lo, sc, &em);
    return (VSPLAT(1.0f) + em) * pK;
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

/* erfc(a) = e^(-a^2) G(t) / (1 + 2a) for a >= 0, t = (a - 2) / (a + 2) (MA_ERFC_G, MA_ERFC_HG_FAST).  gelu
 * takes it at a = b / sqrt2 for b = |x|: t = (b - C) / (b + C), C = 2 sqrt2, from one reciprocal
 * u = 1 / (b + C): t = 2b u - 1 below C and 1 - 2C u above, each one FMA from u, so that t carries about
 * half an ulp where G is most sensitive to it (b near 0, t near -1), not the 2-3 ulps of a quotient of a
 * rounded numerator and denominator; 1 / (1 + sqrt2 b) is applied by ma_div_1p_sqrt2. */
MA_INLINE V ma_erfc_t(V b) {
    V C = VSPLAT(2.82842712474619010f);
    V u = ONE_F / (b + C);
    return VSEL(b < C, VFMA(b + b, u, VSPLAT(-1.0f)), VFMA(-(C + C), u, ONE_F));
}

/* G(t) for any b (degree 14, fitted for a <= 10.1; beyond, erfc(a) < 1e-45 and the result underflows). */
MA_INLINE V ma_erfc_g(V t) {
    V g = VSPLAT(MA_ERFC_G14);
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
    return VFMA(g, t, VSPLAT(MA_ERFC_G0));
}

/* 0.5 G(t) for 0 <= b <= 12 (gelu's fast paths: degree 9, t in [-1, 0.62]).  Horner's order: Estrin's
 * (a shorter chain) costs 1.2 ULP of gelu here.  The scalar ISA has no fused multiply-add, and the two
 * roundings of each of its steps took gelu to 4.01 ULP (x = -0.0316): it runs the chain in double. */
#if defined(MA_ISA_SCALAR)
MA_INLINE V ma_half_erfc_g_fast(V b) {
    double t = ma_erfc_t(b);
    double g = MA_ERFC_HG_FAST9;
    g = g * t + MA_ERFC_HG_FAST8;
    g = g * t + MA_ERFC_HG_FAST7;
    g = g * t + MA_ERFC_HG_FAST6;
    g = g * t + MA_ERFC_HG_FAST5;
    g = g * t + MA_ERFC_HG_FAST4;
    g = g * t + MA_ERFC_HG_FAST3;
    g = g * t + MA_ERFC_HG_FAST2;
    g = g * t + MA_ERFC_HG_FAST1;
    return (float)(g * t + MA_ERFC_HG_FAST0);
}
#else
MA_INLINE V ma_half_erfc_g_fast(V b) {
    V t = ma_erfc_t(b);
    V g = VSPLAT(MA_ERFC_HG_FAST9);
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST8));
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST7));
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST6));
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST5));
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST4));
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST3));
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST2));
    g = VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST1));
    return VFMA(g, t, VSPLAT(MA_ERFC_HG_FAST0));
}
#endif

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
/* a b + c - p for p = a b + c rounded (c - p exact: the caller's c and p are within a factor 2 of each other,
 * or c is 1 and p a float in [1, 2^24]). */
MA_INLINE V ma_fma_err(V a, V b, V c, V p) { return (float)((double)a * (double)b + ((double)c - (double)p)); }
#else
MA_INLINE V ma_mul_err(V a, V b, V p) { return VFMA(a, b, -p); }
MA_INLINE V ma_div_err(V x, V b, V q) { return VFMA(-q, b, x); }
MA_INLINE V ma_fma_err(V a, V b, V c, V p) { return VFMA(a, b, c - p); }
#endif

/* num / (1 + sqrt2 b), b >= 0, to about 0.6 ulp: the denominator d = 1 + sqrt2 b carried as d + dlo (its
 * rounding and sqrt2's), the quotient num / d corrected once by its exact residual (gelu's fast paths:
 * a plain division by the rounded d costs 1.3 ULP of gelu). */
MA_INLINE V ma_div_1p_sqrt2(V num, V b) {
    V S2 = VSPLAT(1.41421356237309505f);
    V d = VFMA(S2, b, ONE_F);
    V dlo = VFMA(b, VSPLAT((float)(1.41421356237309505 - (double)1.41421356237309505f)), ma_fma_err(S2, b, ONE_F, d));
    V r = ONE_F / d, q = num * r;
    return VFMA(ma_div_err(num, d, q) - q * dlo, r, q);
}

/* The standard normal at x, for gelu: cdf and pdf sharing e^(-x^2/2) (scaled by sc).
 * left: x <= 0, where cdf = cdfK * sc; elsewhere cdf = 1 - (cdfK * sc) is returned as cdf_right. */
MA_INLINE void ma_normal_parts(V x, V *cdfK, V *pdfK, V *sc) {
    V xc = ma_clampv(x, -1e5f, 1e5f);
    V h = xc * xc;
    V l = ma_sq_lo(xc, h);
    V em, pK = ma_expneg_k2s(VSPLAT(-0.5f) * h, VSPLAT(-0.5f) * l, sc, &em); /* eK = pK (1 + em) */
    V b = ma_abs(xc), G = ma_erfc_g(ma_erfc_t(b)), k = VSPLAT(0.39894228040143268f);
    /* pK (G + G em), not eK rounded times G: half an ulp less (the backward reached 4.06 ULP at x = -12.16) */
    *cdfK = ma_div_1p_sqrt2((VSPLAT(0.5f) * pK) * VFMA(G, em, G), b); /* 0.5 erfc(|x|/sqrt2), scaled */
    *pdfK = pK * VFMA(k, em, k);
}

#endif
