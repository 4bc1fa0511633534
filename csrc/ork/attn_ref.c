/* attn_ref.c - the scalar oracle of the attention loops (attn.h): the
 * contract written out, one key and one output at a time. */
#include "attn.h"

#include "linear.h" /* ork_dot8 */

static void scores_ref(const float *q, const float *k, size_t ldk, size_t n, size_t hd, float scale, float *s) {
    for (size_t u = 0; u < n; u++) s[u] = ork_dot8(q, k + u * ldk, hd) * scale;
}

static void pv_ref(const float *p, const float *v, size_t ldv, size_t n, size_t hd, float *o) {
    ork_attn_pv_cols(p, v, ldv, n, 0, hd, o);
}

const ork_attn_kernels ork_attn_kernels_ref = {"scalar", scores_ref, pv_ref};
