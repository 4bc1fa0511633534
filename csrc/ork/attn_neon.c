/* attn_neon.c - the aarch64 NEON attention loops (attn.h). scores: a key's
 * 8 dot8 lanes in two q registers (lanes 0-3, 4-7; vmulq then vaddq, rounded
 * apart), reduced by two pairwise adds and one add, which is exactly
 * ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); two keys at a time. pv: 64 outputs at
 * a time in 16 q accumulators over all keys. */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "attn.h"

static inline float tree(float32x4_t lo, float32x4_t hi) {
    const float32x4_t t = vpaddq_f32(vpaddq_f32(lo, hi), vdupq_n_f32(0.0f));
    /* t[0] = (l0+l1)+(l2+l3), t[1] = (l4+l5)+(l6+l7) */
    return vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 1);
}

static void scores_neon(const float *q, const float *k, size_t ldk, size_t n, size_t hd, float scale, float *s) {
    const size_t h8 = hd & ~(size_t)7;
    size_t u = 0;
    for (; u + 2 <= n; u += 2) {
        const float *k0 = k + u * ldk, *k1 = k0 + ldk;
        float32x4_t a0 = vdupq_n_f32(0.0f), b0 = a0, a1 = a0, b1 = a0;
        for (size_t i = 0; i < h8; i += 8) {
            const float32x4_t ql = vld1q_f32(q + i), qh = vld1q_f32(q + i + 4);
            a0 = vaddq_f32(a0, vmulq_f32(ql, vld1q_f32(k0 + i)));
            b0 = vaddq_f32(b0, vmulq_f32(qh, vld1q_f32(k0 + i + 4)));
            a1 = vaddq_f32(a1, vmulq_f32(ql, vld1q_f32(k1 + i)));
            b1 = vaddq_f32(b1, vmulq_f32(qh, vld1q_f32(k1 + i + 4)));
        }
        float r0 = tree(a0, b0), r1 = tree(a1, b1);
        for (size_t i = h8; i < hd; i++) {
            r0 += q[i] * k0[i];
            r1 += q[i] * k1[i];
        }
        s[u] = r0 * scale;
        s[u + 1] = r1 * scale;
    }
    for (; u < n; u++) {
        const float *k0 = k + u * ldk;
        float32x4_t a0 = vdupq_n_f32(0.0f), b0 = a0;
        for (size_t i = 0; i < h8; i += 8) {
            a0 = vaddq_f32(a0, vmulq_f32(vld1q_f32(q + i), vld1q_f32(k0 + i)));
            b0 = vaddq_f32(b0, vmulq_f32(vld1q_f32(q + i + 4), vld1q_f32(k0 + i + 4)));
        }
        float r0 = tree(a0, b0);
        for (size_t i = h8; i < hd; i++) r0 += q[i] * k0[i];
        s[u] = r0 * scale;
    }
}

static void pv_neon(const float *p, const float *v, size_t ldv, size_t n, size_t hd, float *o) {
    size_t d = 0;
    for (; d + 64 <= hd; d += 64) {
        float32x4_t c[16];
        for (int i = 0; i < 16; i++) c[i] = vdupq_n_f32(0.0f);
        for (size_t u = 0; u < n; u++) {
            const float32x4_t pu = vdupq_n_f32(p[u]);
            const float *vv = v + u * ldv + d;
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) c[i] = vaddq_f32(c[i], vmulq_f32(pu, vld1q_f32(vv + 4 * i)));
        }
        for (int i = 0; i < 16; i++) vst1q_f32(o + d + 4 * i, c[i]);
    }
    for (; d + 4 <= hd; d += 4) {
        float32x4_t c0 = vdupq_n_f32(0.0f);
        for (size_t u = 0; u < n; u++) c0 = vaddq_f32(c0, vmulq_f32(vdupq_n_f32(p[u]), vld1q_f32(v + u * ldv + d)));
        vst1q_f32(o + d, c0);
    }
    ork_attn_pv_cols(p, v, ldv, n, d, hd, o);
}

const ork_attn_kernels ork_attn_kernels_neon = {"neon", scores_neon, pv_neon};
#else
typedef int ork_attn_neon_empty; /* ISO C: no empty translation unit */
#endif
