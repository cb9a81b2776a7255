/* The one-pass quantized outputs (ma_quant.inc) for avx2. */
#if defined(__x86_64__)
#define MA_ISA_AVX2 1
#include "ma_quant.inc"
#endif
