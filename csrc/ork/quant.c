/* quant.c - the kind registry, argument checking, the per-row scale search
 * and the threaded drivers. The arithmetic lives in the per-ISA kernel tables; this
 * file only decides which kernel runs on which row with which scale. */
#include "quant.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dequant.h"
#include "ggml_types.h"
#include "half.h"
#include "pool.h"
#include "quant_scalar.h"
#include "scratch.h"

/* ------------------------------------------------------ kind registry -- */
/* One row per kind: name, bits, levels. The LUT, the zero code and the
 * quantization grid are derived by ork_kind_derive when the table is first
 * used; tests re-derive the LUTs independently (orkpy/kernels/reference.py). */
static ork_kind_info g_kinds[ORK_KIND_MAX] = {
    /* bitsandbytes NF4 code values (csrc/kernels.cu nf4_dequantization_lut), exactly as float32 */
    {ORK_KIND_NF4, "nf4", 4, 16,
     {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
      0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
      0.7229568362236023f, 1.0f}},
    /* uniform symmetric k/7, k = -7..7 */
    {ORK_KIND_INT4, "int4", 4, 15,
     {-1.0f, -6.0f / 7, -5.0f / 7, -4.0f / 7, -3.0f / 7, -2.0f / 7, -1.0f / 7, 0.0f, 1.0f / 7, 2.0f / 7,
      3.0f / 7, 4.0f / 7, 5.0f / 7, 6.0f / 7, 1.0f}},
    /* per-channel symmetric int8, codes in [-127, 127] */
    {ORK_KIND_INT8, "int8", 8, 0, {0}, 127, 8},
    /* uniform symmetric 5-bit and 6-bit codes, int8 in memory: [-15, 15], [-31, 31] */
    {ORK_KIND_INT5, "int5", 8, 0, {0}, 15, 5},
    {ORK_KIND_INT6, "int6", 8, 0, {0}, 31, 6},
    /* uniform symmetric 4-bit integer codes [-7, 7], multiplied with 4-bit activations (the NPU's int4 mode) */
    {ORK_KIND_W4A4, "w4a4", 8, 0, {0}, 7, 4, 4},
    /* the same codes with int8 activations, run on the int4 mode as two int4 digits per activation */
    {ORK_KIND_W4A8, "w4a8", 8, 0, {0}, 7, 4, 8},
};
static atomic_size_t g_nkinds = 7; /* rows published (a row is complete before the count covers it) */
static atomic_int g_sealed = 0;
static pthread_once_t g_kinds_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_kinds_mu = PTHREAD_MUTEX_INITIALIZER; /* serialises ork_kind_register */

ork_status ork_kind_derive(ork_kind_info *row, ork_err *err) {
    memset(row->lut, 0, sizeof row->lut);
    memset(&row->grid, 0, sizeof row->grid);
    row->zero_code = 0;
    if (row->act_bits == 0) row->act_bits = 8;
    if (row->act_bits != 8 && row->act_bits != 4)
        return ork_err_set(err, ORK_EINVAL, "kind '%s': act_bits must be 4 or 8, got %d", row->name, row->act_bits);
    if (row->bits == 8) {
        if (row->nlev != 0) return ork_err_set(err, ORK_EINVAL, "kind '%s': an 8-bit kind has no levels", row->name);
        if (row->store_bits < 2 || row->store_bits > 8 || row->qmax != (1 << (row->store_bits - 1)) - 1)
            return ork_err_set(err, ORK_EINVAL, "kind '%s': qmax %d does not match %d stored bits (2^(bits-1) - 1)",
                               row->name, row->qmax, row->store_bits);
        return ORK_OK;
    }
    row->qmax = 127; /* 4-bit kinds: the LUT's int8 range */
    row->store_bits = 4;
    if (row->bits != 4) return ork_err_set(err, ORK_EINVAL, "kind '%s': bits must be 4 or 8, got %d", row->name, row->bits);
    if (row->nlev < 2 || row->nlev > 16)
        return ork_err_set(err, ORK_EINVAL, "kind '%s': a 4-bit kind needs 2..16 levels, got %d", row->name, row->nlev);
    int zero = -1;
    for (int c = 0; c < row->nlev; c++) {
        float v = row->levels[c];
        if (!(v >= -1.0f && v <= 1.0f))
            return ork_err_set(err, ORK_EINVAL, "kind '%s': level %d = %g is not a number in [-1, 1]", row->name, c, (double)v);
        double r = (double)v * 127.0, t = trunc(r), f = r - t;
        row->lut[c] = (int8_t)(f >= 0.5 ? t + 1 : (f <= -0.5 ? t - 1 : t)); /* round half away from zero */
        if (c > 0 && !(row->lut[c] > row->lut[c - 1]))
            return ork_err_set(err, ORK_EINVAL, "kind '%s': levels %d and %d are not ascending on the int8 grid "
                               "(LUT %d, %d)", row->name, c - 1, c, row->lut[c - 1], row->lut[c]);
        if (v == 0.0f) zero = c;
    }
    if (zero < 0)
        return ork_err_set(err, ORK_EINVAL, "kind '%s' has no 0.0 level (zero rows and padding need an exact zero)",
                           row->name);
    row->zero_code = (uint8_t)zero;
    row->grid.nlev = row->nlev;
    for (int c = 0; c < row->nlev; c++) row->grid.lev[c] = (float)row->lut[c];
    for (int c = 0; c + 1 < row->nlev; c++) row->grid.thr[c] = (row->grid.lev[c] + row->grid.lev[c + 1]) / 2.0f;
    ork_q4_grid_cells(&row->grid);
    return ORK_OK;
}

/* The cell lookup (quant.h). A y mapped to cell c satisfies lo - 2^-16 <= y <= lo + 8 + 2^-16 for
 * lo = -128 + 8c (fl(y + 128) is within half an ulp of 256 of y + 128, and the cell of fl(y + 128)
 * brackets it); the margin below is twice that. Thresholds lie in (-127, 127), so clamping y to
 * [-128, 128] changes no comparison. */
void ork_q4_grid_cells(ork_q4_grid *g) {
    const float margin = 1.0f / 32768.0f;
    g->cells = 0;
    if (g->nlev < 2 || g->nlev > 16) return;
    for (int i = 0; i + 1 < g->nlev; i++)
        if (!(g->thr[i] > -127.5f && g->thr[i] < 127.5f)) return;
    for (int c = 0; c < 32; c++) {
        const float lo = -128.0f + 8.0f * (float)c - margin, hi = -120.0f + 8.0f * (float)c + margin;
        int base = 0, nin = 0;
        float t[2] = {FLT_MAX, FLT_MAX};
        for (int i = 0; i + 1 < g->nlev; i++) {
            if (g->thr[i] < lo) base++;
            else if (g->thr[i] <= hi) {
                if (nin == 2) return; /* three thresholds near one cell: no exact two-compare lookup */
                t[nin++] = g->thr[i];
            }
        }
        g->cell_base[c] = base;
        g->cell_t1[c] = t[0];
        g->cell_t2[c] = t[1];
    }
    g->cells = 1;
}

/* The NF4 and INT4 rows name no qmax / store_bits: ork_kind_derive sets them. */
static void kinds_init(void) {
    for (size_t i = 0; i < atomic_load(&g_nkinds); i++) {
        ork_err e;
        if (ork_kind_derive(&g_kinds[i], &e) != ORK_OK) g_kinds[i].bits = 0; /* a broken built-in row is unusable */
    }
}

size_t ork_kind_count(void) {
    pthread_once(&g_kinds_once, kinds_init);
    return atomic_load(&g_nkinds);
}

const ork_kind_info *ork_kind_get(ork_kind kind) {
    size_t n = ork_kind_count();
    if ((int)kind < 0 || (size_t)kind >= n || !g_kinds[kind].bits) return NULL;
    return &g_kinds[kind];
}

const ork_kind_info *ork_kind_find(const char *name) {
    size_t n = ork_kind_count();
    for (size_t i = 0; name && i < n; i++)
        if (g_kinds[i].bits && strcmp(g_kinds[i].name, name) == 0) return &g_kinds[i];
    return NULL;
}

ork_status ork_kind_check(ork_kind kind, ork_err *err) {
    return ork_kind_get(kind) ? ORK_OK : ork_err_set(err, ORK_EINVAL, "unknown quantization kind %d", (int)kind);
}

void ork_kind_seal(void) { atomic_store(&g_sealed, 1); }

ork_status ork_kind_register(const char *name, const float *levels, int nlev, ork_kind *id, ork_err *err) {
    if (!name || !levels || !id) return ork_err_set(err, ORK_EINVAL, "kind_register: NULL argument");
    size_t len = strlen(name);
    if (len == 0 || len >= ORK_KIND_NAME_MAX || strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
        return ork_err_set(err, ORK_EINVAL, "kind name '%.32s' must be 1..%d characters of [a-z0-9_]", name,
                           ORK_KIND_NAME_MAX - 1);
    if (nlev < 2 || nlev > 16) return ork_err_set(err, ORK_EINVAL, "kind '%s': a 4-bit kind needs 2..16 levels, got %d", name, nlev);
    ork_kind_count(); /* the built-in rows are derived first */
    pthread_mutex_lock(&g_kinds_mu);
    ork_status st = ORK_OK;
    size_t n = atomic_load(&g_nkinds);
    if (atomic_load(&g_sealed))
        st = ork_err_set(err, ORK_EINVAL, "the kind registry is sealed: kinds were already exported");
    else if (ork_kind_find(name))
        st = ork_err_set(err, ORK_EINVAL, "kind '%s' is already registered", name);
    else if (n >= ORK_KIND_MAX)
        st = ork_err_set(err, ORK_EINVAL, "the kind registry is full (%d rows)", ORK_KIND_MAX);
    if (st == ORK_OK) {
        ork_kind_info row;
        memset(&row, 0, sizeof row);
        row.id = (ork_kind)n;
        memcpy(row.name, name, len + 1);
        row.bits = 4;
        row.nlev = nlev;
        memcpy(row.levels, levels, (size_t)nlev * sizeof(float));
        st = ork_kind_derive(&row, err);
        if (st == ORK_OK) {
            g_kinds[n] = row;
            atomic_store(&g_nkinds, n + 1);
            *id = row.id;
        }
    }
    pthread_mutex_unlock(&g_kinds_mu);
    return st;
}

size_t ork_quant_row_bytes(ork_kind kind, size_t K) {
    const ork_kind_info *k = ork_kind_get(kind);
    return !k ? 0 : k->bits == 4 ? (K + 1) / 2 : K;
}

const int8_t *ork_quant_lut(ork_kind kind) {
    const ork_kind_info *k = ork_kind_get(kind);
    return k && k->bits == 4 ? k->lut : NULL;
}

size_t ork_quant_default_grid(float *out, size_t cap) {
    for (size_t i = 0; i < ORK_QUANT_DEFAULT_GRID_N && i < cap; i++)
        out[i] = (float)(100 - (int)i) / 100.0f;
    return ORK_QUANT_DEFAULT_GRID_N;
}

/* ------------------------------------------------------------ quantize -- */
typedef struct {
    const uint8_t *w;     /* row n at w + n * w_row: w_type values (ork_quantize_typed) */
    uint32_t w_type;      /* ORK_GGML_F32, _F16 or _BF16 */
    size_t w_row;         /* bytes per source row */
    size_t K;
    const ork_quant_params *p;
    const float *grid;
    size_t ngrid;
    const ork_quant_kernels *kern;
    const ork_q4_grid *g; /* 4-bit kinds: the kind's grid; NULL for int8 */
    uint8_t zero;         /* 4-bit kinds: the kind's zero code */
    uint8_t *codes;
    float *scales;        /* N x G, G = ceil(K / group) */
    size_t row_bytes;
    size_t group;         /* columns per scale: K for per-row scales */
    float lim;            /* the kind's qmax: 127 (int8, 4-bit kinds' LUT range), 31 (int6), 15 (int5) */
} quant_job;

static ork_status report_nonfinite_w(const float *x, size_t K, size_t row, ork_err *err) {
    for (size_t k = 0; k < K; k++)
        if (!isfinite(x[k]))
            return ork_err_set(err, ORK_ENONFINITE, "weight has a non-finite value (%s) at [%zu, %zu]",
                               isnan(x[k]) ? "NaN" : "Inf", row, k);
    return ork_err_set(err, ORK_ENONFINITE, "weight row %zu has a non-finite value", row);
}

/* Group-wise scales are float16 values: more than one segment per row (quant.h). */
static int f16_scales(const quant_job *j) { return j->p->group != 0 && j->p->group < j->K; }

/* The stored scale of m = a * r and the inverse the codes are chosen with (quant.h), Q = j->lim:
 * float32 m / Q and Q / m per row; f16(m / Q) and 1 / s (0 for s = 0) per group.
 * An overflowing float16 saturates here; ork_quantize refuses such segments first. */
static void seg_scale(const quant_job *j, float m, float *s, float *inv) {
    const float q = m / j->lim;
    if (!f16_scales(j)) {
        *s = q;
        *inv = j->lim / m;
        return;
    }
    uint16_t h = ork_f16_from_f32(q);
    if ((h & 0x7c00u) == 0x7c00u) h = 0x7bffu;
    *s = ork_f16_to_f32(h);
    *inv = *s > 0.0f ? 1.0f / *s : 0.0f;
}

/* The screened clip search of a 4-bit segment (quant.h): every grid ratio but 1.0 estimated from a
 * histogram of the segment (ORK_SCREEN_BINS bins of x / a over [-1, 1], each holding sum im and
 * sum im * x in double, in increasing k), the ORK_SCREEN_TOP best estimates (first in grid order on
 * ties) kept. Writes them to rb in grid order; returns how many (0 .. ORK_SCREEN_TOP). */
static int screen4(const quant_job *j, const float *x, const float *im, size_t n, float a, float *rb) {
    enum { W = ORK_SCREEN_BLOCK, B = ORK_SCREEN_BINS, BMAX = ORK_SCREEN_BINS };
    size_t idx[ORK_QUANT_MAX_GRID], ne = 0; /* the ratios to estimate: every one but 1.0 */
    for (size_t i = 0; i < j->ngrid; i++)
        if (j->grid[i] != 1.0f) idx[ne++] = i;
    if (ne == 0) return 0; /* a grid of 1.0 alone */
    const size_t NB = (size_t)B / W;
    /* (sum im, sum im * x) per bin, then per block, each after a zero pair (ork_screen_prefix) */
    double Hs[2 + 2 * BMAX], Os[2 + 2 * BMAX / W];
    double *const H = Hs + 2, *const O = Os + 2;
    const double ra = 1.0 / (double)a, h = (double)(B / 2);
    memset(Hs, 0, (2 + 2 * (size_t)B) * sizeof(double));
    Os[0] = Os[1] = 0.0;
    for (size_t k0 = 0; k0 < n; k0 += 256) { /* bins of 256 values at a time, then their sums */
        const size_t m = n - k0 < 256 ? n - k0 : 256;
        int32_t bi[256];
        j->kern->screen_bins(x + k0, m, ra, h, B, bi);
        for (size_t t = 0; t < m; t++) { /* (im, im * x): exact in double (24-bit by 24-bit) */
            double *hb = H + 2 * bi[t];
            const double w = (double)im[k0 + t];
            hb[0] += w;
            hb[1] += w * (double)x[k0 + t];
        }
    }
    for (size_t b0 = 0; b0 < (size_t)B; b0 += W) { /* running sums inside each block (independent chains) */
        ork_v2d acc = ork_v2_load(H + 2 * b0);
        for (size_t t = 1; t < W; t++) {
            acc = ork_v2_load(H + 2 * (b0 + t)) + acc;
            ork_v2_store(H + 2 * (b0 + t), acc);
        }
    }
    ork_v2d o = {0.0, 0.0};
    ork_v2_store(O, o);
    for (size_t q = 1; q < NB; q++) {
        o = o + ork_v2_load(H + 2 * (q * W - 1));
        ork_v2_store(O + 2 * q, o);
    }
    /* the estimates of every ratio but 1.0 (the ISA's kernel), then the best kept in grid order */
    double est[ORK_QUANT_MAX_GRID];
    float sc[ORK_QUANT_MAX_GRID], ic[ORK_QUANT_MAX_GRID];
    for (size_t t = 0; t < ne; t++) seg_scale(j, a * j->grid[idx[t]], &sc[t], &ic[t]);
    j->kern->screen_est(j->g, H, O, sc, ic, ne, ra, (size_t)B, est);
    double eb[ORK_SCREEN_TOP];
    size_t ib[ORK_SCREEN_TOP];
    int nb = 0;
    for (size_t t = 0; t < ne; t++) {
        const double e = est[t];
        const size_t i = idx[t];
        int at = nb; /* insertion point: after every kept estimate <= e */
        while (at > 0 && e < eb[at - 1]) at--;
        if (at >= ORK_SCREEN_TOP) continue;
        for (int u = (nb < ORK_SCREEN_TOP ? nb : ORK_SCREEN_TOP - 1); u > at; u--) {
            eb[u] = eb[u - 1];
            ib[u] = ib[u - 1];
        }
        eb[at] = e;
        ib[at] = i;
        if (nb < ORK_SCREEN_TOP) nb++;
    }
    for (int t = 1; t < nb; t++) /* grid order */
        for (int u = t; u > 0 && ib[u] < ib[u - 1]; u--) {
            size_t tmp = ib[u];
            ib[u] = ib[u - 1];
            ib[u - 1] = tmp;
        }
    for (int t = 0; t < nb; t++) rb[t] = j->grid[ib[t]];
    return nb;
}

/* The 8-bit kinds' full clip search, pruned by the tail's lower bound (quant.h "pruned full search").
 * Returns the ratio the unpruned search (seg_choose's loop) picks, bit for bit. */
static float search8_pruned(const quant_job *j, const float *x, const float *im, size_t n, float a) {
    enum { BT = ORK_WERR_BATCH, NMAX = 1 + ORK_QUANT_MAX_GRID };
    const double keep = 1.0 - 0x1p-20; /* E(r) >= LB(r) * keep */
    float xt[ORK_PRUNE_TAIL], wt[ORK_PRUNE_TAIL];
    size_t nt = 0;
    const float tau = ORK_PRUNE_TAU * a;
    for (size_t k = 0; k < n && nt < ORK_PRUNE_TAIL; k++)
        if (fabsf(x[k]) >= tau) {
            xt[nt] = x[k];
            wt[nt] = im[k];
            nt++;
        }
    /* the candidates in the full search's order: 1.0, then the grid without 1.0 */
    float r[NMAX], sc[NMAX], ic[NMAX];
    double lb[NMAX];
    size_t nc = 0;
    r[nc++] = 1.0f;
    for (size_t i = 0; i < j->ngrid; i++)
        if (j->grid[i] != 1.0f) r[nc++] = j->grid[i];
    for (size_t c = 0; c < nc; c++) seg_scale(j, a * r[c], &sc[c], &ic[c]);
    for (size_t c = 0; c < nc; c += BT) {
        const int m = nc - c < BT ? (int)(nc - c) : BT;
        if (nt) j->kern->werr8n(xt, wt, nt, ic + c, sc + c, m, j->lim, lb + c);
        else
            for (int t = 0; t < m; t++) lb[c + t] = 0.0;
    }
    /* first batch: 1.0 and the BT - 1 smallest bounds (earliest on ties) */
    size_t pick[BT];
    int np = 0;
    pick[np++] = 0;
    while (np < BT && (size_t)np < nc) {
        size_t m = 0;
        for (size_t c = 1; c < nc; c++) {
            int used = 0;
            for (int t = 1; t < np; t++) used |= pick[t] == c;
            if (!used && (m == 0 || lb[c] < lb[m])) m = c;
        }
        pick[np++] = m;
    }
    const int nfirst = np;
    size_t first[BT];
    memcpy(first, pick, sizeof first);
    double best = INFINITY;
    size_t bi = 0;
    size_t next = 1; /* the next candidate of the rest, in order */
    for (;;) {
        float sb[BT], ib[BT];
        double eb[BT];
        for (int t = 0; t < np; t++) {
            sb[t] = sc[pick[t]];
            ib[t] = ic[pick[t]];
        }
        j->kern->werr8n(x, im, n, ib, sb, np, j->lim, eb);
        for (int t = 0; t < np; t++) /* 1.0 (pick 0, first of all) is taken as it is, NaN too, as the full search does */
            if (pick[t] == 0 || eb[t] < best || (eb[t] == best && pick[t] < bi)) {
                best = eb[t];
                bi = pick[t];
            }
        np = 0;
        for (; next < nc && np < BT; next++) {
            int done = 0;
            for (int t = 1; t < nfirst; t++) done |= first[t] == next;
            if (done || lb[next] * keep > best) continue;
            pick[np++] = next;
        }
        if (np == 0) break;
    }
    return r[bi];
}

/* The scale of one segment and the inverse its codes are chosen with: a * r for the ratio r of
 * the imatrix clip search (first best in grid order, 1.0 first; no search without importance),
 * through seg_scale. s = 0 for a zero segment. Used by quant_segment and, for GPTQ's segments,
 * by ork_quant_segment_scale, so both pick the same scale from the same values.
 * The candidates go to the kernels ORK_WERR_BATCH at a time (each error is the single-candidate
 * value bit for bit); a grid ratio equal to 1.0 is skipped: its error equals the first one's,
 * which a strict "<" never replaces. */
static void seg_choose(const quant_job *j, const float *x, const float *im, size_t n, float a, float *s,
                       float *inv) {
    float r = 1.0f;
    *s = 0.0f;
    *inv = 0.0f;
    if (a < ORK_QUANT_TINY) return;
    if (im && j->g && n >= ORK_SCREEN_MIN_N && !j->p->full_search) {
        /* 1.0 and the screen's picks, each error exact (the kernels), the first best in grid order */
        float rb[1 + ORK_SCREEN_TOP], sb[1 + ORK_SCREEN_TOP], ib[1 + ORK_SCREEN_TOP];
        double eb[1 + ORK_SCREEN_TOP];
        rb[0] = 1.0f;
        const int nb = 1 + screen4(j, x, im, n, a, rb + 1);
        for (int c = 0; c < nb; c++) seg_scale(j, a * rb[c], &sb[c], &ib[c]);
        j->kern->werr4n(x, im, n, ib, sb, nb, j->g, eb);
        double best = eb[0];
        for (int c = 1; c < nb; c++)
            if (eb[c] < best) {
                best = eb[c];
                r = rb[c];
            }
    } else if (im && !j->g && n >= ORK_PRUNE_MIN_N) {
        r = search8_pruned(j, x, im, n, a);
    } else if (im) {
        double best = INFINITY; /* replaced by 1.0's error, the first candidate */
        size_t i = 0;           /* the next grid entry */
        int first = 1;
        for (;;) {
            float rb[ORK_WERR_BATCH], sb[ORK_WERR_BATCH], ib[ORK_WERR_BATCH];
            double eb[ORK_WERR_BATCH];
            int nb = 0;
            if (first) rb[nb++] = 1.0f;
            for (; nb < ORK_WERR_BATCH && i < j->ngrid; i++)
                if (j->grid[i] != 1.0f) rb[nb++] = j->grid[i];
            if (nb == 0) break;
            for (int c = 0; c < nb; c++) seg_scale(j, a * rb[c], &sb[c], &ib[c]);
            if (j->g) j->kern->werr4n(x, im, n, ib, sb, nb, j->g, eb);
            else j->kern->werr8n(x, im, n, ib, sb, nb, j->lim, eb);
            for (int c = 0; c < nb; c++)
                if ((first && c == 0) || eb[c] < best) {
                    best = eb[c];
                    r = rb[c];
                }
            first = 0;
        }
    }
    seg_scale(j, a * r, s, inv);
}

/* ORK_EINVAL unless the clip grid holds 1..ORK_QUANT_MAX_GRID ratios (the searches' arrays hold that many) */
static ork_status grid_len_check(size_t ngrid, ork_err *err) {
    if (ngrid == 0 || ngrid > ORK_QUANT_MAX_GRID)
        return ork_err_set(err, ORK_EINVAL, "clip grid must hold 1..%d ratios, got %zu", ORK_QUANT_MAX_GRID, ngrid);
    return ORK_OK;
}

/* ORK_EINVAL naming the segment when its float16 scale would overflow (group-wise scales only). */
static ork_status seg_f16_check(const quant_job *j, float a, size_t row, size_t c0, size_t len, ork_err *err) {
    if (!f16_scales(j) || (ork_f16_from_f32(a / j->lim) & 0x7c00u) != 0x7c00u) return ORK_OK;
    return ork_err_set(err, ORK_EINVAL, "weight row %zu, group %zu (columns %zu..%zu) has absmax %g: its scale %g "
                       "exceeds %g, the largest float16 (group-wise scales are float16: use one scale per row, or "
                       "rescale the weight)", row, c0 / j->group, c0, c0 + len - 1, (double)a, (double)(a / j->lim),
                       (double)ORK_F16_MAX);
}

/* Quantize one segment of row `row`: the n values x at columns col0.., importance im (or NULL),
 * codes written from out (4-bit: col0 even, nibble packing of the segment as of a row), the
 * scale to *scale. tmp: n bytes (4-bit). */
static void quant_segment(const quant_job *j, const float *x, const float *im, size_t n, size_t col0, size_t row,
                          float a, uint8_t *out, float *scale, uint8_t *tmp) {
    const size_t nb = j->g ? (n + 1) / 2 : n;
    float s, inv;
    seg_choose(j, x, im, n, a, &s, &inv);
    if (s == 0.0f) { /* zero segment (or a float16 scale that rounds to 0) */
        *scale = 0.0f;
        if (j->g) memset(out, j->zero | (j->zero << 4), nb);
        else memset(out, 0, nb);
        return;
    }
    *scale = s;
    uint32_t key = j->p->sr ? ork_sr_row_key(j->p->seed, row) : 0;
    if (j->g) {
        if (j->p->sr) j->kern->codes4_sr(x, n, inv, j->g, key, (uint32_t)col0, tmp);
        else j->kern->codes4_rtn(x, n, inv, j->g, tmp);
        size_t k = 0;
        for (; k + 1 < n; k += 2) out[k >> 1] = (uint8_t)(tmp[k] | (tmp[k + 1] << 4));
        if (k < n) out[k >> 1] = (uint8_t)(tmp[k] | (j->zero << 4));
    } else {
        if (j->p->sr) j->kern->codes8_sr(x, n, inv, j->lim, key, (uint32_t)col0, (int8_t *)out);
        else j->kern->codes8_rtn(x, n, inv, j->lim, (int8_t *)out);
    }
}

static ork_status quant_rows(void *ctx, size_t begin, size_t end, ork_err *err) {
    const quant_job *j = (const quant_job *)ctx;
    const size_t K = j->K, gs = j->group, G = (K + gs - 1) / gs;
    /* the segment's codes before packing (4-bit kinds) and a converted source row (float16 /
     * bfloat16 sources): on the worker's stack up to K = 8192 (scratch.h) */
    _Alignas(64) uint8_t tmp_s[8192];
    _Alignas(64) float row_s[8192];
    uint8_t *tmp = j->g ? (uint8_t *)ork_scratch(tmp_s, sizeof tmp_s, gs) : NULL;
    float *row = j->w_type != ORK_GGML_F32 ? (float *)ork_scratch(row_s, sizeof row_s, K * sizeof(float)) : NULL;
    ork_status st = ORK_OK;
    if ((j->g && !tmp) || (j->w_type != ORK_GGML_F32 && !row)) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory (%zu bytes of row workspace)",
                         (j->g && !tmp) ? gs : K * sizeof(float));
        goto done;
    }
    for (size_t n = begin; n < end; n++) {
        const float *x = (const float *)(j->w + n * j->w_row);
        if (row) {
            /* cannot fail: the type was checked */
            if ((st = ork_dequant_row(j->w_type, j->w + n * j->w_row, K, row, err))) goto done;
            x = row;
        }
        uint8_t *out = j->codes + n * j->row_bytes;
        float a;
        if (j->kern->absmax(x, K, &a)) {
            st = report_nonfinite_w(x, K, n, err);
            goto done;
        }
        for (size_t g = 0; g < G; g++) {
            const size_t c0 = g * gs, len = K - c0 < gs ? K - c0 : gs;
            if (G > 1) j->kern->absmax(x + c0, len, &a);
            if ((st = seg_f16_check(j, a, n, c0, len, err))) goto done;
            quant_segment(j, x + c0, j->p->imatrix ? j->p->imatrix + c0 : NULL, len, c0, n, a,
                          out + (j->g ? c0 / 2 : c0), j->scales + n * G + g, tmp);
        }
    }
done:
    ork_scratch_free(tmp, tmp_s);
    ork_scratch_free(row, row_s);
    return st;
}

static ork_status check_dims(size_t N, size_t K, ork_err *err) {
    if (N == 0 || K == 0)
        return ork_err_set(err, ORK_EINVAL, "weight must be non-empty, got shape (%zu, %zu)", N, K);
    if (K >= ORK_QUANT_MAX_DIM || N >= ORK_QUANT_MAX_DIM)
        return ork_err_set(err, ORK_EINVAL, "weight shape (%zu, %zu) exceeds 2^31 per dimension", N,
                           K);
    return ORK_OK;
}

ork_status ork_quantize(const float *w, size_t N, size_t K, const ork_quant_params *p,
                        void *codes, float *scales, ork_err *err) {
    return ork_quantize_typed(w, ORK_GGML_F32, N, K, p, codes, scales, err);
}

ork_status ork_quantize_typed(const void *w, uint32_t w_type, size_t N, size_t K, const ork_quant_params *p,
                              void *codes, float *scales, ork_err *err) {
    if (!p || !w || !codes || !scales) return ork_err_set(err, ORK_EINVAL, "quantize: NULL argument");
    if (w_type != ORK_GGML_F32 && w_type != ORK_GGML_F16 && w_type != ORK_GGML_BF16)
        return ork_err_set(err, ORK_EINVAL, "quantize: the weight's type must be F32, F16 or BF16 (ggml type %u)",
                           (unsigned)w_type);
    const ork_kind_info *info = ork_kind_get(p->kind);
    if (!info) return ork_kind_check(p->kind, err);
    ork_status st = check_dims(N, K, err);
    if (st == ORK_OK) st = ork_group_check(p->group, err);
    if (st != ORK_OK) return st;

    float defgrid[ORK_QUANT_DEFAULT_GRID_N];
    const float *grid = p->grid;
    size_t ngrid = p->ngrid;
    if (p->imatrix) {
        for (size_t k = 0; k < K; k++) {
            float v = p->imatrix[k];
            if (!isfinite(v))
                return ork_err_set(err, ORK_ENONFINITE, "imatrix has a non-finite value (%s) at [%zu]",
                                   isnan(v) ? "NaN" : "Inf", k);
            if (v < 0.0f)
                return ork_err_set(err, ORK_EINVAL, "imatrix has a negative value (%g) at [%zu]",
                                   (double)v, k);
        }
        if (!grid) {
            ngrid = ork_quant_default_grid(defgrid, ORK_QUANT_DEFAULT_GRID_N);
            grid = defgrid;
        }
        ork_status gst = grid_len_check(ngrid, err);
        if (gst) return gst;
        for (size_t i = 0; i < ngrid; i++)
            if (!(grid[i] >= 1e-3f && grid[i] <= 4.0f))
                return ork_err_set(err, ORK_EINVAL,
                                   "clip grid ratio [%zu] = %g is outside [0.001, 4]", i,
                                   (double)grid[i]);
    }

    quant_job j;
    j.w = (const uint8_t *)w;
    j.w_type = w_type;
    j.w_row = K * (w_type == ORK_GGML_F32 ? 4 : 2);
    j.K = K;
    j.p = p;
    j.grid = grid;
    j.ngrid = ngrid;
    j.kern = ork_quant_kernels_active();
    j.g = info->bits == 4 ? &info->grid : NULL;
    j.zero = info->zero_code;
    j.codes = (uint8_t *)codes;
    j.scales = scales;
    j.row_bytes = ork_quant_row_bytes(p->kind, K);
    j.group = p->group ? p->group : K;
    j.lim = (float)info->qmax;
    size_t chunk = 65536 / K + 1;
    return ork_parallel_for(p->nthreads, N, chunk, quant_rows, &j, err);
}

ork_status ork_group_check(size_t group, ork_err *err) {
    if (group == 0) return ORK_OK;
    if (group % 32 || group > ORK_GROUP_MAX)
        return ork_err_set(err, ORK_EINVAL, "group size %zu is not a multiple of 32 in [32, %d] (or 0: one scale per row)",
                           group, ORK_GROUP_MAX);
    return ORK_OK;
}

size_t ork_group_count(size_t K, size_t group) { return group && K ? (K + group - 1) / group : 1; }

/* ---------------------------------------------------------- dequantize -- */
typedef struct {
    ork_kind kind;
    const uint8_t *codes;
    const float *scales;
    size_t K, row_bytes, group;
    float *out;
    const ork_quant_kernels *kern;
} dequant_job;

static ork_status dequant_rows(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    const dequant_job *j = (const dequant_job *)ctx;
    const int8_t *lut = ork_quant_lut(j->kind);
    const size_t gs = j->group, G = (j->K + gs - 1) / gs;
    for (size_t n = begin; n < end; n++) {
        const uint8_t *c = j->codes + n * j->row_bytes;
        for (size_t g = 0; g < G; g++) {
            const size_t c0 = g * gs, len = j->K - c0 < gs ? j->K - c0 : gs;
            float *o = j->out + n * j->K + c0;
            if (lut) j->kern->dequant4(c + c0 / 2, len, lut, j->scales[n * G + g], o);
            else j->kern->dequant8((const int8_t *)c + c0, len, j->scales[n * G + g], o);
        }
    }
    return ORK_OK;
}

ork_status ork_dequantize(ork_kind kind, const void *codes, const float *scales, size_t N,
                          size_t K, size_t group, float *out, int nthreads, ork_err *err) {
    if (!codes || !scales || !out) return ork_err_set(err, ORK_EINVAL, "dequantize: NULL argument");
    ork_status st = ork_kind_check(kind, err);
    if (st == ORK_OK) st = check_dims(N, K, err);
    if (st == ORK_OK) st = ork_group_check(group, err);
    if (st != ORK_OK) return st;
    const size_t G = ork_group_count(K, group);
    for (size_t i = 0; i < N * G; i++)
        if (!(scales[i] >= 0.0f && scales[i] <= 3.40282347e+38f)) {
            if (G == 1)
                return ork_err_set(err, ORK_EINVAL, "scale[%zu] = %g is not a finite non-negative number", i,
                                   (double)scales[i]);
            return ork_err_set(err, ORK_EINVAL, "scale[%zu, %zu] = %g is not a finite non-negative number",
                               i / G, i % G, (double)scales[i]);
        }
    dequant_job j = {kind, (const uint8_t *)codes, scales, K, ork_quant_row_bytes(kind, K), group ? group : K,
                     out, ork_quant_kernels_active()};
    return ork_parallel_for(nthreads, N, 65536 / K + 1, dequant_rows, &j, err);
}

/* ------------------------------------------------ one segment's scale (GPTQ) -- */
ork_status ork_quant_segment_scale(const ork_quant_params *p, size_t K, size_t row, size_t col0, const float *x,
                                   size_t n, float *scale, float *inv, ork_err *err) {
    const ork_kind_info *info = p ? ork_kind_get(p->kind) : NULL;
    if (!info) return p ? ork_kind_check(p->kind, err) : ork_err_set(err, ORK_EINVAL, "segment_scale: NULL argument");
    float defgrid[ORK_QUANT_DEFAULT_GRID_N];
    quant_job j;
    memset(&j, 0, sizeof j);
    j.K = K;
    j.p = p;
    j.grid = p->grid;
    j.ngrid = p->imatrix ? p->ngrid : 0;
    if (p->imatrix && !j.grid) {
        j.ngrid = ork_quant_default_grid(defgrid, ORK_QUANT_DEFAULT_GRID_N);
        j.grid = defgrid;
    }
    if (p->imatrix) {
        ork_status gst = grid_len_check(j.ngrid, err);
        if (gst) return gst;
    }
    j.kern = ork_quant_kernels_active();
    j.g = info->bits == 4 ? &info->grid : NULL;
    j.zero = info->zero_code;
    j.group = p->group && p->group < K ? p->group : K;
    j.lim = (float)info->qmax;
    float a;
    if (j.kern->absmax(x, n, &a))
        for (size_t k = 0; k < n; k++)
            if (!isfinite(x[k]))
                return ork_err_set(err, ORK_ENONFINITE, "weight has a non-finite value (%s) at [%zu, %zu]",
                                   isnan(x[k]) ? "NaN" : "Inf", row, col0 + k);
    ork_status st = seg_f16_check(&j, a, row, col0, n, err);
    if (st != ORK_OK) return st;
    seg_choose(&j, x, p->imatrix ? p->imatrix + col0 : NULL, n, a, scale, inv);
    return ORK_OK;
}
