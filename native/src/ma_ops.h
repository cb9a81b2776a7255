/* One body per op and direction, written once against ma_simd.h / ma_math.h.
 * The formulas and every convention (kinks, NaN, +-inf) follow multiact/reference.py:
 * forward bodies take (x), backward bodies (dy, x), backward_y bodies (dy, y).
 * Parameters arrive in ma_params (see ma_native.h for which field holds what). */
#ifndef MA_OPS_H
#define MA_OPS_H

#include "ma_math.h"
#include "ma_native.h"

#define ZERO VSPLAT(0.0f)
#define ONE VSPLAT(1.0f)
/* r, or NaN where x is NaN (piecewise formulas would drop it): the reference's _keepnan. */
#define KEEPNAN(x, r) VSEL(ma_isnan(x), (x), (r))
/* x * s, 0 where s is 0 (so that -inf * 0 is 0): the reference's _gated. */
#define GATED(x, s) VSEL((s) == ZERO, ZERO, (x) * (s))

#define SELU_ALPHA 1.6732632423543772848170429916717f
#define SELU_SCALE 1.0507009873554804934193349852946f
#define SELU_SA (1.6732632423543772848170429916717f * 1.0507009873554804934193349852946f)
#define GELU_TANH_2K 1.5957691216057308f /* 2 sqrt(2/pi) */
#define GELU_TANH_C 0.044715f

/* ---- piecewise linear ---- */
MA_INLINE V op_relu(V x, const ma_params *p) { (void)p; return VSEL(x < ZERO, ZERO, x); }
MA_INLINE V op_relu_grad(V dy, V x, const ma_params *p) { (void)p; return KEEPNAN(x, VSEL(x > ZERO, dy, ZERO)); }
MA_INLINE V op_relu6(V x, const ma_params *p) { (void)p; return ma_clampv(x, 0.0f, 6.0f); }
MA_INLINE V op_relu6_grad(V dy, V x, const ma_params *p) {
    (void)p;
    return KEEPNAN(x, VSEL(MAND(x > ZERO, x < VSPLAT(6.0f)), dy, ZERO));
}
MA_INLINE V op_leaky_relu(V x, const ma_params *p) { return VSEL(x > ZERO, x, x * VSPLAT(p->a)); }
MA_INLINE V op_leaky_relu_grad(V dy, V x, const ma_params *p) { return KEEPNAN(x, VSEL(x > ZERO, dy, dy * VSPLAT(p->a))); }
MA_INLINE V op_hardtanh(V x, const ma_params *p) { return ma_clampv(x, p->a, p->b); }
MA_INLINE V op_hardtanh_grad(V dy, V x, const ma_params *p) {
    return KEEPNAN(x, VSEL(MAND(x > VSPLAT(p->a), x < VSPLAT(p->b)), dy, ZERO));
}
MA_INLINE V op_hardswish(V x, const ma_params *p) {
    (void)p;
    V mid = (x * (x + VSPLAT(3.0f))) / VSPLAT(6.0f);
    return VSEL(x <= VSPLAT(-3.0f), ZERO, VSEL(x >= VSPLAT(3.0f), x, mid));
}
MA_INLINE V op_hardswish_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V mid = dy * (x / VSPLAT(3.0f) + VSPLAT(0.5f));
    return KEEPNAN(x, VSEL(x <= VSPLAT(-3.0f), ZERO, VSEL(x < VSPLAT(3.0f), mid, dy)));
}
MA_INLINE V op_hardsigmoid(V x, const ma_params *p) {
    (void)p;
    V mid = (x + VSPLAT(3.0f)) / VSPLAT(6.0f);
    return VSEL(x <= VSPLAT(-3.0f), ZERO, VSEL(x >= VSPLAT(3.0f), ONE, mid));
}
MA_INLINE V op_hardsigmoid_grad(V dy, V x, const ma_params *p) {
    (void)p;
    return KEEPNAN(x, VSEL(MAND(x > VSPLAT(-3.0f), x < VSPLAT(3.0f)), dy / VSPLAT(6.0f), ZERO));
}
MA_INLINE V op_softshrink(V x, const ma_params *p) {
    V lam = VSPLAT(p->a);
    return KEEPNAN(x, VSEL(x > lam, x - lam, VSEL(x < -lam, x + lam, ZERO)));
}
MA_INLINE V op_hardshrink(V x, const ma_params *p) { return KEEPNAN(x, VSEL(ma_abs(x) > VSPLAT(p->a), x, ZERO)); }
MA_INLINE V op_shrink_grad(V dy, V x, const ma_params *p) { return KEEPNAN(x, VSEL(ma_abs(x) > VSPLAT(p->a), dy, ZERO)); }
MA_INLINE V op_threshold(V x, const ma_params *p) { return VSEL(x <= VSPLAT(p->a), VSPLAT(p->b), x); }
MA_INLINE V op_threshold_grad(V dy, V x, const ma_params *p) { return KEEPNAN(x, VSEL(x <= VSPLAT(p->a), ZERO, dy)); }

/* ---- exponential family ---- */
/* alpha * e^x for x <= 0 times dy, with the tail scaling applied last. */
MA_INLINE V ma_dy_alpha_exp(V dy, V x, float alpha) {
    V sc;
    V eK = ma_expneg_k(VSEL(x > ZERO, ZERO, x), &sc);
    return (dy * (VSPLAT(alpha) * eK)) * sc;
}
MA_INLINE V op_elu(V x, const ma_params *p) { return VSEL(x > ZERO, x, VSPLAT(p->a) * ma_expm1(x)); }
MA_INLINE V op_elu_grad(V dy, V x, const ma_params *p) { return VSEL(x > ZERO, dy, ma_dy_alpha_exp(dy, x, p->a)); }
MA_INLINE V op_elu_grad_y(V dy, V y, const ma_params *p) { return VSEL(y > ZERO, dy, dy * (y + VSPLAT(p->a))); }
MA_INLINE V op_selu(V x, const ma_params *p) {
    (void)p;
    return VSEL(x > ZERO, VSPLAT(SELU_SCALE) * x, VSPLAT(SELU_SA) * ma_expm1(x));
}
MA_INLINE V op_selu_grad(V dy, V x, const ma_params *p) {
    (void)p;
    return VSEL(x > ZERO, dy * VSPLAT(SELU_SCALE), ma_dy_alpha_exp(dy, x, SELU_SA));
}
MA_INLINE V op_selu_grad_y(V dy, V y, const ma_params *p) {
    (void)p;
    return VSEL(y > ZERO, dy * VSPLAT(SELU_SCALE), dy * (y + VSPLAT(SELU_SA)));
}
MA_INLINE V op_celu(V x, const ma_params *p) {
    V a = VSPLAT(p->a);
    return VSEL(x > ZERO, x, a * ma_expm1(x / a));
}
MA_INLINE V op_celu_grad(V dy, V x, const ma_params *p) {
    V z = x / VSPLAT(p->a);
    if (p->a > 0.0f) return VSEL(x > ZERO, dy, ma_dy_alpha_exp(dy, z, 1.0f)); /* z <= 0 where used */
    return VSEL(x > ZERO, dy, dy * ma_exp(z));
}
MA_INLINE V op_celu_grad_y(V dy, V y, const ma_params *p) {
    return VSEL(y > ZERO, dy, dy * (y / VSPLAT(p->a) + ONE));
}

/* e = e^-|z| (scaled eK, sc) and inv = 1 / (1 + e): sigmoid(z) = inv (z >= 0) or e * inv (z < 0). */
#define MA_SIG_PARTS(z, eK, sc, inv)                          \
    V sc;                                                     \
    V eK = ma_expneg_k(-ma_abs(z), &sc);                      \
    V inv = ONE / (ONE + eK * sc)
/* The same for z + zlo, zlo a correction below ulp(z) (z computed in double and split). */
#define MA_SIG_PARTS2(z, zlo, eK, sc, inv)                                        \
    V sc;                                                                         \
    V eK = ma_expneg_k2(-ma_abs(z), VSEL((z) < ZERO, (zlo), -(zlo)), &sc);         \
    V inv = ONE / (ONE + eK * sc)

MA_INLINE V op_sigmoid(V x, const ma_params *p) {
    (void)p;
    MA_SIG_PARTS(x, eK, sc, inv);
    return VSEL(x >= ZERO, inv, (eK * inv) * sc);
}
/* 1 / (1 + e)^2 for e in [0, 1] with 1 + e carried exactly (d + c): about 1 ULP. */
MA_INLINE V ma_inv_sq_1pe(V e) {
    V d = ONE + e;
    V c = e - (d - ONE);
    V r = ONE / (d * d);
    return r - (VSPLAT(2.0f) * c) * (r / d);
}
MA_INLINE V op_sigmoid_grad(V dy, V x, const ma_params *p) { /* dy e / (1 + e)^2 */
    (void)p;
    V sc;
    V eK = ma_expneg_k(-ma_abs(x), &sc);
    return (dy * (eK * ma_inv_sq_1pe(eK * sc))) * sc;
}
MA_INLINE V op_sigmoid_grad_y(V dy, V y, const ma_params *p) { (void)p; return dy * (y * (ONE - y)); }
MA_INLINE V op_logsigmoid(V x, const ma_params *p) {
    (void)p;
    V sc;
    V eK = ma_expneg_k(-ma_abs(x), &sc);
    return VSEL(x < ZERO, x, ZERO) - ma_log1p01(eK * sc);
}
MA_INLINE V op_logsigmoid_grad(V dy, V x, const ma_params *p) { /* dy * sigmoid(-x) */
    (void)p;
    MA_SIG_PARTS(x, eK, sc, inv);
    return VSEL(x > ZERO, (dy * (eK * inv)) * sc, dy * inv);
}
MA_INLINE V op_tanh(V x, const ma_params *p) { (void)p; return ma_tanh(x); }
MA_INLINE V op_tanh_grad(V dy, V x, const ma_params *p) { /* dy * 4e / (1 + e)^2, e = e^-2|x| */
    (void)p;
    V sc;
    V eK = ma_expneg_k(VSPLAT(-2.0f) * ma_abs(x), &sc);
    return (dy * ((VSPLAT(4.0f) * eK) * ma_inv_sq_1pe(eK * sc))) * sc;
}
MA_INLINE V op_tanh_grad_y(V dy, V y, const ma_params *p) { (void)p; return dy * ((ONE - y) * (ONE + y)); }
MA_INLINE V op_softplus(V x, const ma_params *p) {
    V b = VSPLAT(p->a);
    V z = x * b;
    V sc;
    V eK = ma_expneg_k(-ma_abs(z), &sc);
    V body = (VSEL(z > ZERO, z, ZERO) + ma_log1p01(eK * sc)) / b;
    /* deep left tail: log1p(e) = e, keep it scaled until the end */
    V tail = (eK / b) * sc;
    V r = VSEL(MAND(z < ZERO, sc < ONE), tail, body);
    return VSEL(z > VSPLAT(p->b), x, r);
}
MA_INLINE V op_softplus_grad(V dy, V x, const ma_params *p) {
    V z = x * VSPLAT(p->a);
    MA_SIG_PARTS(z, eK, sc, inv);
    V g = VSEL(z >= ZERO, dy * inv, (dy * (eK * inv)) * sc);
    return KEEPNAN(x, VSEL(z > VSPLAT(p->b), dy, g));
}
MA_INLINE V op_softsign(V x, const ma_params *p) {
    (void)p;
    V a = ma_abs(x);
    return VSEL(a == VSPLAT(__builtin_inff()), ma_copysign(ONE, x), x / (ONE + a));
}
MA_INLINE V op_softsign_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V r = ONE / (ONE + ma_abs(x));
    return (dy * r) * r;
}

/* ---- x * sigmoid(z) family: silu, swish, fast_gelu, gelu(tanh) ---- */
/* x * sigmoid(z) */
MA_INLINE V ma_gate_fwd(V x, V z, V zlo) {
    MA_SIG_PARTS2(z, zlo, eK, sc, inv);
    VM neg = z < ZERO;
    V sm = VSEL(neg, eK * inv, inv);
    return GATED(x, sm) * VSEL(neg, sc, ONE);
}
/* dy * (s + ((xc * s) * sn) * k), s = sigmoid(z), sn = sigmoid(-z): one of s, sn carries sc. */
MA_INLINE V ma_gate_grad(V dy, V xc, V z, V zlo, V k) {
    MA_SIG_PARTS2(z, zlo, eK, sc, inv);
    VM neg = z < ZERO;
    V small = eK * inv;
    V sm = VSEL(neg, small, inv), snm = VSEL(neg, inv, small);
    V t = ((xc * sm) * snm) * k;
    V a = VSEL(neg, sm + t, sm + t * sc);
    V g = dy * a;
    return VSEL(neg, g * sc, g);
}
MA_INLINE V op_swish(V x, const ma_params *p) { return ma_gate_fwd(x, ma_finite(x) * VSPLAT(p->a), ZERO); }
MA_INLINE V op_swish_grad(V dy, V x, const ma_params *p) {
    V xc = ma_finite(x);
    return ma_gate_grad(dy, xc, xc * VSPLAT(p->a), ZERO, VSPLAT(p->a));
}
MA_INLINE V op_silu(V x, const ma_params *p) { (void)p; return ma_gate_fwd(x, ma_finite(x), ZERO); }
MA_INLINE V op_silu_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_finite(x);
    return ma_gate_grad(dy, xc, xc, ZERO, ONE);
}
MA_INLINE V op_fast_gelu(V x, const ma_params *p) {
    (void)p;
    return ma_gate_fwd(x, ma_finite(x) * VSPLAT(1.702f), ZERO);
}
MA_INLINE V op_fast_gelu_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_finite(x);
    return ma_gate_grad(dy, xc, xc * VSPLAT(1.702f), ZERO, VSPLAT(1.702f));
}
/* z = 2k (x + c x^3) in double, split into z + zlo: several float roundings of z would cost
 * |z| ULPs each in the e^z tail (x < -9). */
MA_INLINE V ma_gelu_tanh_z(V xc, V *zlo) {
    VD xd = V2D(xc);
    VD zd = (2.0 * 0.7978845608028654) * (xd + 0.044715 * (xd * xd * xd));
    V z = D2V(zd);
    *zlo = D2V(zd - V2D(z));
    return z;
}
MA_INLINE V op_gelu_tanh(V x, const ma_params *p) {
    (void)p;
    V zlo, z = ma_gelu_tanh_z(ma_clampv(x, -1e5f, 1e5f), &zlo);
    return ma_gate_fwd(x, z, zlo);
}
MA_INLINE V op_gelu_tanh_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_clampv(x, -1e5f, 1e5f);
    V dz = VSPLAT(GELU_TANH_2K) * (ONE + VSPLAT(3.0f * GELU_TANH_C) * (xc * xc));
    V zlo, z = ma_gelu_tanh_z(xc, &zlo);
    return ma_gate_grad(dy, xc, z, zlo, dz);
}

/* ---- gelu (erf): x * Phi(x) ---- */
MA_INLINE V op_gelu(V x, const ma_params *p) {
    (void)p;
    V cK, pK, sc;
    ma_normal_parts(x, &cK, &pK, &sc);
    VM left = x <= ZERO;
    V s = VSEL(left, cK, ONE - cK * sc);
    return GATED(x, s) * VSEL(left, sc, ONE);
}
MA_INLINE V op_gelu_grad(V dy, V x, const ma_params *p) { /* dy * (cdf + xc * pdf) */
    (void)p;
    V cK, pK, sc;
    ma_normal_parts(x, &cK, &pK, &sc);
    V xc = ma_clampv(x, -1e5f, 1e5f);
    VM left = x <= ZERO;
    V tK = xc * pK;
    V a = VSEL(left, cK + tK, (ONE - cK * sc) + tK * sc);
    V g = dy * a;
    return VSEL(left, g * sc, g);
}

/* ---- mish: x * tanh(softplus(x)), with e = e^-|x| ----
 * x >= 0: t = (1 + 2e) / D, D = 1 + 2e + 2e^2;  x < 0: t = e (e + 2) / D, D = e^2 + 2e + 2.
 * grad = t + x sigmoid(x) sech^2(softplus(x)) = t + 4 x (1 + e) e^(x >= 0 ? 2 : 1) / D^2. */
MA_INLINE V op_mish(V x, const ma_params *p) {
    (void)p;
    V sc;
    V eK = ma_expneg_k(-ma_abs(x), &sc);
    V e = eK * sc;
    VM pos = x >= ZERO;
    V e2e = e * (e + VSPLAT(2.0f));
    V tpos = (ONE + (e + e)) / (ONE + (e + e) + (e * e + e * e));
    V tneg = (eK * (e + VSPLAT(2.0f))) / (e2e + VSPLAT(2.0f));
    V tm = VSEL(pos, tpos, tneg);
    return GATED(x, tm) * VSEL(pos, ONE, sc);
}
MA_INLINE V op_mish_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V sc;
    V eK = ma_expneg_k(-ma_abs(x), &sc);
    V e = eK * sc;
    V xc = ma_finite(x);
    VM pos = x >= ZERO;
    V D = VSEL(pos, ONE + (e + e) + (e * e + e * e), e * (e + VSPLAT(2.0f)) + VSPLAT(2.0f));
    V iD = ONE / D;
    V num = VSEL(pos, ONE + (e + e), eK * (e + VSPLAT(2.0f)));
    V tm = num * iD;
    V f = VSEL(pos, e * e, eK); /* scaled only where x < 0 */
    V u = (((xc * f) * VSPLAT(4.0f)) * (ONE + e)) * (iD * iD); /* xc * f first: FLT_MAX * 0 = 0 */
    V g = dy * (tm + u);
    return VSEL(pos, g, g * sc);
}

/* ---- tanhshrink: x - tanh(x); |x| < 1: x^3 T(x^2) (2.8 ULP); else sign(x) ((|x| - 1) + 2e / (1 + e)) ---- */
MA_INLINE V op_tanhshrink(V x, const ma_params *p) {
    (void)p;
    V x2 = x * x;
    V t = VSPLAT(5.643581517e-06f);
    t = VFMA(t, x2, VSPLAT(-4.480269490e-05f));
    t = VFMA(t, x2, VSPLAT(1.834160503e-04f));
    t = VFMA(t, x2, VSPLAT(-5.495940568e-04f));
    t = VFMA(t, x2, VSPLAT(1.436130726e-03f));
    t = VFMA(t, x2, VSPLAT(-3.585819388e-03f));
    t = VFMA(t, x2, VSPLAT(8.861963637e-03f));
    t = VFMA(t, x2, VSPLAT(-2.186933905e-02f));
    t = VFMA(t, x2, VSPLAT(5.396824330e-02f));
    t = VFMA(t, x2, VSPLAT(-1.333333403e-01f));
    t = VFMA(t, x2, VSPLAT(3.333333433e-01f));
    V small = x * (x2 * t);
    V a = ma_abs(x);
    V sc;
    V e = ma_expneg_k(VSPLAT(-2.0f) * a, &sc) * sc;
    V big = ma_copysign((a - ONE) + (e + e) / (ONE + e), x);
    return VSEL(a < ONE, small, big);
}
MA_INLINE V op_tanhshrink_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V t = ma_tanh(x);
    return dy * (t * t);
}

#endif
