/* quant_scalar.h - per-element scalar definitions shared by quant_ref.c and
 * the scalar tails of the SIMD files, so a tail can never drift from the
 * oracle. Private to the quant module. All files are compiled with
 * -ffp-contract=off: no multiply-add is ever fused. */
#ifndef ORK_QUANT_SCALAR_H
#define ORK_QUANT_SCALAR_H

#include <math.h>

#include "quant.h"

static inline int ork_q4_nearest(float y, const ork_q4_grid *g) {
    int c = 0;
    for (int i = 0; i < g->nlev - 1; i++) c += (y > g->thr[i]);
    return c;
}

static inline float ork_sr_uniform(uint32_t row_key, uint32_t col) {
    return (float)(ork_sr_hash(row_key, col) >> 8) * ORK_SR_UNIT;
}

static inline int ork_q4_sr(float y, const ork_q4_grid *g, uint32_t row_key, uint32_t col) {
    int i = 0; /* lo = lev[i]: the largest level <= y, or lev[0] */
    for (int j = 1; j < g->nlev; j++) i += (y >= g->lev[j]);
    if (i == g->nlev - 1) return i;
    float lo = g->lev[i], hi = g->lev[i + 1];
    float p = (y - lo) / (hi - lo);
    return i + (ork_sr_uniform(row_key, col) < p);
}

/* round half away from zero, exactly (no y+0.5 trick, which misrounds
 * 0.49999997f) */
static inline float ork_round_half_away(float y) {
    float t = truncf(y);
    float f = y - t; /* exact */
    if (f >= 0.5f) t += 1.0f;
    else if (f <= -0.5f) t -= 1.0f;
    return t;
}

static inline float ork_clamp_lim(float v, float lim) {
    return v > lim ? lim : (v < -lim ? -lim : v);
}

static inline float ork_clamp127(float v) { return ork_clamp_lim(v, 127.0f); }

static inline float ork_q8_sr(float y, float lim, uint32_t row_key, uint32_t col) {
    y = ork_clamp_lim(y, lim);
    float lo = floorf(y);
    float p = y - lo; /* exact */
    return lo + (ork_sr_uniform(row_key, col) < p ? 1.0f : 0.0f);
}

/* one term of the weighted error, added to lane acc[k & 3] */
static inline double ork_werr_term(float x, float q, float im) {
    float d = x - q;
    double dd = (double)d;
    double sq = dd * dd;
    return (double)im * sq;
}

/* scalar loops over [k, n), shared by the oracle and the SIMD tails */
static inline void ork_dequant4_range(const uint8_t *packed, size_t k, size_t n, const int8_t lut[16],
                                      float s, float *out) {
    for (; k < n; k++) {
        uint8_t b = packed[k >> 1];
        int c = (k & 1) ? (b >> 4) : (b & 15);
        out[k] = (float)lut[c] * s;
    }
}

static inline void ork_werr4_range(double acc[4], const float *x, const float *im, size_t k, size_t n,
                                   float inv, float s, const ork_q4_grid *g) {
    for (; k < n; k++) {
        float q = g->lev[ork_q4_nearest(x[k] * inv, g)] * s;
        acc[k & 3] += ork_werr_term(x[k], q, im[k]);
    }
}

static inline void ork_werr8_range(double acc[4], const float *x, const float *im, size_t k, size_t n,
                                   float inv, float s, float lim) {
    for (; k < n; k++) {
        float q = ork_clamp_lim(ork_round_half_away(x[k] * inv), lim) * s;
        acc[k & 3] += ork_werr_term(x[k], q, im[k]);
    }
}

static inline double ork_lanes_sum(const double acc[4]) { return (acc[0] + acc[1]) + (acc[2] + acc[3]); }

#endif
