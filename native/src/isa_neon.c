/* The neon kernels: the shared bodies compiled with this ISA's vector layer. */
#if defined(__aarch64__)
#define MA_ISA_NEON 1
#include "ma_kernels.inc"
#endif
