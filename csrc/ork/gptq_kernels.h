/* gptq_kernels.h - the float64 multiply-accumulate under GPTQ (gptq.h): the Cholesky
 * factorization's trailing updates, the inverse's block columns and the rows' lazy updates.
 *
 * Contract (every ISA, every tiling):
 *     C[r][c] += A[r][p] * B[p][c]   for p = 0 .. k-1 in increasing order, r < m, c < n,
 * each element one running double: one rounding per product, one per addition, never fused
 * (-ffp-contract=off; SIMD variants use separate multiplies and adds), so a vector kernel that
 * computes several elements at once gives the scalar _ref's bits. B is packed by column quads
 * (gptq.c pack_b): B[p][c] at Bp[(c / 4) * ts + p * 4 + c % 4], the last quad padded with zeros;
 * A row-major with stride lda, C with stride ldc.
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

#endif /* ORK_GPTQ_KERNELS_H */
