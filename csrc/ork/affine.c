/* affine.c - affine int4 groups (affine.h): the search, the quantizer and the offsets' term. */
#include "affine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "pool.h"
#include "quant_scalar.h"

ork_status ork_affine_check(ork_kind kind, size_t K, size_t group, ork_err *err) {
    const ork_kind_info *info = ork_kind_get(kind);
    if (!info) return ork_kind_check(kind, err);
    if (info->bits != 8 || info->qmax != ORK_AFFINE_QMAX)
        return ork_err_set(err, ORK_EINVAL, "affine groups (offsets) are for the NPU's int4 kinds (w4a4, w4a8), not '%s'",
                           info->name);
    ork_status st = ork_group_check(group, err);
    if (st) return st;
    if (group == 0 || group >= K)
        return ork_err_set(err, ORK_EINVAL, "affine groups (offsets) need group-wise scales: a group size below K = %zu "
                           "(got %zu)", K, group);
    return ORK_OK;
}

float ork_affine_code(float x, float inv, float offset) {
    const float d = x - offset;
    const float c = ork_round_half_away(d * inv);
    return c > (float)ORK_AFFINE_QMAX ? (float)ORK_AFFINE_QMAX : (c < (float)ORK_AFFINE_QMIN ? (float)ORK_AFFINE_QMIN : c);
}

/* a float16 value of v, or -1 when it overflows float16 */
static int f16_of(float v, float *out) {
    const uint16_t h = ork_f16_from_f32(v);
    if ((h & 0x7c00u) == 0x7c00u) return -1;
    *out = ork_f16_to_f32(h);
    return 0;
}

ork_status ork_quant_segment_affine(const float *x, const float *im, size_t n, size_t row, size_t col0, size_t group,
                                    float *scale, float *inv, float *offset, ork_err *err) {
    float lo = 0.0f, hi = 0.0f;
    for (size_t k = 0; k < n; k++) {
        if (!isfinite(x[k]))
            return ork_err_set(err, ORK_ENONFINITE, "weight has a non-finite value (%s) at [%zu, %zu]",
                               isnan(x[k]) ? "NaN" : "Inf", row, col0 + k);
        if (k == 0 || x[k] < lo) lo = x[k];
        if (k == 0 || x[k] > hi) hi = x[k];
    }
    double best = INFINITY;
    float bs = 0.0f, bi = 0.0f, bo = 0.0f;
    for (int t = 0; t < ORK_AFFINE_GRID_N; t++) {
        const float r = 1.0f - (float)t / 40.0f;
        const float a = lo * r, b = hi * r;
        float s, o;
        if (f16_of((b - a) / 15.0f, &s) || f16_of(a + 8.0f * s, &o))
            return ork_err_set(err, ORK_EINVAL, "weight row %zu, group %zu (columns %zu..%zu) spans [%g, %g]: its "
                               "affine scale or offset exceeds %g, the largest float16", row, group ? col0 / group : 0,
                               col0, col0 + n - 1, (double)lo, (double)hi, (double)ORK_F16_MAX);
        const float iv = s > 0.0f ? 1.0f / s : 0.0f;
        double e = 0.0;
        for (size_t k = 0; k < n; k++) {
            const float c = ork_affine_code(x[k], iv, o);
            const float p = c * s;
            const float v = p + o;
            const float d = v - x[k];
            const double dd = (double)d;
            e += (im ? (double)im[k] : 1.0) * (dd * dd);
        }
        if (e < best) {
            best = e;
            bs = s;
            bi = iv;
            bo = o;
        }
        if (lo == hi) break; /* a constant segment: every ratio's candidate is as good as r = 1's */
    }
    *scale = bs;
    *inv = bi;
    *offset = bo;
    return ORK_OK;
}

typedef struct {
    const float *w;
    size_t K, gs, G;
    const float *im;
    int8_t *codes;
    float *scales, *offsets;
} affine_job;

static ork_status affine_rows(void *ctx, size_t begin, size_t end, ork_err *err) {
    const affine_job *j = (const affine_job *)ctx;
    for (size_t n = begin; n < end; n++) {
        const float *x = j->w + n * j->K;
        for (size_t g = 0; g < j->G; g++) {
            const size_t c0 = g * j->gs, len = j->K - c0 < j->gs ? j->K - c0 : j->gs;
            float s, iv, o;
            ork_status st = ork_quant_segment_affine(x + c0, j->im ? j->im + c0 : NULL, len, n, c0, j->gs, &s, &iv, &o,
                                                     err);
            if (st) return st;
            j->scales[n * j->G + g] = s;
            j->offsets[n * j->G + g] = o;
            for (size_t k = 0; k < len; k++) j->codes[n * j->K + c0 + k] = (int8_t)ork_affine_code(x[c0 + k], iv, o);
        }
    }
    return ORK_OK;
}

ork_status ork_quantize_affine(const float *w, size_t N, size_t K, const ork_quant_params *p, int8_t *codes,
                               float *scales, float *offsets, ork_err *err) {
    if (!p || !w || !codes || !scales || !offsets) return ork_err_set(err, ORK_EINVAL, "quantize_affine: NULL argument");
    if (N == 0 || K == 0 || K >= ORK_QUANT_MAX_DIM || N >= ORK_QUANT_MAX_DIM)
        return ork_err_set(err, ORK_EINVAL, "weight shape (%zu, %zu) must be non-empty and below 2^31 per dimension", N, K);
    ork_status st = ork_affine_check(p->kind, K, p->group, err);
    if (st) return st;
    if (p->sr) return ork_err_set(err, ORK_EINVAL, "affine groups round to nearest (no stochastic rounding)");
    if (p->imatrix)
        for (size_t k = 0; k < K; k++) {
            const float v = p->imatrix[k];
            if (!isfinite(v))
                return ork_err_set(err, ORK_ENONFINITE, "imatrix has a non-finite value (%s) at [%zu]",
                                   isnan(v) ? "NaN" : "Inf", k);
            if (v < 0.0f) return ork_err_set(err, ORK_EINVAL, "imatrix has a negative value (%g) at [%zu]", (double)v, k);
        }
    affine_job j = {w, K, p->group, ork_group_count(K, p->group), p->imatrix, codes, scales, offsets};
    const int nt = ork_pool_threads_for(p->nthreads, (double)N * (double)K * ORK_AFFINE_GRID_N, 1 << 18);
    return ork_parallel_for(nt, N, 65536 / K + 1, affine_rows, &j, err);
}

ork_status ork_affine_check_offsets(const float *offsets, size_t N, size_t G, ork_status code, ork_err *err) {
    for (size_t i = 0; i < N * G; i++) {
        const float v = offsets[i];
        float h;
        if (!isfinite(v) || f16_of(v, &h) || memcmp(&h, &v, sizeof h) != 0)
            return ork_err_set(err, code, "offset [%zu, %zu] = %g is not a finite float16 value", i / G, i % G,
                               (double)v);
    }
    return ORK_OK;
}

typedef struct {
    const float *o, *u; /* offsets (N, G); u (M, G) */
    size_t N, G, M;
    float *y;
} off_job;

static ork_status off_cols(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    const off_job *j = (const off_job *)ctx;
    for (size_t m = 0; m < j->M; m++) {
        const float *u = j->u + m * j->G;
        float *yr = j->y + m * j->N;
        for (size_t n = begin; n < end; n++) {
            const float *o = j->o + n * j->G;
            float acc = u[0] * o[0];
            for (size_t i = 1; i < j->G; i++) {
                const float t = u[i] * o[i];
                acc = acc + t;
            }
            yr[n] = yr[n] + acc;
        }
    }
    return ORK_OK;
}

ork_status ork_matmul_add_offsets(const float *offsets, size_t group, size_t N, size_t K, const int8_t *xq, size_t ldq,
                                  const float *ascale, int act_groups, size_t M, float *y, int nthreads, ork_err *err) {
    if (!offsets || !xq || !ascale || !y || group == 0 || ldq < K)
        return ork_err_set(err, ORK_EINVAL, "matmul_add_offsets: bad argument");
    const size_t G = ork_group_count(K, group);
    float *u = (float *)malloc(M * G * sizeof(float));
    if (!u) return ork_err_set(err, ORK_ENOMEM, "out of memory for the offsets' activation sums (%zu x %zu)", M, G);
    for (size_t m = 0; m < M; m++)
        for (size_t i = 0; i < G; i++) {
            const size_t c0 = i * group, c1 = K - c0 < group ? K : c0 + group;
            int32_t s = 0;
            for (size_t k = c0; k < c1; k++) s += xq[m * ldq + k];
            const float a = ascale[act_groups ? i * M + m : m];
            u[m * G + i] = a * (float)s;
        }
    off_job j = {offsets, u, N, G, M, y};
    const int nt = ork_pool_threads_for(nthreads, (double)M * (double)N * (double)G, 65536.0);
    ork_status st = ork_parallel_for(nt, N, 64, off_cols, &j, err);
    free(u);
    return st;
}
