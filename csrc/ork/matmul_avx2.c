/* matmul_avx2.c - AVX2 int8 matmul kernels: LUT inflate with pshufb, int8
 * dot products via maddubs/madd with the sign trick. maddubs multiplies an
 * unsigned by a signed byte, so one operand goes in as its magnitude and the
 * other takes its sign: the magnitude of -128 is 128 as an unsigned byte, but
 * sign() of a negative value cannot give +128. The int8 strip kernel takes
 * the magnitude of the weight, |w| * sign(x, w): exact for any int8 weight
 * (-128 included) and x in [-127, 127], every int16 pair sum at most
 * 2 * 128 * 127 = 32512 < 32767. The 4-bit GEMV, whose weights are LUT
 * entries in [-127, 127], keeps |x| * sign(w, x) with |x| hoisted per tile. */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __AVX2__
#error "matmul_avx2.c must be compiled with -mavx2"
#endif
#include <immintrin.h>
#include <string.h>

#include "pack.h"

/* 16 nibble bytes -> 32 int8 values in k order */
static inline __m256i inflate32(const uint8_t *p, __m128i tbl) {
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i vlo = _mm_shuffle_epi8(tbl, _mm_and_si128(b, lo4));
    __m128i vhi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), lo4));
    return _mm256_set_m128i(_mm_unpackhi_epi8(vlo, vhi), _mm_unpacklo_epi8(vlo, vhi));
}

static void inflate_strip_avx2(const uint8_t *nib, size_t KB, const int8_t lut[16], int8_t *strip) {
    const __m128i tbl = _mm_loadu_si128((const __m128i *)lut);
    for (size_t r = 0; r < KB * 32; r++)
        _mm256_storeu_si256((__m256i *)(strip + r * 32), inflate32(nib + r * 16, tbl));
}

static inline __attribute__((unused)) int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* 8 accumulators of 8 lanes -> 8 int32 sums, in order */
static inline __m256i hsum8x8(const __m256i a[8]) {
    __m256i t0 = _mm256_hadd_epi32(a[0], a[1]);
    __m256i t1 = _mm256_hadd_epi32(a[2], a[3]);
    __m256i t2 = _mm256_hadd_epi32(a[4], a[5]);
    __m256i t3 = _mm256_hadd_epi32(a[6], a[7]);
    __m256i u0 = _mm256_hadd_epi32(t0, t1); /* [a0 a1 a2 a3 | a0 a1 a2 a3] partials */
    __m256i u1 = _mm256_hadd_epi32(t2, t3);
    __m256i lo = _mm256_permute2x128_si256(u0, u1, 0x20);
    __m256i hi = _mm256_permute2x128_si256(u0, u1, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* a += the 32 products of an unsigned byte u and a signed byte s, four per int32 lane
 * (maddubs's int16 pair sums cannot saturate for u <= 128, |s| <= 127) */
static inline __m256i add_dot_avx2(__m256i a, __m256i u, __m256i s) {
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

/* The single-row passes, written once for the AVX2 and VNNI tables; STEP is add_dot_avx2 or
 * add_dot_vnni (the same int32 sums). One sequential pass over the strip, 32 accumulators, the
 * next tiles prefetched: the weights come from memory once (passes of 8 rows at a 1 KB stride
 * stalled on every load). int8: u = |w|, s = x * sign(w), exact for any int8 w (-128 included)
 * and x in [-127, 127]. */
#define ORK_ROW_I8_PASS(STEP, strip, KB, x0, acc)                                                        \
    do {                                                                                                 \
        __m256i a_[32];                                                                                  \
        for (int r = 0; r < 32; r++) a_[r] = _mm256_setzero_si256();                                     \
        for (size_t kb = 0; kb < (KB); kb++) {                                                           \
            const __m256i xs0 = _mm256_loadu_si256((const __m256i *)((x0) + kb * 32));                   \
            const int8_t *w = (strip) + kb * 1024;                                                       \
            for (int p = 0; p < 1024; p += 64) _mm_prefetch((const char *)(w + 2048 + p), _MM_HINT_T0);  \
            for (int r = 0; r < 32; r++) {                                                               \
                const __m256i wr = _mm256_loadu_si256((const __m256i *)(w + r * 32));                    \
                a_[r] = STEP(a_[r], _mm256_abs_epi8(wr), _mm256_sign_epi8(xs0, wr));                     \
            }                                                                                            \
        }                                                                                                \
        for (int i0 = 0; i0 < 32; i0 += 8) _mm256_storeu_si256((__m256i *)((acc) + i0), hsum8x8(a_ + i0)); \
    } while (0)

/* GEMV straight from nibbles. Inflation works on whole 256-bit registers: a
 * tile row's 16 bytes are broadcast to both lanes, lane 0 looks up the low
 * nibbles (even k) and lane 1 the high nibbles (odd k) with one vpshufb. The
 * activations are permuted to the same (even | odd) order once per tile, so
 * every product is the same as in k order and the int32 sums are identical.
 * u = |x| (hoisted per tile), s = the LUT value * sign(x): both within [-127, 127]. */
#define ORK_GEMV_I4_PASS(STEP, nib, KB, lut, x, acc)                                                     \
    do {                                                                                                 \
        const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(lut)));       \
        const __m256i lo4 = _mm256_set1_epi8(0x0F);                                                      \
        const __m256i evod = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,      \
                                              0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);     \
        __m256i a_[32];                                                                                  \
        for (int r = 0; r < 32; r++) a_[r] = _mm256_setzero_si256();                                     \
        for (size_t kb = 0; kb < (KB); kb++) {                                                           \
            __m256i xs = _mm256_loadu_si256((const __m256i *)((x) + kb * 32));                           \
            xs = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(xs, evod), 0xD8); /* evens | odds */       \
            const __m256i xa = _mm256_abs_epi8(xs);                                                      \
            const uint8_t *w = (nib) + kb * 32 * 16;                                                     \
            for (int p = 0; p < 512; p += 64) _mm_prefetch((const char *)(w + 2048 + p), _MM_HINT_T0);   \
            for (int r = 0; r < 32; r++) {                                                               \
                __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(w + r * 16))); \
                __m256i idx = _mm256_and_si256(_mm256_blend_epi32(b, _mm256_srli_epi16(b, 4), 0xF0), lo4); \
                a_[r] = STEP(a_[r], xa, _mm256_sign_epi8(_mm256_shuffle_epi8(tbl, idx), xs));            \
            }                                                                                            \
        }                                                                                                \
        for (int i0 = 0; i0 < 32; i0 += 8) _mm256_storeu_si256((__m256i *)((acc) + i0), hsum8x8(a_ + i0)); \
    } while (0)

static void gemm_strip_i8_avx2(const int8_t *strip, size_t KB, const int8_t *x, size_t ldx, size_t M,
                               int32_t *acc) {
    size_t m = 0;
    /* 2 activation rows x 8 weight rows per pass: 16 accumulators */
    for (; m + 2 <= M; m += 2) {
        const int8_t *x0 = x + m * ldx, *x1 = x0 + ldx;
        for (size_t i0 = 0; i0 < 32; i0 += 8) {
            __m256i a0[8], a1[8];
            for (int r = 0; r < 8; r++) a0[r] = a1[r] = _mm256_setzero_si256();
            for (size_t kb = 0; kb < KB; kb++) {
                __m256i xs0 = _mm256_loadu_si256((const __m256i *)(x0 + kb * 32));
                __m256i xs1 = _mm256_loadu_si256((const __m256i *)(x1 + kb * 32));
                const int8_t *w = strip + (kb * 32 + i0) * 32;
                for (int r = 0; r < 8; r++) {
                    __m256i wr = _mm256_loadu_si256((const __m256i *)(w + r * 32));
                    __m256i wa = _mm256_abs_epi8(wr);
                    a0[r] = add_dot_avx2(a0[r], wa, _mm256_sign_epi8(xs0, wr));
                    a1[r] = add_dot_avx2(a1[r], wa, _mm256_sign_epi8(xs1, wr));
                }
            }
            _mm256_storeu_si256((__m256i *)(acc + m * 32 + i0), hsum8x8(a0));
            _mm256_storeu_si256((__m256i *)(acc + (m + 1) * 32 + i0), hsum8x8(a1));
        }
    }
    /* a single row (decode's M = 1, or an odd M's last row) */
    if (m < M) ORK_ROW_I8_PASS(add_dot_avx2, strip, KB, x + m * ldx, acc + m * 32);
}

static void gemv_strip_i4_avx2(const uint8_t *nib, size_t KB, const int8_t lut[16], const int8_t *x,
                               int32_t *acc) {
    ORK_GEMV_I4_PASS(add_dot_avx2, nib, KB, lut, x, acc);
}

static void acc_group_avx2(const int32_t *acc, size_t M, const float *ascale, const float s[32], int first,
                           float *y) {
    for (size_t m = 0; m < M; m++) {
        __m256 a = _mm256_set1_ps(ascale[m]);
        for (size_t i = 0; i < 32; i += 8) {
            /* the same two float32 multiplies as ork_dequant_acc, then one add: no FMA */
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc + m * 32 + i))), a),
                                     _mm256_loadu_ps(s + i));
            if (!first) t = _mm256_add_ps(_mm256_loadu_ps(y + m * 32 + i), t);
            _mm256_storeu_ps(y + m * 32 + i, t);
        }
    }
}

/* ---- AVX-512 VNNI on 256-bit registers (avx512vl + avx512vnni; chosen at run time by matmul_ref.c) ----
 * vpdpbusd multiplies an unsigned by a signed byte and adds four products into an int32 lane,
 * with no intermediate saturation. x goes in as x + 128 (x ^ 0x80, in [0, 255]) and the weight
 * as is; each row's 128 * sum(w) (the same instruction with 0x80 bytes) is subtracted at the
 * end. Every step is int32 arithmetic modulo 2^32 and the true sum fits in an int32, so the
 * result equals the _ref's exactly, for any int8 x and w. Blocks of 4 activation rows x 4
 * weight rows (16 accumulators); a single row (decode's M = 1, or the last of M % 4) takes
 * gemv_row_i8_vnni, two or three remaining rows the AVX2 path above: the same sums. */
#define ORK_VNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni")))

/* four 8-lane accumulators -> their four int32 sums (modular) */
static inline ORK_VNNI __m128i hsum4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    __m256i u = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

static inline ORK_VNNI __m256i add_dot_vnni(__m256i a, __m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(a, u, s);
}

/* one activation row (decode's M = 1): the AVX2 single-row pass with vpdpbusd, which adds the
 * four u * s products of each int32 lane without saturation, so the sums are exactly the AVX2 /
 * _ref ones, -128 weights included. Three instructions per 32 products where maddubs / madd /
 * add take five. */
static ORK_VNNI void gemv_row_i8_vnni(const int8_t *strip, size_t KB, const int8_t *x0, int32_t *acc) {
    ORK_ROW_I8_PASS(add_dot_vnni, strip, KB, x0, acc);
}

static ORK_VNNI void gemm_strip_i8_vnni(const int8_t *strip, size_t KB, const int8_t *x, size_t ldx, size_t M,
                                        int32_t *acc) {
    if (M == 1) {
        gemv_row_i8_vnni(strip, KB, x, acc);
        return;
    }
    if (M < 4) {
        gemm_strip_i8_avx2(strip, KB, x, ldx, M, acc);
        return;
    }
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    _Alignas(16) int32_t wsum[32]; /* 128 * sum_k w[r][k], modulo 2^32 */
    for (int r0 = 0; r0 < 32; r0 += 4) {
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
        for (size_t kb = 0; kb < KB; kb++) {
            const int8_t *w = strip + (kb * 32 + r0) * 32;
            c0 = _mm256_dpbusd_epi32(c0, bias, _mm256_loadu_si256((const __m256i *)w));
            c1 = _mm256_dpbusd_epi32(c1, bias, _mm256_loadu_si256((const __m256i *)(w + 32)));
            c2 = _mm256_dpbusd_epi32(c2, bias, _mm256_loadu_si256((const __m256i *)(w + 64)));
            c3 = _mm256_dpbusd_epi32(c3, bias, _mm256_loadu_si256((const __m256i *)(w + 96)));
        }
        _mm_store_si128((__m128i *)(wsum + r0), hsum4(c0, c1, c2, c3));
    }
    size_t m = 0;
    for (; m + 4 <= M; m += 4) {
        const int8_t *x0 = x + m * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        for (int r0 = 0; r0 < 32; r0 += 4) {
            __m256i a[4][4];
            for (int i = 0; i < 4; i++)
                for (int r = 0; r < 4; r++) a[i][r] = _mm256_setzero_si256();
            for (size_t kb = 0; kb < KB; kb++) {
                const __m256i u0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x0 + kb * 32)), bias);
                const __m256i u1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x1 + kb * 32)), bias);
                const __m256i u2 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x2 + kb * 32)), bias);
                const __m256i u3 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x3 + kb * 32)), bias);
                const int8_t *w = strip + (kb * 32 + r0) * 32;
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    const __m256i wr = _mm256_loadu_si256((const __m256i *)(w + r * 32));
                    a[0][r] = _mm256_dpbusd_epi32(a[0][r], u0, wr);
                    a[1][r] = _mm256_dpbusd_epi32(a[1][r], u1, wr);
                    a[2][r] = _mm256_dpbusd_epi32(a[2][r], u2, wr);
                    a[3][r] = _mm256_dpbusd_epi32(a[3][r], u3, wr);
                }
            }
            const __m128i ws = _mm_load_si128((const __m128i *)(wsum + r0));
            for (int i = 0; i < 4; i++)
                _mm_storeu_si128((__m128i *)(acc + (m + i) * 32 + r0),
                                 _mm_sub_epi32(hsum4(a[i][0], a[i][1], a[i][2], a[i][3]), ws));
        }
    }
    if (m + 1 == M) gemv_row_i8_vnni(strip, KB, x + m * ldx, acc + m * 32);
    else if (m < M) gemm_strip_i8_avx2(strip, KB, x + m * ldx, ldx, M - m, acc + m * 32);
}

/* the 4-bit GEMV of the AVX2 table with vpdpbusd: the same products and int32 sums, two
 * instructions fewer per tile row */
static ORK_VNNI void gemv_strip_i4_vnni(const uint8_t *nib, size_t KB, const int8_t lut[16], const int8_t *x,
                                        int32_t *acc) {
    ORK_GEMV_I4_PASS(add_dot_vnni, nib, KB, lut, x, acc);
}

const ork_matmul_kernels ork_matmul_kernels_avx2vnni = {"avx2vnni", inflate_strip_avx2, gemm_strip_i8_vnni,
                                                        gemv_strip_i4_vnni, acc_group_avx2};

const ork_matmul_kernels ork_matmul_kernels_avx2 = {"avx2", inflate_strip_avx2, gemm_strip_i8_avx2,
                                                    gemv_strip_i4_avx2, acc_group_avx2};
#endif

typedef int ork_matmul_avx2_tu_nonempty;
