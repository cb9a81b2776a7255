/* The float64 bodies of the ops that need exponential math (ma_math64.h): the float64 units only (MA_F64).
 * The piecewise linear and rational ops share their bodies with float32 (ma_ops.h, ma_ops2.h above their
 * `#if !defined(MA_F64)` lines); these are the reference's formulas (multiact/reference.py) as they stand,
 * evaluated in double: float64 has no wider type to carry a rounded argument's error, and the contract's
 * float64 bound allows the reference's own (cond terms of multiact/optable.py).  Parameters are the double
 * fields (PA, PB).  native/kernels.py reads every op_<name> here as a float64 kernel. */
#ifndef MA_OPS64_H
#define MA_OPS64_H

#include "ma_ops2.h"
#include "ma_math64.h"

#define M64_ONE_BELOW 0x1.fffffffffffffp-1 /* the double below 1: times it, a normal value steps one ulp to 0 */
#define M64_BIG 1.7976931348623157e308     /* DBL_MAX: x clamped to the finite range, so that inf * 0 stays out */
#define M64_GELU_TANH_K 0.7978845608028654 /* sqrt(2 / pi) */
#define M64_GELU_TANH_C 0.044715
#define M64_FAST_GELU_K 1.702

/* ---- exponential family ---- */
MA_INLINE V op_elu(V x, const ma_params *p) { return VSEL(x > ZERO, x, VSPLAT(PA(p)) * m64_expm1(x)); }
MA_INLINE V op_elu_grad(V dy, V x, const ma_params *p) {
    return VSEL(x > ZERO, dy, dy * (VSPLAT(PA(p)) * m64_exp(x)));
}
MA_INLINE V op_elu_grad_y(V dy, V y, const ma_params *p) { return VSEL(y > ZERO, dy, dy * (y + VSPLAT(PA(p)))); }
/* (g dy) (k e^x) below 0, +0 from 0 up (PyTorch's x < 0 mask) */
MA_INLINE V m64_k_exp_grad2(V gd, V x, S k) { return KEEPNAN(x, VSEL(x < ZERO, gd * (VSPLAT(k) * m64_exp(x)), ZERO)); }
MA_INLINE V op_elu_grad2(V g, V dy, V x, const ma_params *p) { return m64_k_exp_grad2(g * dy, x, PA(p)); }

/* selu(alpha = PA, scale = PB): where x (or y) < 0 is too small to change e^x - 1, e^x or y + scale alpha, the
 * value one ulp toward the true side (ma_ops.h's op_selu, the reference's _below) */
MA_INLINE V op_selu(V x, const ma_params *p) {
    V e = m64_expm1(x);
    e = VSEL(MAND(e == x, x < ZERO), x * VSPLAT(M64_ONE_BELOW), e);
    return VSEL(x > ZERO, VSPLAT(PB(p)) * x, VSPLAT(PB(p) * PA(p)) * e);
}
MA_INLINE V op_selu_grad(V dy, V x, const ma_params *p) {
    V e = m64_exp(x);
    e = VSEL(MAND(e == ONE, x < ZERO), VSPLAT(M64_ONE_BELOW), e);
    return VSEL(x > ZERO, dy * VSPLAT(PB(p)), dy * (VSPLAT(PB(p) * PA(p)) * e));
}
MA_INLINE V op_selu_grad_y(V dy, V y, const ma_params *p) {
    S hi = PB(p) * PA(p);
    V t = y + VSPLAT(hi);
    if (hi > 0) t = VSEL(MAND(t == VSPLAT(hi), y < ZERO), VSPLAT(hi * M64_ONE_BELOW), t);
    return VSEL(y > ZERO, dy * VSPLAT(PB(p)), dy * (t + ZERO)); /* + 0: the reference's + lo, 0 in float64 */
}
MA_INLINE V op_selu_grad2(V g, V dy, V x, const ma_params *p) { return m64_k_exp_grad2(g * dy, x, PB(p) * PA(p)); }

MA_INLINE V op_celu(V x, const ma_params *p) {
    V a = VSPLAT(PA(p));
    return VSEL(x > ZERO, x, a * m64_expm1(x / a));
}
MA_INLINE V op_celu_grad(V dy, V x, const ma_params *p) { return VSEL(x > ZERO, dy, dy * m64_exp(x / VSPLAT(PA(p)))); }
MA_INLINE V op_celu_grad_y(V dy, V y, const ma_params *p) { return VSEL(y > ZERO, dy, dy * (y / VSPLAT(PA(p)) + ONE)); }
MA_INLINE V op_celu_grad2(V g, V dy, V x, const ma_params *p) {
    V a = VSPLAT(PA(p));
    return KEEPNAN(x, VSEL(x < ZERO, (g * dy) * (m64_exp(x / a) / a), ZERO));
}

/* ---- sigmoid, logsigmoid, tanh, softplus ---- */
MA_INLINE V op_sigmoid(V x, const ma_params *p) { (void)p; return m64_sigmoid(x); }
MA_INLINE V op_sigmoid_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V s, sn;
    m64_sigmoid2(x, &s, &sn);
    return dy * (s * sn);
}
MA_INLINE V op_sigmoid_grad_y(V dy, V y, const ma_params *p) { (void)p; return dy * (y * (ONE - y)); }
MA_INLINE V op_sigmoid_grad2(V g, V dy, V x, const ma_params *p) { /* s (1 - s) (1 - 2 s) */
    (void)p;
    V s, sn;
    m64_sigmoid2(x, &s, &sn);
    return (g * dy) * ((s * sn) * (sn - s));
}

MA_INLINE V op_logsigmoid(V x, const ma_params *p) {
    (void)p;
    return VLT_SEL(ZERO, x) - m64_log1p01(m64_exp(-ma_abs(x)));
}
MA_INLINE V op_logsigmoid_grad(V dy, V x, const ma_params *p) { (void)p; return dy * m64_sigmoid(-x); }
MA_INLINE V op_logsigmoid_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V s, sn;
    m64_sigmoid2(x, &s, &sn);
    return (g * dy) * -(s * sn);
}

MA_INLINE V op_tanh(V x, const ma_params *p) { (void)p; return m64_tanh(x); }
MA_INLINE V op_tanh_grad(V dy, V x, const ma_params *p) { (void)p; return dy * m64_sech2(x); }
MA_INLINE V op_tanh_grad_y(V dy, V y, const ma_params *p) { (void)p; return dy * ((ONE - y) * (ONE + y)); }
MA_INLINE V op_tanh_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    return (g * dy) * (VSPLAT(-2.0) * (m64_tanh(x) * m64_sech2(x)));
}

/* softplus(beta = PA, threshold = PB): x where beta x > threshold */
MA_INLINE V op_softplus(V x, const ma_params *p) {
    V b = VSPLAT(PA(p)), z = x * b;
    return VSEL(z > VSPLAT(PB(p)), x, m64_softplus0(z) / b);
}
MA_INLINE V op_softplus_grad(V dy, V x, const ma_params *p) {
    V z = x * VSPLAT(PA(p));
    return KEEPNAN(x, VSEL(z > VSPLAT(PB(p)), dy, dy * m64_sigmoid(z)));
}
MA_INLINE V op_softplus_grad2(V g, V dy, V x, const ma_params *p) { /* +0 from the kink beta x = threshold up */
    V b = VSPLAT(PA(p)), z = x * b, s, sn;
    m64_sigmoid2(z, &s, &sn);
    return KEEPNAN(x, VSEL(z < VSPLAT(PB(p)), (g * dy) * (b * (s * sn)), ZERO));
}

/* ---- x * sigmoid(z) family: swish (z = beta x), silu, fast_gelu, gelu(tanh) ---- */
/* s = sigmoid(z), sn = sigmoid(-z) for z = k xc, xc = x clamped to the finite range */
MA_INLINE V m64_swish_parts(V x, V k, V *s, V *sn) {
    V xc = ma_clampv(x, -M64_BIG, M64_BIG);
    m64_sigmoid2(xc * k, s, sn);
    return xc;
}
MA_INLINE V m64_swish(V x, V k) {
    V s, sn;
    m64_swish_parts(x, k, &s, &sn);
    return GATED(x, s);
}
MA_INLINE V m64_swish_grad(V dy, V x, V k) {
    V s, sn, xc = m64_swish_parts(x, k, &s, &sn);
    return dy * (s + ((xc * s) * sn) * k);
}
/* k s s' (2 + k x (s' - s)) */
MA_INLINE V m64_swish_grad2(V gd, V x, V k) {
    V s, sn, xc = m64_swish_parts(x, k, &s, &sn);
    V q = s * sn;
    return gd * (k * (VSPLAT(2.0) * q + ((xc * q) * (sn - s)) * k));
}
MA_INLINE V op_silu(V x, const ma_params *p) { (void)p; return m64_swish(x, ONE); }
MA_INLINE V op_silu_grad(V dy, V x, const ma_params *p) { (void)p; return m64_swish_grad(dy, x, ONE); }
MA_INLINE V op_silu_grad2(V g, V dy, V x, const ma_params *p) { (void)p; return m64_swish_grad2(g * dy, x, ONE); }
MA_INLINE V op_swish(V x, const ma_params *p) { return m64_swish(x, VSPLAT(PA(p))); }
MA_INLINE V op_swish_grad(V dy, V x, const ma_params *p) { return m64_swish_grad(dy, x, VSPLAT(PA(p))); }
MA_INLINE V op_swish_grad2(V g, V dy, V x, const ma_params *p) { return m64_swish_grad2(g * dy, x, VSPLAT(PA(p))); }
MA_INLINE V op_fast_gelu(V x, const ma_params *p) { (void)p; return m64_swish(x, VSPLAT(M64_FAST_GELU_K)); }
MA_INLINE V op_fast_gelu_grad(V dy, V x, const ma_params *p) {
    (void)p;
    return m64_swish_grad(dy, x, VSPLAT(M64_FAST_GELU_K));
}
MA_INLINE V op_fast_gelu_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    return m64_swish_grad2(g * dy, x, VSPLAT(M64_FAST_GELU_K));
}

/* gelu(tanh): x sigmoid(z), z = 2k (xc + c xc^3), xc = x clamped to +-1e5 */
MA_INLINE V m64_gelu_tanh_parts(V x, V *s, V *sn) {
    V xc = ma_clampv(x, -1e5, 1e5);
    V z = VSPLAT(2.0 * M64_GELU_TANH_K) * (xc + VSPLAT(M64_GELU_TANH_C) * ((xc * xc) * xc));
    m64_sigmoid2(z, s, sn);
    return xc;
}
MA_INLINE V op_gelu_tanh(V x, const ma_params *p) {
    (void)p;
    V s, sn;
    m64_gelu_tanh_parts(x, &s, &sn);
    return GATED(x, s);
}
MA_INLINE V m64_gelu_tanh_dz(V xc) {
    return VSPLAT(2.0 * M64_GELU_TANH_K) * (ONE + VSPLAT(3.0 * M64_GELU_TANH_C) * (xc * xc));
}
MA_INLINE V op_gelu_tanh_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V s, sn, xc = m64_gelu_tanh_parts(x, &s, &sn);
    return dy * (s + ((xc * s) * sn) * m64_gelu_tanh_dz(xc));
}
/* s s' (2 z' + x z'^2 (s' - s) + x z'') */
MA_INLINE V op_gelu_tanh_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V s, sn, xc = m64_gelu_tanh_parts(x, &s, &sn);
    V dz = m64_gelu_tanh_dz(xc), ddz = VSPLAT(2.0 * M64_GELU_TANH_K) * (VSPLAT(6.0 * M64_GELU_TANH_C) * xc);
    V q = s * sn;
    return (g * dy) * (q * (VSPLAT(2.0) * dz + xc * ddz) + ((xc * q) * (dz * dz)) * (sn - s));
}

/* gelu (erf form): x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 and phi(xc) = e^(-xc^2 / 2) / sqrt(2 pi) with
 * -x / sqrt 2 and xc^2 rounded as the reference rounds them (its constants, below), then erfc (m64_erfc) and exp
 * to an ulp or two */
#define M64_INV_SQRT2 0x1.6a09e667f3bccp-1     /* 1.0 / math.sqrt(2.0), the reference's */
#define M64_INV_SQRT_2PI 0x1.9884533d43651p-2  /* 1.0 / math.sqrt(2.0 * math.pi), the reference's */
MA_INLINE V m64_gelu_cdf(V x) { return VSPLAT(0.5) * m64_erfc(-x * VSPLAT(M64_INV_SQRT2)); }
MA_INLINE V m64_gelu_pdf(V xc) { return VSPLAT(M64_INV_SQRT_2PI) * m64_exp(VSPLAT(-0.5) * (xc * xc)); }
MA_INLINE V op_gelu(V x, const ma_params *p) {
    (void)p;
    return GATED(x, m64_gelu_cdf(x));
}
MA_INLINE V op_gelu_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_clampv(x, -1e5, 1e5);
    return dy * (m64_gelu_cdf(x) + xc * m64_gelu_pdf(xc));
}
/* phi(x) (2 - x^2) */
MA_INLINE V op_gelu_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_clampv(x, -1e5, 1e5), pdf = m64_gelu_pdf(xc);
    return (g * dy) * (VSPLAT(2.0) * pdf - (xc * xc) * pdf);
}

/* ---- mish: x t, t = tanh(softplus(x)), from e = e^-|x| (no overflow, no cancellation):
 * x >= 0: t = (1 + 2e) / D, D = 1 + 2e + 2e^2, h = sech^2(softplus(x)) = 4 e^2 (1 + e)^2 / D^2;
 * x < 0:  t = n / D, n = e (e + 2), D = n + 2, h = 4 (1 + e)^2 / D^2.
 * Also sets s = sigmoid(x), sn = sigmoid(-x) (from the same e) where asked. ---- */
MA_INLINE V m64_mish_parts(V x, V *h, V *s, V *sn) {
    V e = m64_exp(-ma_abs(x));
    VM pos = x >= ZERO;
    V two = VSPLAT(2.0), ope = ONE + e;
    V n = e * (e + two);
    V D = VSEL(pos, ONE + (e + e) + (e * e + e * e), n + two);
    V t = VSEL(pos, ONE + (e + e), n) / D;
    if (h) {
        V f = VSEL(pos, e * ope, ope);
        *h = (VSPLAT(4.0) * (f * f)) / (D * D);
        V big = ONE / ope, small = e / ope;
        *s = VSEL(pos, big, small);
        *sn = VSEL(pos, small, big);
    }
    return t;
}
MA_INLINE V op_mish(V x, const ma_params *p) {
    (void)p;
    return GATED(x, m64_mish_parts(x, NULL, NULL, NULL));
}
MA_INLINE V op_mish_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V h, s, sn, t = m64_mish_parts(x, &h, &s, &sn);
    V xc = ma_clampv(x, -M64_BIG, M64_BIG);
    return dy * (t + (xc * s) * h);
}
/* s h (2 + x (s' - 2 t s)): x s h first, so that its tails are 0 before meeting x's growth */
MA_INLINE V op_mish_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V h, s, sn, t = m64_mish_parts(x, &h, &s, &sn);
    V xc = ma_clampv(x, -M64_BIG, M64_BIG);
    V sh = s * h;
    return (g * dy) * (VSPLAT(2.0) * sh + ((xc * sh) * (sn - VSPLAT(2.0) * (t * s))));
}

/* ---- tanhshrink: x - tanh(x); |x| < 1: x^3 T(x^2), the series of the definitions (ma_series64.h, generated);
 * else sign(x) ((|x| - 1) + 2e / (1 + e)), e = e^-2|x| (no cancellation: x - tanh(x) >= 0.238 there) ---- */
#include "ma_series64.h"
MA_INLINE V op_tanhshrink(V x, const ma_params *p) {
    (void)p;
    V x2 = x * x;
    V t = VSPLAT(m64_tanhshrink_c[M64_TANHSHRINK_N - 1]);
    for (int k = M64_TANHSHRINK_N - 2; k >= 0; k--) t = VFMA(t, x2, VSPLAT(m64_tanhshrink_c[k]));
    V small = x * (x2 * t);
    V a = ma_abs(x);
    V e = m64_exp(VSPLAT(-2.0) * a);
    V big = ma_copysign((a - ONE) + (e + e) / (ONE + e), x);
    return VSEL(a < ONE, small, big) + ZERO; /* + 0: a zero result is +0, as x - tanh(x) gives at x = -0 */
}
MA_INLINE V op_tanhshrink_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V t = m64_tanh(x);
    return dy * (t * t);
}
MA_INLINE V op_tanhshrink_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    return (g * dy) * (VSPLAT(2.0) * (m64_tanh(x) * m64_sech2(x)));
}

#endif
