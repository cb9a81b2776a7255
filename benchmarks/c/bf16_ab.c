/* A/B of two builds of the avx2 kernels (libA.so, libB.so) in one process: float16 and bfloat16 of each, rounds
 * interleaved (rotated order), medians of the times and of each round's bf16/f16 ratio (a busy machine's slow
 * stretches hit both calls of a round).  Issue 18's speed floor, without Python.
 *
 * Build a library of the measured kernels from a source tree (a generated list of just those kernels):
 *   python - <<'E'
 *   import importlib.util, sys
 *   s = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(s)
 *   sys.modules["k"] = k; s.loader.exec_module(k)
 *   S = frozenset("sigmoid sigmoid_grad sigmoid_grad_y tanh tanh_grad tanh_grad_y gelu gelu_grad silu silu_grad "
 *                 "leaky_relu leaky_relu_grad".split())
 *   open("/tmp/ab/ma_kernel_list.h", "w").write(k.x_macro_header(S, S))
 *   E
 *   gcc -O3 -std=gnu11 -ffp-contract=off -fno-math-errno -fPIC -shared -I<tree>/native/src -I/tmp/ab \
 *       -o libA.so <tree>/native/src/isa_avx2.c -lm
 *   gcc -O2 -mf16c -rdynamic -o bf16_ab benchmarks/c/bf16_ab.c -ldl -lm
 *   ./bf16_ab ./libA.so ./libB.so 16777216 41 1 [kernel names]     (n, rounds, streaming stores)
 * (the libraries take ma_parallel_for / ma_chunks_for from this program: one thread) */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
typedef struct { float a, b, c, d; int stream; float limit, shift, gain, clamp; } ma_params;
typedef void (*un_t)(const void *, void *, size_t, const ma_params *);
typedef void (*bi_t)(const void *, const void *, void *, size_t, const ma_params *);
static uint16_t f2bf(float f) { uint32_t x; memcpy(&x, &f, 4); if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40; return (x + 0x7fff + ((x >> 16) & 1)) >> 16; }
static uint16_t f2h(float f) { return _cvtss_sh(f, 0); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmpd(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
static double gauss(void) { double u = (rand() + 1.0) / (RAND_MAX + 2.0), v = (rand() + 1.0) / (RAND_MAX + 2.0); return sqrt(-2 * log(u)) * cos(6.283185307179586 * v); }
int main(int argc, char **argv) {
    void *lib[2] = {dlopen(argv[1], RTLD_NOW | RTLD_LOCAL), dlopen(argv[2], RTLD_NOW | RTLD_LOCAL)};
    if (!lib[0] || !lib[1]) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    size_t n = strtoull(argv[3], 0, 0); int R = atoi(argv[4]), stream = atoi(argv[5]);
    const char *only = argc > 6 ? argv[6] : NULL;
    uint16_t *xb = aligned_alloc(64, 2 * n), *xh = aligned_alloc(64, 2 * n), *db = aligned_alloc(64, 2 * n), *dh = aligned_alloc(64, 2 * n);
    uint16_t *yb = aligned_alloc(64, 2 * n), *yh = aligned_alloc(64, 2 * n), *ob = aligned_alloc(64, 2 * n);
    srand(1);
    for (size_t i = 0; i < n; i++) { float x = 3 * gauss(), d = gauss(); xb[i] = f2bf(x), xh[i] = f2h(x), db[i] = f2bf(d), dh[i] = f2h(d); }
    memset(ob, 0, 2 * n);
    struct { const char *op, *dir, *k, *fwd; float a; } rows[] = {
        {"sigmoid", "forward", "sigmoid", 0, 0}, {"sigmoid", "backward", "sigmoid_grad", 0, 0}, {"sigmoid", "backward_y", "sigmoid_grad_y", "sigmoid", 0},
        {"tanh", "forward", "tanh", 0, 0}, {"tanh", "backward", "tanh_grad", 0, 0}, {"tanh", "backward_y", "tanh_grad_y", "tanh", 0},
        {"gelu", "forward", "gelu", 0, 0}, {"gelu", "backward", "gelu_grad", 0, 0},
        {"silu", "forward", "silu", 0, 0}, {"silu", "backward", "silu_grad", 0, 0},
        {"leaky_relu", "forward", "leaky_relu", 0, 0.01f}, {"leaky_relu", "backward", "leaky_relu_grad", 0, 0.01f},
        {"leaky_relu", "backward_y", "leaky_relu_grad", "leaky_relu", 0.01f}};
    printf("n=%zu rounds=%d stream=%d; ns/element medians; A=%s B=%s\n", n, R, stream, argv[1], argv[2]);
    printf("%-11s %-10s %7s %7s %7s %7s %8s %8s\n", "op", "dir", "A f16", "A bf16", "B f16", "B bf16", "A bf/h", "B bf/h");
    double *t = malloc(sizeof(double) * 4 * R);
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        if (only && !strstr(only, rows[r].k)) continue;
        ma_params p = {rows[r].a, 0, 0, 0, stream, INFINITY, 0, 1, INFINITY};
        char nm[128];
        void *fn[4];
        for (int v = 0; v < 4; v++) { snprintf(nm, sizeof nm, "ma_%s_%s__avx2", v & 1 ? "bf16" : "f16", rows[r].k); fn[v] = dlsym(lib[v >> 1], nm); if (!fn[v]) { fprintf(stderr, "no %s\n", nm); return 1; } }
        int bin = strstr(rows[r].k, "_grad") != NULL;
        const uint16_t *ib = xb, *ih = xh;
        if (rows[r].fwd) {
            snprintf(nm, sizeof nm, "ma_bf16_%s__avx2", rows[r].fwd); ((un_t)dlsym(lib[0], nm))(xb, yb, n, &p);
            snprintf(nm, sizeof nm, "ma_f16_%s__avx2", rows[r].fwd); ((un_t)dlsym(lib[0], nm))(xh, yh, n, &p);
            ib = yb, ih = yh;
        }
        for (int k = -1; k < R; k++)
            for (int j = 0; j < 4; j++) {
                int v = (j + (k < 0 ? 0 : k)) % 4;
                const uint16_t *in = v & 1 ? ib : ih, *d = v & 1 ? db : dh;
                double t0 = now();
                if (bin) ((bi_t)fn[v])(d, in, ob, n, &p); else ((un_t)fn[v])(in, ob, n, &p);
                double dt = now() - t0;
                if (k >= 0) t[v * R + k] = dt;
            }
        double med[4], ra[2], *q = malloc(sizeof(double) * R);
        for (int s2 = 0; s2 < 2; s2++) { for (int k = 0; k < R; k++) q[k] = t[(2 * s2 + 1) * R + k] / t[2 * s2 * R + k]; qsort(q, R, sizeof(double), cmpd); ra[s2] = q[R / 2]; }
        free(q);
        for (int v = 0; v < 4; v++) { qsort(t + v * R, R, sizeof(double), cmpd); med[v] = t[v * R + R / 2] * 1e9 / n; }
        printf("%-11s %-10s %7.3f %7.3f %7.3f %7.3f %7.3fx %7.3fx   per-round ratio medians %6.3fx %6.3fx\n", rows[r].op, rows[r].dir, med[0], med[1], med[2], med[3], med[1] / med[0], med[3] / med[2], ra[0], ra[1]);
        fflush(stdout);
    }
    return 0;
}
void ma_parallel_for(size_t nchunks, void (*body)(void *, size_t), void *ctx, int nthreads) { (void)nthreads; for (size_t i = 0; i < nchunks; i++) body(ctx, i); }
size_t ma_chunks_for(size_t n, unsigned cost, int nthreads) { (void)n; (void)cost; (void)nthreads; return 1; }
