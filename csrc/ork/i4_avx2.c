/* i4_avx2.c - AVX2 kernel of the int4 x int4 matmul contract (i4.h).
 *
 * Exact integer arithmetic, so bit-identical to the _ref's int16 chunk sums
 * (which are exact, i4.h). A 32-byte load of a stored row holds 64 codes:
 * the low nibbles are the even k, the high nibbles the odd k, of the same
 * k in both operands, so no interleaving is needed. The activation rows of a
 * tile are expanded once per slice to signed int8 in that (even | odd) order,
 * and their sum kept; a weight byte xor 0x88 gives both nibbles as
 * u = w + 8 in [0, 15], the unsigned operand of maddubs:
 *   sum_k u * a = sum_k w * a + 8 * sum_k a
 * |u * a| <= 15 * 8 = 120, so a maddubs pair is within 240 and the two of a
 * 64-code block within 480: 64 blocks (a slice of 4096 k) sum to at most
 * 30720 in an int16 lane, then widen to int32 (madd) and drop 8 * sum(a).
 * Activation rows are taken 4 at a time against 2 weight rows, then 2
 * against 4, and a last single row (decode's M = 1) against 8 (the expanded
 * rows are maddubs's memory operands). Nothing is allocated: a slice of four
 * expanded rows is 16 KB of stack. */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __AVX2__
#error "i4_avx2.c must be compiled with -mavx2"
#endif
#include <immintrin.h>

#include "i4.h"

#define SLICE 64 /* 64-code blocks per int16 run: |lane| <= 64 * 480 = 30720 */
#define AX_ROW (SLICE * 64)

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* 32 stored bytes (64 codes), or 16 (the 32 codes of a row's last half block) and 16 zero bytes */
ALWAYS_INLINE __m256i load_block(const uint8_t *p, int half) {
    if (half) return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)p), 0);
    return _mm256_loadu_si256((const __m256i *)p);
}

ALWAYS_INLINE int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* nfull full blocks (+ one half block when half) of a stored activation row -> ax: block b's
 * even-k codes at ax[64b .. 64b+32), its odd-k codes at ax[64b+32 .. 64b+64), signed int8
 * (a half block's missing codes 0). Returns their sum. */
static int32_t expand_a(const uint8_t *row, size_t nfull, int half, int8_t *ax) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), e8 = _mm256_set1_epi8(8), ones = _mm256_set1_epi8(1);
    __m256i s16 = _mm256_setzero_si256(); /* per block and lane |sum| <= 4 * 8: no overflow in a slice */
    for (size_t b = 0; b < nfull + (size_t)half; b++) {
        const __m256i A = load_block(row + b * 32, b == nfull);
        const __m256i lo = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(A, m0f), e8), e8);
        const __m256i hi = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m0f), e8), e8);
        _mm256_store_si256((__m256i *)(ax + b * 64), lo);
        _mm256_store_si256((__m256i *)(ax + b * 64 + 32), hi);
        s16 = _mm256_add_epi16(s16, _mm256_add_epi16(_mm256_maddubs_epi16(ones, lo), _mm256_maddubs_epi16(ones, hi)));
    }
    return hsum8(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
}

/* one 64-code block of MT activation rows (expanded) against NR weight rows: s[r][j] += the
 * int16 pair sums of u * a */
ALWAYS_INLINE void block_step(const int8_t *ax, int MT, const uint8_t *w, size_t rb, int NR, int half, __m256i s[4][8]) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), x88 = _mm256_set1_epi8((char)0x88);
    __m256i xl[4], xh[4];
#pragma GCC unroll 4
    for (int r = 0; r < MT; r++) {
        xl[r] = _mm256_load_si256((const __m256i *)(ax + r * AX_ROW));
        xh[r] = _mm256_load_si256((const __m256i *)(ax + r * AX_ROW + 32));
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        const __m256i W = _mm256_xor_si256(load_block(w + j * rb, half), x88);
        const __m256i lo = _mm256_and_si256(W, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(W, 4), m0f);
#pragma GCC unroll 4
        for (int r = 0; r < MT; r++)
            s[r][j] = _mm256_add_epi16(s[r][j], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[r]),
                                                                 _mm256_maddubs_epi16(hi, xh[r])));
    }
}

/* acc[r * ldc + j] += the slice's sum of activation row r (ax, asum) with weight row j, r < MT, j < NR */
ALWAYS_INLINE void tile(const int8_t *ax, const int32_t *asum, int MT, const uint8_t *w, size_t rb, int NR,
                        size_t nfull, int half, int32_t *acc, size_t ldc) {
    __m256i s[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < MT; r++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) s[r][j] = _mm256_setzero_si256();
    for (size_t b = 0; b < nfull; b++) block_step(ax + b * 64, MT, w + b * 32, rb, NR, 0, s);
    if (half) block_step(ax + nfull * 64, MT, w + nfull * 32, rb, NR, 1, s);
    const __m256i one16 = _mm256_set1_epi16(1);
    for (int r = 0; r < MT; r++)
        for (int j = 0; j < NR; j++) acc[r * ldc + j] += hsum8(_mm256_madd_epi16(s[r][j], one16)) - 8 * asum[r];
}

static void mm_avx2(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t Kp, int32_t *acc, size_t ldc) {
    const size_t rb = Kp / 2, full = Kp / 64, nblk = (Kp + 63) / 64; /* Kp % 64 is 0 or 32 */
    _Alignas(32) int8_t ax[4 * AX_ROW];
    int32_t asum[4];
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) acc[m * ldc + n] = 0;
    for (size_t b0 = 0; b0 < nblk; b0 += SLICE) {
        const size_t nb = nblk - b0 < SLICE ? nblk - b0 : SLICE;
        const int half = b0 + nb > full;
        const size_t nfull = nb - (size_t)half;
        const uint8_t *ws = w + b0 * 32;
        for (size_t m0 = 0; m0 < M;) {
            int32_t *o = acc + m0 * ldc;
            size_t n = 0;
            const size_t mt = M - m0 >= 4 ? 4 : M - m0 >= 2 ? 2 : 1;
            for (size_t r = 0; r < mt; r++) asum[r] = expand_a(a + (m0 + r) * rb + b0 * 32, nfull, half, ax + r * AX_ROW);
            if (mt == 4) {
                for (; n + 2 <= N; n += 2) tile(ax, asum, 4, ws + n * rb, rb, 2, nfull, half, o + n, ldc);
                for (; n < N; n++) tile(ax, asum, 4, ws + n * rb, rb, 1, nfull, half, o + n, ldc);
            } else if (mt == 2) {
                for (; n + 4 <= N; n += 4) tile(ax, asum, 2, ws + n * rb, rb, 4, nfull, half, o + n, ldc);
                for (; n < N; n++) tile(ax, asum, 2, ws + n * rb, rb, 1, nfull, half, o + n, ldc);
            } else {
                for (; n + 8 <= N; n += 8) tile(ax, asum, 1, ws + n * rb, rb, 8, nfull, half, o + n, ldc);
                for (; n < N; n++) tile(ax, asum, 1, ws + n * rb, rb, 1, nfull, half, o + n, ldc);
            }
            m0 += mt;
        }
    }
}

const ork_i4_kernels ork_i4_kernels_avx2 = {"avx2", mm_avx2};
#endif

typedef int ork_i4_avx2_tu_nonempty;
