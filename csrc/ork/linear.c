/* linear.c - a linear layer on its weight path (linear.h). */
#include "linear.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "affine.h"
#include "gemm_f32.h"
#include "pack.h"
#include "pool.h"
#include "scratch.h"

typedef struct {
    const ork_gemm_f32_kernels *kern;
    const float *x, *w;
    size_t M, N, K;
    float *y;
} gemm_job;

static ork_status gemm_cols(void *ctx, size_t begin, size_t end, ork_err *err) {
    const gemm_job *j = (const gemm_job *)ctx;
    /* M = 1 reads the weight rows in place (gemm_f32.h): no scratch */
    float *scratch = j->M > 1 ? (float *)aligned_alloc(64, ORK_GEMM_F32_SCRATCH * sizeof(float)) : NULL;
    if (j->M > 1 && !scratch) return ork_err_set(err, ORK_ENOMEM, "out of memory for the float32 GEMM's scratch");
    j->kern->cols(j->x, j->K, j->M, j->K, j->w, j->K, begin, end, j->y, j->N, scratch);
    free(scratch);
    return ORK_OK;
}

/* columns per work item: whole 16-column panels, about 4 items per thread (at most 8 panels each) */
static size_t gemm_chunk(size_t N, int nt) {
    size_t panels = (N + 15) / 16, per = (panels + 4 * (size_t)nt - 1) / (4 * (size_t)nt);
    return 16 * (per < 1 ? 1 : per > 8 ? 8 : per);
}

/* ---------------------------------------------------- activation stats -- */
int ork_act_stats_bin(float v) {
    uint32_t b;
    float a = fabsf(v);
    memcpy(&b, &a, sizeof b);
    const uint32_t lo = (uint32_t)(127 + ORK_ASTATS_EMIN) << 23, hi = (uint32_t)(127 + ORK_ASTATS_EMAX) << 23;
    if (b < lo) return 0;
    if (b >= hi) return ORK_ASTATS_BINS - 1;
    return 1 + (int)((b - lo) >> (23 - 6)); /* 6 = log2(ORK_ASTATS_SUB) */
}

double ork_act_stats_edge(int bin) {
    if (bin <= 0) return 0.0;
    if (bin >= ORK_ASTATS_BINS - 1) return ldexp(1.0, ORK_ASTATS_EMAX);
    int q = bin - 1;
    return ldexp(1.0 + (double)(q % ORK_ASTATS_SUB) / ORK_ASTATS_SUB, ORK_ASTATS_EMIN + q / ORK_ASTATS_SUB);
}

static void act_stats_add(const ork_linear *l, const float *x, size_t M) {
    ork_act_stats *s = l->act_stats;
    const size_t K = l->K;
    size_t j = 0;
    for (size_t m = 0; m < M; m++) {
        const float *xr = x + m * K;
        const int clips = l->act.clip > 0.0f && m >= l->act.prefix;
        if (m < s->skip_rows) { /* the channel maxima only */
            if (s->ch_absmax)
                for (size_t k = 0; k < K; k++)
                    if (isfinite(xr[k]) && fabsf(xr[k]) > s->ch_absmax[k]) s->ch_absmax[k] = fabsf(xr[k]);
            continue;
        }
        j = 0;
        for (size_t k = 0; k < K; k++) {
            float v = xr[k], a = fabsf(v);
            int outlier = j < l->act.n_outliers && (size_t)l->act.outliers[j] == k;
            j += (size_t)outlier;
            if (!isfinite(v)) continue;
            int bin = ork_act_stats_bin(v);
            s->count[bin]++;
            s->sum[bin] += (double)a;
            s->sum2[bin] += (double)a * (double)a;
            if (a > s->absmax) s->absmax = a;
            if (s->ch_absmax && a > s->ch_absmax[k]) s->ch_absmax[k] = a;
            if (!outlier && clips && a > l->act.clip) s->n_clipped++;
        }
    }
    if (M > s->skip_rows) s->rows += M - s->skip_rows;
}

ork_status ork_act_stats_add_rows(ork_act_stats *s, const float *x, size_t M, size_t K, const size_t *calls,
                                  size_t n_calls, const float *divisor, ork_err *err) {
    size_t total = 0, most = 0;
    for (size_t c = 0; c < n_calls; c++) {
        if (calls[c] > M - total)  /* checked before the sum, which could otherwise wrap around */
            return ork_err_set(err, ORK_EINVAL, "calls[%zu] = %zu rows: the calls hold more rows than the input's %zu",
                               c, calls[c], M);
        total += calls[c];
        if (calls[c] > most) most = calls[c];
    }
    if (total != M) return ork_err_set(err, ORK_EINVAL, "the calls hold %zu rows, the input %zu", total, M);
    ork_linear l;
    memset(&l, 0, sizeof l);
    l.path = ORK_LIN_F32;
    l.K = K;
    l.act_stats = s;
    float *buf = NULL;
    if (divisor && most && !(buf = (float *)malloc(most * K * sizeof(float)))) return ORK_ENOMEM;
    for (size_t c = 0, m0 = 0; c < n_calls; m0 += calls[c], c++) {
        const float *xc = x + m0 * K;
        if (divisor) {
            for (size_t m = 0; m < calls[c]; m++)
                for (size_t k = 0; k < K; k++) buf[m * K + k] = xc[m * K + k] / divisor[k];
            xc = buf;
        }
        act_stats_add(&l, xc, calls[c]);
    }
    free(buf);
    return ORK_OK;
}

ork_status ork_linear_check_act(const ork_linear *l, ork_err *err) {
    if (l->path != ORK_LIN_PACKED) {
        if (l->act.clip != 0.0f || l->act.n_outliers || l->act.prefix || l->act.group || l->group || l->boffset)
            return ork_err_set(err, ORK_EINVAL, "activation settings, group sizes and offsets apply to packed linears, "
                               "not float ones");
        return ORK_OK;
    }
    if (l->boffset) {
        ork_status st = ork_affine_check(l->kind, l->K, l->group, err);
        if (st) return st;
    }
    if (l->group) {
        ork_status st = ork_group_check(l->group, err);
        if (st) return st;
        if (l->act.n_outliers)
            return ork_err_set(err, ORK_EINVAL, "outlier channels are not supported with a grouped weight (group size %zu)",
                               l->group);
    }
    if (l->act.group && l->act.group != l->group)
        return ork_err_set(err, ORK_EINVAL, "per-group activation scales (group %zu) need a weight grouped alike (the "
                           "weight's group is %zu%s)", l->act.group, l->group, l->group ? "" : ": per channel");
    return ork_act_spec_check(&l->act, l->K, err);
}

/* y[m][n] += (sum_j x[m][o_j] * w[n][o_j]) * bscale[n]: the outlier channels in float (linear.h) */
static ork_status add_outliers(const ork_linear *l, const float *x, size_t M, float *y, ork_err *err) {
    const size_t no = l->act.n_outliers, N = l->N, K = l->K;
    const int32_t *outl = l->act.outliers;
    for (size_t m = 0; m < M; m++)
        for (size_t j = 0; j < no; j++) {
            float v = x[m * K + (size_t)outl[j]];
            if (!isfinite(v))
                return ork_err_set(err, ORK_ENONFINITE, "activation has a non-finite value (%s) at [%zu, %zu]",
                                   isnan(v) ? "NaN" : "Inf", m, (size_t)outl[j]);
        }
    float *w = (float *)malloc(N * no * sizeof(float));
    if (!w) return ork_err_set(err, ORK_ENOMEM, "out of memory for the outlier channels' weights");
    for (size_t n = 0; n < N; n++)
        for (size_t j = 0; j < no; j++) w[n * no + j] = (float)ork_pack_value(l->kind, l->store, K, n, (size_t)outl[j]);
    for (size_t m = 0; m < M; m++) {
        const float *xr = x + m * K;
        for (size_t n = 0; n < N; n++) {
            float s = 0.0f;
            for (size_t j = 0; j < no; j++) {
                float p = xr[outl[j]] * w[n * no + j];
                s += p;
            }
            float t = s * l->bscale[n];
            y[m * N + n] += t;
        }
    }
    free(w);
    return ORK_OK;
}

/* a packed linear: activations quantized in its spec (actspec.h), the int8 matmul on the CPU kernels or
 * outside (int_mm), the same float scaling on both, then the outlier channels */
static ork_status linear_packed(const ork_linear *l, const float *x, size_t M, float *y, int nthreads, ork_err *err) {
    ork_status st = ork_linear_check_act(l, err);
    if (st) return st;
    if (M == 0) return ork_err_set(err, ORK_EINVAL, "activations must have at least one row");
    const size_t Kp = ork_pack_round32(l->K), K = l->K, N = l->N;
    _Alignas(64) int8_t xq_s[8192]; /* decode sizes: no heap (scratch.h) */
    float as_s[16];
    int8_t *xq = (int8_t *)ork_scratch(xq_s, sizeof xq_s, M * Kp);
    const size_t AG = ork_act_groups(&l->act, Kp); /* activation scales per row: 1, or the weight's groups */
    float *as = (float *)ork_scratch(as_s, sizeof as_s, AG * M * sizeof(float));
    const size_t no = l->act.n_outliers;
    float *xm = no ? (float *)malloc(M * K * sizeof(float)) : NULL;
    const size_t G = l->group ? (Kp + l->group - 1) / l->group : 1; /* blocks an external matmul returns */
    int32_t *acc = l->int_mm ? (int32_t *)malloc(G * M * N * sizeof(int32_t)) : NULL;
    if (!xq || !as || (no && !xm) || (l->int_mm && !acc)) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory for the activations of a packed linear");
        goto done;
    }
    const float *xin = x;
    if (xm) {
        memcpy(xm, x, M * K * sizeof(float));
        for (size_t m = 0; m < M; m++)
            for (size_t j = 0; j < no; j++) xm[m * K + (size_t)l->act.outliers[j]] = 0.0f;
        xin = xm;
    }
    if ((st = ork_quantize_acts(xin, M, K, Kp, &l->act, xq, as, err))) goto done;
    if (l->int_mm) {
        if ((st = l->int_mm(l->int_mm_ctx, xq, M, Kp, acc, err))) goto done;
        if (!l->group)
            for (size_t m = 0; m < M; m++)
                for (size_t n = 0; n < N; n++) y[m * N + n] = ork_dequant_acc(acc[m * N + n], as[m], l->bscale[n]);
        else /* pack.h "Group-wise scales": t_i = dequant(acc_i, a, s_i), added in group order from t_0 (no FMA) */
            for (size_t g = 0; g < G; g++)
                for (size_t m = 0; m < M; m++)
                    for (size_t n = 0; n < N; n++) {
                        const float t = ork_dequant_acc(acc[(g * M + m) * N + n], as[(AG > 1 ? g * M : 0) + m],
                                                        l->bscale[n * G + g]);
                        y[m * N + n] = g ? y[m * N + n] + t : t;
                    }
    } else if ((st = ork_matmul_q8_grouped(l->kind, l->store, ork_quant_lut(l->kind), l->bscale, l->group, N, K, xq,
                                           as, AG > 1, M, y, nthreads, err))) {
        goto done;
    }
    if (l->boffset)
        st = ork_matmul_add_offsets(l->boffset, l->group, N, K, xq, Kp, as, AG > 1, M, y, nthreads, err);
    if (no && st == ORK_OK) st = add_outliers(l, x, M, y, err);
done:
    ork_scratch_free(xq, xq_s);
    ork_scratch_free(as, as_s);
    free(xm);
    free(acc);
    return st;
}

/* ------------------------------------------------- input Gram matrix -- */
/* One block of R <= ORK_GRAM_ROWS rows: xt (K x R) its transpose; each work item a tile of 64 channels
 * [i0, i1): P = xt[i0..i1) xt^T over columns i0..K-1 by the float32 GEMM (gemm_f32.h: one fmaf chain per
 * element over the block's rows in order), then added to the upper triangle of g in double. */
typedef struct {
    const ork_gemm_f32_kernels *kern;
    const float *xt;
    size_t R, K;
    double *g;
} gram_job;

#define GRAM_TILE 64 /* channels per work item */

static ork_status gram_tiles(void *ctx, size_t begin, size_t end, ork_err *err) {
    const gram_job *j = (const gram_job *)ctx;
    const size_t K = j->K;
    float *y = (float *)malloc(GRAM_TILE * K * sizeof(float));
    float *scratch = (float *)aligned_alloc(64, ORK_GEMM_F32_SCRATCH * sizeof(float));
    if (!y || !scratch) {
        free(y);
        free(scratch);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for the Gram matrix's tile (%zu floats)", GRAM_TILE * K);
    }
    for (size_t t = begin; t < end; t++) {
        const size_t i0 = t * GRAM_TILE, i1 = i0 + GRAM_TILE < K ? i0 + GRAM_TILE : K;
        j->kern->cols(j->xt + i0 * j->R, j->R, i1 - i0, j->R, j->xt, j->R, i0, K, y, K, scratch);
        for (size_t i = i0; i < i1; i++) {
            const float *yr = y + (i - i0) * K;
            double *gr = j->g + i * K;
            for (size_t c = i; c < K; c++) gr[c] += (double)yr[c];
        }
    }
    free(y);
    free(scratch);
    return ORK_OK;
}

/* xx_sum += the Gram matrix of x's M rows, a block of ORK_GRAM_ROWS rows at a time (linear.h) */
static ork_status gram_add(const ork_linear *l, const float *x, size_t M, int nthreads, ork_err *err) {
    const size_t K = l->K;
    float *xt = (float *)malloc(K * ORK_GRAM_ROWS * sizeof(float));
    if (!xt)
        return ork_err_set(err, ORK_ENOMEM, "out of memory for the Gram matrix's rows (%zu floats)",
                           K * (size_t)ORK_GRAM_ROWS);
    ork_status st = ORK_OK;
    for (size_t m0 = 0; m0 < M && st == ORK_OK; m0 += ORK_GRAM_ROWS) {
        const size_t R = M - m0 < ORK_GRAM_ROWS ? M - m0 : ORK_GRAM_ROWS;
        for (size_t r = 0; r < R; r++)
            for (size_t k = 0; k < K; k++) xt[k * R + r] = x[(m0 + r) * K + k];
        gram_job gj = {ork_gemm_f32_kernels_active(), xt, R, K, l->xx_sum};
        int nt = ork_pool_threads_for(nthreads, (double)R * (double)K * (double)K / 2, 1 << 20);
        st = ork_parallel_for(nt, (K + GRAM_TILE - 1) / GRAM_TILE, 1, gram_tiles, &gj, err);
    }
    free(xt);
    return st;
}

static ork_status linear_product(const ork_linear *l, const float *x, size_t M, float *y, int nthreads, ork_err *err) {
    if (l->cap) {
        if (M > l->cap_rows - *l->cap_used)
            return ork_err_set(err, ORK_EINVAL, "the input capture holds %zu rows: %zu more do not fit after %zu",
                               l->cap_rows, M, *l->cap_used);
        memcpy(l->cap + *l->cap_used * l->K, x, M * l->K * sizeof(float));
        *l->cap_used += M;
    }
    if (l->xx_sum) {
        ork_status st = gram_add(l, x, M, nthreads, err);
        if (st) return st;
        if (l->xx_count) *l->xx_count += M;
    }
    if (l->x2_sum) {
        for (size_t m = 0; m < M; m++) {
            const float *xr = x + m * l->K;
            for (size_t k = 0; k < l->K; k++) l->x2_sum[k] += (double)xr[k] * (double)xr[k];
        }
        if (l->x2_count) *l->x2_count += M;
    }
    if (l->act_stats) act_stats_add(l, x, M);
    if (l->path == ORK_LIN_F32) {
        if (l->act.clip != 0.0f || l->act.n_outliers || l->act.prefix) return ork_linear_check_act(l, err);
        gemm_job j = {ork_gemm_f32_kernels_active(), x, l->w, M, l->N, l->K, y};
        /* 64K multiply-adds a thread: a decoded token's small GEMVs split too (as pack.c run_strips) */
        int nt = ork_pool_threads_for(nthreads, (double)M * (double)l->N * (double)l->K, 65536.0);
        return ork_parallel_for(nt, l->N, gemm_chunk(l->N, nt), gemm_cols, &j, err);
    }
    return linear_packed(l, x, M, y, nthreads, err);
}

void ork_linear_row(const ork_linear *l, size_t n, float *out) {
    if (l->path == ORK_LIN_F32) {
        memcpy(out, l->w + n * l->K, l->K * sizeof(float));
        return;
    }
    const size_t G = l->group ? ork_group_count(l->K, l->group) : 1;
    for (size_t k = 0; k < l->K; k++) {
        float s = l->bscale[n * G + (l->group ? k / l->group : 0)];
        const float v = (float)ork_pack_value(l->kind, l->store, l->K, n, k) * s;
        out[k] = l->boffset ? v + l->boffset[n * G + k / l->group] : v;
    }
}

ork_status ork_linear_apply(const ork_linear *l, const float *x, size_t M, float *y, int nthreads, ork_err *err) {
    ork_status st = linear_product(l, x, M, y, nthreads, err);
    if (st == ORK_OK && l->bias)
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < l->N; n++) y[m * l->N + n] += l->bias[n];
    return st;
}

ork_status ork_linear_int(const ork_linear *l, const int8_t *xq, size_t M, int32_t *acc, int nthreads, ork_err *err) {
    if (l->path != ORK_LIN_PACKED) return ork_err_set(err, ORK_EINVAL, "an int8 matmul needs a packed linear");
    if (l->group && l->group < l->K)
        return ork_err_set(err, ORK_EINVAL, "a grouped weight (group size %zu) has one int32 sum per group, not one per "
                           "output: the fused FFN chain needs per-channel weights", l->group);
    if (l->int_mm) return l->int_mm(l->int_mm_ctx, xq, M, l->K, acc, err);
    return ork_matmul_int(l->kind, l->store, ork_quant_lut(l->kind), l->N, l->K, xq, M, acc, nthreads, err);
}
