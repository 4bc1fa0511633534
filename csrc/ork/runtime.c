/* runtime.c - see runtime.h. */
#include "runtime.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ork_runtime {
    pthread_mutex_t lock; /* serialises passes and every change of the state below */
    ork_model m;
    ork_layer *layers;
    double *x2; /* imatrix accumulators, all linears back to back (NULL when off) */
    uint64_t *x2n;
    ork_ffn_params *ffn;  /* per-layer FFN chain settings (NULL until the first set) */
    ork_ffn_stats *stats; /* per-layer prep statistics (NULL when off) */
    ork_act_stats *astats; /* per linear activation statistics (NULL when off) */
    float *astats_ch;      /* their per-channel maxima, all linears back to back */
    double **xx;           /* per linear: its input Gram matrix (K x K) or NULL (NULL when off) */
    uint64_t *xxn;
    float **cap;           /* per linear: its captured input rows or NULL (NULL when off) */
    size_t *capn;
    /* the owners of the settings (runtime.h "Owners"), allocated by a successful check */
    void **route_owner;  /* per linear: its NPU route's */
    void **linear_owner; /* per linear: a replacement's arrays' */
    void **ffn_owner;    /* per layer: its FFN setting's */
};

ork_status ork_runtime_new(ork_runtime **out, ork_err *err) {
    *out = NULL;
    ork_runtime *rt = (ork_runtime *)calloc(1, sizeof *rt);
    if (!rt) return ORK_ENOMEM;
    if (pthread_mutex_init(&rt->lock, NULL)) {
        free(rt);
        return ork_err_set(err, ORK_ENOMEM, "cannot create the model's lock");
    }
    *out = rt;
    return ORK_OK;
}

ork_model *ork_runtime_model(ork_runtime *rt) { return &rt->m; }

ork_status ork_runtime_alloc_layers(ork_runtime *rt, size_t n_layer, ork_err *err) {
    (void)err;
    free(rt->layers);
    rt->layers = (ork_layer *)calloc(n_layer ? n_layer : 1, sizeof(ork_layer));
    return rt->layers ? ORK_OK : ORK_ENOMEM;
}

ork_layer *ork_runtime_layer(ork_runtime *rt, size_t i) { return &rt->layers[i]; }

ork_status ork_runtime_check(ork_runtime *rt, ork_err *err) {
    rt->m.layers = rt->layers;
    ork_status st = ork_model_check(&rt->m, err);
    if (st == ORK_OK && !rt->route_owner) {
        const size_t n = ork_runtime_n_linears(rt), nl = rt->m.n_layer ? rt->m.n_layer : 1;
        rt->route_owner = (void **)calloc(n, sizeof(void *));
        rt->linear_owner = (void **)calloc(n, sizeof(void *));
        rt->ffn_owner = (void **)calloc(nl, sizeof(void *));
        if (!rt->route_owner || !rt->linear_owner || !rt->ffn_owner) {
            free(rt->route_owner);
            free(rt->linear_owner);
            free(rt->ffn_owner);
            rt->route_owner = rt->linear_owner = rt->ffn_owner = NULL;
            st = ork_err_set(err, ORK_ENOMEM, "out of memory");
        }
    }
    if (st != ORK_OK) rt->m.layers = NULL; /* unlinked: not a model to run or set */
    return st;
}

/* ORK_ESTATE unless the model was checked (the setters' slots exist) */
static ork_status checked(const ork_runtime *rt, ork_err *err) {
    return rt->route_owner ? ORK_OK : ork_err_set(err, ORK_ESTATE, "the model is not initialised");
}

size_t ork_runtime_n_linears(const ork_runtime *rt) { return ork_model_linear_count(rt->m.n_layer); }

/* linear i in the forward model's order */
static ork_linear *linear_at(ork_runtime *rt, size_t i) {
    return ork_model_linear(rt->layers, rt->m.n_layer, &rt->m.output, i);
}

const ork_linear *ork_runtime_linear(ork_runtime *rt, size_t i) { return linear_at(rt, i); }

/* ------------------------------------------------- freeing the collections -- */
static void free_ffn_stats(ork_runtime *rt) {
    if (rt->stats) {
        for (size_t i = 0; i < rt->m.n_layer; i++) free(rt->stats[i].s_absmax_ch);
        free(rt->stats);
        rt->stats = NULL;
    }
    for (size_t i = 0; rt->layers && i < rt->m.n_layer; i++) rt->layers[i].ffn_stats = NULL;
}

static void free_act_stats(ork_runtime *rt) {
    const size_t n = rt->layers ? ork_runtime_n_linears(rt) : 0;
    for (size_t i = 0; i < n; i++) linear_at(rt, i)->act_stats = NULL;
    free(rt->astats);
    free(rt->astats_ch);
    rt->astats = NULL;
    rt->astats_ch = NULL;
}

/* stop the Gram matrix collection and free its buffers */
static void free_gram(ork_runtime *rt) {
    const size_t n = rt->layers ? ork_runtime_n_linears(rt) : 0;
    for (size_t i = 0; i < n; i++) {
        ork_linear *l = linear_at(rt, i);
        l->xx_sum = NULL;
        l->xx_count = NULL;
    }
    for (size_t i = 0; rt->xx && i < n; i++) free(rt->xx[i]);
    free(rt->xx);
    free(rt->xxn);
    rt->xx = NULL;
    rt->xxn = NULL;
}

/* stop the input capture (unhook the linears) and free its buffers */
static void free_capture(ork_runtime *rt) {
    const size_t n = rt->layers ? ork_runtime_n_linears(rt) : 0;
    for (size_t i = 0; i < n; i++) {
        ork_linear *l = linear_at(rt, i);
        l->cap = NULL;
        l->cap_rows = 0;
        l->cap_used = NULL;
    }
    for (size_t i = 0; rt->cap && i < n; i++) free(rt->cap[i]);
    free(rt->cap);
    free(rt->capn);
    rt->cap = NULL;
    rt->capn = NULL;
}

/* stop the imatrix collection (unhook the linears) and free its buffers */
static void free_imatrix(ork_runtime *rt) {
    const size_t n = rt->layers ? ork_runtime_n_linears(rt) : 0;
    for (size_t i = 0; i < n; i++) {
        ork_linear *l = linear_at(rt, i);
        l->x2_sum = NULL;
        l->x2_count = NULL;
    }
    free(rt->x2);
    free(rt->x2n);
    rt->x2 = NULL;
    rt->x2n = NULL;
}

static void release_owners(void **owners, size_t n, void (*release)(void *owner)) {
    for (size_t i = 0; owners && release && i < n; i++)
        if (owners[i]) release(owners[i]);
    free(owners);
}

void ork_runtime_free(ork_runtime *rt, void (*release)(void *owner)) {
    if (!rt) return;
    free_act_stats(rt);
    free_gram(rt);
    free_capture(rt);
    free_ffn_stats(rt);
    free_imatrix(rt);
    const size_t n = rt->route_owner ? ork_runtime_n_linears(rt) : 0;
    free(rt->ffn);
    free(rt->layers);
    pthread_mutex_destroy(&rt->lock);
    release_owners(rt->route_owner, n, release); /* the model that pointed into them is gone */
    release_owners(rt->linear_owner, n, release);
    release_owners(rt->ffn_owner, rt->m.n_layer, release);
    free(rt);
}

/* ------------------------------------------------------------- passes -- */
ork_status ork_runtime_forward(ork_runtime *rt, const int32_t *tokens, size_t T, size_t first, float *logits,
                               int threads, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = ork_model_forward(&rt->m, tokens, T, first, logits, threads, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_forward_hidden(ork_runtime *rt, float *x, size_t T, size_t layers, size_t first, float *logits,
                                      int threads, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = ork_model_forward_hidden(&rt->m, x, T, layers, first, logits, threads, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

/* ------------------------------------------------------------ linears -- */
static ork_status set_linear(ork_runtime *rt, size_t i, const ork_linear *spec, void *owner, void **replaced,
                             void **unrouted, ork_err *err) {
    ork_status st = checked(rt, err);
    if (st != ORK_OK) return st;
    ork_linear *l = linear_at(rt, i), tmp = *spec;
    if (tmp.N != l->N || tmp.K != l->K)
        return ork_err_set(err, ORK_EINVAL, "linear %zu is (%zu, %zu), the new spec is (%zu, %zu)", i, l->N, l->K,
                           tmp.N, tmp.K);
    tmp.bias = l->bias;
    tmp.x2_sum = l->x2_sum;
    tmp.x2_count = l->x2_count;
    tmp.act_stats = l->act_stats;
    tmp.xx_sum = l->xx_sum;
    tmp.xx_count = l->xx_count;
    tmp.cap = l->cap;
    tmp.cap_rows = l->cap_rows;
    tmp.cap_used = l->cap_used;
    tmp.int_mm = NULL; /* the NPU route held the old weight's values */
    tmp.int_mm_ctx = NULL;
    *l = tmp;
    *replaced = rt->linear_owner[i];
    rt->linear_owner[i] = owner;
    *unrouted = rt->route_owner[i];
    rt->route_owner[i] = NULL;
    return ORK_OK;
}

ork_status ork_runtime_set_linear(ork_runtime *rt, size_t i, const ork_linear *spec, void *owner, void **replaced,
                                  void **unrouted, ork_err *err) {
    *replaced = NULL;
    *unrouted = NULL;
    pthread_mutex_lock(&rt->lock);
    ork_status st = set_linear(rt, i, spec, owner, replaced, unrouted, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

static ork_status routable(const ork_linear *l, size_t i, ork_err *err) {
    if (l->path != ORK_LIN_PACKED)
        return ork_err_set(err, ORK_EINVAL,
                           "linear %zu is a float32 linear: only packed int8/nf4/int4 linears run on the NPU", i);
    return ORK_OK;
}

static ork_status set_int_mm(ork_runtime *rt, size_t i, ork_int_mm_fn fn, void *ctx, size_t N, size_t K, size_t group,
                             void *owner, void **replaced, ork_err *err) {
    ork_status st = checked(rt, err);
    if (st != ORK_OK) return st;
    ork_linear *l = linear_at(rt, i);
    if (fn && (st = routable(l, i, err)) != ORK_OK) return st;
    if (fn && (N != l->N || K != l->K))
        return ork_err_set(err, ORK_EINVAL, "NPU weight is (%zu, %zu) but linear %zu is (%zu, %zu)", N, K, i, l->N,
                           l->K);
    if (fn && group != l->group)
        return ork_err_set(err, ORK_EINVAL, "NPU weight has group size %zu but linear %zu has %zu (0: per channel)",
                           group, i, l->group);
    l->int_mm = fn;
    l->int_mm_ctx = fn ? ctx : NULL;
    *replaced = rt->route_owner[i];
    rt->route_owner[i] = fn ? owner : NULL;
    return ORK_OK;
}

ork_status ork_runtime_set_int_mm(ork_runtime *rt, size_t i, ork_int_mm_fn fn, void *ctx, size_t N, size_t K,
                                  size_t group, void *owner, void **replaced, ork_err *err) {
    *replaced = NULL;
    pthread_mutex_lock(&rt->lock);
    ork_status st = set_int_mm(rt, i, fn, ctx, N, K, group, owner, replaced, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

/* ORK_EINVAL naming the first layer on the fused FFN chain, which the per-op collections cannot see */
static ork_status no_ffn_chain(ork_runtime *rt, const char *what, ork_err *err) {
    for (size_t i = 0; i < rt->m.n_layer; i++)
        if (rt->layers[i].ffn)
            return ork_err_set(err, ORK_EINVAL,
                               "layer %zu runs the fused FFN chain: collect %s on the per-op model (set every layer's "
                               "FFN mode to baseline first)",
                               i, what);
    return ORK_OK;
}

/* ------------------------------------------------------------ imatrix -- */
static ork_status imatrix_enable(ork_runtime *rt, ork_err *err) {
    ork_status st = no_ffn_chain(rt, "the imatrix", err);
    if (st != ORK_OK) return st;
    const size_t n = ork_runtime_n_linears(rt);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += linear_at(rt, i)->K;
    free_imatrix(rt); /* unhooks the linears before their buffers go */
    rt->x2 = (double *)calloc(total ? total : 1, sizeof(double));
    rt->x2n = (uint64_t *)calloc(n ? n : 1, sizeof(uint64_t));
    if (!rt->x2 || !rt->x2n) {
        free_imatrix(rt); /* none, not half of one: take sees both buffers or neither */
        return ORK_ENOMEM;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        ork_linear *l = linear_at(rt, i);
        l->x2_sum = rt->x2 + off;
        l->x2_count = &rt->x2n[i];
        off += l->K;
    }
    return ORK_OK;
}

ork_status ork_runtime_imatrix_enable(ork_runtime *rt, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = imatrix_enable(rt, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_imatrix_take(ork_runtime *rt, ork_rt_imatrix *out, ork_err *err) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&rt->lock);
    ork_status st = ORK_OK;
    if (!rt->x2) {
        st = ork_err_set(err, ORK_ESTATE, "imatrix collection is not enabled");
    } else {
        out->n = ork_runtime_n_linears(rt);
        out->sums = rt->x2;
        out->count = rt->x2n;
        rt->x2 = NULL; /* handed over */
        rt->x2n = NULL;
        free_imatrix(rt);
    }
    pthread_mutex_unlock(&rt->lock);
    return st;
}

void ork_rt_imatrix_free(ork_rt_imatrix *t) {
    free(t->sums);
    free(t->count);
    memset(t, 0, sizeof *t);
}

/* -------------------------------------------------------------- Grams -- */
static ork_status gram_enable(ork_runtime *rt, const int64_t *idx, size_t n_idx, ork_err *err) {
    ork_status st = no_ffn_chain(rt, "Gram matrices", err);
    if (st != ORK_OK) return st;
    const size_t n = ork_runtime_n_linears(rt);
    free_gram(rt);
    rt->xx = (double **)calloc(n ? n : 1, sizeof(double *));
    rt->xxn = (uint64_t *)calloc(n ? n : 1, sizeof(uint64_t));
    if (!rt->xx || !rt->xxn) {
        free_gram(rt);
        return ORK_ENOMEM;
    }
    for (size_t k = 0; k < n_idx; k++) {
        const int64_t i = idx[k];
        if (i < 0 || (uint64_t)i >= n) {
            st = ork_err_set(err, ORK_EINVAL, "linear index %lld is outside 0..%zu", (long long)i, n - 1);
            break;
        }
        ork_linear *l = linear_at(rt, (size_t)i);
        if (rt->xx[i]) continue;
        if (l->K > ((size_t)1 << 15)) {
            st = ork_err_set(err, ORK_EINVAL, "linear %lld has K = %zu: a Gram matrix needs K <= 32768", (long long)i,
                             l->K);
            break;
        }
        if (!(rt->xx[i] = (double *)calloc(l->K * l->K, sizeof(double)))) {
            st = ORK_ENOMEM;
            break;
        }
        l->xx_sum = rt->xx[i];
        l->xx_count = &rt->xxn[i];
    }
    if (st != ORK_OK) free_gram(rt);
    return st;
}

ork_status ork_runtime_gram_enable(ork_runtime *rt, const int64_t *idx, size_t n_idx, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = gram_enable(rt, idx, n_idx, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_gram_take(ork_runtime *rt, ork_rt_grams *out, ork_err *err) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&rt->lock);
    ork_status st = ORK_OK;
    if (!rt->xx) {
        st = ork_err_set(err, ORK_ESTATE, "Gram matrix collection is not enabled");
    } else {
        out->n = ork_runtime_n_linears(rt);
        out->upper = rt->xx;
        out->rows = rt->xxn;
        const size_t n = out->n;
        for (size_t i = 0; i < n; i++) { /* unhook, then hand the buffers over */
            ork_linear *l = linear_at(rt, i);
            l->xx_sum = NULL;
            l->xx_count = NULL;
        }
        rt->xx = NULL;
        rt->xxn = NULL;
    }
    pthread_mutex_unlock(&rt->lock);
    return st;
}

void ork_rt_grams_free(ork_rt_grams *t) {
    for (size_t i = 0; t->upper && i < t->n; i++) free(t->upper[i]);
    free(t->upper);
    free(t->rows);
    memset(t, 0, sizeof *t);
}

void ork_rt_gram_symmetric(const double *u, size_t K, double *g) {
    if (g == u) { /* in place: each lower entry from its upper mirror (never written) */
        for (size_t r = 1; r < K; r++)
            for (size_t c = 0; c < r; c++) g[r * K + c] = u[c * K + r];
        return;
    }
    for (size_t r = 0; r < K; r++)
        for (size_t c = 0; c < K; c++) g[r * K + c] = c >= r ? u[r * K + c] : u[c * K + r];
}

/* ------------------------------------------------------------ capture -- */
static ork_status capture_enable(ork_runtime *rt, const int64_t *idx, size_t n_idx, size_t rows, ork_err *err) {
    ork_status st = no_ffn_chain(rt, "an input capture", err);
    if (st != ORK_OK) return st;
    const size_t n = ork_runtime_n_linears(rt);
    free_capture(rt);
    rt->cap = (float **)calloc(n ? n : 1, sizeof(float *));
    rt->capn = (size_t *)calloc(n ? n : 1, sizeof(size_t));
    if (!rt->cap || !rt->capn) {
        free_capture(rt);
        return ORK_ENOMEM;
    }
    for (size_t k = 0; k < n_idx; k++) {
        const int64_t i = idx[k];
        if (i < 0 || (uint64_t)i >= n) {
            st = ork_err_set(err, ORK_EINVAL, "linear index %lld is outside 0..%zu", (long long)i, n - 1);
            break;
        }
        ork_linear *l = linear_at(rt, (size_t)i);
        if (rt->cap[i]) continue;
        if (rows && l->K > SIZE_MAX / sizeof(float) / rows) {
            st = ork_err_set(err, ORK_EINVAL, "a capture of %zu rows of %zu floats is too large", rows, l->K);
            break;
        }
        if (!(rt->cap[i] = (float *)malloc((rows ? rows : 1) * l->K * sizeof(float)))) {
            st = ork_err_set(err, ORK_ENOMEM, "out of memory for the input capture of linear %lld (%zu x %zu floats)",
                             (long long)i, rows, l->K);
            break;
        }
        l->cap = rt->cap[i];
        l->cap_rows = rows;
        l->cap_used = &rt->capn[i];
    }
    if (st != ORK_OK) free_capture(rt);
    return st;
}

ork_status ork_runtime_capture_enable(ork_runtime *rt, const int64_t *idx, size_t n_idx, size_t rows, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = capture_enable(rt, idx, n_idx, rows, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_capture_take(ork_runtime *rt, ork_rt_capture *out, ork_err *err) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&rt->lock);
    ork_status st = ORK_OK;
    if (!rt->cap) {
        st = ork_err_set(err, ORK_ESTATE, "input capture is not enabled");
    } else {
        out->n = ork_runtime_n_linears(rt);
        out->x = rt->cap;
        out->used = rt->capn;
        rt->cap = NULL; /* handed over; the hooks come off */
        rt->capn = NULL;
        free_capture(rt);
    }
    pthread_mutex_unlock(&rt->lock);
    return st;
}

void ork_rt_capture_free(ork_rt_capture *t) {
    for (size_t i = 0; t->x && i < t->n; i++) free(t->x[i]);
    free(t->x);
    free(t->used);
    memset(t, 0, sizeof *t);
}

/* --------------------------------------------------- activation stats -- */
static ork_status act_stats_enable(ork_runtime *rt, size_t prefix, ork_err *err) {
    ork_status st = no_ffn_chain(rt, "activation statistics", err);
    if (st != ORK_OK) return st;
    free_act_stats(rt);
    const size_t n = ork_runtime_n_linears(rt);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += linear_at(rt, i)->K;
    rt->astats = (ork_act_stats *)calloc(n ? n : 1, sizeof(ork_act_stats));
    rt->astats_ch = (float *)calloc(total ? total : 1, sizeof(float));
    if (!rt->astats || !rt->astats_ch) {
        free_act_stats(rt);
        return ORK_ENOMEM;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        ork_linear *l = linear_at(rt, i);
        rt->astats[i].ch_absmax = rt->astats_ch + off;
        rt->astats[i].skip_rows = i + 1 < n ? prefix : 0; /* the head (last) runs on positions first.. */
        l->act_stats = &rt->astats[i];
        off += l->K;
    }
    return ORK_OK;
}

ork_status ork_runtime_act_stats_enable(ork_runtime *rt, size_t prefix, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = act_stats_enable(rt, prefix, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_act_stats_take(ork_runtime *rt, ork_rt_act_stats *out, ork_err *err) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&rt->lock);
    ork_status st = ORK_OK;
    if (!rt->astats) {
        st = ork_err_set(err, ORK_ESTATE, "activation statistics are not enabled");
    } else {
        out->n = ork_runtime_n_linears(rt);
        out->st = rt->astats;
        out->ch = rt->astats_ch;
        rt->astats = NULL; /* handed over */
        rt->astats_ch = NULL;
        free_act_stats(rt);
    }
    pthread_mutex_unlock(&rt->lock);
    return st;
}

void ork_rt_act_stats_free(ork_rt_act_stats *t) {
    free(t->st);
    free(t->ch);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------- FFN chain -- */
static ork_status set_ffn(ork_runtime *rt, size_t li, const ork_ffn_params *p, void *owner, void **replaced,
                          ork_err *err) {
    ork_status st = checked(rt, err);
    if (st != ORK_OK) return st;
    if (!rt->ffn && !(rt->ffn = (ork_ffn_params *)calloc(rt->m.n_layer ? rt->m.n_layer : 1, sizeof(ork_ffn_params))))
        return ORK_ENOMEM;
    ork_layer *L = &rt->layers[li];
    if (!p) {
        L->ffn = NULL;
        memset(&rt->ffn[li], 0, sizeof rt->ffn[li]); /* its arrays go with the owner */
        *replaced = rt->ffn_owner[li];
        rt->ffn_owner[li] = NULL;
        return ORK_OK;
    }
    ork_ffn_params q = *p;
    q.act = rt->m.act; /* the chain's activation is the model's (ffn_chain.h) */
    ork_err e;
    e.msg[0] = '\0';
    st = ork_ffn_check(&L->w_gate, &L->w_up, &L->w_down, &q, &e);
    if (st != ORK_OK) return ork_err_set(err, st, "layer %zu: %s", li, e.msg);
    rt->ffn[li] = q;
    L->ffn = &rt->ffn[li];
    *replaced = rt->ffn_owner[li];
    rt->ffn_owner[li] = owner;
    return ORK_OK;
}

ork_status ork_runtime_set_ffn(ork_runtime *rt, size_t layer, const ork_ffn_params *p, void *owner, void **replaced,
                               ork_err *err) {
    *replaced = NULL;
    pthread_mutex_lock(&rt->lock);
    ork_status st = set_ffn(rt, layer, p, owner, replaced, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_ffn_apply(ork_runtime *rt, size_t layer, const float *h, size_t T, float *y, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    const ork_layer *L = &rt->layers[layer];
    ork_status st = !L->ffn ? ork_err_set(err, ORK_EINVAL, "layer %zu has no FFN chain set", layer)
                            : ork_ffn_chain(&L->w_gate, &L->w_up, &L->w_down, L->ffn, h, T, y, 0, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

static ork_status ffn_stats_enable(ork_runtime *rt) {
    free_ffn_stats(rt);
    rt->stats = (ork_ffn_stats *)calloc(rt->m.n_layer ? rt->m.n_layer : 1, sizeof(ork_ffn_stats));
    if (!rt->stats) return ORK_ENOMEM;
    for (size_t i = 0; i < rt->m.n_layer; i++) {
        rt->stats[i].s_absmax_ch = (float *)calloc(rt->m.n_ff ? rt->m.n_ff : 1, sizeof(float));
        if (!rt->stats[i].s_absmax_ch) {
            free_ffn_stats(rt);
            return ORK_ENOMEM;
        }
        rt->stats[i].smin = 0.0f;
        rt->stats[i].act = rt->m.act;
        rt->layers[i].ffn_stats = &rt->stats[i];
    }
    return ORK_OK;
}

ork_status ork_runtime_ffn_stats_enable(ork_runtime *rt, ork_err *err) {
    (void)err;
    pthread_mutex_lock(&rt->lock);
    ork_status st = ffn_stats_enable(rt);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_ffn_stats_take(ork_runtime *rt, ork_rt_ffn_stats *out, ork_err *err) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&rt->lock);
    ork_status st = ORK_OK;
    if (!rt->stats) {
        st = ork_err_set(err, ORK_ESTATE, "FFN statistics are not enabled");
    } else {
        out->n = rt->m.n_layer;
        out->st = rt->stats;
        rt->stats = NULL; /* handed over */
        free_ffn_stats(rt);
    }
    pthread_mutex_unlock(&rt->lock);
    return st;
}

void ork_rt_ffn_stats_free(ork_rt_ffn_stats *t) {
    for (size_t i = 0; t->st && i < t->n; i++) free(t->st[i].s_absmax_ch);
    free(t->st);
    memset(t, 0, sizeof *t);
}

/* ----------------------------------------------------------- sessions -- */
ork_status ork_runtime_session_new(ork_runtime *rt, size_t n_ctx, size_t n_batch, ork_session **out, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = ork_session_new(&rt->m, n_ctx, n_batch, out, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_session_eval(ork_runtime *rt, ork_session *s, const int32_t *tokens, size_t n, int all_logits,
                                    float *logits, int threads, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = ork_session_eval(s, tokens, n, all_logits, logits, threads, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

ork_status ork_runtime_session_rewind(ork_runtime *rt, ork_session *s, size_t pos, ork_err *err) {
    pthread_mutex_lock(&rt->lock);
    ork_status st = ork_session_rewind(s, pos, err);
    pthread_mutex_unlock(&rt->lock);
    return st;
}

size_t ork_runtime_session_pos(ork_runtime *rt, const ork_session *s) {
    pthread_mutex_lock(&rt->lock);
    const size_t pos = ork_session_pos(s);
    pthread_mutex_unlock(&rt->lock);
    return pos;
}

size_t ork_runtime_session_tokens(ork_runtime *rt, const ork_session *s, int32_t *out) {
    pthread_mutex_lock(&rt->lock);
    const size_t pos = ork_session_tokens(s, out);
    pthread_mutex_unlock(&rt->lock);
    return pos;
}

void ork_runtime_session_free(ork_runtime *rt, ork_session *s) {
    pthread_mutex_lock(&rt->lock);
    ork_session_free(s);
    pthread_mutex_unlock(&rt->lock);
}
