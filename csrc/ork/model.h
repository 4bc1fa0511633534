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
 * count. Linear layers of the packed kinds use ork_matmul_f32 (pack.h).
 */
#ifndef ORK_MODEL_H
#define ORK_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

typedef enum { ORK_ROPE_NORM = 0, ORK_ROPE_NEOX = 2 } ork_rope_type;

typedef enum { ORK_LIN_F32 = 0, ORK_LIN_PACKED = 1 } ork_lin_path;

/* An external int8 matmul for a packed linear (an NPU backend):
 * acc (M, N) int32 = xq (M rows of K values, row stride ldq >= K) times the
 * linear's int8 weight values. The fused FFN chain (ffn_chain.c) uses it too. */
typedef ork_status (*ork_int_mm_fn)(void *ctx, const int8_t *xq, size_t M, size_t ldq, int32_t *acc, ork_err *err);

typedef struct ork_linear {
    ork_lin_path path;
    size_t N, K;
    const float *w;        /* ORK_LIN_F32: (N, K) row-major */
    ork_kind kind;         /* ORK_LIN_PACKED: */
    const void *store;
    const float *bscale;
    int per_tensor_act;
    /* optional importance statistics: when x2_sum is set, every application
     * adds sum over rows of x[m][k]^2 to x2_sum[k] (double, rows in order)
     * and the row count to *x2_count -- llama.cpp's imatrix in_sum2 / counts */
    double *x2_sum;
    uint64_t *x2_count;
    /* optional (ORK_LIN_PACKED only): when int_mm is set, the int8 matmul
     * runs there instead of the CPU kernels; activation quantization and the
     * float scaling ((float)acc * a[m]) * bscale[n] are the same, so the
     * output is bit-identical whenever the int32 accumulators are. */
    ork_int_mm_fn int_mm;
    void *int_mm_ctx;
} ork_linear;

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

/* Checks every dimension and pointer of a model description. */
ork_status ork_model_check(const ork_model *m, ork_err *err);

/* logits: (T - first) x n_vocab float32. */
ork_status ork_model_forward(const ork_model *m, const int32_t *tokens, size_t T, size_t first, float *logits,
                             int nthreads, ork_err *err);

/* Negative log-likelihood of targets under log_softmax(logits) per row, as
 * llama-perplexity: nll = -(l[t] - max - log(sum exp(l - max))), the sum in double. */
ork_status ork_nll_rows(const float *logits, size_t rows, size_t n_vocab, const int32_t *targets, double *nll,
                        ork_err *err);

/* y (M, N) = x (M, K) W^T for a linear layer on its path */
ork_status ork_linear_apply(const ork_linear *l, const float *x, size_t M, float *y, int nthreads, ork_err *err);

#endif
