/* test_matmul.c - every SIMD matmul kernel of this build (AVX2; NEON and
 * NEON+sdot on aarch64, the latter when the CPU has dotprod) against the
 * scalar _ref, and the drivers against a naive int64 matmul, 1 and 3 threads.
 * Prints failures and a closing "N passed, N failed" line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/cpu.h"
#include "check.h"
#include "../../csrc/ork/affine.h"
#include "../../csrc/ork/pack.h"


static uint64_t st = 0x9E3779B97F4A7C15ULL;
static uint32_t rnd(void) { return check_rnd(&st); }
static int8_t rnd_i8(void) { return (int8_t)((int)(rnd() % 255) - 127); } /* [-127, 127] */

static void compare_tables(const ork_matmul_kernels *ref, const ork_matmul_kernels *kv) {
    printf("comparing %s against scalar\n", kv->isa);
    /* KB 2100 (K = 67200): x + 128 times w sums past 2^31 in the VNNI kernel (modular, still exact) */
    const size_t KBs[] = {1, 2, 3, 7, 2100};
    const size_t Ms[] = {1, 2, 3, 5, 4, 8, 11}; /* the 4-row blocks of the VNNI kernel and their tails */
    for (size_t a = 0; a < sizeof KBs / sizeof KBs[0]; a++) {
        size_t KB = KBs[a];
        uint8_t *nib = malloc(KB * 32 * 16);
        int8_t *s1 = malloc(KB * 1024), *s2 = malloc(KB * 1024);
        int8_t lut[16];
        for (int i = 0; i < 16; i++) lut[i] = rnd_i8();
        for (size_t i = 0; i < KB * 32 * 16; i++) nib[i] = (uint8_t)rnd();
        ref->inflate_strip(nib, KB, lut, s1);
        kv->inflate_strip(nib, KB, lut, s2);
        CHECK(memcmp(s1, s2, KB * 1024) == 0, "%s inflate KB=%zu", kv->isa, KB);
        for (size_t b = 0; b < sizeof Ms / sizeof Ms[0]; b++) {
            size_t M = Ms[b], ldx = KB * 32 + (b & 1) * 32;
            if (KB > 100 && M != 5) continue;
            int8_t *x = malloc(M * ldx);
            for (size_t i = 0; i < M * ldx; i++) x[i] = rnd_i8();
            if (b == 3 || b == 6) { /* extreme values: every product at +-127*127 */
                for (size_t i = 0; i < M * ldx; i++) x[i] = (i & 1) ? 127 : -127;
                for (size_t i = 0; i < KB * 1024; i++) s1[i] = (KB > 100 || (i & 2)) ? 127 : -127;
            }
            int32_t *a1 = malloc(M * 32 * 4), *a2 = malloc(M * 32 * 4);
            ref->gemm_strip_i8(s1, KB, x, ldx, M, a1);
            kv->gemm_strip_i8(s1, KB, x, ldx, M, a2);
            CHECK(memcmp(a1, a2, M * 32 * 4) == 0, "%s gemm KB=%zu M=%zu", kv->isa, KB, M);
            ref->gemv_strip_i4(nib, KB, lut, x, a1);
            kv->gemv_strip_i4(nib, KB, lut, x, a2);
            CHECK(memcmp(a1, a2, 32 * 4) == 0, "%s gemv4 KB=%zu", kv->isa, KB);
            /* acc_group: random accumulators and scales, first and accumulating calls */
            float as[16], sc[32], *y1 = malloc(M * 32 * 4), *y2 = malloc(M * 32 * 4);
            for (size_t m = 0; m < M; m++) as[m] = (float)(rnd() % 1000 + 1) * 1e-4f;
            for (int i = 0; i < 32; i++) sc[i] = (float)(rnd() % 977 + 3) * 3e-5f;
            for (size_t i = 0; i < M * 32; i++) a1[i] = (int32_t)(rnd() % 2000001) - 1000000;
            for (int first = 1; first >= 0; first--) {
                ref->acc_group(a1, M, as, sc, first, y1);
                kv->acc_group(a1, M, as, sc, first, y2);
                CHECK(memcmp(y1, y2, M * 32 * 4) == 0, "%s acc_group M=%zu first=%d", kv->isa, M, first);
            }
            free(y1); free(y2);
            free(x); free(a1); free(a2);
        }
        /* int8 weights of -128 (a store that bypassed the doors) with activations in [-127, 127]:
         * exact on every kernel (AVX2 takes |w| as the unsigned operand) */
        for (size_t i = 0; i < KB * 1024; i++) s1[i] = (i % 7 == 0) ? -128 : rnd_i8();
        for (size_t M = 1; M <= 5; M++) {
            int8_t *x = malloc(M * KB * 32);
            for (size_t i = 0; i < M * KB * 32; i++) x[i] = (i % 3 == 0) ? -127 : rnd_i8();
            int32_t *a1 = malloc(M * 32 * 4), *a2 = malloc(M * 32 * 4);
            ref->gemm_strip_i8(s1, KB, x, KB * 32, M, a1);
            kv->gemm_strip_i8(s1, KB, x, KB * 32, M, a2);
            CHECK(memcmp(a1, a2, M * 32 * 4) == 0, "%s gemm with weight -128 KB=%zu M=%zu", kv->isa, KB, M);
            for (size_t i = 0; i < KB * 1024; i++) s2[i] = -128;
            for (size_t i = 0; i < M * KB * 32; i++) x[i] = -127;
            kv->gemm_strip_i8(s2, KB, x, KB * 32, M, a2);
            int all = 1;
            for (size_t i = 0; i < M * 32; i++) all &= a2[i] == (int32_t)(KB * 32 * 128 * 127);
            CHECK(all, "%s gemm all -128 x -127 KB=%zu M=%zu", kv->isa, KB, M);
            free(x); free(a1); free(a2);
        }
        free(nib); free(s1); free(s2);
    }
}

/* the doors and the -128 contract of pack.h, with the active kernels */
static void minus_128(void) {
    const size_t M = 3, K = 70, N = 40, KB = 3;
    int8_t *store = calloc(2 * KB * 1024, 1), *x = malloc(M * K);
    int8_t w[40][70];
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++) {
            w[n][k] = (n == 3 || k == 5) ? -128 : rnd_i8();
            store[((n / 32) * KB + k / 32) * 1024 + (n % 32) * 32 + k % 32] = w[n][k];
        }
    for (size_t i = 0; i < M * K; i++) x[i] = (i < K || i % 5 == 0) ? -128 : rnd_i8();
    int32_t out[3 * 40];
    ork_err err;
    CHECK(ork_matmul_int(ORK_KIND_INT8, store, NULL, N, K, x, M, out, 2, &err) == ORK_OK, "mm with -128");
    int ok = 1;
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            long long s = 0;
            for (size_t k = 0; k < K; k++) s += (long long)x[m * K + k] * w[n][k];
            ok &= s == out[m * N + n];
        }
    CHECK(ok, "-128 weights and activations: exact with %s", ork_matmul_kernels_active()->isa);
    CHECK(out[3] == 128 * 128 * (int)K, "row 0 x weight row 3 = 128 * 128 * K");
    CHECK(ork_pack_check_store(ORK_KIND_INT8, store, N, K, &err) == ORK_EINVAL && strstr(err.msg, "[0, 5]"),
          "check_store names the first -128: %s", err.msg);
    CHECK(ork_pack_check_store(ORK_KIND_NF4, store, N, K, &err) == ORK_OK, "4-bit stores hold no -128");
    float sc[2] = {1.0f, 0.0f};
    CHECK(ork_pack_check_scales(sc, 2, K, ORK_EINVAL, &err) == ORK_OK, "scales 1, 0");
    sc[1] = -0.0f;
    CHECK(ork_pack_check_scales(sc, 2, K, ORK_EFORMAT, &err) == ORK_EFORMAT, "scale -0 refused");
    sc[1] = 3e38f;
    CHECK(ork_pack_check_scales(sc, 2, K, ORK_EINVAL, &err) == ORK_EINVAL && strstr(err.msg, "exceeds"), "3e38: %s",
          err.msg);
    sc[1] = (float)ork_pack_max_scale(K);
    if ((double)sc[1] > ork_pack_max_scale(K)) sc[1] = nextafterf(sc[1], 0.0f);
    CHECK(ork_pack_check_scales(sc, 2, K, ORK_EINVAL, &err) == ORK_OK, "the largest scale");
    free(store); free(x);
}

static void drivers_vs_naive(void) {
    const size_t shapes[][3] = {{1, 45, 37}, {3, 64, 32}, {5, 100, 70}, {64, 33, 65}, {2, 1, 1}};
    for (size_t si = 0; si < 5; si++) {
        size_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        for (int kind = 0; kind < 3; kind++) {
            const int8_t *lut = ork_quant_lut((ork_kind)kind);
            size_t rb = ork_quant_row_bytes((ork_kind)kind, K);
            uint8_t *codes = malloc(N * rb);
            for (size_t i = 0; i < N * rb; i++) codes[i] = (uint8_t)(kind == 2 ? (uint8_t)rnd_i8() : (rnd() & 0xFF));
            if (kind == 1) /* int4 never produces code 15 */
                for (size_t i = 0; i < N * rb; i++) {
                    if ((codes[i] & 15) == 15) codes[i] &= 0xF7;
                    if ((codes[i] >> 4) == 15) codes[i] &= 0x7F;
                }
            void *store = malloc(ork_pack_store_bytes((ork_kind)kind, N, K));
            ork_err err;
            CHECK(ork_pack((ork_kind)kind, codes, N, K, store, &err) == ORK_OK, "pack");
            uint8_t *back = malloc(N * rb);
            ork_unpack((ork_kind)kind, store, N, K, back, &err);
            if (kind != 2 && (K & 1)) /* padding nibble is normalised to code 7 */
                for (size_t n = 0; n < N; n++) codes[n * rb + rb - 1] = (uint8_t)((codes[n * rb + rb - 1] & 15) | 0x70);
            CHECK(memcmp(codes, back, N * rb) == 0, "pack/unpack round trip kind=%d", kind);
            int8_t *x = malloc(M * K);
            for (size_t i = 0; i < M * K; i++) x[i] = rnd_i8();
            int32_t *o1 = malloc(M * N * 4), *o3 = malloc(M * N * 4);
            CHECK(ork_matmul_int((ork_kind)kind, store, lut, N, K, x, M, o1, 1, &err) == ORK_OK, "mm1");
            CHECK(ork_matmul_int((ork_kind)kind, store, lut, N, K, x, M, o3, 3, &err) == ORK_OK, "mm3");
            int ok = 1;
            for (size_t m = 0; m < M; m++)
                for (size_t n = 0; n < N; n++) {
                    long long s = 0;
                    for (size_t k = 0; k < K; k++) {
                        int w;
                        if (kind == 2) w = ((const int8_t *)codes)[n * K + k];
                        else {
                            uint8_t b = codes[n * rb + k / 2];
                            w = lut[(k & 1) ? (b >> 4) : (b & 15)];
                        }
                        s += (long long)x[m * K + k] * w;
                    }
                    if (s != o1[m * N + n] || s != o3[m * N + n]) ok = 0;
                }
            CHECK(ok, "driver vs naive int64 M=%zu K=%zu N=%zu kind=%d", M, K, N, kind);
            free(codes); free(store); free(back); free(x); free(o1); free(o3);
        }
    }
}

/* grouped drivers (pack.h "Group-wise scales") against a naive per-group int64 sum and the
 * documented float order */
static void grouped_vs_naive(void) {
    const size_t shapes[][3] = {{1, 200, 37}, {3, 64, 33}, {5, 300, 70}, {2, 97, 5}};
    const size_t groups[] = {32, 64, 128};
    for (size_t si = 0; si < 4; si++)
        for (size_t gi = 0; gi < 3; gi++)
            for (int kind = 0; kind < 3; kind++) {
                size_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2], g = groups[gi];
                size_t G = ork_group_count(K, g);
                if (g >= K) continue;
                const int8_t *lut = ork_quant_lut((ork_kind)kind);
                size_t rb = ork_quant_row_bytes((ork_kind)kind, K);
                uint8_t *codes = malloc(N * rb);
                for (size_t i = 0; i < N * rb; i++) codes[i] = (uint8_t)(kind == 2 ? (uint8_t)rnd_i8() : (rnd() & 0xFF));
                if (kind == 2)
                    for (size_t i = 0; i < N * rb; i++) if (codes[i] == 0x80) codes[i] = 0x81;
                void *store = malloc(ork_pack_store_bytes((ork_kind)kind, N, K));
                ork_err err;
                CHECK(ork_pack((ork_kind)kind, codes, N, K, store, &err) == ORK_OK, "pack");
                size_t Kp = ork_pack_round32(K);
                int8_t *x = calloc(M * Kp, 1);
                for (size_t m = 0; m < M; m++)
                    for (size_t k = 0; k < K; k++) {
                        int8_t v = rnd_i8();
                        x[m * Kp + k] = v == -128 ? 127 : v; /* quantizer activations are in [-127, 127] */
                    }
                float *bs = malloc(N * G * 4), as[5];
                for (size_t i = 0; i < N * G; i++) bs[i] = (float)(rnd() % 1000 + 1) * 1e-4f;
                for (size_t m = 0; m < M; m++) as[m] = (float)(rnd() % 1000 + 1) * 1e-3f;
                float *y1 = malloc(M * N * 4), *y3 = malloc(M * N * 4);
                int32_t *acc = malloc(G * M * N * 4);
                int8_t *xc = malloc(M * K);
                for (size_t m = 0; m < M; m++) memcpy(xc + m * K, x + m * Kp, K);
                CHECK(ork_matmul_q8_grouped((ork_kind)kind, store, lut, bs, g, N, K, x, as, 0, M, y1, 1, &err) == ORK_OK,
                      "grouped q8: %s", err.msg);
                CHECK(ork_matmul_q8_grouped((ork_kind)kind, store, lut, bs, g, N, K, x, as, 0, M, y3, 3, &err) == ORK_OK,
                      "grouped q8 (3 threads)");
                /* activations scaled per row and group (actspec.h "group"): ascale (G, M) */
                float *ag = malloc(G * M * 4), *yg = malloc(M * N * 4);
                for (size_t i = 0; i < G * M; i++) ag[i] = (float)(rnd() % 1000 + 1) * 1e-3f;
                CHECK(ork_matmul_q8_grouped((ork_kind)kind, store, lut, bs, g, N, K, x, ag, 1, M, yg, 2, &err) == ORK_OK,
                      "grouped q8, grouped activations: %s", err.msg);
                CHECK(ork_matmul_int_grouped((ork_kind)kind, store, lut, g, N, K, xc, M, acc, 2, &err) == ORK_OK,
                      "grouped int: %s", err.msg);
                /* affine groups (affine.h): the offsets' term after the grouped product, 1 and 3 threads,
                 * activations scaled per row and group (yo*) or per row (yp) */
                float *bo = malloc(N * G * 4), *yo1 = malloc(M * N * 4), *yo3 = malloc(M * N * 4), *yp = malloc(M * N * 4);
                for (size_t i = 0; i < N * G; i++) bo[i] = ((float)(rnd() % 2001) - 1000.0f) * 1e-4f;
                memcpy(yo1, yg, M * N * 4);
                memcpy(yo3, yg, M * N * 4);
                memcpy(yp, y1, M * N * 4);
                CHECK(ork_matmul_add_offsets(bo, g, N, K, x, Kp, ag, 1, M, yo1, 1, &err) == ORK_OK, "offsets: %s", err.msg);
                CHECK(ork_matmul_add_offsets(bo, g, N, K, x, Kp, ag, 1, M, yo3, 3, &err) == ORK_OK, "offsets (3 threads)");
                CHECK(ork_matmul_add_offsets(bo, g, N, K, x, Kp, as, 0, M, yp, 2, &err) == ORK_OK, "offsets, row scales");
                int ok = 1;
                for (size_t m = 0; m < M; m++)
                    for (size_t n = 0; n < N; n++) {
                        float y = 0.0f, y2 = 0.0f;
                        for (size_t gg = 0; gg < G; gg++) {
                            long long s = 0;
                            for (size_t k = gg * g; k < K && k < (gg + 1) * g; k++) {
                                int w;
                                if (kind == 2) w = ((const int8_t *)codes)[n * K + k];
                                else {
                                    uint8_t b = codes[n * rb + k / 2];
                                    w = lut[(k & 1) ? (b >> 4) : (b & 15)];
                                }
                                s += (long long)x[m * Kp + k] * w;
                            }
                            if (s != acc[(gg * M + m) * N + n]) ok = 0;
                            float t = ork_dequant_acc((int32_t)s, as[m], bs[n * G + gg]);
                            y = gg ? y + t : t;
                            float t2 = ork_dequant_acc((int32_t)s, ag[gg * M + m], bs[n * G + gg]);
                            y2 = gg ? y2 + t2 : t2;
                        }
                        if (memcmp(&y, &y1[m * N + n], 4) || memcmp(&y, &y3[m * N + n], 4)) ok = 0;
                        if (memcmp(&y2, &yg[m * N + n], 4)) ok = 0;
                        float off = 0.0f, offp = 0.0f; /* affine.h: sum_i (a_i * S_i) * o_i, left to right */
                        for (size_t gg = 0; gg < G; gg++) {
                            int32_t S = 0;
                            for (size_t k = gg * g; k < K && k < (gg + 1) * g; k++) S += x[m * Kp + k];
                            const float u = ag[gg * M + m] * (float)S, up = as[m] * (float)S;
                            const float t = u * bo[n * G + gg], tp = up * bo[n * G + gg];
                            off = gg ? off + t : t;
                            offp = gg ? offp + tp : tp;
                        }
                        const float wo = y2 + off, wp = y + offp;
                        if (memcmp(&wo, &yo1[m * N + n], 4) || memcmp(&wo, &yo3[m * N + n], 4)) ok = 0;
                        if (memcmp(&wp, &yp[m * N + n], 4)) ok = 0;
                    }
                CHECK(ok, "grouped drivers (and affine offsets) vs naive M=%zu K=%zu N=%zu g=%zu kind=%d", M, K, N, g,
                      kind);
                free(bo); free(yo1); free(yo3); free(yp);
                CHECK(ork_matmul_q8_grouped((ork_kind)kind, store, lut, bs, 48, N, K, x, as, 0, M, y1, 1, &err) == ORK_EINVAL,
                      "group 48 refused");
                free(codes); free(store); free(x); free(bs); free(y1); free(y3); free(acc); free(xc); free(ag); free(yg);
            }
}

int main(void) {
    const ork_matmul_kernels *ref = &ork_matmul_kernels_ref;
    int tested = 0;
#if defined(__x86_64__)
    if (ork_isa_available(ORK_ISA_AVX2)) { compare_tables(ref, &ork_matmul_kernels_avx2); tested++; }
    if (ork_cpu_features() & ORK_CPU_AVX512VNNI) { compare_tables(ref, &ork_matmul_kernels_avx2vnni); tested++; }
    else printf("no avx512vl + avx512vnni here: the avx2vnni table is not compared\n");
#endif
#if defined(__aarch64__)
    compare_tables(ref, &ork_matmul_kernels_neon);
    tested++;
    if (ork_cpu_features() & ORK_CPU_DOTPROD) { compare_tables(ref, &ork_matmul_kernels_neondot); tested++; }
#endif
    CHECK(tested > 0, "no SIMD matmul table to compare");
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        ork_err err;
        if (!ork_isa_available((ork_isa)i)) continue;
        ork_cpu_set_isa(ork_isa_name((ork_isa)i), &err);
        printf("drivers with %s kernels (%s)\n", ork_isa_name((ork_isa)i), ork_matmul_kernels_active()->isa);
        drivers_vs_naive();
        grouped_vs_naive();
        minus_128();
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
