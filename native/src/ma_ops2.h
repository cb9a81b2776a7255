/* Second derivatives: g dy f''(x), the backward of the backward with respect to x (`ma.backward2`, the
 * double backward of multiact.torch), one body per kernel key, (g, dy, x) -> result.  The formulas and
 * conventions are multiact/reference.py's (<op>_grad2) and their float32 forms multiact/backend/formulas.py's:
 * the product is (g dy) f''(x), so a zero g dy keeps the reference's zero signs; on a linear piece f'' is +0
 * whatever g and dy are (NaN only from x); at a kink of f' (relu's 0, hardswish's +-3, elu's 0, softplus's
 * beta x = threshold) it is 0, as PyTorch's double backward takes it.  Exponential tails are carried scaled
 * (ma_expneg_k2's eK, sc applied last) and exponents that are products (k x, x^2 / 2) as hi + lo pairs, as the
 * first-order bodies do.  No fast paths: one general body per key. */
#ifndef MA_OPS2_H
#define MA_OPS2_H

#include "ma_ops.h"
#include "ma_kernel_list.h" /* MA_ZERO_GRAD2_LIST, generated from the definitions (native/kernels.py) */

/* f'' = 0 (piecewise linear): one body per key of MA_ZERO_GRAD2_LIST, the ops whose definition says
 * piecewise_linear (prelu's for every weight: the kernel takes none) */
#define MA_ZERO_GRAD2(name)                                                       \
    MA_INLINE V op_##name##_grad2(V g, V dy, V x, const ma_params *p) {           \
        (void)g, (void)dy, (void)p;                                               \
        return KEEPNAN(x, ZERO);                                                  \
    }
MA_ZERO_GRAD2_LIST

MA_INLINE V op_hardswish_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p; /* 1/3 on the open middle piece, 0 at the kinks (PyTorch) */
    VM mid = MAND(x > VSPLAT(-3.0f), x < VSPLAT(3.0f));
    return KEEPNAN(x, VSEL(mid, (g * dy) * VSPLAT((S)(1.0 / 3.0)), ZERO));
}

/* -2 sign(x) / (1 + |x|)^3, divided thrice (the cube never overflows); 0 at x = 0 */
MA_INLINE V op_softsign_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V d = ONE + ma_abs(x);
    V s = VSEL(x > ZERO, VSPLAT(-2.0f), VSEL(x < ZERO, VSPLAT(2.0f), ZERO));
    return (((g * dy) * s) / d) / d / d;
}

/* Everything below computes with float32 math (ma_math.h): no float64 kernels (native/kernels.py reads the
 * bodies above this line as the float64 ones). */
#if !defined(MA_F64)

/* (g dy) (k e^x) below 0, +0 from 0 up (PyTorch's x < 0 mask) */
MA_INLINE V ma_k_exp_grad2(V gd, V x, float k) {
    V sc, eK = ma_expneg_k(VLT_SEL(ZERO, x), &sc);
    return KEEPNAN(x, VSEL(x < ZERO, (gd * (VSPLAT(k) * eK)) * sc, ZERO));
}
MA_INLINE V op_elu_grad2(V g, V dy, V x, const ma_params *p) { return ma_k_exp_grad2(g * dy, x, p->a); }
MA_INLINE V op_selu_grad2(V g, V dy, V x, const ma_params *p) { return ma_k_exp_grad2(g * dy, x, p->b * p->a); }
/* e^(x / alpha) / alpha below 0; x / alpha as z + zlo (op_celu_grad's), for alpha < 0 a plain exponential */
MA_INLINE V op_celu_grad2(V g, V dy, V x, const ma_params *p) {
    V a = VSPLAT(p->a), z = x / a, gd = g * dy, r;
    if (p->a > 0.0f) {
        V zlo = VSEL(ma_abs(z) < VSPLAT(1e30f), ma_div_err(x, a, z) * VSPLAT(1.0f / p->a), ZERO);
        V sc, eK = ma_expneg_k2(VLT_SEL(ZERO, z), VSEL(z < ZERO, zlo, ZERO), &sc);
        r = (gd * (eK / a)) * sc;
    } else {
        r = gd * (ma_exp(z) / a);
    }
    return KEEPNAN(x, VSEL(x < ZERO, r, ZERO));
}

/* e (1 - e) / (1 + e)^3, e = e^-ax (ax >= 0), as q with the value q * sc: sigmoid''(x) is -sign(x) times it at
 * ax = |x|, tanh''(x) 8 times that at ax = 2|x|.  1 - e = -expm1(-ax) (no cancellation near 0). */
MA_INLINE V ma_bell3(V ax, V *sc) {
    V eK = ma_expneg_k(-ax, sc);
    V e = eK * *sc;
    return (eK * (ZERO - ma_expm1(-ax))) * (ma_inv_sq_1pe(e) / (ONE + e));
}
MA_INLINE V op_sigmoid_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V sc, q = ma_bell3(ma_abs(x), &sc);
    return ((g * dy) * VSEL(x >= ZERO, ZERO - q, q)) * sc;
}
MA_INLINE V op_logsigmoid_grad2(V g, V dy, V x, const ma_params *p) { /* -e / (1 + e)^2 */
    (void)p;
    V sc, eK = ma_expneg_k(-ma_abs(x), &sc);
    return ((g * dy) * (ZERO - eK * ma_inv_sq_1pe(eK * sc))) * sc;
}
/* tanh'' = -2 tanh sech^2 = -8 sign(x) bell3(2|x|); tanhshrink'' its negative */
MA_INLINE V ma_tanh_grad2(V gd, V x, V pos_sign) {
    V ax = ma_abs(x);
    V sc, q = ma_bell3(ax + ax, &sc);
    return (gd * (VSPLAT(8.0f) * VSEL(x >= ZERO, pos_sign * q, -pos_sign * q))) * sc;
}
MA_INLINE V op_tanh_grad2(V g, V dy, V x, const ma_params *p) { (void)p; return ma_tanh_grad2(g * dy, x, -ONE); }
MA_INLINE V op_tanhshrink_grad2(V g, V dy, V x, const ma_params *p) { (void)p; return ma_tanh_grad2(g * dy, x, ONE); }

/* z = k x + zlo with |z| clamped to 1e5 (every sigmoid is 0 or 1 beyond; zlo dropped there) */
#define MA_Z_CLAMP(z, zlo)                                              \
    do {                                                                \
        zlo = VSEL(ma_abs(z) <= VSPLAT(1e5f), zlo, ZERO);               \
        z = ma_clampv(z, -1e5f, 1e5f);                                  \
    } while (0)

/* beta s(z) s(-z), z = beta x exactly as z + zlo; +0 from z = threshold up (PyTorch's z < threshold mask) */
MA_INLINE V op_softplus_grad2(V g, V dy, V x, const ma_params *p) {
    V b = VSPLAT(p->a), z = x * b, zlo = ma_mul_err(x, b, z);
    VM linear = MOR(MOR(z > VSPLAT(p->b), MAND(z == VSPLAT(p->b), zlo >= ZERO)), z == VSPLAT(__builtin_inff()));
    MA_Z_CLAMP(z, zlo);
    VM neg = z < ZERO;
    V sc, eK = ma_expneg_k2(-ma_abs(z), VSEL(neg, zlo, -zlo), &sc);
    V r = ((g * dy) * (b * (eK * ma_inv_sq_1pe(eK * sc)))) * sc;
    return KEEPNAN(x, VSEL(linear, ZERO, r));
}
/* x sigmoid(k x): f'' = k s s' (2 - z tanh(z / 2)), z = k x as z + zlo (klo: the constant's own rounding, where
 * k is not a float); s s' = e / (1 + e)^2 and |z| tanh(|z| / 2) = |z| (1 - e) / (1 + e), e = e^-|z|. */
MA_INLINE V ma_swish_grad2(V gd, V x, V k, V klo, int has_klo) {
    V xc = ma_finite(x), z = xc * k, zlo = ma_mul_err(xc, k, z);
    if (has_klo) zlo = VFMA(xc, klo, zlo);
    MA_Z_CLAMP(z, zlo);
    VM neg = z < ZERO;
    V az = ma_abs(z);
    V sc, eK = ma_expneg_k2(-az, VSEL(neg, zlo, -zlo), &sc);
    V e = eK * sc;
    V w = az * ((ZERO - ma_expm1(-az)) / (ONE + e));
    return (gd * ((k * (eK * ma_inv_sq_1pe(e))) * (VSPLAT(2.0f) - w))) * sc;
}
MA_INLINE V op_silu_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    return ma_swish_grad2(g * dy, x, ONE, ZERO, 0);
}
MA_INLINE V op_swish_grad2(V g, V dy, V x, const ma_params *p) { return ma_swish_grad2(g * dy, x, VSPLAT(p->a), ZERO, 0); }
MA_INLINE V op_fast_gelu_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    return ma_swish_grad2(g * dy, x, VSPLAT(MA_FAST_GELU_K), VSPLAT(MA_FAST_GELU_KLO), 1);
}

/* pdf(x) (2 - x^2), x^2 exact as sh + sl */
MA_INLINE V op_gelu_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_clampv(x, -1e5f, 1e5f);
    V sh = xc * xc, sl = ma_mul_err(xc, xc, sh);
    V sc, eK = ma_expneg_k2(VSPLAT(-0.5f) * sh, VSPLAT(-0.5f) * sl, &sc);
    return ((g * dy) * ((VSPLAT(0.39894228040143268f) * eK) * ((VSPLAT(2.0f) - sh) - sl))) * sc;
}
/* x s(z), z = 2k (x + c x^3): f'' = s s' (2 z' + x z'' - |x| tanh(|z| / 2) z'^2) (x and z share a sign),
 * z' = 2k (1 + 3c x^2), x z'' = 2k 6c x^2; z + zlo from ma_gelu_tanh_z (double) */
MA_INLINE V op_gelu_tanh_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_clampv(x, -1e5f, 1e5f);
    V zlo, z = ma_gelu_tanh_z(xc, &zlo);
    VM neg = z < ZERO;
    V az = ma_abs(z);
    V sc, eK = ma_expneg_k2(-az, VSEL(neg, zlo, -zlo), &sc);
    V e = eK * sc, x2 = xc * xc;
    V c3 = VSPLAT(3.0f * GELU_TANH_C), k2 = VSPLAT(GELU_TANH_2K);
    V dz = k2 * (ONE + c3 * x2);
    V th = (ZERO - ma_expm1(-az)) / (ONE + e);
    V inner = ((dz + dz) + (k2 * (c3 + c3)) * x2) - (ma_abs(xc) * th) * (dz * dz);
    return ((g * dy) * ((eK * ma_inv_sq_1pe(e)) * inner)) * sc;
}

/* x tanh(softplus(x)): with u = e^x, D = u^2 + 2u + 2, f'' = (4u / D^2) (2 (1 + u) + x (D - 2u^2 (u + 2)) / D);
 * in e = e^-|x| (scaled by sc below 0): x >= 0: (4e^2 / den^2) (2 (1 + e) + x (e den - 2 num) / den) with
 * den = 1 + 2e + 2e^2, num = 1 + 2e; x < 0: u = e and the result times sc. */
MA_INLINE V op_mish_grad2(V g, V dy, V x, const ma_params *p) {
    (void)p;
    V two = VSPLAT(2.0f);
    V xc = ma_clampv(x, -1e5f, 1e5f); /* e = 0 beyond: no x * 0 * inf */
    V sc, eK = ma_expneg_k(-ma_abs(xc), &sc);
    V e = eK * sc, e2 = e + e;
    VM pos = x >= ZERO;
    V den = VSEL(pos, ONE + e2 + (e * e + e * e), e * (e + two) + two);
    V c = VSEL(pos, ((e2 + two) * e - VSPLAT(3.0f)) * e - two, den - e2 * (e * (e + two)));
    /* x >= 0: e^2 is below float32's normals from x = 43.7 while the result is not (to x = 47): one
       factor e last, as sc below 0 */
    V pre = (VSPLAT(4.0f) * VSEL(pos, e, eK)) / (den * den);
    V r = (g * dy) * (pre * (two * (ONE + e) + xc * (c / den)));
    return r * VSEL(pos, e, sc);
}

#endif /* !MA_F64 */

#endif
