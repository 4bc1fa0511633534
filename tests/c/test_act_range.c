/* test_act_range.c - the static-range error of an |x| histogram (act_range.h): against the exact
 * quantization error of the values it was built from (the formula models each bin's values as
 * uniform within it: close, not exact), exact where every value saturates, the same bits on
 * any thread count, and the errors. Runs natively and under qemu-aarch64 (scalar double code:
 * the same results on every ISA). Prints "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/act_range.h"
#include "../../csrc/ork/linear.h"
#include "check.h"

static uint64_t st = 0x9E3779B97F4A7C15ULL;

static double edges[ORK_ASTATS_BINS + 1];
static double cnt[ORK_ASTATS_BINS], s1[ORK_ASTATS_BINS], s2[ORK_ASTATS_BINS];

static void hist_add(float v) {
    const int b = ork_act_stats_bin(v);
    const double a = fabs((double)v);
    cnt[b] += 1.0;
    s1[b] += a;
    s2[b] += a * a;
}

static double normal(void) { /* Box-Muller on the test's stream */
    const double u1 = (check_rnd(&st) + 1.0) / 4294967297.0, u2 = (check_rnd(&st) + 1.0) / 4294967297.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int main(void) {
    for (int i = 0; i < ORK_ASTATS_BINS; i++) edges[i] = ork_act_stats_edge(i);
    edges[ORK_ASTATS_BINS] = INFINITY;
    ork_err err;

    printf("comparing the range error against the exact error of the values (scalar double code: every ISA)\n");
    /* 1. against the exact error of the values, for several ranges and both grids */
    enum { NV = 200000 };
    float *v = (float *)malloc(NV * sizeof(float));
    double amax = 0.0;
    for (int i = 0; i < NV; i++) {
        v[i] = (float)(normal() * (i % 97 == 0 ? 8.0 : 1.0)); /* a few wide values: saturation matters */
        hist_add(v[i]);
        if (fabs(v[i]) > amax) amax = fabs(v[i]);
    }
    const int qm[2] = {127, 7};
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 12; k++) {
            const double c = amax * pow(2.0, -k / 3.0), d = c / qm[g];
            double exact = 0.0;
            for (int i = 0; i < NV; i++) {
                double q = floor(fabs((double)v[i]) / d + 0.5);
                if (q > qm[g]) q = qm[g];
                const double e = fabs((double)v[i]) - q * d;
                exact += e * e;
            }
            double got = 0.0;
            CHECK(ork_act_range_mse(cnt, s1, s2, edges, ORK_ASTATS_BINS, &c, 1, qm[g], &got, 1, &err) == ORK_OK,
                  "range_mse failed: %s", err.msg);
            CHECK(fabs(got - exact) <= 0.03 * exact, "qmax %d, clip %g: histogram %g vs exact %g", qm[g], c, got,
                  exact);
        }
    free(v);

    /* 2. every value saturates: exact (sum2 - 2 c sum + n c^2) */
    memset(cnt, 0, sizeof cnt);
    memset(s1, 0, sizeof s1);
    memset(s2, 0, sizeof s2);
    for (int i = 0; i < 1000; i++) hist_add(3.0f + (float)(i % 7) * 0.01f);
    for (int k = 1; k <= 20; k++) {
        const double c = 0.1 * k; /* below the values' bin */
        double want = 0.0, got = 0.0;
        for (int i = 0; i < 1000; i++) {
            const double a = (double)(3.0f + (float)(i % 7) * 0.01f) - c;
            want += a * a;
        }
        CHECK(ork_act_range_mse(cnt, s1, s2, edges, ORK_ASTATS_BINS, &c, 1, 127, &got, 1, &err) == ORK_OK, "call");
        CHECK(fabs(got - want) <= 1e-9 * want, "saturated clip %g: %.17g vs %.17g", c, got, want);
    }

    /* 3. the same bits on any thread count */
    for (int t = 0; t < 40; t++) {
        memset(cnt, 0, sizeof cnt);
        memset(s1, 0, sizeof s1);
        memset(s2, 0, sizeof s2);
        for (int i = 0; i < 3000; i++) hist_add(check_rnd_f(&st, 50, 30));
        double clips[97], e1[97], en[97];
        for (int i = 0; i < 97; i++) clips[i] = 1e3 * pow(2.0, -i / 8.0);
        CHECK(ork_act_range_mse(cnt, s1, s2, edges, ORK_ASTATS_BINS, clips, 97, t % 2 ? 7 : 127, e1, 1, &err) == 0,
              "call");
        CHECK(ork_act_range_mse(cnt, s1, s2, edges, ORK_ASTATS_BINS, clips, 97, t % 2 ? 7 : 127, en, 1 + t % 4,
                                &err) == 0, "call");
        CHECK(memcmp(e1, en, sizeof e1) == 0, "threads %d changed the result", 1 + t % 4);
    }

    /* 4. errors */
    double c0 = 0.0, c1 = 1.0, out;
    CHECK(ork_act_range_mse(cnt, s1, s2, edges, ORK_ASTATS_BINS, &c0, 1, 127, &out, 1, &err) == ORK_EINVAL, "clip 0");
    CHECK(ork_act_range_mse(cnt, s1, s2, edges, ORK_ASTATS_BINS, &c1, 1, 0, &out, 1, &err) == ORK_EINVAL, "qmax 0");
    CHECK(ork_act_range_mse(NULL, s1, s2, edges, ORK_ASTATS_BINS, &c1, 1, 127, &out, 1, &err) == ORK_EINVAL, "NULL");
    double bad_edges[3] = {0.0, 1.0, 0.5};
    CHECK(ork_act_range_mse(cnt, s1, s2, bad_edges, 2, &c1, 1, 127, &out, 1, &err) == ORK_EINVAL, "edges");

    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
