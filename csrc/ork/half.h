/* half.h - IEEE 754 binary16 ("float16") <-> float32 in integer arithmetic.
 *
 * No F16C / FP16 instructions and no floating-point operation: every build, ISA
 * and compiler gives the same bits. Used for group-wise scales (quant.h, stored
 * as float16 in O4N1/O8N1 version 3, o4n1.h).
 *
 *   ork_f16_from_f32: round to nearest, ties to even (IEEE's default, as
 *     NumPy's astype(float16)); subnormal results are produced (gradual
 *     underflow), magnitudes >= 65520 become +-inf, NaN stays a (quiet) NaN.
 *   ork_f16_to_f32: exact (every float16 is a float32).
 */
#ifndef ORK_HALF_H
#define ORK_HALF_H

#include <stdint.h>
#include <string.h>

#define ORK_F16_MAX 65504.0f /* the largest finite float16 */

static inline uint16_t ork_f16_from_f32(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN, quieted */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (65504 + half an ulp): inf */
    if (ax < 0x33000000u) return sign;                        /* < 2^-25: rounds to zero */
    uint32_t h, rem, half;
    if (ax >= 0x38800000u) { /* normal: rebias the exponent, drop 13 mantissa bits */
        h = ((ax >> 23) - 112u) << 10 | ((ax >> 13) & 0x3ffu);
        rem = ax & 0x1fffu;
        half = 0x1000u;
    } else { /* subnormal result: units of 2^-24 */
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - (ax >> 23); /* 14..24 */
        h = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    }
    if (rem > half || (rem == half && (h & 1u))) h++; /* a carry rounds up into the next binade */
    return (uint16_t)(sign | h);
}

static inline float ork_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu, x;
    if (e == 0x1fu) x = sign | 0x7f800000u | (m << 13); /* inf, NaN */
    else if (e) x = sign | ((e + 112u) << 23) | (m << 13);
    else if (!m) x = sign;
    else { /* subnormal: normalise m * 2^-24 */
        uint32_t ex = 113u;
        while (!(m & 0x400u)) {
            m <<= 1;
            ex--;
        }
        x = sign | (ex << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

#endif /* ORK_HALF_H */
