/* gptq_neon.c - GPTQ's float64 multiply-accumulate (gptq_kernels.h) on NEON: 4 rows x one
 * column quad per tile (8 float64x2 accumulators), vmulq_f64 then vaddq_f64 (never fused):
 * each element sees the _ref's operations in its order. */
#include "gptq_kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#define MB 64 /* row block (its A rows stay in cache) */

void ork_gptq_acc_neon(size_t m, size_t n, size_t k, const double *A, size_t lda, const double *Bp, size_t ts,
                       double *C, size_t ldc) {
    const size_t nq = n / 4 * 4;
    for (size_t rb = 0; rb < m; rb += MB) {
        const size_t re = m - rb < MB ? m : rb + MB;
        size_t r0 = rb;
        for (; r0 + 4 <= re; r0 += 4) {
            for (size_t c0 = 0; c0 < nq; c0 += 4) {
                const double *b = Bp + (c0 / 4) * ts;
                double *c = C + r0 * ldc + c0;
                float64x2_t x00 = vld1q_f64(c), x01 = vld1q_f64(c + 2);
                float64x2_t x10 = vld1q_f64(c + ldc), x11 = vld1q_f64(c + ldc + 2);
                float64x2_t x20 = vld1q_f64(c + 2 * ldc), x21 = vld1q_f64(c + 2 * ldc + 2);
                float64x2_t x30 = vld1q_f64(c + 3 * ldc), x31 = vld1q_f64(c + 3 * ldc + 2);
                const double *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++) {
                    const float64x2_t v0 = vld1q_f64(b + p * 4), v1 = vld1q_f64(b + p * 4 + 2);
                    float64x2_t s = vdupq_n_f64(a[p]);
                    x00 = vaddq_f64(x00, vmulq_f64(s, v0)), x01 = vaddq_f64(x01, vmulq_f64(s, v1));
                    s = vdupq_n_f64(a[lda + p]);
                    x10 = vaddq_f64(x10, vmulq_f64(s, v0)), x11 = vaddq_f64(x11, vmulq_f64(s, v1));
                    s = vdupq_n_f64(a[2 * lda + p]);
                    x20 = vaddq_f64(x20, vmulq_f64(s, v0)), x21 = vaddq_f64(x21, vmulq_f64(s, v1));
                    s = vdupq_n_f64(a[3 * lda + p]);
                    x30 = vaddq_f64(x30, vmulq_f64(s, v0)), x31 = vaddq_f64(x31, vmulq_f64(s, v1));
                }
                vst1q_f64(c, x00), vst1q_f64(c + 2, x01);
                vst1q_f64(c + ldc, x10), vst1q_f64(c + ldc + 2, x11);
                vst1q_f64(c + 2 * ldc, x20), vst1q_f64(c + 2 * ldc + 2, x21);
                vst1q_f64(c + 3 * ldc, x30), vst1q_f64(c + 3 * ldc + 2, x31);
            }
            ork_gptq_acc_tail(r0, r0 + 4, nq, n, k, A, lda, Bp, ts, C, ldc);
        }
        ork_gptq_acc_tail(r0, re, 0, n, k, A, lda, Bp, ts, C, ldc); /* the block's last rows */
    }
}
#endif

#if defined(__aarch64__)
/* float32 (gptq_kernels.h, column octets): 4 rows x one octet per tile (8 float32x4 accumulators),
 * vmulq_f32 then vaddq_f32 */
void ork_gptq_accf_neon(size_t m, size_t n, size_t k, const float *A, size_t lda, const float *Bp, size_t ts,
                        float *C, size_t ldc) {
    const size_t no = n / 8 * 8;
    for (size_t rb = 0; rb < m; rb += MB) {
        const size_t re = m - rb < MB ? m : rb + MB;
        size_t r0 = rb;
        for (; r0 + 4 <= re; r0 += 4) {
            for (size_t c0 = 0; c0 < no; c0 += 8) {
                const float *b = Bp + (c0 / 8) * ts;
                float *c = C + r0 * ldc + c0;
                float32x4_t x00 = vld1q_f32(c), x01 = vld1q_f32(c + 4);
                float32x4_t x10 = vld1q_f32(c + ldc), x11 = vld1q_f32(c + ldc + 4);
                float32x4_t x20 = vld1q_f32(c + 2 * ldc), x21 = vld1q_f32(c + 2 * ldc + 4);
                float32x4_t x30 = vld1q_f32(c + 3 * ldc), x31 = vld1q_f32(c + 3 * ldc + 4);
                const float *a = A + r0 * lda;
                for (size_t p = 0; p < k; p++) {
                    const float32x4_t v0 = vld1q_f32(b + p * 8), v1 = vld1q_f32(b + p * 8 + 4);
                    float32x4_t s = vdupq_n_f32(a[p]);
                    x00 = vaddq_f32(x00, vmulq_f32(s, v0)), x01 = vaddq_f32(x01, vmulq_f32(s, v1));
                    s = vdupq_n_f32(a[lda + p]);
                    x10 = vaddq_f32(x10, vmulq_f32(s, v0)), x11 = vaddq_f32(x11, vmulq_f32(s, v1));
                    s = vdupq_n_f32(a[2 * lda + p]);
                    x20 = vaddq_f32(x20, vmulq_f32(s, v0)), x21 = vaddq_f32(x21, vmulq_f32(s, v1));
                    s = vdupq_n_f32(a[3 * lda + p]);
                    x30 = vaddq_f32(x30, vmulq_f32(s, v0)), x31 = vaddq_f32(x31, vmulq_f32(s, v1));
                }
                vst1q_f32(c, x00), vst1q_f32(c + 4, x01);
                vst1q_f32(c + ldc, x10), vst1q_f32(c + ldc + 4, x11);
                vst1q_f32(c + 2 * ldc, x20), vst1q_f32(c + 2 * ldc + 4, x21);
                vst1q_f32(c + 3 * ldc, x30), vst1q_f32(c + 3 * ldc + 4, x31);
            }
            ork_gptq_accf_tail(r0, r0 + 4, no, n, k, A, lda, Bp, ts, C, ldc);
        }
        ork_gptq_accf_tail(r0, re, 0, n, k, A, lda, Bp, ts, C, ldc); /* the block's last rows */
    }
}
#endif
