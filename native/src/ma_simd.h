/* The vector layer: one set of names (V, VM, VI, VLOAD, VSEL, ...) per ISA, so that the math
 * (ma_math.h) and the op bodies (ma_ops.h) are written once and compiled for every ISA.
 *
 * The translation unit defines exactly one of MA_ISA_SCALAR, MA_ISA_AVX2, MA_ISA_AVX512, MA_ISA_NEON before
 * including this file.  GCC vector extensions give +,-,*,/, comparisons (lanes of 0 / -1) and
 * bit casts for free; only loads, stores, FMA, blend, min/max and half conversions need intrinsics.
 *   V  float lanes, VI uint32 lanes (bit patterns), VM comparison masks; VALL(m): every lane of m set.
 * Loads and stores per storage type: VLOAD / VSTORE float32, VLOAD_H / VSTORE_H float16 (F16C, vcvt),
 * VLOAD_B / VSTORE_B bfloat16 (a shift into the high half; ma_bf_hi's integer rounding, the same bits
 * on every ISA as ma_half.h's ma_f2bf), each with pair (VLOAD2*, VSTORE2*) and, where the ISA has
 * them, streaming (VSTREAM*) forms.
 */
#ifndef MA_SIMD_H
#define MA_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ma_half.h"

/* The math and op bodies must inline into the loops: a call passes vectors through memory. */
#define MA_INLINE static inline __attribute__((always_inline))

#if defined(MA_F64)
#include "ma_simd64.h" /* float64 lanes */
#else

/* the scalar type of a lane (double in the float64 layer) */
typedef float S;

#if defined(MA_ISA_SCALAR)

#define MA_ISA_NAME scalar
#define W 1
typedef float V;
typedef uint32_t VI;
typedef int VM;
#define VSPLAT(c) ((float)(c))
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VLOAD_H(p) ma_h2f(*(p))
#define VSTORE_H(p, v) (*(p) = ma_f2h(v))
#define VLOAD_B(p) ma_bf2f(*(p))
#define VSTORE_B(p, v) (*(p) = ma_f2bf(v))
/* No FMA in the portable path: every algorithm here is exact enough without one. */
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSEL(m, a, b) ((m) ? (a) : (b))
#define MAND(a, b) ((a) & (b))
#define MOR(a, b) ((a) | (b))
#define MNOT(a) (!(a))
#define MASK_I(m, k) ((m) ? (uint32_t)(k) : 0u)
#define VALL(m) (m)
static inline VI v_as_i(V v) { VI i; memcpy(&i, &v, 4); return i; }
static inline V i_as_v(VI i) { V v; memcpy(&v, &i, 4); return v; }
static inline VI vi_sar1(VI i) { return (VI)((int32_t)i >> 1); }
typedef double VD;
#define V2D(v) ((double)(v))
#define D2V(d) ((float)(d))
/* Pairs: p[0..2W) as its even and odd elements (and back), for interleaved layouts. */
#define VLOAD2(p, ev, od) (*(ev) = (p)[0], *(od) = (p)[1])
#define VLOAD2_H(p, ev, od) (*(ev) = ma_h2f((p)[0]), *(od) = ma_h2f((p)[1]))
#define VSTORE2(p, ev, od) ((p)[0] = (ev), (p)[1] = (od))
#define VSTORE2_H(p, ev, od) ((p)[0] = ma_f2h(ev), (p)[1] = ma_f2h(od))
#define VLOAD2_B(p, ev, od) (*(ev) = ma_bf2f((p)[0]), *(od) = ma_bf2f((p)[1]))
#define VSTORE2_B(p, ev, od) ((p)[0] = ma_f2bf(ev), (p)[1] = ma_f2bf(od))

#elif defined(MA_ISA_AVX2)

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#define MA_ISA_NAME avx2
#define W 8
typedef float V __attribute__((vector_size(32)));
typedef uint32_t VI __attribute__((vector_size(32)));
typedef int32_t VM __attribute__((vector_size(32)));
#define VSPLAT(c) ((V)_mm256_set1_ps((float)(c)))
#define VLOAD(p) ((V)_mm256_loadu_ps(p))
#define VSTORE(p, v) _mm256_storeu_ps((p), (__m256)(v))
#define VLOAD_H(p) ((V)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
/* float32 tails: vmaskmovps reads and writes the first m lanes only (no fault past them, lanes past m
 * read as 0, the padded copy's bits) instead of a memcpy through a buffer and a stalled reload */
#define MA_TAILMASK32(m) _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(m)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define VLOAD_TAIL32(p, m) ((V)_mm256_maskload_ps((p), MA_TAILMASK32(m)))
#define VSTORE_TAIL32(p, m, v) _mm256_maskstore_ps((p), MA_TAILMASK32(m), (__m256)(v))
#define VSTORE_H(p, v) _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph((__m256)(v), _MM_FROUND_TO_NEAREST_INT))
/* bfloat16: 8 halves zero-extended and shifted up; stores keep the high halves of ma_bf_hi (vpshufb picks
 * bytes 2-3 of each lane, vpermq joins the two 128-bit lanes) */
#define VLOAD_B(p) ((V)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define MA_BF_NARROW(t)                                                                                  \
    _mm256_castsi256_si128(_mm256_permute4x64_epi64(                                                     \
        _mm256_shuffle_epi8((__m256i)(t), _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, \
                                                           -1, -1, 2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, \
                                                           -1, -1, -1, -1)), 0x08))
#define VSTORE_B(p, v) _mm_storeu_si128((__m128i *)(p), MA_BF_NARROW(ma_bf_hi(v)))
#define VFMA(a, b, c) ((V)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define VSEL(m, a, b) ((V)_mm256_blendv_ps((__m256)(b), (__m256)(a), (__m256)(m)))
/* maxps / minps are exactly a > b ? a : b and a < b ? a : b (NaN and -0 included): one op, not two */
#define VGT_SEL(a, b) ((V)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define VLT_SEL(a, b) ((V)_mm256_min_ps((__m256)(a), (__m256)(b)))
/* non-temporal stores: f32 needs 32-byte, f16 16-byte aligned addresses */
#define MA_HAVE_STREAM 1
#define VSTREAM(p, v) _mm256_stream_ps((p), (__m256)(v))
#define VSTREAM_H(p, v) _mm_stream_si128((__m128i *)(p), _mm256_cvtps_ph((__m256)(v), _MM_FROUND_TO_NEAREST_INT))
#define VSTREAM_B(p, v) _mm_stream_si128((__m128i *)(p), MA_BF_NARROW(ma_bf_hi(v)))
#define MA_STREAM_FENCE() _mm_sfence()
#define VALL(m) (_mm256_movemask_ps((__m256)(m)) == 0xff)
typedef double VD __attribute__((vector_size(64)));
#define V2D(v) __builtin_convertvector((v), VD)
#define D2V(d) __builtin_convertvector((d), V)
/* Pairs: 16 consecutive elements as their 8 even and 8 odd ones (and back), in registers:
 * shufps picks evens/odds per 128-bit lane, vpermpd puts the 64-bit pieces in order. */
static inline __attribute__((always_inline)) void ma_deint(__m256 a, __m256 b, V *ev, V *od) {
    __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    *ev = (V)_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    *od = (V)_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}
static inline __attribute__((always_inline)) void ma_inter(V ev, V od, __m256 *a, __m256 *b) {
    __m256 lo = _mm256_unpacklo_ps((__m256)ev, (__m256)od), hi = _mm256_unpackhi_ps((__m256)ev, (__m256)od);
    *a = _mm256_permute2f128_ps(lo, hi, 0x20);
    *b = _mm256_permute2f128_ps(lo, hi, 0x31);
}
#define VLOAD2(p, ev, od) ma_deint(_mm256_loadu_ps(p), _mm256_loadu_ps((p) + 8), (ev), (od))
#define VLOAD2_H(p, ev, od)                                                   \
    ma_deint(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))),          \
             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + 8))), (ev), (od))
#define VSTORE2(p, ev, od)                                                    \
    do {                                                                      \
        __m256 a2_, b2_;                                                      \
        ma_inter((ev), (od), &a2_, &b2_);                                     \
        _mm256_storeu_ps((p), a2_);                                           \
        _mm256_storeu_ps((p) + 8, b2_);                                       \
    } while (0)
#define VSTORE2_H(p, ev, od)                                                                          \
    do {                                                                                              \
        __m256 a2_, b2_;                                                                              \
        ma_inter((ev), (od), &a2_, &b2_);                                                             \
        _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph(a2_, _MM_FROUND_TO_NEAREST_INT));            \
        _mm_storeu_si128((__m128i *)((p) + 8), _mm256_cvtps_ph(b2_, _MM_FROUND_TO_NEAREST_INT));      \
    } while (0)
#define VLOAD2_B(p, ev, od) ma_deint((__m256)VLOAD_B(p), (__m256)VLOAD_B((p) + 8), (ev), (od))
#define VSTORE2_B(p, ev, od)                                                  \
    do {                                                                      \
        __m256 a2_, b2_;                                                      \
        ma_inter((ev), (od), &a2_, &b2_);                                     \
        VSTORE_B((p), (V)a2_);                                                \
        VSTORE_B((p) + 8, (V)b2_);                                            \
    } while (0)

#elif defined(MA_ISA_AVX512)

/* AVX-512 F + BW + DQ + VL: 16 lanes, the same GCC vector types twice as wide, and masked loads and
 * stores for tails (VLOAD_TAIL: lanes past m read as 0, never touched in memory).  Built with the real
 * intrinsics, or, with MA_SIMDE (the C harness only), against SIMDe's portable AVX-512 on an AVX2 CPU
 * (ma_simde512.h): the same code, a logic check without the hardware, not a timing. */
#if defined(MA_SIMDE)
#pragma GCC target("avx2,fma,f16c")
#include "ma_simde512.h"
#elif defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
/* AVX512_BF16 too, for vcvtneps2bf16 in the bfloat16 stores: run only where the CPU has it (ma_bf_pack) */
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")
#define MA_HAVE_BF16_CVT 1
#else
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
#endif
#if !defined(MA_SIMDE)
#include <immintrin.h>
#define MM512(f) _mm512_##f
#define MM256(f) _mm256_##f
#define MM(f) _mm_##f
typedef __m512 M512;
typedef __m512i M512I;
typedef __m256i M256I;
typedef __mmask16 MMASK16;
#define MA_CVTPS_PH(v) _mm512_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT)
#define MA_MASKZ_LOADU_PS(k, p) _mm512_maskz_loadu_ps((k), (p))
#define MA_MASK_STOREU_PS(p, k, v) _mm512_mask_storeu_ps((p), (k), (v))
#define MA_MASKZ_LOADU_EPI16(k, p) _mm256_maskz_loadu_epi16((k), (p))
#define MA_MASK_STOREU_EPI16(p, k, v) _mm256_mask_storeu_epi16((p), (k), (v))
#define MA_STREAM_PS(p, v) _mm512_stream_ps((p), (v))
#define MA_CVTEPI32_EPI16(t) _mm512_cvtepi32_epi16(t)
#define MA_STREAM_SI512(p, v) _mm512_stream_si512((void *)(p), (v))
#define MA_UNORD_MASK(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_UNORD_Q)
typedef __mmask32 MMASK32;
#endif
#define MA_ISA_NAME avx512
#define W 16
typedef float V __attribute__((vector_size(64)));
typedef uint32_t VI __attribute__((vector_size(64)));
typedef int32_t VM __attribute__((vector_size(64)));
#define VSPLAT(c) ((V)MM512(set1_ps)((float)(c)))
/* Whole-vector loads are opaque to the optimiser: otherwise GCC folds a load whose value is only used
 * under a select (relu's grad: x > 0 ? dy : 0) into a masked load, which on Zen 5 ran relu backward at
 * 0.43x avx2 at 16M (streaming) and 0.78x in cache; loaded and then selected it is at avx2's speed.
 * SIMDe's build (16-lane vectors in AVX2 registers) has no such fold and no 64-byte register to pin. */
#if defined(MA_SIMDE)
#define MA_OPAQUE(v) (v)
#else
#define MA_OPAQUE(v)                  \
    ({                                \
        V o_ = (v);                   \
        __asm__("" : "+v"(o_));       \
        o_;                           \
    })
#endif
#define VLOAD(p) MA_OPAQUE((V)MM512(loadu_ps)(p))
#define VSTORE(p, v) MM512(storeu_ps)((p), (M512)(v))
#define VLOAD_H(p) MA_OPAQUE((V)MM512(cvtph_ps)(MM256(loadu_si256)((const M256I *)(p))))
#define VSTORE_H(p, v) MM256(storeu_si256)((M256I *)(p), MA_CVTPS_PH((M512)(v)))
/* the first m lanes (0 < m <= W) */
#define MA_TAILMASK(m) ((MMASK16)((1u << (m)) - 1u))
#define VLOAD_TAIL(p, m) ((V)MA_MASKZ_LOADU_PS(MA_TAILMASK(m), (p)))
#define VSTORE_TAIL(p, m, v) MA_MASK_STOREU_PS((p), MA_TAILMASK(m), (M512)(v))
#define VLOAD_TAIL_H(p, m) ((V)MM512(cvtph_ps)(MA_MASKZ_LOADU_EPI16(MA_TAILMASK(m), (p))))
#define VSTORE_TAIL_H(p, m, v) MA_MASK_STOREU_EPI16((p), MA_TAILMASK(m), MA_CVTPS_PH((M512)(v)))
/* bfloat16: 16 halves zero-extended and shifted up; stores narrow with ma_bf_pack (below): vcvtneps2bf16
 * where the CPU has AVX512_BF16, else the high halves of ma_bf_hi (vpsrld, vpmovdw), the same bits. */
#define MA_WIDEN_B(h) ((V)MM512(slli_epi32)(MM512(cvtepu16_epi32)(h), 16))
#define MA_BF_NARROW(t) MA_CVTEPI32_EPI16(MM512(srli_epi32)((M512I)(t), 16))
#define VLOAD_B(p) MA_OPAQUE(MA_WIDEN_B(MM256(loadu_si256)((const M256I *)(p))))
#define VSTORE_B(p, v) MM256(storeu_si256)((M256I *)(p), ma_bf_pack(v))
#define VLOAD_TAIL_B(p, m) MA_WIDEN_B(MA_MASKZ_LOADU_EPI16(MA_TAILMASK(m), (p)))
#define VSTORE_TAIL_B(p, m, v) MA_MASK_STOREU_EPI16((p), MA_TAILMASK(m), ma_bf_pack(v))
#define VFMA(a, b, c) ((V)MM512(fmadd_ps)((M512)(a), (M512)(b), (M512)(c)))
/* a mask lane's sign bit picks, as blendv does for avx2.  Written with vector operators, not as
 * mask_blend(movepi32_mask(m)): GCC then keeps a compare's result in a k register and blends (or masks
 * the operation) with it, where the intrinsic form made it widen every compare to a vector and narrow it
 * back (vmovdqa32{z} + vpmovd2m per select, 74 in gelu's loop). */
#define MA_KMASK(m) MM512(movepi32_mask)((M512I)(m))
static inline __attribute__((always_inline)) V ma_vsel(VM m, V a, V b) {
    VM k = m < 0;
    return (V)((k & (VM)a) | (~k & (VM)b));
}
#define VSEL(m, a, b) ma_vsel((VM)(m), (V)(a), (V)(b))
#define VGT_SEL(a, b) ((V)MM512(max_ps)((M512)(a), (M512)(b)))
#define VLT_SEL(a, b) ((V)MM512(min_ps)((M512)(a), (M512)(b)))
/* non-temporal stores: f32 needs 64-byte, f16 32-byte aligned addresses */
#define MA_HAVE_STREAM 1
#define VSTREAM(p, v) MA_STREAM_PS((p), (M512)(v))
#define VSTREAM_H(p, v) MM256(stream_si256)((M256I *)(p), MA_CVTPS_PH((M512)(v)))
#define VSTREAM_B(p, v) MM256(stream_si256)((M256I *)(p), ma_bf_pack(v))
#define MA_STREAM_FENCE() MM(sfence)()
#define VALL(m) (MA_KMASK(m) == 0xffff)
typedef double VD __attribute__((vector_size(128)));
#define V2D(v) __builtin_convertvector((v), VD)
#define D2V(d) __builtin_convertvector((d), V)
/* Pairs: 32 consecutive elements as their 16 even and 16 odd ones (and back): one two-source
 * permute (vpermt2ps) per result. */
static inline __attribute__((always_inline)) void ma_deint(M512 a, M512 b, V *ev, V *od) {
    const VI ie = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    *ev = (V)MM512(permutex2var_ps)(a, (M512I)ie, b);
    *od = (V)MM512(permutex2var_ps)(a, (M512I)(ie + 1u), b);
}
static inline __attribute__((always_inline)) void ma_inter(V ev, V od, M512 *a, M512 *b) {
    const VI il = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
    *a = MM512(permutex2var_ps)((M512)ev, (M512I)il, (M512)od);
    *b = MM512(permutex2var_ps)((M512)ev, (M512I)(il + 8u), (M512)od);
}
#define VLOAD2(p, ev, od) ma_deint(MM512(loadu_ps)(p), MM512(loadu_ps)((p) + 16), (ev), (od))
#define VLOAD2_H(p, ev, od)                                                   \
    ma_deint(MM512(cvtph_ps)(MM256(loadu_si256)((const M256I *)(p))),        \
             MM512(cvtph_ps)(MM256(loadu_si256)((const M256I *)((p) + 16))), (ev), (od))
#define VSTORE2(p, ev, od)                                                    \
    do {                                                                      \
        M512 a2_, b2_;                                                        \
        ma_inter((ev), (od), &a2_, &b2_);                                     \
        MM512(storeu_ps)((p), a2_);                                           \
        MM512(storeu_ps)((p) + 16, b2_);                                      \
    } while (0)
#define VSTORE2_H(p, ev, od)                                                  \
    do {                                                                      \
        M512 a2_, b2_;                                                        \
        ma_inter((ev), (od), &a2_, &b2_);                                     \
        MM256(storeu_si256)((M256I *)(p), MA_CVTPS_PH(a2_));                  \
        MM256(storeu_si256)((M256I *)((p) + 16), MA_CVTPS_PH(b2_));           \
    } while (0)
#define VLOAD2_B(p, ev, od) ma_deint((M512)VLOAD_B(p), (M512)VLOAD_B((p) + 16), (ev), (od))
#define VSTORE2_B(p, ev, od)                                                  \
    do {                                                                      \
        M512 a2_, b2_;                                                        \
        ma_inter((ev), (od), &a2_, &b2_);                                     \
        VSTORE_B((p), (V)a2_);                                                \
        VSTORE_B((p) + 16, (V)b2_);                                           \
    } while (0)

#elif defined(MA_ISA_NEON)

#include <arm_neon.h>
#define MA_ISA_NAME neon
#define W 4
typedef float V __attribute__((vector_size(16)));
typedef uint32_t VI __attribute__((vector_size(16)));
typedef int32_t VM __attribute__((vector_size(16)));
#define VSPLAT(c) ((V)vdupq_n_f32((float)(c)))
#define VLOAD(p) ((V)vld1q_f32(p))
#define VSTORE(p, v) vst1q_f32((p), (float32x4_t)(v))
#define VLOAD_H(p) ((V)vcvt_f32_f16(vld1_f16((const __fp16 *)(p))))
#define VSTORE_H(p, v) vst1_f16((__fp16 *)(p), vcvt_f16_f32((float32x4_t)(v)))
/* bfloat16: widen by a long shift; store the high halves of ma_bf_hi (a narrowing shift) */
#define VLOAD_B(p) ((V)vshll_n_u16(vld1_u16(p), 16))
#define MA_BF_NARROW(t) vshrn_n_u32((uint32x4_t)(t), 16)
#define VSTORE_B(p, v) vst1_u16((p), MA_BF_NARROW(ma_bf_hi(v)))
#define VFMA(a, b, c) ((V)vfmaq_f32((float32x4_t)(c), (float32x4_t)(a), (float32x4_t)(b)))
#define VSEL(m, a, b) ((V)vbslq_f32((uint32x4_t)(m), (float32x4_t)(a), (float32x4_t)(b)))
#define VALL(m) (vminvq_u32((uint32x4_t)(m)) != 0)
typedef double VD __attribute__((vector_size(32)));
#define V2D(v) __builtin_convertvector((v), VD)
#define D2V(d) __builtin_convertvector((d), V)
/* Pairs: vld2 / vst2 de-interleave and interleave on the way. */
#define VLOAD2(p, ev, od)                                                             \
    do {                                                                              \
        float32x4x2_t t2_ = vld2q_f32(p);                                             \
        *(ev) = (V)t2_.val[0], *(od) = (V)t2_.val[1];                                 \
    } while (0)
#define VLOAD2_H(p, ev, od)                                                           \
    do {                                                                              \
        float16x4x2_t t2_ = vld2_f16((const __fp16 *)(p));                            \
        *(ev) = (V)vcvt_f32_f16(t2_.val[0]), *(od) = (V)vcvt_f32_f16(t2_.val[1]);     \
    } while (0)
#define VSTORE2(p, ev, od)                                                            \
    do {                                                                              \
        float32x4x2_t t2_ = {{(float32x4_t)(ev), (float32x4_t)(od)}};                 \
        vst2q_f32((p), t2_);                                                          \
    } while (0)
#define VSTORE2_H(p, ev, od)                                                                      \
    do {                                                                                          \
        float16x4x2_t t2_ = {{vcvt_f16_f32((float32x4_t)(ev)), vcvt_f16_f32((float32x4_t)(od))}}; \
        vst2_f16((__fp16 *)(p), t2_);                                                             \
    } while (0)
#define VLOAD2_B(p, ev, od)                                                           \
    do {                                                                              \
        uint16x4x2_t t2_ = vld2_u16(p);                                               \
        *(ev) = (V)vshll_n_u16(t2_.val[0], 16), *(od) = (V)vshll_n_u16(t2_.val[1], 16); \
    } while (0)
#define VSTORE2_B(p, ev, od)                                                                      \
    do {                                                                                          \
        uint16x4x2_t t2_ = {{MA_BF_NARROW(ma_bf_hi(ev)), MA_BF_NARROW(ma_bf_hi(od))}};           \
        vst2_u16((p), t2_);                                                                       \
    } while (0)

#else
#error "define one of MA_ISA_SCALAR, MA_ISA_AVX2, MA_ISA_AVX512, MA_ISA_NEON"
#endif

#if !defined(VGT_SEL)
/* a > b ? a : b and a < b ? a : b (not fmax/fmin: those differ on NaN and signed zeros) */
#define VGT_SEL(a, b) VSEL((a) > (b), (a), (b))
#define VLT_SEL(a, b) VSEL((a) < (b), (a), (b))
#endif

#if !defined(MA_ISA_SCALAR)
/* Masks and bit views on GCC vector types: the same for every SIMD ISA. */
#define MAND(a, b) ((a) & (b))
#define MOR(a, b) ((a) | (b))
#define MNOT(a) (~(a))
#define MASK_I(m, k) ((VI)(m) & (uint32_t)(k))
#define v_as_i(v) ((VI)(v))
#define i_as_v(i) ((V)(i))
#define vi_sar1(i) ((VI)(((VM)(i)) >> 1))

/* float32 -> bfloat16 rounded to nearest even, in the high half of each lane (the ISA's MA_BF_NARROW
 * keeps those): ma_f2bf's sequence on vectors, integer operations only, so that no FPU mode applies and
 * every ISA gives its bits.  A NaN lane is the NaN with its quiet bit set (sign and payload kept).
 * avx512's vcvtneps2bf16 (ma_bf_pack) gives these bits too, its subnormal lanes patched with this sequence
 * (tests: the C harness compares every bfloat16 kernel with its float32 kernel rounded by ma_f2bf, bit for
 * bit). */
static inline __attribute__((always_inline)) VI ma_bf_round(V v) { /* a lane that is not NaN */
    VI x = v_as_i(v);
    return x + 0x7fffu + ((x >> 16) & 1u);
}
static inline __attribute__((always_inline)) VI ma_bf_hi(V v) {
    return v_as_i(VSEL(v != v, i_as_v(v_as_i(v) | 0x00400000u), i_as_v(ma_bf_round(v))));
}

#if defined(MA_ISA_AVX512)
#if defined(MA_HAVE_BF16_CVT)
/* 16 float32 lanes as bfloat16, ma_f2bf's bits.  With AVX512_BF16 (ma_bf16_cvt_on, set once at load from
 * CPUID, MULTIACT_NATIVE_BF16_CVT=0 to refuse it): vcvtneps2bf16, whose rounding of normal numbers, infinities
 * and NaNs (quiet bit set, sign and payload kept) is this sequence's, but which reads subnormal inputs as
 * zero whatever MXCSR says; a vector with a nonzero subnormal lane (rare: a test and a branch) takes the
 * integer sequence for those lanes.  Checked against ma_bf_hi on all 2^32 float32 patterns
 * (ma_bf16_cvt_check). */
extern int ma_bf16_cvt_on;
/* The two instructions as volatile asm, not intrinsics: GCC treats an intrinsic as plain arithmetic and may
 * compute it ahead of the ma_bf16_cvt_on test (it did so with the integer sequence's operations in relu's
 * loop), which on an AVX-512 CPU without AVX512_BF16 (Skylake-SP to Ice Lake) would be an illegal
 * instruction; a volatile asm runs only where the code says.  vcvtne2ps2bf16 hi, lo: lo's 16 in the low
 * half, hi's in the high half. */
static inline __attribute__((always_inline)) M256I ma_vcvtneps2bf16(V v) {
    M256I r;
    __asm__ volatile("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
    return r;
}
static inline __attribute__((always_inline)) M512I ma_vcvtne2ps2bf16(V hi, V lo) {
    M512I r;
    __asm__ volatile("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi), "v"(lo));
    return r;
}
/* lanes holding a subnormal (vfpclassps class 0x20, which MXCSR.DAZ does not change: checked on Zen 5) */
#define MA_SUBNORMAL(v) _mm512_fpclass_ps_mask((M512)(v), 0x20)
static inline __attribute__((always_inline)) M256I ma_bf_pack_cvt(V v) {
    M256I r = ma_vcvtneps2bf16(v);
    MMASK16 sub = MA_SUBNORMAL(v);
    if (__builtin_expect(sub != 0, 0)) r = _mm256_mask_blend_epi16(sub, r, MA_BF_NARROW(ma_bf_round(v)));
    return r;
}
static inline __attribute__((always_inline)) M256I ma_bf_pack(V v) {
    if (ma_bf16_cvt_on) return ma_bf_pack_cvt(v);
    return MA_BF_NARROW(ma_bf_hi(v));
}
#else
#define ma_bf_pack(v) MA_BF_NARROW(ma_bf_hi(v))
#endif
#endif
#endif

#if defined(MA_ISA_AVX512)
/* bfloat16, four vectors (64 elements) at once, for the elementwise main loops: AVX2's scheme below on 512-bit
 * registers (even elements shifted up, odd ones masked in place; a pair stored by 16-bit lane rounding, 8
 * vector ops per 32 elements, NaN tested once per step), which measured faster than vcvtneps2bf16 with its
 * subnormal test per vector; where the CPU has AVX512_BF16 the step's pairs go through vcvtne2ps2bf16 and one
 * vpermw each instead, when no lane is subnormal (one vfpclassps per vector; NaN needs no test there), 2-11%
 * faster again (Zen 5: results/isa-avx512-bf16-x86-2core.txt).  Single vectors (the families,
 * tails) store through ma_bf_pack.  Streaming: 64-byte aligned (ALIGN_bf16), as MA_STREAM_SI512 writes. */
#define MA_HAVE_BF4 1
/* The loads are 32-byte halves joined (vinserti64x4): with 64-byte loads a bfloat16 relu forward at 16M (streaming)
 * ran at 0.097 ns per element from a 64-byte aligned x and 0.147 from one 16 bytes off (Zen 5), with halves at
 * 0.058-0.061 either way (avx2 0.065-0.076, float16 0.059).  float32's 64-byte loads measured the same as halves. */
static inline __attribute__((always_inline)) void ma_bf_load4(const uint16_t *p, V *a) {
    M512I v0 = MM512(inserti64x4)(MM512(castsi256_si512)(MM256(loadu_si256)((const M256I *)p)),
                                  MM256(loadu_si256)((const M256I *)(p + 16)), 1),
          v1 = MM512(inserti64x4)(MM512(castsi256_si512)(MM256(loadu_si256)((const M256I *)(p + 32))),
                                  MM256(loadu_si256)((const M256I *)(p + 48)), 1),
          hi = MM512(set1_epi32)((int)0xffff0000u);
    a[0] = MA_OPAQUE((V)MM512(slli_epi32)(v0, 16)), a[1] = MA_OPAQUE((V)MM512(and_si512)(v0, hi));
    a[2] = MA_OPAQUE((V)MM512(slli_epi32)(v1, 16)), a[3] = MA_OPAQUE((V)MM512(and_si512)(v1, hi));
}
static inline __attribute__((always_inline)) M512I ma_bf_join(M512I e, M512I o) {
    return MM512(mask_blend_epi16)((MMASK32)0xaaaaaaaau, MM512(srli_epi32)(e, 16), o);
}
static inline __attribute__((always_inline)) M512I ma_bf_rne2(V e, V o) {
    M512I ei = (M512I)e, oi = (M512I)o;
    M512I h = ma_bf_join(ei, oi), l = MM512(mask_blend_epi16)((MMASK32)0xaaaaaaaau, ei, MM512(slli_epi32)(oi, 16));
    M512I u = MM512(subs_epu16)(l, MM512(andnot_si512)(h, MM512(set1_epi16)(1)));
    return MM512(add_epi16)(h, MM512(srli_epi16)(u, 15));
}
#if defined(MA_HAVE_BF16_CVT)
/* a pair (even e, odd o) by vcvtne2ps2bf16 ([e | o] as bfloat16) and vpermw back to memory order */
static inline __attribute__((always_inline)) M512I ma_bf_cvt2(V e, V o) {
    const M512I order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, ma_vcvtne2ps2bf16(o, e));
}
/* a step's two pairs by ma_bf_cvt2 when none of its lanes is subnormal (else 0: nothing written) */
static inline __attribute__((always_inline)) int ma_bf_cvt4(const V *r, M512I *lo, M512I *hi) {
    if ((MA_SUBNORMAL(r[0]) | MA_SUBNORMAL(r[1]) | MA_SUBNORMAL(r[2]) | MA_SUBNORMAL(r[3])) != 0) return 0;
    *lo = ma_bf_cvt2(r[0], r[1]), *hi = ma_bf_cvt2(r[2], r[3]);
    return 1;
}
#endif
/* a step's two pairs by the integer sequence (a NaN lane: the whole step through ma_bf_hi) */
static inline __attribute__((always_inline)) void ma_bf_int4(const V *r, M512I *lo, M512I *hi) {
    if (__builtin_expect((MA_UNORD_MASK((M512)r[0], (M512)r[1]) | MA_UNORD_MASK((M512)r[2], (M512)r[3])) == 0, 1)) {
        *lo = ma_bf_rne2(r[0], r[1]), *hi = ma_bf_rne2(r[2], r[3]);
    } else {
        *lo = ma_bf_join((M512I)ma_bf_hi(r[0]), (M512I)ma_bf_hi(r[1]));
        *hi = ma_bf_join((M512I)ma_bf_hi(r[2]), (M512I)ma_bf_hi(r[3]));
    }
}
static inline __attribute__((always_inline)) void ma_bf_store4(uint16_t *p, const V *r, int stream) {
    M512I lo, hi;
#if defined(MA_HAVE_BF16_CVT)
    if (!ma_bf16_cvt_on || __builtin_expect(!ma_bf_cvt4(r, &lo, &hi), 0))
#endif
        ma_bf_int4(r, &lo, &hi);
    if (stream) { /* 64-byte aligned (ALIGN_bf16) */
        MA_STREAM_SI512(p, lo);
        MA_STREAM_SI512(p + 32, hi);
    } else {
        MM512(storeu_si512)((void *)p, lo);
        MM512(storeu_si512)((void *)(p + 32), hi);
    }
}
#endif

#if defined(MA_ISA_NEON)
/* bfloat16, four vectors (16 elements) at once: AVX2's scheme below with NEON's lane operations.  Loads: of
 * each 8 elements the even ones shifted into the high halves (shl) and the odd ones masked in place (and).
 * Stores, a pair (even e, odd o) at a time in 16-bit lanes: the high halves h and low halves l in memory
 * order by one transpose each (trn2, trn1), then h + the top bit of l - (1 - lsb(h)), saturating (bic,
 * uqsub, usra): 5 instructions per 8 elements where ma_bf_hi and a narrowing shift took about 16; a step
 * with a NaN lane goes through ma_bf_hi.  Verified under qemu (scripts/test_neon_qemu.sh), not timed: no ARM
 * hardware here. */
#define MA_HAVE_BF4 1
static inline __attribute__((always_inline)) void ma_bf_load4(const uint16_t *p, V *a) {
    uint32x4_t v0 = vreinterpretq_u32_u16(vld1q_u16(p)), v1 = vreinterpretq_u32_u16(vld1q_u16(p + 8)),
               hi = vdupq_n_u32(0xffff0000u);
    a[0] = (V)vshlq_n_u32(v0, 16), a[1] = (V)vandq_u32(v0, hi);
    a[2] = (V)vshlq_n_u32(v1, 16), a[3] = (V)vandq_u32(v1, hi);
}
static inline __attribute__((always_inline)) uint16x8_t ma_bf_join(V e, V o) {
    return vtrn2q_u16(vreinterpretq_u16_f32((float32x4_t)e), vreinterpretq_u16_f32((float32x4_t)o));
}
static inline __attribute__((always_inline)) uint16x8_t ma_bf_rne2(V e, V o) {
    uint16x8_t h = ma_bf_join(e, o),
               l = vtrn1q_u16(vreinterpretq_u16_f32((float32x4_t)e), vreinterpretq_u16_f32((float32x4_t)o));
    uint16x8_t u = vqsubq_u16(l, vbicq_u16(vdupq_n_u16(1), h));
    return vsraq_n_u16(h, u, 15);
}
static inline __attribute__((always_inline)) void ma_bf_store4(uint16_t *p, const V *r, int stream) {
    (void)stream; /* no streaming stores on NEON (MA_HAVE_STREAM 0) */
    uint32x4_t ok = vandq_u32(vandq_u32(vceqq_f32((float32x4_t)r[0], (float32x4_t)r[0]),
                                        vceqq_f32((float32x4_t)r[1], (float32x4_t)r[1])),
                              vandq_u32(vceqq_f32((float32x4_t)r[2], (float32x4_t)r[2]),
                                        vceqq_f32((float32x4_t)r[3], (float32x4_t)r[3])));
    if (__builtin_expect(vminvq_u32(ok) != 0, 1)) {
        vst1q_u16(p, ma_bf_rne2(r[0], r[1]));
        vst1q_u16(p + 8, ma_bf_rne2(r[2], r[3]));
    } else {
        vst1q_u16(p, ma_bf_join((V)ma_bf_hi(r[0]), (V)ma_bf_hi(r[1])));
        vst1q_u16(p + 8, ma_bf_join((V)ma_bf_hi(r[2]), (V)ma_bf_hi(r[3])));
    }
}
#endif

#if defined(MA_ISA_AVX2)
/* bfloat16, four vectors (32 elements) at once, for the elementwise main loops (ma_kernels.inc's LD4 / *_STEP).
 * Loads: of each 16 elements, the even ones shifted into the high halves (vpslld) and the odd ones masked in
 * place (vpand): vectors 0, 2 hold elements 0, 2, .., 14 of their 16, vectors 1, 3 elements 1, 3, .., 15 (an
 * elementwise body does not care).  Stores, a pair of vectors (even e, odd o) at a time, in 16-bit lanes, 16
 * elements an instruction: the high halves h (e's shifted down, o's in place: vpblendw puts them back in
 * memory order, no pack or permute) and the low halves l the same way; then ma_f2bf's rounding, h + 1 where
 * the dropped bits l exceed half an ulp or are half of one with h odd, is h + the top bit of l - (1 - lsb(h))
 * (vpsubusw saturates at 0 where l = 0): vpandn, vpsubusw, vpsrlw, vpaddw, the same bits as x + 0x7fff +
 * lsb for every x that is not NaN (h is never 0xffff then, so no wrap).  The step is tested for NaN once;
 * one NaN lane sends the step through ma_bf_hi.  8 vector ops per 16 elements where the 32-bit rounding and
 * vpackusdw took 11 (Zen 3, in cache: results/bf16-native-x86-2core.txt).  Streaming: two
 * 32-byte stores (the stream head aligns y to 32 bytes: ALIGN_bf16). */
#define MA_HAVE_BF4 1
static inline __attribute__((always_inline)) void ma_bf_load4(const uint16_t *p, V *a) {
    __m256i v0 = _mm256_loadu_si256((const __m256i *)p), v1 = _mm256_loadu_si256((const __m256i *)(p + 16)),
            hi = _mm256_set1_epi32((int)0xffff0000u);
    a[0] = (V)_mm256_slli_epi32(v0, 16), a[1] = (V)_mm256_and_si256(v0, hi);
    a[2] = (V)_mm256_slli_epi32(v1, 16), a[3] = (V)_mm256_and_si256(v1, hi);
}
/* the high halves of e (even elements) and o (odd ones), in memory order */
static inline __attribute__((always_inline)) __m256i ma_bf_join(__m256i e, __m256i o) {
    return _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xaa);
}
/* e and o (not NaN) rounded to nearest even, in memory order */
static inline __attribute__((always_inline)) __m256i ma_bf_rne2(V e, V o) {
    __m256i ei = (__m256i)e, oi = (__m256i)o;
    __m256i h = ma_bf_join(ei, oi), l = _mm256_blend_epi16(ei, _mm256_slli_epi32(oi, 16), 0xaa);
    __m256i u = _mm256_subs_epu16(l, _mm256_andnot_si256(h, _mm256_set1_epi16(1)));
    return _mm256_add_epi16(h, _mm256_srli_epi16(u, 15));
}
static inline __attribute__((always_inline)) void ma_bf_store4(uint16_t *p, const V *r, int stream) {
    __m256i lo, hi;
    __m256 nan = _mm256_or_ps(_mm256_cmp_ps((__m256)r[0], (__m256)r[1], _CMP_UNORD_Q),
                              _mm256_cmp_ps((__m256)r[2], (__m256)r[3], _CMP_UNORD_Q));
    if (__builtin_expect(_mm256_movemask_ps(nan) == 0, 1)) {
        lo = ma_bf_rne2(r[0], r[1]), hi = ma_bf_rne2(r[2], r[3]);
    } else {
        lo = ma_bf_join((__m256i)ma_bf_hi(r[0]), (__m256i)ma_bf_hi(r[1]));
        hi = ma_bf_join((__m256i)ma_bf_hi(r[2]), (__m256i)ma_bf_hi(r[3]));
    }
    if (stream) { /* 32-byte aligned (ALIGN_bf16) */
        _mm256_stream_si256((__m256i *)p, lo);
        _mm256_stream_si256((__m256i *)(p + 16), hi);
    } else {
        _mm256_storeu_si256((__m256i *)p, lo);
        _mm256_storeu_si256((__m256i *)(p + 16), hi);
    }
}
#endif

#endif /* MA_F64 */

#define MA_CAT_(a, b) a##b
#define MA_CAT(a, b) MA_CAT_(a, b)
#define MA_CAT3(a, b, c) MA_CAT(MA_CAT(a, b), c)

#endif
