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

/* ---- M = 1 (a decoded token): no packing (as gemm_f32_avx2.c). Four rows at a time; for each 4 terms,
 * a 4 x 4 transpose of the rows' next 4 weights (TRN1/TRN2 on 32- then 64-bit lanes) and 4 fused
 * multiply-adds continuing the 4 rows' chains in k order. Up to four groups (16 rows) keep four
 * chains in flight. */
static inline __attribute__((always_inline)) float32x4_t rows4_step(const float *r, size_t ldw, const float *xk,
                                                                     float32x4_t acc) {
    const float32x4_t r0 = vld1q_f32(r), r1 = vld1q_f32(r + ldw), r2 = vld1q_f32(r + 2 * ldw),
                      r3 = vld1q_f32(r + 3 * ldw);
    /* t0 = [r0k0 r1k0 r0k2 r1k2], t1 = [r0k1 r1k1 r0k3 r1k3]; t2, t3 the same for rows 2, 3 */
    const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1)), t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
    const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3)), t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
    acc = vfmaq_f32(acc, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)), vdupq_n_f32(xk[0]));
    acc = vfmaq_f32(acc, vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)), vdupq_n_f32(xk[1]));
    acc = vfmaq_f32(acc, vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)), vdupq_n_f32(xk[2]));
    acc = vfmaq_f32(acc, vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)), vdupq_n_f32(xk[3]));
    return acc;
}

/* rows n .. n + 4g - 1, g = 1 .. 4 groups of 4 */
static inline __attribute__((always_inline)) void rows_groups(const int g, const float *x, size_t K, const float *w,
                                                              size_t ldw, size_t n, float *y) {
    const size_t K4 = K & ~(size_t)3;
    const float *r = w + n * ldw;
    float32x4_t a[4];
#pragma GCC unroll 4
    for (int i = 0; i < g; i++) a[i] = vdupq_n_f32(0.0f);
    for (size_t k = 0; k < K4; k += 4) {
#pragma GCC unroll 4
        for (int i = 0; i < g; i++) a[i] = rows4_step(r + (size_t)(4 * i) * ldw + k, ldw, x + k, a[i]);
    }
    float c[16];
#pragma GCC unroll 4
    for (int i = 0; i < g; i++) vst1q_f32(c + 4 * i, a[i]);
    ork_gemm_rows_tail(x, K4, K, w, ldw, n, 4 * (size_t)g, c, y);
}

static void gemv_neon(const float *x, size_t K, const float *w, size_t ldw, size_t n0, size_t n1, float *y) {
    size_t n = n0;
    for (; n + 16 <= n1; n += 16) rows_groups(4, x, K, w, ldw, n, y);
    if (n + 8 <= n1) rows_groups(2, x, K, w, ldw, n, y), n += 8;
    if (n + 4 <= n1) rows_groups(1, x, K, w, ldw, n, y), n += 4;
    if (n < n1) ork_gemm_rows_tail(x, 0, K, w, ldw, n, n1 - n, NULL, y);
}

static void cols_neon(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0,
                      size_t n1, float *y, size_t ldy, float *scratch) {
    if (M == 1) {
        gemv_neon(x, K, w, ldw, n0, n1, y);
        return;
    }
    ork_gemm_f32_blocked(tile_neon, ork_gemm_pack_panel, MR, x, ldx, M, K, w, ldw, n0, n1, y, ldy, scratch);
}

const ork_gemm_f32_kernels ork_gemm_f32_kernels_neon = {"neon", cols_neon};
#endif

typedef int ork_gemm_f32_neon_tu_nonempty;
