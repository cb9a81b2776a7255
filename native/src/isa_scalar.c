/* The scalar kernels: the shared bodies compiled with this ISA's vector layer. */
#if 1
#define MA_ISA_SCALAR 1
#include "ma_kernels.inc"
#endif
