/* The one pass of ma_quant.inc on one ISA against the scalar ISA's, built from the same sources
 * (scripts/test_quant_harness.sh: x86 avx2 / avx512 natively, neon with aarch64-linux-gnu-gcc under qemu-aarch64).
 * 1. The conversion (both sequences: ma_q_convert's fmt and fmt | 4): every STEP-th float32 pattern (argv[1], default 65537; 1: all 2^32) plus the specials and the
 *    neighbourhoods of the formats' boundaries, both signs, for float8_e4m3fn, float8_e5m2 and int8: bit for bit.
 *    The scalar conversion itself is checked on all 2^32 patterns against multiact.quant (scripts/
 *    quant_convert_check.py, results/quant-convert-exhaustive.txt), so equal bits here carry that check over.
 * 2. ma_q_run on float32, float16 and bfloat16 inputs (an activation written here: the same float32 values on
 *    both sides), every mode and format, groups 32/64/128, rows and tails, specials: codes, scales and zero
 *    points bit for bit.
 * Exit status 0 only if everything agrees.  Threads: ma_parallel_for and ma_chunks_for are serial stubs here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ma_half.h"
#include "ma_native.h"
#include "ma_quant.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define RUN_ISA CAT(ma_q_run__, ISA)
#define CONVERT_ISA CAT(ma_q_convert__, ISA)

int RUN_ISA(const ma_qjob *j);
void CONVERT_ISA(const float *r, size_t n, int fmt, uint8_t *out);
int ma_q_run__scalar(const ma_qjob *j);
void ma_q_convert__scalar(const float *r, size_t n, int fmt, uint8_t *out);

void ma_parallel_for(size_t nchunks, ma_chunk_fn body, void *ctx, int nthreads) {
    (void)nthreads;
    for (size_t i = 0; i < nchunks; i++) body(ctx, i);
}
size_t ma_chunks_for(size_t n, unsigned cost, int nthreads) {
    (void)cost;
    return nthreads > 1 && n > 4096 ? 3 : 1;
}

static float f_of(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }

/* y = 1.5 x - 0.25 x^2 / (1 + |x|), in float32: any function will do, both sides call this one */
static void act(const float *x, float *y, size_t n, const ma_params *p) {
    (void)p;
    for (size_t i = 0; i < n; i++) {
        volatile float t = x[i];
        y[i] = 1.5f * t - 0.25f * t * t / (1.0f + fabsf(t));
    }
}
static void gated(const float *g, const float *u, float *y, const ma_gshape *s, const ma_params *p) {
    (void)p;
    for (size_t c = 0; c < s->n; c++) {
        float a = g[(ptrdiff_t)c * s->es[1]], b = u[(ptrdiff_t)c * s->es[2]];
        y[(ptrdiff_t)c * s->es[3]] = a / (1.0f + expf(-a)) * b;
    }
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}

static int check_convert(uint64_t step) {
    static const float around[] = {448.0f, 464.0f, 57344.0f, 61440.0f, 127.0f, 127.5f, 0x1p-6f, 0x1p-9f, 0x1p-10f,
                                   0x1p-14f, 0x1p-16f, 0x1p-17f, 0.5f, 1.5f, 2.5f};
    enum { B = 1 << 16 };
    static float r[B];
    static uint8_t a[B], b[B];
    size_t bad = 0, total = 0;
    static const int fmts[] = {0, 1, 2, 4, 5, 6}; /* the kernels' sequence, then the general one alone */
    for (int fi = 0; fi < 6; fi++) {
        int fmt = fmts[fi];
        size_t k = 0;
        uint64_t pat = 0;
        int extra = 1;
        for (;;) {
            k = 0;
            if (extra) { /* the neighbourhoods and specials first */
                const uint32_t sp[] = {0, 0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 1, 0x7fffffu};
                for (size_t i = 0; i < sizeof sp / 4; i++) r[k++] = f_of(sp[i]), r[k++] = f_of(sp[i] | 0x80000000u);
                for (size_t i = 0; i < sizeof around / 4; i++)
                    for (int d = -3; d <= 3; d++) {
                        uint32_t bb;
                        memcpy(&bb, &around[i], 4);
                        r[k++] = f_of(bb + (uint32_t)d), r[k++] = f_of((bb + (uint32_t)d) | 0x80000000u);
                    }
                extra = 0;
            } else {
                for (; k < B && pat < (1ull << 32); pat += step) r[k++] = f_of((uint32_t)pat);
                if (k == 0) break;
            }
            CONVERT_ISA(r, k, fmt, a);
            ma_q_convert__scalar(r, k, fmt, b);
            for (size_t i = 0; i < k; i++)
                if (a[i] != b[i] && bad++ < 10) {
                    uint32_t bb;
                    memcpy(&bb, &r[i], 4);
                    printf("convert fmt %d: %08x -> %02x, scalar %02x\n", fmt, bb, a[i], b[i]);
                }
            total += k;
        }
    }
    printf("conversion (%s): %zu patterns, %zu differ\n", STR(ISA), total, bad);
    return bad != 0;
}

static int check_run(void) {
    enum { ROWS = 7, N = 384 };
    static float xf[ROWS * 2 * N];
    static uint16_t xh[ROWS * 2 * N];
    static uint8_t ca[ROWS * N], cb[ROWS * N];
    static float sa[ROWS * N], sb[ROWS * N];
    static int32_t za[ROWS * N], zb[ROWS * N];
    size_t bad = 0, cases = 0;
    for (size_t i = 0; i < ROWS * 2 * N; i++) {
        float v = (float)((int32_t)next() % 20000) / 2000.0f;
        if (i / (2 * N) == 1) v *= 1e-4f;
        if (i / (2 * N) == 2 && i % 97 == 0) v = 0.0f;
        xf[i] = v;
    }
    for (size_t i = 2 * N * 3; i < 2 * N * 3 + 128; i++) xf[i] = (i & 1) ? -0.0f : 0.0f; /* zero groups */
    xf[2 * N * 4 + 5] = NAN;
    xf[2 * N * 5 + 77] = INFINITY;
    xf[2 * N * 5 + 300] = -INFINITY;
    xf[2 * N * 6 + 11] = 3e38f;
    ma_params p;
    memset(&p, 0, sizeof p);
    static const size_t groups[] = {32, 64, 128, N};
    for (int dtype = 0; dtype < 3; dtype++) {
        for (size_t i = 0; i < ROWS * 2 * N; i++) xh[i] = dtype == 1 ? ma_f2h(xf[i]) : ma_f2bf(xf[i]);
        for (int kind = 0; kind < 2; kind++)
            for (int fmt = 0; fmt < 4; fmt++)
                for (int mode = 0; mode < 5; mode++)
                    for (size_t gi = 0; gi < 4; gi++)
                        for (int opt = 0; opt < 3; opt++) {
                            if ((mode == 2 || mode == 3) && (fmt >= 2 || groups[gi] != 32)) continue;
                            if ((mode == 1 || mode == 4) && gi) continue;
                            if (fmt == 3 && (mode == 1 || mode == 2 || mode == 3 || opt)) continue;
                            if (mode == 1 && opt) continue;
                            for (size_t rows = 1; rows <= ROWS; rows += ROWS - 1) {
                                ma_qjob j;
                                memset(&j, 0, sizeof j);
                                j.kind = kind, j.fn = kind ? (void *)gated : (void *)act, j.p = &p, j.cost = 4;
                                j.dtype = dtype;
                                j.x = dtype ? (const void *)xh : (const void *)xf;
                                j.up = dtype ? (const void *)(xh + N) : (const void *)(xf + N);
                                j.arows = rows, j.an = N, j.xrs = j.urs = 2 * N, j.xes = j.ues = 1;
                                if (kind == 0 && rows == 1) j.an = N - 5; /* a tail */
                                j.fmt = fmt, j.mode = mode, j.group = mode == 0 ? groups[gi] : 32;
                                if (j.an % j.group) j.group = j.an;
                                j.qmax = fmt == 0 ? 448.0f : fmt == 1 ? 57344.0f : 127.0f;
                                j.scale = 0.0123f;
                                j.pow2 = opt == 1;
                                j.ub = opt == 2 ? 2.0f : 0.0f, j.floor_ = opt == 2 ? 1e-3f : 0.0f;
                                j.emax = fmt == 0 ? 8 : 15;
                                j.nthreads = 2;
                                memset(ca, 0xaa, sizeof ca), memset(cb, 0xaa, sizeof cb);
                                memset(sa, 0xaa, sizeof sa), memset(sb, 0xaa, sizeof sb);
                                memset(za, 0xaa, sizeof za), memset(zb, 0xaa, sizeof zb);
                                j.codes = ca, j.scales = sa, j.zp = za;
                                int ra = RUN_ISA(&j);
                                j.codes = cb, j.scales = sb, j.zp = zb;
                                int rb = ma_q_run__scalar(&j);
                                cases++;
                                if (ra || rb || memcmp(ca, cb, sizeof ca) || memcmp(sa, sb, sizeof sa) ||
                                    memcmp(za, zb, sizeof za)) {
                                    if (bad++ < 10)
                                        printf("run differs: dtype %d kind %d fmt %d mode %d group %zu opt %d rows "
                                               "%zu\n", dtype, kind, fmt, mode, j.group, opt, rows);
                                }
                            }
                        }
    }
    printf("one pass (%s): %zu cases, %zu differ\n", STR(ISA), cases, bad);
    return bad != 0;
}

int main(int argc, char **argv) {
    uint64_t step = argc > 1 ? strtoull(argv[1], NULL, 10) : 65537;
    int fail = check_convert(step ? step : 1);
    fail |= check_run();
    return fail;
}
