/* test_quant.c - C-level proof that every SIMD quant kernel available in this
 * build (AVX2 on x86-64, NEON on aarch64 under qemu) is bit-identical to the
 * scalar _ref oracle, kernel by kernel and through the full ork_quantize /
 * ork_dequantize drivers (1 and 3 threads). Prints one line per failure and
 * a closing "N passed, N failed" line; exit status 1 on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/cpu.h"
#include "check.h"
#include "../../csrc/ork/ggml_types.h"
#include "../../csrc/ork/half.h"
#include "../../csrc/ork/quant.h"
#include "../../csrc/ork/quant_scalar.h"


static uint64_t rng_state = 0x1234567887654321ULL;
static uint32_t rnd32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_unit(void) { return (float)(rnd32() >> 8) * (1.0f / 16777216.0f); }
static float rnd_normal(void) {
    float u = rnd_unit() + 1e-7f, v = rnd_unit();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* a row mixing Gaussian values, heavy tails, exact levels, exact midpoints
 * and round-half cases, in units where inv = 1 maps straight onto the grid */
static void fill_row(float *x, size_t n, int mode) {
    static const float specials[] = {0.0f,   -0.0f,  0.5f,  -0.5f,   1.5f,   -1.5f,  0.49999997f,
                                     -0.49999997f, 126.5f, -126.5f, 127.0f, -127.0f, 200.0f,
                                     -300.0f, 5.0f,  -6.0f,  109.5f, -107.5f, 63.5f,  -63.5f,
                                     118.0f, -118.0f, 9.0f, -9.0f, 92.0f, 10.0f, -12.0f};
    const size_t ns = sizeof specials / sizeof specials[0];
    for (size_t k = 0; k < n; k++) {
        float v = rnd_normal() * 40.0f;
        if (mode == 1 && (rnd32() & 7) == 0) v *= 8.0f;
        if ((rnd32() & 3) == 0) v = specials[rnd32() % ns];
        if ((rnd32() & 7) == 0) v = (float)((int)(rnd32() % 255) - 127) + ((rnd32() & 1) ? 0.5f : 0.0f);
        x[k] = v;
    }
}

/* the batch error kernels: every batch size, ratios around inv (the clip search's 1.0 .. 0.6 and
 * beyond), each result equal to the _ref's single-candidate value */
static void check_batch4(const ork_quant_kernels *ref, const ork_quant_kernels *kv, const float *x, const float *im,
                         size_t n, float inv, const ork_q4_grid *g) {
    for (int nc = 1; nc <= ORK_WERR_BATCH; nc++) {
        float iv[ORK_WERR_BATCH], sv[ORK_WERR_BATCH];
        double e[ORK_WERR_BATCH];
        for (int c = 0; c < nc; c++) {
            iv[c] = inv / (1.0f - 0.11f * (float)c);
            sv[c] = 1.0f / iv[c];
        }
        kv->werr4n(x, im, n, iv, sv, nc, g, e);
        for (int c = 0; c < nc; c++) {
            double e1 = ref->werr4(x, im, n, iv[c], sv[c], g);
            CHECK(memcmp(&e1, &e[c], sizeof e1) == 0, "%s werr4n nc=%d c=%d n=%zu cells=%d %.17g vs %.17g", kv->isa,
                  nc, c, n, g->cells, e1, e[c]);
        }
    }
}

static void check_batch8(const ork_quant_kernels *ref, const ork_quant_kernels *kv, const float *x, const float *im,
                         size_t n, float inv, float lim) {
    for (int nc = 1; nc <= ORK_WERR_BATCH; nc++) {
        float iv[ORK_WERR_BATCH], sv[ORK_WERR_BATCH];
        double e[ORK_WERR_BATCH];
        for (int c = 0; c < nc; c++) {
            iv[c] = inv / (1.0f - 0.13f * (float)c);
            sv[c] = 1.0f / iv[c];
        }
        kv->werr8n(x, im, n, iv, sv, nc, lim, e);
        for (int c = 0; c < nc; c++) {
            double e1 = ref->werr8(x, im, n, iv[c], sv[c], lim);
            CHECK(memcmp(&e1, &e[c], sizeof e1) == 0, "%s werr8n nc=%d c=%d n=%zu lim=%g", kv->isa, nc, c, n,
                  (double)lim);
        }
    }
}

/* The grid's cell lookup (quant.h) against counting the thresholds, with the kernels' float steps,
 * at every threshold and cell edge and their float neighbours, and at random points: for the
 * built-in grids and for a custom one whose thresholds sit on cell edges. A grid with three
 * thresholds near one cell must report cells = 0. */
static void check_cells_of(const ork_q4_grid *g, const char *what) {
    CHECK(g->cells == 1, "%s: no cell lookup", what);
    float pts[4096];
    size_t np = 0;
    for (int i = 0; i + 1 < g->nlev; i++) pts[np++] = g->thr[i];
    for (int c = 0; c <= 32; c++) pts[np++] = -128.0f + 8.0f * (float)c;
    size_t base = np;
    for (size_t i = 0; i < base; i++)
        for (int d = 1; d <= 4; d++) {
            pts[np++] = nextafterf(pts[i], INFINITY);
            pts[np++] = nextafterf(pts[i], -INFINITY);
            float u = pts[i];
            for (int t = 0; t < d; t++) u = nextafterf(u, t & 1 ? INFINITY : -INFINITY);
            pts[np++] = u + (float)d * 1e-6f;
        }
    while (np < 4000) pts[np++] = (rnd_unit() * 2.0f - 1.0f) * 300.0f;
    for (size_t i = 0; i < np; i++) {
        float y = pts[i] > 128.0f ? 128.0f : (pts[i] < -128.0f ? -128.0f : pts[i]);
        float u = (y - -128.0f) * 0.125f;
        int cell = (int)u;
        if (cell > 31) cell = 31;
        int code = g->cell_base[cell] + (y > g->cell_t1[cell]) + (y > g->cell_t2[cell]);
        CHECK(code == ork_q4_nearest(pts[i], g), "%s: cell lookup at %.9g gives %d, thresholds %d", what,
              (double)pts[i], code, ork_q4_nearest(pts[i], g));
    }
}

static void check_cells(void) {
    for (int kind = 0; kind < 2; kind++) check_cells_of(&ork_kind_get((ork_kind)kind)->grid, "built-in grid");
    ork_q4_grid g;
    memset(&g, 0, sizeof g);
    g.nlev = 16;
    static const float lev[16] = {-127, -120, -104, -88, -72, -56, -40, -24, -8, 0, 8, 24, 40, 56, 72, 127};
    for (int c = 0; c < 16; c++) g.lev[c] = lev[c];
    for (int c = 0; c < 15; c++) g.thr[c] = (g.lev[c] + g.lev[c + 1]) / 2.0f; /* -4, 4, 16, ... on cell edges */
    ork_q4_grid_cells(&g);
    check_cells_of(&g, "edge grid");
    static const float dense[16] = {-127, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 127};
    for (int c = 0; c < 16; c++) g.lev[c] = dense[c];
    for (int c = 0; c < 15; c++) g.thr[c] = (g.lev[c] + g.lev[c + 1]) / 2.0f;
    ork_q4_grid_cells(&g);
    CHECK(g.cells == 0, "dense grid: cell lookup claimed exact");
}

/* two hand-made grids: thresholds on the lookup's cell edges (cells != 0) and a dense grid the
 * lookup refuses (cells == 0: the kernels count thresholds) */
static void odd_grids(ork_q4_grid out[2]) {
    static const float edge[16] = {-127, -120, -104, -88, -72, -56, -40, -24, -8, 0, 8, 24, 40, 56, 72, 127};
    static const float dense[16] = {-127, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 127};
    for (int i = 0; i < 2; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].nlev = 16;
        for (int c = 0; c < 16; c++) out[i].lev[c] = i ? dense[c] : edge[c];
        for (int c = 0; c < 15; c++) out[i].thr[c] = (out[i].lev[c] + out[i].lev[c + 1]) / 2.0f;
        ork_q4_grid_cells(&out[i]);
    }
}

/* screen_est against the _ref: random prefix pairs (a zero pair before each array), every count of
 * candidates up to 41 (odd ones leave a lane alone), inv = 0 (estimates 0), tiny inv (k huge: every
 * boundary clamps to B) and inv large (boundaries near the middle), the kinds' grids and the odd ones */
static void check_screen_est(const ork_quant_kernels *ref, const ork_quant_kernels *kv, const ork_q4_grid odd[2]) {
    enum { B = ORK_SCREEN_BINS, NB = B / ORK_SCREEN_BLOCK, NC = 41 };
    static double Hs[2 + 2 * B], Os[2 + 2 * NB];
    double *H = Hs + 2, *O = Os + 2;
    Hs[0] = Hs[1] = Os[0] = Os[1] = 0.0;
    for (size_t i = 0; i < 2 * (size_t)B; i++) H[i] = (double)rnd_normal();
    for (size_t i = 0; i < 2 * (size_t)NB; i++) O[i] = (double)rnd_normal() * 10.0;
    { /* screen_bins: values over [-a, a] (both ends included), every length up to 40 and a long one */
        float x[1000];
        int32_t b1[1000], b2[1000];
        const float a = 0.37f;
        for (int k = 0; k < 1000; k++) x[k] = a * (2.0f * rnd_unit() - 1.0f);
        x[0] = a, x[1] = -a, x[2] = 0.0f, x[3] = -0.0f, x[9] = a, x[10] = -a;
        const double ra = 1.0 / (double)a, h = (double)(B / 2);
        for (size_t n = 1; n <= 1000; n += (n < 40 ? 1 : 480)) {
            ref->screen_bins(x, n, ra, h, B, b1);
            kv->screen_bins(x, n, ra, h, B, b2);
            CHECK(memcmp(b1, b2, n * sizeof(int32_t)) == 0, "%s screen_bins n=%zu", kv->isa, n);
        }
        CHECK(b1[0] == B - 1 && b1[1] == 0, "screen_bins ends: %d %d", (int)b1[0], (int)b1[1]);
    }
    float s[NC], inv[NC];
    double e1[NC], e2[NC];
    for (int trial = 0; trial < 6; trial++) {
        for (int c = 0; c < NC; c++) {
            inv[c] = (float)(127.0 / (0.6 + 0.4 * rnd_unit()));
            if (trial == 1 && c % 5 == 0) inv[c] = 0.0f;
            if (trial == 2 && c % 3 == 0) inv[c] = 1e-30f;
            if (trial == 3) inv[c] = 1e6f * (1.0f + rnd_unit());
            s[c] = inv[c] > 0.0f ? 1.0f / inv[c] : 0.0f;
        }
        const double ra = 1.0 + 3.0 * rnd_unit();
        for (int gi = 0; gi < 4; gi++) {
            const ork_q4_grid *g = gi < 2 ? &ork_kind_get((ork_kind)gi)->grid : &odd[gi - 2];
            for (size_t nc = 1; nc <= NC; nc += (nc < 5 ? 1 : 12)) {
                ref->screen_est(g, H, O, s, inv, nc, ra, B, e1);
                kv->screen_est(g, H, O, s, inv, nc, ra, B, e2);
                CHECK(memcmp(e1, e2, nc * sizeof(double)) == 0, "%s screen_est trial=%d grid=%d nc=%zu", kv->isa,
                      trial, gi, nc);
                for (size_t c = 0; c < nc; c++)
                    CHECK(inv[c] != 0.0f || e1[c] == 0.0, "screen_est of inv = 0 is 0");
            }
        }
    }
}

static void compare_kernels(const ork_quant_kernels *ref, const ork_quant_kernels *kv) {
    ork_q4_grid odd[2];
    odd_grids(odd);
    const size_t sizes[] = {1, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 100, 257, 1000, 4096};
    const float invs[] = {1.0f, 0.37f, 2.5f, 1.0f / 3.0f};
    float *x = malloc(4096 * sizeof(float)), *im = malloc(4096 * sizeof(float));
    float *o1 = malloc(4096 * sizeof(float)), *o2 = malloc(4096 * sizeof(float));
    uint8_t *c1 = malloc(4096), *c2 = malloc(4096);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        for (int mode = 0; mode < 2; mode++) {
            fill_row(x, n, mode);
            for (size_t k = 0; k < n; k++) im[k] = rnd_unit() * ((rnd32() & 15) ? 1.0f : 100.0f);
            float a1, a2;
            int b1 = ref->absmax(x, n, &a1), b2 = kv->absmax(x, n, &a2);
            CHECK(b1 == b2 && a1 == a2, "%s absmax n=%zu", kv->isa, n);
            for (size_t ii = 0; ii < sizeof invs / sizeof invs[0]; ii++) {
                float inv = invs[ii], s = 1.0f / inv;
                for (int kind = 0; kind < 2; kind++) {
                    const ork_q4_grid *g = &ork_kind_get((ork_kind)kind)->grid;
                    ref->codes4_rtn(x, n, inv, g, c1);
                    kv->codes4_rtn(x, n, inv, g, c2);
                    CHECK(memcmp(c1, c2, n) == 0, "%s codes4_rtn kind=%d n=%zu inv=%g", kv->isa, kind, n,
                          (double)inv);
                    uint32_t key = rnd32(), col0 = rnd32() & 0xffff;
                    ref->codes4_sr(x, n, inv, g, key, col0, c1);
                    kv->codes4_sr(x, n, inv, g, key, col0, c2);
                    CHECK(memcmp(c1, c2, n) == 0, "%s codes4_sr kind=%d n=%zu", kv->isa, kind, n);
                    double e1 = ref->werr4(x, im, n, inv, s, g), e2 = kv->werr4(x, im, n, inv, s, g);
                    CHECK(memcmp(&e1, &e2, sizeof e1) == 0, "%s werr4 kind=%d n=%zu %.17g vs %.17g",
                          kv->isa, kind, n, e1, e2);
                    check_batch4(ref, kv, x, im, n, inv, g);
                    /* dequant of random packed bytes */
                    for (size_t k = 0; k < (n + 1) / 2; k++) c1[k] = (uint8_t)rnd32();
                    ref->dequant4(c1, n, ork_quant_lut((ork_kind)kind), s, o1);
                    kv->dequant4(c1, n, ork_quant_lut((ork_kind)kind), s, o2);
                    CHECK(memcmp(o1, o2, n * sizeof(float)) == 0, "%s dequant4 n=%zu", kv->isa, n);
                }
                for (int gi = 0; gi < 2; gi++) { /* codes and batch errors on the hand-made grids */
                    ref->codes4_rtn(x, n, inv, &odd[gi], c1);
                    kv->codes4_rtn(x, n, inv, &odd[gi], c2);
                    CHECK(memcmp(c1, c2, n) == 0, "%s codes4_rtn odd grid %d (cells=%d) n=%zu inv=%g", kv->isa, gi,
                          odd[gi].cells, n, (double)inv);
                    check_batch4(ref, kv, x, im, n, inv, &odd[gi]);
                }
                static const float lims[] = {127.0f, 31.0f, 15.0f}; /* int8, int6, int5 */
                for (size_t li = 0; li < 3; li++) {
                    const float lim = lims[li];
                    ref->codes8_rtn(x, n, inv, lim, (int8_t *)c1);
                    kv->codes8_rtn(x, n, inv, lim, (int8_t *)c2);
                    CHECK(memcmp(c1, c2, n) == 0, "%s codes8_rtn lim=%g n=%zu inv=%g", kv->isa, (double)lim, n,
                          (double)inv);
                    for (size_t k = 0; k < n; k++)
                        CHECK((float)((int8_t *)c1)[k] <= lim && (float)((int8_t *)c1)[k] >= -lim, "codes8 range");
                    uint32_t key = rnd32(), col0 = rnd32() & 0xffff;
                    ref->codes8_sr(x, n, inv, lim, key, col0, (int8_t *)c1);
                    kv->codes8_sr(x, n, inv, lim, key, col0, (int8_t *)c2);
                    CHECK(memcmp(c1, c2, n) == 0, "%s codes8_sr lim=%g n=%zu", kv->isa, (double)lim, n);
                    double e1 = ref->werr8(x, im, n, inv, s, lim), e2 = kv->werr8(x, im, n, inv, s, lim);
                    CHECK(memcmp(&e1, &e2, sizeof e1) == 0, "%s werr8 lim=%g n=%zu", kv->isa, (double)lim, n);
                    check_batch8(ref, kv, x, im, n, inv, lim);
                }
                ref->dequant8((const int8_t *)c1, n, s, o1);
                kv->dequant8((const int8_t *)c1, n, s, o2);
                CHECK(memcmp(o1, o2, n * sizeof(float)) == 0, "%s dequant8 n=%zu", kv->isa, n);
            }
        }
    }
    check_screen_est(ref, kv, odd);
    /* non-finite detection, anywhere in the row (vector body and tail) */
    for (size_t pos = 0; pos < 37; pos += 5) {
        for (size_t k = 0; k < 37; k++) x[k] = rnd_normal();
        x[pos] = (pos & 1) ? INFINITY : NAN;
        float a;
        CHECK(kv->absmax(x, 37, &a) == 1, "%s absmax misses non-finite at %zu", kv->isa, pos);
    }
    free(x); free(im); free(o1); free(o2); free(c1); free(c2);
}

/* full driver: the selected ISA against scalar, 1 vs 3 threads, every kind,
 * with and without imatrix and SR, per row and with group-wise (float16) scales */
static void compare_drivers(ork_isa isa) {
    const size_t N = 37, K = 301;
    float *w = malloc(N * K * sizeof(float)), *im = malloc(K * sizeof(float));
    uint8_t *c_ref = malloc(N * K), *c_v = malloc(N * K);
    float s_ref[37 * 5], s_v[37 * 5];
    float *d_ref = malloc(N * K * sizeof(float)), *d_v = malloc(N * K * sizeof(float));
    for (size_t i = 0; i < N * K; i++) w[i] = rnd_normal() * 0.02f;
    for (size_t k = 0; k < K; k++) im[k] = rnd_unit() + ((k % 50) == 0 ? 50.0f : 0.0f);
    memset(w + 5 * K, 0, K * sizeof(float)); /* an all-zero row */
    for (int kind = 0; kind < (int)ork_kind_count(); kind++) { /* nf4, int4, int8, int5, int6 */
        for (int variant = 0; variant < 8; variant++) {
            ork_quant_params p;
            memset(&p, 0, sizeof p);
            p.kind = (ork_kind)kind;
            p.imatrix = (variant & 1) ? im : NULL;
            p.sr = (variant & 2) != 0;
            p.seed = 42;
            p.group = (variant & 4) ? 64 : 0;
            const size_t G = ork_group_count(K, p.group);
            ork_err err;
            ork_cpu_set_isa("scalar", &err);
            p.nthreads = 1;
            ork_status st1 = ork_quantize(w, N, K, &p, c_ref, s_ref, &err);
            ork_dequantize(p.kind, c_ref, s_ref, N, K, p.group, d_ref, 1, &err);
            ork_cpu_set_isa(ork_isa_name(isa), &err);
            p.nthreads = 3;
            ork_status st2 = ork_quantize(w, N, K, &p, c_v, s_v, &err);
            ork_dequantize(p.kind, c_v, s_v, N, K, p.group, d_v, 3, &err);
            size_t nb = N * ork_quant_row_bytes(p.kind, K);
            CHECK(st1 == ORK_OK && st2 == ORK_OK, "quantize status %d %d", st1, st2);
            CHECK(memcmp(c_ref, c_v, nb) == 0 && memcmp(s_ref, s_v, N * G * sizeof(float)) == 0,
                  "%s driver kind=%d variant=%d codes/scales differ", ork_isa_name(isa), kind, variant);
            CHECK(memcmp(d_ref, d_v, N * K * sizeof(float)) == 0, "%s dequantize kind=%d",
                  ork_isa_name(isa), kind);
            CHECK(s_ref[5 * G] == 0.0f, "zero row scale");
            size_t not_f16 = 0; /* group scales are float16 values; per-row ones (float32) need not be */
            for (size_t i = 0; i < N * G; i++) not_f16 += ork_f16_to_f32(ork_f16_from_f32(s_ref[i])) != s_ref[i];
            CHECK(G == 1 ? not_f16 > 0 : not_f16 == 0, "kind=%d variant=%d: %zu scales not float16", kind, variant,
                  not_f16);
        }
    }
    w[3 * K + 7] = NAN;
    ork_quant_params p;
    memset(&p, 0, sizeof p);
    ork_err err;
    err.msg[0] = 0;
    ork_status st = ork_quantize(w, N, K, &p, c_v, s_v, &err);
    CHECK(st == ORK_ENONFINITE && strstr(err.msg, "[3, 7]") != NULL, "NaN report: %d '%s'", st, err.msg);
    free(w); free(im); free(c_ref); free(c_v); free(d_ref); free(d_v);
}

/* ork_quantize_typed: a float16 / bfloat16 weight gives byte for byte what ork_quantize gives for its float32
 * values (every kind, with and without an imatrix, groups, 1 and 3 threads); another type is ORK_EINVAL; a
 * non-finite value is reported at its position. */
static void check_typed(void) {
    const size_t N = 300, K = 544; /* 121 rows per work item (quant.c): 3 items, so 3 threads share them */
    uint16_t *h = malloc(N * K * 2), *b = malloc(N * K * 2);
    float *wh = malloc(N * K * sizeof(float)), *wb = malloc(N * K * sizeof(float)), *im = malloc(K * sizeof(float));
    uint8_t *c1 = malloc(N * K), *c2 = malloc(N * K);
    float *s1 = malloc(N * 17 * sizeof(float)), *s2 = malloc(N * 17 * sizeof(float));
    for (size_t i = 0; i < N * K; i++) {
        const float v = rnd_normal() * (i % 97 == 0 ? 3.0f : 0.05f);
        h[i] = ork_f16_from_f32(v);
        wh[i] = ork_f16_to_f32(h[i]);
        uint32_t u;
        memcpy(&u, &v, 4);
        b[i] = (uint16_t)(u >> 16); /* a bfloat16: the top half of a float32 */
        u = (uint32_t)b[i] << 16;
        memcpy(&wb[i], &u, 4);
    }
    h[3] = 0x0001; /* the smallest float16 subnormal */
    wh[3] = ork_f16_to_f32(h[3]);
    for (size_t k = 0; k < K; k++) im[k] = rnd_unit() + 0.01f;
    for (int kind = 0; kind < (int)ork_kind_count(); kind++)
        for (int variant = 0; variant < 8; variant++) {
            ork_quant_params p;
            memset(&p, 0, sizeof p);
            p.kind = (ork_kind)kind;
            p.imatrix = (variant & 1) ? im : NULL;
            p.group = (variant & 2) ? 64 : 0;
            p.nthreads = (variant & 4) ? 3 : 1;
            const size_t nb = N * ork_quant_row_bytes(p.kind, K), ns = N * ork_group_count(K, p.group);
            for (int bf = 0; bf < 2; bf++) {
                ork_err err;
                err.msg[0] = 0;
                ork_status st1 = ork_quantize(bf ? wb : wh, N, K, &p, c1, s1, &err);
                ork_status st2 = ork_quantize_typed(bf ? (const void *)b : (const void *)h, bf ? ORK_GGML_BF16 : ORK_GGML_F16,
                                                    N, K, &p, c2, s2, &err);
                CHECK(st1 == ORK_OK && st2 == ORK_OK, "typed status %d %d '%s'", st1, st2, err.msg);
                CHECK(memcmp(c1, c2, nb) == 0 && memcmp(s1, s2, ns * sizeof(float)) == 0,
                      "typed %s kind=%d variant=%d differs from float32", bf ? "BF16" : "F16", kind, variant);
            }
        }
    ork_quant_params p;
    memset(&p, 0, sizeof p);
    ork_err err;
    err.msg[0] = 0;
    CHECK(ork_quantize_typed(h, ORK_GGML_Q8_0, N, K, &p, c2, s2, &err) == ORK_EINVAL && strstr(err.msg, "F16"),
          "typed: a Q8_0 weight must be refused: '%s'", err.msg);
    h[250 * K + 9] = 0x7e00; /* a float16 NaN, in the last work item */
    err.msg[0] = 0;
    p.nthreads = 2;
    ork_status st = ork_quantize_typed(h, ORK_GGML_F16, N, K, &p, c2, s2, &err);
    CHECK(st == ORK_ENONFINITE && strstr(err.msg, "[250, 9]") != NULL, "typed NaN report: %d '%s'", st, err.msg);
    free(h); free(b); free(wh); free(wb); free(im); free(c1); free(c2); free(s1); free(s2);
}

int main(void) {
    int tested = 0;
    check_typed();
    check_cells();
#if defined(__x86_64__) || defined(__i386__)
    /* both x86 tables, whichever of them quant_ref.c picks */
    if (ork_isa_available(ORK_ISA_AVX2)) {
        printf("comparing avx2 (plain) against scalar\n");
        compare_kernels(&ork_quant_kernels_ref, &ork_quant_kernels_avx2);
        if (ork_cpu_features() & ORK_CPU_AVX512) {
            printf("comparing avx512 against scalar\n");
            compare_kernels(&ork_quant_kernels_ref, &ork_quant_kernels_avx512);
        } else {
            printf("avx512 table not run: this CPU lacks avx512f/vl/bw/dq\n");
        }
    }
#endif
    for (int i = 1; i < ORK_ISA_COUNT; i++) {
        if (!ork_isa_available((ork_isa)i)) continue;
        const ork_quant_kernels *kv = ork_quant_kernels_for((ork_isa)i);
        printf("comparing %s against scalar\n", kv->isa);
        compare_kernels(&ork_quant_kernels_ref, kv);
        compare_drivers((ork_isa)i);
        tested++;
    }
    CHECK(tested > 0, "no SIMD ISA available to compare");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
