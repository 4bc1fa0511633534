/* attn_ref.c - the scalar oracle of the attention value sums (attn.h): the
 * contract written out, one output at a time (fmaf: one rounding per term). */
#include "attn.h"

static void pv_ref(const float *p, size_t ldp, size_t R, const float *v, size_t ldv, size_t n, size_t hd, float *o,
                   size_t ldo) {
    ork_attn_pv_cols(p, ldp, R, v, ldv, n, 0, hd, o, ldo);
}

const ork_attn_kernels ork_attn_kernels_ref = {"scalar", pv_ref};
