/* linear.h - one linear layer y = x W^T on its weight path: the unit the
 * forward pass (model.c) and the fused FFN chain (ffn_chain.c) both apply
 * their linears through.
 *
 * Paths:
 *   ORK_LIN_F32     W float32 (N, K) row-major; y[m][n] = ork_dot8(x[m], W[n], K)
 *                   (fixed 8-lane order, so the thread count never matters).
 *   ORK_LIN_PACKED  W a packed store of a registered kind (pack.h, quant.h);
 *                   activations quantized to int8 (per token, or per tensor
 *                   when per_tensor_act), int32 accumulation on the CPU
 *                   kernels or on an external backend (int_mm, e.g. an NPU),
 *                   y[m][n] = ork_dequant_acc(acc[m][n], a[m], bscale[n])
 *                   on both, so the output is bit-identical whenever the
 *                   int32 accumulators are.
 * Importance statistics: when x2_sum is set, every ork_linear_apply adds
 * sum over rows of x[m][k]^2 to x2_sum[k] (double, rows in order) and the row
 * count to *x2_count -- llama.cpp's imatrix in_sum2 / counts.
 */
#ifndef ORK_LINEAR_H
#define ORK_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

typedef enum { ORK_LIN_F32 = 0, ORK_LIN_PACKED = 1 } ork_lin_path;

/* An external int8 matmul for a packed linear (an NPU backend):
 * acc (M, N) int32 = xq (M rows of K values, row stride ldq >= K) times the
 * linear's int8 weight values. */
typedef ork_status (*ork_int_mm_fn)(void *ctx, const int8_t *xq, size_t M, size_t ldq, int32_t *acc, ork_err *err);

typedef struct ork_linear {
    ork_lin_path path;
    size_t N, K;
    const float *w;        /* ORK_LIN_F32: (N, K) row-major */
    ork_kind kind;         /* ORK_LIN_PACKED: */
    const void *store;
    const float *bscale;
    int per_tensor_act;
    double *x2_sum;        /* optional importance statistics (see above) */
    uint64_t *x2_count;
    ork_int_mm_fn int_mm;  /* optional (ORK_LIN_PACKED): the int8 matmul runs there */
    void *int_mm_ctx;
} ork_linear;

/* dot of n floats in 8 interleaved lanes, combined in a fixed tree, tail last */
static inline float ork_dot8(const float *a, const float *b, size_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[k + l] * b[k + l];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* y (M, N) float32 = x (M, K) W^T on the linear's path (see above). */
ork_status ork_linear_apply(const ork_linear *l, const float *x, size_t M, float *y, int nthreads, ork_err *err);

/* The int8 matmul of a packed linear: acc (M, N) int32 for int8 activations
 * xq (M rows of K values, stride K), on its external backend when int_mm is
 * set, else the CPU kernels. No importance statistics. */
ork_status ork_linear_int(const ork_linear *l, const int8_t *xq, size_t M, int32_t *acc, int nthreads, ork_err *err);

#endif
