/* The avx512 vector layer's names on SIMDe (MA_SIMDE): the C harness builds the avx512 kernels with
 * this on a CPU without AVX-512 and runs them against the scalar path (scripts/test_native_harness.sh
 * avx512-simde).  Only ma_simd.h includes it, inside #pragma GCC target("avx2,fma,f16c"), so SIMDe
 * computes each 512-bit operation as two native 256-bit ones (FMA fused, as the hardware's).
 *
 * SIMDe 0.8.2 (PyPI cmeel-simde; Debian's 0.7.4 lacks the masked stores) has no _mm512_cvtps_ph and
 * no _mm512_stream_ps: both are made of two 256-bit halves here; nor _mm512_cvtepi32_epi16 (vpmovdw,
 * the bfloat16 store's narrowing): lane by lane.  Its masked loads and stores are
 * full-width accesses (the store writes zeros over the lanes outside the mask, the load reads past the
 * end), not the hardware's: they are done lane by lane here, as the hardware does them (unmasked lanes
 * never touched), so that the harness can check that a tail leaves the memory after it alone. */
#ifndef MA_SIMDE512_H
#define MA_SIMDE512_H

#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#define MM512(f) simde_mm512_##f
#define MM256(f) simde_mm256_##f
#define MM(f) simde_mm_##f
typedef simde__m512 M512;
typedef simde__m512i M512I;
typedef simde__m256i M256I;
typedef simde__mmask16 MMASK16;

static inline simde__m256i ma_simde_cvtps_ph(simde__m512 v) {
    simde__m128i lo = simde_mm256_cvtps_ph(simde_mm512_extractf32x8_ps(v, 0), SIMDE_MM_FROUND_TO_NEAREST_INT);
    simde__m128i hi = simde_mm256_cvtps_ph(simde_mm512_extractf32x8_ps(v, 1), SIMDE_MM_FROUND_TO_NEAREST_INT);
    return simde_mm256_set_m128i(hi, lo);
}
static inline void ma_simde_stream_ps(float *p, simde__m512 v) {
    simde_mm256_stream_ps(p, simde_mm512_extractf32x8_ps(v, 0));
    simde_mm256_stream_ps(p + 8, simde_mm512_extractf32x8_ps(v, 1));
}
/* The hardware's masked load and store, lane by lane (see above), for one element type: maskz_loadu_SFX
 * reads only the lanes in k (zeros elsewhere), mask_storeu_SFX writes only those lanes. */
#define MA_SIMDE_MASKED(sfx, T, VT, loadu, storeu)                                 \
    static inline VT ma_simde_maskz_loadu_##sfx(simde__mmask16 k, const T *p) {     \
        T b[16] = {0};                                                             \
        for (int l = 0; l < 16; l++)                                               \
            if (k >> l & 1) b[l] = p[l];                                           \
        return loadu(b);                                                           \
    }                                                                              \
    static inline void ma_simde_mask_storeu_##sfx(T *p, simde__mmask16 k, VT v) {  \
        T b[16];                                                                   \
        storeu(b, v);                                                              \
        for (int l = 0; l < 16; l++)                                               \
            if (k >> l & 1) p[l] = b[l];                                           \
    }
MA_SIMDE_MASKED(ps, float, simde__m512, simde_mm512_loadu_ps, simde_mm512_storeu_ps)
MA_SIMDE_MASKED(epi16, uint16_t, simde__m256i, simde_mm256_loadu_si256, simde_mm256_storeu_si256)
#define MA_CVTPS_PH(v) ma_simde_cvtps_ph(v)
#define MA_MASKZ_LOADU_PS(k, p) ma_simde_maskz_loadu_ps((k), (p))
#define MA_MASK_STOREU_PS(p, k, v) ma_simde_mask_storeu_ps((p), (k), (v))
#define MA_MASKZ_LOADU_EPI16(k, p) ma_simde_maskz_loadu_epi16((k), (p))
#define MA_MASK_STOREU_EPI16(p, k, v) ma_simde_mask_storeu_epi16((p), (k), (v))
#define MA_STREAM_PS(p, v) ma_simde_stream_ps((p), (v))
static inline void ma_simde_stream_si512(void *p, simde__m512i v) {
    simde_mm256_stream_si256((simde__m256i *)p, simde_mm512_extracti64x4_epi64(v, 0));
    simde_mm256_stream_si256((simde__m256i *)p + 1, simde_mm512_extracti64x4_epi64(v, 1));
}
#define MA_STREAM_SI512(p, v) ma_simde_stream_si512((p), (v))
#define MA_UNORD_MASK(a, b) simde_mm512_cmp_ps_mask((a), (b), SIMDE_CMP_UNORD_Q)
typedef simde__mmask32 MMASK32;
static inline simde__m256i ma_simde_cvtepi32_epi16(simde__m512i t) {
    uint32_t a[16];
    uint16_t b[16];
    simde_mm512_storeu_si512(a, t);
    for (int l = 0; l < 16; l++) b[l] = (uint16_t)a[l];
    return simde_mm256_loadu_si256(b);
}
#define MA_CVTEPI32_EPI16(t) ma_simde_cvtepi32_epi16(t)

#endif
