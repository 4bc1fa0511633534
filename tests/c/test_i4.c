/* test_i4.c - the int4 x int4 matmul contract (csrc/ork/i4.h): every SIMD
 * table of this build (AVX2; NEON on aarch64) against the scalar _ref and a
 * naive int64 product for many shapes (K not a multiple of 32 or 64, M = 1,
 * N tails, the 4096-k slice edge) and extreme codes; the drivers at 1, 2, 3
 * and 7 threads on every ISA; the int16 partials; random chunk splits; the
 * storage codec. Prints failures and a closing "N passed, N failed" line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/cpu.h"
#include "../../csrc/ork/i4.h"
#include "check.h"

static uint64_t st = 0x2545F4914F6CDD1DULL;
static uint32_t rnd(void) { return check_rnd(&st); }

/* rows x K codes: random in [-8, 7], or a pattern (1: all -8, 2: all 7, 3: -8 / 7 alternating) */
static void fill(int8_t *c, size_t n, int pattern) {
    for (size_t i = 0; i < n; i++)
        c[i] = pattern == 1 ? -8 : pattern == 2 ? 7 : pattern == 3 ? ((i & 1) ? 7 : -8) : (int8_t)((int)(rnd() % 16) - 8);
}

static uint8_t *packed(const int8_t *c, size_t rows, size_t K) {
    uint8_t *p = malloc(rows * ork_i4_row_bytes(K));
    ork_err err;
    CHECK(ork_i4_pack(c, rows, K, K, p, &err) == ORK_OK, "pack rows=%zu K=%zu", rows, K);
    return p;
}

static int64_t dot(const int8_t *a, const int8_t *w, size_t k0, size_t k1) {
    int64_t s = 0;
    for (size_t k = k0; k < k1; k++) s += (int64_t)a[k] * w[k];
    return s;
}

/* the exact product of code matrices a (M x K), w (N x K) */
static int naive_equal(const int8_t *a, size_t M, const int8_t *w, size_t N, size_t K, const int32_t *acc, size_t ldc) {
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++)
            if (dot(a + m * K, w + n * K, 0, K) != acc[m * ldc + n]) return 0;
    return 1;
}

static void compare_table(const ork_i4_kernels *kv) {
    printf("comparing %s against scalar\n", kv->isa);
    const size_t Ks[] = {1, 31, 32, 64, 96, 480, 481, 992, 4096, 4127, 4160, 8224, 12345};
    const size_t Ms[] = {1, 2, 3, 4, 5, 9}; /* the AVX2 kernel takes rows 4, 2 and 1 at a time */
    const size_t Ns[] = {1, 4, 7, 8, 9, 33};
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                const size_t K = Ks[ki], M = Ms[mi], N = Ns[ni], Kp = ork_i4_kpad(K), ldc = N + 3;
                if (K > 4200 && (ni % 2 || mi % 2)) continue; /* long rows: fewer shapes */
                /* 0: random codes; a all -8 against w all -8 (1) or all 7 (2); 3: -8 / 7 in both */
                const int pattern = (ki + mi + ni) % 6 > 3 ? 0 : (int)((ki + mi + ni) % 6);
                int8_t *a = malloc(M * K), *w = malloc(N * K);
                fill(a, M * K, pattern == 2 ? 1 : pattern);
                fill(w, N * K, pattern);
                uint8_t *ap = packed(a, M, K), *wp = packed(w, N, K);
                int32_t *r1 = malloc(M * ldc * 4), *r2 = malloc(M * ldc * 4);
                memset(r1, 0x5A, M * ldc * 4);
                memset(r2, 0x5A, M * ldc * 4);
                ork_i4_kernels_ref.mm(ap, M, wp, N, Kp, r1, ldc);
                kv->mm(ap, M, wp, N, Kp, r2, ldc);
                CHECK(memcmp(r1, r2, M * ldc * 4) == 0, "%s vs scalar M=%zu N=%zu K=%zu pattern %d", kv->isa, M, N, K,
                      pattern);
                CHECK(naive_equal(a, M, w, N, K, r2, ldc), "%s vs int64 M=%zu N=%zu K=%zu pattern %d", kv->isa, M, N, K,
                      pattern);
                free(a); free(w); free(ap); free(wp); free(r1); free(r2);
            }
}

static void drivers(void) {
    const size_t shapes[][3] = {{1, 4096, 70}, {3, 481, 33}, {2, 100, 65}, {7, 960, 40}, {1, 8192, 129}, {5, 33, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        int8_t *a = malloc(M * K), *w = malloc(N * K);
        fill(a, M * K, si == 4 ? 1 : 0);
        fill(w, N * K, si == 4 ? 1 : 0);
        uint8_t *ap = packed(a, M, K), *wp = packed(w, N, K);
        int32_t *o1 = malloc(M * N * 4), *ot = malloc(M * N * 4);
        ork_err err;
        CHECK(ork_mm_i4(ap, M, wp, N, K, o1, 1, &err) == ORK_OK, "mm_i4 1 thread");
        CHECK(naive_equal(a, M, w, N, K, o1, N), "driver (%s) vs int64 M=%zu N=%zu K=%zu", ork_i4_kernels_active()->isa,
              M, N, K);
        const int threads[] = {2, 3, 7};
        for (int t = 0; t < 3; t++) {
            memset(ot, 0, M * N * 4);
            CHECK(ork_mm_i4(ap, M, wp, N, K, ot, threads[t], &err) == ORK_OK, "mm_i4 %d threads", threads[t]);
            CHECK(memcmp(o1, ot, M * N * 4) == 0, "%d threads == 1 thread M=%zu N=%zu K=%zu", threads[t], M, N, K);
        }
        free(a); free(w); free(ap); free(wp); free(o1); free(ot);
    }
}

/* the int16 partials: each the exact chunk sum, their int32 sum the product */
static void partials(void) {
    const size_t Ks[] = {480, 481, 960, 1000, 8192};
    for (size_t ki = 0; ki < 5; ki++)
        for (int pattern = 0; pattern < 4; pattern++) {
            const size_t K = Ks[ki], M = 2, N = 3, Kp = ork_i4_kpad(K), C = ork_i4_chunks(K);
            int8_t *a = calloc(M * Kp, 1), *w = calloc(N * Kp, 1), *ac = malloc(M * K), *wc = malloc(N * K);
            fill(ac, M * K, pattern == 2 ? 1 : pattern);
            fill(wc, N * K, pattern);
            for (size_t m = 0; m < M; m++) memcpy(a + m * Kp, ac + m * K, K);
            for (size_t n = 0; n < N; n++) memcpy(w + n * Kp, wc + n * K, K);
            uint8_t *ap = packed(ac, M, K), *wp = packed(wc, N, K);
            int16_t *part = malloc(C * M * N * 2);
            int32_t acc[6];
            ork_err err;
            CHECK(ork_mm_i4_partials(ap, M, wp, N, K, part, &err) == ORK_OK, "partials: %s", err.msg);
            CHECK(ork_mm_i4(ap, M, wp, N, K, acc, 2, &err) == ORK_OK, "mm_i4");
            CHECK(C == (Kp + 479) / 480, "chunks of K = %zu", K);
            int ok = 1;
            for (size_t m = 0; m < M; m++)
                for (size_t n = 0; n < N; n++) {
                    int32_t s = 0;
                    for (size_t c = 0; c < C; c++) {
                        const size_t k1 = (c + 1) * 480 < Kp ? (c + 1) * 480 : Kp;
                        ok &= dot(a + m * Kp, w + n * Kp, c * 480, k1) == part[(c * M + m) * N + n];
                        s += part[(c * M + m) * N + n];
                    }
                    ok &= s == acc[m * N + n] && s == dot(a + m * Kp, w + n * Kp, 0, Kp);
                }
            CHECK(ok, "partials K=%zu pattern %d: exact chunk sums adding up to the product", K, pattern);
            if (pattern == 1) CHECK(part[0] == 480 * 64, "a full chunk of -8 x -8 is 30720, got %d", part[0]);
            free(a); free(w); free(ac); free(wc); free(ap); free(wp); free(part);
        }
}

/* any split of k into chunks of at most 511 keeps every int16 step exact; 512 does not */
static void random_splits(void) {
    const size_t K = 5000;
    int8_t *a = malloc(K), *w = malloc(K);
    for (int trial = 0; trial < 60; trial++) {
        fill(a, K, trial % 3 == 0 ? 1 : 0);
        fill(w, K, trial % 3 == 0 ? 1 : trial % 3 == 1 ? 3 : 0);
        int32_t total = 0;
        int in_range = 1;
        for (size_t k0 = 0; k0 < K;) {
            size_t len = 1 + rnd() % 511, k1 = k0 + len < K ? k0 + len : K;
            int32_t s = 0; /* the int16 accumulator, checked at every step */
            for (size_t k = k0; k < k1; k++) {
                s += a[k] * w[k];
                in_range &= s >= -32768 && s <= 32767;
            }
            total += (int16_t)s;
            k0 = k1;
        }
        CHECK(in_range && total == dot(a, w, 0, K), "random split %d: every step within int16, sum exact", trial);
    }
    fill(a, 512, 1);
    fill(w, 512, 1);
    CHECK(dot(a, w, 0, 512) == 32768, "a chunk of 512 -8 x -8 products leaves int16 (the bound is tight)");
    free(a); free(w);
}

static void codec(void) {
    ork_err err;
    const int8_t c[3] = {1, 2, -8}, d[3] = {7, -1, -8};
    uint8_t p[2][16];
    CHECK(ork_i4_pack(c, 1, 3, 3, p[0], &err) == ORK_OK && ork_i4_pack(d, 1, 3, 3, p[1], &err) == ORK_OK, "pack 3");
    CHECK(p[0][0] == 0x21 && p[0][1] == 0x08 && p[1][0] == 0xF7 && p[1][1] == 0x08, "nibble order: %02x %02x %02x %02x",
          p[0][0], p[0][1], p[1][0], p[1][1]);
    int zero = 1;
    for (int j = 2; j < 16; j++) zero &= p[0][j] == 0 && p[1][j] == 0;
    CHECK(zero && ork_i4_row_bytes(3) == 16, "padding codes are 0, 16 bytes per row of K = 3");
    int8_t back[2][4];
    memset(back, 99, sizeof back);
    CHECK(ork_i4_unpack(p[0], 2, 3, 4, back[0], &err) == ORK_OK && back[0][0] == 1 && back[0][2] == -8 &&
              back[1][0] == 7 && back[1][1] == -1 && back[0][3] == 99,
          "unpack with a row stride");
    for (size_t K = 1; K < 200; K += 13) {
        int8_t *x = malloc(3 * K), *y = malloc(3 * K);
        fill(x, 3 * K, 0);
        uint8_t *q = packed(x, 3, K);
        CHECK(ork_i4_unpack(q, 3, K, K, y, &err) == ORK_OK && memcmp(x, y, 3 * K) == 0, "round trip K=%zu", K);
        free(x); free(y); free(q);
    }
    int8_t bad[2][5] = {{0, 1, 2, 3, 4}, {0, 0, 0, 8, 0}};
    CHECK(ork_i4_pack(bad[0], 2, 5, 5, p[0], &err) == ORK_EINVAL && strstr(err.msg, "8 at [1, 3]"), "code 8: %s",
          err.msg);
    bad[1][3] = -9;
    CHECK(ork_i4_pack(bad[0], 2, 5, 5, p[0], &err) == ORK_EINVAL && strstr(err.msg, "-9 at [1, 3]"), "code -9: %s",
          err.msg);
    p[1][1] = 0x18; /* code 3 of row 0 (K = 3) is padding: 1 */
    CHECK(ork_i4_unpack(p[1], 1, 3, 3, back[0], &err) == ORK_EINVAL && strstr(err.msg, "[0, 3]"), "padding: %s",
          err.msg);
    int32_t o[4];
    CHECK(ork_mm_i4(p[0], 0, p[0], 1, 3, o, 1, &err) == ORK_EINVAL, "M = 0 refused");
    CHECK(ork_mm_i4(p[0], 1, p[0], 1, 0, o, 1, &err) == ORK_EINVAL, "K = 0 refused");
    CHECK(ork_mm_i4(p[0], 1, p[0], 1, ORK_I4_MAX_K + 1, o, 1, &err) == ORK_EINVAL && strstr(err.msg, "exceeds"),
          "K past the int32 bound refused: %s", err.msg);
    CHECK(ork_mm_i4(NULL, 1, p[0], 1, 3, o, 1, &err) == ORK_EINVAL, "NULL refused");
}

int main(void) {
    int tested = 0;
#if defined(__x86_64__)
    if (ork_isa_available(ORK_ISA_AVX2)) { compare_table(&ork_i4_kernels_avx2); tested++; }
#endif
#if defined(__aarch64__)
    compare_table(&ork_i4_kernels_neon);
    tested++;
#endif
    CHECK(tested > 0, "no SIMD int4 table to compare");
    compare_table(&ork_i4_kernels_ref); /* the _ref against the naive int64 product */
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        ork_err err;
        if (!ork_isa_available((ork_isa)i)) continue;
        ork_cpu_set_isa(ork_isa_name((ork_isa)i), &err);
        printf("drivers with %s kernels (%s)\n", ork_isa_name((ork_isa)i), ork_i4_kernels_active()->isa);
        CHECK(ork_i4_kernels_active() == ork_i4_kernels_for((ork_isa)i), "the active table is the ISA's");
        drivers();
    }
    partials();
    random_splits();
    codec();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
