/* gemm_f32_blocked.h - the cache blocking shared by the SIMD float32 GEMMs
 * (gemm_f32.h) and their M = 1 row tails. Included by gemm_f32_avx2.c and gemm_f32_neon.c only.
 *
 * For each panel of ORK_GEMM_NR weight rows (output columns) and each K block
 * (K split into equal blocks of at most ORK_GEMM_KC terms), the panel's block
 * is packed k-major into the caller's scratch (bp[k][j] = W[j0 + j][k0 + k],
 * zero rows past the end; at most 64 KB, it stays in L2) and the ISA's tile
 * kernel runs it against every group of up to MR activation rows, read in
 * place. Meanwhile the next block's weights are prefetched a few cache lines
 * per tile (spread thin: a burst stalls on the fill buffers), so packing
 * seldom waits for memory; the panel's outputs (16 columns of M rows) stay in
 * L2 from one K block to the next. A tile kernel continues the chains of its
 * outputs: it starts from +0.0f in the first K block and from y (the stored
 * c_k) after it, so the blocking never changes a result. */
#ifndef ORK_GEMM_F32_BLOCKED_H
#define ORK_GEMM_F32_BLOCKED_H

#include <math.h>
#include <stddef.h>

#include "gemm_f32.h"

#define ORK_GEMM_NR 16
#define ORK_GEMM_KC 1024

/* continue mr x nr output chains (mr <= the ISA's MR, nr <= ORK_GEMM_NR) over kc terms */
typedef void (*ork_gemm_tile_fn)(size_t mr, const float *x, size_t ldx, const float *bp, size_t kc, float *y,
                                 size_t ldy, size_t nr, int first);
/* pack a panel block (ork_gemm_pack_panel's result; an ISA may do it with its own shuffles) */
typedef void (*ork_gemm_pack_fn)(const float *w, size_t ldw, size_t nr, size_t kc, float *bp);

/* bp[k * NR + j] = w[j * ldw + k] for j < nr, 0 for nr <= j < NR; written in
 * order (bp may exceed L1: a column-wise fill would evict it line by line) */
static inline void ork_gemm_pack_panel(const float *w, size_t ldw, size_t nr, size_t kc, float *bp) {
    if (nr == ORK_GEMM_NR) {
        for (size_t k = 0; k < kc; k++)
            for (size_t j = 0; j < ORK_GEMM_NR; j++) bp[k * ORK_GEMM_NR + j] = w[j * ldw + k];
        return;
    }
    for (size_t k = 0; k < kc; k++)
        for (size_t j = 0; j < ORK_GEMM_NR; j++) bp[k * ORK_GEMM_NR + j] = j < nr ? w[j * ldw + k] : 0.0f;
}

_Static_assert(ORK_GEMM_KC * ORK_GEMM_NR <= ORK_GEMM_F32_SCRATCH, "a packed panel block must fit the scratch");

/* M = 1 (the SIMD paths read the weight rows in place): the chains of rows n .. n + nr - 1 continued
 * from c (NULL: +0.0f) over terms k0 .. K - 1, one fmaf each, into y[n + j] */
static inline void ork_gemm_rows_tail(const float *x, size_t k0, size_t K, const float *w, size_t ldw, size_t n,
                                      size_t nr, const float *c, float *y) {
    for (size_t j = 0; j < nr; j++) {
        float v = c ? c[j] : 0.0f;
        const float *r = w + (n + j) * ldw;
        for (size_t k = k0; k < K; k++) v = fmaf(x[k], r[k], v);
        y[n + j] = v;
    }
}

static inline void ork_gemm_f32_blocked(ork_gemm_tile_fn tile, ork_gemm_pack_fn pack, size_t MR, const float *x,
                                        size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0,
                                        size_t n1, float *y, size_t ldy, float *bp) {
    if (K == 0) { /* the empty chain: +0.0f */
        for (size_t m = 0; m < M; m++)
            for (size_t n = n0; n < n1; n++) y[m * ldy + n] = 0.0f;
        return;
    }
    const size_t nkb = (K + ORK_GEMM_KC - 1) / ORK_GEMM_KC, kcb = (K + nkb - 1) / nkb;
    const size_t ntile = (M + MR - 1) / MR;
    for (size_t j0 = n0; j0 < n1; j0 += ORK_GEMM_NR) {
        const size_t nr = n1 - j0 < ORK_GEMM_NR ? n1 - j0 : ORK_GEMM_NR;
        for (size_t k0 = 0; k0 < K; k0 += kcb) {
            const size_t kc = K - k0 < kcb ? K - k0 : kcb;
            pack(w + j0 * ldw + k0, ldw, nr, kc, bp);
            /* the next block: the panel's next K block, else the next panel's first */
            const int more_k = k0 + kcb < K;
            const size_t jn = more_k ? j0 : j0 + ORK_GEMM_NR, kn = more_k ? k0 + kcb : 0;
            const size_t kcn = K - kn < kcb ? K - kn : kcb, lines = (kcn * sizeof(float) + 63) / 64;
            const size_t total = jn < n1 ? (n1 - jn < ORK_GEMM_NR ? n1 - jn : ORK_GEMM_NR) * lines : 0;
            const size_t per = (total + ntile - 1) / ntile;
            size_t pf = 0, pf_row = 0, pf_line = 0; /* pf = pf_row * lines + pf_line */
            for (size_t i0 = 0; i0 < M; i0 += MR) {
                for (size_t e = pf + per; pf < e && pf < total; pf++) {
                    __builtin_prefetch((const char *)(w + (jn + pf_row) * ldw + kn) + 64 * pf_line);
                    if (++pf_line == lines) pf_line = 0, pf_row++;
                }
                tile(M - i0 < MR ? M - i0 : MR, x + i0 * ldx + k0, ldx, bp, kc, y + i0 * ldy + j0, ldy, nr, k0 == 0);
            }
        }
    }
}

#endif
