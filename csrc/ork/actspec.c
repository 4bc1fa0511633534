/* actspec.c - the activation modes' registry, the spec's validator and the
 * shared activation quantizer (actspec.h). */
#include "actspec.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "quant.h"

/* ------------------------------------------------------------ kernels -- */
static ork_status range_row(const ork_act_spec *spec, const float *x, size_t M, size_t K, float *r, ork_err *err) {
    (void)spec, (void)x, (void)M, (void)K, (void)r, (void)err;
    return ORK_OK; /* each row its own absmax */
}

static ork_status range_tensor(const ork_act_spec *spec, const float *x, size_t M, size_t K, float *r, ork_err *err) {
    (void)spec, (void)x, (void)K, (void)err;
    float t = 0.0f;
    for (size_t m = 0; m < M; m++)
        if (r[m] > t) t = r[m];
    for (size_t m = 0; m < M; m++) r[m] = t;
    return ORK_OK;
}

static ork_status range_static(const ork_act_spec *spec, const float *x, size_t M, size_t K, float *r, ork_err *err) {
    (void)x, (void)K, (void)err;
    for (size_t m = 0; m < M; m++) r[m] = spec->clip;
    return ORK_OK;
}

/* ----------------------------------------------------------- registry -- */
static ork_act_mode_info g_modes[ORK_ACT_MODE_MAX] = {
#define BITS_4_8 (ORK_ACT_BITS_MASK(4) | ORK_ACT_BITS_MASK(8))
    {ORK_ACT_MODE_PER_TOKEN, "per_token", 0, range_row, BITS_4_8},
    {ORK_ACT_MODE_PER_TENSOR, "per_tensor", ORK_ACTF_PER_TENSOR, range_tensor, BITS_4_8},
    {ORK_ACT_MODE_STATIC, "static", ORK_ACTF_STATIC, range_static, BITS_4_8},
    {ORK_ACT_MODE_PER_TOKEN_OUTLIERS, "per_token_outliers", ORK_ACTF_OUTLIERS, range_row, BITS_4_8},
};
static atomic_size_t g_nmodes = 0; /* rows published (a row is complete before the count covers it) */
static atomic_int g_sealed = 0;
static pthread_once_t g_modes_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_modes_mu = PTHREAD_MUTEX_INITIALIZER; /* serialises ork_act_mode_register */

/* the built-in rows: those written above (a row has a kernel and serves a width), checked to sit at their ids */
static void modes_init(void) {
    size_t n = 0;
    while (n < ORK_ACT_MODE_MAX && g_modes[n].range && g_modes[n].bits && g_modes[n].id == (int)n) n++;
    atomic_store(&g_nmodes, n);
}

size_t ork_act_mode_count(void) {
    pthread_once(&g_modes_once, modes_init);
    return atomic_load(&g_nmodes);
}

const ork_act_mode_info *ork_act_mode_get(int mode) {
    return mode >= 0 && (size_t)mode < ork_act_mode_count() ? &g_modes[mode] : NULL;
}

const ork_act_mode_info *ork_act_mode_find(const char *name) {
    size_t n = ork_act_mode_count();
    for (size_t i = 0; name && i < n; i++)
        if (strcmp(g_modes[i].name, name) == 0) return &g_modes[i];
    return NULL;
}

int ork_act_bits_ok(const ork_act_mode_info *row, int bits) {
    return row && bits >= 1 && bits <= 32 && (row->bits & ORK_ACT_BITS_MASK(bits));
}

/* the widths a row serves, "8" or "4 or 8", into buf */
static const char *bits_list(const ork_act_mode_info *row, char *buf, size_t size) {
    size_t len = 0;
    int last = 0;
    buf[0] = '\0';
    for (int b = 1; b <= 32; b++)
        if (ork_act_bits_ok(row, b)) last = b;
    for (int b = 1; b <= 32 && len < size; b++)
        if (ork_act_bits_ok(row, b)) {
            int w = snprintf(buf + len, size - len, "%s%d", !len ? "" : b == last ? " or " : ", ", b);
            len += w > 0 ? (size_t)w : 0;
        }
    return buf;
}

void ork_act_mode_seal(void) { atomic_store(&g_sealed, 1); }

ork_status ork_act_mode_register(const char *name, unsigned flags, ork_act_range_fn range, int *id, ork_err *err) {
    if (!name || !range || !id) return ork_err_set(err, ORK_EINVAL, "act_mode_register: NULL argument");
    size_t len = strlen(name);
    if (len == 0 || len >= ORK_ACT_MODE_NAME_MAX || strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
        return ork_err_set(err, ORK_EINVAL, "activation mode name '%.32s' must be 1..%d characters of [a-z0-9_]", name,
                           ORK_ACT_MODE_NAME_MAX - 1);
    if (flags & ~(ORK_ACTF_STATIC | ORK_ACTF_PER_TENSOR | ORK_ACTF_OUTLIERS))
        return ork_err_set(err, ORK_EINVAL, "activation mode '%s': unknown flags 0x%x", name, flags);
    if ((flags & ORK_ACTF_STATIC) && (flags & ORK_ACTF_PER_TENSOR))
        return ork_err_set(err, ORK_EINVAL, "activation mode '%s': a range is static or dynamic, not both", name);
    pthread_mutex_lock(&g_modes_mu);
    ork_status st = ORK_OK;
    size_t n = ork_act_mode_count();
    if (atomic_load(&g_sealed))
        st = ork_err_set(err, ORK_EINVAL, "the activation mode registry is sealed: modes were already exported");
    else if (ork_act_mode_find(name))
        st = ork_err_set(err, ORK_EINVAL, "activation mode '%s' is already registered", name);
    else if (n >= ORK_ACT_MODE_MAX)
        st = ork_err_set(err, ORK_EINVAL, "the activation mode registry is full (%d rows)", ORK_ACT_MODE_MAX);
    if (st == ORK_OK) {
        ork_act_mode_info *row = &g_modes[n];
        memset(row, 0, sizeof *row);
        row->id = (int)n;
        memcpy(row->name, name, len + 1);
        row->flags = flags;
        row->range = range;
        row->bits = ORK_ACT_BITS_MASK(ORK_ACT_BITS);
        atomic_store(&g_nmodes, n + 1);
        *id = row->id;
    }
    pthread_mutex_unlock(&g_modes_mu);
    return st;
}

/* ---------------------------------------------------------- validator -- */
ork_status ork_act_clip_check(float clip, ork_err *err) {
    if (!isfinite(clip) || !(clip >= ORK_QUANT_TINY))
        return ork_err_set(err, ORK_EINVAL, "static activation range %g is not a finite number >= %g", (double)clip,
                           (double)ORK_QUANT_TINY);
    return ORK_OK;
}

ork_status ork_act_spec_check(const ork_act_spec *s, size_t K, ork_err *err) {
    const ork_act_mode_info *row = ork_act_mode_get(s->mode);
    if (!row) return ork_err_set(err, ORK_EINVAL, "unknown activation mode %d", s->mode);
    if (!ork_act_bits_ok(row, s->bits)) {
        char widths[128];
        return ork_err_set(err, ORK_EINVAL, "activation mode '%s': bits must be %s, got %d", row->name,
                           bits_list(row, widths, sizeof widths), s->bits);
    }
    if (row->flags & ORK_ACTF_STATIC) {
        ork_status st = ork_act_clip_check(s->clip, err);
        if (st) return st;
    } else if (s->clip != 0.0f) {
        return ork_err_set(err, ORK_EINVAL, "activation mode '%s' takes no static range (got %g): only a static mode "
                           "does", row->name, (double)s->clip);
    }
    if (s->search != 0 && s->search != 1)
        return ork_err_set(err, ORK_EINVAL, "activation range search must be 0 or 1, got %d", s->search);
    if (s->search && (s->bits >= 8 || (row->flags & (ORK_ACTF_STATIC | ORK_ACTF_PER_TENSOR))))
        return ork_err_set(err, ORK_EINVAL, "activation mode '%s' at %d bits takes no range search (per-row modes "
                           "below 8 bits only)", row->name, s->bits);
    if (s->digits != 0 && (s->digits != 1 || s->bits != 8))
        return ork_err_set(err, ORK_EINVAL, "activation digits must be 0, or 1 with 8-bit activations (got %d at %d "
                           "bits)", s->digits, s->bits);
    if (s->group) {
        ork_status st = ork_group_check(s->group, err);
        if (st) return st;
        if (row->flags & (ORK_ACTF_STATIC | ORK_ACTF_PER_TENSOR))
            return ork_err_set(err, ORK_EINVAL, "activation mode '%s' shares one range across rows: it takes no "
                               "per-group scales (group %zu; per-row modes only)", row->name, s->group);
    }
    if (s->n_outliers && !s->outliers) return ork_err_set(err, ORK_EINVAL, "outlier channels missing");
    for (size_t j = 0; j < s->n_outliers; j++) {
        int32_t o = s->outliers[j];
        if (o < 0 || (size_t)o >= K)
            return ork_err_set(err, ORK_EINVAL, "outlier channel %ld (entry %zu) outside [0, %zu)", (long)o, j, K);
        if (j && o <= s->outliers[j - 1])
            return ork_err_set(err, ORK_EINVAL, "outlier channels must be strictly increasing (entry %zu: %ld after %ld)",
                               j, (long)o, (long)s->outliers[j - 1]);
    }
    return ORK_OK;
}

/* ---------------------------------------------------------- quantizer -- */
/* A searched row's codes (actspec.h "search"): clamp(round_half_away(x * inv), -qmax - 1, qmax), the
 * quantizer's codes8_rtn at a limit one wider, the top code then lowered to qmax (a scalar pass, so every
 * ISA gives the same codes). inv carries the row's sign (row_sign), so the extra code -qmax - 1 goes to
 * the side of the row's largest |x|. */
static void codes_wide(const ork_quant_kernels *qk, const float *x, size_t K, float inv, float qmax, int8_t *q) {
    qk->codes8_rtn(x, K, inv, qmax + 1.0f, q);
    const int8_t top = (int8_t)qmax;
    for (size_t k = 0; k < K; k++)
        if (q[k] > top) q[k] = top;
}

/* -1 when the row's first largest |x| is positive, else 1: its side goes onto the negative codes */
static float row_sign(const float *x, size_t K) {
    size_t e = 0;
    for (size_t k = 1; k < K; k++)
        if (fabsf(x[k]) > fabsf(x[e])) e = k;
    return K && x[e] > 0.0f ? -1.0f : 1.0f;
}

/* squared error of one searched row at range c: step s = sg * (c / qmax), codes_wide with inv =
 * sg * (qmax / c) (into q, K bytes), then sum_k (x - q * s)^2 in double, k in order */
static double row_err(const ork_quant_kernels *qk, const float *x, size_t K, float c, float qmax, float sg, int8_t *q) {
    const float s = sg * (c / qmax);
    codes_wide(qk, x, K, sg * (qmax / c), qmax, q);
    double e = 0.0;
    for (size_t k = 0; k < K; k++) {
        float d = x[k] - (float)q[k] * s;
        e += (double)d * (double)d;
    }
    return e;
}

/* the searched range of one row (actspec.h "search"); q: K bytes of scratch */
static float row_search(const ork_quant_kernels *qk, const float *x, size_t K, float a, float qmax, float sg, int8_t *q) {
    float best = a;
    double be = row_err(qk, x, K, a, qmax, sg, q);
    for (int i = 1; i < ORK_ACT_SEARCH_N; i++) {
        float c = a * (1.0f - (float)i / 40.0f);
        if (!(c >= ORK_QUANT_TINY)) break;
        double e = row_err(qk, x, K, c, qmax, sg, q);
        if (e < be) be = e, best = c;
    }
    return best;
}

size_t ork_act_groups(const ork_act_spec *spec, size_t ldq) {
    return spec->group ? (ldq + spec->group - 1) / spec->group : 1;
}

static ork_status quantize_rows(const float *x, size_t M, size_t K, size_t ldq, const ork_act_spec *spec, int8_t *xq,
                                float *ascale, ork_err *err);

/* actspec.h "group": each (row, group) segment becomes a row of g inputs (zero-padded past K) of the
 * per-row quantizer, the prefix rows' segments first (row-major order keeps them the leading rows) */
static ork_status quantize_groups(const float *x, size_t M, size_t K, size_t ldq, const ork_act_spec *spec,
                                  int8_t *xq, float *ascale, ork_err *err) {
    const size_t g = spec->group, G = ork_act_groups(spec, ldq), R = M * G;
    if (M == 0) return ORK_OK;
    float *seg = (float *)calloc(R * g, sizeof(float));
    int8_t *q = (int8_t *)malloc(R * g);
    float *sc = (float *)malloc(R * sizeof(float));
    ork_status st = ORK_OK;
    if (!seg || !q || !sc) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory for per-group activations (%zu rows x %zu groups)", M, G);
        goto done;
    }
    for (size_t m = 0; m < M; m++)
        for (size_t i = 0; i < G; i++) {
            const size_t k0 = i * g, n = k0 >= K ? 0 : (K - k0 < g ? K - k0 : g);
            for (size_t k = 0; k < n; k++) {
                const float v = x[m * K + k0 + k];
                if (!isfinite(v)) {
                    st = ork_err_set(err, ORK_ENONFINITE, "activation has a non-finite value (%s) at [%zu, %zu]",
                                     isnan(v) ? "NaN" : "Inf", m, k0 + k);
                    goto done;
                }
                seg[(m * G + i) * g + k] = v;
            }
        }
    ork_act_spec rs = *spec;
    rs.group = 0;
    rs.outliers = NULL; /* the caller's to zero (actspec.h): the segments are not the rows they index */
    rs.n_outliers = 0;
    rs.prefix = (spec->prefix < M ? spec->prefix : M) * G;
    if ((st = quantize_rows(seg, R, g, g, &rs, q, sc, err))) goto done;
    for (size_t m = 0; m < M; m++) {
        for (size_t i = 0; i < G; i++) {
            const size_t k0 = i * g, n = ldq - k0 < g ? ldq - k0 : g;
            memcpy(xq + m * ldq + k0, q + (m * G + i) * g, n); /* past K: the zero padding's codes, 0 */
            ascale[i * M + m] = sc[m * G + i];
        }
    }
done:
    free(seg);
    free(q);
    free(sc);
    return st;
}

ork_status ork_quantize_acts(const float *x, size_t M, size_t K, size_t ldq, const ork_act_spec *spec, int8_t *xq,
                             float *ascale, ork_err *err) {
    ork_status st = ork_act_spec_check(spec, K, err);
    if (st) return st;
    if (ldq < K) return ork_err_set(err, ORK_EINVAL, "activation row stride %zu is below K = %zu", ldq, K);
    return spec->group ? quantize_groups(x, M, K, ldq, spec, xq, ascale, err)
                       : quantize_rows(x, M, K, ldq, spec, xq, ascale, err);
}

static ork_status quantize_rows(const float *x, size_t M, size_t K, size_t ldq, const ork_act_spec *spec, int8_t *xq,
                                float *ascale, ork_err *err) {
    ork_status st;
    const ork_act_mode_info *row = ork_act_mode_get(spec->mode);
    const ork_quant_kernels *qk = ork_quant_kernels_active();
    for (size_t m = 0; m < M; m++) {
        float a = 0.0f;
        if (qk->absmax(x + m * K, K, &a)) { /* a non-finite value reported: *a is unspecified (quant.h) */
            for (size_t k = 0; k < K; k++)
                if (!isfinite(x[m * K + k]))
                    return ork_err_set(err, ORK_ENONFINITE, "activation has a non-finite value (%s) at [%zu, %zu]",
                                       isnan(x[m * K + k]) ? "NaN" : "Inf", m, k);
            a = 0.0f; /* none found (a kernel that reported wrongly): the row's absmax, as the scalar kernel */
            for (size_t k = 0; k < K; k++)
                if (fabsf(x[m * K + k]) > a) a = fabsf(x[m * K + k]);
        }
        ascale[m] = a;
    }
    const size_t p = spec->prefix < M ? spec->prefix : M; /* prefix rows keep their absmax, at 8 bits */
    if (M > p && (st = row->range(spec, x + p * K, M - p, K, ascale + p, err))) return st;
    /* 127, or 7 at 4 bits; 119 with digits, and for the 8-bit prefix rows of a 4-bit spec (two int4 digits) */
    const float qmax = spec->digits ? (float)ORK_ACT_DIGITS_QMAX : (float)((1 << (spec->bits - 1)) - 1);
    const float qmax8 = spec->digits || spec->bits < ORK_ACT_BITS ? (float)ORK_ACT_DIGITS_QMAX
                                                                  : (float)((1 << (ORK_ACT_BITS - 1)) - 1);
    for (size_t m = 0; m < M; m++) {
        float a = ascale[m], qm = m < p ? qmax8 : qmax;
        int8_t *q = xq + m * ldq;
        memset(q + K, 0, ldq - K);
        if (!(a >= ORK_QUANT_TINY)) {
            ascale[m] = 0.0f;
            memset(q, 0, K);
            continue;
        }
        if (spec->search && m >= p) { /* the range searched, the codes one wider on the row's extreme side */
            const float sg = row_sign(x + m * K, K);
            a = row_search(qk, x + m * K, K, a, qm, sg, q);
            ascale[m] = sg * (a / qm);
            codes_wide(qk, x + m * K, K, sg * (qm / a), qm, q);
            continue;
        }
        ascale[m] = a / qm;
        qk->codes8_rtn(x + m * K, K, qm / a, qm, q);
    }
    return ORK_OK;
}
