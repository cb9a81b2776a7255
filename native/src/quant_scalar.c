/* The one-pass quantized outputs (ma_quant.inc) for scalar. */
#if 1
#define MA_ISA_SCALAR 1
#include "ma_quant.inc"
#endif
