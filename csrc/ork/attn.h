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
 * Each output is one chain of its own, so a kernel may keep outputs in
 * registers in any grouping and vectorize across d at any width: the scalar
 * _ref (fmaf), AVX2 (_mm256_fmadd_ps) and NEON (vfmaq_f32) tables are
 * bit-identical. Softmax (max, expf, the float64 sum) stays in model.c: it is
 * per key, not per key x hd. Nothing here allocates or fails. */
#ifndef ORK_ATTN_H
#define ORK_ATTN_H

#include <math.h>
#include <stddef.h>

typedef struct ork_attn_kernels {
    const char *isa;
    void (*pv)(const float *p, size_t ldp, size_t R, const float *v, size_t ldv, size_t n, size_t hd, float *o,
               size_t ldo);
} ork_attn_kernels;

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

#endif
