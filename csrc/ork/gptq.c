/* gptq.c - GPTQ rounding (contract in gptq.h): the factor U of inv(H) without
 * LAPACK, then blocks of rows rounded column by column with error feedback. */
#include "gptq.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gptq_kernels.h"
#include "pool.h"
#include "quant_scalar.h"

#define NB 64   /* factorization panel */
#define RB 16   /* rows per GPTQ work item */
#define MB 64   /* row block of the multiply-accumulate (its A rows stay in cache) */

/* B (k x n, row stride ldb) packed by column quads: B[p][c] at Bp[(c / 4) * ts + p * 4 + c % 4],
 * ts = 4 * k, the last quad padded with zeros. */
static void pack_b(size_t k, size_t n, const double *B, size_t ldb, double *Bp) {
    for (size_t c0 = 0; c0 < n; c0 += 4)
        for (size_t p = 0; p < k; p++)
            for (size_t c = 0; c < 4; c++) Bp[c0 * k + p * 4 + c] = c0 + c < n ? B[p * ldb + c0 + c] : 0.0;
}

/* C[r][c] += A[r][p] * B[p][c] for p = 0 .. k-1 in order, r < m, c < n, B packed (pack_b, quad
 * stride ts): each element keeps one running value (one rounding per product and per
 * addition), so the tiling only changes the memory order. The scalar oracle of
 * gptq_kernels.h; the AVX2 and NEON kernels give its bits. */
void ork_gptq_acc_ref(size_t m, size_t n, size_t k, const double *A, size_t lda, const double *Bp, size_t ts,
                      double *C, size_t ldc) {
    for (size_t rb = 0; rb < m; rb += MB) {
        const size_t re = m - rb < MB ? m : rb + MB;
        for (size_t c0 = 0; c0 < n; c0 += 4) {
            const double *bq = Bp + (c0 / 4) * ts;
            size_t r0 = rb;
            for (; c0 + 4 <= n && r0 + 4 <= re; r0 += 4) { /* a 4 x 4 tile in registers */
                double *c = C + r0 * ldc + c0;
                double c00 = c[0], c01 = c[1], c02 = c[2], c03 = c[3];
                double c10 = c[ldc], c11 = c[ldc + 1], c12 = c[ldc + 2], c13 = c[ldc + 3];
                double c20 = c[2 * ldc], c21 = c[2 * ldc + 1], c22 = c[2 * ldc + 2], c23 = c[2 * ldc + 3];
                double c30 = c[3 * ldc], c31 = c[3 * ldc + 1], c32 = c[3 * ldc + 2], c33 = c[3 * ldc + 3];
                const double *a = A + r0 * lda, *b = bq;
                for (size_t p = 0; p < k; p++, b += 4) {
                    const double b0 = b[0], b1 = b[1], b2 = b[2], b3 = b[3];
                    const double a0 = a[p], a1 = a[lda + p], a2 = a[2 * lda + p], a3 = a[3 * lda + p];
                    c00 += a0 * b0, c01 += a0 * b1, c02 += a0 * b2, c03 += a0 * b3;
                    c10 += a1 * b0, c11 += a1 * b1, c12 += a1 * b2, c13 += a1 * b3;
                    c20 += a2 * b0, c21 += a2 * b1, c22 += a2 * b2, c23 += a2 * b3;
                    c30 += a3 * b0, c31 += a3 * b1, c32 += a3 * b2, c33 += a3 * b3;
                }
                c[0] = c00, c[1] = c01, c[2] = c02, c[3] = c03;
                c[ldc] = c10, c[ldc + 1] = c11, c[ldc + 2] = c12, c[ldc + 3] = c13;
                c[2 * ldc] = c20, c[2 * ldc + 1] = c21, c[2 * ldc + 2] = c22, c[2 * ldc + 3] = c23;
                c[3 * ldc] = c30, c[3 * ldc + 1] = c31, c[3 * ldc + 2] = c32, c[3 * ldc + 3] = c33;
            }
            const size_t nc = n - c0 < 4 ? n - c0 : 4;
            for (; r0 < re; r0++) /* the tile's last rows, or a partial quad */
                for (size_t j = 0; j < nc; j++) {
                    double acc = C[r0 * ldc + c0 + j];
                    for (size_t p = 0; p < k; p++) acc += A[r0 * lda + p] * bq[p * 4 + j];
                    C[r0 * ldc + c0 + j] = acc;
                }
        }
    }
}

ork_gptq_acc_fn ork_gptq_acc_for(ork_isa isa) {
    switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return ork_gptq_acc_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return ork_gptq_acc_neon;
#endif
    default: return ork_gptq_acc_ref;
    }
}

/* --------------------------------------------------- lower Cholesky of A -- */
typedef struct {
    double *A;       /* K x K, lower triangle factored in place */
    size_t K, k0, k1;
    double *T;       /* -A21^T packed (pack_b layout, quad stride 4 nbk): -A[j][k0 + p] for j >= k1 */
    double *LT;      /* nbk x nbk: L[j'][j] at LT[j - k0][j' - k0] */
    ork_gptq_acc_fn acc;
} chol_job;

static ork_status chol_trsm(void *ctx, size_t b, size_t e, ork_err *err) {
    (void)err;
    const chol_job *c = (const chol_job *)ctx;
    const size_t K = c->K, k0 = c->k0, nbk = c->k1 - k0;
    for (size_t i = c->k1 + b; i < c->k1 + e; i++) {
        double *a = c->A + i * K + k0;
        for (size_t j = 0; j < nbk; j++) {
            const double x = a[j] / c->A[(k0 + j) * K + k0 + j];
            a[j] = x;
            const double *lt = c->LT + j * NB;
            for (size_t j2 = j + 1; j2 < nbk; j2++) a[j2] -= x * lt[j2];
        }
        double *t = c->T + ((i - c->k1) / 4) * 4 * nbk + (i - c->k1) % 4;
        for (size_t j = 0; j < nbk; j++) t[j * 4] = -a[j];
    }
    return ORK_OK;
}

static ork_status chol_syrk(void *ctx, size_t b, size_t e, ork_err *err) {
    (void)err;
    const chol_job *c = (const chol_job *)ctx;
    const size_t K = c->K, k0 = c->k0, k1 = c->k1;
    /* rows k1+b .. k1+e-1, columns k1 .. k1+e-1 (the strict upper part of the last rows is scratch) */
    c->acc(e - b, e, k1 - k0, c->A + (k1 + b) * K + k0, K, c->T, 4 * (k1 - k0), c->A + (k1 + b) * K + k1, K);
    return ORK_OK;
}

/* A: K x K, lower triangle; on success L with A = L L^T in the lower triangle. */
static ork_status chol_lower(double *A, size_t K, int nthreads, double *T, double *LT, double damp, ork_err *err) {
    for (size_t k0 = 0; k0 < K; k0 += NB) {
        const size_t k1 = K - k0 < NB ? K : k0 + NB, nbk = k1 - k0;
        for (size_t j = k0; j < k1; j++) { /* the diagonal block, right-looking */
            const double d = A[j * K + j];
            if (!(d > 0.0) || !isfinite(d))
                return ork_err_set(err, ORK_EINVAL, "the Gram matrix plus damping is not positive definite "
                                   "(raise damp, now %g)", damp);
            const double l = sqrt(d);
            A[j * K + j] = l;
            for (size_t i = j + 1; i < k1; i++) A[i * K + j] /= l;
            for (size_t i = j + 1; i < k1; i++) {
                const double x = A[i * K + j];
                for (size_t j2 = j + 1; j2 <= i; j2++) A[i * K + j2] -= x * A[j2 * K + j];
            }
        }
        if (k1 == K) break;
        for (size_t j = 0; j < nbk; j++)
            for (size_t j2 = j + 1; j2 < nbk; j2++) LT[j * NB + j2] = A[(k0 + j2) * K + k0 + j];
        chol_job c = {A, K, k0, k1, T, LT, ork_gptq_acc_for(ork_cpu_isa())};
        const size_t M = K - k1;
        const int th = ork_pool_threads_for(nthreads, (double)M * (double)M * (double)nbk, 1 << 21);
        ork_status st = ork_parallel_for(th, M, 16, chol_trsm, &c, err);
        if (st == ORK_OK) st = ork_parallel_for(th, M, 32, chol_syrk, &c, err);
        if (st != ORK_OK) return st;
    }
    return ORK_OK;
}

/* ------------------------------------------- X = L^-1, one block column each -- */
typedef struct {
    const double *L;
    double *X;
    size_t K;
    ork_gptq_acc_fn acc;
} inv_job;

static ork_status inv_cols(void *ctx, size_t b, size_t e, ork_err *err) {
    const inv_job *v = (const inv_job *)ctx;
    const size_t K = v->K;
    double *Bp = (double *)malloc(NB * NB * sizeof(double));
    if (!Bp) return ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ factorization workspace)");
    for (size_t J = b; J < e; J++) {
        const size_t j0 = J * NB, w = K - j0 < NB ? K - j0 : NB;
        for (size_t i = j0; i < K; i++) memset(v->X + i * K + j0, 0, w * sizeof(double));
        for (size_t i0 = j0; i0 < K; i0 += NB) {
            const size_t i1 = K - i0 < NB ? K : i0 + NB;
            for (size_t i = i0; i < i1; i++) { /* the running sums of rows i0.. hold the earlier blocks' terms */
                double *x = v->X + i * K + j0;
                const double lii = v->L[i * K + i];
                for (size_t c = 0; c < w; c++) x[c] = ((i == j0 + c ? 1.0 : 0.0) - x[c]) / lii;
                for (size_t i2 = i + 1; i2 < i1; i2++) {
                    const double l = v->L[i2 * K + i];
                    double *y = v->X + i2 * K + j0;
                    for (size_t c = 0; c < w; c++) y[c] += l * x[c];
                }
            }
            if (i1 < K) {
                pack_b(i1 - i0, w, v->X + i0 * K + j0, K, Bp);
                v->acc(K - i1, w, i1 - i0, v->L + i1 * K + i0, K, Bp, 4 * (i1 - i0), v->X + i1 * K + j0, K);
            }
        }
    }
    free(Bp);
    return ORK_OK;
}

/* A: the reversed matrix (P H P), destroyed. u: U = P L^-1 P in its upper triangle. */
static ork_status factor_rev(double *A, size_t K, int nthreads, double damp, double *u, ork_err *err) {
    double *T = (double *)malloc((NB * (K + 4) + NB * NB) * sizeof(double));
    if (!T) return ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ factorization workspace, K = %zu)", K);
    ork_status st = chol_lower(A, K, nthreads, T, T + NB * (K + 4), damp, err);
    free(T);
    if (st != ORK_OK) return st;
    inv_job v = {A, u, K, ork_gptq_acc_for(ork_cpu_isa())};
    const size_t nblk = (K + NB - 1) / NB;
    st = ork_parallel_for(ork_pool_threads_for(nthreads, (double)K * K * K, 1 << 22), nblk, 1, inv_cols, &v, err);
    if (st != ORK_OK) return st;
    /* U[a][b] = X[K-1-a][K-1-b]: the lower triangle (sources) never overlaps the strict upper (targets) */
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < i; j++) u[(K - 1 - i) * K + (K - 1 - j)] = u[i * K + j];
    for (size_t i = 0; i < K / 2; i++) {
        const double t = u[i * K + i];
        u[i * K + i] = u[(K - 1 - i) * K + (K - 1 - i)];
        u[(K - 1 - i) * K + (K - 1 - i)] = t;
    }
    return ORK_OK;
}

ork_status ork_gptq_factor(const double *h, size_t K, int nthreads, double *u, ork_err *err) {
    if (!h || !u || K == 0) return ork_err_set(err, ORK_EINVAL, "gptq_factor: NULL argument or K = 0");
    double *A = (double *)malloc(K * K * sizeof(double));
    if (!A) return ork_err_set(err, ORK_ENOMEM, "out of memory (%zu x %zu doubles)", K, K);
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j <= i; j++) A[i * K + j] = h[(K - 1 - i) * K + (K - 1 - j)];
    ork_status st = factor_rev(A, K, nthreads, 0.0, u, err);
    free(A);
    for (size_t i = 1; st == ORK_OK && i < K; i++) memset(u + i * K, 0, i * sizeof(double));
    return st;
}

/* ------------------------------------------------------------- the rows -- */
typedef struct {
    const float *w;
    size_t N, K;
    const double *u;
    const double *up; /* per block [i1, i2) of `block` columns: U[i1..i2, i2..K) packed (pack_b) */
    const ork_gptq_params *p;
    ork_quant_params qp; /* kind, imatrix (4-bit), group: ork_quant_segment_scale's view */
    const ork_kind_info *info;
    const uint8_t *dead;
    size_t gs, G, block;
    uint8_t *codes;
    float *scales;
    size_t row_bytes;
    ork_gptq_acc_fn acc;
} gptq_job;

typedef struct {
    float s, inv;
    double invd;
} seg_sc;

/* the scale of group g of row n from float32() of its R-row state W (row stride K) */
static ork_status pick_scale(const gptq_job *j, const double *wrow, const float *w32, size_t n, size_t g, float *x32,
                             seg_sc *out, ork_err *err) {
    const size_t c0 = g * j->gs, len = j->K - c0 < j->gs ? j->K - c0 : j->gs;
    const float *x = w32;
    if (wrow) {
        for (size_t c = 0; c < len; c++) x32[c] = (float)wrow[c0 + c];
        x = x32;
    } else {
        x = w32 + c0;
    }
    float s, inv;
    ork_status st = ork_quant_segment_scale(&j->qp, j->K, n, c0, x, len, &s, &inv, err);
    if (st != ORK_OK) return st;
    j->scales[n * j->G + g] = s;
    out->s = s;
    out->inv = inv;
    out->invd = s > 0.0f ? 1.0 / (double)s : 0.0;
    return ORK_OK;
}

static ork_status gptq_rows(void *ctx, size_t r0, size_t r1, ork_err *err) {
    const gptq_job *j = (const gptq_job *)ctx;
    const size_t K = j->K, R = r1 - r0, B = j->block, gs = j->gs, G = j->G;
    const int four = j->info->bits == 4;
    const ork_q4_grid *grid = &j->info->grid;
    const uint8_t zero = j->info->zero_code;
    double *W = (double *)malloc(R * K * sizeof(double));
    double *E = (double *)malloc(R * B * sizeof(double));
    seg_sc *sc = (seg_sc *)malloc(R * G * sizeof(seg_sc));
    float *x32 = (float *)malloc(gs * sizeof(float));
    ork_status st = ORK_OK;
    if (!W || !E || !sc || !x32) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ row workspace, %zu x %zu doubles)", R, K);
        goto done;
    }
    for (size_t r = 0; r < R; r++) {
        const float *src = j->w + (r0 + r) * K;
        for (size_t k = 0; k < K; k++) W[r * K + k] = (double)src[k];
        if (four) memset(j->codes + (r0 + r) * j->row_bytes, zero | (zero << 4), j->row_bytes);
        for (size_t g = 0; g < G && (j->p->static_groups || g == 0); g++)
            if ((st = pick_scale(j, NULL, src, r0 + r, g, x32, &sc[r * G + g], err)) != ORK_OK) goto done;
    }
    const double *up = j->up; /* this block's panel U[i1..i2, i2..K), packed */
    for (size_t i1 = 0; i1 < K; i1 += B) {
        const size_t i2 = K - i1 < B ? K : i1 + B;
        size_t f = i1; /* errors of columns [f, k) not yet pushed onto [i2, K) */
        for (size_t k = i1; k < i2; k++) {
            const size_t g = k / gs;
            if (k % gs == 0 && k > 0 && !j->p->static_groups) {
                const size_t end = K - k < gs ? K : k + gs;
                if (end > i2 && k > f) { /* the group reaches past the block: bring it up to date first */
                    j->acc(R, K - i2, k - f, E + (f - i1), B, up + (f - i1) * 4, 4 * (i2 - i1), W + i2, K);
                    f = k;
                }
                for (size_t r = 0; r < R; r++)
                    if ((st = pick_scale(j, W + r * K, NULL, r0 + r, g, x32, &sc[r * G + g], err)) != ORK_OK)
                        goto done;
            }
            const double *uk = j->u + k * K;
            for (size_t r = 0; r < R; r++) {
                double *wr = W + r * K;
                const seg_sc *s = &sc[r * G + g];
                const double x = wr[k];
                double val;
                if (four) {
                    int c = zero;
                    if (s->s > 0.0f) {
                        const double y = x * s->invd;
                        c = 0;
                        for (int t = 0; t < grid->nlev - 1; t++) c += (y >= (double)grid->thr[t]);
                    }
                    uint8_t *byte = j->codes + (r0 + r) * j->row_bytes + (k >> 1);
                    *byte = (k & 1) ? (uint8_t)((*byte & 0x0f) | (c << 4)) : (uint8_t)((*byte & 0xf0) | c);
                    val = (double)grid->lev[c] * (double)s->s;
                } else {
                    const float q = ork_clamp_lim(ork_round_half_away((float)x * s->inv), (float)j->info->qmax);
                    ((int8_t *)j->codes)[(r0 + r) * j->row_bytes + k] = (int8_t)q;
                    val = (double)q * (double)s->s;
                }
                double e = 0.0;
                if (!j->dead[k]) {
                    e = (x - val) / uk[k];
                    for (size_t c = k + 1; c < i2; c++) wr[c] -= e * uk[c];
                }
                E[r * B + (k - i1)] = -e;
            }
        }
        if (i2 < K) j->acc(R, K - i2, i2 - f, E + (f - i1), B, up + (f - i1) * 4, 4 * (i2 - i1), W + i2, K);
        up += (i2 - i1) * 4 * ((K - i2 + 3) / 4);
    }
done:
    free(W);
    free(E);
    free(sc);
    free(x32);
    return st;
}

/* the arguments' checks (H as given: finite, diagonal >= 0); ORK_OK when GPTQ may run */
static ork_status gptq_check(const float *w, size_t N, size_t K, const double *gram, const ork_gptq_params *p,
                             void *codes, float *scales, ork_err *err) {
    if (!w || !gram || !p || !codes || !scales) return ork_err_set(err, ORK_EINVAL, "gptq: NULL argument");
    const ork_kind_info *info = ork_kind_get(p->kind);
    if (!info) return ork_kind_check(p->kind, err);
    if (N == 0 || K == 0)
        return ork_err_set(err, ORK_EINVAL, "weight must be non-empty, got shape (%zu, %zu)", N, K);
    if (K >= ORK_QUANT_MAX_DIM || N >= ORK_QUANT_MAX_DIM || K > SIZE_MAX / sizeof(double) / K)
        return ork_err_set(err, ORK_EINVAL, "weight shape (%zu, %zu) is too large for GPTQ", N, K);
    if (!(isfinite(p->damp) && p->damp >= 0.0))
        return ork_err_set(err, ORK_EINVAL, "damp must be a finite number >= 0, got %g", p->damp);
    if (p->block < 1) return ork_err_set(err, ORK_EINVAL, "block must be >= 1, got %zu", p->block);
    ork_status st = ork_group_check(p->group, err);
    if (st != ORK_OK) return st;
    for (size_t i = 0; i < K * K; i++)
        if (!isfinite(gram[i]))
            return ork_err_set(err, ORK_ENONFINITE, "the Gram matrix has a non-finite value at (%zu, %zu)", i / K,
                               i % K);
    for (size_t k = 0; k < K; k++)
        if (gram[k * K + k] < 0.0)
            return ork_err_set(err, ORK_EINVAL, "the Gram matrix has a negative diagonal value at [%zu]", k);
    for (size_t i = 0; i < N * K; i++)
        if (!isfinite(w[i]))
            return ork_err_set(err, ORK_ENONFINITE, "weight has a non-finite value (%s) at [%zu, %zu]",
                               isnan(w[i]) ? "NaN" : "Inf", i / K, i % K);
    return ORK_OK;
}

/* GPTQ on checked arguments. A: K x K doubles holding H on entry, the call's workspace (P H' P,
 * its Cholesky factor, then U's packed panels; reallocated when the panels outgrow it); freed
 * here when `own`, else the caller's, left destroyed. */
static ork_status gptq_run(const float *w, size_t N, size_t K, double *A, int own, const ork_gptq_params *p,
                           void *codes, float *scales, ork_err *err) {
    ork_status st = ORK_OK;
    const ork_kind_info *info = ork_kind_get(p->kind);
    const double *gram = A; /* read as H until A is rewritten below */
    const size_t gs = p->group && p->group < K ? p->group : K;
    double *U = (double *)malloc(K * K * sizeof(double));
    double *diag = (double *)malloc(K * sizeof(double));
    uint8_t *dead = (uint8_t *)malloc(K);
    float *im = NULL;
    if (!U || !diag || !dead) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: %zu x %zu doubles)", K, K);
        goto done;
    }
    if ((info->bits == 4 || info->qmax < 127) && p->rows > 0) { /* every kind but int8: the clip search */
        int any = 0;
        if (!(im = (float *)malloc(K * sizeof(float)))) {
            st = ork_err_set(err, ORK_ENOMEM, "out of memory (%zu floats)", K);
            goto done;
        }
        for (size_t k = 0; k < K; k++) {
            im[k] = (float)(gram[k * K + k] / (double)p->rows);
            if (!isfinite(im[k])) {
                st = ork_err_set(err, ORK_ENONFINITE, "the importance diag(Gram) / rows overflows float32 at [%zu]", k);
                goto done;
            }
            any |= im[k] > 0.0f;
        }
        if (!any) {
            free(im);
            im = NULL;
        }
    }
    double mean = 0.0;
    for (size_t k = 0; k < K; k++) {
        dead[k] = gram[k * K + k] == 0.0;
        mean += dead[k] ? 1.0 : gram[k * K + k];
    }
    mean /= (double)K;
    /* A = P H' P (lower triangle): A[i][j] = H'[K-1-i][K-1-j], from H's strict upper triangle
     * (in place: those sources never overlap the strict lower targets), then the diagonal */
    for (size_t k = 0; k < K; k++) diag[k] = gram[k * K + k];
    for (size_t i = 0; i < K; i++) {
        const size_t a = K - 1 - i;
        for (size_t jj = 0; jj < i; jj++) A[i * K + jj] = gram[a * K + (K - 1 - jj)];
    }
    for (size_t i = 0; i < K; i++) A[i * K + i] = (dead[K - 1 - i] ? 1.0 : diag[K - 1 - i]) + p->damp * mean;
    st = factor_rev(A, K, p->nthreads, p->damp, U, err);
    if (st != ORK_OK) goto done;
    const size_t B = p->block < K ? p->block : K;
    size_t need = 0; /* the packed panels, in A's place when they fit (K >= 6) */
    for (size_t i1 = 0; i1 < K; i1 += B) {
        const size_t i2 = K - i1 < B ? K : i1 + B;
        need += (i2 - i1) * 4 * ((K - i2 + 3) / 4);
    }
    if (need > K * K) {
        if (own) free(A);
        own = 1;
        if (!(A = (double *)malloc(need * sizeof(double)))) {
            st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: %zu doubles)", need);
            goto done;
        }
    }
    for (size_t i1 = 0, off = 0; i1 < K; i1 += B) {
        const size_t i2 = K - i1 < B ? K : i1 + B;
        pack_b(i2 - i1, K - i2, U + i1 * K + i2, K, A + off);
        off += (i2 - i1) * 4 * ((K - i2 + 3) / 4);
    }

    gptq_job j;
    memset(&j, 0, sizeof j);
    j.w = w;
    j.N = N;
    j.K = K;
    j.u = U;
    j.up = A;
    j.p = p;
    j.qp.kind = p->kind;
    j.qp.imatrix = im;
    j.qp.group = gs < K ? gs : 0;
    j.qp.nthreads = 1;
    j.info = info;
    j.dead = dead;
    j.gs = gs;
    j.G = (K + gs - 1) / gs;
    j.block = B;
    j.codes = (uint8_t *)codes;
    j.scales = scales;
    j.row_bytes = ork_quant_row_bytes(p->kind, K);
    j.acc = ork_gptq_acc_for(ork_cpu_isa());
    st = ork_parallel_for(ork_pool_threads_for(p->nthreads, (double)N * K * K, 1 << 22), N, RB, gptq_rows, &j, err);
done:
    if (own) free(A);
    free(U);
    free(diag);
    free(dead);
    free(im);
    return st;
}

ork_status ork_gptq(const float *w, size_t N, size_t K, const double *gram, const ork_gptq_params *p, void *codes,
                    float *scales, ork_err *err) {
    ork_status st = gptq_check(w, N, K, gram, p, codes, scales, err);
    if (st != ORK_OK) return st;
    double *A = (double *)malloc(K * K * sizeof(double));
    if (!A) return ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: 2 x %zu x %zu doubles)", K, K);
    memcpy(A, gram, K * K * sizeof(double));
    return gptq_run(w, N, K, A, 1, p, codes, scales, err);
}

ork_status ork_gptq_consume(const float *w, size_t N, size_t K, double *gram, const ork_gptq_params *p, void *codes,
                            float *scales, ork_err *err) {
    ork_status st = gptq_check(w, N, K, gram, p, codes, scales, err);
    return st != ORK_OK ? st : gptq_run(w, N, K, gram, 0, p, codes, scales, err);
}
