/* gram_avx2.c - the input Gram matrix's accumulation (linear.h "Input Gram matrix") with AVX2:
 * four columns at a time. Bit-identical to the scalar loop of linear.c: every product of two
 * floats is exact in double (24 + 24 bits < 53), so a fused multiply-add rounds the same sum,
 * and each element adds the rows m in order. */
#include <stddef.h>

#include "linear.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

void ork_gram_tile_avx2(const float *x, size_t M, size_t K, double *g, size_t i0, size_t i1, size_t c0, size_t c1) {
    for (size_t m = 0; m < M; m++) {
        const float *xr = x + m * K;
        for (size_t i = i0; i < i1; i++) {
            const double xi = (double)xr[i];
            const __m256d vi = _mm256_set1_pd(xi);
            double *gr = g + i * K;
            size_t c = c0 > i ? c0 : i;
            for (; c + 4 <= c1; c += 4) {
                const __m256d xc = _mm256_cvtps_pd(_mm_loadu_ps(xr + c));
                _mm256_storeu_pd(gr + c, _mm256_fmadd_pd(vi, xc, _mm256_loadu_pd(gr + c)));
            }
            for (; c < c1; c++) gr[c] += xi * (double)xr[c];
        }
    }
}
#else
void ork_gram_tile_avx2(const float *x, size_t M, size_t K, double *g, size_t i0, size_t i1, size_t c0, size_t c1) {
    (void)x, (void)M, (void)K, (void)g, (void)i0, (void)i1, (void)c0, (void)c1;
}
#endif
