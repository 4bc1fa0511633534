/* test_gemm_f32.c - the float32 GEMM kernels (gemm_f32.h): every SIMD table of
 * this build (AVX2; NEON on aarch64) bit-identical to the scalar _ref over
 * edge shapes (tails of the 6 x 16 tiles, K blocks, column ranges that start
 * mid-panel, row strides), outputs outside the column range untouched, the
 * contract itself (one fused multiply-add per term, in k order) on every
 * ISA, and the F32 linear (linear.c) on 1, 2 and 3 threads against the _ref.
 * Prints failures and a closing "N passed, N failed" line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/cpu.h"
#include "../../csrc/ork/gemm_f32.h"
#include "../../csrc/ork/linear.h"
#include "check.h"

static uint64_t st = 0x9E3779B97F4A7C15ULL;
static float rnd_f(void) { return check_rnd_f(&st, 17, 7); }

static const float SENTINEL = 12345.0f;
static float *scratch; /* ORK_GEMM_F32_SCRATCH floats; offset by one float where a test wants it unaligned */

/* one shape: ref and kv over columns [n0, n1) of N, strides with slack */
static void compare_shape(const ork_gemm_f32_kernels *kv, size_t M, size_t N, size_t K, size_t n0, size_t n1) {
    const size_t ldx = K + 3, ldw = K + 5, ldy = N + 2;
    float *x = malloc((M * ldx + 1) * sizeof(float)), *w = malloc((N * ldw + 1) * sizeof(float));
    float *y1 = malloc(M * ldy * sizeof(float)), *y2 = malloc(M * ldy * sizeof(float));
    for (size_t i = 0; i < M * ldx; i++) x[i] = rnd_f();
    for (size_t i = 0; i < N * ldw; i++) w[i] = rnd_f();
    for (size_t i = 0; i < M * ldy; i++) y1[i] = y2[i] = SENTINEL;
    ork_gemm_f32_kernels_ref.cols(x, ldx, M, K, w, ldw, n0, n1, y1, ldy, scratch);
    kv->cols(x, ldx, M, K, w, ldw, n0, n1, y2, ldy, scratch + (K & 1));
    CHECK(memcmp(y1, y2, M * ldy * sizeof(float)) == 0, "%s M=%zu N=%zu K=%zu cols [%zu, %zu)", kv->isa, M, N, K,
          n0, n1);
    int untouched = 1, close = 1;
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < ldy; n++) {
            float v = y2[m * ldy + n];
            if (n < n0 || n >= n1) {
                untouched &= v == SENTINEL;
                continue;
            }
            double d = 0.0, mag = 0.0;
            for (size_t k = 0; k < K; k++) {
                d += (double)x[m * ldx + k] * (double)w[n * ldw + k];
                mag += fabs((double)x[m * ldx + k] * (double)w[n * ldw + k]);
            }
            close &= fabs((double)v - d) <= (double)(K + 1) * 0x1p-24 * mag; /* a chain's error bound */
        }
    CHECK(untouched, "%s M=%zu N=%zu K=%zu: wrote outside [%zu, %zu)", kv->isa, M, N, K, n0, n1);
    CHECK(close, "%s M=%zu N=%zu K=%zu: far from the float64 product", kv->isa, M, N, K);
    free(x); free(w); free(y1); free(y2);
}

static void compare_tables(const ork_gemm_f32_kernels *kv) {
    printf("comparing %s against scalar\n", kv->isa);
    const size_t Ms[] = {1, 2, 5, 6, 7, 8, 13, 16, 17}; /* AVX2 tiles of 6 rows, AVX-512 of 8 */
    const size_t Ks[] = {1, 3, 8, 17, 256, 257, 600, 1025, 2100}; /* 1025, 2100: two and three K blocks */
    const size_t Ns[] = {1, 15, 16, 17, 40};
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
        for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++)
            for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++) compare_shape(kv, Ms[a], Ns[c], Ks[b], 0, Ns[c]);
    /* column ranges that start and end mid-panel */
    compare_shape(kv, 7, 40, 33, 3, 37);
    compare_shape(kv, 6, 70, 1100, 17, 50);
    compare_shape(kv, 1, 40, 9, 39, 40);
    /* M = 1 (the decode path, no packing): row groups of 16 / 8 / 4 and leftovers, K tails of 1 .. 3,
     * strided rows, ranges starting mid-group */
    compare_shape(kv, 1, 45, 579, 0, 45);
    compare_shape(kv, 1, 77, 1027, 5, 74);
    compare_shape(kv, 1, 3, 2, 0, 3);
    /* K = 0: the empty chain is +0.0f */
    float x = 1, w = 1, y[2] = {SENTINEL, SENTINEL};
    kv->cols(&x, 1, 1, 0, &w, 1, 0, 1, y, 2, scratch);
    CHECK(y[0] == 0.0f && !signbit(y[0]) && y[1] == SENTINEL, "%s K=0 gives %g", kv->isa, (double)y[0]);
}

/* the contract: c1 = fma(-1, 1 + 2^-11, +0) = -(1 + 2^-11); c2 = fma(1 + 2^-12, 1 + 2^-12, c1) = 2^-24
 * exactly, where a rounded product (1 + 2^-11) would cancel to 0 */
static void fused_chain(const ork_gemm_f32_kernels *kv) {
    const float e12 = ldexpf(1.0f, -12), e11 = ldexpf(1.0f, -11);
    float x[2 * 8], w[2 * 20], y[8 * 20];
    for (size_t m = 0; m < 8; m++) { x[2 * m] = -1.0f; x[2 * m + 1] = 1.0f + e12; }
    for (size_t n = 0; n < 20; n++) { w[2 * n] = 1.0f + e11; w[2 * n + 1] = 1.0f + e12; }
    kv->cols(x, 2, 8, 2, w, 2, 0, 20, y, 20, scratch);
    int ok = 1;
    for (size_t i = 0; i < 8 * 20; i++) ok &= y[i] == ldexpf(1.0f, -24);
    CHECK(ok, "%s: not one fused multiply-add per term (got %g)", kv->isa, (double)y[0]);
    /* the same at M = 1 (the unpacked path) over 20 rows: two of its row groups and a leftover */
    kv->cols(x, 2, 1, 2, w, 2, 0, 20, y, 20, scratch);
    ok = 1;
    for (size_t i = 0; i < 20; i++) ok &= y[i] == ldexpf(1.0f, -24);
    CHECK(ok, "%s M=1: not one fused multiply-add per term (got %g)", kv->isa, (double)y[0]);
    /* terms in k order: (1e8 - 1e8) + 1 = 1, whereas 1e8 + (1 - 1e8) would be 0 */
    float x3[3] = {1e8f, -1e8f, 1.0f}, w3[3] = {1.0f, 1.0f, 1.0f}, y3 = 0;
    kv->cols(x3, 3, 1, 3, w3, 3, 0, 1, &y3, 1, scratch);
    CHECK(y3 == 1.0f, "%s: terms not in k order (got %g)", kv->isa, (double)y3);
    /* and through the vector steps of M = 1: 16 rows, 8 terms, the cancellation at terms 4 and 5 */
    float x8[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 1e8f, -1e8f, 1.0f, 2.0f}, w8[16 * 8], y8[16];
    for (size_t i = 0; i < 16 * 8; i++) w8[i] = 1.0f;
    kv->cols(x8, 8, 1, 8, w8, 8, 0, 16, y8, 16, scratch);
    ok = 1;
    for (size_t i = 0; i < 16; i++) ok &= y8[i] == 3.0f; /* ((0.9375 + 1e8) - 1e8) = 0 in float: 0 + 1 + 2 */
    CHECK(ok, "%s M=1: terms not in k order (got %g)", kv->isa, (double)y8[0]);
}

/* the F32 linear on the active ISA, 1..3 threads, against the _ref */
static void linear_threads_m(size_t M, size_t N, size_t K) {
    float *x = malloc(M * K * sizeof(float)), *w = malloc(N * K * sizeof(float));
    float *ref = malloc(M * N * sizeof(float)), *y = malloc(M * N * sizeof(float));
    for (size_t i = 0; i < M * K; i++) x[i] = rnd_f();
    for (size_t i = 0; i < N * K; i++) w[i] = rnd_f();
    ork_gemm_f32_kernels_ref.cols(x, K, M, K, w, K, 0, N, ref, N, scratch);
    ork_linear l;
    memset(&l, 0, sizeof l);
    l.path = ORK_LIN_F32;
    l.N = N;
    l.K = K;
    l.w = w;
    for (int nt = 1; nt <= 3; nt++) {
        ork_err err;
        memset(y, 0, M * N * sizeof(float));
        ork_status s = ork_linear_apply(&l, x, M, y, nt, &err);
        CHECK(s == ORK_OK && memcmp(y, ref, M * N * sizeof(float)) == 0, "linear (%s) %d threads",
              ork_gemm_f32_kernels_active()->isa, nt);
    }
    free(x); free(w); free(ref); free(y);
}

/* M = 11, and M = 1 with enough work (600 x 600 = 360K multiply-adds) for 2 and 3 threads */
static void linear_threads(void) {
    linear_threads_m(11, 300, 270);
    linear_threads_m(1, 600, 600);
}

int main(void) {
    int tested = 0;
    scratch = aligned_alloc(64, (ORK_GEMM_F32_SCRATCH + 16) * sizeof(float));
#if defined(__x86_64__)
    if (ork_isa_available(ORK_ISA_AVX2)) { compare_tables(&ork_gemm_f32_kernels_avx2); tested++; }
    if (ork_isa_available(ORK_ISA_AVX2) && (ork_cpu_features() & ORK_CPU_AVX512)) {
        compare_tables(&ork_gemm_f32_kernels_avx512);
        fused_chain(&ork_gemm_f32_kernels_avx512);
    } else {
        printf("avx512 table not run: this CPU lacks avx512f/vl/bw/dq\n");
    }
#endif
#if defined(__aarch64__)
    compare_tables(&ork_gemm_f32_kernels_neon);
    tested++;
#endif
    CHECK(tested > 0, "no SIMD float32 GEMM table to compare");
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        ork_err err;
        if (!ork_isa_available((ork_isa)i)) continue;
        ork_cpu_set_isa(ork_isa_name((ork_isa)i), &err);
        CHECK(ork_gemm_f32_kernels_active() == ork_gemm_f32_kernels_for((ork_isa)i), "%s: active table",
              ork_isa_name((ork_isa)i));
        fused_chain(ork_gemm_f32_kernels_active());
        linear_threads();
    }
    free(scratch);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
