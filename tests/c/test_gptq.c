/* test_gptq.c - GPTQ rounding (gptq.h) and the input Gram matrix a linear
 * collects for it (linear.h, "Input Gram matrix"), natively and on aarch64
 * under qemu.
 *
 * What runs per ISA: GPTQ's multiply-accumulate kernels (gptq_kernels.h,
 * float64 and float32), the Gram matrix's tile, and the segment scale GPTQ
 * takes from ork_quant_segment_scale, whose clip search uses the active
 * quantizer table. So everything below runs once per available ISA (scalar
 * and AVX2 here, scalar and NEON on aarch64) and the results are compared
 * across ISAs too.
 *   - GPTQ in both precisions (float64, float32: gptq.h "Precision") against
 *     an oracle per precision written from the contract alone (gptq_oracle.h): the
 *     factor of step 2 the textbook way (right-looking Cholesky of P H P,
 *     forward substitution, reversal), then the eager column loop of step 4
 *     in that precision; codes and scales byte for byte, over odd shapes (K = 1, K
 *     not a multiple of the 64-column panels, odd K for the padding nibble),
 *     every kind family, dead columns, static and dynamic groups, several
 *     blocks and thread counts (shapes big enough that the pool splits the
 *     factorization and the rows);
 *   - ork_gptq_factor against the same oracle and against inv(H) = U^T U;
 *   - a diagonal Gram matrix without damping is plain rounding: codes and
 *     scales of the 8-bit kinds are ork_quantize's byte for byte (imatrix
 *     diag / rows, groups), the 4-bit scales are;
 *   - error feedback helps: on correlated inputs the output error of GPTQ is
 *     below plain rounding's;
 *   - the Gram matrix equals its contract's sum bit for bit (linear.h: float32
 *     fmaf chains over blocks of ORK_GRAM_ROWS rows, added in double), for
 *     odd shapes, accumulating over calls, lower triangle untouched, on 1,
 *     2 and 3 threads.
 * Prints failures and a closing "N passed, N failed" line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/cpu.h"
#include "../../csrc/ork/gptq.h"
#include "../../csrc/ork/linear.h"
#include "../../csrc/ork/quant.h"
#include "check.h"

#define SEED 0x2545F4914F6CDD1DULL
static uint64_t st = SEED;
static double rnd_n(void) { /* about N(0, 1): a sum of four uniforms, centred and scaled */
    double s = 0.0;
    for (int i = 0; i < 4; i++) s += (double)check_rnd(&st) / 4096.0 / 1048576.0;
    return (s - 2.0) * 1.7320508075688772;
}

/* ------------------------------------------------------------ the oracle -- */
#define OR double
#define OX(n) n##_d
#define OSQRT sqrt
#include "gptq_oracle.h"
#undef OR
#undef OX
#undef OSQRT
#define OR float
#define OX(n) n##_f
#define OSQRT sqrtf
#include "gptq_oracle.h"
#undef OR
#undef OX
#undef OSQRT

static int oracle_factor(const double *h, size_t K, double *u) { return oracle_factor_d(h, K, u); }

/* the oracle of p's precision */
static int oracle_gptq(const float *w, size_t N, size_t K, const double *gram, const ork_gptq_params *p,
                       uint8_t *codes, float *scales) {
    return p->precision == ORK_GPTQ_F32 ? oracle_gptq_f(w, N, K, gram, p, codes, scales)
                                        : oracle_gptq_d(w, N, K, gram, p, codes, scales);
}

/* -------------------------------------------------------------- the data -- */
/* gram (K x K) = X^T X of M rows whose columns are correlated (each x[m][k] mixes its neighbours),
 * a few loud channels, and the columns in `dead` never firing (their rows / columns of X zero) */
static void make_gram(size_t M, size_t K, const size_t *dead, size_t ndead, double *gram) {
    float *x = malloc(M * K * sizeof(float));
    for (size_t m = 0; m < M; m++) {
        double prev = 0.0;
        for (size_t k = 0; k < K; k++) {
            prev = 0.6 * prev + rnd_n();
            x[m * K + k] = (float)(prev * (k % 11 == 3 ? 8.0 : 1.0));
        }
        for (size_t d = 0; d < ndead; d++) x[m * K + dead[d]] = 0.0f;
    }
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < K; j++) {
            double s = 0.0;
            for (size_t m = 0; m < M; m++) s += (double)x[m * K + i] * (double)x[m * K + j];
            gram[i * K + j] = s;
        }
    free(x);
}

static void make_weight(size_t N, size_t K, float *w) {
    for (size_t i = 0; i < N * K; i++) w[i] = (float)(0.05 * rnd_n());
    for (size_t k = 0; k < K; k += 17) w[k] *= 30.0f; /* row 0's outliers */
    if (N > 2) memset(w + 2 * K, 0, K * sizeof(float)); /* a zero row */
}

static size_t scale_count(size_t K, size_t group) { return ork_group_count(K, group && group < K ? group : 0); }

/* ----------------------------------------------------------------- GPTQ -- */
typedef struct {
    ork_kind kind;
    size_t N, K, M, group;
    int static_groups;
    size_t rows; /* 0: no importance */
    double damp;
    size_t ndead;
    size_t dead[3];
} gcase;

/* every (block, threads) of one case against the oracle; the codes and scales of the first run returned */
static void gptq_case(const gcase *c, ork_gptq_prec prec, const size_t *blocks, size_t nb, const char *isa_name,
                      uint8_t **codes_out, float **scales_out) {
    const size_t N = c->N, K = c->K, rb = ork_quant_row_bytes(c->kind, K), G = scale_count(K, c->group);
    float *w = malloc(N * K * sizeof(float));
    double *gram = malloc(K * K * sizeof(double));
    uint8_t *want = malloc(N * rb), *got = malloc(N * rb);
    float *want_s = malloc(N * G * sizeof(float)), *got_s = malloc(N * G * sizeof(float));
    make_weight(N, K, w);
    make_gram(c->M, K, c->dead, c->ndead, gram);
    ork_gptq_params p = {c->kind, c->damp, 1, c->rows, c->group, c->static_groups, 1, prec};
    CHECK(oracle_gptq(w, N, K, gram, &p, want, want_s), "oracle failed");
    const char *kn = ork_kind_get(c->kind)->name;
    char who[64]; /* the ISA and the precision, in every message */
    snprintf(who, sizeof who, "%s %s", isa_name, prec == ORK_GPTQ_F32 ? "float32" : "float64");
    const char *isa = who;
    for (size_t b = 0; b < nb; b++)
        for (int nt = 1; nt <= 3; nt++) {
            ork_err err;
            p.block = blocks[b];
            p.nthreads = nt;
            memset(got, 0xa5, N * rb);
            memset(got_s, 0xa5, N * G * sizeof(float));
            ork_status s = ork_gptq(w, N, K, gram, &p, got, got_s, &err);
            CHECK(s == ORK_OK, "%s %s N=%zu K=%zu: %s", isa, kn, N, K, err.msg);
            CHECK(memcmp(got, want, N * rb) == 0, "%s %s N=%zu K=%zu group %zu%s block %zu, %d threads: codes differ "
                  "from the oracle's", isa, kn, N, K, c->group, c->static_groups ? " static" : "", blocks[b], nt);
            CHECK(memcmp(got_s, want_s, N * G * sizeof(float)) == 0, "%s %s N=%zu K=%zu group %zu%s block %zu, "
                  "%d threads: scales differ from the oracle's", isa, kn, N, K, c->group,
                  c->static_groups ? " static" : "", blocks[b], nt);
        }
    for (int nt = 1; nt <= 2; nt++) { /* the caller's H as the workspace: the same bytes */
        ork_err err;
        double *g2 = malloc(K * K * sizeof(double));
        memcpy(g2, gram, K * K * sizeof(double));
        p.block = blocks[0];
        p.nthreads = nt;
        memset(got, 0xa5, N * rb);
        memset(got_s, 0xa5, N * G * sizeof(float));
        ork_status s = ork_gptq_consume(w, N, K, g2, &p, got, got_s, &err);
        CHECK(s == ORK_OK, "%s %s consume N=%zu K=%zu: %s", isa, kn, N, K, err.msg);
        CHECK(memcmp(got, want, N * rb) == 0 && memcmp(got_s, want_s, N * G * sizeof(float)) == 0,
              "%s %s N=%zu K=%zu group %zu, %d threads: ork_gptq_consume differs from the oracle", isa, kn, N, K,
              c->group, nt);
        free(g2);
    }
    *codes_out = want;
    *scales_out = want_s;
    free(w); free(gram); free(got); free(got_s);
}

/* each case's output on the scalar ISA, which every other ISA's must equal */
#define NCASES 10
static uint8_t *first_codes[2][NCASES];
static float *first_scales[2][NCASES];

static void gptq_vs_oracle(const char *isa, int scalar) {
    const gcase cases[NCASES] = {
        {ORK_KIND_INT8, 5, 1, 3, 0, 0, 0, 0.01, 0, {0}},                 /* K = 1 */
        {ORK_KIND_INT8, 19, 37, 50, 0, 0, 0, 0.01, 2, {4, 36}},         /* dead columns, the last among them */
        {ORK_KIND_INT6, 17, 70, 40, 32, 0, 40, 0.02, 1, {33}},          /* dynamic groups, a short last one */
        {ORK_KIND_INT5, 3, 130, 200, 64, 1, 200, 0.01, 0, {0}},         /* static groups, three panels */
        {ORK_KIND_NF4, 21, 67, 30, 32, 0, 30, 0.01, 1, {66}},           /* odd K: the padding nibble */
        {ORK_KIND_INT4, 18, 96, 100, 32, 1, 100, 0.0, 0, {0}},          /* no damping (M > K) */
        {ORK_KIND_W4A4, 7, 45, 20, 0, 0, 20, 0.05, 0, {0}},             /* rank-deficient: damping needed */
        {ORK_KIND_NF4, 9, 33, 64, 4096, 0, 64, 0.01, 0, {0}},           /* group >= K: per row */
        {ORK_KIND_INT4, 2, 64, 80, 0, 0, 0, 0.01, 1, {0}},              /* no importance, dead column 0 */
        /* the pool splits it: factor 266^2 * 64 and 330^3 work, rows 80 * 330^2 (pool.h, gptq.c) */
        {ORK_KIND_NF4, 80, 330, 400, 64, 0, 400, 0.01, 2, {5, 200}},
    };
    const size_t blocks[] = {1, 7, 64, 128, 1000}, big_blocks[] = {1, 128};
    printf("comparing gptq on %s against the oracle\n", isa);
    for (int pi = 0; pi < 2; pi++) { /* float64, float32 */
        const ork_gptq_prec prec = pi ? ORK_GPTQ_F32 : ORK_GPTQ_F64;
        for (size_t i = 0; i < NCASES; i++) {
            uint8_t *codes;
            float *scales;
            if (cases[i].K > 300) gptq_case(&cases[i], prec, big_blocks, 2, isa, &codes, &scales);
            else gptq_case(&cases[i], prec, blocks, sizeof blocks / sizeof *blocks, isa, &codes, &scales);
            const size_t cb = cases[i].N * ork_quant_row_bytes(cases[i].kind, cases[i].K);
            const size_t sb = cases[i].N * scale_count(cases[i].K, cases[i].group) * sizeof(float);
            if (scalar) {
                first_codes[pi][i] = codes;
                first_scales[pi][i] = scales;
                continue;
            }
            CHECK(memcmp(codes, first_codes[pi][i], cb) == 0 && memcmp(scales, first_scales[pi][i], sb) == 0,
                  "%s %s: case %zu differs from the scalar ISA's", isa, pi ? "float32" : "float64", i);
            free(codes);
            free(scales);
        }
    }
}

/* ork_gptq_factor: the oracle's factor bit for bit, its strict lower triangle 0, U^T U H = I */
static void factor_checks(const char *isa) {
    const size_t Ks[] = {1, 2, 63, 64, 65, 130, 260};
    for (size_t a = 0; a < sizeof Ks / sizeof *Ks; a++) {
        const size_t K = Ks[a];
        double *h = malloc(K * K * sizeof(double)), *want = malloc(K * K * sizeof(double));
        double *got = malloc(K * K * sizeof(double));
        make_gram(K + 20, K, NULL, 0, h);
        for (size_t k = 0; k < K; k++) h[k * K + k] += 0.01;
        CHECK(oracle_factor(h, K, want), "oracle factor K=%zu", K);
        for (int nt = 1; nt <= 3; nt += 2) {
            ork_err err;
            memset(got, 0xa5, K * K * sizeof(double));
            CHECK(ork_gptq_factor(h, K, nt, got, &err) == ORK_OK, "factor K=%zu: %s", K, err.msg);
            CHECK(memcmp(got, want, K * K * sizeof(double)) == 0, "%s factor K=%zu %d threads differs from the "
                  "oracle's", isa, K, nt);
        }
        double *t = calloc(K * K, sizeof(double)); /* (U^T U) H - I, U^T U = inv(H) */
        double worst = 0.0;
        for (size_t i = 0; i < K; i++)
            for (size_t k = 0; k < K; k++)
                for (size_t q = 0; q <= (i < k ? i : k); q++) t[i * K + k] += got[q * K + i] * got[q * K + k];
        for (size_t i = 0; i < K; i++)
            for (size_t j = 0; j < K; j++) {
                double s = i == j ? -1.0 : 0.0;
                for (size_t k = 0; k < K; k++) s += t[i * K + k] * h[k * K + j];
                worst = fabs(s) > worst ? fabs(s) : worst;
            }
        free(t);
        CHECK(worst < 1e-7, "%s factor K=%zu: |U^T U H - I| = %g", isa, K, worst);
        int pos = 1;
        for (size_t k = 0; k < K; k++) pos &= got[k * K + k] > 0.0;
        CHECK(pos, "factor K=%zu: a non-positive diagonal", K);
        free(h); free(want); free(got);
    }
    double bad[4] = {1.0, 2.0, 2.0, 1.0}, u[4]; /* indefinite */
    ork_err err;
    CHECK(ork_gptq_factor(bad, 2, 1, u, &err) == ORK_EINVAL, "an indefinite H is refused");
}

/* a diagonal H, no damping: nothing moves, so the rounding is plain rounding */
static void diagonal_checks(const char *isa) {
    const ork_kind kinds[] = {ORK_KIND_INT8, ORK_KIND_INT6, ORK_KIND_INT5, ORK_KIND_W4A4, ORK_KIND_NF4, ORK_KIND_INT4};
    const size_t groups[] = {0, 32, 64};
    const size_t N = 13, K = 99, rows = 7;
    float *w = malloc(N * K * sizeof(float)), *im = malloc(K * sizeof(float));
    double *gram = calloc(K * K, sizeof(double));
    make_weight(N, K, w);
    for (size_t k = 0; k < K; k++) gram[k * K + k] = k == 10 ? 0.0 : 0.5 + fabs(rnd_n()) * 3.0; /* 10 dead */
    for (size_t k = 0; k < K; k++) im[k] = (float)(gram[k * K + k] / (double)rows);
    uint8_t *codes = malloc(N * K), *plain = malloc(N * K), *want = malloc(N * K);
    float *sc = malloc(N * 4 * sizeof(float)), *psc = malloc(N * 4 * sizeof(float));
    float *wsc = malloc(N * 4 * sizeof(float));
    for (size_t a = 0; a < sizeof kinds / sizeof *kinds; a++)
        for (size_t b = 0; b < sizeof groups / sizeof *groups; b++)
            for (int stat = 0; stat <= 3; stat++) { /* bit 0: static groups; bit 1: float32 */
                const ork_kind_info *info = ork_kind_get(kinds[a]);
                const size_t rb = ork_quant_row_bytes(kinds[a], K), G = scale_count(K, groups[b]);
                ork_gptq_params p = {kinds[a], 0.0, 16, rows, groups[b], stat & 1, 2,
                                     stat & 2 ? ORK_GPTQ_F32 : ORK_GPTQ_F64};
                ork_quant_params qp;
                memset(&qp, 0, sizeof qp);
                qp.kind = kinds[a];
                qp.imatrix = info->bits == 4 || info->qmax < 127 ? im : NULL;
                qp.group = groups[b];
                qp.nthreads = 1;
                ork_err err;
                CHECK(ork_gptq(w, N, K, gram, &p, codes, sc, &err) == ORK_OK, "%s", err.msg);
                CHECK(ork_quantize(w, N, K, &qp, plain, psc, &err) == ORK_OK, "%s", err.msg);
                CHECK(memcmp(sc, psc, N * G * sizeof(float)) == 0, "%s diagonal %s group %zu%s: scales are not "
                      "ork_quantize's", isa, info->name, groups[b], stat & 1 ? " static" : "");
                if (info->bits == 8)
                    CHECK(memcmp(codes, plain, N * rb) == 0, "%s diagonal %s group %zu%s: codes are not "
                          "ork_quantize's", isa, info->name, groups[b], stat & 1 ? " static" : "");
                CHECK(oracle_gptq(w, N, K, gram, &p, want, wsc) && memcmp(codes, want, N * rb) == 0,
                      "%s diagonal %s group %zu%s: codes are not the nearest levels", isa, info->name, groups[b],
                      stat & 1 ? " static" : "");
            }
    free(w); free(im); free(gram); free(codes); free(plain); free(want); free(sc); free(psc); free(wsc);
}

/* sum over rows of d H d^T, d = w - dequant: the layer's output error on the calibration inputs */
static double out_err(const float *w, size_t N, size_t K, const double *gram, ork_kind kind, const void *codes,
                      const float *scales) {
    float *dq = malloc(N * K * sizeof(float));
    ork_err err;
    ork_dequantize(kind, codes, scales, N, K, 0, dq, 1, &err);
    double tot = 0.0;
    for (size_t n = 0; n < N; n++)
        for (size_t i = 0; i < K; i++) {
            const double di = (double)w[n * K + i] - (double)dq[n * K + i];
            for (size_t j = 0; j < K; j++) tot += di * gram[i * K + j] * ((double)w[n * K + j] - (double)dq[n * K + j]);
        }
    free(dq);
    return tot;
}

static void feedback_helps(const char *isa) {
    const ork_kind kinds[] = {ORK_KIND_INT4, ORK_KIND_INT8};
    const size_t N = 32, K = 64;
    float *w = malloc(N * K * sizeof(float)), sc[32], psc[32];
    double *gram = malloc(K * K * sizeof(double));
    uint8_t codes[32 * 64], plain[32 * 64];
    make_weight(N, K, w);
    make_gram(200, K, NULL, 0, gram);
    for (size_t a = 0; a < 4; a++) { /* each kind in float64, then float32 */
        ork_gptq_params p = {kinds[a % 2], 0.01, 16, 0, 0, 0, 1, a < 2 ? ORK_GPTQ_F64 : ORK_GPTQ_F32};
        ork_quant_params qp;
        memset(&qp, 0, sizeof qp);
        qp.kind = kinds[a % 2];
        qp.nthreads = 1;
        ork_err err;
        CHECK(ork_gptq(w, N, K, gram, &p, codes, sc, &err) == ORK_OK, "%s", err.msg);
        CHECK(ork_quantize(w, N, K, &qp, plain, psc, &err) == ORK_OK, "%s", err.msg);
        const double eg = out_err(w, N, K, gram, kinds[a % 2], codes, sc);
        const double er = out_err(w, N, K, gram, kinds[a % 2], plain, psc);
        CHECK(eg < 0.9 * er, "%s %s %s: GPTQ's output error %g is not below plain rounding's %g", isa,
              ork_kind_get(kinds[a % 2])->name, a < 2 ? "float64" : "float32", eg, er);
    }
    free(w); free(gram);
}

static void bad_arguments(void) {
    float w[4] = {1, 2, 3, 4}, sc[2];
    int8_t codes[4];
    double g[4] = {1, 0, 0, 1};
    ork_gptq_params p = {ORK_KIND_INT8, 0.0, 4, 0, 0, 0, 1};
    ork_err err;
    g[1] = g[2] = NAN;
    CHECK(ork_gptq(w, 2, 2, g, &p, codes, sc, &err) == ORK_ENONFINITE && strstr(err.msg, "(0, 1)"), "NaN in H");
    g[1] = g[2] = 0.0;
    g[3] = -1.0;
    CHECK(ork_gptq(w, 2, 2, g, &p, codes, sc, &err) == ORK_EINVAL && strstr(err.msg, "[1]"), "negative diagonal");
    g[0] = g[3] = 1.0;
    g[1] = g[2] = 2.0; /* indefinite, no damping */
    CHECK(ork_gptq(w, 2, 2, g, &p, codes, sc, &err) == ORK_EINVAL && strstr(err.msg, "positive definite"),
          "indefinite H");
    g[1] = g[2] = 0.0;
    p.block = 0;
    CHECK(ork_gptq(w, 2, 2, g, &p, codes, sc, &err) == ORK_EINVAL, "block 0");
}

/* ----------------------------------------------------- the Gram matrix -- */
/* xx_sum after ork_linear_apply on two batches (M1 then M2 rows), against the naive double sum from
 * the same starting values, on 1, 2 and 3 threads; the lower triangle keeps its sentinel */
static void gram_shape(const char *isa, size_t M1, size_t M2, size_t K) {
    const size_t N = 3, M = M1 + M2;
    float *x = malloc(M * K * sizeof(float)), *w = malloc(N * K * sizeof(float));
    float *y = malloc(M * N * sizeof(float)), *y0 = malloc(M * N * sizeof(float));
    double *init = malloc(K * K * sizeof(double)), *want = malloc(K * K * sizeof(double));
    double *got = malloc(K * K * sizeof(double));
    for (size_t i = 0; i < M * K; i++) x[i] = check_rnd_f(&st, 13, 24); /* 24 binades: order shows */
    for (size_t i = 0; i < N * K; i++) w[i] = check_rnd_f(&st, 13, 4);
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < K; j++) init[i * K + j] = j >= i ? (double)check_rnd_f(&st, 5, 30) : -777.0;
    memcpy(want, init, K * K * sizeof(double));
    /* linear.h: each call's rows in blocks of ORK_GRAM_ROWS, a float32 fmaf chain per block, added in double */
    const size_t calls[2][2] = {{0, M1}, {M1, M}};
    for (int cidx = 0; cidx < 2; cidx++)
        for (size_t b0 = calls[cidx][0]; b0 < calls[cidx][1]; b0 += ORK_GRAM_ROWS) {
            const size_t b1 = b0 + ORK_GRAM_ROWS < calls[cidx][1] ? b0 + ORK_GRAM_ROWS : calls[cidx][1];
            for (size_t i = 0; i < K; i++)
                for (size_t j = i; j < K; j++) {
                    float c = 0.0f;
                    for (size_t m = b0; m < b1; m++) c = fmaf(x[m * K + i], x[m * K + j], c);
                    want[i * K + j] += (double)c;
                }
        }
    ork_linear l;
    memset(&l, 0, sizeof l);
    l.path = ORK_LIN_F32;
    l.N = N;
    l.K = K;
    l.w = w;
    ork_err err;
    CHECK(ork_linear_apply(&l, x, M, y0, 1, &err) == ORK_OK, "%s", err.msg);
    for (int nt = 1; nt <= 3; nt++) {
        uint64_t count = 5;
        memcpy(got, init, K * K * sizeof(double));
        l.xx_sum = got;
        l.xx_count = &count;
        CHECK(ork_linear_apply(&l, x, M1, y, nt, &err) == ORK_OK, "%s", err.msg);
        CHECK(ork_linear_apply(&l, x + M1 * K, M2, y + M1 * N, nt, &err) == ORK_OK, "%s", err.msg);
        CHECK(memcmp(got, want, K * K * sizeof(double)) == 0, "%s Gram M=%zu+%zu K=%zu %d threads: not the naive "
              "sum of the float32 blocks", isa, M1, M2, K, nt);
        CHECK(count == 5 + M, "%s Gram count %llu, want %zu", isa, (unsigned long long)count, 5 + M);
        CHECK(memcmp(y, y0, M * N * sizeof(float)) == 0, "%s Gram M=%zu K=%zu: the product changed", isa, M, K);
    }
    free(x); free(w); free(y); free(y0); free(init); free(want); free(got);
}

static void gram_checks(const char *isa) {
    printf("comparing the gram matrix on %s against its contract's sum\n", isa);
    const size_t shapes[][3] = {{1, 1, 1}, {2, 1, 5}, {9, 8, 9}, {1, 1, 31}, {3, 4, 67}, {1, 2, 130},
                                /* blocks of ORK_GRAM_ROWS = 256 rows (a call of 600: 256 + 256 + 88); 2 and 3
                                 * threads per call: R K^2 / 2 multiply-adds per block, 2^20 a thread (linear.c) */
                                {70, 50, 300}, {7, 90, 301}, {600, 256, 150}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        gram_shape(isa, shapes[i][0], shapes[i][1], shapes[i][2]);
}

int main(void) {
    int tested = 0;
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        ork_err err;
        if (!ork_isa_available((ork_isa)i)) continue;
        const char *isa = ork_isa_name((ork_isa)i);
        ork_cpu_set_isa(isa, &err);
        st = SEED; /* the same data on every ISA */
        CHECK(ork_cpu_isa() == (ork_isa)i, "%s: not active", isa);
        if (i != ORK_ISA_SCALAR) {
            printf("comparing %s against scalar\n", isa); /* the scale search's table under GPTQ */
            tested++;
        }
        gptq_vs_oracle(isa, i == ORK_ISA_SCALAR);
        factor_checks(isa);
        diagonal_checks(isa);
        feedback_helps(isa);
        gram_checks(isa);
    }
    bad_arguments();
    CHECK(tested > 0, "no SIMD ISA to compare");
    for (int pi = 0; pi < 2; pi++)
        for (size_t i = 0; i < NCASES; i++) {
            free(first_codes[pi][i]);
            free(first_scales[pi][i]);
        }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
