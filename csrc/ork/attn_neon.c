/* attn_neon.c - the aarch64 NEON attention value sums (attn.h). Rows go three
 * at a time (then two, then one); for three or two rows, 32 outputs of each
 * row in 8 q accumulators share every value load; a single row keeps 64
 * outputs in 16. One vfmaq_f32 per key and 4 outputs; outputs past the last
 * full vector by the scalar contract. softmax: 8 scores per step in two q
 * registers, the exp in the contract's operations lane-wise, the 8 float64
 * lanes in four 2-double accumulators; the rest by the scalar contract. */
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

/* ork_attn_expf on 4 lanes: the same operations in the same order */
static inline float32x4_t expf4(float32x4_t x) {
    const float32x4_t mxc = vdupq_n_f32(ORK_EXP_MAX);
    const float32x4_t xc = vbslq_f32(vcgtq_f32(x, mxc), mxc, x); /* x > 88 ? 88 : x (a NaN stays) */
    const float32x4_t shift = vdupq_n_f32(ORK_EXP_SHIFT);
    const float32x4_t t = vfmaq_f32(shift, xc, vdupq_n_f32(ORK_EXP_LOG2E)), n = vsubq_f32(t, shift);
    float32x4_t r = vfmaq_f32(xc, n, vdupq_n_f32(-ORK_EXP_LN2_HI));
    r = vfmaq_f32(r, n, vdupq_n_f32(ORK_EXP_LN2_LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(ORK_EXP_P1), vdupq_n_f32(ORK_EXP_P0), r);
    p = vfmaq_f32(vdupq_n_f32(ORK_EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(ORK_EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(ORK_EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(ORK_EXP_P5), p, r);
    const float32x4_t y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    const uint32x4_t eb = vshlq_n_u32(
        vaddq_u32(vsubq_u32(vreinterpretq_u32_f32(t), vdupq_n_u32(ORK_EXP_SHIFT_BITS)), vdupq_n_u32(127)), 23);
    const float32x4_t e = vmulq_f32(y, vreinterpretq_f32_u32(eb));
    const uint32x4_t below = vcltq_f32(x, vdupq_n_f32(ORK_EXP_MIN));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), below));
}

static void softmax_neon(float *s, size_t n, float scale, float cap) {
    const size_t n8 = n & ~(size_t)7;
    float32x4_t ma = vdupq_n_f32(-INFINITY), mb = ma;
    if (cap > 0.0f) { /* tanhf: the scalar step 1 */
        ork_attn_scale_cap(s, 0, n, scale, cap);
        for (size_t u = 0; u < n8; u += 8) {
            const float32x4_t a = vld1q_f32(s + u), b = vld1q_f32(s + u + 4);
            ma = vbslq_f32(vcgtq_f32(a, ma), a, ma);
            mb = vbslq_f32(vcgtq_f32(b, mb), b, mb);
        }
    } else {
        for (size_t u = 0; u < n8; u += 8) {
            const float32x4_t a = vmulq_n_f32(vld1q_f32(s + u), scale), b = vmulq_n_f32(vld1q_f32(s + u + 4), scale);
            vst1q_f32(s + u, a);
            vst1q_f32(s + u + 4, b);
            ma = vbslq_f32(vcgtq_f32(a, ma), a, ma); /* x > m ? x : m (a NaN x keeps m) */
            mb = vbslq_f32(vcgtq_f32(b, mb), b, mb);
        }
        ork_attn_scale_cap(s, n8, n, scale, cap);
    }
    float ml[8], mx = -INFINITY;
    vst1q_f32(ml, ma);
    vst1q_f32(ml + 4, mb);
    for (int l = 0; l < 8; l++)
        if (ml[l] > mx) mx = ml[l];
    for (size_t u = n8; u < n; u++)
        if (s[u] > mx) mx = s[u];
    const float32x4_t mv = vdupq_n_f32(mx);
    float64x2_t l0 = vdupq_n_f64(0.0), l1 = l0, l2 = l0, l3 = l0;
    for (size_t u = 0; u < n8; u += 8) {
        const float32x4_t a = expf4(vsubq_f32(vld1q_f32(s + u), mv)), b = expf4(vsubq_f32(vld1q_f32(s + u + 4), mv));
        vst1q_f32(s + u, a);
        vst1q_f32(s + u + 4, b);
        l0 = vaddq_f64(l0, vcvt_f64_f32(vget_low_f32(a)));
        l1 = vaddq_f64(l1, vcvt_high_f64_f32(a));
        l2 = vaddq_f64(l2, vcvt_f64_f32(vget_low_f32(b)));
        l3 = vaddq_f64(l3, vcvt_high_f64_f32(b));
    }
    double lane[8];
    vst1q_f64(lane, l0);
    vst1q_f64(lane + 2, l1);
    vst1q_f64(lane + 4, l2);
    vst1q_f64(lane + 6, l3);
    for (size_t u = n8; u < n; u++) {
        s[u] = ork_attn_expf(s[u] - mx);
        lane[u & 7] += s[u];
    }
    const float inv = (float)(1.0 / ork_attn_lane_sum(lane));
    for (size_t u = 0; u < n8; u += 4) vst1q_f32(s + u, vmulq_n_f32(vld1q_f32(s + u), inv));
    for (size_t u = n8; u < n; u++) s[u] *= inv;
}

const ork_attn_kernels ork_attn_kernels_neon = {"neon", pv_neon, softmax_neon};
#else
typedef int ork_attn_neon_empty; /* ISO C: no empty translation unit */
#endif
