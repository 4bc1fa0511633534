/* quant_scalar.h - per-element scalar definitions shared by quant_ref.c and
 * the scalar tails of the SIMD files, so a tail can never drift from the
 * oracle. Private to the quant module. All files are compiled with
 * -ffp-contract=off: no multiply-add is ever fused. */
#ifndef ORK_QUANT_SCALAR_H
#define ORK_QUANT_SCALAR_H

#include <math.h>
#include <stddef.h>
#include <string.h>

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

/* Two doubles as one value (GNU C vector extension): each operation is the IEEE operation of each
 * lane, so a two-lane loop computes what two scalar loops do, bit for bit (-ffp-contract=off: no
 * fused multiply-add). The screen keeps its (sum im, sum im * x) pairs and two grid ratios in them. */
typedef double ork_v2d __attribute__((vector_size(16)));

static inline ork_v2d ork_v2_load(const double *p) {
    ork_v2d v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void ork_v2_store(double *p, ork_v2d v) { memcpy(p, &v, sizeof v); }

/* The screen's prefix sums (quant.h): the bins below i, (sum im, sum im * x) as a pair.
 * Bins come in blocks of ORK_SCREEN_BLOCK: run[] (pairs) holds each block's running sums, off[] (pairs)
 * the sums of every block before it; both have a zero pair before their first (run[-2..-1],
 * off[-2..-1]), which is the sum below bin 0: 0 + 0, with no branch. */
static inline ork_v2d ork_screen_prefix(const double *run, const double *off, ptrdiff_t i) {
    const ptrdiff_t q = (i + ORK_SCREEN_BLOCK - 1) / ORK_SCREEN_BLOCK - 1; /* (i - 1) / BLOCK; -1 for i = 0 */
    return ork_v2_load(off + 2 * q) + ork_v2_load(run + 2 * (i - 1));
}

/* The boundary of threshold value v (quant.h): trunc(v) clamped to [0, B], NaN (a NaN grid
 * ratio) to 0; the clamps come first, so the truncation always fits. */
static inline ptrdiff_t ork_screen_bound(double v, double B) {
    v = v > 0.0 ? v : 0.0;
    v = v < B ? v : B;
    return (ptrdiff_t)(int32_t)v;
}

/* The screen's estimates of two 4-bit candidates (the two-lane form of ork_screen_est1) (lane 0: s[0], inv[0]; lane 1: s[1], inv[1]), less
 * the candidate-independent sum of im * x^2 (quant.h "screened clip search"): level c owns the bins
 * between the boundaries of thresholds c-1 and c (the bin edge nearest thr[c] / inv),
 * L = lev[c] * s, and adds L*L*S0 - 2*L*S1 of those bins. inv = 0 (a float16 scale that rounds to
 * 0: every value decodes to 0) estimates 0. Each lane is the one-candidate computation. */
static inline void ork_screen_est2(const ork_q4_grid *g, const double *run, const double *off, const float s[2],
                         const float inv[2], double ra, size_t B, double e_out[2]) {
    const double h = (double)(B / 2);
    /* inv = 0: a placeholder k (its lane's estimate is replaced by 0 below) */
    const ork_v2d k = {inv[0] != 0.0f ? ra / (double)inv[0] : 1.0, inv[1] != 0.0f ? ra / (double)inv[1] : 1.0};
    const ork_v2d sv = {(double)s[0], (double)s[1]};
    ork_v2d e = {0.0, 0.0}, p0 = {0.0, 0.0}, p1 = {0.0, 0.0}; /* p0: sum im below, p1: sum im * x below */
    for (int c = 0; c < g->nlev; c++) {
        ork_v2d q0 = {0.0, 0.0}, q1 = {0.0, 0.0};
        if (c + 1 < g->nlev) {
            /* ascending thresholds, k > 0 and monotone rounding: the boundaries ascend */
            const ork_v2d v = ((double)g->thr[c] * k + 1.0) * h + 0.5;
            const ork_v2d qa = ork_screen_prefix(run, off, ork_screen_bound(v[0], (double)B));
            const ork_v2d qb = ork_screen_prefix(run, off, ork_screen_bound(v[1], (double)B));
            q0 = (ork_v2d){qa[0], qb[0]};
            q1 = (ork_v2d){qa[1], qb[1]};
        } else {
            const ork_v2d qt = ork_screen_prefix(run, off, (ptrdiff_t)B);
            q0 = (ork_v2d){qt[0], qt[0]};
            q1 = (ork_v2d){qt[1], qt[1]};
        }
        const ork_v2d L = (double)g->lev[c] * sv;
        e += L * L * (q0 - p0) - 2.0 * L * (q1 - p1);
        p0 = q0;
        p1 = q1;
    }
    e_out[0] = inv[0] == 0.0f ? 0.0 : e[0];
    e_out[1] = inv[1] == 0.0f ? 0.0 : e[1];
}

/* The screen's estimate of one 4-bit candidate (s, inv), less the candidate-independent sum of
 * im * x^2 (quant.h "screened clip search"): the oracle every ISA's screen_est reproduces bit for bit.
 * Level c owns the bins between the boundaries of thresholds c-1 and c (the bin edge nearest
 * thr[c] / inv), L = lev[c] * s, and adds L*L*S0 - 2*L*S1 of those bins; inv = 0 (a float16 scale
 * that rounds to 0: every value decodes to 0) estimates 0. */
static inline double ork_screen_est1(const ork_q4_grid *g, const double *run, const double *off, float s, float inv,
                                     double ra, size_t B) {
    if (inv == 0.0f) return 0.0;
    const double h = (double)(B / 2), k = ra / (double)inv;
    double e = 0.0, p0 = 0.0, p1 = 0.0;
    for (int c = 0; c < g->nlev; c++) {
        const ptrdiff_t i = c + 1 < g->nlev ? ork_screen_bound(((double)g->thr[c] * k + 1.0) * h + 0.5, (double)B)
                                            : (ptrdiff_t)B;
        const ptrdiff_t q = (i + ORK_SCREEN_BLOCK - 1) / ORK_SCREEN_BLOCK - 1;
        const double q0 = off[2 * q] + run[2 * (i - 1)], q1 = off[2 * q + 1] + run[2 * (i - 1) + 1];
        const double L = (double)g->lev[c] * (double)s;
        e += L * L * (q0 - p0) - 2.0 * L * (q1 - p1);
        p0 = q0;
        p1 = q1;
    }
    return e;
}

/* screen_bins (quant.h), one value at a time: the oracle and every table's scalar tail */
static inline void ork_screen_bins_range(const float *x, size_t k, size_t n, double ra, double h, int32_t B,
                                         int32_t *bi) {
    for (; k < n; k++) { /* |x| <= a: v in (-1, B + 1), truncated then clamped */
        int32_t b = (int32_t)(((double)x[k] * ra + 1.0) * h);
        b = b < B - 1 ? b : B - 1;
        bi[k] = b > 0 ? b : 0;
    }
}

static inline void ork_screen_bins_c(const float *x, size_t n, double ra, double h, int32_t B, int32_t *bi) {
    ork_screen_bins_range(x, 0, n, ra, h, B, bi);
}

/* screen_est by ork_screen_est2, two candidates per pass (an odd last one paired with itself) */
static inline void ork_screen_est_pairs(const ork_q4_grid *g, const double *run, const double *off, const float *s,
                                        const float *inv, size_t nc, double ra, size_t B, double *est) {
    for (size_t t = 0; t < nc; t += 2) {
        const size_t u = t + 1 < nc ? t + 1 : t;
        const float s2[2] = {s[t], s[u]}, i2[2] = {inv[t], inv[u]};
        double e2[2];
        ork_screen_est2(g, run, off, s2, i2, ra, B, e2);
        est[t] = e2[0];
        if (u != t) est[u] = e2[1];
    }
}

#endif
