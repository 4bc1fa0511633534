/* runtime.h - a forward model as the runtime owns it: the ork_model and its
 * layers (model.h), the lock that serialises every pass and every change of
 * the C-side state, the statistics buffers with their enable / take
 * lifecycle (imatrix sums, input Gram matrices, activation statistics, FFN
 * statistics), the per-layer FFN chain parameters (ffn_chain.h), the NPU
 * routes of the linears (linear.h int_mm) and the decode sessions' passes.
 *
 * The binding describes the model (ork_runtime_model, ork_runtime_layer:
 * hyper-parameters, arrays, linears) and then calls ork_runtime_check; after
 * that every function takes the model's lock (a pthread mutex) itself, so a
 * caller never locks: concurrent forward passes, session steps, settings and
 * collections on one model run one at a time. The arrays the model points
 * into belong to the caller and must outlive the runtime.
 *
 * Owners: a setting that points into memory of the caller's objects (an NPU
 * route: the uploaded weight; a replaced linear: its arrays; an FFN setting:
 * its per-channel scales) names an opaque `owner` (the binding's reference
 * that keeps them alive, or NULL). The runtime swaps the owner together with
 * the pointer under its lock and hands back the one it replaced (`*replaced`,
 * NULL when none), so the caller releases exactly what no setting uses any
 * more, also when two threads change one setting at once. On an error nothing
 * changed: *replaced is NULL and the new owner is still the caller's.
 * ork_runtime_free hands every owner still held to `release`.
 *
 * Collections: *_enable starts one (replacing one in progress) and hooks its
 * buffers into the linears / layers; *_take stops it and hands the buffers
 * to the caller (free them with the matching *_free), ORK_ESTATE when none
 * was enabled. The fused FFN chain and the per-op collections exclude each
 * other: imatrix, Gram and activation statistics are refused (ORK_EINVAL)
 * while a layer runs the chain.
 */
#ifndef ORK_RUNTIME_H
#define ORK_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "ffn_chain.h"
#include "linear.h"
#include "model.h"
#include "status.h"

typedef struct ork_runtime ork_runtime;

/* an empty model (all of ork_model zero, no layers) and its lock */
ork_status ork_runtime_new(ork_runtime **out, ork_err *err);
/* After every session of it was freed; NULL is a no-op. The model's memory first, then release(owner) for
 * every owner a setting still holds (release NULL: the owners are only forgotten). */
void ork_runtime_free(ork_runtime *rt, void (*release)(void *owner));

/* The description, filled by the caller before ork_runtime_check and read-only after it. */
ork_model *ork_runtime_model(ork_runtime *rt);
/* n_layer zeroed layers (replacing any), i < n_layer the layer to fill */
ork_status ork_runtime_alloc_layers(ork_runtime *rt, size_t n_layer, ork_err *err);
ork_layer *ork_runtime_layer(ork_runtime *rt, size_t i);
/* links the layers into the model and checks it (ork_model_check); on an error the model stays unlinked
 * (model->layers NULL) and the setters below refuse it (ORK_ESTATE) */
ork_status ork_runtime_check(ork_runtime *rt, ork_err *err);

/* the linears in the forward model's order (model.h ork_model_linear) */
size_t ork_runtime_n_linears(const ork_runtime *rt);
const ork_linear *ork_runtime_linear(ork_runtime *rt, size_t i);

/* ork_model_forward under the lock */
ork_status ork_runtime_forward(ork_runtime *rt, const int32_t *tokens, size_t T, size_t first, float *logits,
                               int threads, ork_err *err);
/* ork_model_forward_hidden under the lock */
ork_status ork_runtime_forward_hidden(ork_runtime *rt, float *x, size_t T, size_t layers, size_t first, float *logits,
                                      int threads, ork_err *err);

/* Replace linear i by `spec` of the same shape, whose arrays `owner` keeps: its bias and statistics hooks
 * are kept, its NPU route dropped (it held the old weight's values). *replaced: the owner of the linear it
 * replaces (NULL for the described one, which the caller's description keeps); *unrouted: the owner of the
 * dropped route (NULL when none). */
ork_status ork_runtime_set_linear(ork_runtime *rt, size_t i, const ork_linear *spec, void *owner, void **replaced,
                                  void **unrouted, ork_err *err);
/* Route linear i's int8 matmul through fn(ctx) (an N x K weight of group size `group`, the linear's shape
 * and group: a grouped fn returns per-group partial sums, linear.h), kept by `owner`; fn NULL (and owner
 * NULL) routes it back to the CPU. ORK_EINVAL naming why a linear cannot run there (a float32 linear) or
 * the shapes or group sizes that differ. *replaced: the previous route's owner. */
ork_status ork_runtime_set_int_mm(ork_runtime *rt, size_t i, ork_int_mm_fn fn, void *ctx, size_t N, size_t K,
                                  size_t group, void *owner, void **replaced, ork_err *err);

/* imatrix: sum x^2 per input channel of every linear, and the rows counted */
typedef struct ork_rt_imatrix {
    size_t n;        /* linears */
    double *sums;    /* linear i's K sums follow linear i-1's */
    uint64_t *count; /* (n) */
} ork_rt_imatrix;
ork_status ork_runtime_imatrix_enable(ork_runtime *rt, ork_err *err);
ork_status ork_runtime_imatrix_take(ork_runtime *rt, ork_rt_imatrix *out, ork_err *err);
void ork_rt_imatrix_free(ork_rt_imatrix *t);

/* Input Gram matrices (linear.h) of the linears at positions idx (each in [0, n_linears), K <= 32768) */
typedef struct ork_rt_grams {
    size_t n;        /* linears */
    double **upper;  /* (n): linear i's K x K sums, upper triangle (column >= row) valid, or NULL if not collected */
    uint64_t *rows;  /* (n) */
} ork_rt_grams;
ork_status ork_runtime_gram_enable(ork_runtime *rt, const int64_t *idx, size_t n_idx, ork_err *err);
ork_status ork_runtime_gram_take(ork_runtime *rt, ork_rt_grams *out, ork_err *err);
void ork_rt_grams_free(ork_rt_grams *t);
/* the full symmetric K x K matrix g of a collected upper triangle (g == upper: mirrored in place) */
void ork_rt_gram_symmetric(const double *upper, size_t K, double *g);

/* Input capture (linear.h) of the linears at positions idx (each in [0, n_linears)): room for `rows` input
 * rows each, filled in call order; take hands the buffers over (the caller frees each with free()). */
typedef struct ork_rt_capture {
    size_t n;     /* linears */
    float **x;    /* (n): linear i's rows (used[i] x K, row-major), or NULL if not captured */
    size_t *used; /* (n) */
} ork_rt_capture;
ork_status ork_runtime_capture_enable(ork_runtime *rt, const int64_t *idx, size_t n_idx, size_t rows, ork_err *err);
ork_status ork_runtime_capture_take(ork_runtime *rt, ork_rt_capture *out, ork_err *err);
void ork_rt_capture_free(ork_rt_capture *t);

/* Activation statistics (linear.h ork_act_stats) of every linear's input, the first `prefix` rows of
 * each call of a block linear counted in ch_absmax only (not the head's) */
typedef struct ork_rt_act_stats {
    size_t n;          /* linears */
    ork_act_stats *st; /* (n); st[i].ch_absmax points into ch (K of linear i) */
    float *ch;
} ork_rt_act_stats;
ork_status ork_runtime_act_stats_enable(ork_runtime *rt, size_t prefix, ork_err *err);
ork_status ork_runtime_act_stats_take(ork_runtime *rt, ork_rt_act_stats *out, ork_err *err);
void ork_rt_act_stats_free(ork_rt_act_stats *t);

/* Layer i's FFN on the fused chain with p (checked by ork_ffn_check; its activation is the model's; p's
 * arrays are kept by `owner`), or NULL (and owner NULL): the per-op path. *replaced: the previous setting's
 * owner. */
ork_status ork_runtime_set_ffn(ork_runtime *rt, size_t layer, const ork_ffn_params *p, void *owner, void **replaced,
                               ork_err *err);
/* one layer's chain on normed inputs h (T, n_embd) -> y (T, n_embd) (tests, debugging) */
ork_status ork_runtime_ffn_apply(ork_runtime *rt, size_t layer, const float *h, size_t T, float *y, ork_err *err);

/* The FFN's prep statistics (ffn_chain.h ork_ffn_stats) per layer */
typedef struct ork_rt_ffn_stats {
    size_t n;          /* layers */
    ork_ffn_stats *st; /* (n), each with its own s_absmax_ch (n_ff) */
} ork_rt_ffn_stats;
ork_status ork_runtime_ffn_stats_enable(ork_runtime *rt, ork_err *err);
ork_status ork_runtime_ffn_stats_take(ork_runtime *rt, ork_rt_ffn_stats *out, ork_err *err);
void ork_rt_ffn_stats_free(ork_rt_ffn_stats *t);

/* Decode sessions (model.h ork_session) over the model: made, stepped and rewound under the lock. */
ork_status ork_runtime_session_new(ork_runtime *rt, size_t n_ctx, size_t n_batch, ork_session **out, ork_err *err);
ork_status ork_runtime_session_eval(ork_runtime *rt, ork_session *s, const int32_t *tokens, size_t n, int all_logits,
                                    float *logits, int threads, ork_err *err);
ork_status ork_runtime_session_rewind(ork_runtime *rt, ork_session *s, size_t pos, ork_err *err);
/* under the lock: the position (the tokens held), and a copy of their ids (out holds n_ctx ids; returns pos),
 * so a reader never sees the ids of one step and the position of another */
size_t ork_runtime_session_pos(ork_runtime *rt, const ork_session *s);
size_t ork_runtime_session_tokens(ork_runtime *rt, const ork_session *s, int32_t *out);
void ork_runtime_session_free(ork_runtime *rt, ork_session *s);

#endif
