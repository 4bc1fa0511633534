/* attn.h - the two inner loops of causal attention (model.c attn_heads), for
 * one query row of one head against n cached keys / values of head_dim hd:
 *
 *   scores: s[u] = dot8(q, k + u*ldk, hd) * scale                  u < n
 *           dot8 (linear.h ork_dot8): 8 interleaved lanes, lane l sums
 *           the products of k = l, l+8, ... in k order; each multiply and
 *           each add rounded apart; the lanes combined in the fixed tree
 *           ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); then the hd % 8 tail
 *           terms added in order; then one rounded multiply by scale.
 *   pv:     o[d] = c_n,  c_0 = +0.0f,  c_{u+1} = c_u + p[u] * v[u*ldv + d]
 *           (product rounded, then the add; u increasing)        d < hd
 *
 * No fused multiply-adds anywhere (buildflags.py: -ffp-contract=off), so the
 * scalar _ref, AVX2 and NEON tables are bit-identical: a kernel may keep
 * lanes, keys or outputs in registers in any grouping that keeps each
 * output's own sequence of roundings. Softmax (max, expf, the float64 sum)
 * stays in model.c: it is per key, not per key x hd. Nothing here allocates
 * or fails. */
#ifndef ORK_ATTN_H
#define ORK_ATTN_H

#include <stddef.h>

typedef struct ork_attn_kernels {
    const char *isa;
    void (*scores)(const float *q, const float *k, size_t ldk, size_t n, size_t hd, float scale, float *s);
    void (*pv)(const float *p, const float *v, size_t ldv, size_t n, size_t hd, float *o);
} ork_attn_kernels;

/* pv's contract for outputs d0 <= d < d1, one output at a time: the _ref, and the SIMD kernels'
 * columns past their last full vector */
static inline void ork_attn_pv_cols(const float *p, const float *v, size_t ldv, size_t n, size_t d0, size_t d1,
                                    float *o) {
    for (size_t d = d0; d < d1; d++) {
        float c = 0.0f;
        for (size_t u = 0; u < n; u++) c += p[u] * v[u * ldv + d];
        o[d] = c;
    }
}

extern const ork_attn_kernels ork_attn_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const ork_attn_kernels ork_attn_kernels_avx2;
#endif
#if defined(__aarch64__)
extern const ork_attn_kernels ork_attn_kernels_neon;
#endif

#endif
