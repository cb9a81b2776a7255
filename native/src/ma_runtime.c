/* Runtime pieces shared by every ISA: CPU feature tests, the threaded drivers, half conversion. */
#include <string.h>

#include "ma_half.h"
#include "ma_native.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

int ma_isa_supported(const char *isa) {
    if (strcmp(isa, "scalar") == 0) return 1;
#if defined(__x86_64__)
    if (strcmp(isa, "avx2") == 0) {
        unsigned a, b, c, d;
        __builtin_cpu_init();
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29))) return 0; /* F16C */
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
#endif
#if defined(__aarch64__)
    if (strcmp(isa, "neon") == 0) {
#if defined(__linux__)
        return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
        return 1; /* Advanced SIMD is part of every ARMv8-A */
#endif
    }
#endif
    return 0;
}

int ma_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* Below this many elements a call stays on the calling thread (measured: benchmarks/). */
static size_t parallel_min = 1u << 17;
void ma_set_parallel_min(size_t n) { parallel_min = n; }
size_t ma_get_parallel_min(void) { return parallel_min; }

typedef void (*unary_fn)(const void *, void *, size_t, const ma_params *);
typedef void (*binary_fn)(const void *, const void *, void *, size_t, const ma_params *);

/* Thread t's share [lo, hi), cut at multiples of 64 elements (whole cache lines, whole vectors). */
static void share(size_t n, int t, int nt, size_t *lo, size_t *hi) {
    size_t blocks = (n + 63) / 64;
    size_t b0 = blocks * (size_t)t / (size_t)nt, b1 = blocks * (size_t)(t + 1) / (size_t)nt;
    *lo = b0 * 64 < n ? b0 * 64 : n;
    *hi = b1 * 64 < n ? b1 * 64 : n;
}

void ma_run_unary(void *fn, const void *x, void *y, size_t n, size_t elsize,
                  float a, float b, float c, float d, int nthreads) {
    const ma_params p = {a, b, c, d};
    unary_fn f = (unary_fn)fn;
    if (nthreads <= 1 || n < parallel_min) {
        f(x, y, n, &p);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int t = 0; t < nthreads; t++) {
        size_t lo, hi;
        share(n, t, nthreads, &lo, &hi);
        if (hi > lo) f((const char *)x + lo * elsize, (char *)y + lo * elsize, hi - lo, &p);
    }
}

void ma_run_binary(void *fn, const void *u, const void *v, void *out, size_t n, size_t elsize,
                   float a, float b, float c, float d, int nthreads) {
    const ma_params p = {a, b, c, d};
    binary_fn f = (binary_fn)fn;
    if (nthreads <= 1 || n < parallel_min) {
        f(u, v, out, n, &p);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int t = 0; t < nthreads; t++) {
        size_t lo, hi;
        share(n, t, nthreads, &lo, &hi);
        if (hi > lo)
            f((const char *)u + lo * elsize, (const char *)v + lo * elsize, (char *)out + lo * elsize, hi - lo, &p);
    }
}

void ma_f16_to_f32(const uint16_t *h, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = ma_h2f(h[i]);
}

void ma_f32_to_f16(const float *f, uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = ma_f2h(f[i]);
}
