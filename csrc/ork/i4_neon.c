/* i4_neon.c - aarch64 NEON kernel of the int4 x int4 matmul contract (i4.h).
 *
 * Exact integer arithmetic, so bit-identical to the _ref's int16 chunk sums
 * (which are exact, i4.h). 32 stored bytes of a row hold 64 codes, the low
 * nibbles the even k and the high nibbles the odd k of the same k in both
 * operands. Signed codes come straight from shifts (high nibble: arithmetic
 * shift right by 4; low: left by 4, then right by 4). The activation rows of
 * a tile are expanded once per slice in that (even | odd) order; per weight
 * row and 64-code block, vmull_s8 / vmlal_s8 add 8 products of at most
 * 8 * 8 = 64 into each int16 lane (at most 512), vpadalq_s16 widens them into
 * int32. Weight rows are taken 8 at a time for one activation row (decode),
 * 4 at a time for two. Nothing is allocated. */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "i4.h"

#define SLICE 64 /* 64-code blocks of expanded activations per pass (8 KB for two rows) */
#define AX_ROW (SLICE * 64)

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE int8x16_t lo_codes(int8x16_t b) { return vshrq_n_s8(vshlq_n_s8(b, 4), 4); }
ALWAYS_INLINE int8x16_t hi_codes(int8x16_t b) { return vshrq_n_s8(b, 4); }

/* nfull full blocks (+ one half block when half) of a stored activation row -> ax: block b's
 * even-k codes at ax[64b .. 64b+32), its odd-k codes at ax[64b+32 .. 64b+64) (a half block's
 * missing codes 0) */
static void expand_a(const uint8_t *row, size_t nfull, int half, int8_t *ax) {
    for (size_t b = 0; b < nfull + (size_t)half; b++) {
        const int8x16_t A0 = vreinterpretq_s8_u8(vld1q_u8(row + b * 32));
        const int8x16_t A1 = b == nfull ? vdupq_n_s8(0) : vreinterpretq_s8_u8(vld1q_u8(row + b * 32 + 16));
        vst1q_s8(ax + b * 64, lo_codes(A0));
        vst1q_s8(ax + b * 64 + 16, lo_codes(A1));
        vst1q_s8(ax + b * 64 + 32, hi_codes(A0));
        vst1q_s8(ax + b * 64 + 48, hi_codes(A1));
    }
}

/* one 64-code block of MT activation rows against NR weight rows: s[r][j] += the products */
ALWAYS_INLINE void block_step(const int8_t *ax, int MT, const uint8_t *w, size_t rb, int NR, int half,
                              int32x4_t s[2][8]) {
    int8x16_t xl0[2], xl1[2], xh0[2], xh1[2];
#pragma GCC unroll 2
    for (int r = 0; r < MT; r++) {
        xl0[r] = vld1q_s8(ax + r * AX_ROW);
        xl1[r] = vld1q_s8(ax + r * AX_ROW + 16);
        xh0[r] = vld1q_s8(ax + r * AX_ROW + 32);
        xh1[r] = vld1q_s8(ax + r * AX_ROW + 48);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        const int8x16_t W0 = vreinterpretq_s8_u8(vld1q_u8(w + j * rb));
        const int8x16_t l0 = lo_codes(W0), h0 = hi_codes(W0);
        int8x16_t l1 = vdupq_n_s8(0), h1 = l1;
        if (!half) {
            const int8x16_t W1 = vreinterpretq_s8_u8(vld1q_u8(w + j * rb + 16));
            l1 = lo_codes(W1);
            h1 = hi_codes(W1);
        }
#pragma GCC unroll 2
        for (int r = 0; r < MT; r++) {
            int16x8_t t = vmull_s8(vget_low_s8(l0), vget_low_s8(xl0[r]));
            t = vmlal_high_s8(t, l0, xl0[r]);
            t = vmlal_s8(t, vget_low_s8(h0), vget_low_s8(xh0[r]));
            t = vmlal_high_s8(t, h0, xh0[r]);
            if (!half) {
                t = vmlal_s8(t, vget_low_s8(l1), vget_low_s8(xl1[r]));
                t = vmlal_high_s8(t, l1, xl1[r]);
                t = vmlal_s8(t, vget_low_s8(h1), vget_low_s8(xh1[r]));
                t = vmlal_high_s8(t, h1, xh1[r]);
            }
            s[r][j] = vpadalq_s16(s[r][j], t);
        }
    }
}

/* acc[r * ldc + j] += the slice's sum of activation row r (ax) with weight row j, r < MT, j < NR */
ALWAYS_INLINE void tile(const int8_t *ax, int MT, const uint8_t *w, size_t rb, int NR, size_t nfull, int half,
                        int32_t *acc, size_t ldc) {
    int32x4_t s[2][8];
#pragma GCC unroll 2
    for (int r = 0; r < MT; r++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) s[r][j] = vdupq_n_s32(0);
    for (size_t b = 0; b < nfull; b++) block_step(ax + b * 64, MT, w + b * 32, rb, NR, 0, s);
    if (half) block_step(ax + nfull * 64, MT, w + nfull * 32, rb, NR, 1, s);
    for (int r = 0; r < MT; r++)
        for (int j = 0; j < NR; j++) acc[r * ldc + j] += vaddvq_s32(s[r][j]);
}

static void mm_neon(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t Kp, int32_t *acc, size_t ldc) {
    const size_t rb = Kp / 2, full = Kp / 64, nblk = (Kp + 63) / 64; /* Kp % 64 is 0 or 32 */
    _Alignas(16) int8_t ax[2 * AX_ROW];
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) acc[m * ldc + n] = 0;
    for (size_t b0 = 0; b0 < nblk; b0 += SLICE) {
        const size_t nb = nblk - b0 < SLICE ? nblk - b0 : SLICE;
        const int half = b0 + nb > full;
        const size_t nfull = nb - (size_t)half;
        const uint8_t *ws = w + b0 * 32;
        for (size_t m0 = 0; m0 < M; m0 += 2) {
            int32_t *o = acc + m0 * ldc;
            size_t n = 0;
            if (M - m0 >= 2) {
                expand_a(a + m0 * rb + b0 * 32, nfull, half, ax);
                expand_a(a + (m0 + 1) * rb + b0 * 32, nfull, half, ax + AX_ROW);
                for (; n + 4 <= N; n += 4) tile(ax, 2, ws + n * rb, rb, 4, nfull, half, o + n, ldc);
                for (; n < N; n++) tile(ax, 2, ws + n * rb, rb, 1, nfull, half, o + n, ldc);
            } else {
                expand_a(a + m0 * rb + b0 * 32, nfull, half, ax);
                for (; n + 8 <= N; n += 8) tile(ax, 1, ws + n * rb, rb, 8, nfull, half, o + n, ldc);
                for (; n < N; n++) tile(ax, 1, ws + n * rb, rb, 1, nfull, half, o + n, ldc);
            }
        }
    }
}

const ork_i4_kernels ork_i4_kernels_neon = {"neon", mm_neon};
#endif

typedef int ork_i4_neon_tu_nonempty;
