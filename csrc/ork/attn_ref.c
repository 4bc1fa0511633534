/* attn_ref.c - the scalar oracle of the attention value sums (attn.h): the
 * contract written out, one output / score at a time (fmaf: one rounding per term). */
#include "attn.h"

static void pv_ref(const float *p, size_t ldp, size_t R, const float *v, size_t ldv, size_t n, size_t hd, float *o,
                   size_t ldo) {
    ork_attn_pv_cols(p, ldp, R, v, ldv, n, 0, hd, o, ldo);
}

static void softmax_ref(float *s, size_t n, float scale, float cap) {
    ork_attn_scale_cap(s, 0, n, scale, cap);
    float mx = -INFINITY;
    for (size_t u = 0; u < n; u++)
        if (s[u] > mx) mx = s[u];
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t u = 0; u < n; u++) {
        s[u] = ork_attn_expf(s[u] - mx);
        lane[u & 7] += s[u];
    }
    const float inv = (float)(1.0 / ork_attn_lane_sum(lane));
    for (size_t u = 0; u < n; u++) s[u] *= inv;
}

const ork_attn_kernels ork_attn_kernels_ref = {"scalar", pv_ref, softmax_ref};

/* The attention family's table choice: the ISA's table. */
const ork_attn_kernels *ork_attn_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_attn_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return &ork_attn_kernels_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return &ork_attn_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_attn_kernels *ork_attn_kernels_active(void) { return ork_attn_kernels_for(ork_cpu_isa()); }
