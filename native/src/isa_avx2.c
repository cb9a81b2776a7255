/* The avx2 kernels: the shared bodies compiled with this ISA's vector layer. */
#if defined(__x86_64__)
#define MA_ISA_AVX2 1
#include "ma_kernels.inc"
#endif
