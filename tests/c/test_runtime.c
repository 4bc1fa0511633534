/* test_runtime.c - the runtime's (csrc/ork/runtime.h) state under failures and owners:
 *   - every collection's enable, failing at each of its allocations (calloc is wrapped: the link
 *     passes -Wl,--wrap=calloc, tests/cbuild.py), leaves no collection half made (take refuses with
 *     ORK_ESTATE, no linear hooked to a freed buffer: a forward after it runs and a new collection
 *     counts only its own rows);
 *   - the setters hand back exactly the owner they replace, and ork_runtime_free releases every owner
 *     still held, once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/runtime.h"
#include "check.h"

void *__real_calloc(size_t n, size_t size);
static int g_fail_at; /* > 0: the g_fail_at-th calloc from now returns NULL (1: the next one) */
static int g_callocs; /* callocs seen while counting */
void *__wrap_calloc(size_t n, size_t size) {
    g_callocs++;
    if (g_fail_at > 0 && --g_fail_at == 0) return NULL;
    return __real_calloc(n, size);
}

enum { E = 8, H = 2, HD = 4, F = 16, V = 10, T = 3 };
static float g_w[4096]; /* every array of the model reads from here */

static void linear(ork_linear *l, size_t N, size_t K) {
    memset(l, 0, sizeof *l);
    l->path = ORK_LIN_F32;
    l->N = N;
    l->K = K;
    l->w = g_w;
    l->act.bits = ORK_ACT_BITS;
}

/* a one-layer model over g_w */
static ork_runtime *model(void) {
    ork_runtime *rt = NULL;
    ork_err err;
    CHECK(ork_runtime_new(&rt, &err) == ORK_OK, "runtime_new");
    ork_model *m = ork_runtime_model(rt);
    m->n_layer = 1;
    m->n_embd = E;
    m->n_head = m->n_head_kv = H;
    m->head_dim = HD;
    m->n_ff = F;
    m->n_vocab = V;
    m->n_rot = HD;
    m->rope_base = 10000.0f;
    m->rope_freq_scale = 1.0f;
    m->norm_eps = 1e-5f;
    m->tok_embd = g_w;
    m->out_norm = g_w;
    linear(&m->output, V, E);
    CHECK(ork_runtime_alloc_layers(rt, 1, &err) == ORK_OK, "alloc_layers");
    ork_layer *L = ork_runtime_layer(rt, 0);
    L->attn_norm = L->ffn_norm = g_w;
    linear(&L->wq, E, E);
    linear(&L->wk, E, E);
    linear(&L->wv, E, E);
    linear(&L->wo, E, E);
    linear(&L->w_gate, F, E);
    linear(&L->w_up, F, E);
    linear(&L->w_down, E, F);
    ork_status st = ork_runtime_check(rt, &err);
    CHECK(st == ORK_OK, "runtime_check: %s", err.msg);
    return rt;
}

static ork_status forward(ork_runtime *rt) {
    static const int32_t tok[T] = {1, 2, 3};
    float logits[T * V];
    ork_err err;
    return ork_runtime_forward(rt, tok, T, 0, logits, 1, &err);
}

/* imatrix: enable, fail the i-th allocation of a second enable, then check the state */
static void imatrix_failures(void) {
    ork_runtime *rt = model();
    ork_err err;
    g_callocs = 0;
    CHECK(ork_runtime_imatrix_enable(rt, &err) == ORK_OK, "imatrix_enable");
    const int n_alloc = g_callocs;
    CHECK(n_alloc >= 2, "imatrix_enable allocates its sums and counts (%d callocs)", n_alloc);
    for (int i = 1; i <= n_alloc; i++) {
        CHECK(forward(rt) == ORK_OK, "forward while collecting");
        g_fail_at = i;
        CHECK(ork_runtime_imatrix_enable(rt, &err) == ORK_ENOMEM, "imatrix_enable, calloc %d failing", i);
        g_fail_at = 0;
        ork_rt_imatrix t;
        CHECK(ork_runtime_imatrix_take(rt, &t, &err) == ORK_ESTATE && !t.sums && !t.count,
              "after a failed enable (calloc %d) no collection is left, not half of one", i);
        CHECK(forward(rt) == ORK_OK, "a forward after the failed enable writes no freed buffer");
        CHECK(ork_runtime_imatrix_enable(rt, &err) == ORK_OK, "imatrix_enable again");
        CHECK(forward(rt) == ORK_OK, "forward");
        CHECK(ork_runtime_imatrix_take(rt, &t, &err) == ORK_OK && t.sums && t.count, "take");
        for (size_t j = 0; t.count && j < t.n; j++)
            CHECK(t.count[j] == T, "linear %zu counted %llu rows, one forward's", j,
                  (unsigned long long)t.count[j]);
        ork_rt_imatrix_free(&t);
        CHECK(ork_runtime_imatrix_enable(rt, &err) == ORK_OK, "imatrix_enable for the next round");
    }
    ork_runtime_free(rt, NULL);
}

/* the same for the Gram matrices, the activation and the FFN statistics */
static void other_failures(void) {
    ork_runtime *rt = model();
    ork_err err;
    const int64_t idx[2] = {0, 6};
    for (int which = 0; which < 3; which++) {
        g_callocs = 0;
        ork_status st = which == 0   ? ork_runtime_gram_enable(rt, idx, 2, &err)
                        : which == 1 ? ork_runtime_act_stats_enable(rt, 0, &err)
                                     : ork_runtime_ffn_stats_enable(rt, &err);
        CHECK(st == ORK_OK, "enable %d", which);
        const int n_alloc = g_callocs;
        for (int i = 1; i <= n_alloc; i++) {
            CHECK(forward(rt) == ORK_OK, "forward while collecting");
            g_fail_at = i;
            st = which == 0   ? ork_runtime_gram_enable(rt, idx, 2, &err)
                 : which == 1 ? ork_runtime_act_stats_enable(rt, 0, &err)
                              : ork_runtime_ffn_stats_enable(rt, &err);
            g_fail_at = 0;
            CHECK(st == ORK_ENOMEM, "enable %d, calloc %d failing: %d", which, i, (int)st);
            CHECK(forward(rt) == ORK_OK, "a forward after the failed enable");
            if (which == 0) {
                ork_rt_grams t;
                CHECK(ork_runtime_gram_take(rt, &t, &err) == ORK_ESTATE, "no Gram collection left");
            } else if (which == 1) {
                ork_rt_act_stats t;
                CHECK(ork_runtime_act_stats_take(rt, &t, &err) == ORK_ESTATE, "no activation statistics left");
            } else {
                ork_rt_ffn_stats t;
                CHECK(ork_runtime_ffn_stats_take(rt, &t, &err) == ORK_ESTATE, "no FFN statistics left");
            }
            st = which == 0   ? ork_runtime_gram_enable(rt, idx, 2, &err)
                 : which == 1 ? ork_runtime_act_stats_enable(rt, 0, &err)
                              : ork_runtime_ffn_stats_enable(rt, &err);
            CHECK(st == ORK_OK, "enable %d again", which);
        }
    }
    ork_runtime_free(rt, NULL);
}

/* owners: each setter hands back what it replaced; free releases what is left */
static int g_released[8];
static void release(void *owner) { g_released[(int *)owner - g_released]++; }
#define OWNER(i) ((void *)&g_released[i])

static ork_status fake_mm(void *ctx, const int8_t *xq, size_t M, size_t ldq, int32_t *acc, ork_err *err) {
    (void)ctx, (void)xq, (void)M, (void)ldq, (void)acc, (void)err;
    return ORK_OK;
}

static void owners(void) {
    ork_runtime *rt = model();
    ork_err err;
    void *old = OWNER(7), *unrouted = OWNER(7);
    /* a float linear cannot be routed: nothing changes, nothing is handed back */
    CHECK(ork_runtime_set_int_mm(rt, 0, fake_mm, NULL, E, E, 0, OWNER(0), &old, &err) == ORK_EINVAL && !old,
          "a refused route hands back no owner");
    ork_linear spec;
    linear(&spec, E, E);
    CHECK(ork_runtime_set_linear(rt, 0, &spec, OWNER(1), &old, &unrouted, &err) == ORK_OK && !old && !unrouted,
          "the described linear has no owner");
    CHECK(ork_runtime_set_linear(rt, 0, &spec, OWNER(2), &old, &unrouted, &err) == ORK_OK && old == OWNER(1) &&
              !unrouted,
          "set_linear hands back the linear it replaced");
    linear(&spec, E, F);
    CHECK(ork_runtime_set_linear(rt, 0, &spec, OWNER(3), &old, &unrouted, &err) == ORK_EINVAL && !old && !unrouted,
          "a refused linear hands back nothing");
    CHECK(ork_runtime_set_int_mm(rt, 0, NULL, NULL, 0, 0, 0, NULL, &old, &err) == ORK_OK && !old, "no route to drop");
    CHECK(ork_runtime_set_ffn(rt, 0, NULL, NULL, &old, &err) == ORK_OK && !old, "no FFN setting to drop");
    memset(g_released, 0, sizeof g_released);
    ork_runtime_free(rt, release);
    CHECK(g_released[2] == 1, "free releases the linear's owner once (%d)", g_released[2]);
    CHECK(g_released[0] + g_released[1] + g_released[3] == 0, "free releases nothing it handed back or refused");
}

int main(void) {
    for (size_t i = 0; i < sizeof g_w / sizeof g_w[0]; i++) g_w[i] = (float)((i * 7919u) % 17u) / 17.0f - 0.5f;
    printf("comparing the runtime's state against its contract\n");
    imatrix_failures();
    other_failures();
    owners();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
