/* attn_neon.c - the aarch64 NEON attention value sums (attn.h). Rows go three
 * at a time (then two, then one); for three or two rows, 32 outputs of each
 * row in 8 q accumulators share every value load; a single row keeps 64
 * outputs in 16. One vfmaq_f32 per key and 4 outputs; outputs past the last
 * full vector by the scalar contract. */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "attn.h"

/* rows g (<= 3) x W vectors of outputs at o, continued over n keys (g, W constants once inlined) */
static inline __attribute__((always_inline)) void pv_tile(const int g, const int W, const float *p, size_t ldp,
                                                           const float *v, size_t ldv, size_t n, float *o,
                                                           size_t ldo) {
    float32x4_t c[3][16];
    #pragma GCC unroll 16
    for (int r = 0; r < g; r++)
        #pragma GCC unroll 16
        for (int w = 0; w < W; w++) c[r][w] = vld1q_f32(o + r * ldo + 4 * w);
    for (size_t u = 0; u < n; u++) {
        const float *vv = v + u * ldv;
        float32x4_t pr[3];
        #pragma GCC unroll 16
        for (int r = 0; r < g; r++) pr[r] = vdupq_n_f32(p[r * ldp + u]);
        #pragma GCC unroll 16
        for (int w = 0; w < W; w++) {
            const float32x4_t x = vld1q_f32(vv + 4 * w);
            #pragma GCC unroll 16
            for (int r = 0; r < g; r++) c[r][w] = vfmaq_f32(c[r][w], pr[r], x);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < g; r++)
        #pragma GCC unroll 16
        for (int w = 0; w < W; w++) vst1q_f32(o + r * ldo + 4 * w, c[r][w]);
}

static void pv_rows(const int g, const float *p, size_t ldp, const float *v, size_t ldv, size_t n, size_t hd,
                    float *o, size_t ldo) {
    size_t d = 0;
    if (g == 1)
        for (; d + 64 <= hd; d += 64) pv_tile(1, 16, p, ldp, v + d, ldv, n, o + d, ldo);
    else if (g == 2)
        for (; d + 32 <= hd; d += 32) pv_tile(2, 8, p, ldp, v + d, ldv, n, o + d, ldo);
    else
        for (; d + 32 <= hd; d += 32) pv_tile(3, 8, p, ldp, v + d, ldv, n, o + d, ldo);
    for (; d + 4 <= hd; d += 4) {
        if (g == 1) pv_tile(1, 1, p, ldp, v + d, ldv, n, o + d, ldo);
        else if (g == 2) pv_tile(2, 1, p, ldp, v + d, ldv, n, o + d, ldo);
        else pv_tile(3, 1, p, ldp, v + d, ldv, n, o + d, ldo);
    }
    ork_attn_pv_cols(p, ldp, (size_t)g, v, ldv, n, d, hd, o, ldo);
}

static void pv_neon(const float *p, size_t ldp, size_t R, const float *v, size_t ldv, size_t n, size_t hd, float *o,
                    size_t ldo) {
    size_t r = 0;
    for (; r + 3 <= R; r += 3) pv_rows(3, p + r * ldp, ldp, v, ldv, n, hd, o + r * ldo, ldo);
    if (R - r == 2) pv_rows(2, p + r * ldp, ldp, v, ldv, n, hd, o + r * ldo, ldo);
    else if (R - r == 1) pv_rows(1, p + r * ldp, ldp, v, ldv, n, hd, o + r * ldo, ldo);
}

const ork_attn_kernels ork_attn_kernels_neon = {"neon", pv_neon};
#else
typedef int ork_attn_neon_empty; /* ISO C: no empty translation unit */
#endif
