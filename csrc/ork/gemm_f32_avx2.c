/* gemm_f32_avx2.c - the AVX2 float32 GEMM (gemm_f32.h): 6 x 16 output tiles
 * in 12 ymm accumulators, one broadcast activation times two packed weight
 * vectors per row and term, _mm256_fmadd_ps (one rounding, as fmaf). */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __FMA__
#error "gemm_f32_avx2.c must be compiled with -mavx2 -mfma"
#endif
#include <immintrin.h>
#include <string.h>

#include "gemm_f32_blocked.h"

#define MR 6

static inline __attribute__((always_inline)) void tile_mr(const size_t mr, const float *x, size_t ldx,
                                                          const float *bp, size_t kc, float *y, size_t ldy,
                                                          size_t nr, int first) {
    __m256 c0[MR], c1[MR];
    _Alignas(32) float t[ORK_GEMM_NR];
#pragma GCC unroll 6
    for (size_t i = 0; i < mr; i++) {
        if (first) {
            c0[i] = c1[i] = _mm256_setzero_ps();
        } else if (nr == ORK_GEMM_NR) {
            c0[i] = _mm256_loadu_ps(y + i * ldy);
            c1[i] = _mm256_loadu_ps(y + i * ldy + 8);
        } else {
            memset(t, 0, sizeof t);
            memcpy(t, y + i * ldy, nr * sizeof(float));
            c0[i] = _mm256_load_ps(t);
            c1[i] = _mm256_load_ps(t + 8);
        }
    }
    for (size_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(bp + k * ORK_GEMM_NR), b1 = _mm256_loadu_ps(bp + k * ORK_GEMM_NR + 8);
#pragma GCC unroll 6
        for (size_t i = 0; i < mr; i++) {
            const __m256 a = _mm256_broadcast_ss(x + i * ldx + k);
            c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
        }
    }
#pragma GCC unroll 6
    for (size_t i = 0; i < mr; i++) {
        if (nr == ORK_GEMM_NR) {
            _mm256_storeu_ps(y + i * ldy, c0[i]);
            _mm256_storeu_ps(y + i * ldy + 8, c1[i]);
        } else {
            _mm256_store_ps(t, c0[i]);
            _mm256_store_ps(t + 8, c1[i]);
            memcpy(y + i * ldy, t, nr * sizeof(float));
        }
    }
}

static void tile_avx2(size_t mr, const float *x, size_t ldx, const float *bp, size_t kc, float *y, size_t ldy,
                      size_t nr, int first) {
    switch (mr) {
    case 6: tile_mr(6, x, ldx, bp, kc, y, ldy, nr, first); break;
    case 5: tile_mr(5, x, ldx, bp, kc, y, ldy, nr, first); break;
    case 4: tile_mr(4, x, ldx, bp, kc, y, ldy, nr, first); break;
    case 3: tile_mr(3, x, ldx, bp, kc, y, ldy, nr, first); break;
    case 2: tile_mr(2, x, ldx, bp, kc, y, ldy, nr, first); break;
    default: tile_mr(1, x, ldx, bp, kc, y, ldy, nr, first); break;
    }
}

/* ork_gemm_pack_panel, a full panel 8 terms at a time: two 8 x 8 transposes */
static void pack_avx2(const float *w, size_t ldw, size_t nr, size_t kc, float *bp) {
    if (nr != ORK_GEMM_NR) {
        ork_gemm_pack_panel(w, ldw, nr, kc, bp);
        return;
    }
    size_t k = 0;
    for (; k + 8 <= kc; k += 8)
        for (int half = 0; half < 2; half++) {
            const float *r = w + (size_t)(8 * half) * ldw + k;
            __m256 t0 = _mm256_unpacklo_ps(_mm256_loadu_ps(r), _mm256_loadu_ps(r + ldw));
            __m256 t1 = _mm256_unpackhi_ps(_mm256_loadu_ps(r), _mm256_loadu_ps(r + ldw));
            __m256 t2 = _mm256_unpacklo_ps(_mm256_loadu_ps(r + 2 * ldw), _mm256_loadu_ps(r + 3 * ldw));
            __m256 t3 = _mm256_unpackhi_ps(_mm256_loadu_ps(r + 2 * ldw), _mm256_loadu_ps(r + 3 * ldw));
            __m256 t4 = _mm256_unpacklo_ps(_mm256_loadu_ps(r + 4 * ldw), _mm256_loadu_ps(r + 5 * ldw));
            __m256 t5 = _mm256_unpackhi_ps(_mm256_loadu_ps(r + 4 * ldw), _mm256_loadu_ps(r + 5 * ldw));
            __m256 t6 = _mm256_unpacklo_ps(_mm256_loadu_ps(r + 6 * ldw), _mm256_loadu_ps(r + 7 * ldw));
            __m256 t7 = _mm256_unpackhi_ps(_mm256_loadu_ps(r + 6 * ldw), _mm256_loadu_ps(r + 7 * ldw));
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *o = bp + k * ORK_GEMM_NR + 8 * half; /* column k + i of these 8 rows -> o[i * NR] */
            _mm256_storeu_ps(o + 0 * ORK_GEMM_NR, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(o + 1 * ORK_GEMM_NR, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(o + 2 * ORK_GEMM_NR, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(o + 3 * ORK_GEMM_NR, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(o + 4 * ORK_GEMM_NR, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(o + 5 * ORK_GEMM_NR, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(o + 6 * ORK_GEMM_NR, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(o + 7 * ORK_GEMM_NR, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    if (k < kc) ork_gemm_pack_panel(w + k, ldw, nr, kc - k, bp + k * ORK_GEMM_NR);
}

/* ---- M = 1 (a decoded token): no packing. Eight rows at a time; for each 4 terms, the rows' next 4
 * weights are two 128-bit loads (rows j and j + 4 in one vector), transposed in
 * each half by unpack / shuffle, and the 4 fused multiply-adds continue the 8 rows' chains in k order:
 * the contract's arithmetic, read straight from the weight rows. The packed path copied every weight
 * through the scratch for one use (SmolLM2 F32 decode at 1 thread: 14.8 -> ~20 tok/s). */
static inline __attribute__((always_inline)) __m256 half_rows(const float *r, size_t ldw) {
    return _mm256_loadu2_m128(r + 4 * ldw, r); /* two unaligned 128-bit loads: [r[0..3] | r[4 ldw..4 ldw + 3]] */
}

static inline __attribute__((always_inline)) __m256 rows8_step(const float *r, size_t ldw, const float *xk,
                                                                __m256 acc) {
    /* q_j = [row j: k0 k1 k2 k3 | row j + 4: k0 k1 k2 k3] */
    const __m256 q0 = half_rows(r, ldw), q1 = half_rows(r + ldw, ldw);
    const __m256 q2 = half_rows(r + 2 * ldw, ldw), q3 = half_rows(r + 3 * ldw, ldw);
    /* t0 = [r0k0 r1k0 r0k1 r1k1 | ...], t1 = [r0k2 r1k2 r0k3 r1k3 | ...]; t2, t3 the same for rows 2, 3 */
    const __m256 t0 = _mm256_unpacklo_ps(q0, q1), t1 = _mm256_unpackhi_ps(q0, q1);
    const __m256 t2 = _mm256_unpacklo_ps(q2, q3), t3 = _mm256_unpackhi_ps(q2, q3);
    acc = _mm256_fmadd_ps(_mm256_broadcast_ss(xk + 0), _mm256_shuffle_ps(t0, t2, 0x44), acc);
    acc = _mm256_fmadd_ps(_mm256_broadcast_ss(xk + 1), _mm256_shuffle_ps(t0, t2, 0xEE), acc);
    acc = _mm256_fmadd_ps(_mm256_broadcast_ss(xk + 2), _mm256_shuffle_ps(t1, t3, 0x44), acc);
    acc = _mm256_fmadd_ps(_mm256_broadcast_ss(xk + 3), _mm256_shuffle_ps(t1, t3, 0xEE), acc);
    return acc;
}

/* rows n .. n + 8g - 1 (g = 1, 2): two groups keep two chains in flight (a step's 4 fused multiply-adds
 * are one dependent chain); measured: more groups (more short row streams at once) were slower */
static inline __attribute__((always_inline)) void rows_groups(const int g, const float *x, size_t K, const float *w,
                                                              size_t ldw, size_t n, float *y) {
    const size_t K4 = K & ~(size_t)3;
    const float *r = w + n * ldw;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (size_t k = 0; k < K4; k += 4) {
        a0 = rows8_step(r + k, ldw, x + k, a0);
        if (g == 2) a1 = rows8_step(r + 8 * ldw + k, ldw, x + k, a1);
    }
    _Alignas(32) float c[16];
    _mm256_store_ps(c, a0);
    _mm256_store_ps(c + 8, a1);
    ork_gemm_rows_tail(x, K4, K, w, ldw, n, 8 * (size_t)g, c, y);
}

static void gemv_avx2(const float *x, size_t K, const float *w, size_t ldw, size_t n0, size_t n1, float *y) {
    size_t n = n0;
    for (; n + 16 <= n1; n += 16) rows_groups(2, x, K, w, ldw, n, y);
    if (n + 8 <= n1) rows_groups(1, x, K, w, ldw, n, y), n += 8;
    if (n < n1) ork_gemm_rows_tail(x, 0, K, w, ldw, n, n1 - n, NULL, y);
}

static void cols_avx2(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0,
                      size_t n1, float *y, size_t ldy, float *scratch) {
    if (M == 1) {
        gemv_avx2(x, K, w, ldw, n0, n1, y);
        return;
    }
    ork_gemm_f32_blocked(tile_avx2, pack_avx2, MR, x, ldx, M, K, w, ldw, n0, n1, y, ldy, scratch);
}

const ork_gemm_f32_kernels ork_gemm_f32_kernels_avx2 = {"avx2", cols_avx2};

/* ---- AVX-512 (picked for the avx2 ISA when the CPU has AVX-512F/VL/BW/DQ; ORKPY_NO_AVX512=1 keeps the
 * ymm kernel): the same 16-column panels and K blocks (gemm_f32_blocked.h), a panel row is one zmm, so a
 * tile is MR512 x 16 outputs in MR512 zmm accumulators, each term one broadcast activation times the
 * panel row, _mm512_fmadd_ps (one rounding per lane, as fmaf): every output's chain is the contract's,
 * bit for bit the AVX2 and _ref results. On a CPU with full-width 512-bit FMA units this doubles the
 * multiply-adds per instruction; M = 1 keeps the AVX2 row kernel (memory-bound). */
#define ORK_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq")))
#define MR512 8 /* measured on a Zen 5 EPYC, Qwen3-1.7B shape: 8 rows beat 12 and 16 */

static ORK_AVX512 inline __attribute__((always_inline)) void tile512_mr(const size_t mr, const float *x, size_t ldx,
                                                                        const float *bp, size_t kc, float *y,
                                                                        size_t ldy, size_t nr, int first) {
    __m512 c[MR512];
    const __mmask16 msk = (__mmask16)((1u << nr) - 1u); /* nr <= 16 */
#pragma GCC unroll 8
    for (size_t i = 0; i < mr; i++) c[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(msk, y + i * ldy);
    for (size_t k = 0; k < kc; k++) {
        const __m512 b = _mm512_loadu_ps(bp + k * ORK_GEMM_NR);
#pragma GCC unroll 8
        for (size_t i = 0; i < mr; i++) c[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + k]), b, c[i]);
    }
#pragma GCC unroll 8
    for (size_t i = 0; i < mr; i++) _mm512_mask_storeu_ps(y + i * ldy, msk, c[i]);
}

static ORK_AVX512 void tile_avx512(size_t mr, const float *x, size_t ldx, const float *bp, size_t kc, float *y,
                                   size_t ldy, size_t nr, int first) {
    switch (mr) {
#define ORK_T(n) case n: tile512_mr(n, x, ldx, bp, kc, y, ldy, nr, first); break;
    ORK_T(8) ORK_T(7) ORK_T(6) ORK_T(5) ORK_T(4) ORK_T(3) ORK_T(2)
#undef ORK_T
    default: tile512_mr(1, x, ldx, bp, kc, y, ldy, nr, first); break;
    }
}

static ORK_AVX512 void cols_avx512(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw,
                                   size_t n0, size_t n1, float *y, size_t ldy, float *scratch) {
    if (M == 1) {
        gemv_avx2(x, K, w, ldw, n0, n1, y);
        return;
    }
    ork_gemm_f32_blocked(tile_avx512, pack_avx2, MR512, x, ldx, M, K, w, ldw, n0, n1, y, ldy, scratch);
}

const ork_gemm_f32_kernels ork_gemm_f32_kernels_avx512 = {"avx512", cols_avx512};
#endif

typedef int ork_gemm_f32_avx2_tu_nonempty;
