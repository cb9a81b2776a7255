/* Runtime pieces shared by every ISA: CPU feature tests, the threaded drivers, half and bfloat16
 * conversions. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ma_half.h"
#include "ma_isa_list.h"
#include "ma_native.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

/* Why avx512 cannot run ("" when it can), from CPUID leaf 1 ECX, leaf 7 (subleaf 0) EBX and XCR0: the
 * kernels need AVX-512 F, BW, DQ and VL, and the OS must save the opmask and ZMM state (XCR0 bits 5-7)
 * with the SSE and AVX state (bits 1-2), which it shows by setting OSXSAVE.  Pure: the tests feed it
 * words of CPUs this machine is not. */
const char *ma_x86_avx512_why(unsigned leaf1_ecx, unsigned leaf7_ebx, unsigned long long xcr0) {
    static const struct { unsigned bit; const char *why; } need[] = {
        {16, "the CPU has no AVX-512 (CPUID leaf 7 EBX: no AVX512F)"},
        {30, "CPUID leaf 7 EBX: no AVX512BW"},
        {17, "CPUID leaf 7 EBX: no AVX512DQ"},
        {31, "CPUID leaf 7 EBX: no AVX512VL"},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!(leaf7_ebx >> need[i].bit & 1u)) return need[i].why;
    if (!(leaf1_ecx >> 27 & 1u)) return "the OS has not enabled XSAVE (CPUID leaf 1 ECX: no OSXSAVE)";
    if ((xcr0 & 0xe6u) != 0xe6u)
        return "the OS does not save the AVX-512 register state (XCR0 bits 5-7 opmask/ZMM, 1-2 SSE/AVX)";
    return "";
}

#if defined(__x86_64__)
static int x86_avx2(void) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29))) return 0; /* F16C */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static const char *x86_avx512_why(void) {
    unsigned a, b, c, c1 = 0, d, b7 = 0;
    unsigned long long xcr0 = 0;
    if (!x86_avx2()) return "the CPU lacks AVX2, FMA or F16C";
    __get_cpuid(1, &a, &b, &c1, &d);
    if (!__get_cpuid_count(7, 0, &a, &b7, &c, &d)) b7 = 0;
    if (c1 >> 27 & 1u) { /* xgetbv faults without OSXSAVE */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = (unsigned long long)hi << 32 | lo;
    }
    return ma_x86_avx512_why(c1, b7, xcr0);
}
#endif

/* vcvtneps2bf16 in the avx512 bfloat16 stores (ma_simd.h ma_bf_pack reads ma_bf16_cvt_on). */
int ma_bf16_cvt_on = 0;
static size_t (*bf16_cvt_check)(uint32_t, uint32_t, uint32_t *);

static const char *bf16_cvt_hw_why(void) {
    if (!bf16_cvt_check)
        return "this build's avx512 kernels have no vcvtneps2bf16 (no avx512 column, a SIMDe build, or a compiler "
               "without AVX512_BF16)";
#if defined(__x86_64__)
    const char *why = x86_avx512_why();
    unsigned a = 0, b, c, d;
    if (*why) return why;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1u))
        return "the CPU has no AVX512_BF16 (CPUID leaf 7 subleaf 1 EAX)";
    return "";
#else
    return "not an x86-64 CPU";
#endif
}

const char *ma_bf16_cvt_why(void) {
    const char *why = bf16_cvt_hw_why(), *env = getenv("MULTIACT_NATIVE_BF16_CVT");
    if (*why) return why;
    if (env && strcmp(env, "0") == 0) return "MULTIACT_NATIVE_BF16_CVT=0 asks for the integer sequence";
    return "";
}

int ma_set_bf16_cvt(int on) {
    ma_bf16_cvt_on = on && ma_bf16_cvt_why()[0] == '\0';
    return ma_bf16_cvt_on;
}

int ma_get_bf16_cvt(void) { return ma_bf16_cvt_on; }

size_t ma_bf16_cvt_check(uint32_t lo, uint32_t hi, uint32_t *first) {
    return bf16_cvt_hw_why()[0] ? (size_t)-1 : bf16_cvt_check(lo, hi, first);
}

void ma_bf16_cvt_register(size_t (*check)(uint32_t, uint32_t, uint32_t *)) {
    bf16_cvt_check = check;
    ma_set_bf16_cvt(1);
}

/* The ISA table: which ISAs there are, their names and order (best first) come from the vocabulary
 * (multiact/vocab.py, generated into ma_isa_list.h as MA_ISA(name, architecture)); each ISA's test of this
 * machine is isa_<name>_why below, on its own architecture ("" when this machine runs it).  An ISA of
 * another architecture has no test here (NULL): it does not run. */
static const char *isa_scalar_why(void) { return ""; }
#define MA_ON_any(test) test
#if defined(__x86_64__)
static const char *isa_avx2_why(void) { return x86_avx2() ? "" : "the CPU lacks AVX2, FMA or F16C"; }
static const char *isa_avx512_why(void) { return x86_avx512_why(); }
#define MA_ON_x86_64(test) test
#else
#define MA_ON_x86_64(test) NULL
#endif
#if defined(__aarch64__)
static const char *isa_neon_why(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0 ? "" : "the CPU lacks Advanced SIMD (HWCAP_ASIMD)";
#else
    return ""; /* Advanced SIMD is part of every ARMv8-A */
#endif
}
#define MA_ON_aarch64(test) test
#else
#define MA_ON_aarch64(test) NULL
#endif

static const struct {
    const char *name;
    const char *(*why)(void);
} isas[] = {
#define MA_ISA(name, arch) {#name, MA_ON_##arch(isa_##name##_why)},
    MA_ISA_LIST
#undef MA_ISA
};

const char *ma_isa_names(void) {
    return ""
#define MA_ISA(name, arch) " " #name
        MA_ISA_LIST
#undef MA_ISA
        + 1;
}

/* Why this machine cannot run the kernels of isa ("" when it can). */
const char *ma_isa_why(const char *isa) {
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (strcmp(isa, isas[i].name) == 0 && isas[i].why) return isas[i].why();
    return "not an ISA of this architecture";
}

int ma_isa_supported(const char *isa) {
    return ma_isa_why(isa)[0] == '\0';
}

/* Results larger than this skip the caches (streaming stores): they would only evict the inputs. */
#define MA_STREAM_BYTES ((size_t)8 << 20)

/* Below this much work (elements x cost) a call stays on the calling thread (measured: benchmarks/). */
static size_t parallel_min = 1u << 18;
void ma_set_parallel_min(size_t work) { parallel_min = work; }
size_t ma_get_parallel_min(void) { return parallel_min; }

typedef void (*unary_fn)(const void *, void *, size_t, const ma_params *);
typedef void (*binary_fn)(const void *, const void *, void *, size_t, const ma_params *);
typedef void (*ternary_fn)(const void *, const void *, const void *, void *, size_t, const ma_params *);

size_t ma_chunks_for(size_t n, unsigned cost, int nthreads) {
    size_t work = n > SIZE_MAX / 64 ? SIZE_MAX : n * (cost ? cost : 1);
    if (nthreads <= 1 || work < parallel_min) return 1;
    /* chunks of ~32K units: a helper preempted mid-chunk holds the call up for one chunk only */
    size_t c = work / 32768;
    if (c < (size_t)nthreads) c = (size_t)nthreads;
    return c > 4096 ? 4096 : c;
}

/* Chunk i of n elements in c chunks: [lo, hi), cut at multiples of 64 elements. */
static void cut(size_t n, size_t c, size_t i, size_t *lo, size_t *hi) {
    size_t blocks = (n + 63) / 64;
    size_t b0 = blocks * i / c, b1 = blocks * (i + 1) / c;
    *lo = b0 * 64 < n ? b0 * 64 : n;
    *hi = b1 * 64 < n ? b1 * 64 : n;
}

typedef struct {
    void *fn;
    const char *u, *v, *w; /* w: a ternary kernel's third input (its first two are u, v), else NULL */
    char *out;
    size_t n, chunks, elsize;
    ma_params p;
} ew_job;

/* Elements [lo, hi) of a job.  NumPy allows a float32 array at any byte offset, but C may not load
 * a float from one (the scalar kernels dereference; gcc may vectorise assuming alignment): arrays
 * off their element alignment go through aligned blocks, which round exactly like the rest. */
#define MA_BOUNCE 1024
static void run_span(const ew_job *j, size_t lo, size_t hi) {
    size_t e = j->elsize, n = hi - lo;
    const char *u = j->u + lo * e, *v = j->v ? j->v + lo * e : NULL, *w = j->w ? j->w + lo * e : NULL;
    char *out = j->out + lo * e;
    if (n == 0) return;
    if (((uintptr_t)u % e | (uintptr_t)(v ? v : u) % e | (uintptr_t)(w ? w : u) % e | (uintptr_t)out % e) == 0) {
        if (w) ((ternary_fn)j->fn)(u, v, w, out, n, &j->p);
        else if (v) ((binary_fn)j->fn)(u, v, out, n, &j->p);
        else ((unary_fn)j->fn)(u, out, n, &j->p);
        return;
    }
    ma_params p = j->p;
    p.stream = 0;
    _Alignas(64) char bu[MA_BOUNCE * 8], bv[MA_BOUNCE * 8], bw[MA_BOUNCE * 8], by[MA_BOUNCE * 8]; /* float64's */
    for (size_t i = 0; i < n; i += MA_BOUNCE) {
        size_t m = n - i < MA_BOUNCE ? n - i : MA_BOUNCE;
        memcpy(bu, u + i * e, m * e);
        if (w) {
            memcpy(bv, v + i * e, m * e);
            memcpy(bw, w + i * e, m * e);
            ((ternary_fn)j->fn)(bu, bv, bw, by, m, &p);
        } else if (v) {
            memcpy(bv, v + i * e, m * e);
            ((binary_fn)j->fn)(bu, bv, by, m, &p);
        } else {
            ((unary_fn)j->fn)(bu, by, m, &p);
        }
        memcpy(out + i * e, by, m * e);
    }
}

static void span_chunk(void *ctx, size_t i) {
    ew_job *j = ctx;
    size_t lo, hi;
    cut(j->n, j->chunks, i, &lo, &hi);
    run_span(j, lo, hi);
}

/* One elementwise call (v = NULL: unary; w given: ternary): on this thread, or in chunks on the pool. */
static void run_job3(void *fn, const void *u, const void *v, const void *w, void *out, size_t n, size_t elsize,
                     unsigned cost, double a, double b, double c, double d, int nthreads) {
    ew_job j = {fn, u, v, w, out, n, ma_chunks_for(n, cost, nthreads), elsize,
                {.a = (float)a, .b = (float)b, .c = (float)c, .d = (float)d, .stream = n * elsize >= MA_STREAM_BYTES,
                 .da = a, .db = b, .dc = c, .dd = d}};
    if (j.chunks <= 1) {
        run_span(&j, 0, n);
        return;
    }
    ma_parallel_for(j.chunks, span_chunk, &j, nthreads);
}

static void run_job(void *fn, const void *u, const void *v, void *out, size_t n, size_t elsize, unsigned cost,
                    double a, double b, double c, double d, int nthreads) {
    run_job3(fn, u, v, NULL, out, n, elsize, cost, a, b, c, d, nthreads);
}

void ma_run_unary(void *fn, const void *x, void *y, size_t n, size_t elsize, unsigned cost,
                  double a, double b, double c, double d, int nthreads) {
    run_job(fn, x, NULL, y, n, elsize, cost, a, b, c, d, nthreads);
}

void ma_run_binary(void *fn, const void *u, const void *v, void *out, size_t n, size_t elsize, unsigned cost,
                   double a, double b, double c, double d, int nthreads) {
    run_job(fn, u, v, out, n, elsize, cost, a, b, c, d, nthreads);
}

void ma_run_ternary(void *fn, const void *g, const void *u, const void *v, void *out, size_t n, size_t elsize,
                    unsigned cost, double a, double b, double c, double d, int nthreads) {
    run_job3(fn, g, u, v, out, n, elsize, cost, a, b, c, d, nthreads);
}

void ma_call_unary(const ma_call *k, uintptr_t x, uintptr_t y, size_t n, int nthreads) {
    run_job(k->fn, (const void *)x, NULL, (void *)y, n, k->elsize, k->cost, k->p.da, k->p.db, k->p.dc, k->p.dd, nthreads);
}

void ma_call_binary(const ma_call *k, uintptr_t u, uintptr_t v, uintptr_t y, size_t n, int nthreads) {
    run_job(k->fn, (const void *)u, (const void *)v, (void *)y, n, k->elsize, k->cost, k->p.da, k->p.db,
            k->p.dc, k->p.dd, nthreads);
}

void ma_f16_to_f32(const uint16_t *h, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = ma_h2f(h[i]);
}

void ma_f32_to_f16(const float *f, uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = ma_f2h(f[i]);
}

void ma_bf16_to_f32(const uint16_t *h, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = ma_bf2f(h[i]);
}

void ma_f32_to_bf16(const float *f, uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = ma_f2bf(f[i]);
}
