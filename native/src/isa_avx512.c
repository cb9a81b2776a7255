/* The avx512 kernels (AVX-512 F + BW + DQ + VL): the shared bodies compiled with this ISA's vector
 * layer (ma_simd.h; with MA_SIMDE, on SIMDe's emulation, for the C harness on CPUs without AVX-512). */
#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__) && !defined(MA_SIMDE)
/* as for avx2 (isa_avx2.c): the pre-allocation scheduler interleaves the vectors of a main-loop step.  Zen 5,
 * 64K, 1 thread, two builds alternated twice: without it float32/bfloat16 calls took 1.06x as long (median of
 * 36 rows; mish backward 1.25x, gelu 1.14-1.18x, elu 1.08-1.17x), only relu and hardswish 0.88-0.99x.  Not
 * for the SIMDe build (no timing there). */
#pragma GCC optimize("schedule-insns", "sched-pressure")
#endif
#define MA_ISA_AVX512 1
#include "ma_kernels.inc"

#if defined(MA_HAVE_BF16_CVT) && MA_PART_FIRST
/* ma_bf16_cvt_check's body: float32 patterns in blocks of 64 through the kernels' two vcvtneps2bf16 paths (ma_bf_pack
 * for single vectors, ma_bf_cvt4 for a main-loop step where it applies) and the integer sequence (ma_bf_hi);
 * runs only where the CPU has AVX512_BF16 (the caller checks). */
static size_t bf16_cvt_check(uint32_t lo, uint32_t hi, uint32_t *first) {
    const VI lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    size_t bad = 0;
    uint32_t at = 0;
    for (uint64_t b = lo & ~63u; b <= hi; b += 64) {
        V r[4];
        M512I step[2];
        for (int k = 0; k < 4; k++) {
            r[k] = i_as_v(lane + (uint32_t)(b + 16u * (unsigned)k));
            __mmask16 ne = _mm256_cmpneq_epi16_mask(ma_bf_pack_cvt(r[k]), MA_BF_NARROW(ma_bf_hi(r[k])));
            if (ne && !bad++) at = (uint32_t)(b + 16u * (unsigned)k) + (uint32_t)__builtin_ctz(ne);
            bad += ne ? (size_t)__builtin_popcount(ne) - 1 : 0;
        }
        if (!ma_bf_cvt4(r, &step[0], &step[1])) continue; /* a subnormal lane: the step stores by integers */
        for (int k = 0; k < 4; k += 2) { /* memory order: element 2j of r[k] lane j, 2j + 1 of r[k + 1] lane j */
            __mmask32 ne = _mm512_cmpneq_epi16_mask(step[k / 2], ma_bf_join((M512I)ma_bf_hi(r[k]),
                                                                           (M512I)ma_bf_hi(r[k + 1])));
            if (ne && !bad++) {
                unsigned j = (unsigned)__builtin_ctz(ne);
                at = (uint32_t)(b + 16u * (unsigned)(k + (int)(j & 1u)) + (j >> 1));
            }
            bad += ne ? (size_t)__builtin_popcount(ne) - 1 : 0;
        }
    }
    if (bad && first) *first = at;
    return bad;
}
__attribute__((constructor)) static void bf16_cvt_register(void) { ma_bf16_cvt_register(bf16_cvt_check); }
#endif
#endif
