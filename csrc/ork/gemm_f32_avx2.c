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

static void cols_avx2(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0,
                      size_t n1, float *y, size_t ldy, float *scratch) {
    ork_gemm_f32_blocked(tile_avx2, pack_avx2, MR, x, ldx, M, K, w, ldw, n0, n1, y, ldy, scratch);
}

const ork_gemm_f32_kernels ork_gemm_f32_kernels_avx2 = {"avx2", cols_avx2};
#endif

typedef int ork_gemm_f32_avx2_tu_nonempty;
