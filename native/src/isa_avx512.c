/* The avx512 kernels (AVX-512 F + BW + DQ + VL): the shared bodies compiled with this ISA's vector
 * layer (ma_simd.h; with MA_SIMDE, on SIMDe's emulation, for the C harness on CPUs without AVX-512). */
#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__) && !defined(MA_SIMDE)
/* as for avx2 (isa_avx2.c): the pre-allocation scheduler interleaves the vectors of a main-loop step;
 * not measured on AVX-512 hardware (none here).  Not for the SIMDe build (no timing there). */
#pragma GCC optimize("schedule-insns", "sched-pressure")
#endif
#define MA_ISA_AVX512 1
#include "ma_kernels.inc"

#if defined(MA_HAVE_BF16_CVT) && MA_PART_FIRST
/* ma_bf16_cvt_check's body: float32 patterns in blocks of 16 through vcvtneps2bf16 (ma_bf_pack's way) and the
 * integer sequence (ma_bf_hi), as ma_bf_pack takes them; runs only where the CPU has AVX512_BF16 (the caller checks). */
static size_t bf16_cvt_check(uint32_t lo, uint32_t hi, uint32_t *first) {
    const VI lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    size_t bad = 0;
    for (uint64_t b = lo & ~15u; b <= hi; b += 16) {
        V v = i_as_v(lane + (uint32_t)b);
        __mmask16 ne = _mm256_cmpneq_epi16_mask(ma_bf_pack_cvt(v), MA_BF_NARROW(ma_bf_hi(v)));
        if (ne) {
            if (!bad && first) *first = (uint32_t)b + (uint32_t)__builtin_ctz(ne);
            bad += (size_t)__builtin_popcount(ne);
        }
    }
    return bad;
}
__attribute__((constructor)) static void bf16_cvt_register(void) { ma_bf16_cvt_register(bf16_cvt_check); }
#endif
#endif
