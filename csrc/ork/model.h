/* model.h - a float32 forward pass for Llama- and Qwen3-architecture models,
 * batched over one chunk of tokens (prefill style, causal, positions 0..T-1),
 * every linear layer on its own weight path.
 *
 * Arithmetic (float32 activations throughout):
 *   x = tok_embd[tokens]
 *   per layer:  h = rmsnorm(x) * attn_norm
 *               q = h Wq^T, k = h Wk^T, v = h Wv^T          (linear paths)
 *               qwen3: q, k per-head rmsnorm * q_norm / k_norm
 *               RoPE on q, k (NORM: pairs (2i, 2i+1); NEOX: pairs (i, i + n_rot/2)),
 *                 theta_i = pos * base^(-2i/n_rot), first n_rot dims of each head
 *               attention per head (grouped KV heads), scale 1/sqrt(head_dim), causal
 *               x += attn Wo^T
 *               h = rmsnorm(x) * ffn_norm;  x += (silu(h Wg^T) * (h Wu^T)) Wd^T
 *   logits = (rmsnorm(x) * out_norm) Wout^T   for rows first..T-1 only
 * rmsnorm(v) = v * (1 / sqrt(mean(v^2) + eps)), the mean accumulated in double.
 * Float dot products use a fixed 8-lane accumulation order and work is split
 * over output columns / heads only, so results do not depend on the thread
 * count. Every linear runs through ork_linear_apply (linear.h).
 *
 * Linear names and order: the forward model owns them. A layer's linears are
 * ORK_LAYER_LINEARS in the order of ork_layer_linear_names (the GGUF tensor
 * stems attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down); the
 * model's linears are every layer's in that order, layer by layer, then the
 * output head: index i of ork_model_linear, named by ork_model_linear_name
 * ("blk.<layer>.<stem>.weight", "output.weight"). The binding exports this
 * order; imatrix results, NPU routing and FFN settings are keyed by it.
 */
#ifndef ORK_MODEL_H
#define ORK_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "linear.h"
#include "status.h"

typedef enum { ORK_ROPE_NORM = 0, ORK_ROPE_NEOX = 2 } ork_rope_type;

struct ork_ffn_params;
struct ork_ffn_stats;

typedef struct ork_layer {
    const float *attn_norm, *ffn_norm;
    const float *q_norm, *k_norm; /* (head_dim) or NULL */
    ork_linear wq, wk, wv, wo, w_gate, w_up, w_down;
    /* optional: run the FFN on the NPU chain model (ffn_chain.h) instead of per-op */
    const struct ork_ffn_params *ffn;
    /* optional: collect prep-pass statistics of the per-op FFN */
    struct ork_ffn_stats *ffn_stats;
} ork_layer;

typedef struct ork_model {
    size_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot;
    float rope_base, rope_freq_scale, norm_eps;
    ork_rope_type rope_type;
    const float *tok_embd; /* (n_vocab, n_embd) */
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

/* Negative log-likelihood of targets under log_softmax(logits) per row, as
 * llama-perplexity: nll = -(l[t] - max - log(sum exp(l - max))), the sum in double. */
ork_status ork_nll_rows(const float *logits, size_t rows, size_t n_vocab, const int32_t *targets, double *nll,
                        ork_err *err);

#endif
