/* IEEE binary16 <-> binary32 and bfloat16 <-> binary32 in portable C (round to nearest even,
 * subnormals, inf, NaN kept).  Used by the scalar path and by tails; SIMD paths use F16C / vcvt for
 * half and the same integer sequence as ma_f2bf for bfloat16 (ma_simd.h). */
#ifndef MA_HALF_H
#define MA_HALF_H

#include <stdint.h>
#include <string.h>

static inline float ma_h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = s | 0x7f800000u | (m << 13);
    } else if (e) {
        bits = s | ((e + 112u) << 23) | (m << 13);
    } else {
        float f = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        memcpy(&bits, &f, 4);
        bits |= s;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t ma_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t s = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((x >> 13) & 0x3ffu)); /* NaN stays quiet NaN */
    if (x >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);                      /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                                                        /* below 2^-14 */
        /* In [0.5, 1) the float spacing is 2^-24, the half subnormal spacing: the FPU rounds. */
        float a;
        memcpy(&a, &x, 4);
        a += 0.5f;
        uint32_t b;
        memcpy(&b, &a, 4);
        return (uint16_t)(s | (b - 0x3f000000u));
    }
    x += 0xc8000fffu + ((x >> 13) & 1u); /* rebias exponent by -112, round mantissa to even */
    return (uint16_t)(s | (x >> 13));
}

/* bfloat16 is the high half of a binary32: widening is a shift (exact, subnormals included). */
static inline float ma_bf2f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* binary32 -> bfloat16, rounded once to nearest even on the bits: add 0x7fff plus the lowest kept bit,
 * keep the high half (a carry into the exponent is the right rounding: from 0x7f7f8000, the tie above
 * the largest finite bfloat16, up rounds to inf; subnormals round like normals).  NaN stays NaN: quiet (bit 6 set), sign and top payload kept, as
 * float16's rule (ma_f2h) and AVX512_BF16's vcvtneps2bf16.  No FPU mode (FTZ/DAZ, rounding) applies. */
static inline uint16_t ma_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
