/* The C ABI of multiact._native: parameter block, runtime helpers, and (through the generated
 * X-macro list ma_kernel_list.h) one symbol per kernel, ma_<dtype>_<name>__<isa>. */
#ifndef MA_NATIVE_H
#define MA_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* Scalar parameters, already validated by the caller; a..d rounded to float32 (the float32, float16 and bfloat16
 * kernels compute with them), da..dd the same values unrounded (the float64 kernels'):
 *   leaky_relu a=negative_slope; elu, celu a=alpha; swish a=beta; hardtanh a=min_val b=max_val;
 *   softplus a=beta b=threshold; softshrink, hardshrink a=lambd; threshold a=threshold b=value. */
typedef struct ma_params {
    float a, b, c, d;
    int stream; /* set by ma_run_*: the whole call is larger than the caches (non-temporal stores) */
    /* The gated family (gated_<act>): the gate is clipped above at limit, up to [-limit, limit] and
     * shifted by shift (GPT-OSS: 7, 1); limit = +inf: no clip, no shift, no masking. */
    float limit, shift;
    /* The bias_act family (bias_act_<act>): the activation's output times gain, clipped to [-clamp, clamp]
     * (clamp = +inf: no clip). */
    float gain, clamp;
    /* a..d unrounded, for the float64 kernels (ma_run_* and ma_call fill both) */
    double da, db, dc, dd;
} ma_params;

/* The layout of one gated call (gated_<act>, gated_<act>_grad): every array is rows x n elements,
 * element (r, c) of array k at base_k + r * rs[k] + c * es[k] (strides in elements, any sign).
 * Arrays k: 0 dy, 1 gate, 2 up, 3 y (forward) or dgate (backward), 4 dup; the forward ignores 0 and 4.
 * Outputs may be the very same memory as inputs (in place: every input of an element is read before
 * any output is written), never overlap them otherwise.  Fast paths: every element stride 1
 * (contiguous rows); gate and up interleaved (element stride 2, one element apart, de-interleaved in
 * registers) with contiguous or interleaved outputs; anything else gathers per vector.  Threads: the
 * rows x n elements cut in chunks as the unary kernels are (ma_chunks_for with cost). */
typedef struct ma_gshape {
    size_t rows, n;
    ptrdiff_t rs[5], es[5];
    unsigned cost;
    int nthreads;
} ma_gshape;

/* The layout of one bias_act call (bias_act_<act>, bias_act_<act>_grad): x, dy, y, dx and full-shape
 * b, scale, db, dscale are aligned C-contiguous outer x c x inner arrays (the channel axis in the middle);
 * bkind, skind: 0 none, 1 one value per channel (c contiguous values), 2 x's shape.  Outputs may be the
 * very memory of x or dy (in place), never overlap them otherwise.  The backward's sums (db, dscale per
 * channel, 2 x c doubles) are per chunk in double, added in chunk order; chunks as ma_chunks_for with
 * cost, at most 4 per thread where there are sums. */
typedef struct ma_bshape {
    size_t outer, c, inner;
    int bkind, skind;
    unsigned cost;
    int nthreads;
} ma_bshape;

/* The kernel table of native/kernels.py, one "op direction dtype isa symbol ..." line per kernel. */
const char *ma_kernel_table(void);

/* Runtime (ma_runtime.c, ma_pool.c). */
typedef void (*ma_chunk_fn)(void *ctx, size_t chunk);
/* Run body(ctx, 0..nchunks-1) on up to nthreads threads (the caller included). */
void ma_parallel_for(size_t nchunks, ma_chunk_fn body, void *ctx, int nthreads);
/* Chunks for n elements of a kernel costing `cost` (native/kernels.py's COST) on nthreads: 1 while
 * n x cost is below ma_get_parallel_min(), else a few per thread. */
size_t ma_chunks_for(size_t n, unsigned cost, int nthreads);
int ma_isa_supported(const char *isa);
/* The ISAs this runtime knows, best first, separated by spaces (multiact/vocab.py's, through ma_isa_list.h). */
const char *ma_isa_names(void);
/* Why this machine cannot run isa's kernels ("" when it can: CPU features, and for avx512 the OS state). */
const char *ma_isa_why(const char *isa);
/* The avx512 decision from CPUID leaf 1 ECX, leaf 7 EBX and XCR0 ("" when they allow it); any architecture. */
const char *ma_x86_avx512_why(unsigned leaf1_ecx, unsigned leaf7_ebx, unsigned long long xcr0);
void ma_set_parallel_min(size_t work);
size_t ma_get_parallel_min(void);
/* One elementwise call of n elements; cost: the kernel's time per element relative to relu's
 * (native/kernels.py's COST), so that expensive kernels go parallel at smaller sizes. */
void ma_run_unary(void *fn, const void *x, void *y, size_t n, size_t elsize, unsigned cost,
                  double a, double b, double c, double d, int nthreads);
void ma_run_binary(void *fn, const void *u, const void *v, void *out, size_t n, size_t elsize, unsigned cost,
                   double a, double b, double c, double d, int nthreads);
/* A second derivative (g, u = dy, v = x): the binary call's rules with a third input. */
void ma_run_ternary(void *fn, const void *g, const void *u, const void *v, void *out, size_t n, size_t elsize,
                    unsigned cost, double a, double b, double c, double d, int nthreads);
/* The same calls for the tensor hot path: one resolved kernel (fn, elsize, cost and its parameters a..d,
 * built once per cached call) and the arrays as plain addresses of contiguous memory, which cffi converts
 * from Python ints without building a cdata per array (ffi.from_buffer, ffi.cast: the slow parts). */
typedef struct ma_call {
    void *fn;
    size_t elsize;
    unsigned cost;
    ma_params p;
} ma_call;
void ma_call_unary(const ma_call *k, uintptr_t x, uintptr_t y, size_t n, int nthreads);
void ma_call_binary(const ma_call *k, uintptr_t u, uintptr_t v, uintptr_t y, size_t n, int nthreads);
void ma_f16_to_f32(const uint16_t *h, float *f, size_t n);
void ma_f32_to_f16(const float *f, uint16_t *h, size_t n);
/* bfloat16: the scalar rule every ISA's kernels follow (ma_half.h: shift up; round to nearest even) */
void ma_bf16_to_f32(const uint16_t *h, float *f, size_t n);
void ma_f32_to_bf16(const float *f, uint16_t *h, size_t n);
/* The avx512 kernels' bfloat16 stores: AVX512_BF16's vcvtneps2bf16 where this machine has it (its subnormal
 * lanes patched, so that the bits stay ma_f32_to_bf16's), else integer operations.  Why vcvtneps2bf16 is not
 * used ("" when it is allowed: the CPU has it, the avx512 unit was built with it, MULTIACT_NATIVE_BF16_CVT is
 * not 0): */
const char *ma_bf16_cvt_why(void);
/* Use it (1, where allowed) or not (0), between calls only: the state in force after the call. */
int ma_set_bf16_cvt(int on);
int ma_get_bf16_cvt(void);
/* The float32 patterns lo..hi (the whole blocks of 64 that hold them) narrowed by vcvtneps2bf16 as the
 * kernels do and by the integer sequence: how many differ, the first in *first; (size_t)-1 where the CPU
 * or the build has no vcvtneps2bf16 (MULTIACT_NATIVE_BF16_CVT does not matter here). */
size_t ma_bf16_cvt_check(uint32_t lo, uint32_t hi, uint32_t *first);
/* Called at load by an avx512 unit built with vcvtneps2bf16, with its check. */
void ma_bf16_cvt_register(size_t (*check)(uint32_t lo, uint32_t hi, uint32_t *first));

#endif
