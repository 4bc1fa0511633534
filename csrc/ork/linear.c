/* linear.c - a linear layer on its weight path (linear.h). */
#include "linear.h"

#include <stdlib.h>

#include "pack.h"
#include "pool.h"

typedef struct {
    const float *x, *w;
    size_t M, N, K;
    float *y;
} gemm_job;

static ork_status gemm_cols(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    const gemm_job *j = (const gemm_job *)ctx;
    for (size_t n = begin; n < end; n++) {
        const float *wr = j->w + n * j->K;
        for (size_t m = 0; m < j->M; m++) j->y[m * j->N + n] = ork_dot8(j->x + m * j->K, wr, j->K);
    }
    return ORK_OK;
}

/* a packed linear whose int8 matmul runs outside (int_mm) */
static ork_status linear_external(const ork_linear *l, const float *x, size_t M, float *y, ork_err *err) {
    const size_t Kp = ork_pack_round32(l->K);
    int8_t *xq = (int8_t *)malloc(M * Kp);
    float *as = (float *)malloc(M * sizeof(float));
    int32_t *acc = (int32_t *)malloc(M * l->N * sizeof(int32_t));
    ork_status st = ORK_OK;
    if (!xq || !as || !acc) st = ork_err_set(err, ORK_ENOMEM, "out of memory for an external matmul");
    if (!st) st = ork_quantize_activations(x, M, l->K, Kp, l->per_tensor_act, xq, as, err);
    if (!st) st = l->int_mm(l->int_mm_ctx, xq, M, Kp, acc, err);
    if (!st)
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < l->N; n++) y[m * l->N + n] = ork_dequant_acc(acc[m * l->N + n], as[m], l->bscale[n]);
    free(xq);
    free(as);
    free(acc);
    return st;
}

ork_status ork_linear_apply(const ork_linear *l, const float *x, size_t M, float *y, int nthreads, ork_err *err) {
    if (l->x2_sum) {
        for (size_t m = 0; m < M; m++) {
            const float *xr = x + m * l->K;
            for (size_t k = 0; k < l->K; k++) l->x2_sum[k] += (double)xr[k] * (double)xr[k];
        }
        if (l->x2_count) *l->x2_count += M;
    }
    if (l->path == ORK_LIN_F32) {
        gemm_job j = {x, l->w, M, l->N, l->K, y};
        size_t chunk = 16;
        int nt = ork_pool_threads_for(nthreads, (double)M * (double)l->N * (double)l->K, 1 << 20);
        return ork_parallel_for(nt, l->N, chunk, gemm_cols, &j, err);
    }
    if (l->int_mm) return linear_external(l, x, M, y, err);
    return ork_matmul_f32(l->kind, l->store, ork_quant_lut(l->kind), l->bscale, l->N, l->K, x, M, l->per_tensor_act, y,
                          nthreads, err);
}

ork_status ork_linear_int(const ork_linear *l, const int8_t *xq, size_t M, int32_t *acc, int nthreads, ork_err *err) {
    if (l->path != ORK_LIN_PACKED) return ork_err_set(err, ORK_EINVAL, "an int8 matmul needs a packed linear");
    if (l->int_mm) return l->int_mm(l->int_mm_ctx, xq, M, l->K, acc, err);
    return ork_matmul_int(l->kind, l->store, ork_quant_lut(l->kind), l->N, l->K, xq, M, acc, nthreads, err);
}
