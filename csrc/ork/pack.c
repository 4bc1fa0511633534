/* pack.c - tile packing and the threaded matmul drivers (see pack.h). */
#include "pack.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "pool.h"
#include "scratch.h"

static int is4(ork_kind k) {
    const ork_kind_info *info = ork_kind_get(k);
    return info && info->bits == 4;
}

size_t ork_pack_store_bytes(ork_kind kind, size_t N, size_t K) {
    size_t shape[4];
    ork_pack_store_shape(kind, N, K, shape);
    return shape[0] * shape[1] * shape[2] * shape[3];
}

void ork_pack_store_shape(ork_kind kind, size_t N, size_t K, size_t shape[4]) {
    shape[0] = ork_pack_round32(N) / 32;
    shape[1] = ork_pack_round32(K) / 32;
    shape[2] = 32;
    shape[3] = is4(kind) ? 16 : 32;
}

static ork_status check_shape(ork_kind kind, size_t N, size_t K, ork_err *err) {
    ork_status st = ork_kind_check(kind, err);
    if (st) return st;
    if (N == 0 || K == 0) return ork_err_set(err, ORK_EINVAL, "empty weight shape (%zu, %zu)", N, K);
    if (K > ORK_PACK_MAX_K)
        return ork_err_set(err, ORK_EINVAL, "K = %zu exceeds %zu (int32 accumulators could overflow)", K,
                           ORK_PACK_MAX_K);
    if (N > ORK_PACK_MAX_N) return ork_err_set(err, ORK_EINVAL, "N = %zu exceeds %zu", N, ORK_PACK_MAX_N);
    return ORK_OK;
}

static uint8_t code_at(const uint8_t *codes, size_t rb, size_t n, size_t k) {
    uint8_t b = codes[n * rb + (k >> 1)];
    return (k & 1) ? (b >> 4) : (b & 15);
}

ork_status ork_pack(ork_kind kind, const void *codes, size_t N, size_t K, void *store, ork_err *err) {
    ork_status st = check_shape(kind, N, K, err);
    if (st) return st;
    const size_t KB = ork_pack_round32(K) / 32, NB = ork_pack_round32(N) / 32;
    if (is4(kind)) {
        const uint8_t zero = ork_kind_get(kind)->zero_code;
        const uint8_t *c = (const uint8_t *)codes;
        uint8_t *s = (uint8_t *)store;
        const size_t rb = (K + 1) / 2;
        for (size_t nb = 0; nb < NB; nb++)
            for (size_t kb = 0; kb < KB; kb++)
                for (size_t i = 0; i < 32; i++) {
                    uint8_t *row = s + ((nb * KB + kb) * 32 + i) * 16;
                    size_t n = nb * 32 + i;
                    if (n < N && (kb + 1) * 32 <= K) { /* a whole tile row: the row's 16 code bytes as they are */
                        memcpy(row, c + n * rb + kb * 16, 16);
                        continue;
                    }
                    for (size_t j = 0; j < 16; j++) {
                        size_t k0 = kb * 32 + 2 * j, k1 = k0 + 1;
                        uint8_t lo = (n < N && k0 < K) ? code_at(c, rb, n, k0) : zero;
                        uint8_t hi = (n < N && k1 < K) ? code_at(c, rb, n, k1) : zero;
                        row[j] = (uint8_t)(lo | (hi << 4));
                    }
                }
    } else {
        const int8_t *c = (const int8_t *)codes;
        int8_t *s = (int8_t *)store;
        const ork_kind_info *ki = ork_kind_get(kind);
        const int q = ki->qmax, qmin = ork_kind_qmin(ki);
        for (size_t i = 0; i < N * K; i++)
            if (c[i] < qmin || c[i] > q)
                return ork_err_set(err, ORK_EINVAL, "%s weight code %d at [%zu, %zu]: codes must be in [%d, %d]",
                                   ki->name, c[i], i / K, i % K, qmin, q);
        for (size_t nb = 0; nb < NB; nb++)
            for (size_t kb = 0; kb < KB; kb++)
                for (size_t i = 0; i < 32; i++) {
                    int8_t *row = s + ((nb * KB + kb) * 32 + i) * 32;
                    size_t n = nb * 32 + i;
                    if (n < N && (kb + 1) * 32 <= K) {
                        memcpy(row, c + n * K + kb * 32, 32);
                        continue;
                    }
                    for (size_t j = 0; j < 32; j++) {
                        size_t k = kb * 32 + j;
                        row[j] = (n < N && k < K) ? c[n * K + k] : 0;
                    }
                }
    }
    return ORK_OK;
}

ork_status ork_unpack(ork_kind kind, const void *store, size_t N, size_t K, void *codes, ork_err *err) {
    ork_status st = check_shape(kind, N, K, err);
    if (st) return st;
    const size_t KB = ork_pack_round32(K) / 32;
    if (is4(kind)) {
        const uint8_t *s = (const uint8_t *)store;
        uint8_t *c = (uint8_t *)codes;
        const size_t rb = (K + 1) / 2;
        const uint8_t zero = ork_kind_get(kind)->zero_code;
        memset(c, zero | (zero << 4), N * rb);
        for (size_t n = 0; n < N; n++)
            for (size_t k = 0; k < K; k++) {
                size_t nb = n / 32, i = n % 32, kb = k / 32, j = k % 32;
                uint8_t b = s[((nb * KB + kb) * 32 + i) * 16 + j / 2];
                uint8_t code = (j & 1) ? (b >> 4) : (b & 15);
                uint8_t *dst = &c[n * rb + k / 2];
                *dst = (k & 1) ? (uint8_t)((*dst & 0x0F) | (code << 4)) : (uint8_t)((*dst & 0xF0) | code);
            }
    } else {
        const int8_t *s = (const int8_t *)store;
        int8_t *c = (int8_t *)codes;
        for (size_t n = 0; n < N; n++)
            for (size_t k = 0; k < K; k++) {
                size_t nb = n / 32, i = n % 32, kb = k / 32, j = k % 32;
                c[n * K + k] = s[((nb * KB + kb) * 32 + i) * 32 + j];
            }
    }
    return ORK_OK;
}

/* ------------------------------------------------------------ doors --- */
ork_status ork_pack_check_store(ork_kind kind, const void *store, size_t N, size_t K, ork_err *err) {
    ork_status st = check_shape(kind, N, K, err);
    if (st || is4(kind)) return st;
    const size_t KB = ork_pack_round32(K) / 32, bytes = ork_pack_store_bytes(kind, N, K);
    const ork_kind_info *ki = ork_kind_get(kind);
    const int q = ki->qmax, qmin = ork_kind_qmin(ki);
    const uint8_t *s = (const uint8_t *)store, *hit = NULL;
    if (q == 127) hit = memchr(s, 0x80, bytes); /* int8: -128 is the one code out of range */
    else
        for (size_t i = 0; i < bytes && !hit; i++)
            if ((int8_t)s[i] < qmin || (int8_t)s[i] > q) hit = s + i;
    if (!hit) return ORK_OK;
    const size_t off = (size_t)(hit - s), tile = off / 1024, nb = tile / KB, kb = tile % KB;
    const size_t n = nb * 32 + (off % 1024) / 32, k = kb * 32 + off % 32;
    if (n < N && k < K)
        return ork_err_set(err, ORK_EINVAL, "%s weight code %d at [%zu, %zu]: codes must be in [-%d, %d]", ki->name,
                           (int8_t)*hit, n, k, q, q);
    return ork_err_set(err, ORK_EINVAL, "%s store holds %d in its padding (store byte %zu): codes must be in [-%d, %d] "
                       "and padding 0", ki->name, (int8_t)*hit, off, q, q);
}

/* the code of element idx of a store read as a little-endian stream of b-bit codes (b <= 8) of `bytes` bytes */
static unsigned stream_code(const uint8_t *s, size_t bytes, int b, size_t idx) {
    const size_t bit = (size_t)b * idx, p = bit / 8;
    unsigned v = s[p];
    if (p + 1 < bytes) v |= (unsigned)s[p + 1] << 8;
    return (v >> (bit % 8)) & ((1u << b) - 1u);
}

ork_status ork_pack_check_padding(ork_kind kind, const void *store, size_t N, size_t K, int file, uint64_t base,
                                  ork_status code, ork_err *err) {
    ork_status st = check_shape(kind, N, K, err);
    if (st) return st;
    const ork_kind_info *ki = ork_kind_get(kind);
    /* every store is a stream of b-bit codes in memory order: 4-bit nibbles (element 2j low), int8 bytes, and in a
     * file the narrow kinds' b-bit codes u = code + qmax + 1 */
    const int b = ki->bits == 4 ? 4 : file ? ki->store_bits : 8;
    const unsigned zero = ki->bits == 4 ? ki->zero_code : b == 8 ? 0u : (unsigned)(ki->qmax + 1);
    const size_t Np = ork_pack_round32(N), Kp = ork_pack_round32(K), KB = Kp / 32;
    const size_t bytes = file ? ork_pack_file_store_bytes(kind, N, K) : ork_pack_store_bytes(kind, N, K);
    const uint8_t *s = (const uint8_t *)store;
    if (Np == N && Kp == K) return ORK_OK; /* no padding lanes */
    for (size_t n = 0; n < Np; n++)
        for (size_t k = n < N ? K : 0; k < Kp; k++) { /* the lanes past K of a weight row, every lane of a padding row */
            const size_t idx = (((n / 32) * KB + k / 32) * 32 + n % 32) * 32 + k % 32;
            const unsigned u = stream_code(s, bytes, b, idx);
            if (u == zero) continue;
            const unsigned long long at = (unsigned long long)(base + (uint64_t)b * idx / 8);
            const char *where = file ? "offset" : "store byte";
            if (ki->bits == 4)
                return ork_err_set(err, code, "non-zero padding lane [%zu, %zu] (the weight is %zu x %zu): the %s store "
                                   "holds code %u at %s %llu (%s nibble), padding must be the kind's zero code %u", n, k,
                                   N, K, ki->name, u, where, at, idx % 2 ? "high" : "low", zero);
            const int v = b == 8 ? (int)(int8_t)u : (int)u - (int)zero;
            return ork_err_set(err, code, "non-zero padding lane [%zu, %zu] (the weight is %zu x %zu): the %s store holds "
                               "%d at %s %llu, padding must be 0", n, k, N, K, ki->name, v, where, at);
        }
    return ORK_OK;
}

/* ------------------------------------------------ narrow file stores --- */
size_t ork_pack_file_store_bytes(ork_kind kind, size_t N, size_t K) {
    const ork_kind_info *ki = ork_kind_get(kind);
    const size_t b = ork_pack_store_bytes(kind, N, K);
    return !ki || ki->bits != 8 ? b : b / 8 * (size_t)ki->store_bits;
}

ork_status ork_pack_bits(ork_kind kind, const int8_t *store, size_t n, uint8_t *out, ork_err *err) {
    const ork_kind_info *ki = ork_kind_get(kind);
    if (!ki || ki->bits != 8 || n % 8)
        return ork_err_set(err, ORK_EINVAL, "pack_bits: an 8-bit kind and a multiple of 8 codes are needed");
    const int b = ki->store_bits, q = ki->qmax, bias = q + 1, qmin = ork_kind_qmin(ki);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t acc = 0;
        for (int j = 0; j < 8; j++) {
            const int c = store[i + (size_t)j];
            if (c < qmin || c > q)
                return ork_err_set(err, ORK_EINVAL, "%s store code %d at %zu is outside [%d, %d]", ki->name, c,
                                   i + (size_t)j, qmin, q);
            acc |= (uint64_t)(unsigned)(c + bias) << (b * j);
        }
        for (int j = 0; j < b; j++) out[i / 8 * (size_t)b + (size_t)j] = (uint8_t)(acc >> (8 * j));
    }
    return ORK_OK;
}

ork_status ork_unpack_bits(ork_kind kind, const uint8_t *in, size_t n, int8_t *store, ork_err *err) {
    const ork_kind_info *ki = ork_kind_get(kind);
    if (!ki || ki->bits != 8 || n % 8)
        return ork_err_set(err, ORK_EINVAL, "unpack_bits: an 8-bit kind and a multiple of 8 codes are needed");
    const int b = ki->store_bits, bias = ki->qmax + 1, qmin = ork_kind_qmin(ki);
    const uint64_t mask = ((uint64_t)1 << b) - 1;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t acc = 0;
        for (int j = 0; j < b; j++) acc |= (uint64_t)in[i / 8 * (size_t)b + (size_t)j] << (8 * j);
        for (int j = 0; j < 8; j++) {
            const unsigned u = (unsigned)((acc >> (b * j)) & mask);
            if ((int)u - bias < qmin)
                return ork_err_set(err, ORK_EFORMAT, "%s store code %zu is %d, outside [%d, %d]", ki->name,
                                   i + (size_t)j, -bias, qmin, ki->qmax);
            if (store) store[i + (size_t)j] = (int8_t)((int)u - bias);
        }
    }
    return ORK_OK;
}

double ork_pack_max_scale(size_t K) { return (double)FLT_MAX / (127.0 * 127.0 * (double)(K ? K : 1)); }

ork_status ork_pack_check_scales(const float *bscale, size_t N, size_t K, ork_status code, ork_err *err) {
    const double cap = ork_pack_max_scale(K);
    for (size_t n = 0; n < N; n++) {
        float s = bscale[n];
        if (!isfinite(s) || s < 0.0f || (s == 0.0f && signbit(s)))
            return ork_err_set(err, code, "scale[%zu] = %g is not a finite non-negative number", n, (double)s);
        if ((double)s > cap)
            return ork_err_set(err, code, "scale[%zu] = %g exceeds %g, the largest scale for K = %zu (scale * 127 * 127 "
                               "* K must fit float32)", n, (double)s, cap, K);
    }
    return ORK_OK;
}

ork_status ork_pack_check_gscales(const float *bscale, size_t N, size_t G, size_t K, ork_status code, ork_err *err) {
    if (G <= 1) return ork_pack_check_scales(bscale, N, K, code, err);
    /* every group's |acc| sums to at most 127 * 127 * K over the row, so the per-row cap still bounds y */
    const double cap = ork_pack_max_scale(K);
    for (size_t i = 0; i < N * G; i++) {
        float s = bscale[i];
        if (!isfinite(s) || s < 0.0f || (s == 0.0f && signbit(s)))
            return ork_err_set(err, code, "scale[%zu, %zu] = %g is not a finite non-negative number", i / G, i % G,
                               (double)s);
        if ((double)s > cap)
            return ork_err_set(err, code, "scale[%zu, %zu] = %g exceeds %g, the largest scale for K = %zu (scale * 127 * "
                               "127 * K must fit float32)", i / G, i % G, (double)s, cap, K);
    }
    return ORK_OK;
}

/* ----------------------------------------------------- activations ---- */
ork_status ork_quantize_activations(const float *x, size_t M, size_t K, size_t ldq, int per_tensor,
                                    int8_t *xq, float *ascale, ork_err *err) {
    ork_act_spec spec = ORK_ACT_SPEC_INIT;
    spec.mode = per_tensor ? ORK_ACT_MODE_PER_TENSOR : ORK_ACT_MODE_PER_TOKEN;
    return ork_quantize_acts(x, M, K, ldq, &spec, xq, ascale, err);
}

/* ---------------------------------------------------------- drivers --- */
typedef struct {
    int four;
    const uint8_t *store;
    const int8_t *lut;
    size_t N, KB, M, ldx;
    const int8_t *x;
    int32_t *out_i;          /* int path */
    float *out_f;            /* float path */
    const float *ascale, *bscale;
    const ork_matmul_kernels *mk;
    size_t gt;               /* grouped weights: tiles per group (group / 32); 0 per channel */
    size_t ags;              /* grouped activations: M (ascale (G, M)); 0: one scale per row */
} mm_job;

/* acc (M x 32) of tiles [kb0, kb0 + kbn) of strip nb (buf: the strip inflated, 4-bit with M > 1) */
static void strip_part(const mm_job *j, size_t nb, const int8_t *buf, size_t kb0, size_t kbn, int32_t *acc) {
    const size_t strip_tiles = j->KB * 32;
    if (j->four) {
        if (j->M == 1) j->mk->gemv_strip_i4(j->store + nb * strip_tiles * 16 + kb0 * 512, kbn, j->lut, j->x + kb0 * 32, acc);
        else j->mk->gemm_strip_i8(buf + kb0 * 1024, kbn, j->x + kb0 * 32, j->ldx, j->M, acc);
    } else {
        j->mk->gemm_strip_i8((const int8_t *)j->store + nb * strip_tiles * 32 + kb0 * 1024, kbn, j->x + kb0 * 32, j->ldx,
                             j->M, acc);
    }
}

/* the strips of a grouped weight: per-group partial sums (int path: out_i (G, M, N)) or the
 * grouped float output (pack.h, "Group-wise scales") */
static ork_status mm_strips_grouped(void *ctx, size_t begin, size_t end, ork_err *err) {
    const mm_job *j = (const mm_job *)ctx;
    const size_t KB = j->KB, G = (KB + j->gt - 1) / j->gt, M = j->M, N = j->N;
    _Alignas(64) int32_t acc_s[256]; /* decode sizes: no heap (scratch.h) */
    _Alignas(64) float y_s[256], sb_s[2048];
    int32_t *acc = (int32_t *)ork_scratch(acc_s, sizeof acc_s, M * 32 * sizeof(int32_t));
    int8_t *buf = (j->four && M > 1) ? (int8_t *)malloc(KB * 32 * 32) : NULL;
    float *y = j->out_f ? (float *)ork_scratch(y_s, sizeof y_s, M * 32 * sizeof(float)) : NULL;
    float *sb = j->out_f ? (float *)ork_scratch(sb_s, sizeof sb_s, G * 32 * sizeof(float)) : NULL;
    if (!acc || (j->four && M > 1 && !buf) || (j->out_f && (!y || !sb))) {
        ork_scratch_free(acc, acc_s);
        free(buf);
        ork_scratch_free(y, y_s);
        ork_scratch_free(sb, sb_s);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for a matmul strip (M = %zu, K = %zu)", M, KB * 32);
    }
    for (size_t nb = begin; nb < end; nb++) {
        size_t n0 = nb * 32, nn = (N - n0 < 32) ? N - n0 : 32;
        if (buf) j->mk->inflate_strip(j->store + nb * KB * 32 * 16, KB, j->lut, buf);
        if (sb)
            for (size_t g = 0; g < G; g++)
                for (size_t i = 0; i < 32; i++) sb[g * 32 + i] = i < nn ? j->bscale[(n0 + i) * G + g] : 0.0f;
        for (size_t g = 0; g < G; g++) {
            size_t kb0 = g * j->gt, kbn = KB - kb0 < j->gt ? KB - kb0 : j->gt;
            strip_part(j, nb, buf, kb0, kbn, acc);
            if (y) j->mk->acc_group(acc, M, j->ascale + g * j->ags, sb + g * 32, g == 0, y);
            else
                for (size_t m = 0; m < M; m++) memcpy(j->out_i + (g * M + m) * N + n0, acc + m * 32, nn * sizeof(int32_t));
        }
        if (y)
            for (size_t m = 0; m < M; m++) memcpy(j->out_f + m * N + n0, y + m * 32, nn * sizeof(float));
    }
    ork_scratch_free(acc, acc_s);
    free(buf);
    ork_scratch_free(y, y_s);
    ork_scratch_free(sb, sb_s);
    return ORK_OK;
}

static ork_status mm_strips(void *ctx, size_t begin, size_t end, ork_err *err) {
    const mm_job *j = (const mm_job *)ctx;
    const size_t KB = j->KB, strip_tiles = KB * 32;
    _Alignas(64) int32_t acc_s[256]; /* decode sizes: no heap (scratch.h) */
    int32_t *acc = (int32_t *)ork_scratch(acc_s, sizeof acc_s, j->M * 32 * sizeof(int32_t));
    int8_t *buf = (j->four && j->M > 1) ? (int8_t *)malloc(strip_tiles * 32) : NULL;
    if (!acc || (j->four && j->M > 1 && !buf)) {
        ork_scratch_free(acc, acc_s);
        free(buf);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for a matmul strip (M = %zu, K = %zu)", j->M, KB * 32);
    }
    for (size_t nb = begin; nb < end; nb++) {
        if (j->four) {
            const uint8_t *nib = j->store + nb * strip_tiles * 16;
            if (j->M == 1) j->mk->gemv_strip_i4(nib, KB, j->lut, j->x, acc);
            else {
                j->mk->inflate_strip(nib, KB, j->lut, buf);
                j->mk->gemm_strip_i8(buf, KB, j->x, j->ldx, j->M, acc);
            }
        } else {
            j->mk->gemm_strip_i8((const int8_t *)j->store + nb * strip_tiles * 32, KB, j->x, j->ldx, j->M, acc);
        }
        size_t n0 = nb * 32, nn = (j->N - n0 < 32) ? j->N - n0 : 32;
        for (size_t m = 0; m < j->M; m++) {
            const int32_t *a = acc + m * 32;
            if (j->out_i) memcpy(j->out_i + m * j->N + n0, a, nn * sizeof(int32_t));
            else {
                float as = j->ascale[m];
                float *o = j->out_f + m * j->N + n0;
                for (size_t i = 0; i < nn; i++) o[i] = ork_dequant_acc(a[i], as, j->bscale[n0 + i]);
            }
        }
    }
    ork_scratch_free(acc, acc_s);
    free(buf);
    return ORK_OK;
}

/* Strips over threads. A decoded token's GEMVs (M = 1) are small (SmolLM2's q: 576 x 576) and
 * memory-bound, so a thread is worth its hand-off from 64K multiply-adds on (measured on
 * SmolLM2 decode, bench/decode.py: 1<<20 left every block linear on one thread). Each thread
 * takes contiguous runs of about a quarter of its share: a strip per grab sent alternate strips
 * to alternate threads, which breaks each thread's sequential stream through the store (int8
 * decode at 2 threads: 130 tok/s with a strip per grab, 178 with runs). A strip's result does
 * not depend on which thread computes it or with which neighbours. */
static ork_status run_strips(mm_job *j, const ork_matmul_kernels *mk, int nthreads, ork_err *err) {
    j->mk = mk ? mk : ork_matmul_kernels_active();
    size_t NB = ork_pack_round32(j->N) / 32;
    int nt = ork_pool_threads_for(nthreads, (double)j->M * (double)j->N * (double)j->KB * 32.0, 65536.0);
    size_t run = (NB + 4 * (size_t)nt - 1) / (4 * (size_t)nt);
    return ork_parallel_for(nt, NB, run, j->gt ? mm_strips_grouped : mm_strips, j, err);
}

static ork_status matmul_int_g(ork_kind kind, const void *store, const int8_t lut[16], size_t group, size_t N, size_t K,
                               const int8_t *xq, size_t M, int32_t *out, int nthreads, ork_err *err) {
    ork_status st = check_shape(kind, N, K, err);
    if (st == ORK_OK) st = ork_group_check(group, err);
    if (st) return st;
    if (M == 0) return ork_err_set(err, ORK_EINVAL, "activations must have at least one row");
    if (is4(kind) && !lut) return ork_err_set(err, ORK_EINVAL, "a 4-bit weight needs its LUT");
    size_t Kp = ork_pack_round32(K);
    int8_t *xp = (int8_t *)calloc(M * Kp, 1);
    if (!xp) return ork_err_set(err, ORK_ENOMEM, "out of memory for padded activations");
    int has_m128 = 0;
    for (size_t m = 0; m < M; m++) {
        memcpy(xp + m * Kp, xq + m * K, K);
        if (!has_m128 && memchr(xq + m * K, 0x80, K)) has_m128 = 1;
    }
    if (has_m128 && K >= ORK_PACK_MAX_K) {
        free(xp);
        return ork_err_set(err, ORK_EINVAL, "activations of -128 need K < %zu (K * 128 * 128 must fit int32), got K = %zu",
                           ORK_PACK_MAX_K, K);
    }
    mm_job j = {is4(kind), (const uint8_t *)store, lut, N, Kp / 32, M, Kp, xp, out, NULL, NULL, NULL, NULL,
                group && group < K ? group / 32 : 0};
    /* the SIMD kernels are exact for activations in [-127, 127]; -128 takes the scalar kernels, exact for any int8 */
    st = run_strips(&j, has_m128 ? &ork_matmul_kernels_ref : NULL, nthreads, err);
    free(xp);
    return st;
}

ork_status ork_matmul_int(ork_kind kind, const void *store, const int8_t lut[16], size_t N, size_t K,
                          const int8_t *xq, size_t M, int32_t *out, int nthreads, ork_err *err) {
    return matmul_int_g(kind, store, lut, 0, N, K, xq, M, out, nthreads, err);
}

ork_status ork_matmul_int_grouped(ork_kind kind, const void *store, const int8_t lut[16], size_t group, size_t N,
                                  size_t K, const int8_t *xq, size_t M, int32_t *out, int nthreads, ork_err *err) {
    return matmul_int_g(kind, store, lut, group, N, K, xq, M, out, nthreads, err);
}

ork_status ork_matmul_q8_grouped(ork_kind kind, const void *store, const int8_t lut[16], const float *bscale,
                                 size_t group, size_t N, size_t K, const int8_t *xq, const float *ascale, int act_groups,
                                 size_t M, float *out, int nthreads, ork_err *err) {
    ork_status st = check_shape(kind, N, K, err);
    if (st == ORK_OK) st = ork_group_check(group, err);
    if (st) return st;
    if (M == 0) return ork_err_set(err, ORK_EINVAL, "activations must have at least one row");
    if (is4(kind) && !lut) return ork_err_set(err, ORK_EINVAL, "a 4-bit weight needs its LUT");
    size_t Kp = ork_pack_round32(K);
    mm_job j = {is4(kind), (const uint8_t *)store, lut, N, Kp / 32, M, Kp, xq, NULL, out, ascale, bscale, NULL,
                group && group < K ? group / 32 : 0, act_groups && group && group < K ? M : 0};
    return run_strips(&j, NULL, nthreads, err);
}

ork_status ork_matmul_q8(ork_kind kind, const void *store, const int8_t lut[16], const float *bscale, size_t N,
                         size_t K, const int8_t *xq, const float *ascale, size_t M, float *out, int nthreads,
                         ork_err *err) {
    return ork_matmul_q8_grouped(kind, store, lut, bscale, 0, N, K, xq, ascale, 0, M, out, nthreads, err);
}

ork_status ork_matmul_f32(ork_kind kind, const void *store, const int8_t lut[16], const float *bscale,
                          size_t N, size_t K, const float *x, size_t M, int per_tensor, float *out,
                          int nthreads, ork_err *err) {
    ork_status st = check_shape(kind, N, K, err);
    if (st) return st;
    if (M == 0) return ork_err_set(err, ORK_EINVAL, "activations must have at least one row");
    size_t Kp = ork_pack_round32(K);
    int8_t *xp = (int8_t *)malloc(M * Kp);
    float *as = (float *)malloc(M * sizeof(float));
    if (!xp || !as) {
        free(xp);
        free(as);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for quantized activations");
    }
    st = ork_quantize_activations(x, M, K, Kp, per_tensor, xp, as, err);
    if (st == ORK_OK) st = ork_matmul_q8(kind, store, lut, bscale, N, K, xp, as, M, out, nthreads, err);
    free(xp);
    free(as);
    return st;
}

int8_t ork_pack_value(ork_kind kind, const void *store, size_t K, size_t n, size_t k) {
    const size_t KB = ork_pack_round32(K) / 32, at = ((n / 32 * KB + k / 32) * 32 + n % 32) * 32 + k % 32;
    if (!is4(kind)) return ((const int8_t *)store)[at];
    uint8_t b = ((const uint8_t *)store)[at / 2];
    return ork_quant_lut(kind)[(k & 1) ? (b >> 4) : (b & 15)];
}
