/* test_hadamard.c - the Hadamard rotation of float64 rows (hadamard.h): against the dense product
 * x kron(Hp, Hm) * scale summed in long double, the same bits on any thread count, the argument
 * errors. Runs natively and under qemu-aarch64 (scalar double code: the same results on every
 * ISA). Prints "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/hadamard.h"
#include "check.h"

static uint64_t st = 0x2545F4914F6CDD1DULL;

static int popcount(size_t v) {
    int c = 0;
    for (; v; v &= v - 1) c++;
    return c;
}

int main(void) {
    static const size_t orders[][2] = {{1, 1}, {1, 2}, {1, 64}, {1, 512}, {12, 32}, {20, 16}, {36, 8}, {3, 8}};
    enum { ROWS = 9 };
    ork_err err;
    printf("comparing the fast transform against the dense product (scalar double code: every ISA)\n");
    for (size_t o = 0; o < sizeof orders / sizeof orders[0]; o++) {
        const size_t p = orders[o][0], m = orders[o][1], n = p * m;
        double *hp = (double *)malloc(p * p * sizeof(double));
        double *x = (double *)malloc(ROWS * n * sizeof(double)), *y = (double *)malloc(ROWS * n * sizeof(double));
        double *z = (double *)malloc(ROWS * n * sizeof(double));
        for (size_t i = 0; i < p * p; i++) hp[i] = (check_rnd(&st) & 1) ? 1.0 : -1.0;
        for (size_t i = 0; i < ROWS * n; i++) x[i] = (double)check_rnd_f(&st, 97, 8);
        const double scale = 1.0 / sqrt((double)n);
        for (int threads = 1; threads <= 3; threads++) {
            memcpy(y, x, ROWS * n * sizeof(double));
            CHECK(ork_hadamard_rows_f64(y, ROWS, p, m, p > 1 ? hp : NULL, scale, threads, &err) == ORK_OK,
                  "p %zu m %zu: %s", p, m, err.msg);
            if (threads == 1) memcpy(z, y, ROWS * n * sizeof(double));
            for (size_t r = 0; r < ROWS; r++) {
                double worst = 0.0, norm = 0.0;
                for (size_t i = 0; i < p; i++)
                    for (size_t a = 0; a < m; a++) {
                        long double s = 0.0L;
                        for (size_t j = 0; j < p; j++)
                            for (size_t b = 0; b < m; b++) {
                                const double h = (p > 1 ? hp[j * p + i] : 1.0) * ((popcount(a & b) & 1) ? -1.0 : 1.0);
                                s += (long double)x[r * n + j * m + b] * h;
                            }
                        const double want = (double)(s * scale), d = fabs(y[r * n + i * m + a] - want);
                        if (d > worst) worst = d;
                        norm += want * want;
                    }
                CHECK(worst <= 1e-13 * sqrt(norm + 1e-300) * sqrt((double)n), "p %zu m %zu row %zu: error %g", p, m, r,
                      worst);
                CHECK(memcmp(y + r * n, z + r * n, n * sizeof(double)) == 0, "p %zu m %zu row %zu: %d threads differ",
                      p, m, r, threads);
            }
        }
        free(hp);
        free(x);
        free(y);
        free(z);
    }
    double v[12] = {0};
    CHECK(ork_hadamard_rows_f64(v, 1, 1, 12, NULL, 1.0, 1, &err) == ORK_EINVAL, "m = 12 accepted");
    CHECK(ork_hadamard_rows_f64(v, 1, 3, 4, NULL, 1.0, 1, &err) == ORK_EINVAL, "p = 3 without hp accepted");
    CHECK(ork_hadamard_rows_f64(v, 1, 0, 4, NULL, 1.0, 1, &err) == ORK_EINVAL, "p = 0 accepted");
    CHECK(ork_hadamard_rows_f64(NULL, 0, 1, 4, NULL, 1.0, 1, &err) == ORK_OK, "no rows refused");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
