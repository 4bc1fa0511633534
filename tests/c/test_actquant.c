/* test_actquant.c - the activation modes of a packed linear (linear.h,
 * actspec.h): per token, per tensor, static range (saturating) and outlier
 * channels in float, on every ISA of this build against the scalar kernels and
 * against a naive implementation of the contract, the external int8 matmul
 * path (an NPU backend) bit-identical to the CPU path, the activation
 * statistics' histogram, the spec's validator, the mode registry (a mode
 * registered with its own kernel runs through ork_linear_apply), and the
 * errors. Prints "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/cpu.h"
#include "../../csrc/ork/linear.h"
#include "../../csrc/ork/pack.h"
#include "../../csrc/ork/quant_scalar.h"
#include "check.h"

static uint64_t st = 0x2545F4914F6CDD1DULL;
static uint32_t rnd(void) { return check_rnd(&st); }
static float rnd_f(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; } /* [-1, 1] */

enum { M = 7, K = 100, N = 45 };
static const int32_t OUTL[3] = {3, 40, 99};

typedef struct {
    ork_kind kind;
    void *store;
    float bscale[N];
} weight;

static void make_weight(weight *w, ork_kind kind) {
    float *wf = malloc(N * K * sizeof(float));
    for (size_t i = 0; i < N * K; i++) wf[i] = rnd_f();
    ork_quant_params p;
    memset(&p, 0, sizeof p);
    p.kind = kind;
    p.nthreads = 1;
    void *codes = malloc(N * ork_quant_row_bytes(kind, K));
    ork_err err;
    CHECK(ork_quantize(wf, N, K, &p, codes, w->bscale, &err) == ORK_OK, "quantize kind %d", (int)kind);
    w->kind = kind;
    w->store = malloc(ork_pack_store_bytes(kind, N, K));
    CHECK(ork_pack(kind, codes, N, K, w->store, &err) == ORK_OK, "pack kind %d", (int)kind);
    free(wf);
    free(codes);
}

static ork_linear linear_of(const weight *w, int per_tensor, float clip, size_t n_outl, size_t prefix) {
    ork_linear l;
    memset(&l, 0, sizeof l);
    l.path = ORK_LIN_PACKED;
    l.N = N;
    l.K = K;
    l.kind = w->kind;
    l.store = w->store;
    l.bscale = w->bscale;
    const ork_act_spec init = ORK_ACT_SPEC_INIT;
    l.act = init;
    l.act.mode = clip != 0.0f ? ORK_ACT_MODE_STATIC : per_tensor ? ORK_ACT_MODE_PER_TENSOR
                 : n_outl ? ORK_ACT_MODE_PER_TOKEN_OUTLIERS : ORK_ACT_MODE_PER_TOKEN;
    l.act.clip = clip;
    l.act.outliers = n_outl ? OUTL : NULL;
    l.act.n_outliers = n_outl;
    l.act.prefix = prefix;
    return l;
}

static ork_act_spec static_spec(float clip) {
    ork_act_spec s = ORK_ACT_SPEC_INIT;
    s.mode = ORK_ACT_MODE_STATIC;
    s.clip = clip;
    return s;
}

/* the contract written out naively (linear.h, pack.h) */
static void naive(const weight *w, const float *x, int per_tensor, float clip, size_t n_outl, size_t prefix,
                  float *y) {
    float xm[M * K], a[M];
    memcpy(xm, x, sizeof xm);
    for (size_t m = 0; m < M; m++)
        for (size_t j = 0; j < n_outl; j++) xm[m * K + OUTL[j]] = 0.0f;
    float tmax = 0.0f;
    for (size_t m = 0; m < M; m++) {
        a[m] = 0.0f;
        for (size_t k = 0; k < K; k++) a[m] = fmaxf(a[m], fabsf(xm[m * K + k]));
        if (m >= prefix) tmax = fmaxf(tmax, a[m]);
    }
    for (size_t m = 0; m < M; m++) {
        float r = m < prefix ? a[m] : clip > 0.0f ? clip : per_tensor ? tmax : a[m];
        int8_t q[K];
        float as = 0.0f;
        if (r >= ORK_QUANT_TINY) {
            as = r / 127.0f;
            for (size_t k = 0; k < K; k++) q[k] = (int8_t)ork_clamp127(ork_round_half_away(xm[m * K + k] * (127.0f / r)));
        } else {
            memset(q, 0, sizeof q);
        }
        for (size_t n = 0; n < N; n++) {
            long long acc = 0;
            for (size_t k = 0; k < K; k++) acc += (long long)q[k] * ork_pack_value(w->kind, w->store, K, n, k);
            float t = (float)acc * as;
            float v = t * w->bscale[n];
            float s = 0.0f;
            for (size_t j = 0; j < n_outl; j++) {
                float p = x[m * K + OUTL[j]] * (float)ork_pack_value(w->kind, w->store, K, n, (size_t)OUTL[j]);
                s += p;
            }
            if (n_outl) {
                float u = s * w->bscale[n];
                v += u;
            }
            y[m * N + n] = v;
        }
    }
}

/* an external int8 matmul (the NPU hook's contract): the CPU kernels on a compacted copy */
static ork_status ext_mm(void *ctx, const int8_t *xq, size_t Mr, size_t ldq, int32_t *acc, ork_err *err) {
    const weight *w = (const weight *)ctx;
    int8_t *c = malloc(Mr * K);
    for (size_t m = 0; m < Mr; m++) memcpy(c + m * K, xq + m * ldq, K);
    ork_status s = ork_matmul_int(w->kind, w->store, ork_quant_lut(w->kind), N, K, c, Mr, acc, 1, err);
    free(c);
    return s;
}

#define NMODES 7
static float ref_out[2][NMODES][M * N]; /* scalar ISA outputs: kind x mode */

static void modes(ork_isa isa, int first) {
    static float x[M * K];
    static weight ws[2];
    if (first) {
        make_weight(&ws[0], ORK_KIND_INT8);
        make_weight(&ws[1], ORK_KIND_NF4);
        for (size_t i = 0; i < M * K; i++) x[i] = rnd_f();
        for (size_t m = 0; m < M; m++) x[m * K + OUTL[1]] = 40.0f * (float)(m + 1); /* an outlier channel */
        x[0 * K + 11] = 300.0f;                                                     /* a massive first token */
        x[2 * K + 7] = -9.0f;                                                       /* saturates below */
        for (size_t k = 0; k < K; k++) x[5 * K + k] = 0.0f;                         /* a zero row */
    }
    const float clip = 2.5f; /* well below the outliers: static saturates */
    const struct { int pt; float clip; size_t no, prefix; const char *name; } md[NMODES] = {
        {0, 0.0f, 0, 0, "per_token"}, {1, 0.0f, 0, 0, "per_tensor"}, {0, clip, 0, 0, "static"},
        {0, 0.0f, 3, 0, "per_token_outliers"}, {0, clip, 3, 0, "static_outliers"},
        {1, 0.0f, 0, 2, "per_tensor_prefix"}, {0, clip, 0, 1, "static_prefix"}};
    float y[M * N], yn[M * N], ye[M * N];
    for (int kw = 0; kw < 2; kw++)
        for (int i = 0; i < NMODES; i++) {
            ork_linear l = linear_of(&ws[kw], md[i].pt, md[i].clip, md[i].no, md[i].prefix);
            ork_err err;
            for (int nt = 1; nt <= 3; nt += 2) {
                CHECK(ork_linear_apply(&l, x, M, y, nt, &err) == ORK_OK, "%s %s kind %d: %s", ork_isa_name(isa),
                      md[i].name, kw, err.msg);
                naive(&ws[kw], x, md[i].pt, md[i].clip, md[i].no, md[i].prefix, yn);
                CHECK(memcmp(y, yn, sizeof y) == 0, "%s %s kind %d threads %d: differs from the naive contract",
                      ork_isa_name(isa), md[i].name, kw, nt);
                if (first) memcpy(ref_out[kw][i], y, sizeof y);
                CHECK(memcmp(y, ref_out[kw][i], sizeof y) == 0, "%s %s kind %d: differs from scalar", ork_isa_name(isa),
                      md[i].name, kw);
            }
            l.int_mm = ext_mm;
            l.int_mm_ctx = &ws[kw];
            CHECK(ork_linear_apply(&l, x, M, ye, 1, &err) == ORK_OK, "external %s", md[i].name);
            CHECK(memcmp(y, ye, sizeof y) == 0, "%s %s kind %d: the external matmul path differs from the CPU path",
                  ork_isa_name(isa), md[i].name, kw);
        }
    /* per_tensor == static when the range is the batch's absmax */
    float amax = 0.0f, y2[M * N];
    for (size_t i = 0; i < M * K; i++) amax = fmaxf(amax, fabsf(x[i]));
    ork_linear a = linear_of(&ws[1], 1, 0.0f, 0, 0), b = linear_of(&ws[1], 0, amax, 0, 0);
    ork_err err;
    CHECK(ork_linear_apply(&a, x, M, y, 1, &err) == ORK_OK && ork_linear_apply(&b, x, M, y2, 1, &err) == ORK_OK,
          "per_tensor/static");
    CHECK(memcmp(y, y2, sizeof y) == 0, "%s: static with the batch absmax != per_tensor", ork_isa_name(isa));
    /* static: every value beyond the range saturates at +-127 */
    int8_t xq[M * 128];
    float as[M];
    ork_act_spec ss = static_spec(clip);
    CHECK(ork_quantize_acts(x, M, K, 128, &ss, xq, as, &err) == ORK_OK, "quantize static");
    int sat = 1, pad = 1;
    for (size_t m = 0; m < M; m++) {
        sat &= as[m] == clip / 127.0f;
        for (size_t k = 0; k < K; k++) {
            float v = x[m * K + k];
            if (v > clip) sat &= xq[m * 128 + k] == 127;
            if (v < -clip) sat &= xq[m * 128 + k] == -127;
        }
        for (size_t k = K; k < 128; k++) pad &= xq[m * 128 + k] == 0;
    }
    CHECK(sat && pad, "%s: static saturation / padding", ork_isa_name(isa));
    /* huge values (x * 127/clip overflows float32) saturate too */
    float big[64];
    for (int i = 0; i < 64; i++) big[i] = (i & 1 ? -1.0f : 1.0f) * (i < 32 ? 3e38f : 1e30f);
    int8_t bq[64];
    float bs;
    ss = static_spec(1e-20f);
    CHECK(ork_quantize_acts(big, 1, 64, 64, &ss, bq, &bs, &err) == ORK_OK, "quantize huge");
    int hs = 1;
    for (int i = 0; i < 64; i++) hs &= bq[i] == (i & 1 ? -127 : 127);
    CHECK(hs, "%s: overflowing products saturate", ork_isa_name(isa));
}

static void errors(void) {
    weight w;
    make_weight(&w, ORK_KIND_INT8);
    float x[M * K], y[M * N];
    for (size_t i = 0; i < M * K; i++) x[i] = rnd_f();
    ork_err err;
    const float bad[] = {-1.0f, NAN, INFINITY, 1e-31f, -0.5f};
    for (int i = 0; i < 5; i++) {
        ork_linear l = linear_of(&w, 0, bad[i], 0, 0);
        err.msg[0] = '\0';
        CHECK(ork_linear_apply(&l, x, M, y, 1, &err) == ORK_EINVAL && strstr(err.msg, "static activation range"),
              "bad range %g: %s", (double)bad[i], err.msg);
        CHECK(ork_act_clip_check(bad[i], &err) == ORK_EINVAL, "clip check %g", (double)bad[i]);
    }
    int32_t o1[2] = {5, 5}, o2[2] = {7, 3}, o3[1] = {K}, o4[1] = {-1};
    const int32_t *outs[4] = {o1, o2, o3, o4};
    const size_t nos[4] = {2, 2, 1, 1};
    for (int i = 0; i < 4; i++) {
        ork_linear l = linear_of(&w, 0, 0.0f, 0, 0);
        l.act.outliers = outs[i];
        l.act.n_outliers = nos[i];
        err.msg[0] = '\0';
        CHECK(ork_linear_apply(&l, x, M, y, 1, &err) == ORK_EINVAL && strstr(err.msg, "outlier channel"),
              "bad outliers %d: %s", i, err.msg);
    }
    ork_linear f;
    memset(&f, 0, sizeof f);
    f.path = ORK_LIN_F32;
    f.N = N;
    f.K = K;
    float *wf = calloc(N * K, sizeof(float));
    f.w = wf;
    f.act.clip = 1.0f;
    CHECK(ork_linear_apply(&f, x, M, y, 1, &err) == ORK_EINVAL, "a range on a float linear");
    /* a non-finite value in an outlier channel (taken out of the int8 input) is still an error */
    ork_linear l = linear_of(&w, 0, 0.0f, 3, 0);
    x[2 * K + OUTL[2]] = NAN;
    CHECK(ork_linear_apply(&l, x, M, y, 1, &err) == ORK_ENONFINITE && strstr(err.msg, "[2, 99]"), "NaN outlier: %s",
          err.msg);
    l = linear_of(&w, 0, 1.0f, 0, 0);
    CHECK(ork_linear_apply(&l, x, M, y, 1, &err) == ORK_ENONFINITE, "NaN static: %s", err.msg);
    free(wf);
    free(w.store);
}

/* the spec's one validator: a registered mode serving the bits, its clip, its channels */
static void spec_check(void) {
    ork_err err;
    ork_act_spec s = ORK_ACT_SPEC_INIT;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_OK, "the default spec: %s", err.msg);
    s.bits = 4; /* the int4 activations of a w4a4 linear */
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_OK, "bits 4");
    s.search = 1;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_OK, "bits 4 with the per-row range search");
    s.bits = 8;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL && strstr(err.msg, "takes no range search"), "search at 8: %s",
          err.msg);
    s.search = 2;
    s.bits = 4;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL && strstr(err.msg, "must be 0 or 1"), "search 2: %s", err.msg);
    s.search = 0;
    s.bits = 5;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL && strstr(err.msg, "bits must be 4 or 8, got 5"), "bits 5: %s",
          err.msg);
    s.bits = 0;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL, "bits 0 (a zeroed spec is not a valid one)");
    s = static_spec(0.0f);
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL && strstr(err.msg, "static activation range 0"),
          "static without a range: %s", err.msg);
    s.mode = ORK_ACT_MODE_PER_TENSOR;
    s.clip = 2.0f;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL && strstr(err.msg, "'per_tensor' takes no static range"),
          "a range on a dynamic mode: %s", err.msg);
    s = static_spec(1.0f);
    s.mode = (int)ork_act_mode_count();
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL && strstr(err.msg, "unknown activation mode"), "unknown mode");
    s.mode = -1;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL, "mode -1");
    s = static_spec(1.0f);
    s.n_outliers = 2;
    CHECK(ork_act_spec_check(&s, K, &err) == ORK_EINVAL && strstr(err.msg, "missing"), "NULL channels");
    const ork_act_mode_info *r = ork_act_mode_find("per_token_outliers");
    CHECK(r && r->id == ORK_ACT_MODE_PER_TOKEN_OUTLIERS && (r->flags & ORK_ACTF_OUTLIERS) && ork_act_bits_ok(r, 8) &&
              ork_act_bits_ok(r, 4) && !ork_act_bits_ok(r, 5) && ork_act_mode_get(ORK_ACT_MODE_STATIC)->flags == ORK_ACTF_STATIC,
          "the built-in rows");
}

/* actspec.h "group": each (row, group) segment quantized as a row of g inputs (zero-padded past K),
 * the prefix rows' segments first; ascale (G, M). Checked against the per-row quantizer on the segments
 * laid out by hand, at 4 bits with the search and a prefix row, and at 8 bits with digits; then the
 * spec checks (a multiple of 32; per-row modes only). Run on the active ISA. */
enum { GM = 3, GK = 100, GLD = 128, GG = 32, GN = 4 }; /* G = 4: the last group 4 inputs + padding */
static int8_t g_scalar_q[2][GM * GLD]; /* the scalar ISA's codes and scales (its run comes first) */
static float g_scalar_as[2][GN * GM];

static void groups(int first) {
    float x[GM * GK], seg[GM * GN * GG];
    int8_t q[GM * GLD], qr[GM * GN * GG];
    float as[GN * GM], ar[GM * GN];
    ork_err err;
    uint64_t gs = 0x9E3779B97F4A7C15ULL; /* the same values on every ISA's run */
    for (int i = 0; i < GM * GK; i++)
        x[i] = ((float)(check_rnd(&gs) % 20001) / 10000.0f - 1.0f) * (i % 37 == 5 ? 40.0f : 1.0f);
    memset(seg, 0, sizeof seg);
    for (int m = 0; m < GM; m++)
        for (int k = 0; k < GK; k++) seg[(m * GN + k / GG) * GG + k % GG] = x[m * GK + k];
    for (int variant = 0; variant < 2; variant++) {
        ork_act_spec s = ORK_ACT_SPEC_INIT, r;
        if (variant == 0) s.bits = 4, s.search = 1, s.prefix = 1;
        else s.digits = 1;
        r = s;
        r.prefix = s.prefix * GN;
        s.group = GG;
        CHECK(ork_act_groups(&s, GLD) == GN, "groups of %d over %d", GG, GLD);
        memset(q, 0x55, sizeof q);
        CHECK(ork_quantize_acts(x, GM, GK, GLD, &s, q, as, &err) == ORK_OK, "grouped: %s", err.msg);
        CHECK(ork_quantize_acts(seg, GM * GN, GG, GG, &r, qr, ar, &err) == ORK_OK, "segments: %s", err.msg);
        int ok = 1;
        for (int m = 0; m < GM; m++)
            for (int i = 0; i < GN; i++) {
                if (memcmp(&as[i * GM + m], &ar[m * GN + i], 4)) ok = 0;
                for (int k = 0; k < GG; k++)
                    if (q[m * GLD + i * GG + k] != qr[(m * GN + i) * GG + k]) ok = 0;
            }
        CHECK(ok, "grouped activations are the per-row quantizer on the segments (variant %d)", variant);
        if (first) {
            memcpy(g_scalar_q[variant], q, sizeof q);
            memcpy(g_scalar_as[variant], as, sizeof as);
        } else {
            CHECK(!memcmp(g_scalar_q[variant], q, sizeof q) && !memcmp(g_scalar_as[variant], as, sizeof as),
                  "searched (wide) / digit activations equal the scalar ISA's (variant %d)", variant);
        }
    }
    ork_act_spec s = ORK_ACT_SPEC_INIT;
    s.group = 48;
    CHECK(ork_act_spec_check(&s, GK, &err) == ORK_EINVAL, "group 48 refused");
    s.group = 32;
    s.mode = ORK_ACT_MODE_PER_TENSOR;
    CHECK(ork_act_spec_check(&s, GK, &err) == ORK_EINVAL && strstr(err.msg, "per-row modes only"), "per tensor: %s",
          err.msg);
    x[2 * GK + 70] = NAN;
    s.mode = ORK_ACT_MODE_PER_TOKEN;
    CHECK(ork_quantize_acts(x, GM, GK, GLD, &s, q, as, &err) == ORK_ENONFINITE && strstr(err.msg, "[2, 70]"),
          "a NaN named at its place: %s", err.msg);
}

/* a mode whose kernel is its own (a quarter of each row's absmax): registered, it runs through the linear */
static ork_status range_quarter(const ork_act_spec *spec, const float *x, size_t Mr, size_t Kr, float *r, ork_err *err) {
    (void)spec, (void)x, (void)Kr, (void)err;
    for (size_t m = 0; m < Mr; m++) r[m] *= 0.25f;
    return ORK_OK;
}

static void registry(void) {
    ork_err err;
    int id = -1;
    CHECK(ork_act_mode_register("Bad-name", 0, range_quarter, &id, &err) == ORK_EINVAL, "bad name");
    CHECK(ork_act_mode_register("per_token", 0, range_quarter, &id, &err) == ORK_EINVAL &&
          strstr(err.msg, "already registered"), "a taken name");
    CHECK(ork_act_mode_register("q4", ORK_ACTF_STATIC | ORK_ACTF_PER_TENSOR, range_quarter, &id, &err) == ORK_EINVAL,
          "static and per tensor");
    CHECK(ork_act_mode_register("q4", 0, NULL, &id, &err) == ORK_EINVAL, "no kernel");
    CHECK(ork_act_mode_register("quarter", 0, range_quarter, &id, &err) == ORK_OK && id == 4 &&
          ork_act_mode_find("quarter") == ork_act_mode_get(4), "register quarter: %s", err.msg);
    weight w;
    make_weight(&w, ORK_KIND_NF4);
    float x[M * K], y[M * N], y1[N];
    for (size_t i = 0; i < M * K; i++) x[i] = rnd_f();
    ork_linear l = linear_of(&w, 0, 0.0f, 0, 1);
    l.act.mode = id;
    CHECK(ork_linear_apply(&l, x, M, y, 2, &err) == ORK_OK, "quarter: %s", err.msg);
    int same = 1;
    for (size_t m = 0; m < M; m++) { /* row m (m >= prefix 1) is the static mode with a quarter of its absmax */
        float a = 0.0f;
        for (size_t k = 0; k < K; k++) a = fmaxf(a, fabsf(x[m * K + k]));
        ork_linear s = linear_of(&w, 0, m ? 0.25f * a : 0.0f, 0, 0);
        CHECK(ork_linear_apply(&s, x + m * K, 1, y1, 1, &err) == ORK_OK, "static row %zu", m);
        same &= memcmp(y1, y + m * N, sizeof y1) == 0;
    }
    CHECK(same, "the registered mode's rows are the static mode's with its ranges");
    ork_act_mode_seal();
    CHECK(ork_act_mode_register("late", 0, range_quarter, &id, &err) == ORK_EINVAL && strstr(err.msg, "sealed"),
          "sealed");
    free(w.store);
}

static void stats(void) {
    /* bins: edge(bin(v)) <= |v| < edge(bin(v) + 1), and the ends */
    int ok = 1;
    for (int i = 0; i < 20000; i++) {
        float v = ldexpf(1.0f + (float)(rnd() % 1000000) / 1e6f, (int)(rnd() % 60) - 30) * (rnd() & 1 ? -1.0f : 1.0f);
        int b = ork_act_stats_bin(v);
        ok &= b >= 0 && b < ORK_ASTATS_BINS && ork_act_stats_edge(b) <= fabs((double)v) &&
              (b == ORK_ASTATS_BINS - 1 || fabs((double)v) < ork_act_stats_edge(b + 1));
    }
    CHECK(ok, "histogram bins hold their values");
    CHECK(ork_act_stats_bin(0.0f) == 0 && ork_act_stats_bin(ldexpf(1.0f, ORK_ASTATS_EMIN)) == 1 &&
              ork_act_stats_bin(ldexpf(1.0f, ORK_ASTATS_EMAX)) == ORK_ASTATS_BINS - 1 &&
              ork_act_stats_bin(-3e38f) == ORK_ASTATS_BINS - 1,
          "histogram ends");
    CHECK(ork_act_stats_edge(1) == ldexp(1.0, ORK_ASTATS_EMIN) && ork_act_stats_edge(ORK_ASTATS_BINS - 1) ==
          ldexp(1.0, ORK_ASTATS_EMAX) && ork_act_stats_edge(1 + ORK_ASTATS_SUB) == ldexp(1.0, ORK_ASTATS_EMIN + 1),
          "histogram edges");
    /* collected on a static linear with outliers: counts, sums, maxima, clipped values */
    weight w;
    make_weight(&w, ORK_KIND_INT8);
    float x[M * K], y[M * N], chmax[K];
    for (size_t i = 0; i < M * K; i++) x[i] = 3.0f * rnd_f();
    memset(chmax, 0, sizeof chmax);
    ork_act_stats *s = calloc(1, sizeof *s);
    s->ch_absmax = chmax;
    ork_linear l = linear_of(&w, 0, 1.5f, 3, 0);
    l.act_stats = s;
    ork_err err;
    CHECK(ork_linear_apply(&l, x, M, y, 1, &err) == ORK_OK, "stats run");
    CHECK(ork_linear_apply(&l, x, 3, y, 1, &err) == ORK_OK, "stats run 2");
    uint64_t n = 0, clipped = 0;
    double sum = 0, sum2 = 0, s1 = 0, s2 = 0;
    float amax = 0;
    int chok = 1;
    for (size_t m = 0; m < M + 3; m++)
        for (size_t k = 0; k < K; k++) {
            float a = fabsf(x[(m % M) * K + k]);
            sum += a;
            sum2 += (double)a * a;
            amax = fmaxf(amax, a);
            int o = k == 3 || k == 40 || k == 99;
            clipped += !o && a > 1.5f;
        }
    for (size_t k = 0; k < K; k++) {
        float c = 0;
        for (size_t m = 0; m < M; m++) c = fmaxf(c, fabsf(x[m * K + k]));
        chok &= chmax[k] == c;
    }
    for (int b = 0; b < ORK_ASTATS_BINS; b++) {
        n += s->count[b];
        s1 += s->sum[b];
        s2 += s->sum2[b];
    }
    CHECK(n == (M + 3) * K && s->rows == M + 3, "stats count %llu rows %llu", (unsigned long long)n,
          (unsigned long long)s->rows);
    CHECK(fabs(s1 - sum) < 1e-9 * sum && fabs(s2 - sum2) < 1e-9 * sum2 && s->absmax == amax && chok, "stats sums/maxima");
    CHECK(s->n_clipped == clipped && clipped > 0, "stats clipped %llu vs %llu", (unsigned long long)s->n_clipped,
          (unsigned long long)clipped);
    /* skipped rows are not counted; prefix rows are not clipped */
    memset(s, 0, sizeof *s);
    memset(chmax, 0, sizeof chmax);
    s->ch_absmax = chmax;
    s->skip_rows = 2;
    l = linear_of(&w, 0, 1.5f, 0, 3);
    l.act_stats = s;
    CHECK(ork_linear_apply(&l, x, M, y, 1, &err) == ORK_OK, "stats run 3");
    uint64_t c2 = 0;
    n = 0;
    for (size_t m = 3; m < M; m++)
        for (size_t k = 0; k < K; k++) c2 += fabsf(x[m * K + k]) > 1.5f;
    for (int b = 0; b < ORK_ASTATS_BINS; b++) n += s->count[b];
    CHECK(s->rows == M - 2 && n == (M - 2) * K && s->n_clipped == c2, "stats skip/prefix rows %llu clipped %llu vs %llu",
          (unsigned long long)s->rows, (unsigned long long)s->n_clipped, (unsigned long long)c2);
    chok = 1;
    float amax2 = 0;
    for (size_t k = 0; k < K; k++) {
        float c = 0;
        for (size_t m = 0; m < M; m++) c = fmaxf(c, fabsf(x[m * K + k]));
        chok &= chmax[k] == c;                     /* the channel maxima see the skipped rows too */
    }
    for (size_t m = 2; m < M; m++)
        for (size_t k = 0; k < K; k++) amax2 = fmaxf(amax2, fabsf(x[m * K + k]));
    CHECK(chok && s->absmax == amax2, "stats skip: channel maxima over every row, absmax over the counted ones");
    free(s);
    free(w.store);
}

int main(void) {
    int tested = 0;
    ork_err e0;
    CHECK(ork_cpu_set_isa("scalar", &e0) == ORK_OK, "scalar ISA");
    modes(ORK_ISA_SCALAR, 1);
    groups(1);
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        ork_err err;
        if (i == ORK_ISA_SCALAR || !ork_isa_available((ork_isa)i)) continue;
        ork_cpu_set_isa(ork_isa_name((ork_isa)i), &err);
        printf("comparing %s against scalar\n", ork_isa_name((ork_isa)i));
        modes((ork_isa)i, 0);
        groups(0);
        tested++;
    }
    CHECK(tested > 0, "no SIMD ISA to compare");
    errors();
    spec_check();
    registry();
    stats();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
