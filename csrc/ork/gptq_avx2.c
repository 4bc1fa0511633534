/* gptq_avx2.c - GPTQ's float64 multiply-accumulate (gptq_kernels.h) on AVX2: 4 rows x 2
 * column quads per tile (8 ymm accumulators), _mm256_mul_pd then _mm256_add_pd (never
 * fused): each element sees the _ref's operations in its order. */
#include "gptq_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define MB 64 /* row block (its A rows stay in cache) */

void ork_gptq_acc_avx2(size_t m, size_t n, size_t k, const double *A, size_t lda, const double *Bp, size_t ts,
                       double *C, size_t ldc) {
    const size_t nq = n / 4 * 4; /* whole quads */
    for (size_t rb = 0; rb < m; rb += MB) {
        const size_t re = m - rb < MB ? m : rb + MB;
        size_t r0 = rb;
        for (; r0 + 4 <= re; r0 += 4) {
            size_t c0 = 0;
            for (; c0 + 8 <= nq; c0 += 8) {
                const double *b0 = Bp + (c0 / 4) * ts, *b1 = b0 + ts;
                double *c = C + r0 * ldc + c0;
                __m256d x00 = _mm256_loadu_pd(c), x01 = _mm256_loadu_pd(c + 4);
                __m256d x10 = _mm256_loadu_pd(c + ldc), x11 = _mm256_loadu_pd(c + ldc + 4);
                __m256d x20 = _mm256_loadu_pd(c + 2 * ldc), x21 = _mm256_loadu_pd(c + 2 * ldc + 4);
                __m256d x30 = _mm256_loadu_pd(c + 3 * ldc), x31 = _mm256_loadu_pd(c + 3 * ldc + 4);
                const double *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++) {
                    const __m256d v0 = _mm256_loadu_pd(b0 + p * 4), v1 = _mm256_loadu_pd(b1 + p * 4);
                    __m256d s = _mm256_broadcast_sd(a + p);
                    x00 = _mm256_add_pd(x00, _mm256_mul_pd(s, v0)), x01 = _mm256_add_pd(x01, _mm256_mul_pd(s, v1));
                    s = _mm256_broadcast_sd(a + lda + p);
                    x10 = _mm256_add_pd(x10, _mm256_mul_pd(s, v0)), x11 = _mm256_add_pd(x11, _mm256_mul_pd(s, v1));
                    s = _mm256_broadcast_sd(a + 2 * lda + p);
                    x20 = _mm256_add_pd(x20, _mm256_mul_pd(s, v0)), x21 = _mm256_add_pd(x21, _mm256_mul_pd(s, v1));
                    s = _mm256_broadcast_sd(a + 3 * lda + p);
                    x30 = _mm256_add_pd(x30, _mm256_mul_pd(s, v0)), x31 = _mm256_add_pd(x31, _mm256_mul_pd(s, v1));
                }
                _mm256_storeu_pd(c, x00), _mm256_storeu_pd(c + 4, x01);
                _mm256_storeu_pd(c + ldc, x10), _mm256_storeu_pd(c + ldc + 4, x11);
                _mm256_storeu_pd(c + 2 * ldc, x20), _mm256_storeu_pd(c + 2 * ldc + 4, x21);
                _mm256_storeu_pd(c + 3 * ldc, x30), _mm256_storeu_pd(c + 3 * ldc + 4, x31);
            }
            for (; c0 < nq; c0 += 4) { /* one quad */
                const double *b0 = Bp + (c0 / 4) * ts;
                double *c = C + r0 * ldc + c0;
                __m256d x0 = _mm256_loadu_pd(c), x1 = _mm256_loadu_pd(c + ldc);
                __m256d x2 = _mm256_loadu_pd(c + 2 * ldc), x3 = _mm256_loadu_pd(c + 3 * ldc);
                const double *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++) {
                    const __m256d v = _mm256_loadu_pd(b0 + p * 4);
                    x0 = _mm256_add_pd(x0, _mm256_mul_pd(_mm256_broadcast_sd(a + p), v));
                    x1 = _mm256_add_pd(x1, _mm256_mul_pd(_mm256_broadcast_sd(a + lda + p), v));
                    x2 = _mm256_add_pd(x2, _mm256_mul_pd(_mm256_broadcast_sd(a + 2 * lda + p), v));
                    x3 = _mm256_add_pd(x3, _mm256_mul_pd(_mm256_broadcast_sd(a + 3 * lda + p), v));
                }
                _mm256_storeu_pd(c, x0), _mm256_storeu_pd(c + ldc, x1);
                _mm256_storeu_pd(c + 2 * ldc, x2), _mm256_storeu_pd(c + 3 * ldc, x3);
            }
            ork_gptq_acc_tail(r0, r0 + 4, nq, n, k, A, lda, Bp, ts, C, ldc);
        }
        for (; r0 < re; r0++) { /* the block's last rows: one row, a quad at a time */
            size_t c0 = 0;
            for (; c0 < nq; c0 += 4) {
                const double *b0 = Bp + (c0 / 4) * ts;
                double *c = C + r0 * ldc + c0;
                __m256d x0 = _mm256_loadu_pd(c);
                const double *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++)
                    x0 = _mm256_add_pd(x0, _mm256_mul_pd(_mm256_broadcast_sd(a + p), _mm256_loadu_pd(b0 + p * 4)));
                _mm256_storeu_pd(c, x0);
            }
            ork_gptq_acc_tail(r0, r0 + 1, nq, n, k, A, lda, Bp, ts, C, ldc);
        }
    }
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* float32 (gptq_kernels.h, column octets): 4 rows x 2 octets per tile, _mm256_mul_ps then _mm256_add_ps */
void ork_gptq_accf_avx2(size_t m, size_t n, size_t k, const float *A, size_t lda, const float *Bp, size_t ts,
                        float *C, size_t ldc) {
    const size_t no = n / 8 * 8; /* whole octets */
    for (size_t rb = 0; rb < m; rb += MB) {
        const size_t re = m - rb < MB ? m : rb + MB;
        size_t r0 = rb;
        for (; r0 + 4 <= re; r0 += 4) {
            size_t c0 = 0;
            for (; c0 + 16 <= no; c0 += 16) {
                const float *b0 = Bp + (c0 / 8) * ts, *b1 = b0 + ts;
                float *c = C + r0 * ldc + c0;
                __m256 x00 = _mm256_loadu_ps(c), x01 = _mm256_loadu_ps(c + 8);
                __m256 x10 = _mm256_loadu_ps(c + ldc), x11 = _mm256_loadu_ps(c + ldc + 8);
                __m256 x20 = _mm256_loadu_ps(c + 2 * ldc), x21 = _mm256_loadu_ps(c + 2 * ldc + 8);
                __m256 x30 = _mm256_loadu_ps(c + 3 * ldc), x31 = _mm256_loadu_ps(c + 3 * ldc + 8);
                const float *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++) {
                    const __m256 v0 = _mm256_loadu_ps(b0 + p * 8), v1 = _mm256_loadu_ps(b1 + p * 8);
                    __m256 s = _mm256_broadcast_ss(a + p);
                    x00 = _mm256_add_ps(x00, _mm256_mul_ps(s, v0)), x01 = _mm256_add_ps(x01, _mm256_mul_ps(s, v1));
                    s = _mm256_broadcast_ss(a + lda + p);
                    x10 = _mm256_add_ps(x10, _mm256_mul_ps(s, v0)), x11 = _mm256_add_ps(x11, _mm256_mul_ps(s, v1));
                    s = _mm256_broadcast_ss(a + 2 * lda + p);
                    x20 = _mm256_add_ps(x20, _mm256_mul_ps(s, v0)), x21 = _mm256_add_ps(x21, _mm256_mul_ps(s, v1));
                    s = _mm256_broadcast_ss(a + 3 * lda + p);
                    x30 = _mm256_add_ps(x30, _mm256_mul_ps(s, v0)), x31 = _mm256_add_ps(x31, _mm256_mul_ps(s, v1));
                }
                _mm256_storeu_ps(c, x00), _mm256_storeu_ps(c + 8, x01);
                _mm256_storeu_ps(c + ldc, x10), _mm256_storeu_ps(c + ldc + 8, x11);
                _mm256_storeu_ps(c + 2 * ldc, x20), _mm256_storeu_ps(c + 2 * ldc + 8, x21);
                _mm256_storeu_ps(c + 3 * ldc, x30), _mm256_storeu_ps(c + 3 * ldc + 8, x31);
            }
            for (; c0 < no; c0 += 8) { /* one octet */
                const float *b0 = Bp + (c0 / 8) * ts;
                float *c = C + r0 * ldc + c0;
                __m256 x0 = _mm256_loadu_ps(c), x1 = _mm256_loadu_ps(c + ldc);
                __m256 x2 = _mm256_loadu_ps(c + 2 * ldc), x3 = _mm256_loadu_ps(c + 3 * ldc);
                const float *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++) {
                    const __m256 v = _mm256_loadu_ps(b0 + p * 8);
                    x0 = _mm256_add_ps(x0, _mm256_mul_ps(_mm256_broadcast_ss(a + p), v));
                    x1 = _mm256_add_ps(x1, _mm256_mul_ps(_mm256_broadcast_ss(a + lda + p), v));
                    x2 = _mm256_add_ps(x2, _mm256_mul_ps(_mm256_broadcast_ss(a + 2 * lda + p), v));
                    x3 = _mm256_add_ps(x3, _mm256_mul_ps(_mm256_broadcast_ss(a + 3 * lda + p), v));
                }
                _mm256_storeu_ps(c, x0), _mm256_storeu_ps(c + ldc, x1);
                _mm256_storeu_ps(c + 2 * ldc, x2), _mm256_storeu_ps(c + 3 * ldc, x3);
            }
            ork_gptq_accf_tail(r0, r0 + 4, no, n, k, A, lda, Bp, ts, C, ldc);
        }
        for (; r0 < re; r0++) { /* the block's last rows: one row, an octet at a time */
            size_t c0 = 0;
            for (; c0 < no; c0 += 8) {
                const float *b0 = Bp + (c0 / 8) * ts;
                float *c = C + r0 * ldc + c0;
                __m256 x0 = _mm256_loadu_ps(c);
                const float *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++)
                    x0 = _mm256_add_ps(x0, _mm256_mul_ps(_mm256_broadcast_ss(a + p), _mm256_loadu_ps(b0 + p * 8)));
                _mm256_storeu_ps(c, x0);
            }
            ork_gptq_accf_tail(r0, r0 + 1, no, n, k, A, lda, Bp, ts, C, ldc);
        }
    }
}
#endif
