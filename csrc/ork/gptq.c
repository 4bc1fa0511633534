/* gptq.c - GPTQ rounding (contract in gptq.h): the factor U of inv(H) without
 * LAPACK, then blocks of rows rounded column by column with error feedback. */
#include "gptq.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "affine.h"
#include "gptq_kernels.h"
#include "pool.h"
#include "quant_scalar.h"

#define NB 64   /* factorization panel */
#define RB 16   /* rows per GPTQ work item */
#define MB 64   /* row block of the multiply-accumulate (its A rows stay in cache) */

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

/* the float32 oracle (gptq_kernels.h): as ork_gptq_acc_ref, in float, B packed by column octets */
void ork_gptq_accf_ref(size_t m, size_t n, size_t k, const float *A, size_t lda, const float *Bp, size_t ts,
                       float *C, size_t ldc) {
    for (size_t rb = 0; rb < m; rb += MB) {
        const size_t re = m - rb < MB ? m : rb + MB;
        for (size_t c0 = 0; c0 < n; c0 += 8) {
            const float *bq = Bp + (c0 / 8) * ts;
            const size_t nc = n - c0 < 8 ? n - c0 : 8;
            size_t r0 = rb;
            for (; r0 + 2 <= re && nc == 8; r0 += 2) { /* a 2 x 8 tile in registers */
                float x0[8], x1[8];
                for (size_t j = 0; j < 8; j++) x0[j] = C[r0 * ldc + c0 + j], x1[j] = C[(r0 + 1) * ldc + c0 + j];
                const float *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++) {
                    const float a0 = a[p], a1 = a[lda + p];
                    for (size_t j = 0; j < 8; j++) x0[j] += a0 * bq[p * 8 + j], x1[j] += a1 * bq[p * 8 + j];
                }
                for (size_t j = 0; j < 8; j++) C[r0 * ldc + c0 + j] = x0[j], C[(r0 + 1) * ldc + c0 + j] = x1[j];
            }
            ork_gptq_accf_tail(r0, re, c0, c0 + nc, k, A, lda, Bp, ts, C, ldc);
        }
    }
}

ork_gptq_accf_fn ork_gptq_accf_for(ork_isa isa) {
    switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return ork_gptq_accf_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return ork_gptq_accf_neon;
#endif
    default: return ork_gptq_accf_ref;
    }
}

/* the two precisions' factor and rows (gptq_impl.h) */
#define GR double
#define GW 4
#define GX(n) n##_d
#define GACC ork_gptq_acc_fn
#define GACC_FOR ork_gptq_acc_for
#define GSQRT sqrt
#include "gptq_impl.h"
#undef GR
#undef GW
#undef GX
#undef GACC
#undef GACC_FOR
#undef GSQRT
#define GR float
#define GW 8
#define GX(n) n##_f
#define GACC ork_gptq_accf_fn
#define GACC_FOR ork_gptq_accf_for
#define GSQRT sqrtf
#include "gptq_impl.h"
#undef GR
#undef GW
#undef GX
#undef GACC
#undef GACC_FOR
#undef GSQRT

ork_status ork_gptq_factor(const double *h, size_t K, int nthreads, double *u, ork_err *err) {
    if (!h || !u || K == 0) return ork_err_set(err, ORK_EINVAL, "gptq_factor: NULL argument or K = 0");
    double *A = (double *)malloc(K * K * sizeof(double));
    if (!A) return ork_err_set(err, ORK_ENOMEM, "out of memory (%zu x %zu doubles)", K, K);
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j <= i; j++) A[i * K + j] = h[(K - 1 - i) * K + (K - 1 - j)];
    ork_status st = factor_rev_d(A, K, nthreads, 0.0, u, err);
    free(A);
    for (size_t i = 1; st == ORK_OK && i < K; i++) memset(u + i * K, 0, i * sizeof(double));
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
    if (st == ORK_OK && p->offsets) st = ork_affine_check(p->kind, K, p->group, err);
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

/* GPTQ on checked arguments. gram: H; scratch: H's own memory when the caller gives it up
 * (ork_gptq_consume; destroyed), else NULL. float64: A = P H' P in scratch (or a copy), U
 * allocated. float32: A = float(P H' P) allocated, U in scratch's first half (or allocated). */
static ork_status gptq_run(const float *w, size_t N, size_t K, const double *gram, double *scratch,
                           const ork_gptq_params *p, void *codes, float *scales, ork_err *err) {
    ork_status st = ORK_OK;
    const ork_kind_info *info = ork_kind_get(p->kind);
    const int single = p->precision == ORK_GPTQ_F32;
    double *diag = (double *)malloc(K * sizeof(double));
    uint8_t *dead = (uint8_t *)malloc(K);
    float *im = NULL;
    void *A = NULL, *U = NULL;
    int ownA = 1, ownU = 1;
    if (!diag || !dead) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: %zu values)", K);
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
    for (size_t k = 0; k < K; k++) diag[k] = (dead[k] ? 1.0 : gram[k * K + k]) + p->damp * mean;
    if (!single) {
        /* A = P H' P (lower triangle): A[i][j] = H'[K-1-i][K-1-j], from H's strict upper triangle
         * (in place in scratch: those sources never overlap the strict lower targets), then the diagonal */
        double *a = scratch;
        if (a) ownA = 0;
        else if ((a = (double *)malloc(K * K * sizeof(double)))) memcpy(a, gram, K * K * sizeof(double));
        A = a;
        if (!(U = malloc(K * K * sizeof(double))) || !a) {
            st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: 2 x %zu x %zu doubles)", K, K);
            goto done;
        }
        for (size_t i = 0; i < K; i++) {
            const size_t s = K - 1 - i;
            for (size_t jj = 0; jj < i; jj++) a[i * K + jj] = a[s * K + (K - 1 - jj)];
        }
        for (size_t i = 0; i < K; i++) a[i * K + i] = diag[K - 1 - i];
        st = gptq_finish_d(w, N, K, (double **)&A, &ownA, (double *)U, dead, im, p, codes, scales, err);
    } else {
        float *a = (float *)malloc(K * K * sizeof(float));
        A = a;
        if (!a) {
            st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: %zu x %zu floats)", K, K);
            goto done;
        }
        for (size_t i = 0; i < K; i++) {
            const size_t s = K - 1 - i;
            for (size_t jj = 0; jj < i; jj++) a[i * K + jj] = (float)gram[s * K + (K - 1 - jj)];
            a[i * K + i] = (float)diag[s];
        }
        if (scratch) { /* H is read: its memory holds U (K x K floats in K x K doubles) */
            U = scratch;
            ownU = 0;
        } else if (!(U = malloc(K * K * sizeof(float)))) {
            st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: 2 x %zu x %zu floats)", K, K);
            goto done;
        }
        st = gptq_finish_f(w, N, K, (float **)&A, &ownA, (float *)U, dead, im, p, codes, scales, err);
    }
done:
    if (ownA) free(A);
    if (ownU) free(U);
    free(diag);
    free(dead);
    free(im);
    return st;
}

ork_status ork_gptq(const float *w, size_t N, size_t K, const double *gram, const ork_gptq_params *p, void *codes,
                    float *scales, ork_err *err) {
    ork_status st = gptq_check(w, N, K, gram, p, codes, scales, err);
    return st != ORK_OK ? st : gptq_run(w, N, K, gram, NULL, p, codes, scales, err);
}

ork_status ork_gptq_consume(const float *w, size_t N, size_t K, double *gram, const ork_gptq_params *p, void *codes,
                            float *scales, ork_err *err) {
    ork_status st = gptq_check(w, N, K, gram, p, codes, scales, err);
    return st != ORK_OK ? st : gptq_run(w, N, K, gram, gram, p, codes, scales, err);
}
