/* The vector layer in float64 lanes (MA_F64, the f64_<isa>.c units): ma_simd.h's names (V, VI, VM, S, VSPLAT,
 * VLOAD, VSEL, ...) with double lanes, so that the op bodies that need no float32 math (ma_ops.h and
 * ma_ops2.h above their `#if !defined(MA_F64)` lines: the piecewise linear and rational ones) compile
 * unchanged for float64.  Included by ma_simd.h in place of its float32 layer.  No half types, no pairs:
 * the float64 kernels are the elementwise ones (ma_kernels64.inc).
 *   V  double lanes, VI uint64 lanes (bit patterns), VM comparison masks (lanes of 0 / -1), S double.
 */
#ifndef MA_SIMD64_H
#define MA_SIMD64_H

typedef double S;

#if defined(MA_ISA_SCALAR)

#define MA_ISA_NAME scalar
#define W 1
typedef double V;
typedef uint64_t VI;
typedef int VM;
#define VSPLAT(c) ((double)(c))
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSEL(m, a, b) ((m) ? (a) : (b))
#define MAND(a, b) ((a) & (b))
#define MOR(a, b) ((a) | (b))
#define MNOT(a) (!(a))
#define VALL(m) (m)
static inline VI v_as_i(V v) { VI i; memcpy(&i, &v, 8); return i; }
static inline V i_as_v(VI i) { V v; memcpy(&v, &i, 8); return v; }

#elif defined(MA_ISA_AVX2)

#pragma GCC target("avx2,fma")
#include <immintrin.h>
#define MA_ISA_NAME avx2
#define W 4
typedef double V __attribute__((vector_size(32)));
typedef uint64_t VI __attribute__((vector_size(32)));
typedef int64_t VM __attribute__((vector_size(32)));
#define VSPLAT(c) ((V)_mm256_set1_pd((double)(c)))
#define VLOAD(p) ((V)_mm256_loadu_pd(p))
#define VSTORE(p, v) _mm256_storeu_pd((p), (__m256d)(v))
#define VFMA(a, b, c) ((V)_mm256_fmadd_pd((__m256d)(a), (__m256d)(b), (__m256d)(c)))
#define VSEL(m, a, b) ((V)_mm256_blendv_pd((__m256d)(b), (__m256d)(a), (__m256d)(m)))
/* maxpd / minpd are exactly a > b ? a : b and a < b ? a : b, NaN and -0 included */
#define VGT_SEL(a, b) ((V)_mm256_max_pd((__m256d)(a), (__m256d)(b)))
#define VLT_SEL(a, b) ((V)_mm256_min_pd((__m256d)(a), (__m256d)(b)))
#define MA_HAVE_STREAM 1
#define VSTREAM(p, v) _mm256_stream_pd((p), (__m256d)(v))
#define MA_STREAM_FENCE() _mm_sfence()
#define VALL(m) (_mm256_movemask_pd((__m256d)(m)) == 0xf)

#elif defined(MA_ISA_AVX512)

#if defined(MA_SIMDE)
#error "the float64 kernels have no SIMDe build"
#endif
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
#include <immintrin.h>
#define MA_ISA_NAME avx512
#define W 8
typedef double V __attribute__((vector_size(64)));
typedef uint64_t VI __attribute__((vector_size(64)));
typedef int64_t VM __attribute__((vector_size(64)));
#define VSPLAT(c) ((V)_mm512_set1_pd((double)(c)))
/* opaque whole-vector loads, as for float32 (ma_simd.h): GCC would fold a load used only under a select
 * into a masked load, slower than load + blend */
#define MA_OPAQUE(v)                  \
    ({                                \
        V o_ = (v);                   \
        __asm__("" : "+v"(o_));       \
        o_;                           \
    })
#define VLOAD(p) MA_OPAQUE((V)_mm512_loadu_pd(p))
#define VSTORE(p, v) _mm512_storeu_pd((p), (__m512d)(v))
#define VFMA(a, b, c) ((V)_mm512_fmadd_pd((__m512d)(a), (__m512d)(b), (__m512d)(c)))
/* the sign bit of a mask lane picks, with vector operators (compares stay in k registers; ma_simd.h) */
static inline __attribute__((always_inline)) V ma_vsel(VM m, V a, V b) {
    VM k = m < 0;
    return (V)((k & (VM)a) | (~k & (VM)b));
}
#define VSEL(m, a, b) ma_vsel((VM)(m), (V)(a), (V)(b))
#define VGT_SEL(a, b) ((V)_mm512_max_pd((__m512d)(a), (__m512d)(b)))
#define VLT_SEL(a, b) ((V)_mm512_min_pd((__m512d)(a), (__m512d)(b)))
#define MA_HAVE_STREAM 1
#define VSTREAM(p, v) _mm512_stream_pd((p), (__m512d)(v))
#define MA_STREAM_FENCE() _mm_sfence()
#define VALL(m) (_mm512_movepi64_mask((__m512i)(m)) == 0xff)

#elif defined(MA_ISA_NEON)

#include <arm_neon.h>
#define MA_ISA_NAME neon
#define W 2
typedef double V __attribute__((vector_size(16)));
typedef uint64_t VI __attribute__((vector_size(16)));
typedef int64_t VM __attribute__((vector_size(16)));
#define VSPLAT(c) ((V)vdupq_n_f64((double)(c)))
#define VLOAD(p) ((V)vld1q_f64(p))
#define VSTORE(p, v) vst1q_f64((p), (float64x2_t)(v))
#define VFMA(a, b, c) ((V)vfmaq_f64((float64x2_t)(c), (float64x2_t)(a), (float64x2_t)(b)))
#define VSEL(m, a, b) ((V)vbslq_f64((uint64x2_t)(m), (float64x2_t)(a), (float64x2_t)(b)))
#define VALL(m) (vminvq_u32((uint32x4_t)(m)) != 0)

#else
#error "define one of MA_ISA_SCALAR, MA_ISA_AVX2, MA_ISA_AVX512, MA_ISA_NEON"
#endif

#if !defined(VGT_SEL)
/* a > b ? a : b and a < b ? a : b (not fmax/fmin: those differ on NaN and signed zeros) */
#define VGT_SEL(a, b) VSEL((a) > (b), (a), (b))
#define VLT_SEL(a, b) VSEL((a) < (b), (a), (b))
#endif

#if !defined(MA_ISA_SCALAR)
#define MAND(a, b) ((a) & (b))
#define MOR(a, b) ((a) | (b))
#define MNOT(a) (~(a))
#define v_as_i(v) ((VI)(v))
#define i_as_v(i) ((V)(i))
#endif

/* The few helpers of ma_math.h that the float64 bodies use, on double lanes. */
MA_INLINE V ma_abs(V x) { return i_as_v(v_as_i(x) & 0x7fffffffffffffffull); }
MA_INLINE V ma_copysign(V mag, V sgn) {
    return i_as_v((v_as_i(mag) & 0x7fffffffffffffffull) | (v_as_i(sgn) & 0x8000000000000000ull));
}
MA_INLINE V ma_clampv(V x, double lo, double hi) {
    x = VGT_SEL(VSPLAT(lo), x); /* NaN compares false: stays NaN */
    return VLT_SEL(VSPLAT(hi), x);
}
MA_INLINE VM ma_isnan(V x) { return x != x; }

#endif
