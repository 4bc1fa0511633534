/* quant_ref.c - scalar reference kernels: the oracle for every SIMD variant.
 * The arithmetic of each element is defined once, in quant_scalar.h. */
#include "quant_scalar.h"

static int absmax_ref(const float *x, size_t n, float *amax) {
    float m = 0.0f;
    int bad = 0;
    for (size_t k = 0; k < n; k++) {
        float a = fabsf(x[k]);
        if (!(a <= 3.40282347e+38f)) bad = 1; /* NaN or Inf */
        if (a > m) m = a;
    }
    *amax = m;
    return bad;
}

static void codes4_rtn_ref(const float *x, size_t n, float inv, const ork_q4_grid *g,
                           uint8_t *codes) {
    for (size_t k = 0; k < n; k++) codes[k] = (uint8_t)ork_q4_nearest(x[k] * inv, g);
}

static void codes4_sr_ref(const float *x, size_t n, float inv, const ork_q4_grid *g,
                          uint32_t row_key, uint32_t col0, uint8_t *codes) {
    for (size_t k = 0; k < n; k++)
        codes[k] = (uint8_t)ork_q4_sr(x[k] * inv, g, row_key, col0 + (uint32_t)k);
}

static double werr4_ref(const float *x, const float *im, size_t n, float inv, float s,
                        const ork_q4_grid *g) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    ork_werr4_range(acc, x, im, 0, n, inv, s, g);
    return ork_lanes_sum(acc);
}

static void werr4n_ref(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                       const ork_q4_grid *g, double *err) {
    for (int c = 0; c < nc; c++) err[c] = werr4_ref(x, im, n, inv[c], s[c], g);
}

static void codes8_rtn_ref(const float *x, size_t n, float inv, float lim, int8_t *codes) {
    for (size_t k = 0; k < n; k++) codes[k] = (int8_t)ork_clamp_lim(ork_round_half_away(x[k] * inv), lim);
}

static void codes8_sr_ref(const float *x, size_t n, float inv, float lim, uint32_t row_key, uint32_t col0,
                          int8_t *codes) {
    for (size_t k = 0; k < n; k++)
        codes[k] = (int8_t)ork_q8_sr(x[k] * inv, lim, row_key, col0 + (uint32_t)k);
}

static double werr8_ref(const float *x, const float *im, size_t n, float inv, float s, float lim) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    ork_werr8_range(acc, x, im, 0, n, inv, s, lim);
    return ork_lanes_sum(acc);
}

static void werr8n_ref(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                       float lim, double *err) {
    for (int c = 0; c < nc; c++) err[c] = werr8_ref(x, im, n, inv[c], s[c], lim);
}

static void dequant4_ref(const uint8_t *packed, size_t n, const int8_t lut[16], float s,
                         float *out) {
    ork_dequant4_range(packed, 0, n, lut, s, out);
}

static void dequant8_ref(const int8_t *codes, size_t n, float s, float *out) {
    for (size_t k = 0; k < n; k++) out[k] = (float)codes[k] * s;
}

static void screen_est_ref(const ork_q4_grid *g, const double *run, const double *off, const float *s,
                           const float *inv, size_t nc, double ra, size_t B, double *est) {
    for (size_t c = 0; c < nc; c++) est[c] = ork_screen_est1(g, run, off, s[c], inv[c], ra, B);
}

const ork_quant_kernels ork_quant_kernels_ref = {
    "scalar",       absmax_ref,    codes4_rtn_ref, codes4_sr_ref, werr4_ref,
    codes8_rtn_ref, codes8_sr_ref, werr8_ref,      werr4n_ref,    werr8n_ref,
    dequant4_ref,   dequant8_ref,   screen_est_ref, ork_screen_bins_c,
};

/* The quantizer's table choice: the ISA's table; under AVX2 the one with AVX-512 error kernels where
 * the CPU has AVX-512 F/VL/BW/DQ and ORKPY_NO_AVX512 is not set (ork_cpu_use_avx512). */
const ork_quant_kernels *ork_quant_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_quant_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return ork_cpu_use_avx512() ? &ork_quant_kernels_avx512 : &ork_quant_kernels_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return &ork_quant_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_quant_kernels *ork_quant_kernels_active(void) { return ork_quant_kernels_for(ork_cpu_isa()); }
