/* test_attn.c - the attention loops (attn.h): every SIMD table of this build
 * (AVX2; NEON on aarch64) bit-identical to the scalar _ref over head sizes
 * with and without a tail (hd 1..260: the 8-lane dot, the 64-wide pv
 * blocks and their remainders), key counts 0..37 (the 4- and 2-key groups
 * and their tails), row strides; the contract itself on every ISA (the dot8
 * lane tree and the unfused pv sums, checked against values written out by
 * hand) and the scores' scale applied after the dot. Prints failures and a
 * closing "N passed, N failed" line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/attn.h"
#include "../../csrc/ork/cpu.h"
#include "check.h"

static uint64_t st = 0x2545F4914F6CDD1DULL;
static float rnd_f(void) { return check_rnd_f(&st, 19, 9); }

static void compare(const ork_attn_kernels *kv, size_t hd, size_t n) {
    const size_t ld = hd + 5; /* a row stride that is not the head size */
    float *q = malloc((hd + 1) * sizeof(float)), *k = malloc((n * ld + 1) * sizeof(float));
    float *v = malloc((n * ld + 1) * sizeof(float)), *p = malloc((n + 1) * sizeof(float));
    float *s1 = malloc((n + 2) * sizeof(float)), *s2 = malloc((n + 2) * sizeof(float));
    float *o1 = malloc((hd + 2) * sizeof(float)), *o2 = malloc((hd + 2) * sizeof(float));
    for (size_t i = 0; i < hd; i++) q[i] = rnd_f();
    for (size_t i = 0; i < n * ld; i++) k[i] = rnd_f(), v[i] = rnd_f();
    for (size_t i = 0; i < n; i++) p[i] = fabsf(rnd_f());
    for (size_t i = 0; i < n + 2; i++) s1[i] = s2[i] = 777.0f;
    for (size_t i = 0; i < hd + 2; i++) o1[i] = o2[i] = 777.0f;
    const float scale = 0.125f + (float)(hd % 7) * 0.0371f;
    ork_attn_kernels_ref.scores(q, k, ld, n, hd, scale, s1);
    kv->scores(q, k, ld, n, hd, scale, s2);
    CHECK(memcmp(s1, s2, (n + 2) * sizeof(float)) == 0, "%s scores hd=%zu n=%zu", kv->isa, hd, n);
    ork_attn_kernels_ref.pv(p, v, ld, n, hd, o1);
    kv->pv(p, v, ld, n, hd, o2);
    CHECK(memcmp(o1, o2, (hd + 2) * sizeof(float)) == 0, "%s pv hd=%zu n=%zu", kv->isa, hd, n);
    CHECK(s2[n] == 777.0f && s2[n + 1] == 777.0f && o2[hd] == 777.0f, "%s hd=%zu n=%zu: wrote past the end",
          kv->isa, hd, n);
    free(q); free(k); free(v); free(p); free(s1); free(s2); free(o1); free(o2);
}

static void compare_table(const ork_attn_kernels *kv) {
    printf("comparing %s against scalar\n", kv->isa);
    static const size_t hds[] = {1, 3, 7, 8, 9, 15, 16, 24, 63, 64, 65, 72, 80, 96, 120, 128, 136, 192, 200, 256, 260};
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t n = 0; n <= 37; n += (n < 10 ? 1 : 9)) compare(kv, hds[a], n);
}

/* the contract on one table: lane tree, tail last, scale after; pv unfused, keys in order */
static void contract(const ork_attn_kernels *kv) {
    /* lane l of 8 holds one product; 1e8 + 1 - 1e8 ... shows the grouping */
    float q[10], k[10], s[1];
    const float big = 16777216.0f; /* 2^24: big + 1 rounds back to big */
    const float lanes[8] = {big, 1.0f, -big, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    for (int i = 0; i < 8; i++) q[i] = lanes[i], k[i] = 1.0f;
    q[8] = 3.0f, k[8] = 1.0f; /* the tail term, added after the tree */
    q[9] = 0.0f, k[9] = 0.0f;
    kv->scores(q, k, 10, 1, 9, 0.5f, s);
    /* ((big+1) + (-big+1)) + ((1+1)+(1+1)) = (big + (1-big)) + 4 = 1 + 4 = 5 (big+1 = big; -big+1 exact) */
    const float tree = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    CHECK(s[0] == (tree + 3.0f) * 0.5f, "%s: dot8 tree / tail / scale gives %g, want %g", kv->isa, (double)s[0],
          (double)((tree + 3.0f) * 0.5f));
    /* pv: 1 + 2^-24 * 1 ... in key order, unfused: p0*v0 = 1, then 3 x (2^-24 each, rounded away) */
    float p[4] = {1.0f, 0x1p-24f, 0x1p-24f, 0x1p-24f}, vv[4] = {1.0f, 1.0f, 1.0f, 1.0f}, o[1];
    kv->pv(p, vv, 1, 4, 1, o);
    CHECK(o[0] == 1.0f, "%s: pv not summed in key order (got %.9g)", kv->isa, (double)o[0]);
    /* a product that rounds: x*y = 1 + 2^-22 + 2^-46 exactly; unfused (rounded to 1 + 2^-22, then
     * added to -(1 + 2^-22)) gives 0, a fused multiply-add 2^-46 */
    const float x = 1.0f + 0x1p-23f, y = 1.0f + 0x1p-23f, c = -(1.0f + 0x1p-22f);
    float pp[2] = {1.0f, x}, v2[2] = {c, y}, o2[1];
    kv->pv(pp, v2, 1, 2, 1, o2);
    CHECK(o2[0] == 0.0f, "%s: pv fused a multiply-add (got %.9g)", kv->isa, (double)o2[0]);
    float q2[16] = {0}, k2[16] = {0}, s2[1];
    q2[0] = 1.0f, k2[0] = c, q2[8] = x, k2[8] = y; /* lane 0: two terms */
    kv->scores(q2, k2, 16, 1, 16, 1.0f, s2);
    CHECK(s2[0] == 0.0f, "%s: dot8 fused a multiply-add (got %.9g)", kv->isa, (double)s2[0]);
    kv->pv(pp, v2, 1, 0, 1, o2);
    CHECK(o2[0] == 0.0f && !signbit(o2[0]), "%s: no keys gives %g, want +0", kv->isa, (double)o2[0]);
}

int main(void) {
    int tested = 0;
#if defined(__x86_64__)
    if (ork_isa_available(ORK_ISA_AVX2)) { compare_table(&ork_attn_kernels_avx2); tested++; }
#endif
#if defined(__aarch64__)
    compare_table(&ork_attn_kernels_neon);
    tested++;
#endif
    CHECK(tested > 0, "no SIMD attention table to compare");
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        ork_err err;
        if (!ork_isa_available((ork_isa)i)) continue;
        ork_cpu_set_isa(ork_isa_name((ork_isa)i), &err);
        CHECK(ork_attn_kernels_active() == ork_attn_kernels_for((ork_isa)i), "%s: active table",
              ork_isa_name((ork_isa)i));
        contract(ork_attn_kernels_active());
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
