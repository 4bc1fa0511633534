/* model.c - the float32 forward pass (see model.h). */
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ffn_chain.h"
#include "pool.h"

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

static void rope(float *v, size_t n_rot, ork_rope_type type, float pos, float base, float freq_scale) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = pos * freq_scale;
    for (size_t i0 = 0; i0 < n_rot; i0 += 2) {
        float c = cosf(theta), s = sinf(theta);
        size_t a = (type == ORK_ROPE_NEOX) ? i0 / 2 : i0;
        size_t b = (type == ORK_ROPE_NEOX) ? i0 / 2 + n_rot / 2 : i0 + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
        theta *= theta_scale;
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
    if (!m->tok_embd || !m->out_norm || !m->layers) return ork_err_set(err, ORK_EINVAL, "model is missing tensors");
    if (!(m->norm_eps > 0.0f) || !(m->rope_base > 0.0f) || !(m->rope_freq_scale > 0.0f))
        return ork_err_set(err, ORK_EINVAL, "bad norm epsilon or rope parameters");
    ork_status st;
    const size_t D = m->n_embd, qd = m->n_head * m->head_dim, kvd = m->n_head_kv * m->head_dim, F = m->n_ff;
    /* (N, K) of each linear, in ork_layer_linear_names order */
    const size_t shape[ORK_LAYER_LINEARS][2] = {{qd, D}, {kvd, D}, {kvd, D}, {D, qd}, {F, D}, {F, D}, {D, F}};
    for (size_t i = 0; i < m->n_layer; i++) {
        const ork_layer *L = &m->layers[i];
        if (!L->attn_norm || !L->ffn_norm) return ork_err_set(err, ORK_EINVAL, "layer %zu is missing a norm", i);
        for (int j = 0; j < ORK_LAYER_LINEARS; j++) {
            const ork_linear *l = (const ork_linear *)(const void *)((const char *)L + layer_linear_off[j]);
            if ((st = check_linear(l, shape[j][0], shape[j][1], ork_layer_linear_names[j], i, err))) return st;
        }
    }
    return check_linear(&m->output, m->n_vocab, m->n_embd, "output", m->n_layer, err);
}

/* ----------------------------------------------------------- attention -- */
typedef struct {
    const ork_model *m;
    const float *q, *k, *v; /* (T, H*hd), (T, Hkv*hd) */
    float *out;             /* (T, H*hd) */
    size_t T;
} attn_job;

static ork_status attn_heads(void *ctx, size_t begin, size_t end, ork_err *err) {
    const attn_job *j = (const attn_job *)ctx;
    const ork_model *m = j->m;
    const size_t hd = m->head_dim, qd = m->n_head * hd, kvd = m->n_head_kv * hd, T = j->T;
    const size_t group = m->n_head / m->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    float *s = (float *)malloc(T * sizeof(float));
    if (!s) return ork_err_set(err, ORK_ENOMEM, "out of memory for attention scores");
    for (size_t h = begin; h < end; h++) {
        size_t kh = h / group;
        for (size_t t = 0; t < T; t++) {
            const float *qv = j->q + t * qd + h * hd;
            float mx = -INFINITY;
            for (size_t u = 0; u <= t; u++) {
                s[u] = ork_dot8(qv, j->k + u * kvd + kh * hd, hd) * scale;
                if (s[u] > mx) mx = s[u];
            }
            double sum = 0.0;
            for (size_t u = 0; u <= t; u++) {
                s[u] = expf(s[u] - mx);
                sum += s[u];
            }
            float inv = (float)(1.0 / sum);
            float *o = j->out + t * qd + h * hd;
            for (size_t d = 0; d < hd; d++) o[d] = 0.0f;
            for (size_t u = 0; u <= t; u++) {
                const float *vv = j->v + u * kvd + kh * hd;
                float p = s[u] * inv;
                for (size_t d = 0; d < hd; d++) o[d] += p * vv[d];
            }
        }
    }
    free(s);
    return ORK_OK;
}

/* ------------------------------------------------------------- forward -- */
ork_status ork_model_forward(const ork_model *m, const int32_t *tokens, size_t T, size_t first, float *logits,
                             int nthreads, ork_err *err) {
    ork_status st = ork_model_check(m, err);
    if (st) return st;
    if (T == 0 || first >= T) return ork_err_set(err, ORK_EINVAL, "need 0 <= first < T, got first %zu, T %zu", first, T);
    for (size_t t = 0; t < T; t++)
        if (tokens[t] < 0 || (size_t)tokens[t] >= m->n_vocab)
            return ork_err_set(err, ORK_EINVAL, "token %d at position %zu is outside the vocabulary (%zu)", tokens[t], t,
                               m->n_vocab);
    const size_t D = m->n_embd, hd = m->head_dim, qd = m->n_head * hd, kvd = m->n_head_kv * hd, F = m->n_ff;
    size_t big = qd > F ? qd : F;
    float *x = malloc(T * D * sizeof(float)), *h = malloc(T * D * sizeof(float));
    float *q = malloc(T * qd * sizeof(float)), *k = malloc(T * kvd * sizeof(float)), *v = malloc(T * kvd * sizeof(float));
    float *a = malloc(T * big * sizeof(float)), *g = malloc(T * F * sizeof(float)), *tmp = malloc(T * D * sizeof(float));
    if (!x || !h || !q || !k || !v || !a || !g || !tmp) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory for a %zu-token forward pass", T);
        goto done;
    }
    for (size_t t = 0; t < T; t++) memcpy(x + t * D, m->tok_embd + (size_t)tokens[t] * D, D * sizeof(float));
    for (size_t l = 0; l < m->n_layer; l++) {
        const ork_layer *L = &m->layers[l];
        for (size_t t = 0; t < T; t++) rmsnorm(x + t * D, L->attn_norm, D, m->norm_eps, h + t * D);
        if ((st = ork_linear_apply(&L->wq, h, T, q, nthreads, err))) goto done;
        if ((st = ork_linear_apply(&L->wk, h, T, k, nthreads, err))) goto done;
        if ((st = ork_linear_apply(&L->wv, h, T, v, nthreads, err))) goto done;
        for (size_t t = 0; t < T; t++) {
            for (size_t hh = 0; hh < m->n_head; hh++) {
                float *qh = q + t * qd + hh * hd;
                if (L->q_norm) rmsnorm(qh, L->q_norm, hd, m->norm_eps, qh);
                rope(qh, m->n_rot, m->rope_type, (float)t, m->rope_base, m->rope_freq_scale);
            }
            for (size_t hh = 0; hh < m->n_head_kv; hh++) {
                float *kh = k + t * kvd + hh * hd;
                if (L->k_norm) rmsnorm(kh, L->k_norm, hd, m->norm_eps, kh);
                rope(kh, m->n_rot, m->rope_type, (float)t, m->rope_base, m->rope_freq_scale);
            }
        }
        attn_job aj = {m, q, k, v, a, T};
        int nt = ork_pool_threads_for(nthreads, (double)T * (double)T * (double)qd, 1 << 20);
        if ((st = ork_parallel_for(nt, m->n_head, 1, attn_heads, &aj, err))) goto done;
        if ((st = ork_linear_apply(&L->wo, a, T, tmp, nthreads, err))) goto done;
        for (size_t i = 0; i < T * D; i++) x[i] += tmp[i];
        for (size_t t = 0; t < T; t++) rmsnorm(x + t * D, L->ffn_norm, D, m->norm_eps, h + t * D);
        if (L->ffn) {
            if ((st = ork_ffn_chain(&L->w_gate, &L->w_up, &L->w_down, L->ffn, h, T, tmp, nthreads, err))) goto done;
            for (size_t i = 0; i < T * D; i++) x[i] += tmp[i];
            continue;
        }
        if ((st = ork_linear_apply(&L->w_gate, h, T, g, nthreads, err))) goto done;
        if ((st = ork_linear_apply(&L->w_up, h, T, a, nthreads, err))) goto done;
        if (L->ffn_stats) ork_ffn_stats_add(L->ffn_stats, g, a, T, F);
        for (size_t i = 0; i < T * F; i++) {
            float z = g[i];
            a[i] = (z / (1.0f + expf(-z))) * a[i];
        }
        if ((st = ork_linear_apply(&L->w_down, a, T, tmp, nthreads, err))) goto done;
        for (size_t i = 0; i < T * D; i++) x[i] += tmp[i];
    }
    for (size_t t = first; t < T; t++) rmsnorm(x + t * D, m->out_norm, D, m->norm_eps, h + (t - first) * D);
    st = ork_linear_apply(&m->output, h, T - first, logits, nthreads, err);
done:
    free(x); free(h); free(q); free(k); free(v); free(a); free(g); free(tmp);
    return st;
}

ork_status ork_nll_rows(const float *logits, size_t rows, size_t n_vocab, const int32_t *targets, double *nll,
                        ork_err *err) {
    for (size_t r = 0; r < rows; r++) {
        const float *l = logits + r * n_vocab;
        if (targets[r] < 0 || (size_t)targets[r] >= n_vocab)
            return ork_err_set(err, ORK_EINVAL, "target %d of row %zu is outside the vocabulary", targets[r], r);
        float mx = l[0];
        for (size_t i = 1; i < n_vocab; i++)
            if (l[i] > mx) mx = l[i];
        double sum_exp = 0.0;
        for (size_t i = 0; i < n_vocab; i++) sum_exp += expf(l[i] - mx);
        nll[r] = -((double)(l[targets[r]] - mx) - log(sum_exp));
    }
    return ORK_OK;
}
