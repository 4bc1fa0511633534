/* gemm_f32_ref.c - the scalar float32 GEMM (the oracle of gemm_f32.h): one
 * fmaf chain per output, terms in k order. */
#include <math.h>

#include "gemm_f32.h"

static void cols_ref(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0, size_t n1,
                     float *y, size_t ldy, float *scratch) {
    (void)scratch;
    for (size_t n = n0; n < n1; n++)
        for (size_t m = 0; m < M; m++) {
            const float *xr = x + m * ldx, *wr = w + n * ldw;
            float c = 0.0f;
            for (size_t k = 0; k < K; k++) c = fmaf(xr[k], wr[k], c);
            y[m * ldy + n] = c;
        }
}

const ork_gemm_f32_kernels ork_gemm_f32_kernels_ref = {"scalar", cols_ref};
