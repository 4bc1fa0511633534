/* gptq_kernels.h - the multiply-accumulate under GPTQ (gptq.h), in float64 and float32 (the
 * params' precision): the Cholesky factorization's trailing updates, the inverse's block columns
 * and the rows' lazy updates.
 *
 * Contract (every ISA, every tiling):
 *     C[r][c] += A[r][p] * B[p][c]   for p = 0 .. k-1 in increasing order, r < m, c < n,
 * each element one running double: one rounding per product, one per addition, never fused
 * (-ffp-contract=off; SIMD variants use separate multiplies and adds), so a vector kernel that
 * computes several elements at once gives the scalar _ref's bits. B is packed by column quads
 * (gptq.c pack_b): B[p][c] at Bp[(c / 4) * ts + p * 4 + c % 4], the last quad padded with zeros;
 * A row-major with stride lda, C with stride ldc.
 * The float32 kernels (ork_gptq_accf_*): the same contract in float (one float running value per
 * element), B packed by column octets: B[p][c] at Bp[(c / 8) * ts + p * 8 + c % 8].
 */
#ifndef ORK_GPTQ_KERNELS_H
#define ORK_GPTQ_KERNELS_H

#include <stddef.h>

#include "cpu.h"

typedef void (*ork_gptq_acc_fn)(size_t m, size_t n, size_t k, const double *A, size_t lda, const double *Bp,
                                size_t ts, double *C, size_t ldc);

void ork_gptq_acc_ref(size_t m, size_t n, size_t k, const double *A, size_t lda, const double *Bp, size_t ts,
                      double *C, size_t ldc);
#if defined(__x86_64__) || defined(__i386__)
void ork_gptq_acc_avx2(size_t m, size_t n, size_t k, const double *A, size_t lda, const double *Bp, size_t ts,
                       double *C, size_t ldc);
#endif
#if defined(__aarch64__)
void ork_gptq_acc_neon(size_t m, size_t n, size_t k, const double *A, size_t lda, const double *Bp, size_t ts,
                       double *C, size_t ldc);
#endif
/* the kernel of an ISA (the scalar one when the build has none for it) */
ork_gptq_acc_fn ork_gptq_acc_for(ork_isa isa);

/* rows [r0, re) x quads [c0, n) the vector kernels leave over: the _ref's loop (one element at a time) */
static inline void ork_gptq_acc_tail(size_t r0, size_t re, size_t c0, size_t n, size_t k, const double *A,
                                     size_t lda, const double *Bp, size_t ts, double *C, size_t ldc) {
    for (; c0 < n; c0 += 4) {
        const double *bq = Bp + (c0 / 4) * ts;
        const size_t nc = n - c0 < 4 ? n - c0 : 4;
        for (size_t r = r0; r < re; r++)
            for (size_t j = 0; j < nc; j++) {
                double acc = C[r * ldc + c0 + j];
                for (size_t p = 0; p < k; p++) acc += A[r * lda + p] * bq[p * 4 + j];
                C[r * ldc + c0 + j] = acc;
            }
    }
}

typedef void (*ork_gptq_accf_fn)(size_t m, size_t n, size_t k, const float *A, size_t lda, const float *Bp,
                                 size_t ts, float *C, size_t ldc);

void ork_gptq_accf_ref(size_t m, size_t n, size_t k, const float *A, size_t lda, const float *Bp, size_t ts,
                       float *C, size_t ldc);
#if defined(__x86_64__) || defined(__i386__)
void ork_gptq_accf_avx2(size_t m, size_t n, size_t k, const float *A, size_t lda, const float *Bp, size_t ts,
                        float *C, size_t ldc);
#endif
#if defined(__aarch64__)
void ork_gptq_accf_neon(size_t m, size_t n, size_t k, const float *A, size_t lda, const float *Bp, size_t ts,
                        float *C, size_t ldc);
#endif
ork_gptq_accf_fn ork_gptq_accf_for(ork_isa isa);

/* the float32 kernels' leftover: rows [r0, re) x octets [c0, n), one element at a time */
static inline void ork_gptq_accf_tail(size_t r0, size_t re, size_t c0, size_t n, size_t k, const float *A,
                                      size_t lda, const float *Bp, size_t ts, float *C, size_t ldc) {
    for (; c0 < n; c0 += 8) {
        const float *bq = Bp + (c0 / 8) * ts;
        const size_t nc = n - c0 < 8 ? n - c0 : 8;
        for (size_t r = r0; r < re; r++)
            for (size_t j = 0; j < nc; j++) {
                float acc = C[r * ldc + c0 + j];
                for (size_t p = 0; p < k; p++) acc += A[r * lda + p] * bq[p * 8 + j];
                C[r * ldc + c0 + j] = acc;
            }
    }
}

#endif /* ORK_GPTQ_KERNELS_H */
