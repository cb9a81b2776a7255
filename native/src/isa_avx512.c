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
#endif
