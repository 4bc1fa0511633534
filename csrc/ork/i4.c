/* i4.c - the int4 storage codec and the threaded driver of the int4 x int4
 * matmul (i4.h). The kernels are in i4_ref.c / i4_avx2.c / i4_neon.c. */
#include "i4.h"

#include "pool.h"

ork_status ork_i4_pack(const int8_t *codes, size_t rows, size_t K, size_t ld, uint8_t *out, ork_err *err) {
    if (!codes || !out) return ork_err_set(err, ORK_EINVAL, "int4 pack: codes and out must not be NULL");
    if (ld < K) return ork_err_set(err, ORK_EINVAL, "int4 pack: row stride %zu is less than K = %zu", ld, K);
    const size_t rb = ork_i4_row_bytes(K);
    for (size_t r = 0; r < rows; r++) {
        const int8_t *c = codes + r * ld;
        uint8_t *o = out + r * rb;
        for (size_t k = 0; k < K; k++)
            if (c[k] < -8 || c[k] > 7)
                return ork_err_set(err, ORK_EINVAL, "int4 code %d at [%zu, %zu] is outside [-8, 7]", c[k], r, k);
        for (size_t j = 0; j < rb; j++) {
            const unsigned lo = 2 * j < K ? (unsigned)c[2 * j] & 15u : 0u;
            const unsigned hi = 2 * j + 1 < K ? (unsigned)c[2 * j + 1] & 15u : 0u;
            o[j] = (uint8_t)(lo | hi << 4);
        }
    }
    return ORK_OK;
}

ork_status ork_i4_unpack(const uint8_t *packed, size_t rows, size_t K, size_t ld, int8_t *codes, ork_err *err) {
    if (!codes || !packed) return ork_err_set(err, ORK_EINVAL, "int4 unpack: packed and codes must not be NULL");
    if (ld < K) return ork_err_set(err, ORK_EINVAL, "int4 unpack: row stride %zu is less than K = %zu", ld, K);
    const size_t rb = ork_i4_row_bytes(K), Kp = ork_i4_kpad(K);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *p = packed + r * rb;
        for (size_t k = K; k < Kp; k++)
            if (ork_i4_code(p, k) != 0)
                return ork_err_set(err, ORK_EINVAL, "int4 padding code at [%zu, %zu] is %d, not 0", r, k,
                                   ork_i4_code(p, k));
        for (size_t k = 0; k < K; k++) codes[r * ld + k] = (int8_t)ork_i4_code(p, k);
    }
    return ORK_OK;
}

ork_status ork_i4_check(const void *a, size_t M, const void *w, size_t N, size_t K, const void *out, ork_err *err) {
    if (!a || !w || !out) return ork_err_set(err, ORK_EINVAL, "int4 matmul: a, w and the output must not be NULL");
    if (M == 0 || N == 0 || K == 0)
        return ork_err_set(err, ORK_EINVAL, "int4 matmul: M, N and K must be >= 1, got M = %zu, N = %zu, K = %zu", M,
                           N, K);
    if (K > ORK_I4_MAX_K)
        return ork_err_set(err, ORK_EINVAL, "int4 matmul: K = %zu exceeds %zu (the int32 sum must fit)", K,
                           ORK_I4_MAX_K);
    return ORK_OK;
}

typedef struct i4_job {
    const ork_i4_kernels *kern;
    const uint8_t *a, *w;
    size_t M, N, Kp;
    int32_t *acc;
} i4_job;

/* weight rows [32 * begin, 32 * end): one kernel call per block of 32, whose rows stay in the
 * cache while every activation row passes over them */
static ork_status i4_blocks(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    const i4_job *j = (const i4_job *)ctx;
    const size_t rb = j->Kp / 2;
    for (size_t b = begin; b < end; b++) {
        const size_t n0 = b * 32, nn = j->N - n0 < 32 ? j->N - n0 : 32;
        j->kern->mm(j->a, j->M, j->w + n0 * rb, nn, j->Kp, j->acc + n0, j->N);
    }
    return ORK_OK;
}

ork_status ork_mm_i4_with(const ork_i4_kernels *kern, const uint8_t *a, size_t M, const uint8_t *w, size_t N,
                          size_t K, int32_t *acc, int nthreads, ork_err *err) {
    ork_status st = ork_i4_check(a, M, w, N, K, acc, err);
    if (st) return st;
    if (!kern) return ork_err_set(err, ORK_EUNAVAIL, "no int4 matmul kernels for this ISA in this build");
    i4_job j = {kern, a, w, M, N, ork_i4_kpad(K), acc};
    const size_t NB = (N + 31) / 32;
    /* as the int8 strips (pack.c run_strips): a thread from 64K multiply-adds, contiguous runs
     * of about a quarter of a thread's share */
    const int nt = ork_pool_threads_for(nthreads, (double)M * (double)N * (double)j.Kp, 65536.0);
    const size_t run = (NB + 4 * (size_t)nt - 1) / (4 * (size_t)nt);
    return ork_parallel_for(nt, NB, run, i4_blocks, &j, err);
}

ork_status ork_mm_i4(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t K, int32_t *acc, int nthreads,
                     ork_err *err) {
    return ork_mm_i4_with(ork_i4_kernels_active(), a, M, w, N, K, acc, nthreads, err);
}
