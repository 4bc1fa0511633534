/* gemm_f32_neon.c - the aarch64 NEON float32 GEMM (gemm_f32.h): 6 x 16
 * output tiles in 24 q-register accumulators, one broadcast activation times
 * four packed weight vectors per row and term, vfmaq_f32 (FMLA: one
 * rounding, as fmaf). */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "gemm_f32_blocked.h"

#define MR 6

static inline __attribute__((always_inline)) void tile_mr(const size_t mr, const float *x, size_t ldx,
                                                          const float *bp, size_t kc, float *y, size_t ldy,
                                                          size_t nr, int first) {
    float32x4_t c[MR][4];
    float t[ORK_GEMM_NR];
#pragma GCC unroll 6
    for (size_t i = 0; i < mr; i++) {
        const float *src = y + i * ldy;
        if (!first && nr != ORK_GEMM_NR) {
            memset(t, 0, sizeof t);
            memcpy(t, src, nr * sizeof(float));
            src = t;
        }
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) c[i][v] = first ? vdupq_n_f32(0.0f) : vld1q_f32(src + 4 * v);
    }
    for (size_t k = 0; k < kc; k++) {
        const float *b = bp + k * ORK_GEMM_NR;
        const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
#pragma GCC unroll 6
        for (size_t i = 0; i < mr; i++) {
            const float32x4_t a = vld1q_dup_f32(x + i * ldx + k);
            c[i][0] = vfmaq_f32(c[i][0], a, b0);
            c[i][1] = vfmaq_f32(c[i][1], a, b1);
            c[i][2] = vfmaq_f32(c[i][2], a, b2);
            c[i][3] = vfmaq_f32(c[i][3], a, b3);
        }
    }
#pragma GCC unroll 6
    for (size_t i = 0; i < mr; i++) {
        float *dst = nr == ORK_GEMM_NR ? y + i * ldy : t;
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) vst1q_f32(dst + 4 * v, c[i][v]);
        if (nr != ORK_GEMM_NR) memcpy(y + i * ldy, t, nr * sizeof(float));
    }
}

static void tile_neon(size_t mr, const float *x, size_t ldx, const float *bp, size_t kc, float *y, size_t ldy,
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

static void cols_neon(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0,
                      size_t n1, float *y, size_t ldy, float *scratch) {
    ork_gemm_f32_blocked(tile_neon, ork_gemm_pack_panel, MR, x, ldx, M, K, w, ldw, n0, n1, y, ldy, scratch);
}

const ork_gemm_f32_kernels ork_gemm_f32_kernels_neon = {"neon", cols_neon};
#endif

typedef int ork_gemm_f32_neon_tu_nonempty;
