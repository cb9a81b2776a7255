/* One body per op and direction, written once against ma_simd.h / ma_math.h.
 * The formulas and every convention (kinks, NaN, +-inf) follow multiact/reference.py:
 * forward bodies take (x), backward bodies (dy, x), backward_y bodies (dy, y).
 * Parameters arrive in ma_params (see ma_native.h for which field holds what). */
#ifndef MA_OPS_H
#define MA_OPS_H

#include "ma_native.h"
#ifndef MA_F64 /* (not `#if !defined`: that line marks where the float64 bodies end) */
#include "ma_math.h"
#else
#include "ma_simd.h"
#endif

/* An op's parameters in the precision of the lanes: the float32 fields, or the float64 kernels' da..dd */
#if defined(MA_F64)
#define PA(p) ((p)->da)
#define PB(p) ((p)->db)
#else
#define PA(p) ((p)->a)
#define PB(p) ((p)->b)
#endif

#define ZERO VSPLAT(0.0f)
#define ONE VSPLAT(1.0f)
/* r, or NaN where x is NaN (piecewise formulas would drop it): the reference's _keepnan. */
#define KEEPNAN(x, r) VSEL(ma_isnan(x), (x), (r))
/* x * s, 0 where s is 0 (so that -inf * 0 is 0): the reference's _gated. */
#define GATED(x, s) VSEL((s) == ZERO, ZERO, (x) * (s))

#define GELU_TANH_2K 1.5957691216057308f /* 2 sqrt(2/pi) */
#define GELU_TANH_C 0.044715f

/* ---- piecewise linear ---- */
MA_INLINE V op_relu(V x, const ma_params *p) { (void)p; return VGT_SEL(ZERO, x); }
MA_INLINE V op_relu_grad(V dy, V x, const ma_params *p) { (void)p; return KEEPNAN(x, VSEL(x > ZERO, dy, ZERO)); }
MA_INLINE V op_relu6(V x, const ma_params *p) { (void)p; return ma_clampv(x, 0.0f, 6.0f); }
MA_INLINE V op_relu6_grad(V dy, V x, const ma_params *p) {
    (void)p;
    return KEEPNAN(x, VSEL(MAND(x > ZERO, x < VSPLAT(6.0f)), dy, ZERO));
}
MA_INLINE V op_leaky_relu(V x, const ma_params *p) { return VSEL(x > ZERO, x, x * VSPLAT(PA(p))); }
MA_INLINE V op_leaky_relu_grad(V dy, V x, const ma_params *p) { return KEEPNAN(x, VSEL(x > ZERO, dy, dy * VSPLAT(PA(p)))); }
MA_INLINE V op_hardtanh(V x, const ma_params *p) { return ma_clampv(x, PA(p), PB(p)); }
MA_INLINE V op_hardtanh_grad(V dy, V x, const ma_params *p) {
    return KEEPNAN(x, VSEL(MAND(x > VSPLAT(PA(p)), x < VSPLAT(PB(p))), dy, ZERO));
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
/* hardsigmoid(alpha = PA(p), beta = PB(p)) as (x + c) / d, c = beta / alpha, d = 1 / alpha, between lo = -c and
   hi = d - c: at PyTorch's alpha = 1/6 (float32), beta = 0.5 these round to 3, 6, -3, 3 (relu6(x + 3) / 6). */
MA_INLINE V op_hardsigmoid(V x, const ma_params *p) {
    S c = PB(p) / PA(p), d = (S)1 / PA(p);
    V mid = (x + VSPLAT(c)) / VSPLAT(d);
    return VSEL(x <= VSPLAT(-c), ZERO, VSEL(x >= VSPLAT(d - c), ONE, mid));
}
MA_INLINE V op_hardsigmoid_grad(V dy, V x, const ma_params *p) {
    S c = PB(p) / PA(p), d = (S)1 / PA(p);
    return KEEPNAN(x, VSEL(MAND(x > VSPLAT(-c), x < VSPLAT(d - c)), dy / VSPLAT(d), ZERO));
}
MA_INLINE V op_softshrink(V x, const ma_params *p) {
    V lam = VSPLAT(PA(p));
    return KEEPNAN(x, VSEL(x > lam, x - lam, VSEL(x < -lam, x + lam, ZERO)));
}
MA_INLINE V op_hardshrink(V x, const ma_params *p) { return KEEPNAN(x, VSEL(ma_abs(x) > VSPLAT(PA(p)), x, ZERO)); }
MA_INLINE V op_shrink_grad(V dy, V x, const ma_params *p) { return KEEPNAN(x, VSEL(ma_abs(x) > VSPLAT(PA(p)), dy, ZERO)); }
MA_INLINE V op_threshold(V x, const ma_params *p) { return VSEL(x <= VSPLAT(PA(p)), VSPLAT(PB(p)), x); }
MA_INLINE V op_threshold_grad(V dy, V x, const ma_params *p) { return KEEPNAN(x, VSEL(x <= VSPLAT(PA(p)), ZERO, dy)); }

/* ---- rational ---- */
MA_INLINE V op_softsign(V x, const ma_params *p) {
    (void)p;
    V a = ma_abs(x);
    return VSEL(a == VSPLAT(__builtin_inff()), ma_copysign(ONE, x), x / (ONE + a));
}
/* dy / (1 + |x|)^2 with the rounding error c of d = 1 + |x| (Fast2Sum, larger term first) taken back as
 * g (1 - 2 c / d): squaring 1 / d doubled that error (4.2 ULP at x = 1.9e7, 3.5 at x = 15, exhaustive run). */
MA_INLINE V op_softsign_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V a = ma_abs(x);
    V big = VSEL(a > ONE, a, ONE), small = VSEL(a > ONE, ONE, a);
    V d = big + small;
    V c = small - (d - big);
    V r = ONE / d;
    V g = (dy * r) * r;
    V k = VSEL(d == VSPLAT(__builtin_inff()), ZERO, VSPLAT(-2.0f) * (c * r));  /* c is NaN at |x| = inf */
    return VSEL(g == g + g, g, VFMA(k, g, g));  /* g = +-0 keeps its sign, g = +-inf stays (not inf - inf) */
}

/* Everything below computes with float32 math (ma_math.h): no float64 kernels (native/kernels.py reads the
 * bodies above this line as the float64 ones). */
#if !defined(MA_F64)

/* ---- exponential family ---- */
/* alpha * e^x for x <= 0 times dy, with the tail scaling applied last. */
MA_INLINE V ma_dy_alpha_exp(V dy, V x, float alpha) {
    V sc;
    V eK = ma_expneg_k(VLT_SEL(ZERO, x), &sc);
    return (dy * (VSPLAT(alpha) * eK)) * sc;
}
MA_INLINE V op_elu(V x, const ma_params *p) { return VSEL(x > ZERO, x, VSPLAT(p->a) * ma_expm1(x)); }
MA_INLINE V op_elu_grad(V dy, V x, const ma_params *p) { return VSEL(x > ZERO, dy, ma_dy_alpha_exp(dy, x, p->a)); }
MA_INLINE V op_elu_grad_y(V dy, V y, const ma_params *p) { return VSEL(y > ZERO, dy, dy * (y + VSPLAT(p->a))); }
/* selu(alpha = p->a, scale = p->b): PyTorch's constants by default; sa = scale * alpha rounded to float32, and
 * in the y-form as hi + lo (hi's rounding alone is 2^-12 of y + sa where y saturates at -sa: y + hi is exact
 * there).  Where x (or y) is so small that float32 cannot hold its effect on e^x - 1 (= x), e^x (= 1) or
 * y + hi (= hi), the true value lies strictly on one side: e^x - 1 in (x, 0), e^x in (0, 1), y + hi below hi,
 * for x, y < 0.  The value one float32 ulp to that side (times MA_ONE_BELOW, the float below 1: exact for
 * normal floats) keeps the side, so that a product that float32 holds exactly on a bfloat16 tie (3 * 2 *
 * x, 6 dy for alpha = 2, scale = 3) rounds the right way: 1% of bfloat16 results one ulp off before
 * (multiact/backend/formulas.py and multiact/reference.py do the same; float32 results within 1.5 ulp there). */
#define MA_ONE_BELOW 0x1.fffffep-1f
MA_INLINE V op_selu(V x, const ma_params *p) {
    V e = ma_expm1(x);
    e = VSEL(MAND(e == x, x < ZERO), x * VSPLAT(MA_ONE_BELOW), e);
    return VSEL(x > ZERO, VSPLAT(p->b) * x, VSPLAT(p->b * p->a) * e);
}
MA_INLINE V op_selu_grad(V dy, V x, const ma_params *p) { /* ma_dy_alpha_exp's steps */
    V sc;
    V eK = ma_expneg_k(VLT_SEL(ZERO, x), &sc);
    eK = VSEL(MAND(eK == VSPLAT(1.0f), x < ZERO), VSPLAT(MA_ONE_BELOW), eK); /* sc = 1 there */
    return VSEL(x > ZERO, dy * VSPLAT(p->b), (dy * (VSPLAT(p->b * p->a) * eK)) * sc);
}
MA_INLINE V op_selu_grad_y(V dy, V y, const ma_params *p) {
    float hi = p->b * p->a, lo = (float)((double)p->b * (double)p->a - (double)hi); /* exact */
    V t = y + VSPLAT(hi);
    if (hi > 0.0f) t = VSEL(MAND(t == VSPLAT(hi), y < ZERO), VSPLAT(hi * MA_ONE_BELOW), t);
    return VSEL(y > ZERO, dy * VSPLAT(p->b), dy * (t + VSPLAT(lo)));
}
MA_INLINE V op_celu(V x, const ma_params *p) {
    V a = VSPLAT(p->a);
    return VSEL(x > ZERO, x, a * ma_expm1(x / a));
}
MA_INLINE V op_celu_grad(V dy, V x, const ma_params *p) {
    V a = VSPLAT(p->a);
    V z = x / a;
    if (p->a > 0.0f) { /* z <= 0 where used; e^(z + zlo), zlo = z's rounding error (|x/a| ULPs in the tail) */
        V zlo = VSEL(ma_abs(z) < VSPLAT(1e30f), ma_div_err(x, a, z) * VSPLAT(1.0f / p->a), ZERO);
        V sc;
        V eK = ma_expneg_k2(VLT_SEL(ZERO, z), VSEL(z < ZERO, zlo, ZERO), &sc);
        return VSEL(x > ZERO, dy, (dy * eK) * sc);
    }
    return VSEL(x > ZERO, dy, dy * ma_exp(z));
}
MA_INLINE V op_celu_grad_y(V dy, V y, const ma_params *p) {
    return VSEL(y > ZERO, dy, dy * (y / VSPLAT(p->a) + ONE));
}

/* Fast paths.  Where |z| <= lim (no NaN, no inf, no scaled exponential tail) a shorter body
 * fast_<op> computes the op within the same tolerance; gen_<op> handles everything.  A vector
 * with every lane in range runs only the fast body; otherwise the lanes in range still take
 * the fast body's bits (on a sanitised copy) and the rest the general body's, so no result
 * depends on its neighbours in the vector.  in_<op> is the range test: the kernel loops test a
 * whole step of vectors with it at once (native/kernels.py finds the split ops by these lines). */
#define MA_SPLIT_UNARY(name, zexpr, lim)                                                \
    MA_INLINE VM in_##name(V x, const ma_params *p) { (void)p; return ma_abs(zexpr) <= VSPLAT(lim); } \
    MA_INLINE V op_##name(V x, const ma_params *p) {                                     \
        VM in_ = in_##name(x, p);                                                        \
        if (VALL(in_)) return fast_##name(x, p);                                         \
        return VSEL(in_, fast_##name(VSEL(in_, x, ZERO), p), gen_##name(x, p));          \
    }
#define MA_SPLIT_BINARY(name, zexpr, lim) MA_SPLIT_BINARY_IF(name, ma_abs(zexpr) <= VSPLAT(lim))
/* The same with the fast body's domain as any mask expression in x and p. */
#define MA_SPLIT_BINARY_IF(name, cond)                                                   \
    MA_INLINE VM in_##name(V dy, V x, const ma_params *p) {                              \
        (void)dy, (void)p;                                                               \
        return cond;                                                                     \
    }                                                                                    \
    MA_INLINE V op_##name(V dy, V x, const ma_params *p) {                               \
        VM in_ = in_##name(dy, x, p);                                                    \
        if (VALL(in_)) return fast_##name(dy, x, p);                                     \
        return VSEL(in_, fast_##name(dy, VSEL(in_, x, ZERO), p), gen_##name(dy, x, p));  \
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

MA_INLINE V fast_sigmoid(V x, const ma_params *p) { (void)p; return ONE / (ONE + ma_exp_fast(-x)); }
MA_INLINE V gen_sigmoid(V x, const ma_params *p) {
    (void)p;
    MA_SIG_PARTS(x, eK, sc, inv);
    return VSEL(x >= ZERO, inv, (eK * inv) * sc);
}
MA_SPLIT_UNARY(sigmoid, x, 80.0f)
/* 1 / (1 + e)^2 for e in [0, 1] with 1 + e carried exactly (d + c): about 1 ULP.  The correction's 1 / d^3 as
 * r r d (one division, not two: its error reaches the result 2^-23 times). */
MA_INLINE V ma_inv_sq_1pe(V e) {
    V d = ONE + e;
    V c = e - (d - ONE);
    V r = ONE / (d * d);
    return r - (VSPLAT(2.0f) * c) * ((r * r) * d);
}
/* dy e / (1 + e)^2, e = e^-|x| (the derivative is even) with 1 + e carried exactly: 1 / (1 + e) squared
 * doubled its rounding error (4.6 ULP at x = 15.5 with dy = -0.618, the exhaustive run). */
MA_INLINE V fast_sigmoid_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V e = ma_exp_fast(-ma_abs(x));
    return dy * (e * ma_inv_sq_1pe(e));
}
MA_INLINE V gen_sigmoid_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V sc;
    V eK = ma_expneg_k(-ma_abs(x), &sc);
    return (dy * (eK * ma_inv_sq_1pe(eK * sc))) * sc;
}
MA_SPLIT_BINARY(sigmoid_grad, x, 80.0f)
MA_INLINE V op_sigmoid_grad_y(V dy, V y, const ma_params *p) { (void)p; return dy * (y * (ONE - y)); }
MA_INLINE V fast_logsigmoid(V x, const ma_params *p) {
    (void)p;
    return VLT_SEL(x, ZERO) - ma_log1p01(ma_exp_fast(-ma_abs(x)));
}
MA_INLINE V gen_logsigmoid(V x, const ma_params *p) {
    (void)p;
    V sc;
    V eK = ma_expneg_k(-ma_abs(x), &sc);
    return VLT_SEL(x, ZERO) - ma_log1p01(eK * sc);
}
MA_SPLIT_UNARY(logsigmoid, x, 80.0f)
/* dy * sigmoid(-x) */
MA_INLINE V fast_logsigmoid_grad(V dy, V x, const ma_params *p) { (void)p; return dy / (ONE + ma_exp_fast(x)); }
MA_INLINE V gen_logsigmoid_grad(V dy, V x, const ma_params *p) {
    (void)p;
    MA_SIG_PARTS(x, eK, sc, inv);
    return VSEL(x > ZERO, (dy * (eK * inv)) * sc, dy * inv);
}
MA_SPLIT_BINARY(logsigmoid_grad, x, 80.0f)
MA_INLINE V op_tanh(V x, const ma_params *p) { (void)p; return ma_tanh(x); }
/* dy * 4e / (1 + e)^2, e = e^-2|x|, with 1 + e carried exactly (ma_inv_sq_1pe): 1 / (1 + e) squared doubled
 * its rounding (4.2 ULP at x = 1.06 with dy = -0.618, hidden until issue 44 by a floor of 2 eps |dy|). */
MA_INLINE V fast_tanh_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V e = ma_exp_fast(VSPLAT(-2.0f) * ma_abs(x));
    return dy * ((VSPLAT(4.0f) * e) * ma_inv_sq_1pe(e));
}
MA_INLINE V gen_tanh_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V sc;
    V eK = ma_expneg_k(VSPLAT(-2.0f) * ma_abs(x), &sc);
    return (dy * ((VSPLAT(4.0f) * eK) * ma_inv_sq_1pe(eK * sc))) * sc;
}
MA_SPLIT_BINARY(tanh_grad, x, 40.0f)
MA_INLINE V op_tanh_grad_y(V dy, V y, const ma_params *p) { (void)p; return dy * ((ONE - y) * (ONE + y)); }
/* z = beta x with its rounding error zlo: in the left tail softplus(x) is e^z / beta, which a rounded z
 * would give to |z| / 2 ULPs (7.9 at beta = 0.3, x = -100). */
#define MA_SOFTPLUS_Z(x, p, z, zlo)                                                   \
    V z = (x) * VSPLAT((p)->a);                                                       \
    V zlo = VSEL(ma_abs(z) < VSPLAT(1e30f), ma_mul_err((x), VSPLAT((p)->a), z), ZERO)
MA_INLINE V fast_softplus(V x, const ma_params *p) {
    MA_SOFTPLUS_Z(x, p, z, zlo);
    VM neg = z < ZERO;
    V body = VGT_SEL(z, ZERO) + ma_log1p01(ma_exp_fast2(-ma_abs(z), VSEL(neg, -zlo, zlo)));
    return VSEL(z > VSPLAT(p->b), x, body / VSPLAT(p->a)); /* no branch: it would split the step */
}
MA_INLINE V gen_softplus(V x, const ma_params *p) {
    V b = VSPLAT(p->a);
    MA_SOFTPLUS_Z(x, p, z, zlo);
    V sc;
    V eK = ma_expneg_k2(-ma_abs(z), VSEL(z < ZERO, zlo, -zlo), &sc);
    V body = (VGT_SEL(z, ZERO) + ma_log1p01(eK * sc)) / b;
    /* deep left tail: log1p(e) = e, keep it scaled until the end */
    V tail = (eK / b) * sc;
    V r = VSEL(MAND(z < ZERO, sc < ONE), tail, body);
    return VSEL(z > VSPLAT(p->b), x, r);
}
MA_SPLIT_UNARY(softplus, x * VSPLAT(p->a), 80.0f)
MA_INLINE V fast_softplus_grad(V dy, V x, const ma_params *p) {
    MA_SOFTPLUS_Z(x, p, z, zlo);
    return VSEL(z > VSPLAT(p->b), dy, dy / (ONE + ma_exp_fast2(-z, zlo)));
}
MA_INLINE V gen_softplus_grad(V dy, V x, const ma_params *p) {
    MA_SOFTPLUS_Z(x, p, z, zlo);
    MA_SIG_PARTS2(z, zlo, eK, sc, inv);
    V g = VSEL(z >= ZERO, dy * inv, (dy * (eK * inv)) * sc);
    return KEEPNAN(x, VSEL(z > VSPLAT(p->b), dy, g));
}
MA_SPLIT_BINARY(softplus_grad, x * VSPLAT(p->a), 80.0f)
/* ---- x * sigmoid(z) family: silu, swish, fast_gelu, gelu(tanh) ---- */
/* The fast bodies, for |z| <= 80 (x finite): x / (1 + e^-z), with z standing for z + zlo, and the backward
 * as ma_gate_grad below without its scaling (e^-|z| >= e^-80 is a normal float), for x >= -10 as well (the
 * tails beyond take ma_gate_grad).  The backward was s + x s (1 - s) k from 1 / (1 + e^-z), which carried
 * sn = 1 - s's error |w| times into 1 + w sn where z < 0: 5.0 ULP at x = -4.84 for silu, 6.0 for gelu(tanh)
 * at x = -1.59 (dy = 1), hidden by the floor of 2 eps |dy| that applied to every |x| < 10 until issue 44. */
MA_INLINE V ma_gate_fwd_fast(V x, V z, V zlo) { return x / (ONE + ma_exp_fast2(-z, zlo)); }
MA_INLINE V ma_gate_grad_fast(V dy, V z, V zlo, V w, V wlo) {
    VM neg = z < ZERO;
    V s2, em = ma_exp_split(-ma_abs(z), VSEL(neg, -zlo, zlo), &s2); /* e^-|z + zlo| = s2 (1 + em) */
    V e = VFMA(s2, em, s2), d = ONE + e, c = e - (d - ONE); /* 1 + e = d + c exactly */
    V i = ONE / d;
    V small = s2 * VFMA(em, i, i); /* sigmoid(-|z|), without the rounding of 1 + em (nor of 1 + e: below) */
    /* inner = 1 + w small + wlo small (z >= 0), (1 + w) - w small + wlo i (z < 0), less k c i, k = 1 or 1 + w: the
     * rounding of 1 + e, which i and small carry, folded in; the small terms first, one rounding for the sum (a
     * rounding more cost swish's beta = 1.702 4.09 ULP at x = -5.47, dy = -0.618) */
    V k = ONE + VSEL(neg, w, ZERO);
    V lo = VSEL(neg, VFMA(-k, c, wlo) * i, VFMA(wlo, small, -(c * i)));
    V inner = k + VFMA(VSEL(neg, -w, w), small, lo);
    return dy * (VSEL(neg, small, i) * inner);
}
/* x * sigmoid(z) */
MA_INLINE V ma_gate_fwd(V x, V z, V zlo) {
    MA_SIG_PARTS2(z, zlo, eK, sc, inv);
    VM neg = z < ZERO;
    V sm = VSEL(neg, eK * inv, inv);
    return GATED(x, sm) * VSEL(neg, sc, ONE);
}
/* dy s (1 + w sn), s = sigmoid(z), sn = sigmoid(-z) = 1 - s, w = x dz/dx (z itself for swish's family) and
 * wlo its rounding error (zlo z's), for any z (scaled tails, +-inf, NaN).  From e = e^-|z| = pK (1 + em)
 * and i = 1 / (1 + e): the smaller of s, sn is pK (em i + i), without the rounding of 1 + em (in the tail
 * z < 0 the result is about s (1 + w): s's error is the result's); for z < 0, 1 + w sn is taken as
 * (1 + w) - w s (1 + w exact for |w| >= 1), which no error of sn reaches (the fast body's 1 + w e s
 * carries sn's 1.5 ulp |w| / |1 + w| times: 6 ULP at x = -11.6 for swish's beta = 0.5).  Where the small
 * side underflows to 0 the result is 0 (w may be infinite there). */
MA_INLINE V ma_gate_grad(V dy, V z, V zlo, V w, V wlo) {
    VM neg = z < ZERO;
    V sc, em, pK = ma_expneg_k2s(-ma_abs(z), VSEL(neg, zlo, -zlo), &sc, &em);
    V i = ONE / (ONE + VFMA(pK, em, pK) * sc);
    V small = pK * VFMA(em, i, i), sn_pos = small * sc; /* small: e / (1 + e), scaled by 1 / sc */
    V inner_neg = VFMA(-w, sn_pos, ONE + w), inner_pos = VFMA(w, sn_pos, ONE);
    V inner = VSEL(neg, VFMA(wlo, i, inner_neg), VFMA(wlo, sn_pos, inner_pos));
    V g = dy * (VSEL(neg, small, i) * VSEL(sn_pos == ZERO, VSEL(neg, ONE + w, ONE), inner));
    return VSEL(neg, VSEL(small == ZERO, small * dy, g * sc), g);
}
/* z = k x + zlo, ZLO(x, z) the rounding error of the product (and of the constant k, where it is not a
 * float: fast_gelu's 1.702), which the tail e^z would otherwise carry as |z| ULPs; the general bodies
 * clamp x to +-FLT_MAX (inf * 0 stays 0) and drop zlo where z is huge (there it cannot matter).  Both
 * directions are split (native/kernels.py counts an MA_GATE_OPS line as name and name_grad). */
#define MA_ZLO_GEN(ZLO, x, z) VSEL(ma_abs(z) < VSPLAT(1e30f), ZLO(x, z), ZERO)
#define MA_GATE_OPS(name, kexpr, ZLO)                                                       \
    MA_INLINE V fast_##name(V x, const ma_params *p) {                                      \
        (void)p;                                                                            \
        V z = x * (kexpr);                                                                  \
        return ma_gate_fwd_fast(x, z, ZLO(x, z));                                           \
    }                                                                                       \
    MA_INLINE V gen_##name(V x, const ma_params *p) {                                       \
        (void)p;                                                                            \
        V xc = ma_finite(x), z = xc * (kexpr);                                              \
        return ma_gate_fwd(x, z, MA_ZLO_GEN(ZLO, xc, z));                                   \
    }                                                                                       \
    MA_SPLIT_UNARY(name, x * (kexpr), 80.0f)                                                \
    MA_INLINE V fast_##name##_grad(V dy, V x, const ma_params *p) {                         \
        (void)p;                                                                            \
        V z = x * (kexpr), zlo = ZLO(x, z);                                                 \
        return ma_gate_grad_fast(dy, z, zlo, z, zlo);                                       \
    }                                                                                       \
    MA_INLINE V gen_##name##_grad(V dy, V x, const ma_params *p) {                          \
        (void)p;                                                                            \
        V xc = ma_finite(x), z = xc * (kexpr), zlo = MA_ZLO_GEN(ZLO, xc, z);                \
        return ma_gate_grad(dy, z, zlo, z, zlo);                                            \
    }                                                                                       \
    MA_SPLIT_BINARY_IF(name##_grad, MAND(ma_abs(x * (kexpr)) <= VSPLAT(80.0f), x >= VSPLAT(-10.0f)))
#define MA_FAST_GELU_K 1.702f
#define MA_FAST_GELU_KLO ((float)(1.702 - (double)MA_FAST_GELU_K)) /* 1.702 = K + KLO */
#define MA_ZLO_SWISH(x, z) ma_mul_err((x), VSPLAT(p->a), (z))
#define MA_ZLO_SILU(x, z) ZERO
#define MA_ZLO_FAST_GELU(x, z) VFMA((x), VSPLAT(MA_FAST_GELU_KLO), ma_mul_err((x), VSPLAT(MA_FAST_GELU_K), (z)))
MA_GATE_OPS(swish, VSPLAT(p->a), MA_ZLO_SWISH)
MA_GATE_OPS(silu, ONE, MA_ZLO_SILU)
MA_GATE_OPS(fast_gelu, VSPLAT(MA_FAST_GELU_K), MA_ZLO_FAST_GELU)

/* z = 2k (x + c x^3) in double, split into z + zlo: several float roundings of z would cost
 * |z| ULPs each in the e^z tail (x < -9). */
MA_INLINE V ma_gelu_tanh_z(V xc, V *zlo) {
    VD xd = V2D(xc);
    VD zd = (2.0 * 0.7978845608028654) * (xd + 0.044715 * (xd * xd * xd));
    V z = D2V(zd);
    *zlo = D2V(zd - V2D(z));
    return z;
}
/* Fast paths (|x| <= 9, so |z| <= 66): z + zlo accurate to about 2^-44 |z|, so that the tail e^z
 * keeps its few ULP: in double-float arithmetic with fused multiply-adds; the scalar ISA has none
 * and uses double. */
#define MA_GT_K 1.5957691216057308f /* 2k = K + K_LO, 2kc = C + C_LO */
#define MA_GT_K_LO ((float)(1.5957691216057308 - (double)MA_GT_K))
#define MA_GT_C_D (1.5957691216057308 * 0.044715) /* 2k c, rounded once in double */
#define MA_GT_C ((float)MA_GT_C_D)
#define MA_GT_C_LO ((float)(MA_GT_C_D - (double)MA_GT_C))
/* With w non-null, also w = x dz/dx = x (K + 3 C x^2) and its error *wlo, carried the same way: the backward's
 * 1 + w sigmoid(-z) takes |w| / |1 + w sn| times w's error (a dz rounded in float32 twice cost 2.3 ULP at
 * x = -1.6, where that ratio is 1.5). */
MA_INLINE V ma_gelu_tanh_zf2(V x, V *zlo, V *w, V *wlo) {
#if defined(MA_ISA_SCALAR)
    double xd = (double)x, x2 = xd * xd;
    double zd = (2.0 * 0.7978845608028654) * (xd + 0.044715 * (x2 * xd));
    float z = (float)zd;
    *zlo = (float)(zd - z);
    if (w) {
        double wd = xd * ((2.0 * 0.7978845608028654) * (1.0 + (3.0 * 0.044715) * x2));
        *w = (float)wd;
        *wlo = (float)(wd - *w);
    }
    return z;
#else
    /* z = x u, u = K + C x^2, each step with its rounding error carried (double-float, about 44 bits):
     * the tail's result is e^z, so z needs an absolute error below ulp(1), not ulp(z) */
    V x2 = x * x, x2l = ma_mul_err(x, x, x2);
    V t = VSPLAT(MA_GT_C) * x2;
    V tl = VFMA(VSPLAT(MA_GT_C_LO), x2, VFMA(VSPLAT(MA_GT_C), x2l, ma_mul_err(VSPLAT(MA_GT_C), x2, t)));
    V u = VSPLAT(MA_GT_K) + t; /* two-sum: t may exceed K */
    V bv = u - VSPLAT(MA_GT_K);
    V ul = ((VSPLAT(MA_GT_K) - (u - bv)) + (t - bv)) + (tl + VSPLAT(MA_GT_K_LO));
    V z = x * u;
    *zlo = VFMA(x, ul, ma_mul_err(x, u, z));
    if (w) { /* dz = K + 3 C x^2 = u + 2t, two-sum again */
        V t2 = t + t, d = u + t2, dv = d - u;
        V dl = ((u - (d - dv)) + (t2 - dv)) + (ul + (tl + tl));
        *w = x * d;
        *wlo = VFMA(x, dl, ma_mul_err(x, d, *w));
    }
    return z;
#endif
}
MA_INLINE V ma_gelu_tanh_zf(V x, V *zlo) { return ma_gelu_tanh_zf2(x, zlo, 0, 0); }
MA_INLINE V fast_gelu_tanh(V x, const ma_params *p) {
    (void)p;
    V zlo, z = ma_gelu_tanh_zf(x, &zlo);
    return ma_gate_fwd_fast(x, z, zlo);
}
MA_INLINE V gen_gelu_tanh(V x, const ma_params *p) {
    (void)p;
    V zlo, z = ma_gelu_tanh_z(ma_clampv(x, -1e5f, 1e5f), &zlo);
    return ma_gate_fwd(x, z, zlo);
}
MA_SPLIT_UNARY(gelu_tanh, x, 9.0f)
MA_INLINE V fast_gelu_tanh_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V zlo, w, wlo, z = ma_gelu_tanh_zf2(x, &zlo, &w, &wlo);
    return ma_gate_grad_fast(dy, z, zlo, w, wlo);
}
MA_INLINE V gen_gelu_tanh_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V xc = ma_clampv(x, -1e5f, 1e5f);
    V zlo, z = ma_gelu_tanh_z(xc, &zlo);
    VD xd = V2D(xc), wd = xd * ((2.0 * 0.7978845608028654) * (1.0 + (3.0 * 0.044715) * (xd * xd))); /* w = x dz */
    V w = D2V(wd);
    return ma_gate_grad(dy, z, zlo, w, D2V(wd - V2D(w)));
}
MA_SPLIT_BINARY(gelu_tanh_grad, x, 9.0f)

/* ---- gelu (erf): x * Phi(x) ---- */
/* Fast paths (|x| <= 12): e^(-x^2/2) from x^2 = h + l (l its rounding error, which would cost x^2/2
 * ULPs of the result in the tail), unscaled. */
/* c = 0.5 erfc(|x| / sqrt2) (the cdf's smaller side) and the pdf. */
MA_INLINE V ma_normal_tail_fast(V x, V *pdf) {
    V h = x * x, s;
    V em = ma_exp_split(VSPLAT(-0.5f) * h, VSPLAT(0.5f) * ma_mul_err(x, x, h), &s); /* e = s (1 + em) */
    *pdf = VFMA(s, em, s) * VSPLAT(0.39894228040143268f);
    V b = ma_abs(x), g = ma_half_erfc_g_fast(b);
    return ma_div_1p_sqrt2(s * VFMA(g, em, g), b); /* e G / (1 + sqrt2 b), not e rounded times q rounded */
}
/* x Phi(x) = x c (x <= 0) or x - x c (x > 0): not x (1 - c), whose rounding of 1 - c just above 0.5
 * would cost up to 4 ULP of a result at the top of its binade. */
MA_INLINE V fast_gelu(V x, const ma_params *p) {
    (void)p;
    V pdf, c = ma_normal_tail_fast(x, &pdf);
    V t = x * c;
    return VSEL(x <= ZERO, t, x - t);
}
/* The backward: x > 0, (1 - c) + x pdf as before.  x <= 0: e (A + x k) from e = e^(-x^2/2) = s (1 + em),
 * A = c / e = 0.5 G / (1 + sqrt2 |x|), k = 1 / sqrt(2 pi) as k + klo: the two terms cancel down to half their
 * sum next to the zero crossing (x = -1.53), and e's own error (1.5 ulp), carried by both terms separately,
 * took twice that (4.8 ULP at x = -1.63, 5.5 at x = -1.85; hidden until issue 44 by a floor of 2 eps |dy|). */
#define MA_INV_SQRT_2PI_F 0.39894228040143268f
#define MA_INV_SQRT_2PI_LO ((float)(0.39894228040143268 - (double)MA_INV_SQRT_2PI_F))
/* |x| <= 1/2: f' = 1/2 + x P(x^2 / 2), P = sum (-1)^n (2n + 2) / ((2n + 1) n!) u^n / sqrt(2 pi) (Phi's series and
 * x pdf's, term by term), one rounding of the FMA: e (A + x k) loses a factor of up to 1.5 there to the two terms'
 * cancellation, A's error with it (4.7 ULP at x = -0.327, found by the exhaustive run under issue 44's rule). */
/* term n's coefficient, (2n + 2) / ((2n + 1) n!) / sqrt(2 pi), rounded once to float */
#define MA_GELU_NEAR0_C(num, den) VSPLAT((float)((num) / (den) * 0.39894228040143268))
MA_INLINE V ma_gelu_grad_near0(V x, V h) {
    V u = VSPLAT(0.5f) * h;
    V P = VFMA(u, MA_GELU_NEAR0_C(14.0, 9360.0), MA_GELU_NEAR0_C(-12.0, 1320.0));
    P = VFMA(u, P, MA_GELU_NEAR0_C(10.0, 216.0));
    P = VFMA(u, P, MA_GELU_NEAR0_C(-8.0, 42.0));
    P = VFMA(u, P, MA_GELU_NEAR0_C(6.0, 10.0));
    P = VFMA(u, P, MA_GELU_NEAR0_C(-4.0, 3.0));
    P = VFMA(u, P, MA_GELU_NEAR0_C(2.0, 1.0));
    return VFMA(x, P, VSPLAT(0.5f));
}
MA_INLINE V fast_gelu_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V h = x * x, s;
    V em = ma_exp_split(VSPLAT(-0.5f) * h, VSPLAT(0.5f) * ma_mul_err(x, x, h), &s); /* e = s (1 + em) */
    V b = ma_abs(x), A = ma_div_1p_sqrt2(ma_half_erfc_g_fast(b), b), K = VSPLAT(MA_INV_SQRT_2PI_F);
    V xk = x * K, xkl = VFMA(x, VSPLAT(MA_INV_SQRT_2PI_LO), ma_mul_err(x, K, xk));
    V L = (A + xk) + xkl;
    V left = s * VFMA(L, em, L);
    V right = (ONE - s * VFMA(A, em, A)) + x * (VFMA(s, em, s) * K);
    return dy * VSEL(b <= VSPLAT(0.5f), ma_gelu_grad_near0(x, h), VSEL(x <= ZERO, left, right));
}
MA_INLINE V gen_gelu(V x, const ma_params *p) {
    (void)p;
    V cK, pK, sc;
    ma_normal_parts(x, &cK, &pK, &sc);
    VM left = x <= ZERO;
    V xc = ma_finite(x); /* x - x c as the fast body; inf * 0 stays out */
    return VSEL(left, GATED(x, cK) * sc, x - xc * (cK * sc));
}
MA_SPLIT_UNARY(gelu, x, 12.0f)
MA_INLINE V gen_gelu_grad(V dy, V x, const ma_params *p) { /* dy * (cdf + xc * pdf) */
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
MA_SPLIT_BINARY(gelu_grad, x, 12.0f)

/* ---- mish: x * tanh(softplus(x)), with e = e^-|x| = s (1 + em) (s a power of two, em = e^r - 1) ----
 * x >= 0: t = (1 + 2e) / (1 + 2e + 2e^2);  x < 0: t = n / (n + 2), n = e^2 + 2e = s q with
 * q = e (1 + em) + (2 + 2 em), so that the rounding of 1 + em never enters n.  y = x num / den, one division.
 * The backward's general body: grad = num' / den^2, one rounding each (1 / den squared doubles den's rounding:
 * 6 ulp at x = -10):
 * x >= 0: num' = 1 + e B, B = 4 + e (6 + 4x + e (4 + 4x)), den^2 = 1 + m (m + 2), m = 2e + 2e^2;
 * x < 0: num' = e B, B = 4 + 4x + e (6 + 4x + e (4 + e)), taken as s (B + em B), den^2 = 4 + m (m + 4), m = n. */
MA_INLINE V ma_mish_y(V x, V e, V nK, V n, VM pos) { /* nK: n, scaled where the exponential is */
    V num = VSEL(pos, ONE + (e + e), nK);
    V den = VSEL(pos, ONE + (e + e) + (e * e + e * e), n + VSPLAT(2.0f));
    return (x * num) / den;
}
MA_INLINE V fast_mish(V x, const ma_params *p) {
    (void)p;
    V s, em = ma_exp_split(-ma_abs(x), ZERO, &s), ope = ONE + em;
    V e = ope * s;
    V n = s * VFMA(e, ope, VSPLAT(2.0f) + (em + em));
    return ma_mish_y(x, e, n, n, x >= ZERO);
}
MA_INLINE V gen_mish(V x, const ma_params *p) {
    (void)p;
    V sc, em;
    V pK = ma_expneg_k2s(-ma_abs(x), ZERO, &sc, &em), ope = ONE + em;
    V e = (ope * pK) * sc;
    VM pos = x >= ZERO;
    V nK = pK * VFMA(e, ope, VSPLAT(2.0f) + (em + em));
    V y = ma_mish_y(VSEL(pos, x, ma_finite(x)), e, nK, nK * sc, pos); /* -inf * 0 stays out */
    return VSEL(pos, y, y * sc);
}
MA_SPLIT_UNARY(mish, x, 80.0f)
/* Both bodies, the fast one (x in (-10, 80]) with pK = 2^n unscaled: xc is x clamped to [-1e5, 1e5] (e = 0
 * beyond); e unscaled, pK and em as ma_expneg_k2s gives them.  The result is scaled where x < 0 and pK is.
 * Until issue 44 (which took away a floor of 2 eps |dy| over |x| < 10 that hid them): the fast body was t + u,
 * t = num / D, u = 4 x (1 + e) e^(x >= 0 ? 2 : 1) / D^2 from 1 / D squared, which doubled the roundings of D and
 * 1 / D (6.5 ULP at x = -3.08); both were num' / den^2 over e for every x (4.4 ULP at x = 0.31, 4.2 at -0.29). */
MA_INLINE V ma_mish_grad_parts(V dy, V xc, V e, V pK, V em, VM pos) {
    V four = VSPLAT(4.0f), two = VSPLAT(2.0f);
    /* x >= 0 (e = e^-x): 1 - d, d = 2e^2 (den - 2x (1 + e)) / den^2, den = 1 + 2e (1 + e), d <= 0.4: d's error
     * reaches the result at most 0.67 times */
    V ope = ONE + e;
    V den = VFMA(e + e, ope, ONE);
    /* x < 0 (e = e^x = pK (1 + em)): e B / D, B = 4 + 4x + e (6 + 4x + e (4 + e)), D = 4 + m (m + 4), m = e (e + 2);
     * B / D = q + ql, times pK (1 + em) in one rounding.  One reciprocal serves both sides: iv = 1 / den^2 or 1 / D,
     * q = B iv and ql = (B - q D) iv, the residual exact, so that q + ql is B / D whatever q's rounding. */
    V B = VFMA(e, VFMA(e, four + e, VFMA(four, xc, VSPLAT(6.0f))), VFMA(four, xc, four));
    V m = e * (e + two), D = VFMA(m, m + four, four);
    V iv = ONE / VSEL(pos, den * den, D);
    V gpos = ONE - ((two * (e * e)) * VFMA(-(xc + xc), ope, den)) * iv;
    V q = B * iv, ql = ma_div_err(B, D, q) * iv; /* B - q D exactly (the scalar ISA has no FMA: in double) */
    V gneg = q + VFMA(q, em, ql);
    /* (MA_MISH_MID, 0): the polynomial in x (e's rounding would cost |f'' / f'| times, up to 2.5, there) */
    V d = VSPLAT(MA_MISH_D7);
    d = VFMA(d, xc, VSPLAT(MA_MISH_D6));
    d = VFMA(d, xc, VSPLAT(MA_MISH_D5));
    d = VFMA(d, xc, VSPLAT(MA_MISH_D4));
    d = VFMA(d, xc, VSPLAT(MA_MISH_D3));
    d = VFMA(d, xc, VSPLAT(MA_MISH_D2));
    d = VFMA(d, xc, VSPLAT(MA_MISH_D1));
    d = VFMA(d, xc, VSPLAT(MA_MISH_D0));
    return dy * VSEL(pos, gpos, VSEL(xc > VSPLAT((float)MA_MISH_MID), d, gneg * pK));
}
MA_INLINE V fast_mish_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V s, em = ma_exp_split(-ma_abs(x), ZERO, &s);
    return ma_mish_grad_parts(dy, x, VFMA(s, em, s), s, em, x >= ZERO);
}
MA_INLINE V gen_mish_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V sc, em;
    V pK = ma_expneg_k2s(-ma_abs(x), ZERO, &sc, &em);
    VM pos = x >= ZERO;
    V g = ma_mish_grad_parts(dy, ma_clampv(x, -1e5f, 1e5f), ((ONE + em) * pK) * sc, pK, em, pos);
    return VSEL(pos, g, g * sc);
}
MA_SPLIT_BINARY_IF(mish_grad, MAND(x > VSPLAT(-10.0f), x <= VSPLAT(80.0f)))

/* ---- tanhshrink: x - tanh(x); |x| < 1: x^3 T(x^2) (MA_TANHSHRINK_T); else sign(x) ((|x| - 1) + 2e / (1 + e)) ---- */
MA_INLINE V ma_tanhshrink_small(V x, V x2) { /* x - tanh(x) = x^3 T(x^2), |x| < 1 */
    V t = VSPLAT(MA_TANHSHRINK_T10); /* ma_coeffs.h */
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T9));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T8));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T7));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T6));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T5));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T4));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T3));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T2));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T1));
    t = VFMA(t, x2, VSPLAT(MA_TANHSHRINK_T0));
    return x * (x2 * t);
}
MA_INLINE V op_tanhshrink(V x, const ma_params *p) {
    (void)p;
    V small = ma_tanhshrink_small(x, x * x);
    V a = ma_abs(x);
    V sc;
    V e = ma_expneg_k(VSPLAT(-2.0f) * a, &sc) * sc;
    V big = ma_copysign((a - ONE) + (e + e) / (ONE + e), x);
    return VSEL(a < ONE, small, big) + ZERO; /* + 0: a zero result is +0, as x - tanh(x) gives at x = -0 */
}
/* dy tanh(x)^2: |x| < 1, tanh(x) = x - (x - tanh(x)) as th + tl (the series above, the subtraction's rounding
 * carried), squared in one rounding; |x| >= 1, 1 - sech^2(x), sech^2 = 4e / (1 + e)^2 (e = e^-2|x|, 1 + e carried),
 * at most 0.42 there.  tanh(x) squared (2.5 ULP each) reached 5.1 ULP at x = 0.15 (hidden until issue 44 by a
 * floor of 2 eps |dy| over |x| < 10). */
MA_INLINE V op_tanhshrink_grad(V dy, V x, const ma_params *p) {
    (void)p;
    V sm = ma_tanhshrink_small(x, x * x);
    V th = x - sm, tl = (x - th) - sm;
    V small = VFMA(th, th, (th + th) * tl);
    V e = ma_exp_fast(VSPLAT(-2.0f) * VLT_SEL(VSPLAT(9.5f), ma_abs(x))); /* tanh(9.5)^2 rounds to 1; NaN passes */
    V big = ONE - (VSPLAT(4.0f) * e) * ma_inv_sq_1pe(e);
    return dy * VSEL(ma_abs(x) < ONE, small, big);
}

#endif /* !MA_F64 */

#endif
