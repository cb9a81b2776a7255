/* The avx2 kernels: the shared bodies compiled with this ISA's vector layer. */
#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
/* GCC leaves x86 code in source order: the long exp/erfc chains of one vector then stall an
 * out-of-order window that holds little else (Zen 1 splits every 256-bit op in two).  The
 * pre-allocation scheduler interleaves the vectors of a main-loop step (ma_kernels.inc). */
#pragma GCC optimize("schedule-insns", "sched-pressure")
#endif
#define MA_ISA_AVX2 1
#include "ma_kernels.inc"
#endif
