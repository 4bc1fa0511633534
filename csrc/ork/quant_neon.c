/* quant_neon.c - aarch64 NEON variants of the quant kernels, bit-identical to
 * quant_ref.c. The codebook inflate uses vqtbl1q_s8. Tested under
 * qemu-aarch64 by tests/test_c_kernels.py (tests/c/test_quant.c). Compiled
 * with -ffp-contract=off: aarch64 compilers otherwise fuse x - q*s. */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "quant_scalar.h"

static int absmax_neon(const float *x, size_t n, float *amax) {
    const float32x4_t fmax = vdupq_n_f32(3.40282347e+38f);
    float32x4_t m = vdupq_n_f32(0.0f);
    uint32x4_t bad = vdupq_n_u32(0);
    size_t k = 0;
    for (; k + 4 <= n; k += 4) {
        float32x4_t a = vabsq_f32(vld1q_f32(x + k));
        bad = vorrq_u32(bad, vmvnq_u32(vcleq_f32(a, fmax))); /* NaN or > max */
        m = vmaxq_f32(m, a);
    }
    float r = vmaxvq_f32(m);
    int isbad = vmaxvq_u32(bad) != 0;
    for (; k < n; k++) {
        float a = fabsf(x[k]);
        if (!(a <= 3.40282347e+38f)) isbad = 1;
        if (a > r) r = a;
    }
    *amax = r;
    return isbad;
}

static inline uint8x16_t narrow16_u8(uint32x4_t a, uint32x4_t b, uint32x4_t c, uint32x4_t d) {
    uint16x8_t ab = vcombine_u16(vmovn_u32(a), vmovn_u32(b));
    uint16x8_t cd = vcombine_u16(vmovn_u32(c), vmovn_u32(d));
    return vcombine_u8(vmovn_u16(ab), vmovn_u16(cd));
}

static inline uint32x4_t nearest4_neon(float32x4_t y, const ork_q4_grid *g) {
    uint32x4_t c = vdupq_n_u32(0);
    for (int i = 0; i < g->nlev - 1; i++) c = vsubq_u32(c, vcgtq_f32(y, vdupq_n_f32(g->thr[i])));
    return c;
}

static void codes4_rtn_neon(const float *x, size_t n, float inv, const ork_q4_grid *g,
                            uint8_t *codes) {
    const float32x4_t vinv = vdupq_n_f32(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        uint32x4_t c[4];
        for (int j = 0; j < 4; j++) c[j] = nearest4_neon(vmulq_f32(vld1q_f32(x + k + 4 * j), vinv), g);
        vst1q_u8(codes + k, narrow16_u8(c[0], c[1], c[2], c[3]));
    }
    for (; k < n; k++) codes[k] = (uint8_t)ork_q4_nearest(x[k] * inv, g);
}

static inline float32x4_t uniform_neon(uint32_t row_key, uint32_t col) {
    static const uint32_t lane_init[4] = {0, 1, 2, 3};
    uint32x4_t c = vaddq_u32(vdupq_n_u32(col), vld1q_u32(lane_init));
    uint32x4_t h = vaddq_u32(vdupq_n_u32(row_key), vmulq_n_u32(c, 0x9e3779b1U));
    h = veorq_u32(h, vshrq_n_u32(h, 16));
    h = vmulq_n_u32(h, 0x7feb352dU);
    h = veorq_u32(h, vshrq_n_u32(h, 15));
    h = vmulq_n_u32(h, 0x846ca68bU);
    h = veorq_u32(h, vshrq_n_u32(h, 16));
    return vmulq_n_f32(vcvtq_f32_u32(vshrq_n_u32(h, 8)), ORK_SR_UNIT);
}

static inline uint32x4_t sr4_neon(float32x4_t y, const ork_q4_grid *g, uint32_t row_key,
                                  uint32_t col) {
    const int top = g->nlev - 1;
    float32x4_t lo = vdupq_n_f32(g->lev[0]);
    float32x4_t hi = vdupq_n_f32(g->lev[1]);
    uint32x4_t idx = vdupq_n_u32(0);
    for (int j = 1; j < g->nlev; j++) {
        uint32x4_t m = vcgeq_f32(y, vdupq_n_f32(g->lev[j]));
        lo = vbslq_f32(m, vdupq_n_f32(g->lev[j]), lo);
        hi = vbslq_f32(m, vdupq_n_f32(g->lev[j < top ? j + 1 : j]), hi);
        idx = vsubq_u32(idx, m);
    }
    float32x4_t p = vdivq_f32(vsubq_f32(y, lo), vsubq_f32(hi, lo));
    uint32x4_t up = vcltq_f32(uniform_neon(row_key, col), p);
    uint32x4_t attop = vceqq_u32(idx, vdupq_n_u32((uint32_t)top));
    return vsubq_u32(idx, vbicq_u32(up, attop));
}

static void codes4_sr_neon(const float *x, size_t n, float inv, const ork_q4_grid *g,
                           uint32_t row_key, uint32_t col0, uint8_t *codes) {
    const float32x4_t vinv = vdupq_n_f32(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        uint32x4_t c[4];
        for (int j = 0; j < 4; j++)
            c[j] = sr4_neon(vmulq_f32(vld1q_f32(x + k + 4 * j), vinv), g, row_key,
                            col0 + (uint32_t)(k + 4 * j));
        vst1q_u8(codes + k, narrow16_u8(c[0], c[1], c[2], c[3]));
    }
    for (; k < n; k++) codes[k] = (uint8_t)ork_q4_sr(x[k] * inv, g, row_key, col0 + (uint32_t)k);
}

/* lanes: a01 holds acc[0], acc[1]; a23 holds acc[2], acc[3] */
static inline void werr_acc4(float64x2_t *a01, float64x2_t *a23, float32x4_t x, float32x4_t q,
                             const float *im) {
    float32x4_t d = vsubq_f32(x, q);
    float32x4_t vim = vld1q_f32(im);
    float64x2_t d0 = vcvt_f64_f32(vget_low_f32(d)), d1 = vcvt_high_f64_f32(d);
    float64x2_t i0 = vcvt_f64_f32(vget_low_f32(vim)), i1 = vcvt_high_f64_f32(vim);
    *a01 = vaddq_f64(*a01, vmulq_f64(i0, vmulq_f64(d0, d0)));
    *a23 = vaddq_f64(*a23, vmulq_f64(i1, vmulq_f64(d1, d1)));
}

static double werr4_neon(const float *x, const float *im, size_t n, float inv, float s,
                         const ork_q4_grid *g) {
    const float32x4_t vinv = vdupq_n_f32(inv);
    float64x2_t a01 = vdupq_n_f64(0.0), a23 = vdupq_n_f64(0.0);
    size_t k = 0;
    for (; k + 4 <= n; k += 4) {
        float32x4_t vx = vld1q_f32(x + k);
        float32x4_t y = vmulq_f32(vx, vinv);
        float32x4_t lev = vdupq_n_f32(g->lev[0]);
        for (int i = 0; i < g->nlev - 1; i++)
            lev = vbslq_f32(vcgtq_f32(y, vdupq_n_f32(g->thr[i])), vdupq_n_f32(g->lev[i + 1]), lev);
        werr_acc4(&a01, &a23, vx, vmulq_n_f32(lev, s), im + k);
    }
    double a[4];
    vst1q_f64(a, a01);
    vst1q_f64(a + 2, a23);
    ork_werr4_range(a, x, im, k, n, inv, s, g);
    return ork_lanes_sum(a);
}

static inline float32x4_t round_half_away_neon(float32x4_t y) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    float32x4_t t = vrndq_f32(y); /* toward zero */
    float32x4_t f = vsubq_f32(y, t);
    uint32x4_t ge = vcgeq_f32(f, vdupq_n_f32(0.5f));
    uint32x4_t le = vcleq_f32(f, vdupq_n_f32(-0.5f));
    t = vaddq_f32(t, vreinterpretq_f32_u32(vandq_u32(ge, vreinterpretq_u32_f32(one))));
    t = vsubq_f32(t, vreinterpretq_f32_u32(vandq_u32(le, vreinterpretq_u32_f32(one))));
    return t;
}
static inline float32x4_t clamp_neon(float32x4_t v, float lim) {
    return vminq_f32(vmaxq_f32(v, vdupq_n_f32(-lim)), vdupq_n_f32(lim));
}
static inline int8x16_t narrow16_s8(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    int16x8_t ab = vcombine_s16(vmovn_s32(vcvtq_s32_f32(a)), vmovn_s32(vcvtq_s32_f32(b)));
    int16x8_t cd = vcombine_s16(vmovn_s32(vcvtq_s32_f32(c)), vmovn_s32(vcvtq_s32_f32(d)));
    return vcombine_s8(vmovn_s16(ab), vmovn_s16(cd));
}

static void codes8_rtn_neon(const float *x, size_t n, float inv, float lim, int8_t *codes) {
    const float32x4_t vinv = vdupq_n_f32(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        float32x4_t q[4];
        for (int j = 0; j < 4; j++)
            q[j] = clamp_neon(round_half_away_neon(vmulq_f32(vld1q_f32(x + k + 4 * j), vinv)), lim);
        vst1q_s8(codes + k, narrow16_s8(q[0], q[1], q[2], q[3]));
    }
    for (; k < n; k++) codes[k] = (int8_t)ork_clamp_lim(ork_round_half_away(x[k] * inv), lim);
}

static void codes8_sr_neon(const float *x, size_t n, float inv, float lim, uint32_t row_key, uint32_t col0,
                           int8_t *codes) {
    const float32x4_t vinv = vdupq_n_f32(inv);
    const uint32x4_t one = vreinterpretq_u32_f32(vdupq_n_f32(1.0f));
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        float32x4_t q[4];
        for (int j = 0; j < 4; j++) {
            float32x4_t y = clamp_neon(vmulq_f32(vld1q_f32(x + k + 4 * j), vinv), lim);
            float32x4_t lo = vrndmq_f32(y);
            float32x4_t p = vsubq_f32(y, lo);
            uint32x4_t up = vcltq_f32(uniform_neon(row_key, col0 + (uint32_t)(k + 4 * j)), p);
            q[j] = vaddq_f32(lo, vreinterpretq_f32_u32(vandq_u32(up, one)));
        }
        vst1q_s8(codes + k, narrow16_s8(q[0], q[1], q[2], q[3]));
    }
    for (; k < n; k++) codes[k] = (int8_t)ork_q8_sr(x[k] * inv, lim, row_key, col0 + (uint32_t)k);
}

static double werr8_neon(const float *x, const float *im, size_t n, float inv, float s, float lim) {
    const float32x4_t vinv = vdupq_n_f32(inv);
    float64x2_t a01 = vdupq_n_f64(0.0), a23 = vdupq_n_f64(0.0);
    size_t k = 0;
    for (; k + 4 <= n; k += 4) {
        float32x4_t vx = vld1q_f32(x + k);
        float32x4_t q = clamp_neon(round_half_away_neon(vmulq_f32(vx, vinv)), lim);
        werr_acc4(&a01, &a23, vx, vmulq_n_f32(q, s), im + k);
    }
    double a[4];
    vst1q_f64(a, a01);
    vst1q_f64(a + 2, a23);
    ork_werr8_range(a, x, im, k, n, inv, s, lim);
    return ork_lanes_sum(a);
}

static inline void store16_scaled(float *out, int8x16_t v, float s) {
    int16x8_t l = vmovl_s8(vget_low_s8(v)), h = vmovl_high_s8(v);
    vst1q_f32(out + 0, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))), s));
    vst1q_f32(out + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(l)), s));
    vst1q_f32(out + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), s));
    vst1q_f32(out + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(h)), s));
}

static void dequant4_neon(const uint8_t *packed, size_t n, const int8_t lut[16], float s,
                          float *out) {
    const int8x16_t tbl = vld1q_s8(lut);
    const uint8x16_t lo4 = vdupq_n_u8(0x0F);
    size_t k = 0;
    for (; k + 32 <= n; k += 32) {
        uint8x16_t b = vld1q_u8(packed + (k >> 1));
        int8x16_t vlo = vqtbl1q_s8(tbl, vandq_u8(b, lo4));
        int8x16_t vhi = vqtbl1q_s8(tbl, vshrq_n_u8(b, 4));
        store16_scaled(out + k, vzip1q_s8(vlo, vhi), s);
        store16_scaled(out + k + 16, vzip2q_s8(vlo, vhi), s);
    }
    ork_dequant4_range(packed, k, n, lut, s, out);
}

static void dequant8_neon(const int8_t *codes, size_t n, float s, float *out) {
    size_t k = 0;
    for (; k + 16 <= n; k += 16) store16_scaled(out + k, vld1q_s8(codes + k), s);
    for (; k < n; k++) out[k] = (float)codes[k] * s;
}

/* batch forms: one candidate at a time (the single-candidate kernels, so bit for bit theirs) */
static void werr4n_neon(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                        const ork_q4_grid *g, double *err) {
    for (int c = 0; c < nc; c++) err[c] = werr4_neon(x, im, n, inv[c], s[c], g);
}

static void werr8n_neon(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                        float lim, double *err) {
    for (int c = 0; c < nc; c++) err[c] = werr8_neon(x, im, n, inv[c], s[c], lim);
}

const ork_quant_kernels ork_quant_kernels_neon = {
    "neon",          absmax_neon,    codes4_rtn_neon, codes4_sr_neon, werr4_neon,
    codes8_rtn_neon, codes8_sr_neon, werr8_neon,      werr4n_neon,    werr8n_neon,
    dequant4_neon,   dequant8_neon,   ork_screen_est_pairs, ork_screen_bins_c,
};
#endif

/* keeps the translation unit non-empty on other architectures */
typedef int ork_quant_neon_tu_nonempty;
