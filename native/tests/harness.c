/* Runs every elementwise kernel of one ISA against the scalar path, plus prelu and the swish beta
 * gradient, on specials, sweeps and random values, at sizes around the vector width.
 * Built by scripts/test_native_harness.sh (x86: avx2; avx512, or avx512-simde: the avx512 kernels on
 * SIMDe's emulation, MA_SIMDE, on a CPU with AVX2 only) and scripts/test_neon_qemu.sh (neon, under
 * qemu-aarch64 -cpu max and -cpu cortex-a53).  Exit status 0 only if everything agrees.
 *
 * Tolerance per kernel (generated from multiact.optable): |isa - scalar| <= ulp * spacing(scalar)
 * + atol * eps * scale (scale |x| forward, |dy| backward, |dy y| backward_y), with ulp and atol
 * twice the op's bound (each path is within one bound of the reference), results below the
 * smallest normal allowed an error of that size; NaN must match NaN and inf must match inf.
 * bfloat16 kernels besides, on both paths: bit for bit their float32 twin (same ISA) on the widened inputs,
 * rounded by ma_half.h's ma_f2bf (NaN payloads included), which checks the vector loads and stores.
 * Bits: every short n (tails) and a streaming-store call (from an unaligned output) give the bits of
 * the long run, and no call writes past its n elements (masked tail stores).  With a twin ISA
 * (HARNESS_TWIN=avx2 for avx512: the table's HK_TWIN, HG_TWIN, HB_TWIN) every kernel's outputs are the
 * twin's bits (the bias_act sums, added in another order, only within their bound).
 * The thread pool: helpers compute in the caller's flush-to-zero mode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ma_half.h"
#include "ma_native.h"
#include "ma_kernel_decls.h"

#define STR_(x) #x
#define STR(x) STR_(x)

enum { DT_F32, DT_F16, DT_BF16 };
typedef struct {
    const char *name;
    int sig;     /* 0 unary, 1 binary, 2 ternary (backward2: g, dy, x) */
    int dt;      /* DT_* */
    int dir;     /* 0 forward, 1 backward, 2 backward_y, 3 backward2 */
    void *fn, *ref, *fwd_ref;
    void *fn32, *ref32; /* bfloat16: the float32 kernels of the same name (ISA, scalar); else NULL */
    float params[4];
    float ulp, atol;
} hk_t;

/* A gated kernel pair (forward, backward) of one ISA and its scalar twins (and, for bfloat16, the float32
 * pairs of the ISA and scalar). */
typedef struct {
    const char *name;
    int dt;
    void *fwd, *bwd, *rfwd, *rbwd;
    void *fwd32, *bwd32, *rfwd32, *rbwd32;
    float params[4];
    float ulp, atol_f, atol_b;
} hg_t;

/* A bias_act kernel pair: the same fields. */
typedef hg_t hb_t;

/* A bias_act backward from y of one ISA, its scalar twin, and the key's scalar forward (which makes its y). */
typedef struct {
    const char *name;
    int dt;
    void *bwd, *rbwd, *rfwd;
    float params[4];
    float ulp, atol;
} hby_t;

#include HARNESS_TABLE

typedef void (*un_f32)(const float *, float *, size_t, const ma_params *);
typedef void (*bin_f32)(const float *, const float *, float *, size_t, const ma_params *);
typedef void (*un_f16)(const uint16_t *, uint16_t *, size_t, const ma_params *);
typedef void (*bin_f16)(const uint16_t *, const uint16_t *, uint16_t *, size_t, const ma_params *);
typedef void (*ter_f32)(const float *, const float *, const float *, float *, size_t, const ma_params *);
typedef void (*ter_f16)(const uint16_t *, const uint16_t *, const uint16_t *, uint16_t *, size_t, const ma_params *);

#define N 1400
#define GUARD 64 /* elements after each output that no call may write */
static float X[N], DY[N], G2[N]; /* G2: backward2's upstream g */
static int clobbered; /* calls that wrote past their n elements */

/* storage <-> float for the half types; q(): a float rounded to the storage type */
static uint16_t enc(int dt, float v) { return dt == DT_BF16 ? ma_f2bf(v) : ma_f2h(v); }
static float dec(int dt, uint16_t h) { return dt == DT_BF16 ? ma_bf2f(h) : ma_h2f(h); }
static float q(int dt, float v) { return dt == DT_F32 ? v : dec(dt, enc(dt, v)); }
static uint16_t bfbits(float v) { /* a decoded bfloat16's stored bits */
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
}
/* a bfloat16 kernel's result (decoded) against its float32 twin's: the same bits, or both NaN with the result
 * quiet (which NaN a body makes from two NaN operands follows the operand order the compiler chose for that
 * kernel: x86 keeps the first); tests/test_native_bf16.py checks the store's NaN bits on a single-operand path */
static int bf_differs(float got, float want32) {
    uint16_t g = bfbits(got), w = ma_f2bf(want32);
    return g != w && !((g & 0x7fff) > 0x7f80 && (g & 0x40) && isnan(want32));
}

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}
static double nrand(void) { return sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }

static void make_inputs(void) {
    const float sp[] = {0.0f, -0.0f, 1.0f, -1.0f, 100.0f, -100.0f, 1000.0f, -1000.0f, 1.17549435e-38f,
                        -1.17549435e-38f, 1.4e-45f, -1.4e-45f, 3.0e-39f, 3.40282347e38f, -3.40282347e38f,
                        INFINITY, -INFINITY, NAN, -3.0f, 3.0f, 6.0f, 0.5f, -0.5f, 0.3f, -13.0f, -88.0f,
                        -90.0f, 88.0f, 90.0f, -104.0f, 44.0f, 20.0f, 1e30f, -1e30f};
    size_t k = 0, ns = sizeof sp / sizeof sp[0];
    for (; k < ns; k++) X[k] = sp[k];
    for (size_t i = 0; k < 500; i++, k++) X[k] = -30.0f + 60.0f * (float)i / 465.0f;
    for (; k < N; k++) X[k] = (float)(nrand() * 3.0);
    for (size_t i = 0; i < N; i++) DY[i] = (float)(nrand() * 2.0);
    for (size_t i = 0; i < N; i++) G2[i] = i % 61 == 7 ? -0.0f : (float)nrand();
}

static float spacing32(float v) {
    v = fabsf(v);
    return nextafterf(v, INFINITY) - v;
}
static float spacing16(float v) {
    v = fabsf(v);
    if (v < 0x1p-14f) return 0x1p-24f;
    int e;
    frexpf(v, &e);
    return ldexpf(1.0f, e - 11);
}
static float spacingbf(float v) {
    v = fabsf(v);
    if (v < 0x1p-126f) return 0x1p-133f;
    int e;
    frexpf(v, &e);
    return ldexpf(1.0f, e - 8);
}
/* spacing, epsilon and smallest normal of a dtype */
static float spacing_dt(int dt, float v) { return dt == DT_F32 ? spacing32(v) : dt == DT_F16 ? spacing16(v) : spacingbf(v); }
static float eps_dt(int dt) { return dt == DT_F32 ? 0x1p-23f : dt == DT_F16 ? 0x1p-10f : 0x1p-7f; }
static float tiny_dt(int dt) { return dt == DT_F16 ? 0x1p-14f : 1.17549435e-38f; }

static int close_enough(const hk_t *k, float got, float want, float x, float dy, float g) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    float eps = eps_dt(k->dt), tiny = tiny_dt(k->dt);
    float scale = k->dir == 0 ? fabsf(x) : k->dir == 1 ? fabsf(dy) : k->dir == 2 ? fabsf(dy * x) : fabsf(g * dy);
    if (!isfinite(scale)) scale = 0.0f;
    double bound = (double)k->ulp * spacing_dt(k->dt, want) + (double)k->atol * eps * scale;
    if (fabsf(want) < tiny && bound < tiny) bound = tiny;
    return fabs((double)got - (double)want) <= bound;
}

/* Run kernel fn (of dtype dt) on n elements; inputs are x (X or y) and dy, outputs as float.  The kernel
 * writes a buffer of its own, GUARD elements past n watched (no call may write there); stream: the call as a
 * large one makes it (ma_params.stream: streaming stores after a head up to the output's alignment), its
 * output `shift` elements past a 64-byte boundary. */
static void run_at(const hk_t *k, int dt, void *fn, const float *x, const float *dy, size_t n, float *out, int stream,
                   size_t shift) {
    ma_params p = {k->params[0], k->params[1], k->params[2], k->params[3], stream};
    static _Alignas(64) float fo[N + 16 + GUARD];
    static _Alignas(64) uint16_t ho[N + 16 + GUARD];
    static uint16_t hx[N], hd[N], hg[N];
    static float gq[N]; /* G2 in the kernel's storage type (a float32 twin of a half kernel takes it rounded) */
    const uint16_t hs = 0x7e5a;
    const float fs = -1234.5f;
    if (dt == DT_F32) {
        float *o = fo + shift;
        for (size_t i = n; i < n + GUARD; i++) o[i] = fs;
        if (k->sig == 0) ((un_f32)fn)(x, o, n, &p);
        else if (k->sig == 1) ((bin_f32)fn)(dy, x, o, n, &p);
        else {
            for (size_t i = 0; i < n; i++) gq[i] = q(k->dt, G2[i]);
            ((ter_f32)fn)(gq, dy, x, o, n, &p);
        }
        for (size_t i = n; i < n + GUARD; i++)
            if (memcmp(&o[i], &fs, 4) != 0) {
                clobbered++;
                break;
            }
        memcpy(out, o, n * sizeof(float));
        return;
    }
    uint16_t *o = ho + shift;
    for (size_t i = 0; i < n; i++) hx[i] = enc(dt, x[i]), hd[i] = enc(dt, dy[i]), hg[i] = enc(dt, G2[i]);
    for (size_t i = n; i < n + GUARD; i++) o[i] = hs;
    if (k->sig == 0) ((un_f16)fn)(hx, o, n, &p);
    else if (k->sig == 1) ((bin_f16)fn)(hd, hx, o, n, &p);
    else ((ter_f16)fn)(hg, hd, hx, o, n, &p);
    for (size_t i = n; i < n + GUARD; i++)
        if (o[i] != hs) {
            clobbered++;
            break;
        }
    for (size_t i = 0; i < n; i++) out[i] = dec(dt, o[i]);
}
static void run_dt(const hk_t *k, int dt, void *fn, const float *x, const float *dy, size_t n, float *out) {
    run_at(k, dt, fn, x, dy, n, out, 0, 0);
}
static void run(const hk_t *k, void *fn, const float *x, size_t n, float *out) { run_dt(k, k->dt, fn, x, DY, n, out); }

/* bfloat16: each path's kernel against its float32 twin on the same (bfloat16) inputs, rounded, bit for bit */
static int bits_elementwise(const hk_t *k, const float *xin) {
    static float dyq[N], o16[N], o32[N];
    int bad = 0;
    for (size_t i = 0; i < N; i++) dyq[i] = q(DT_BF16, DY[i]);
    for (int path = 0; path < 2; path++) {
        run_dt(k, DT_BF16, path ? k->ref : k->fn, xin, dyq, N, o16);
        run_dt(k, DT_F32, path ? k->ref32 : k->fn32, xin, dyq, N, o32);
        for (size_t i = 0; i < N; i++)
            if (bf_differs(o16[i], o32[i])) {
                if (bad < 3)
                    printf("  %s (%s): x=%.9g dy=%.9g: bf16 kernel 0x%04x, float32 kernel rounded 0x%04x\n", k->name,
                           path ? "scalar" : STR(HARNESS_ISA), xin[i], dyq[i], bfbits(o16[i]), ma_f2bf(o32[i]));
                bad++;
            }
    }
    return bad;
}

static int check_elementwise(const hk_t *k) {
    static float xin[N], want[N], got[N], part[N];
    int bad = 0, clob = clobbered;
    memcpy(xin, X, sizeof X);
    for (size_t i = 0; i < N; i++) xin[i] = q(k->dt, xin[i]);
    if (k->dir == 2) { /* backward_y takes y = forward(x), computed by the scalar path */
        hk_t fk = *k;
        fk.sig = 0;
        run(&fk, k->fwd_ref, xin, N, xin);
    }
    run(k, k->ref, xin, N, want);
    run(k, k->fn, xin, N, got);
    for (size_t i = 0; i < N; i++) {
        float dyv = q(k->dt, DY[i]);
        if (!close_enough(k, got[i], want[i], xin[i], dyv, q(k->dt, G2[i]))) {
            if (bad < 3)
                printf("  %s: x=%.9g dy=%.9g got %.9g, scalar %.9g\n", k->name, xin[i], dyv, got[i], want[i]);
            bad++;
        }
    }
    /* tails: every short n equals the long run bit for bit */
    for (size_t n = 1; n <= 40; n++) {
        run(k, k->fn, xin, n, part);
        for (size_t i = 0; i < n; i++)
            if (memcmp(&part[i], &got[i], 4) != 0 && !(isnan(part[i]) && isnan(got[i]))) {
                if (bad < 3) printf("  %s: tail n=%zu differs at %zu\n", k->name, n, i);
                bad++;
                break;
            }
    }
    if (k->dt == DT_BF16) bad += bits_elementwise(k, xin);
    /* streaming stores from an output 3 elements past a 64-byte boundary: the same bits */
    run_at(k, k->dt, k->fn, xin, DY, N, part, 1, 3);
    for (size_t i = 0; i < N; i++)
        if (memcmp(&part[i], &got[i], 4) != 0 && !(isnan(part[i]) && isnan(got[i]))) {
            if (bad < 3) printf("  %s: streaming call differs at %zu\n", k->name, i);
            bad++;
            break;
        }
    if (clobbered != clob) {
        printf("  %s: %d calls wrote past their n elements\n", k->name, clobbered - clob);
        bad++;
    }
#if defined(HARNESS_TWIN_NAME)
    run(k, HK_TWIN[k - HK], xin, N, part);
    for (size_t i = 0; i < N; i++)
        if (memcmp(&part[i], &got[i], 4) != 0 && !(isnan(part[i]) && isnan(got[i]))) {
            if (bad < 3) printf("  %s: x=%.9g: %.9g, %s's %.9g\n", k->name, xin[i], got[i], HARNESS_TWIN_NAME, part[i]);
            bad++;
        }
#endif
    return bad;
}

#define ISA_SYM(base) MA_CAT3(base, __, HARNESS_ISA)
#define MA_CAT_(a, b) a##b
#define MA_CAT(a, b) MA_CAT_(a, b)
#define MA_CAT3(a, b, c) MA_CAT(MA_CAT(a, b), c)

static int check_prelu(void) {
    enum { O = 3, C = 5, I = 7 };
    static float y1[O * C * I], y2[O * C * I], w[C] = {-0.5f, 0.0f, 0.25f, 1.0f, 1.5f};
    int bad = 0;
    for (int inner1 = 0; inner1 < 2; inner1++) {
        size_t o = inner1 ? O * I : O, in = inner1 ? 1 : I;
        for (int grad = 0; grad < 2; grad++) {
            ISA_SYM(ma_f32_prelu)(grad ? DY : NULL, X, y1, o, C, in, w, 1);
            ma_f32_prelu__scalar(grad ? DY : NULL, X, y2, o, C, in, w, 1);
            for (size_t i = 0; i < O * C * I; i++)
                if (memcmp(&y1[i], &y2[i], 4) && !(isnan(y1[i]) && isnan(y2[i]))) bad++;
        }
    }
    double a1[C] = {0}, a2[C] = {0};
    ISA_SYM(ma_f32_prelu_weight_grad)(DY + 40, X + 40, O, C, I, a1);
    ma_f32_prelu_weight_grad__scalar(DY + 40, X + 40, O, C, I, a2);
    for (int c = 0; c < C; c++) bad += fabs(a1[c] - a2[c]) > 1e-12 * (1 + fabs(a2[c]));
    double b1 = ISA_SYM(ma_f32_swish_beta_grad)(DY + 40, X + 40, 1000, 1.3f, 1, 1);
    double b2 = ma_f32_swish_beta_grad__scalar(DY + 40, X + 40, 1000, 1.3f, 1, 1);
    bad += fabs(b1 - b2) > 1e-12 * (1 + fabs(b2));
    if (bad) printf("  prelu / weight grad / beta grad: %d mismatches\n", bad);
    /* bfloat16, each path: the float32 kernels on the widened inputs, rounded (prelu) or equal (the sums) */
    static uint16_t hx[N], hd[N], hy[O * C * I];
    static float fx[N], fd[N];
    int bbad = 0;
    for (size_t i = 0; i < N; i++) hx[i] = ma_f2bf(X[i]), hd[i] = ma_f2bf(DY[i]), fx[i] = ma_bf2f(hx[i]), fd[i] = ma_bf2f(hd[i]);
    for (int path = 0; path < 2; path++)
        for (int inner1 = 0; inner1 < 2; inner1++) {
            size_t o = inner1 ? O * I : O, in = inner1 ? 1 : I;
            for (int grad = 0; grad < 2; grad++) {
                (path ? ma_bf16_prelu__scalar : ISA_SYM(ma_bf16_prelu))(grad ? hd : NULL, hx, hy, o, C, in, w, 1);
                (path ? ma_f32_prelu__scalar : ISA_SYM(ma_f32_prelu))(grad ? fd : NULL, fx, y1, o, C, in, w, 1);
                for (size_t i = 0; i < O * C * I; i++) bbad += bf_differs(ma_bf2f(hy[i]), y1[i]);
            }
        }
    for (int path = 0; path < 2; path++) {
        double c1[C] = {0}, c2[C] = {0};
        (path ? ma_bf16_prelu_weight_grad__scalar : ISA_SYM(ma_bf16_prelu_weight_grad))(hd + 40, hx + 40, O, C, I, c1);
        (path ? ma_f32_prelu_weight_grad__scalar : ISA_SYM(ma_f32_prelu_weight_grad))(fd + 40, fx + 40, O, C, I, c2);
        for (int c = 0; c < C; c++) bbad += memcmp(&c1[c], &c2[c], sizeof c1[c]) != 0;
        double e1 = (path ? ma_bf16_swish_beta_grad__scalar : ISA_SYM(ma_bf16_swish_beta_grad))(hd + 40, hx + 40, 1000,
                                                                                               1.3f, 1, 1);
        double e2 = (path ? ma_f32_swish_beta_grad__scalar : ISA_SYM(ma_f32_swish_beta_grad))(fd + 40, fx + 40, 1000,
                                                                                             1.3f, 1, 1);
        bbad += memcmp(&e1, &e2, sizeof e1) != 0;
    }
    if (bbad) printf("  bfloat16 prelu / weight grad / beta grad: %d differ from the float32 kernels\n", bbad);
    return bad + bbad;
}

/* Flush-to-zero (x86: FTZ and DAZ; aarch64: FZ) on or off for this thread. */
static void set_flush(int on) {
#if defined(__aarch64__)
    uint64_t r;
    __asm__ volatile("mrs %0, fpcr" : "=r"(r));
    r = on ? (r | (1u << 24)) : (r & ~(uint64_t)(1u << 24));
    __asm__ volatile("msr fpcr, %0" : : "r"(r));
#elif defined(__x86_64__)
    unsigned m;
    __asm__ volatile("stmxcsr %0" : "=m"(m));
    m = on ? (m | 0x8040u) : (m & ~0x8040u);
    __asm__ volatile("ldmxcsr %0" : : "m"(m));
#else
    (void)on;
#endif
}

static volatile float SUBNORMAL = 1e-39f;
static float POOL_OUT[64 * 64];
static void halve_subnormal(void *ctx, size_t i) { /* slow enough that helpers claim chunks */
    (void)ctx;
    for (int r = 0; r < 2000; r++)
        for (size_t k = 0; k < 64; k++) POOL_OUT[i * 64 + k] = SUBNORMAL * 0.5f;
}
static int pool_zeros(void) { /* by the bits: under DAZ a subnormal compares equal to 0 */
    int z = 0;
    for (size_t i = 0; i < 64 * 64; i++) {
        uint32_t b;
        memcpy(&b, &POOL_OUT[i], 4);
        z += b == 0;
    }
    return z;
}

/* Helpers started before the caller flushes still flush its chunks, and stop when it stops. */
static int check_pool_flush_mode(void) {
    int bad = 0;
    ma_parallel_for(64, halve_subnormal, NULL, 4);
    set_flush(1);
    float probe = SUBNORMAL * 0.5f;
    uint32_t pb;
    memcpy(&pb, &probe, 4);
    if (pb != 0) { /* this CPU or emulator (valgrind) does not flush: nothing to compare */
        set_flush(0);
        printf("  pool flush mode: not checked (no flush-to-zero here)\n");
        return 0;
    }
    for (int on = 1; on >= 0; on--) {
        set_flush(on);
        for (int rep = 0; rep < 10; rep++) {
            ma_parallel_for(64, halve_subnormal, NULL, 4);
            int z = pool_zeros();
            if (z != (on ? 64 * 64 : 0)) bad++;
        }
    }
    if (bad) printf("  pool flush mode: %d of 20 pooled calls mixed flushed and unflushed chunks\n", bad);
    return bad;
}

/* ---- gated kernels: the ISA against scalar (tolerance), its layouts against each other (bits) ---- */
typedef void (*gfwd_f32)(const float *, const float *, float *, const ma_gshape *, const ma_params *);
typedef void (*gbwd_f32)(const float *, const float *, const float *, float *, float *, const ma_gshape *,
                         const ma_params *);
typedef void (*gfwd_f16)(const uint16_t *, const uint16_t *, uint16_t *, const ma_gshape *, const ma_params *);
typedef void (*gbwd_f16)(const uint16_t *, const uint16_t *, const uint16_t *, uint16_t *, uint16_t *,
                         const ma_gshape *, const ma_params *);
static float GU[N];
enum { GL_TWO, GL_PAIR, GL_SWAP, GL_STRIDE3, GL_INPLACE, GL_N };

/* One call of the pair fw, bw (dtype dt) on n elements in layout lay: gate G = X, up GU, dy DY, each rounded
 * to qdt first; results y, dg, du as float. */
static void gated_call(const hg_t *k, void *fw, void *bw, int dt, int qdt, int lay, size_t n, int lim, float *y,
                       float *dg, float *du) {
    static float fin[3 * N], fo[3 * N], fd[N], fy[N];
    static uint16_t hin[3 * N], ho[3 * N], hd[N], hy[N];
    ma_params p = {k->params[0], k->params[1], k->params[2], k->params[3], 0, lim ? 7.0f : INFINITY, lim ? 1.0f : 0.0f};
    size_t es = lay == GL_TWO ? 1 : lay == GL_STRIDE3 ? 3 : 2;
    size_t go = lay == GL_TWO ? 0 : lay == GL_SWAP ? 1 : 0, uo = lay == GL_TWO ? N : lay == GL_SWAP ? 0 : 1;
    ma_gshape s = {1, n, {0, 0, 0, 0, 0}, {1, (ptrdiff_t)es, (ptrdiff_t)es, 1, 1}, 1, 1};
    for (size_t i = 0; i < n; i++) {
        float gv = q(qdt, X[i]), uv = q(qdt, GU[i]), dv = q(qdt, DY[i]);
        if (dt) hin[go + i * es] = enc(dt, gv), hin[uo + i * es] = enc(dt, uv), hd[i] = enc(dt, dv);
        else fin[go + i * es] = gv, fin[uo + i * es] = uv, fd[i] = dv;
    }
    if (dt) ((gfwd_f16)fw)(hin + go, hin + uo, hy, &s, &p);
    else ((gfwd_f32)fw)(fin + go, fin + uo, fy, &s, &p);
    /* backward outputs in the inputs' layout (in place: the inputs themselves) */
    ma_gshape sb = s;
    sb.es[3] = sb.es[4] = (ptrdiff_t)es;
    if (dt) {
        uint16_t *o = lay == GL_INPLACE ? hin : ho;
        ((gbwd_f16)bw)(hd, hin + go, hin + uo, o + go, o + uo, &sb, &p);
        for (size_t i = 0; i < n; i++) y[i] = dec(dt, hy[i]), dg[i] = dec(dt, o[go + i * es]), du[i] = dec(dt, o[uo + i * es]);
    } else {
        float *o = lay == GL_INPLACE ? fin : fo;
        ((gbwd_f32)bw)(fd, fin + go, fin + uo, o + go, o + uo, &sb, &p);
        for (size_t i = 0; i < n; i++) y[i] = fy[i], dg[i] = o[go + i * es], du[i] = o[uo + i * es];
    }
}
static void gated_run(const hg_t *k, int ref, int lay, size_t n, int lim, float *y, float *dg, float *du) {
    gated_call(k, ref ? k->rfwd : k->fwd, ref ? k->rbwd : k->bwd, k->dt, k->dt, lay, n, lim, y, dg, du);
}

static int gated_close(const hg_t *k, float got, float want, float atol, float scale) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    float eps = eps_dt(k->dt), tiny = tiny_dt(k->dt);
    if (!isfinite(scale)) scale = 0.0f;
    double bound = (double)k->ulp * spacing_dt(k->dt, want) + (double)atol * eps * scale;
    if (fabsf(want) < tiny && bound < tiny) bound = tiny;
    return fabs((double)got - (double)want) <= bound;
}

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)); }

static int check_gated(const hg_t *k) {
    static float y0[N], g0[N], u0[N], y1[N], g1[N], u1[N];
    int bad = 0;
    for (int lim = 0; lim < 2; lim++) {
        gated_run(k, 1, GL_TWO, N, lim, y0, g0, u0);
        gated_run(k, 0, GL_TWO, N, lim, y1, g1, u1);
        for (size_t i = 0; i < N; i++) {
            float g = q(k->dt, X[i]), u = q(k->dt, GU[i]), d = q(k->dt, DY[i]);
            if (lim) g = g > 7.0f ? 7.0f : g, u = (u > 7.0f ? 7.0f : u < -7.0f ? -7.0f : u) + 1.0f;
            if (!gated_close(k, y1[i], y0[i], k->atol_f, fabsf(g) * fabsf(u)) ||
                !gated_close(k, g1[i], g0[i], k->atol_b, fabsf(d * u)) ||
                !gated_close(k, u1[i], u0[i], k->atol_f, fabsf(g) * fabsf(d))) {
                if (bad < 3)
                    printf("  %s lim=%d: gate=%.9g up=%.9g dy=%.9g: y %.9g/%.9g dg %.9g/%.9g du %.9g/%.9g (isa/scalar)\n",
                           k->name, lim, X[i], GU[i], d, y1[i], y0[i], g1[i], g0[i], u1[i], u0[i]);
                bad++;
            }
        }
#if defined(HARNESS_TWIN_NAME)
        gated_call(k, HG_TWIN[k - HG][0], HG_TWIN[k - HG][1], k->dt, k->dt, GL_TWO, N, lim, y0, g0, u0);
        for (size_t i = 0; i < N; i++)
            if (!same_bits(y0[i], y1[i]) || !same_bits(g0[i], g1[i]) || !same_bits(u0[i], u1[i])) {
                if (bad < 3) printf("  %s lim=%d: differs from %s's at %zu\n", k->name, lim, HARNESS_TWIN_NAME, i);
                bad++;
            }
#endif
        /* every layout and every short n: the bits of the long two-input run */
        for (int lay = GL_TWO; lay < GL_N; lay++)
            for (size_t n = 1; n <= (lay == GL_TWO ? 40u : N); n = n < 40 ? n + 1 : N) {
                gated_run(k, 0, lay, n, lim, y0, g0, u0);
                for (size_t i = 0; i < n; i++)
                    if (!same_bits(y0[i], y1[i]) || !same_bits(g0[i], g1[i]) || !same_bits(u0[i], u1[i])) {
                        if (bad < 3) printf("  %s lim=%d: layout %d n=%zu differs at %zu\n", k->name, lim, lay, n, i);
                        bad++;
                        break;
                    }
                if (n == N) break;
            }
        /* bfloat16: both paths against their float32 pairs on the bfloat16 inputs, rounded, bit for bit */
        for (int path = 0; k->dt == DT_BF16 && path < 2; path++) {
            gated_call(k, path ? k->rfwd : k->fwd, path ? k->rbwd : k->bwd, DT_BF16, DT_BF16, GL_TWO, N, lim, y0, g0, u0);
            gated_call(k, path ? k->rfwd32 : k->fwd32, path ? k->rbwd32 : k->bwd32, DT_F32, DT_BF16, GL_TWO, N, lim,
                       y1, g1, u1);
            for (size_t i = 0; i < N; i++)
                if (bf_differs(y0[i], y1[i]) || bf_differs(g0[i], g1[i]) || bf_differs(u0[i], u1[i])) {
                    if (bad < 3) printf("  %s lim=%d (%s): bf16 kernel differs from float32 rounded at %zu\n", k->name,
                                        lim, path ? "scalar" : STR(HARNESS_ISA), i);
                    bad++;
                }
        }
    }
    return bad;
}

/* ---- bias_act kernels: the ISA against scalar (tolerance), on per-channel rows (inner > 1), channels
 * along the row (inner = 1) and full-shape sides, with and without clamp ---- */
typedef void (*bfwd_f32)(const float *, const float *, const float *, float *, const ma_bshape *, const ma_params *);
typedef int (*bbwd_f32)(const float *, const float *, const float *, const float *, float *, float *, float *,
                        double *, const ma_bshape *, const ma_params *);
typedef void (*bfwd_f16)(const uint16_t *, const uint16_t *, const uint16_t *, uint16_t *, const ma_bshape *,
                         const ma_params *);
typedef int (*bbwd_f16)(const uint16_t *, const uint16_t *, const uint16_t *, const uint16_t *, uint16_t *,
                        uint16_t *, uint16_t *, double *, const ma_bshape *, const ma_params *);
/* BL_ROWS2, BL_VEC2: no scale and rows of more than a step of any ISA (the forward's flat path: steps across
 * row ends, the row's b from a window or an extended copy; layout 3's b also none).  Rows shorter than
 * BA_FLAT_ROW_BWD take the backward's flat path too.  BL_LONG: rows past both thresholds (the row paths),
 * no scale and gain 1 (the forward's bias-only loop; with the clamp, its general loop). */
enum { BL_ROWS, BL_VEC, BL_FULL, BL_ROWS2, BL_VEC2, BL_LONG, BL_N };
/* the layouts with sums read X and DY from element 100 on, past the specials, so that the sums are finite
 * and checked (the full-shape layout, without sums, takes the specials) */
#define BL_OFF(lay) ((lay) == BL_FULL ? 0 : 100)
#define BC_MAX 70
static float BB[N], BS[N];

static const size_t BSHAPES[BL_N][3] = {{3, 5, 37}, {30, 40, 1}, {2, 7, 45}, {2, 3, 203}, {15, BC_MAX, 1}, {1, 4, 317}};
#define BL_SIZE(lay) (BSHAPES[lay][0] * BSHAPES[lay][1] * BSHAPES[lay][2])
/* One forward and backward of fw, bw (dtype dt) on the first o*c*i elements of X, DY (and BB, BS), each
 * rounded to qdt first; y, dx, db (full) and the sums out. */
static void bias_call(const hb_t *k, void *fw, void *bw, int dt, int qdt, int lay, int lim, int nthreads, float *y,
                      float *dx, float *dbf, double *sums) {
    const size_t o = BSHAPES[lay][0], c = BSHAPES[lay][1], in = BSHAPES[lay][2], n = o * c * in;
    int full = lay == BL_FULL;
    ma_bshape s = {o, c, in, full ? 2 : 1, full || lay >= BL_ROWS2 ? 0 : 1, 1, nthreads};
    ma_params p = {k->params[0], k->params[1], k->params[2], k->params[3], 0, INFINITY, 0.0f,
                   lay == BL_LONG ? 1.0f : 1.5f, lim ? 2.0f : INFINITY};
    if (dt == DT_F32) {
        static float fx[N], fd[N], fb[N], fs[N], fy[N], fdx[N], fdb[N];
        for (size_t e = 0; e + BL_OFF(lay) < N; e++) fx[e] = q(qdt, X[e + BL_OFF(lay)]), fd[e] = q(qdt, DY[e + BL_OFF(lay)]);
        for (size_t e = 0; e < N; e++) fb[e] = q(qdt, BB[e]), fs[e] = q(qdt, BS[e]);
        ((bfwd_f32)fw)(fx, fb, fs, fy, &s, &p);
        ((bbwd_f32)bw)(fd, fx, fb, fs, fdx, full ? fdb : NULL, NULL, full ? NULL : sums, &s, &p);
        for (size_t e = 0; e < n; e++) y[e] = fy[e], dx[e] = fdx[e], dbf[e] = full ? fdb[e] : 0.0f;
        return;
    }
    static uint16_t hx[N], hd[N], hb[N], hs[N], hy[N], hdx[N], hdb[N];
    for (size_t e = 0; e + BL_OFF(lay) < N; e++) hx[e] = enc(dt, X[e + BL_OFF(lay)]), hd[e] = enc(dt, DY[e + BL_OFF(lay)]);
    for (size_t e = 0; e < N; e++) hb[e] = enc(dt, BB[e]), hs[e] = enc(dt, BS[e]);
    ((bfwd_f16)fw)(hx, hb, hs, hy, &s, &p);
    ((bbwd_f16)bw)(hd, hx, hb, hs, hdx, full ? hdb : NULL, NULL, full ? NULL : sums, &s, &p);
    for (size_t e = 0; e < n; e++) y[e] = dec(dt, hy[e]), dx[e] = dec(dt, hdx[e]), dbf[e] = full ? dec(dt, hdb[e]) : 0.0f;
}
static void bias_run(const hb_t *k, int ref, int lay, int lim, int nthreads, float *y, float *dx, float *dbf,
                     double *sums) {
    bias_call(k, ref ? k->rfwd : k->fwd, ref ? k->rbwd : k->bwd, k->dt, k->dt, lay, lim, nthreads, y, dx, dbf, sums);
}

/* bfloat16: both paths against their float32 pairs on the bfloat16 inputs: outputs rounded, sums equal */
static int bias_bits(const hb_t *k, int lay, int lim) {
    static float y0[N], d0[N], f0[N], y1[N], d1[N], f1[N];
    size_t n = BL_SIZE(lay);
    int bad = 0;
    for (int path = 0; path < 2; path++) {
        double s0[2 * BC_MAX] = {0}, s1[2 * BC_MAX] = {0};
        bias_call(k, path ? k->rfwd : k->fwd, path ? k->rbwd : k->bwd, DT_BF16, DT_BF16, lay, lim, 1, y0, d0, f0, s0);
        bias_call(k, path ? k->rfwd32 : k->fwd32, path ? k->rbwd32 : k->bwd32, DT_F32, DT_BF16, lay, lim, 1, y1, d1, f1,
                  s1);
        for (size_t e = 0; e < n; e++)
            if (bf_differs(y0[e], y1[e]) || bf_differs(d0[e], d1[e]) || bf_differs(f0[e], f1[e])) {
                if (bad < 3) printf("  %s layout %d lim=%d (%s): bf16 kernel differs from float32 rounded at %zu\n",
                                    k->name, lay, lim, path ? "scalar" : STR(HARNESS_ISA), e);
                bad++;
            }
        for (int i = 0; i < 2 * BC_MAX; i++)
            if (memcmp(&s0[i], &s1[i], sizeof s0[i]) && !(isnan(s0[i]) && isnan(s1[i]))) {
                if (bad < 3) printf("  %s layout %d lim=%d (%s): sum %d %.17g, float32 kernel's %.17g\n", k->name, lay,
                                    lim, path ? "scalar" : STR(HARNESS_ISA), i, s0[i], s1[i]);
                bad++;
            }
    }
    return bad;
}

static int bias_close(const hb_t *k, float got, float want, float atol, float scale) {
    hg_t g = {k->name, k->dt, 0, 0, 0, 0, 0, 0, 0, 0, {0}, k->ulp, 0, 0};
    return gated_close(&g, got, want, atol, scale);
}

static int check_bias(const hb_t *k) {
    static float y0[N], d0[N], f0[N], y1[N], d1[N], f1[N];
    double s0[2 * BC_MAX], s1[2 * BC_MAX];
    int bad = 0;
    for (int lay = 0; lay < BL_N; lay++)
        for (int lim = 0; lim < 2; lim++) {
            memset(s0, 0, sizeof s0), memset(s1, 0, sizeof s1);
            bias_run(k, 1, lay, lim, 1, y0, d0, f0, s0);
            bias_run(k, 0, lay, lim, 1, y1, d1, f1, s1);
            size_t n = BL_SIZE(lay);
            const float *xs = X + BL_OFF(lay), *ds = DY + BL_OFF(lay);
            for (size_t e = 0; e < n; e++) {
                float d = ds[e] * 1.5f;
                if (!bias_close(k, y1[e], y0[e], k->atol_f, 1.5f * (fabsf(xs[e]) * 1.5f + 1.0f)) ||
                    !bias_close(k, d1[e], d0[e], k->atol_b, 2.0f * fabsf(d)) ||
                    !bias_close(k, f1[e], f0[e], k->atol_b, fabsf(d))) {
                    if (bad < 3)
                        printf("  %s layout %d lim=%d at %zu: x=%.9g dy=%.9g: y %.9g/%.9g dx %.9g/%.9g (isa/scalar)\n",
                               k->name, lay, lim, e, xs[e], ds[e], y1[e], y0[e], d1[e], d0[e]);
                    bad++;
                }
            }
            if (k->dt == DT_BF16) bad += bias_bits(k, lay, lim);
#if defined(HARNESS_TWIN_NAME)
            {
                static float yt[N], dt_[N], ft[N];
                double st[2 * BC_MAX] = {0};
                bias_call(k, HB_TWIN[k - HB][0], HB_TWIN[k - HB][1], k->dt, k->dt, lay, lim, 1, yt, dt_, ft, st);
                for (size_t e = 0; e < n; e++)
                    if (!same_bits(yt[e], y1[e]) || !same_bits(dt_[e], d1[e]) || !same_bits(ft[e], f1[e])) {
                        if (bad < 3) printf("  %s layout %d lim=%d: differs from %s's at %zu\n", k->name, lay, lim,
                                            HARNESS_TWIN_NAME, e);
                        bad++;
                    }
            }
#endif
            if (lay == BL_FULL) continue;
            /* the sums: within the bound of the elements (finite ones; a NaN b makes its channel's sums NaN) */
            double mag = 0.0;
            for (size_t e = 0; e < n; e++)
                if (isfinite(d1[e])) mag += fabs(d1[e]) * 4.0 + fabs(ds[e]) * 8.0;
            for (int i = 0; i < 2 * BC_MAX; i++) {
                double tol = (double)(k->ulp + k->atol_b) * 0x1p-22 * mag;
                if (isnan(s0[i]) != isnan(s1[i]) || fabs(s1[i] - s0[i]) > tol) {
                    if (bad < 3) printf("  %s layout %d lim=%d: sum %d %.17g/%.17g (isa/scalar)\n", k->name, lay,
                                        lim, i, s1[i], s0[i]);
                    bad++;
                }
            }
        }
    return bad;
}

/* bias_act's backward from y: on the scalar forward's y (layouts with b along dim, and full-shape b: db
 * elementwise), with and without clamp, the ISA against scalar (dx, the full db, the sums) */
static void bias_ycall(const hby_t *k, void *bw, int lay, int lim, float *dx, float *dbf, double *sums) {
    const size_t o = BSHAPES[lay][0], c = BSHAPES[lay][1], in = BSHAPES[lay][2], n = o * c * in;
    int full = lay == BL_FULL;
    ma_bshape s = {o, c, in, full ? 2 : 1, 0, 1, 1}, sy = {o, c, in, 0, 0, 1, 1};
    ma_params p = {k->params[0], k->params[1], k->params[2], k->params[3], 0, INFINITY, 0.0f,
                   lay == BL_LONG ? 1.0f : 1.5f, lim ? 2.0f : INFINITY};
    if (k->dt == DT_F32) {
        static float fx[N], fd[N], fb[N], fy[N], fdx[N], fdb[N];
        for (size_t e = 0; e + BL_OFF(lay) < N; e++) fx[e] = X[e + BL_OFF(lay)], fd[e] = DY[e + BL_OFF(lay)];
        for (size_t e = 0; e < N; e++) fb[e] = BB[e];
        ((bfwd_f32)k->rfwd)(fx, fb, NULL, fy, &s, &p);
        ((bbwd_f32)bw)(fd, fy, NULL, NULL, fdx, full ? fdb : NULL, NULL, full ? NULL : sums, &sy, &p);
        for (size_t e = 0; e < n; e++) dx[e] = fdx[e], dbf[e] = full ? fdb[e] : 0.0f;
        return;
    }
    static uint16_t hx[N], hd[N], hb[N], hy[N], hdx[N], hdb[N];
    for (size_t e = 0; e + BL_OFF(lay) < N; e++) hx[e] = enc(k->dt, X[e + BL_OFF(lay)]), hd[e] = enc(k->dt, DY[e + BL_OFF(lay)]);
    for (size_t e = 0; e < N; e++) hb[e] = enc(k->dt, BB[e]);
    ((bfwd_f16)k->rfwd)(hx, hb, NULL, hy, &s, &p);
    ((bbwd_f16)bw)(hd, hy, NULL, NULL, hdx, full ? hdb : NULL, NULL, full ? NULL : sums, &sy, &p);
    for (size_t e = 0; e < n; e++) dx[e] = dec(k->dt, hdx[e]), dbf[e] = full ? dec(k->dt, hdb[e]) : 0.0f;
}

static int check_bias_y(const hby_t *k) {
    static float d0[N], f0[N], d1[N], f1[N];
    double s0[2 * BC_MAX], s1[2 * BC_MAX];
    int bad = 0;
    hg_t g = {k->name, k->dt, 0, 0, 0, 0, 0, 0, 0, 0, {0}, k->ulp, 0, 0};
    static const int lays[] = {BL_ROWS, BL_VEC, BL_FULL, BL_ROWS2, BL_LONG};
    for (size_t li = 0; li < sizeof lays / sizeof lays[0]; li++)
        for (int lim = 0; lim < 2; lim++) {
            int lay = lays[li];
            memset(s0, 0, sizeof s0), memset(s1, 0, sizeof s1);
            bias_ycall(k, k->rbwd, lay, lim, d0, f0, s0);
            bias_ycall(k, k->bwd, lay, lim, d1, f1, s1);
            size_t n = BL_SIZE(lay);
            const float *ds = DY + BL_OFF(lay);
            double mag = 0.0;
            for (size_t e = 0; e < n; e++) {
                float d = ds[e] * 1.5f;
                if (isfinite(d1[e])) mag += fabs(d1[e]) * 4.0 + fabs(ds[e]) * 8.0;
                if (!gated_close(&g, d1[e], d0[e], k->atol, 2.0f * fabsf(d)) ||
                    !gated_close(&g, f1[e], f0[e], k->atol, 2.0f * fabsf(d))) {
                    if (bad < 3) printf("  %s layout %d lim=%d at %zu: dy=%.9g: dx %.9g/%.9g (isa/scalar)\n", k->name,
                                        lay, lim, e, ds[e], d1[e], d0[e]);
                    bad++;
                }
            }
            if (lay == BL_FULL) continue;
            for (int i = 0; i < 2 * BC_MAX; i++) {
                double tol = (double)(k->ulp + k->atol) * 0x1p-22 * mag;
                if (isnan(s0[i]) != isnan(s1[i]) || fabs(s1[i] - s0[i]) > tol) {
                    if (bad < 3) printf("  %s layout %d lim=%d: sum %d %.17g/%.17g (isa/scalar)\n", k->name, lay, lim,
                                        i, s1[i], s0[i]);
                    bad++;
                }
            }
        }
    return bad;
}

#if defined(MA_SIMDE)
/* SIMDe computes the avx512 kernels with AVX2, FMA and F16C instructions */
#define HOST_ISA "avx2"
#define HOST_NOTE " (SIMDe emulation)"
#else
#define HOST_ISA STR(HARNESS_ISA)
#define HOST_NOTE ""
#endif

/* --serve: the float32 kernels of this build for the accuracy sweeps of an ISA the host cannot run
 * (multiact/cli/served.py; NEON under qemu-aarch64).  A request on stdin is a line "SYMBOL N A B C D" (the
 * packed parameters as C floats, hexadecimal allowed) and then N float32 inputs, 2N for a binary kernel (dy,
 * then x or y), 3N for a ternary one (g, dy, x); the answer on stdout is the N outputs.  Ends at the end of
 * input; exit status 1 on a symbol it lacks or a short read, with the reason on stderr. */
static int serve(void) {
    char sym[160];
    size_t n, cap = 0;
    float a, b, c, d, *in = NULL, *out = NULL;
    while (scanf("%159s %zu %f %f %f %f", sym, &n, &a, &b, &c, &d) == 6 && getchar() == '\n') {
        const hk_t *k = NULL;
        for (size_t i = 0; i < sizeof HK / sizeof HK[0] && !k; i++)
            if (HK[i].dt == DT_F32 && !strcmp(HK[i].name, sym)) k = &HK[i];
        if (!k) {
            fprintf(stderr, "harness --serve: no float32 kernel %s in this build\n", sym);
            return 1;
        }
        size_t need = n * (size_t)(k->sig + 1);
        if (n > cap) {
            free(in), free(out);
            in = malloc(3 * n * sizeof *in), out = malloc(n * sizeof *out), cap = n;
            if (!in || !out) {
                fprintf(stderr, "harness --serve: no memory for %zu points\n", n);
                return 1;
            }
        }
        if (fread(in, sizeof *in, need, stdin) != need) {
            fprintf(stderr, "harness --serve: %s: short input\n", sym);
            return 1;
        }
        ma_params p;
        memset(&p, 0, sizeof p);
        p.a = a, p.b = b, p.c = c, p.d = d;
        if (k->sig == 0) ((un_f32)k->fn)(in, out, n, &p);
        else if (k->sig == 1) ((bin_f32)k->fn)(in, in + n, out, n, &p);
        else ((ter_f32)k->fn)(in, in + n, in + 2 * n, out, n, &p);
        if (fwrite(out, sizeof *out, n, stdout) != n || fflush(stdout)) return 1;
    }
    free(in), free(out);
    return 0;
}

int main(int argc, char **argv) {
    if (!ma_isa_supported(HOST_ISA)) {
        printf("harness: this CPU does not run %s: %s\n", HOST_ISA, ma_isa_why(HOST_ISA));
        return 2;
    }
    if (argc > 1 && !strcmp(argv[1], "--serve")) return serve();
    if (argc > 1) {
        fprintf(stderr, "usage: harness [--serve]\n");
        return 2;
    }
    make_inputs();
    int failed = 0, total = 0;
    for (size_t i = 0; i < sizeof HK / sizeof HK[0]; i++, total++) {
        if (check_elementwise(&HK[i])) failed++;
    }
    for (size_t i = 0; i < N; i++) GU[i] = i % 97 == 5 ? 1e30f : i % 89 == 3 ? -0.0f : DY[(i * 7 + 3) % N] * 1.5f;
    int gtotal = 0;
    for (size_t i = 0; i < sizeof HG / sizeof HG[0]; i++, gtotal++) {
        if (check_gated(&HG[i])) failed++;
    }
    /* bias_act sides: b in [-1, 1], scale in [-1.5, 1.5] with a NaN, an inf and -0 (channels 2, 3 of the rows) */
    for (size_t i = 0; i < N; i++) BB[i] = (float)(urand() * 2.0 - 1.0), BS[i] = (float)(urand() * 3.0 - 1.5);
    BB[3] = NAN, BS[2] = -0.0f, BB[600] = INFINITY;
    int btotal = 0;
    for (size_t i = 0; i < sizeof HB / sizeof HB[0]; i++, btotal++) {
        if (check_bias(&HB[i])) failed++;
    }
    int ytotal = 0;
    for (size_t i = 0; HBY[i].name; i++, ytotal++) {
        if (check_bias_y(&HBY[i])) failed++;
    }
    if (check_prelu()) failed++;
    if (check_pool_flush_mode()) failed++;
#if defined(HARNESS_TWIN_NAME)
#define TWIN_NOTE ", each bit for bit against " HARNESS_TWIN_NAME
#else
#define TWIN_NOTE ""
#endif
    printf("harness %s%s: %d kernels + %d gated pairs + %d bias_act pairs + %d from y + prelu + pool%s, %d failed\n",
           STR(HARNESS_ISA), HOST_NOTE, total, gtotal, btotal, ytotal, TWIN_NOTE, failed);
    return failed != 0;
}
