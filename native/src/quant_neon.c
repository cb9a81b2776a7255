/* The one-pass quantized outputs (ma_quant.inc) for neon. */
#if defined(__aarch64__)
#define MA_ISA_NEON 1
#include "ma_quant.inc"
#endif
