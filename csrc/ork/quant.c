/* quant.c - codebooks, argument checking, the per-row scale search and the
 * threaded drivers. The arithmetic lives in the per-ISA kernel tables; this
 * file only decides which kernel runs on which row with which scale. */
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "pool.h"

/* bitsandbytes NF4 code values (csrc/kernels.cu nf4_dequantization_lut),
 * exactly as float32 */
static const float nf4_levels[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};
static const float int4_levels[15] = {
    -1.0f, -6.0f / 7, -5.0f / 7, -4.0f / 7, -3.0f / 7, -2.0f / 7, -1.0f / 7, 0.0f,
    1.0f / 7, 2.0f / 7, 3.0f / 7, 4.0f / 7, 5.0f / 7, 6.0f / 7, 1.0f,
};

/* round(level * 127), half away from zero; tests re-derive both tables */
static const int8_t nf4_lut[16] = {-127, -88, -67, -50, -36, -23, -12, 0,
                                   10,   20,  31,  43,  56,  71,  92,  127};
static const int8_t int4_lut[16] = {-127, -109, -91, -73, -54, -36, -18, 0,
                                    18,   36,   54,  73,  91,  109, 127, 0};

static const ork_q4_grid nf4_grid = {
    16,
    {-127, -88, -67, -50, -36, -23, -12, 0, 10, 20, 31, 43, 56, 71, 92, 127},
    {-107.5f, -77.5f, -58.5f, -43.0f, -29.5f, -17.5f, -6.0f, 5.0f, 15.0f, 25.5f, 37.0f, 49.5f,
     63.5f, 81.5f, 109.5f},
};
static const ork_q4_grid int4_grid = {
    15,
    {-127, -109, -91, -73, -54, -36, -18, 0, 18, 36, 54, 73, 91, 109, 127, 0},
    {-118.0f, -100.0f, -82.0f, -63.5f, -45.0f, -27.0f, -9.0f, 9.0f, 27.0f, 45.0f, 63.5f, 82.0f,
     100.0f, 118.0f, 0.0f},
};

size_t ork_quant_row_bytes(ork_kind kind, size_t K) {
    switch (kind) {
    case ORK_KIND_NF4:
    case ORK_KIND_INT4: return (K + 1) / 2;
    case ORK_KIND_INT8: return K;
    default: return 0;
    }
}

const int8_t *ork_quant_lut(ork_kind kind) {
    return kind == ORK_KIND_NF4 ? nf4_lut : kind == ORK_KIND_INT4 ? int4_lut : NULL;
}

const float *ork_quant_levels(ork_kind kind, int *nlev) {
    if (kind == ORK_KIND_NF4) {
        if (nlev) *nlev = 16;
        return nf4_levels;
    }
    if (kind == ORK_KIND_INT4) {
        if (nlev) *nlev = 15;
        return int4_levels;
    }
    if (nlev) *nlev = 0;
    return NULL;
}

const ork_q4_grid *ork_quant_grid(ork_kind kind) {
    return kind == ORK_KIND_NF4 ? &nf4_grid : kind == ORK_KIND_INT4 ? &int4_grid : NULL;
}

size_t ork_quant_default_grid(float *out, size_t cap) {
    for (size_t i = 0; i < ORK_QUANT_DEFAULT_GRID_N && i < cap; i++)
        out[i] = (float)(100 - (int)i) / 100.0f;
    return ORK_QUANT_DEFAULT_GRID_N;
}

/* ------------------------------------------------------------ quantize -- */
typedef struct {
    const float *w;
    size_t K;
    const ork_quant_params *p;
    const float *grid;
    size_t ngrid;
    const ork_quant_kernels *kern;
    const ork_q4_grid *g;
    uint8_t *codes;
    float *scales;
    size_t row_bytes;
} quant_job;

static ork_status report_nonfinite_w(const float *x, size_t K, size_t row, ork_err *err) {
    for (size_t k = 0; k < K; k++)
        if (!isfinite(x[k]))
            return ork_err_set(err, ORK_ENONFINITE, "weight has a non-finite value (%s) at [%zu, %zu]",
                               isnan(x[k]) ? "NaN" : "Inf", row, k);
    return ork_err_set(err, ORK_ENONFINITE, "weight row %zu has a non-finite value", row);
}

/* weighted error at ratio r (nearest rounding) */
static double row_werr(const quant_job *j, const float *x, float a, float r) {
    float m = a * r;
    float s = m / 127.0f, inv = 127.0f / m;
    if (j->g) return j->kern->werr4(x, j->p->imatrix, j->K, inv, s, j->g);
    return j->kern->werr8(x, j->p->imatrix, j->K, inv, s);
}

static ork_status quant_rows(void *ctx, size_t begin, size_t end, ork_err *err) {
    const quant_job *j = (const quant_job *)ctx;
    const size_t K = j->K;
    uint8_t *tmp = NULL;
    if (j->g) {
        tmp = (uint8_t *)malloc(K);
        if (!tmp) return ork_err_set(err, ORK_ENOMEM, "out of memory (%zu bytes of row workspace)", K);
    }
    for (size_t n = begin; n < end; n++) {
        const float *x = j->w + n * K;
        uint8_t *out = j->codes + n * j->row_bytes;
        float a;
        if (j->kern->absmax(x, K, &a)) {
            free(tmp);
            return report_nonfinite_w(x, K, n, err);
        }
        if (!(a >= ORK_QUANT_TINY)) { /* zero row */
            j->scales[n] = 0.0f;
            if (j->g) memset(out, ORK_QUANT_ZERO_CODE | (ORK_QUANT_ZERO_CODE << 4), j->row_bytes);
            else memset(out, 0, j->row_bytes);
            continue;
        }
        float r = 1.0f;
        if (j->p->imatrix) {
            double best = row_werr(j, x, a, 1.0f);
            for (size_t i = 0; i < j->ngrid; i++) {
                double e = row_werr(j, x, a, j->grid[i]);
                if (e < best) {
                    best = e;
                    r = j->grid[i];
                }
            }
        }
        float m = a * r;
        float s = m / 127.0f, inv = 127.0f / m;
        j->scales[n] = s;
        uint32_t key = j->p->sr ? ork_sr_row_key(j->p->seed, n) : 0;
        if (j->g) {
            if (j->p->sr) j->kern->codes4_sr(x, K, inv, j->g, key, 0, tmp);
            else j->kern->codes4_rtn(x, K, inv, j->g, tmp);
            size_t k = 0;
            for (; k + 1 < K; k += 2) out[k >> 1] = (uint8_t)(tmp[k] | (tmp[k + 1] << 4));
            if (k < K) out[k >> 1] = (uint8_t)(tmp[k] | (ORK_QUANT_ZERO_CODE << 4));
        } else {
            if (j->p->sr) j->kern->codes8_sr(x, K, inv, key, 0, (int8_t *)out);
            else j->kern->codes8_rtn(x, K, inv, (int8_t *)out);
        }
    }
    free(tmp);
    return ORK_OK;
}

static ork_status check_dims(size_t N, size_t K, ork_err *err) {
    if (N == 0 || K == 0)
        return ork_err_set(err, ORK_EINVAL, "weight must be non-empty, got shape (%zu, %zu)", N, K);
    if (K >= ORK_QUANT_MAX_DIM || N >= ORK_QUANT_MAX_DIM)
        return ork_err_set(err, ORK_EINVAL, "weight shape (%zu, %zu) exceeds 2^31 per dimension", N,
                           K);
    return ORK_OK;
}

ork_status ork_quantize(const float *w, size_t N, size_t K, const ork_quant_params *p,
                        void *codes, float *scales, ork_err *err) {
    if (!p || !w || !codes || !scales) return ork_err_set(err, ORK_EINVAL, "quantize: NULL argument");
    if (p->kind != ORK_KIND_NF4 && p->kind != ORK_KIND_INT4 && p->kind != ORK_KIND_INT8)
        return ork_err_set(err, ORK_EINVAL, "unknown quantization kind %d", (int)p->kind);
    ork_status st = check_dims(N, K, err);
    if (st != ORK_OK) return st;

    float defgrid[ORK_QUANT_DEFAULT_GRID_N];
    const float *grid = p->grid;
    size_t ngrid = p->ngrid;
    if (p->imatrix) {
        for (size_t k = 0; k < K; k++) {
            float v = p->imatrix[k];
            if (!isfinite(v))
                return ork_err_set(err, ORK_ENONFINITE, "imatrix has a non-finite value (%s) at [%zu]",
                                   isnan(v) ? "NaN" : "Inf", k);
            if (v < 0.0f)
                return ork_err_set(err, ORK_EINVAL, "imatrix has a negative value (%g) at [%zu]",
                                   (double)v, k);
        }
        if (!grid) {
            ngrid = ork_quant_default_grid(defgrid, ORK_QUANT_DEFAULT_GRID_N);
            grid = defgrid;
        }
        if (ngrid == 0 || ngrid > ORK_QUANT_MAX_GRID)
            return ork_err_set(err, ORK_EINVAL, "clip grid must hold 1..%d ratios, got %zu",
                               ORK_QUANT_MAX_GRID, ngrid);
        for (size_t i = 0; i < ngrid; i++)
            if (!(grid[i] >= 1e-3f && grid[i] <= 4.0f))
                return ork_err_set(err, ORK_EINVAL,
                                   "clip grid ratio [%zu] = %g is outside [0.001, 4]", i,
                                   (double)grid[i]);
    }

    quant_job j;
    j.w = w;
    j.K = K;
    j.p = p;
    j.grid = grid;
    j.ngrid = ngrid;
    j.kern = ork_quant_kernels_active();
    j.g = ork_quant_grid(p->kind);
    j.codes = (uint8_t *)codes;
    j.scales = scales;
    j.row_bytes = ork_quant_row_bytes(p->kind, K);
    size_t chunk = 65536 / K + 1;
    return ork_parallel_for(p->nthreads, N, chunk, quant_rows, &j, err);
}

/* ---------------------------------------------------------- dequantize -- */
typedef struct {
    ork_kind kind;
    const uint8_t *codes;
    const float *scales;
    size_t K, row_bytes;
    float *out;
    const ork_quant_kernels *kern;
} dequant_job;

static ork_status dequant_rows(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    const dequant_job *j = (const dequant_job *)ctx;
    const int8_t *lut = ork_quant_lut(j->kind);
    for (size_t n = begin; n < end; n++) {
        const uint8_t *c = j->codes + n * j->row_bytes;
        if (lut) j->kern->dequant4(c, j->K, lut, j->scales[n], j->out + n * j->K);
        else j->kern->dequant8((const int8_t *)c, j->K, j->scales[n], j->out + n * j->K);
    }
    return ORK_OK;
}

ork_status ork_dequantize(ork_kind kind, const void *codes, const float *scales, size_t N,
                          size_t K, float *out, int nthreads, ork_err *err) {
    if (!codes || !scales || !out) return ork_err_set(err, ORK_EINVAL, "dequantize: NULL argument");
    if (kind != ORK_KIND_NF4 && kind != ORK_KIND_INT4 && kind != ORK_KIND_INT8)
        return ork_err_set(err, ORK_EINVAL, "unknown quantization kind %d", (int)kind);
    ork_status st = check_dims(N, K, err);
    if (st != ORK_OK) return st;
    for (size_t n = 0; n < N; n++)
        if (!(scales[n] >= 0.0f && scales[n] <= 3.40282347e+38f))
            return ork_err_set(err, ORK_EINVAL, "scale[%zu] = %g is not a finite non-negative number",
                               n, (double)scales[n]);
    dequant_job j = {kind, (const uint8_t *)codes, scales, K, ork_quant_row_bytes(kind, K),
                     out, ork_quant_kernels_active()};
    return ork_parallel_for(nthreads, N, 65536 / K + 1, dequant_rows, &j, err);
}
