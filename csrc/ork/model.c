/* model.c - the float32 forward pass (see model.h). */
#include "model.h"

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cpu.h"
#include "gemm_f32.h"
#include "ffn_chain.h"
#include "pool.h"
#include "scratch.h"

/* -------------------------------------------------------- linear order -- */
const char *const ork_layer_linear_names[ORK_LAYER_LINEARS] = {"attn_q",   "attn_k", "attn_v", "attn_output",
                                                               "ffn_gate", "ffn_up", "ffn_down"};
static const size_t layer_linear_off[ORK_LAYER_LINEARS] = {
    offsetof(ork_layer, wq),     offsetof(ork_layer, wk),   offsetof(ork_layer, wv),    offsetof(ork_layer, wo),
    offsetof(ork_layer, w_gate), offsetof(ork_layer, w_up), offsetof(ork_layer, w_down)};

ork_linear *ork_layer_linear(ork_layer *L, int j) { return (ork_linear *)(void *)((char *)L + layer_linear_off[j]); }

size_t ork_model_linear_count(size_t n_layer) { return n_layer * ORK_LAYER_LINEARS + 1; }

ork_linear *ork_model_linear(ork_layer *layers, size_t n_layer, ork_linear *output, size_t i) {
    if (i < n_layer * ORK_LAYER_LINEARS) return ork_layer_linear(&layers[i / ORK_LAYER_LINEARS], (int)(i % ORK_LAYER_LINEARS));
    return i == n_layer * ORK_LAYER_LINEARS ? output : NULL;
}

int ork_model_linear_name(size_t n_layer, size_t i, char *buf, size_t len) {
    int n;
    if (i < n_layer * ORK_LAYER_LINEARS)
        n = snprintf(buf, len, "blk.%zu.%s.weight", i / ORK_LAYER_LINEARS, ork_layer_linear_names[i % ORK_LAYER_LINEARS]);
    else if (i == n_layer * ORK_LAYER_LINEARS)
        n = snprintf(buf, len, "output.weight");
    else
        return -1;
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* ------------------------------------------------------------- helpers -- */
static void rmsnorm(const float *x, const float *w, size_t n, float eps, float *out) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float mean = (float)(ss / (double)n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (size_t i = 0; i < n; i++) {
        float t = x[i] * scale;
        out[i] = w ? t * w[i] : t;
    }
}

/* theta_i = freq_scale * (pos * base^(-2i/n_rot) / ff_i), the running product as ggml's rope cache:
 * cs[2i] = cos(theta_i) * mscale, cs[2i + 1] = sin(theta_i) * mscale for i < n_rot / 2 (one table per
 * position serves every head) */
static void rope_table(size_t n_rot, float pos, float base, float freq_scale, const float *ff, float mscale,
                       float *cs) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = pos;
    for (size_t i0 = 0; i0 < n_rot; i0 += 2) {
        float th = freq_scale * (ff ? theta / ff[i0 / 2] : theta);
        float c = cosf(th), s = sinf(th);
        if (mscale != 1.0f) {
            c *= mscale;
            s *= mscale;
        }
        cs[i0] = c;
        cs[i0 + 1] = s;
        theta *= theta_scale;
    }
}

static void rope(float *v, size_t n_rot, ork_rope_type type, const float *cs) {
    for (size_t i0 = 0; i0 < n_rot; i0 += 2) {
        const float c = cs[i0], s = cs[i0 + 1];
        size_t a = (type == ORK_ROPE_NEOX) ? i0 / 2 : i0;
        size_t b = (type == ORK_ROPE_NEOX) ? i0 / 2 + n_rot / 2 : i0 + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

static ork_status check_linear(const ork_linear *l, size_t N, size_t K, const char *what, size_t layer, ork_err *err) {
    if (l->N != N || l->K != K)
        return ork_err_set(err, ORK_EINVAL, "layer %zu %s has shape (%zu, %zu), expected (%zu, %zu)", layer, what, l->N,
                           l->K, N, K);
    if (l->path == ORK_LIN_F32 ? !l->w : (!l->store || !l->bscale))
        return ork_err_set(err, ORK_EINVAL, "layer %zu %s has no weight data", layer, what);
    return ORK_OK;
}

ork_status ork_model_check(const ork_model *m, ork_err *err) {
    if (!m) return ork_err_set(err, ORK_EINVAL, "NULL model");
    if (!m->n_layer || !m->n_embd || !m->n_head || !m->n_head_kv || !m->head_dim || !m->n_ff || !m->n_vocab)
        return ork_err_set(err, ORK_EINVAL, "model has a zero dimension");
    if (m->n_layer > ORK_MODEL_MAX_LAYERS || m->n_head > 65536 || m->n_head_kv > 65536 || m->head_dim > 65536 || m->n_embd > ((size_t)1 << 20) ||
        m->n_ff > ((size_t)1 << 22) || m->n_vocab > ((size_t)1 << 24))
        return ork_err_set(err, ORK_EINVAL, "model dimensions out of range (layers %zu, heads %zu/%zu x %zu, embd %zu, ff %zu, vocab %zu)",
                           m->n_layer, m->n_head, m->n_head_kv, m->head_dim, m->n_embd, m->n_ff, m->n_vocab);
    if (m->n_head % m->n_head_kv)
        return ork_err_set(err, ORK_EINVAL, "n_head %zu is not a multiple of n_head_kv %zu", m->n_head, m->n_head_kv);
    if (m->n_rot > m->head_dim || (m->n_rot & 1))
        return ork_err_set(err, ORK_EINVAL, "rope dimension %zu must be even and <= head_dim %zu", m->n_rot, m->head_dim);
    if (!m->out_norm || !m->layers) return ork_err_set(err, ORK_EINVAL, "model is missing tensors");
    if (!(m->norm_eps > 0.0f) || !(m->rope_base > 0.0f) || !(m->rope_freq_scale > 0.0f) || !isfinite(m->norm_eps) ||
        !isfinite(m->rope_base) || !isfinite(m->rope_freq_scale))
        return ork_err_set(err, ORK_EINVAL, "bad norm epsilon or rope parameters");
    if ((unsigned)m->act >= ORK_ACT_COUNT) return ork_err_set(err, ORK_EINVAL, "unknown activation %d", (int)m->act);
    const float opt[5] = {m->embd_scale, m->attn_scale, m->attn_softcap, m->final_softcap, m->rope_attn_factor};
    static const char *const opt_name[5] = {"embedding scale", "attention scale", "attention soft-cap",
                                            "final soft-cap", "rope attention factor"};
    for (int i = 0; i < 5; i++)
        if (!(opt[i] >= 0.0f) || !isfinite(opt[i]))
            return ork_err_set(err, ORK_EINVAL, "%s %g must be finite and >= 0 (0: off)", opt_name[i], (double)opt[i]);
    if (m->rope_freqs)
        for (size_t i = 0; i < m->n_rot / 2; i++)
            if (!(m->rope_freqs[i] > 0.0f) || !isfinite(m->rope_freqs[i]))
                return ork_err_set(err, ORK_EINVAL, "rope frequency factor %zu is %g, expected a positive number", i,
                                   (double)m->rope_freqs[i]);
    ork_status st;
    const size_t D = m->n_embd, qd = m->n_head * m->head_dim, kvd = m->n_head_kv * m->head_dim, F = m->n_ff;
    /* (N, K) of each linear, in ork_layer_linear_names order */
    const size_t shape[ORK_LAYER_LINEARS][2] = {{qd, D}, {kvd, D}, {kvd, D}, {D, qd}, {F, D}, {F, D}, {D, F}};
    for (size_t i = 0; i < m->n_layer; i++) {
        const ork_layer *L = &m->layers[i];
        if (!L->attn_norm || !L->ffn_norm) return ork_err_set(err, ORK_EINVAL, "layer %zu is missing a norm", i);
        if (!(L->rope_base >= 0.0f) || !(L->rope_freq_scale >= 0.0f) || !isfinite(L->rope_base) ||
            !isfinite(L->rope_freq_scale))
            return ork_err_set(err, ORK_EINVAL, "layer %zu has a bad rope base %g / scale %g", i, (double)L->rope_base,
                               (double)L->rope_freq_scale);
        if (L->down_rot) {
            const size_t p = L->down_rot_p, mm = p ? F / p : 0;
            if (!p || p > ORK_DOWN_ROT_MAX_P || F % p || !mm || (mm & (mm - 1)))
                return ork_err_set(err, ORK_EINVAL, "layer %zu: an online down rotation of order %zu x H_m needs "
                                   "n_ff %zu = %zu x a power of two (and at most %d)", i, p, F, p, ORK_DOWN_ROT_MAX_P);
            if (L->ffn)
                return ork_err_set(err, ORK_EINVAL, "layer %zu: the fused FFN chain does not apply the online down "
                                   "rotation", i);
        }
        if (L->norm_rot) {
            const size_t p = L->norm_rot_p, mm = p ? D / p : 0;
            if (!p || p > ORK_DOWN_ROT_MAX_P || D % p || !mm || (mm & (mm - 1)))
                return ork_err_set(err, ORK_EINVAL, "layer %zu: an online block-input rotation of order %zu x H_m "
                                   "needs n_embd %zu = %zu x a power of two (and at most %d)", i, p, D, p,
                                   ORK_DOWN_ROT_MAX_P);
        }
        for (int j = 0; j < ORK_LAYER_LINEARS; j++) {
            const ork_linear *l = (const ork_linear *)(const void *)((const char *)L + layer_linear_off[j]);
            if ((st = check_linear(l, shape[j][0], shape[j][1], ork_layer_linear_names[j], i, err))) return st;
        }
    }
    return check_linear(&m->output, m->n_vocab, m->n_embd, "output", m->n_layer, err);
}

/* ----------------------------------------------------------- attention -- */
/* Work item (KV head, block of up to `rows` query rows), for each query head of the KV head's
 * group: the block's scores against the keys any of its rows sees, by the float32 GEMM
 * (attn.h: each score its own chain, so the block never changes one), then per row the
 * softmax over its own keys and the value sum over exactly those keys. A decoded token (T = 1) is a block of one row: the same
 * chains, so its output equals the prefill row's bit for bit. Each running item holds one
 * scratch slot (scores + the GEMM's packing buffer); at most nslots items run at once. */
typedef struct {
    const ork_model *m;
    const float *q;         /* (T, H*hd): the queries of positions pos0..pos0+T-1 */
    const float *k, *v;     /* (pos0 + T, Hkv*hd): keys / values of positions 0..pos0+T-1 */
    float *out;             /* (T, H*hd) */
    size_t T, pos0, n_swa;  /* n_swa: the layer's sliding window, 0 = none */
    size_t rows, nblk;      /* query rows per block, blocks per head */
    float *slots;           /* nslots x slot_floats, 64-byte aligned each */
    size_t slot_floats;
    atomic_int *busy;       /* nslots flags */
    int nslots;
} attn_job;

#define ATTN_MAX_SLOTS 256 /* scratch slots at most (threads=10000 asks for no 10000 slots of scores) */
#define ATTN_PV_ROWS 3 /* rows per value-sum call (attn.h kernels take them three at a time) */

/* the first key position a query at position p sees */
static size_t attn_lo(size_t p, size_t n_swa) { return n_swa && p >= n_swa ? p + 1 - n_swa : 0; }

/* query rows per block: at most 64, and the block's scores for a KV head's group of query heads
 * within 2^18 floats (1 MB) */
static size_t attn_rows(size_t n_keys, size_t group) {
    size_t r = ((size_t)1 << 18) / ((n_keys ? n_keys : 1) * (group ? group : 1));
    return r < 1 ? 1 : r > 64 ? 64 : r;
}

static size_t attn_slot_floats(size_t n_keys, size_t group) {
    const size_t s = group * attn_rows(n_keys, group) * n_keys;
    return (s + 15) / 16 * 16 + ORK_GEMM_F32_SCRATCH; /* the GEMM scratch stays 64-byte aligned */
}

static ork_status attn_blocks(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    const attn_job *j = (const attn_job *)ctx;
    const ork_model *m = j->m;
    const size_t hd = m->head_dim, qd = m->n_head * hd, kvd = m->n_head_kv * hd;
    const size_t group = m->n_head / m->n_head_kv;
    const float scale = m->attn_scale > 0.0f ? m->attn_scale : 1.0f / sqrtf((float)hd);
    const float cap = m->attn_softcap;
    const ork_attn_kernels *ak = ork_attn_kernels_active();       /* attn.h: bit-identical on every ISA */
    const ork_gemm_f32_kernels *gk = ork_gemm_f32_kernels_active(); /* gemm_f32.h: likewise */
    int slot = 0; /* fewer items run at once than there are slots, so one is free */
    while (atomic_exchange_explicit(&j->busy[slot], 1, memory_order_acquire)) slot = (slot + 1) % j->nslots;
    float *S = j->slots + (size_t)slot * j->slot_floats;
    float *gs = S + (j->slot_floats - ORK_GEMM_F32_SCRATCH);
    for (size_t it = begin; it < end; it++) {
        const size_t kh = it / j->nblk, h0 = kh * group, t0 = (it % j->nblk) * j->rows;
        const size_t t1 = t0 + j->rows < j->T ? t0 + j->rows : j->T, nr = t1 - t0;
        const size_t klo = attn_lo(j->pos0 + t0, j->n_swa), nk = j->pos0 + t1 - klo; /* keys klo..klo+nk-1 */
        const float *kb = j->k + klo * kvd + kh * hd, *vh = j->v + kh * hd;
        /* S[(g * nr + row) * nk + key]: head h0 + g of the group. One row (a decoded token): the
         * group's query vectors are adjacent rows (stride hd), one GEMM packs the keys once. */
        if (nr == 1)
            gk->cols(j->q + t0 * qd + h0 * hd, hd, group, hd, kb, kvd, 0, nk, S, nk, gs);
        else
            for (size_t g = 0; g < group; g++)
                gk->cols(j->q + t0 * qd + (h0 + g) * hd, qd, nr, hd, kb, kvd, 0, nk, S + g * nr * nk, nk, gs);
        for (size_t g = 0; g < group; g++)
            for (size_t t = t0; t < t1; t++) {
                const size_t p = j->pos0 + t, lo = attn_lo(p, j->n_swa), n = p + 1 - lo; /* keys lo..p */
                ak->softmax(S + (g * nr + t - t0) * nk + (lo - klo), n, scale, cap); /* the probabilities */
                memset(j->out + t * qd + (h0 + g) * hd, 0, hd * sizeof(float));
            }
        if (nr == 1) { /* the group's heads share every value load (outputs adjacent, stride hd) */
            const size_t lo = attn_lo(j->pos0 + t0, j->n_swa);
            ak->pv(S + (lo - klo), nk, group, vh + lo * kvd, kvd, j->pos0 + t0 + 1 - lo, hd,
                   j->out + t0 * qd + h0 * hd, hd);
            continue;
        }
        /* value sums, ATTN_PV_ROWS rows at a time: each row's keys in order, the rows' common
         * range [L, P] together (row t's probability of key u is S[(g * nr + t - t0) * nk + u - klo]) */
        for (size_t g = 0; g < group; g++)
            for (size_t ta = t0; ta < t1; ta += ATTN_PV_ROWS) {
                const size_t tb = ta + ATTN_PV_ROWS < t1 ? ta + ATTN_PV_ROWS : t1, R = tb - ta;
                const size_t L = attn_lo(j->pos0 + tb - 1, j->n_swa), P = j->pos0 + ta;
                const float *Sa = S + (g * nr + ta - t0) * nk;
                float *oa = j->out + ta * qd + (h0 + g) * hd;
                for (size_t r = 0; r < R; r++) {
                    const size_t lo = attn_lo(j->pos0 + ta + r, j->n_swa), p = j->pos0 + ta + r;
                    const size_t hi = L <= P ? L : p + 1; /* keys lo..hi-1 before the common range (all, without one) */
                    if (hi > lo)
                        ak->pv(Sa + r * nk + (lo - klo), nk, 1, vh + lo * kvd, kvd, hi - lo, hd, oa + r * qd, qd);
                }
                if (L > P) continue;
                ak->pv(Sa + (L - klo), nk, R, vh + L * kvd, kvd, P + 1 - L, hd, oa, qd);
                for (size_t r = 1; r < R; r++) /* keys P+1 .. p */
                    ak->pv(Sa + r * nk + (P + 1 - klo), nk, 1, vh + (P + 1) * kvd, kvd, r, hd, oa + r * qd, qd);
            }
    }
    atomic_store_explicit(&j->busy[slot], 0, memory_order_release);
    return ORK_OK;
}

/* ------------------------------------ online rotations (down input, block inputs) -- */
/* each of the T rows x (n = p * m) <- x kron(R, H_m): a fast Walsh-Hadamard transform of each
 * of the p blocks of m values (H_m symmetric, unnormalized), then R (p x p) mixes the blocks:
 * out[i*m + j] = sum_a y[a*m + j] R[a][i]. A fixed order of operations per row. */
static void down_rotate(float *x, size_t T, size_t n, const float *R, size_t p) {
    const size_t m = n / p;
    float in[ORK_DOWN_ROT_MAX_P];
    for (size_t t = 0; t < T; t++) {
        float *r = x + t * n;
        for (size_t b = 0; b < p; b++) {
            float *v = r + b * m;
            for (size_t hl = 1; hl < m; hl <<= 1)
                for (size_t i = 0; i < m; i += 2 * hl)
                    for (size_t j = i; j < i + hl; j++) {
                        const float u = v[j], w = v[j + hl];
                        v[j] = u + w;
                        v[j + hl] = u - w;
                    }
        }
        for (size_t j = 0; j < m; j++) {
            for (size_t a = 0; a < p; a++) in[a] = r[a * m + j];
            for (size_t i = 0; i < p; i++) {
                float s = 0.0f;
                for (size_t a = 0; a < p; a++) s += in[a] * R[a * p + i];
                r[i * m + j] = s;
            }
        }
    }
}

/* ------------------------------------------------------------- forward -- */
/* the activations of one step of T tokens (rows of D, D, qd, max(qd, F), F, D floats) and
 * the attention's scratch slots (attn_slot_floats(n_keys, group) floats each, one per thread that
 * runs attention items; grown on first use by attn_ensure) */
typedef struct {
    float *x, *h, *q, *a, *g, *tmp, *s;
    atomic_int *busy;
    size_t n_keys, s_slots;
} fwd_bufs;

static void bufs_free(fwd_bufs *b) {
    free(b->x); free(b->h); free(b->q); free(b->a); free(b->g); free(b->tmp); free(b->s); free(b->busy);
    memset(b, 0, sizeof *b);
}

/* n * k * elem bytes without overflow, or 0 */
static size_t mul3(size_t n, size_t k, size_t elem) {
    if (n && k > SIZE_MAX / n) return 0;
    const size_t nk = n * k;
    if (nk && elem > SIZE_MAX / nk) return 0;
    return nk * elem;
}

static ork_status bufs_alloc(const ork_model *m, size_t T, size_t n_keys, fwd_bufs *b, ork_err *err) {
    const size_t D = m->n_embd, qd = m->n_head * m->head_dim, F = m->n_ff, big = qd > F ? qd : F;
    memset(b, 0, sizeof *b);
    const size_t nx = mul3(T, D, sizeof(float)), nq = mul3(T, qd, sizeof(float)), na = mul3(T, big, sizeof(float)),
                 ng = mul3(T, F, sizeof(float));
    b->n_keys = n_keys;
    if (nx && nq && na && ng) {
        b->x = malloc(nx); b->h = malloc(nx); b->q = malloc(nq); b->a = malloc(na);
        b->g = malloc(ng); b->tmp = malloc(nx);
    }
    if (!b->x || !b->h || !b->q || !b->a || !b->g || !b->tmp) {
        bufs_free(b);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for the activations of %zu tokens", T);
    }
    return ORK_OK;
}

/* at least nslots attention scratch slots for n_keys keys in b (kept for later steps) */
static ork_status attn_ensure(fwd_bufs *b, int nslots, size_t group, ork_err *err) {
    if (b->s_slots >= (size_t)nslots) return ORK_OK;
    const size_t per = attn_slot_floats(b->n_keys, group), bytes = mul3((size_t)nslots, per, sizeof(float));
    float *s = bytes ? aligned_alloc(64, bytes) : NULL;
    atomic_int *busy = s ? malloc((size_t)nslots * sizeof *busy) : NULL;
    if (!busy) {
        free(s);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for the attention scratch (%d x %zu floats)", nslots, per);
    }
    for (int i = 0; i < nslots; i++) atomic_init(&busy[i], 0);
    free(b->s);
    free(b->busy);
    b->s = s;
    b->busy = busy;
    b->s_slots = (size_t)nslots;
    return ORK_OK;
}

static ork_status check_tokens(const ork_model *m, const int32_t *tokens, size_t T, size_t pos0, ork_err *err) {
    for (size_t t = 0; t < T; t++)
        if (tokens[t] < 0 || (size_t)tokens[t] >= m->n_vocab)
            return ork_err_set(err, ORK_EINVAL, "token %d at position %zu is outside the vocabulary (%zu)", tokens[t],
                               pos0 + t, m->n_vocab);
    return ORK_OK;
}

static void embed(const ork_model *m, const int32_t *tokens, size_t T, float *x) {
    const size_t D = m->n_embd;
    for (size_t t = 0; t < T; t++) {
        if (m->tok_embd) memcpy(x + t * D, m->tok_embd + (size_t)tokens[t] * D, D * sizeof(float));
        else ork_linear_row(&m->output, (size_t)tokens[t], x + t * D);
    }
    if (m->embd_scale > 0.0f)
        for (size_t i = 0; i < T * D; i++) x[i] *= m->embd_scale;
}

/* a block linear on rows at positions pos0..: act.prefix counts positions (model.h) */
static ork_status block_linear(const ork_linear *l, const float *x, size_t M, size_t pos0, float *y, int nthreads,
                               ork_err *err) {
    if (!pos0 || !l->act.prefix) return ork_linear_apply(l, x, M, y, nthreads, err);
    ork_linear at = *l;
    at.act.prefix = l->act.prefix > pos0 ? l->act.prefix - pos0 : 0;
    return ork_linear_apply(&at, x, M, y, nthreads, err);
}

/* One layer on the T rows of b->x (positions pos0..pos0+T-1), in place. Their keys and values
 * are written to rows pos0..pos0+T-1 of kc / vc (n_head_kv * head_dim floats per row), and the
 * attention reads rows 0..pos0+T-1: the chunk's own rows in the forward pass (pos0 = 0), the
 * session's caches when decoding. */
/* ------------------------------------------------ row-wise stages -- */
/* The per-token work between the linears (norms, RoPE, residual adds, the gated activation),
 * split over rows: each row's arithmetic is the same on any thread. */
typedef enum { ROWS_ATTN_IN, ROWS_ROPE, ROWS_ATTN_OUT, ROWS_ACT, ROWS_FFN_OUT } rows_stage;

typedef struct {
    const ork_model *m;
    const ork_layer *L;
    const fwd_bufs *b;
    float *k;          /* this step's key rows */
    size_t pos0;
    rows_stage stage;
} rows_job;

/* x += o for one row of n, o first normalized in place by post_norm when the layer has one */
static void residual_add(float *x, float *o, const float *post_norm, size_t n, float eps) {
    if (post_norm) rmsnorm(o, post_norm, n, eps, o);
    for (size_t i = 0; i < n; i++) x[i] += o[i];
}

static ork_status rows_run(void *ctx, size_t begin, size_t end, ork_err *err) {
    const rows_job *j = (const rows_job *)ctx;
    const ork_model *m = j->m;
    const ork_layer *L = j->L;
    const size_t D = m->n_embd, hd = m->head_dim, qd = m->n_head * hd, kvd = m->n_head_kv * hd, F = m->n_ff;
    float *x = j->b->x, *h = j->b->h, *q = j->b->q, *a = j->b->a, *g = j->b->g, *tmp = j->b->tmp;
    switch (j->stage) {
    case ROWS_ATTN_IN:
        for (size_t t = begin; t < end; t++) {
            rmsnorm(x + t * D, L->attn_norm, D, m->norm_eps, h + t * D);
            if (L->norm_rot) down_rotate(h + t * D, 1, D, L->norm_rot, L->norm_rot_p);
        }
        break;
    case ROWS_ROPE: {
        const float mscale = m->rope_attn_factor > 0.0f ? m->rope_attn_factor : 1.0f;
        const float base = L->rope_base > 0.0f ? L->rope_base : m->rope_base;
        const float fscale = L->rope_freq_scale > 0.0f ? L->rope_freq_scale : m->rope_freq_scale;
        _Alignas(64) float cs_s[520]; /* a position's RoPE table (scratch.h) */
        float *cs = ork_scratch(cs_s, sizeof cs_s, (m->n_rot + 1) * sizeof(float));
        if (!cs) return ork_err_set(err, ORK_ENOMEM, "out of memory (%zu floats of RoPE table)", m->n_rot);
        for (size_t t = begin; t < end; t++) {
            rope_table(m->n_rot, (float)(j->pos0 + t), base, fscale, m->rope_freqs, mscale, cs);
            for (size_t hh = 0; hh < m->n_head; hh++) {
                float *qh = q + t * qd + hh * hd;
                if (L->q_norm) rmsnorm(qh, L->q_norm, hd, m->norm_eps, qh);
                rope(qh, m->n_rot, m->rope_type, cs);
            }
            for (size_t hh = 0; hh < m->n_head_kv; hh++) {
                float *kh = j->k + t * kvd + hh * hd;
                if (L->k_norm) rmsnorm(kh, L->k_norm, hd, m->norm_eps, kh);
                rope(kh, m->n_rot, m->rope_type, cs);
            }
        }
        ork_scratch_free(cs, cs_s);
        break;
    }
    case ROWS_ATTN_OUT:
        for (size_t t = begin; t < end; t++) {
            residual_add(x + t * D, tmp + t * D, L->post_attn_norm, D, m->norm_eps);
            rmsnorm(x + t * D, L->ffn_norm, D, m->norm_eps, h + t * D);
            if (L->norm_rot) down_rotate(h + t * D, 1, D, L->norm_rot, L->norm_rot_p);
        }
        break;
    case ROWS_ACT:
        for (size_t t = begin; t < end; t++) {
            float *ar = a + t * F;
            const float *gr = g + t * F;
            if (m->act == ORK_ACT_SILU)
                for (size_t i = 0; i < F; i++) ar[i] = ork_act_apply(ORK_ACT_SILU, gr[i]) * ar[i];
            else
                for (size_t i = 0; i < F; i++) ar[i] = ork_act_apply(m->act, gr[i]) * ar[i];
            if (L->down_rot) down_rotate(ar, 1, F, L->down_rot, L->down_rot_p);
        }
        break;
    case ROWS_FFN_OUT:
        for (size_t t = begin; t < end; t++) residual_add(x + t * D, tmp + t * D, L->post_ffn_norm, D, m->norm_eps);
        break;
    }
    return ORK_OK;
}

/* run a row stage over T rows, on as many threads as ~64K floats of row work each justify */
static ork_status rows_stage_run(rows_job *j, rows_stage stage, size_t T, size_t row_floats, int nthreads,
                                 ork_err *err) {
    j->stage = stage;
    const int nt = ork_pool_threads_for(nthreads, (double)T * (double)row_floats, 65536.0);
    const size_t chunk = T / (4 * (size_t)nt) > 0 ? T / (4 * (size_t)nt) : 1;
    return ork_parallel_for(nt, T, chunk, rows_run, j, err);
}

/* One layer on the T rows of b->x (positions pos0..pos0+T-1), in place. Their keys and values
 * are written to rows pos0..pos0+T-1 of kc / vc (n_head_kv * head_dim floats per row), and the
 * attention reads rows 0..pos0+T-1: the chunk's own rows in the forward pass (pos0 = 0), the
 * session's caches when decoding. */
static ork_status layer_step(const ork_model *m, const ork_layer *L, fwd_bufs *b, size_t T, size_t pos0,
                             float *kc, float *vc, int nthreads, ork_err *err) {
    const size_t D = m->n_embd, hd = m->head_dim, qd = m->n_head * hd, kvd = m->n_head_kv * hd, F = m->n_ff;
    float *h = b->h, *q = b->q, *a = b->a, *g = b->g, *tmp = b->tmp;
    float *k = kc + pos0 * kvd, *v = vc + pos0 * kvd;
    rows_job rj = {m, L, b, k, pos0, ROWS_ATTN_IN};
    ork_status st;
    if ((st = rows_stage_run(&rj, ROWS_ATTN_IN, T, 2 * D, nthreads, err))) return st;
    if ((st = block_linear(&L->wq, h, T, pos0, q, nthreads, err))) return st;
    if ((st = block_linear(&L->wk, h, T, pos0, k, nthreads, err))) return st;
    if ((st = block_linear(&L->wv, h, T, pos0, v, nthreads, err))) return st;
    if ((st = rows_stage_run(&rj, ROWS_ROPE, T, 8 * (qd + kvd), nthreads, err))) return st;
    const size_t group = m->n_head / m->n_head_kv, rows = attn_rows(b->n_keys, group), nblk = (T + rows - 1) / rows;
    int nt = ork_pool_threads_for(nthreads, (double)T * (double)(pos0 + T) * (double)qd, 1 << 20);
    if ((size_t)nt > m->n_head_kv * nblk) nt = (int)(m->n_head_kv * nblk); /* no more running items than items */
    if (nt > ATTN_MAX_SLOTS) nt = ATTN_MAX_SLOTS;
    if ((st = attn_ensure(b, nt, group, err))) return st;
    attn_job aj = {m, q, kc, vc, a, T, pos0, L->n_swa, rows, nblk, b->s, attn_slot_floats(b->n_keys, group), b->busy,
                   nt};
    if ((st = ork_parallel_for(nt, m->n_head_kv * nblk, 1, attn_blocks, &aj, err))) return st;
    if ((st = block_linear(&L->wo, a, T, pos0, tmp, nthreads, err))) return st;
    if ((st = rows_stage_run(&rj, ROWS_ATTN_OUT, T, 4 * D, nthreads, err))) return st;
    if (L->ffn) {
        if ((st = ork_ffn_chain(&L->w_gate, &L->w_up, &L->w_down, L->ffn, h, T, tmp, nthreads, err))) return st;
    } else {
        if ((st = block_linear(&L->w_gate, h, T, pos0, g, nthreads, err))) return st;
        if ((st = block_linear(&L->w_up, h, T, pos0, a, nthreads, err))) return st;
        if (L->ffn_stats) ork_ffn_stats_add(L->ffn_stats, g, a, T, F);
        if ((st = rows_stage_run(&rj, ROWS_ACT, T, 8 * F, nthreads, err))) return st;
        if ((st = block_linear(&L->w_down, a, T, pos0, tmp, nthreads, err))) return st;
    }
    return rows_stage_run(&rj, ROWS_FFN_OUT, T, 2 * D, nthreads, err);
}

/* logits (rows x n_vocab) of the rows of x: the output norm into h, the head, the final soft-cap */
static ork_status head_logits(const ork_model *m, const float *x, size_t rows, float *h, float *logits, int nthreads,
                              ork_err *err) {
    const size_t D = m->n_embd;
    for (size_t t = 0; t < rows; t++) rmsnorm(x + t * D, m->out_norm, D, m->norm_eps, h + t * D);
    ork_status st = ork_linear_apply(&m->output, h, rows, logits, nthreads, err);
    if (st == ORK_OK && m->final_softcap > 0.0f) {
        const float cap = m->final_softcap, inv_cap = 1.0f / cap;
        for (size_t i = 0; i < rows * m->n_vocab; i++) logits[i] = tanhf(logits[i] * inv_cap) * cap;
    }
    return st;
}

ork_status ork_model_forward(const ork_model *m, const int32_t *tokens, size_t T, size_t first, float *logits,
                             int nthreads, ork_err *err) {
    ork_status st = ork_model_check(m, err);
    if (st) return st;
    if (T == 0 || first >= T) return ork_err_set(err, ORK_EINVAL, "need 0 <= first < T, got first %zu, T %zu", first, T);
    if (m->n_ctx_max && T > m->n_ctx_max)
        return ork_err_set(err, ORK_EINVAL, "a %zu-token chunk is longer than the %zu positions this model description "
                           "is valid for (n_ctx_max: its RoPE factors for longer contexts are not implemented)", T,
                           m->n_ctx_max);
    if ((st = check_tokens(m, tokens, T, 0, err))) return st;
    const size_t kvd = m->n_head_kv * m->head_dim, nkv = mul3(T, kvd, sizeof(float));
    fwd_bufs b;
    if ((st = bufs_alloc(m, T, T, &b, err))) return st;
    float *k = nkv ? malloc(nkv) : NULL, *v = nkv ? malloc(nkv) : NULL;
    if (!k || !v) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory for a %zu-token forward pass", T);
        goto done;
    }
    embed(m, tokens, T, b.x);
    for (size_t l = 0; l < m->n_layer; l++)
        if ((st = layer_step(m, &m->layers[l], &b, T, 0, k, v, nthreads, err))) goto done;
    st = head_logits(m, b.x + first * m->n_embd, T - first, b.h, logits, nthreads, err);
done:
    bufs_free(&b);
    free(k);
    free(v);
    return st;
}

ork_status ork_model_forward_hidden(const ork_model *m, float *x, size_t T, size_t layers, size_t first,
                                    float *logits, int nthreads, ork_err *err) {
    ork_status st = ork_model_check(m, err);
    if (st) return st;
    if (!x || T == 0) return ork_err_set(err, ORK_EINVAL, "need T >= 1 hidden rows, got %zu", T);
    if (layers > m->n_layer)
        return ork_err_set(err, ORK_EINVAL, "cannot run %zu layers of a %zu-layer model", layers, m->n_layer);
    if (logits && first >= T) return ork_err_set(err, ORK_EINVAL, "need 0 <= first < T, got first %zu, T %zu", first, T);
    if (m->n_ctx_max && T > m->n_ctx_max)
        return ork_err_set(err, ORK_EINVAL, "a %zu-token chunk is longer than the %zu positions this model description "
                           "is valid for (n_ctx_max)", T, m->n_ctx_max);
    const size_t D = m->n_embd, kvd = m->n_head_kv * m->head_dim, nkv = mul3(T, kvd, sizeof(float));
    fwd_bufs b;
    if ((st = bufs_alloc(m, T, T, &b, err))) return st;
    float *k = nkv ? malloc(nkv) : NULL, *v = nkv ? malloc(nkv) : NULL;
    if (!k || !v) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory for a %zu-token forward pass", T);
        goto done;
    }
    memcpy(b.x, x, T * D * sizeof(float));
    for (size_t l = 0; l < layers; l++)
        if ((st = layer_step(m, &m->layers[l], &b, T, 0, k, v, nthreads, err))) goto done;
    if (logits && (st = head_logits(m, b.x + first * D, T - first, b.h, logits, nthreads, err))) goto done;
    memcpy(x, b.x, T * D * sizeof(float));
done:
    bufs_free(&b);
    free(k);
    free(v);
    return st;
}

/* ------------------------------------------------------ decode session -- */
struct ork_session {
    const ork_model *m;
    size_t n_ctx, n_batch, pos;
    int32_t *ids; /* n_ctx: the id of every position held (0..pos-1), recorded with the caches */
    float *kv;    /* n_layer x (K cache, V cache), each n_ctx x kvd */
    fwd_bufs b;   /* scratch for n_batch tokens, scores for n_ctx keys */
};

ork_status ork_session_new(const ork_model *m, size_t n_ctx, size_t n_batch, ork_session **out, ork_err *err) {
    if (!out) return ork_err_set(err, ORK_EINVAL, "NULL session pointer");
    *out = NULL;
    ork_status st = ork_model_check(m, err);
    if (st) return st;
    if (n_ctx == 0 || n_batch == 0)
        return ork_err_set(err, ORK_EINVAL, "a session needs n_ctx >= 1 and n_batch >= 1, got n_ctx %zu, n_batch %zu",
                           n_ctx, n_batch);
    if (m->n_ctx_max && n_ctx > m->n_ctx_max)
        return ork_err_set(err, ORK_EINVAL, "n_ctx %zu is longer than the %zu positions this model description is "
                           "valid for (n_ctx_max: its RoPE factors for longer contexts are not implemented)", n_ctx,
                           m->n_ctx_max);
    if (n_batch > n_ctx) n_batch = n_ctx;
    const size_t kvd = m->n_head_kv * m->head_dim, per = mul3(n_ctx, kvd, 2 * sizeof(float));
    const size_t bytes = per ? mul3(m->n_layer, per, 1) : 0;
    if (!bytes)
        return ork_err_set(err, ORK_EINVAL, "a KV cache of %zu layers x %zu positions x 2 x %zu floats does not fit in "
                           "memory", m->n_layer, n_ctx, kvd);
    ork_session *s = calloc(1, sizeof *s);
    if (!s) return ork_err_set(err, ORK_ENOMEM, "out of memory for a decode session");
    s->m = m;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    if (!(s->ids = malloc(n_ctx * sizeof *s->ids))) {
        free(s);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for a decode session of %zu positions", n_ctx);
    }
    if (!(s->kv = malloc(bytes))) {
        free(s->ids);
        free(s);
        return ork_err_set(err, ORK_ENOMEM, "out of memory for the KV cache (%zu layers x %zu positions x 2 x %zu "
                           "floats: %.1f MB)", m->n_layer, n_ctx, kvd, (double)bytes / 1e6);
    }
    if ((st = bufs_alloc(m, n_batch, n_ctx, &s->b, err))) {
        free(s->kv);
        free(s->ids);
        free(s);
        return st;
    }
    *out = s;
    return ORK_OK;
}

void ork_session_free(ork_session *s) {
    if (!s) return;
    bufs_free(&s->b);
    free(s->kv);
    free(s->ids);
    free(s);
}

size_t ork_session_pos(const ork_session *s) { return s->pos; }
size_t ork_session_n_ctx(const ork_session *s) { return s->n_ctx; }

size_t ork_session_tokens(const ork_session *s, int32_t *out) {
    if (s->pos) memcpy(out, s->ids, s->pos * sizeof *s->ids);
    return s->pos;
}

ork_status ork_session_rewind(ork_session *s, size_t pos, ork_err *err) {
    if (pos > s->pos)
        return ork_err_set(err, ORK_EINVAL, "cannot rewind to position %zu: the session holds %zu tokens", pos, s->pos);
    s->pos = pos;
    return ORK_OK;
}

ork_status ork_session_eval(ork_session *s, const int32_t *tokens, size_t n, int all_logits, float *logits,
                            int nthreads, ork_err *err) {
    const ork_model *m = s->m;
    ork_status st = ork_model_check(m, err);
    if (st) return st;
    if (n == 0) return ork_err_set(err, ORK_EINVAL, "no tokens to evaluate");
    if (n > s->n_ctx - s->pos)
        return ork_err_set(err, ORK_EINVAL, "%zu tokens at position %zu do not fit the session's context: n_ctx %zu",
                           n, s->pos, s->n_ctx);
    if ((st = check_tokens(m, tokens, n, s->pos, err))) return st;
    const size_t D = m->n_embd, V = m->n_vocab, kvd = m->n_head_kv * m->head_dim, layer_kv = s->n_ctx * kvd;
    size_t pos = s->pos;
    for (size_t done = 0; done < n;) {
        const size_t T = n - done < s->n_batch ? n - done : s->n_batch;
        embed(m, tokens + done, T, s->b.x);
        for (size_t l = 0; l < m->n_layer; l++) {
            float *kc = s->kv + 2 * l * layer_kv;
            if ((st = layer_step(m, &m->layers[l], &s->b, T, pos, kc, kc + layer_kv, nthreads, err))) return st;
        }
        if (all_logits)
            st = head_logits(m, s->b.x, T, s->b.h, logits + done * V, nthreads, err);
        else if (done + T == n)
            st = head_logits(m, s->b.x + (T - 1) * D, 1, s->b.h, logits, nthreads, err);
        if (st) return st;
        done += T;
        pos += T;
    }
    memcpy(s->ids + s->pos, tokens, n * sizeof *tokens); /* the ids with their caches: one state */
    s->pos = pos;
    return ORK_OK;
}

typedef struct {
    const float *logits;
    size_t n_vocab;
    const int32_t *targets;
    double *nll;
} nll_job;

static ork_status nll_run(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    const nll_job *j = (const nll_job *)ctx;
    for (size_t r = begin; r < end; r++) {
        const float *l = j->logits + r * j->n_vocab;
        float mx = l[0];
        for (size_t i = 1; i < j->n_vocab; i++)
            if (l[i] > mx) mx = l[i];
        double sum_exp = 0.0;
        for (size_t i = 0; i < j->n_vocab; i++) sum_exp += expf(l[i] - mx);
        j->nll[r] = -((double)(l[j->targets[r]] - mx) - log(sum_exp));
    }
    return ORK_OK;
}

ork_status ork_nll_rows(const float *logits, size_t rows, size_t n_vocab, const int32_t *targets, double *nll,
                        int nthreads, ork_err *err) {
    for (size_t r = 0; r < rows; r++)
        if (targets[r] < 0 || (size_t)targets[r] >= n_vocab)
            return ork_err_set(err, ORK_EINVAL, "target %d of row %zu is outside the vocabulary", targets[r], r);
    if (rows == 0 || n_vocab == 0) return ORK_OK;
    nll_job j = {logits, n_vocab, targets, nll};
    const int nt = ork_pool_threads_for(nthreads, (double)rows * (double)n_vocab, 1 << 18);
    return ork_parallel_for(nt, rows, 1, nll_run, &j, err);
}
