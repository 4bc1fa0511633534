/* test_attn.c - the attention value sums (attn.h): every SIMD table of this
 * build (AVX2; NEON on aarch64) bit-identical to the scalar _ref over head
 * sizes with and without a tail (hd 1..260: the 64- and 32-wide blocks, the
 * 8/4-wide vectors and the scalar rest), row counts 1..7 (the three-row
 * groups and their remainders), key counts 0..37, row and probability
 * strides, and outputs that continue the chains left in o; the contract itself
 * on every ISA (one fused multiply-add per term, keys in order, o continued,
 * no keys leaves o as it was), checked against values written out by hand.
 * (The scores are the float32 GEMM's: tests/c/test_gemm_f32.c.) Prints
 * failures and a closing "N passed, N failed" line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/attn.h"
#include "../../csrc/ork/cpu.h"
#include "check.h"

static uint64_t st = 0x2545F4914F6CDD1DULL;
static float rnd_f(void) { return check_rnd_f(&st, 19, 9); }

static void compare(const ork_attn_kernels *kv, size_t hd, size_t R, size_t n) {
    const size_t ld = hd + 5, ldp = n + 3, ldo = hd + 7; /* strides that are not the sizes */
    float *v = malloc((n * ld + 1) * sizeof(float)), *p = malloc((R * ldp + 1) * sizeof(float));
    float *o1 = malloc((R * ldo + 2) * sizeof(float)), *o2 = malloc((R * ldo + 2) * sizeof(float));
    for (size_t i = 0; i < n * ld; i++) v[i] = rnd_f();
    for (size_t i = 0; i < R * ldp; i++) p[i] = fabsf(rnd_f());
    for (size_t i = 0; i < R * ldo + 2; i++) o1[i] = o2[i] = i < R * ldo && (i % ldo) < hd ? rnd_f() : 777.0f; /* chains to continue */
    ork_attn_kernels_ref.pv(p, ldp, R, v, ld, n, hd, o1, ldo);
    kv->pv(p, ldp, R, v, ld, n, hd, o2, ldo);
    CHECK(memcmp(o1, o2, (R * ldo + 2) * sizeof(float)) == 0, "%s pv hd=%zu R=%zu n=%zu", kv->isa, hd, R, n);
    int past = 1;
    for (size_t i = 0; i < R * ldo + 2; i++)
        if ((i % ldo) >= hd || i >= R * ldo) past &= o2[i] == 777.0f;
    CHECK(past, "%s hd=%zu R=%zu n=%zu: wrote outside the outputs", kv->isa, hd, R, n);
    free(v); free(p); free(o1); free(o2);
}

static void compare_table(const ork_attn_kernels *kv) {
    printf("comparing %s against scalar\n", kv->isa);
    static const size_t hds[] = {1, 3, 4, 7, 8, 9, 15, 16, 24, 31, 32, 33, 40, 63, 64, 65, 72, 80, 96, 120, 128, 136,
                                 192, 200, 256, 260};
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t R = 1; R <= 7; R++)
            for (size_t n = 0; n <= 37; n += (n < 10 ? 1 : 9)) compare(kv, hds[a], R, n);
}

/* the contract on one table: fused, keys in order, o continued, no keys leaves o */
static void contract(const ork_attn_kernels *kv) {
    /* 1 + 2^-24 * 1 ... in key order: p0*v0 = 1, then 3 x (2^-24 each, rounded away) */
    float p[4] = {1.0f, 0x1p-24f, 0x1p-24f, 0x1p-24f}, vv[4] = {1.0f, 1.0f, 1.0f, 1.0f}, o[1] = {0.0f};
    kv->pv(p, 4, 1, vv, 1, 4, 1, o, 1);
    CHECK(o[0] == 1.0f, "%s: pv not summed in key order (got %.9g)", kv->isa, (double)o[0]);
    /* x*y = 1 + 2^-22 + 2^-46 exactly: fused with c = -(1 + 2^-22) gives 2^-46 (unfused: 0) */
    const float x = 1.0f + 0x1p-23f, y = 1.0f + 0x1p-23f, c = -(1.0f + 0x1p-22f);
    float pp[2] = {1.0f, x}, v2[2] = {c, y};
    for (size_t hd = 1; hd <= 72; hd += 71) { /* the scalar rest (1) and the vector paths (72) */
        float *v3 = malloc(2 * hd * sizeof(float)), *o3 = malloc(3 * hd * sizeof(float));
        float p3[6] = {1.0f, x, 1.0f, x, 1.0f, x};
        for (size_t d = 0; d < hd; d++) v3[d] = c, v3[hd + d] = y;
        for (size_t i = 0; i < 3 * hd; i++) o3[i] = 0.0f;
        kv->pv(p3, 2, 3, v3, hd, 2, hd, o3, hd);
        int ok = 1;
        for (size_t i = 0; i < 3 * hd; i++) ok &= o3[i] == 0x1p-46f;
        CHECK(ok, "%s hd=%zu: pv not one fused multiply-add per term (got %.9g)", kv->isa, hd, (double)o3[0]);
        /* continued: from o = 0.5, terms 1*1 and 1*0.25 give 1.75 (1.25 if a kernel restarted at 0) */
        float p4[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
        for (size_t d = 0; d < hd; d++) v3[d] = 1.0f, v3[hd + d] = 0.25f;
        for (size_t i = 0; i < 3 * hd; i++) o3[i] = 0.5f;
        kv->pv(p4, 2, 3, v3, hd, 2, hd, o3, hd);
        ok = 1;
        for (size_t i = 0; i < 3 * hd; i++) ok &= o3[i] == 1.75f;
        CHECK(ok, "%s hd=%zu: pv did not continue the chains in o (got %.9g)", kv->isa, hd, (double)o3[0]);
        free(v3); free(o3);
    }
    float o2[1] = {-3.5f};
    kv->pv(pp, 2, 1, v2, 1, 0, 1, o2, 1);
    CHECK(o2[0] == -3.5f, "%s: no keys gives %g, want o unchanged", kv->isa, (double)o2[0]);
}

/* softmax: the table against the scalar _ref on rows with and without a tail, with and without a
 * soft-cap, spread wide enough that some exps fall below the -87 cut, and with a NaN and +-0 ties */
static void compare_softmax(const ork_attn_kernels *kv) {
    for (size_t n = 0; n <= 70; n++)
        for (int kind = 0; kind < 4; kind++) {
            float *a = malloc((n + 2) * sizeof(float)), *b = malloc((n + 2) * sizeof(float));
            for (size_t u = 0; u < n + 2; u++) a[u] = b[u] = u < n ? rnd_f() * (kind == 1 ? 40.0f : 3.0f) : 777.0f;
            if (kind == 2 && n > 3) a[3] = b[3] = NAN;
            if (kind == 3) for (size_t u = 0; u < n; u += 2) a[u] = b[u] = (u & 2) ? -0.0f : 0.0f;
            const float cap = kind == 1 ? 30.0f : 0.0f;
            ork_attn_kernels_ref.softmax(a, n, 0.37f, cap);
            kv->softmax(b, n, 0.37f, cap);
            CHECK(memcmp(a, b, (n + 2) * sizeof(float)) == 0, "%s softmax n=%zu kind=%d", kv->isa, n, kind);
            free(a); free(b);
        }
}

/* the exp: within 2 ulp of exp (float64) on [-87, 88], +0 below -87, 88 above, NaN kept, exp(0) = 1 */
static void expf_contract(void) {
    double worst = 0.0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0009765625f * 3.0f + x * 1e-7f) {
        const double want = exp((double)x), got = (double)ork_attn_expf(x);
        const double ulp = ldexp(1.0, ilogb(want) - 23);
        const double e = fabs(got - want) / ulp;
        if (e > worst) worst = e;
    }
    CHECK(worst <= 2.0, "ork_attn_expf: %.3f ulp from exp on [-87, 88]", worst);
    CHECK(ork_attn_expf(0.0f) == 1.0f && ork_attn_expf(-0.0f) == 1.0f, "ork_attn_expf(0) = %g", (double)ork_attn_expf(0.0f));
    CHECK(ork_attn_expf(-87.01f) == 0.0f && !signbit(ork_attn_expf(-1000.0f)) && ork_attn_expf(-INFINITY) == 0.0f,
          "ork_attn_expf below -87 is not +0");
    CHECK(ork_attn_expf(1000.0f) == ork_attn_expf(88.0f) && ork_attn_expf(INFINITY) == ork_attn_expf(88.0f),
          "ork_attn_expf above 88 is not exp(88)");
    CHECK(isnan(ork_attn_expf(NAN)), "ork_attn_expf(NaN) is not a NaN");
}

/* the softmax contract on one table, written out: scale, max, the exp, the 8 float64 lanes and their
 * tree (a sum of positive terms in float64 is seldom visible after the float division: the lanes are
 * checked through the SIMD tables' bit equality with the _ref on the 71 row lengths above) */
static void softmax_contract(const ork_attn_kernels *kv) {
    for (size_t n = 1; n <= 37; n += 4) {
        float s[40], want[40];
        for (size_t u = 0; u < n; u++) s[u] = rnd_f() * 5.0f;
        float mx = -INFINITY;
        for (size_t u = 0; u < n; u++) mx = fmaxf(mx, s[u] * 0.5f);
        double lane[8] = {0};
        for (size_t u = 0; u < n; u++) lane[u % 8] += (double)(want[u] = ork_attn_expf(s[u] * 0.5f - mx));
        const double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        for (size_t u = 0; u < n; u++) want[u] *= (float)(1.0 / sum);
        kv->softmax(s, n, 0.5f, 0.0f);
        CHECK(memcmp(s, want, n * sizeof(float)) == 0, "%s softmax n=%zu differs from the contract written out",
              kv->isa, n);
    }
}

int main(void) {
    int tested = 0;
#if defined(__x86_64__)
    if (ork_isa_available(ORK_ISA_AVX2)) {
        compare_table(&ork_attn_kernels_avx2);
        compare_softmax(&ork_attn_kernels_avx2);
        tested++;
    }
#endif
#if defined(__aarch64__)
    compare_table(&ork_attn_kernels_neon);
    compare_softmax(&ork_attn_kernels_neon);
    tested++;
#endif
    CHECK(tested > 0, "no SIMD attention table to compare");
    expf_contract();
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        ork_err err;
        if (!ork_isa_available((ork_isa)i)) continue;
        ork_cpu_set_isa(ork_isa_name((ork_isa)i), &err);
        CHECK(ork_attn_kernels_active() == ork_attn_kernels_for((ork_isa)i), "%s: active table",
              ork_isa_name((ork_isa)i));
        contract(ork_attn_kernels_active());
        softmax_contract(ork_attn_kernels_active());
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
