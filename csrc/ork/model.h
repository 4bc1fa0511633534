/* model.h - a float32 forward pass for the decoder-only architectures of
 * orkpy's architecture table (orkpy/formats/arch.py, arch.SUPPORTED), batched over one chunk of tokens (prefill style, causal,
 * positions 0..T-1), every linear layer on its own weight path. Each feature
 * is a flag or an optional pointer, off by default (0 / NULL), so a plain
 * Llama description runs the plain Llama arithmetic.
 *
 * Arithmetic (float32 activations throughout):
 *   x = tok_embd[tokens]                          (* embd_scale when set: Gemma's sqrt(n_embd))
 *                                                 (tok_embd NULL: row t of the head, ork_linear_row)
 *   per layer:  h = rmsnorm(x) * attn_norm
 *               q = h Wq^T (+ bq), k = h Wk^T (+ bk), v = h Wv^T (+ bv)   (linear paths; optional biases)
 *               q_norm / k_norm set: q, k per-head rmsnorm * q_norm / k_norm  (qwen3, gemma3)
 *               RoPE on q, k (NORM: pairs (2i, 2i+1); NEOX: pairs (i, i + n_rot/2)), first n_rot dims of
 *                 each head: theta_i = freq_scale * (pos * base^(-2i/n_rot) / ff_i), ff = rope_freqs or 1,
 *                 (cos, sin) * rope_attn_factor when set; base / freq_scale per layer when the layer sets them
 *               attention per head (grouped KV heads): s = (q . k) * attn_scale (default 1/sqrt(head_dim));
 *                 attn_softcap c set: s = c * tanh(s * (1/c)); causal, and with the layer's n_swa > 0 a
 *                 key at u is seen from t only when t - u < n_swa (llama.cpp's standard sliding window)
 *               o = attn Wo^T (+ bo);  post_attn_norm set: o = rmsnorm(o) * post_attn_norm;  x += o
 *               h = rmsnorm(x) * ffn_norm;  f = (act(h Wg^T) * (h Wu^T)) Wd^T   (act: act.h, SiLU or GELU-tanh)
 *               post_ffn_norm set: f = rmsnorm(f) * post_ffn_norm;  x += f
 *   logits = (rmsnorm(x) * out_norm) Wout^T (+ bout)   for rows first..T-1 only
 *            final_softcap c set: logits = c * tanh(logits * (1/c))
 * rmsnorm(v) = v * (1 / sqrt(mean(v^2) + eps)), the mean accumulated in double.
 * Norm weights are used as stored: llama.cpp's converter already stores
 * Gemma's (1 + w) norm weights with the 1 added.
 * Float linears are one fused multiply-add chain per output (gemm_f32.h), and so
 * are attention's scores (the same GEMM, blocks of query rows against their keys)
 * and value sums (attn.h: keys in order); work is split over output columns and
 * over (head, query block) items only, and no chain depends on the blocking, so
 * results depend on neither the ISA nor the thread count, and a decoded token's
 * output equals its row of the full forward pass. Every linear runs through ork_linear_apply (linear.h), which adds its
 * bias when it has one.
 *
 * Linear names and order: the forward model owns them. A layer's linears are
 * ORK_LAYER_LINEARS in the order of ork_layer_linear_names (the GGUF tensor
 * stems attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down); the
 * model's linears are every layer's in that order, layer by layer, then the
 * output head: index i of ork_model_linear, named by ork_model_linear_name
 * ("blk.<layer>.<stem>.weight", "output.weight"). The binding exports this
 * order; imatrix results, NPU routing and FFN settings are keyed by it.
 * Architectures that store some of these fused (phi3's attn_qkv and gate+up
 * ffn_up) are split into them when loaded (orkpy/formats/arch.py), so the order and
 * the names are the same for every architecture.
 */
#ifndef ORK_MODEL_H
#define ORK_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "act.h"
#include "linear.h"
#include "status.h"

typedef enum { ORK_ROPE_NORM = 0, ORK_ROPE_NEOX = 2 } ork_rope_type;

struct ork_ffn_params;
struct ork_ffn_stats;

typedef struct ork_layer {
    const float *attn_norm, *ffn_norm;
    const float *q_norm, *k_norm; /* (head_dim) or NULL */
    const float *post_attn_norm, *post_ffn_norm; /* (n_embd) or NULL: norm of the block output before the add */
    size_t n_swa;                 /* 0: full causal attention; else the sliding window (see above) */
    float rope_base, rope_freq_scale; /* > 0: this layer's RoPE base / scale; 0: the model's */
    ork_linear wq, wk, wv, wo, w_gate, w_up, w_down;
    /* optional: run the FFN on the NPU chain model (ffn_chain.h) instead of per-op */
    const struct ork_ffn_params *ffn;
    /* optional: collect prep-pass statistics of the per-op FFN */
    struct ork_ffn_stats *ffn_stats;
    /* optional online rotation of w_down's input (QuaRot; orkpy/runtime/rotate.py): each token's n_ff values
     * are multiplied by kron(down_rot, H_m) before w_down, down_rot (down_rot_p x down_rot_p,
     * row-major; it carries the normalization) and H_m the unnormalized Sylvester Hadamard matrix of
     * order m = n_ff / down_rot_p, a power of two (a fast Walsh-Hadamard transform); w_down holds the
     * weight rotated to match. NULL: off. The fused FFN chain (ffn) does not apply it: both is an error. */
    const float *down_rot;
    size_t down_rot_p;
    /* optional online rotation of the block inputs (orkpy/runtime/rotate.py, placement "online": the
     * architectures whose post-norms keep a rotation out of the residual stream, Gemma 2/3): the
     * outputs of attn_norm and ffn_norm (n_embd values per token) are multiplied by
     * kron(norm_rot, H_m) exactly as down_rot multiplies w_down's input (m = n_embd / norm_rot_p, a
     * power of two), before wq/wk/wv and before w_gate/w_up (or the fused FFN chain, which receives
     * the rotated input); the weights hold the matching rotation. NULL: off. */
    const float *norm_rot;
    size_t norm_rot_p;
} ork_layer;

#define ORK_DOWN_ROT_MAX_P 256

typedef struct ork_model {
    size_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot;
    float rope_base, rope_freq_scale, norm_eps;
    ork_rope_type rope_type;
    ork_act act;                  /* FFN gate activation (act.h); 0 = SiLU */
    float embd_scale;             /* > 0: embeddings multiplied by it; 0: not scaled */
    float attn_scale;             /* > 0: attention score scale; 0: 1/sqrt(head_dim) */
    float attn_softcap;           /* > 0: attention logit soft-capping; 0: off */
    float final_softcap;          /* > 0: output logit soft-capping; 0: off */
    float rope_attn_factor;       /* > 0: RoPE cos/sin multiplier; 0: 1 */
    const float *rope_freqs;      /* (n_rot/2) RoPE frequency divisors, or NULL */
    size_t n_ctx_max;             /* > 0: longest chunk the description is valid for; 0: any */
    const float *tok_embd; /* (n_vocab, n_embd); NULL: the rows of `output` (a tied head), dequantized
                            * (ork_linear_row): a tied model stores its table once, packed */
    const float *out_norm;
    ork_linear output;
    const ork_layer *layers;
} ork_model;

#define ORK_MODEL_MAX_LAYERS 4096
#define ORK_LAYER_LINEARS 7
extern const char *const ork_layer_linear_names[ORK_LAYER_LINEARS];
/* linear j (0 <= j < ORK_LAYER_LINEARS) of a layer, in the order above */
ork_linear *ork_layer_linear(ork_layer *L, int j);
/* the model's linears: n_layer * ORK_LAYER_LINEARS + 1 */
size_t ork_model_linear_count(size_t n_layer);
/* linear i of a model with these layers and output head (layers, then output), or NULL past the end */
ork_linear *ork_model_linear(ork_layer *layers, size_t n_layer, ork_linear *output, size_t i);
/* its tensor name into buf (at most len bytes, NUL included); 0, or -1 past the end */
int ork_model_linear_name(size_t n_layer, size_t i, char *buf, size_t len);

/* Checks every dimension and pointer of a model description. */
ork_status ork_model_check(const ork_model *m, ork_err *err);

/* logits: (T - first) x n_vocab float32. */
ork_status ork_model_forward(const ork_model *m, const int32_t *tokens, size_t T, size_t first, float *logits,
                             int nthreads, ork_err *err);

/* The forward pass from hidden rows instead of tokens (a layer-by-layer calibration, the
 * quantization recipe's streamed engine): x (T x n_embd) holds the rows entering layer 0 at
 * positions 0..T-1; the first `layers` layers (0..n_layer) run on them exactly as
 * ork_model_forward runs them (the same layer function on the same rows: bit for bit, and every
 * statistics hook of those layers' linears collects as it does there), the result written back
 * into x only on success; with logits non-NULL the head then gives (T - first) x n_vocab
 * logits of rows first..T-1 (the output linear's hooks see those rows). A model built only to
 * run its layers may carry any head of the right width (e.g. one row: n_vocab = 1). */
ork_status ork_model_forward_hidden(const ork_model *m, float *x, size_t T, size_t layers, size_t first,
                                    float *logits, int nthreads, ork_err *err);

/* ------------------------------------------------------ decode session --
 * A KV-cached decode session: tokens are appended at positions pos..pos+n-1
 * (pos = the number of tokens the session holds), a prompt as one batch, then
 * one token per call. Per layer the session keeps the keys (after k_norm and
 * RoPE) and the values of every position it holds, float32:
 *   K cache of layer l: n_ctx rows of n_head_kv * head_dim floats, row p the
 *   key of position p, head h at offset h * head_dim (the layout of the
 *   forward pass's k); the V cache the same.
 * Caches and scratch (for n_batch tokens per step) are allocated once by
 * ork_session_new; an eval of n tokens runs in steps of at most n_batch.
 * Arithmetic: the layer function of ork_model_forward itself (one code path):
 * RoPE at the absolute positions, the query at position p attending to the
 * cached keys 0..p (the layer's sliding window, soft-cap and scale as
 * above), every linear through ork_linear_apply (M = the step's tokens, 1 when
 * decoding). So the logits of position p equal row p of
 * ork_model_forward(tokens[0..T), first = 0) bit for bit whenever a linear's
 * output row depends only on its input row -- the F32 path and the packed
 * path with per-token or static activations (act.prefix counting absolute
 * positions: a step at pos quantizes its rows p < act.prefix per token);
 * dynamic per-tensor scales span one call's rows (a step here, the whole
 * chunk there), so that mode differs. No thread count changes a bit.
 * The model must outlive the session and keep its dimensions (its linears
 * may be replaced between calls). The session records the id of every
 * position it holds (ork_session_tokens) in the same call that fills its
 * caches, so the ids and the caches are one state. A session is not
 * thread-safe: runtime.h's ork_runtime_session_* take the model's lock. */
typedef struct ork_session ork_session;

/* n_ctx >= 1 positions (at most the model's n_ctx_max when it sets one), n_batch >= 1
 * tokens per step (capped at n_ctx). *out = NULL on failure. */
ork_status ork_session_new(const ork_model *m, size_t n_ctx, size_t n_batch, ork_session **out, ork_err *err);
void ork_session_free(ork_session *s);
size_t ork_session_pos(const ork_session *s);
size_t ork_session_n_ctx(const ork_session *s);
/* copies the ids of positions 0..pos-1 (the tokens the caches hold, in their order) to out, which holds
 * n_ctx ids; returns pos */
size_t ork_session_tokens(const ork_session *s, int32_t *out);
/* forget every position >= pos (pos <= the current position): the next eval appends at pos */
ork_status ork_session_rewind(ork_session *s, size_t pos, ork_err *err);
/* Append n >= 1 tokens. logits: n_vocab floats (the last token's) or, with
 * all_logits, n x n_vocab (every appended token's). pos + n > n_ctx is
 * ORK_EINVAL naming n_ctx. On any error the session is as before the call. */
ork_status ork_session_eval(ork_session *s, const int32_t *tokens, size_t n, int all_logits, float *logits,
                            int nthreads, ork_err *err);

/* Negative log-likelihood of targets under log_softmax(logits) per row, as
 * llama-perplexity: nll = -(l[t] - max - log(sum exp(l - max))), the sum in double
 * (one row's sum in order on one thread: the result never depends on nthreads; <= 0: all cores). */
ork_status ork_nll_rows(const float *logits, size_t rows, size_t n_vocab, const int32_t *targets, double *nll,
                        int nthreads, ork_err *err);

#endif
