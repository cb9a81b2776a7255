/* The one-pass quantized outputs (ma_quant.inc) for avx512. */
#if defined(__x86_64__)
#define MA_ISA_AVX512 1
#include "ma_quant.inc"
#endif
