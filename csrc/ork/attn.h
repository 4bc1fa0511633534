/* attn.h - causal attention's inner loops (model.c attn_blocks).
 *
 *   scores: the float32 GEMM (gemm_f32.h) of a block of query rows against
 *           the block's keys, S = Q K^T: each score one chain of fused
 *           multiply-adds in increasing head-dimension order,
 *             c_0 = +0.0f,  c_{d+1} = fmaf(q[d], k[u][d], c_d),
 *           then one rounded multiply by the scale (model.c). A score depends
 *           only on its own query and key, never on the block around it.
 *   pv:     (this table) the probability-weighted sums of the values for R
 *           query rows against the same n cached values of head_dim hd,
 *           continuing the chains the caller left in o:
 *             c_0 = o[r*ldo + d],  c_{u+1} = fmaf(p[r*ldp + u], v[u*ldv + d], c_u),
 *             o[r*ldo + d] = c_n       r < R, d < hd; one fused multiply-add per
 *           key, keys in increasing order. (model.c starts each row at +0.0f and
 *           runs its keys in order: those before the rows' common range one row
 *           at a time, the common range for the rows together, then the rest.)
 *
 *   softmax: (this table) one row of n scores s in place, in four passes:
 *           1. s[u] = s[u] * scale (rounded); cap > 0: s[u] = tanhf(s[u] * ic) * cap
 *              with ic = 1.0f / cap (each step rounded);
 *           2. mx = the largest s[u] (a NaN is skipped; -inf when all are);
 *           3. e[u] = ork_attn_expf(s[u] - mx) (below), summed in 8 float64
 *              lanes: lane l holds the e[u] with u % 8 == l, added in u order,
 *              sum = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
 *           4. s[u] = e[u] * (float)(1.0 / sum).
 *           ork_attn_expf is a fixed sequence of rounded float operations
 *           (range reduction by ln 2 in two parts, a degree-5 polynomial in
 *           fused multiply-adds, 2^n by exponent bits; within 2 ulp of exp on
 *           [-87, 88]); x < -87 gives +0 (exp(-87) is 1.6e-38), x > 88 is taken
 *           as 88, a NaN gives a NaN. The SIMD kernels do the same operations
 *           lane-wise, so every ISA gives the same bits.
 *
 * Each output is one chain of its own, so a kernel may keep outputs in
 * registers in any grouping and vectorize across d at any width: the scalar
 * _ref (fmaf), AVX2 (_mm256_fmadd_ps) and NEON (vfmaq_f32) tables are
 * bit-identical. Nothing here allocates or fails. */
#ifndef ORK_ATTN_H
#define ORK_ATTN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"

typedef struct ork_attn_kernels {
    const char *isa;
    void (*pv)(const float *p, size_t ldp, size_t R, const float *v, size_t ldv, size_t n, size_t hd, float *o,
               size_t ldo);
    void (*softmax)(float *s, size_t n, float scale, float cap);
} ork_attn_kernels;

/* the constants of ork_attn_expf (Cephes' expf polynomial on [-ln2/2, ln2/2]) */
#define ORK_EXP_LOG2E 0x1.715476p+0f
#define ORK_EXP_SHIFT 0x1.8p23f      /* 1.5 * 2^23: t = x*log2e + shift holds round(x*log2e) in its low bits */
#define ORK_EXP_SHIFT_BITS 0x4B400000 /* the bits of ORK_EXP_SHIFT */
#define ORK_EXP_LN2_HI 0x1.63p-1f     /* 0.693359375: n * LN2_HI exact for |n| < 2^15 */
#define ORK_EXP_LN2_LO 0x1.bd0106p-13f /* LN2_HI - ln 2 */
#define ORK_EXP_P0 1.9875691500e-4f
#define ORK_EXP_P1 1.3981999507e-3f
#define ORK_EXP_P2 8.3334519073e-3f
#define ORK_EXP_P3 4.1665795894e-2f
#define ORK_EXP_P4 1.6666665459e-1f
#define ORK_EXP_P5 5.0000001201e-1f
#define ORK_EXP_MIN -87.0f
#define ORK_EXP_MAX 88.0f

/* the contract's exp, one value (the _ref, and the SIMD kernels' tails) */
static inline float ork_attn_expf(float x) {
    const float xc = x > ORK_EXP_MAX ? ORK_EXP_MAX : x; /* a NaN stays */
    const float t = fmaf(xc, ORK_EXP_LOG2E, ORK_EXP_SHIFT), n = t - ORK_EXP_SHIFT;
    float r = fmaf(n, -ORK_EXP_LN2_HI, xc);
    r = fmaf(n, ORK_EXP_LN2_LO, r);
    float p = fmaf(ORK_EXP_P0, r, ORK_EXP_P1);
    p = fmaf(p, r, ORK_EXP_P2);
    p = fmaf(p, r, ORK_EXP_P3);
    p = fmaf(p, r, ORK_EXP_P4);
    p = fmaf(p, r, ORK_EXP_P5);
    const float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const uint32_t eb = (tb - (uint32_t)ORK_EXP_SHIFT_BITS + 127u) << 23; /* 2^n */
    float two_n;
    memcpy(&two_n, &eb, sizeof two_n);
    const float e = y * two_n;
    return x < ORK_EXP_MIN ? 0.0f : e;
}

/* softmax step 1 for s[u0..n) */
static inline void ork_attn_scale_cap(float *s, size_t u0, size_t n, float scale, float cap) {
    const float ic = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (size_t u = u0; u < n; u++) {
        s[u] *= scale;
        if (cap > 0.0f) s[u] = tanhf(s[u] * ic) * cap;
    }
}

/* softmax step 4's sum: the lane tree */
static inline double ork_attn_lane_sum(const double l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* pv's contract for rows r < R and outputs d0 <= d < d1, one output at a time: the _ref, and
 * the SIMD kernels' columns past their last full vector */
static inline void ork_attn_pv_cols(const float *p, size_t ldp, size_t R, const float *v, size_t ldv, size_t n,
                                    size_t d0, size_t d1, float *o, size_t ldo) {
    for (size_t r = 0; r < R; r++)
        for (size_t d = d0; d < d1; d++) {
            float c = o[r * ldo + d];
            for (size_t u = 0; u < n; u++) c = fmaf(p[r * ldp + u], v[u * ldv + d], c);
            o[r * ldo + d] = c;
        }
}

extern const ork_attn_kernels ork_attn_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const ork_attn_kernels ork_attn_kernels_avx2;
#endif
#if defined(__aarch64__)
extern const ork_attn_kernels ork_attn_kernels_neon;
#endif
/* the attention loops of an ISA (attn_ref.c picks them); NULL when the build has none */
const ork_attn_kernels *ork_attn_kernels_for(ork_isa isa);
const ork_attn_kernels *ork_attn_kernels_active(void); /* of ork_cpu_isa() */

#endif
