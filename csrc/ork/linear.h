/* linear.h - one linear layer y = x W^T on its weight path: the unit the
 * forward pass (model.c) and the fused FFN chain (ffn_chain.c) both apply
 * their linears through.
 *
 * Paths:
 *   ORK_LIN_F32     W float32 (N, K) row-major; y = x W^T by the float32 GEMM
 *                   (gemm_f32.h): each y[m][n] one chain of fused multiply-adds
 *                   over k in order from +0.0f, so neither the ISA (scalar
 *                   fmaf, AVX2, NEON), the blocking nor the thread count
 *                   changes a bit; the pool splits over output columns.
 *   ORK_LIN_PACKED  W a packed store of a registered kind (pack.h, quant.h);
 *                   activations quantized to int8 in the linear's activation
 *                   spec `act` (actspec.h: a registered mode, its static range,
 *                   prefix and outlier channels), int32 accumulation on the CPU
 *                   kernels or on an external backend (int_mm, e.g. an NPU),
 *                   y[m][n] = ork_dequant_acc(acc[m][n], a[m], bscale[n])
 *                   on both, so the output is bit-identical whenever the
 *                   int32 accumulators are.
 * Importance statistics: when x2_sum is set, every ork_linear_apply adds
 * sum over rows of x[m][k]^2 to x2_sum[k] (double, rows in order) and the row
 * count to *x2_count -- llama.cpp's imatrix in_sum2 / counts.
 * Input Gram matrix: when xx_sum is set (K x K doubles, row-major), every
 * ork_linear_apply takes the call's rows in blocks of ORK_GRAM_ROWS (the last
 * one shorter) and, per block, adds to xx_sum[i * K + j] for every j >= i the
 * float32 sum over the block's rows in order, as the float32 GEMM makes it
 * (gemm_f32.h: c_0 = +0, c_{r+1} = fmaf(x[r][i], x[r][j], c_r)), converted to
 * double; the row count goes to *xx_count, the lower triangle is never
 * written. float32 inside a block (the GEMM's speed: the Gram matrix was the
 * largest stage of a calibrated quantization in double), double across
 * blocks (thousands of rows); no ISA or thread count changes a bit. The
 * Hessian of GPTQ's rounding (orkpy.quantization.gptq).
 *
 * Activation modes of a packed linear (on the CPU kernels and through int_mm
 * alike, so an external backend stays bit-identical): the built-in rows of the
 * mode registry (actspec.h) and the spec's fields, l->act.*:
 *   per token      the default: one dynamic scale per row;
 *   per tensor     one dynamic scale for the M rows of a call;
 *   static         act.clip > 0: one fixed range for every call (pack.h:
 *                  a = act.clip/127, |x| beyond act.clip saturates at +-127),
 *                  calibrated once -- what lets the NPU chain matmuls without
 *                  a host round trip to measure the input;
 *   prefix         act.prefix = p > 0 (with per tensor or static): the first p
 *                  rows of every call are quantized per token (and left out
 *                  of a per-tensor absmax). The forward pass calls each block
 *                  linear with the sequence's positions 0..T-1 as rows, so these
 *                  are the first p positions -- BOS and the attention sink, whose
 *                  massive activations no range shared with the other tokens
 *                  serves; on a device they are computed once, at prefill
 *                  (PrefixQuant's observation).
 *   outliers       act.n_outliers > 0 (with any mode; per_token_outliers is the
 *                  per-token mode whose channels come from the calibration):
 *                  the input channels act.outliers[0..n) (strictly increasing,
 *                  < K) are taken out of
 *                  the int8 product (their values set to 0 before the scale is
 *                  measured and the row quantized) and computed in float:
 *                    y[m][n] = int8 part + (sum_j x[m][o_j] * w[n][o_j]) * bscale[n]
 *                  with w the int8 weight value (ork_pack_value), the sum in
 *                  j order from 0.0f, multiplies and adds rounded apart (no
 *                  FMA). LLM.int8()'s decomposition with the linear's own
 *                  weights, so only the activations' treatment changes. NPU
 *                  cost: the int8 matmul keeps its shape; the host adds an
 *                  M x n x N float product (and reads n weight columns) per
 *                  linear, and the input must come back to the host.
 * Group-wise scales (group > 0, pack.h "Group-wise scales"): bscale holds N x G
 * entries and the output is ork_matmul_q8_grouped's; the int8 activations are
 * the same. With an external matmul (int_mm) the backend returns the per-group
 * partial sums and the output is made from them with the same arithmetic
 * (bit-identical whenever the partials are); not with outlier channels: ORK_EINVAL.
 * Affine groups (boffset, affine.h; a grouped w4a4 / w4a8 weight): after the product
 * above, on either path, y gets the offsets' term of affine.h from the same int8
 * activations and scales (ork_matmul_add_offsets).
 * Activation statistics: when act_stats is set, every ork_linear_apply adds
 * its input to them (ork_act_stats below), before any quantization.
 * Input capture: when cap is set, every ork_linear_apply appends its M input
 * rows to cap (row *cap_used on, then *cap_used += M), before any use; rows
 * beyond cap_rows are refused (ORK_EINVAL) and nothing is appended.
 */
#ifndef ORK_LINEAR_H
#define ORK_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "actspec.h"
#include "quant.h"
#include "status.h"

#define ORK_GRAM_ROWS 256 /* rows per float32 block of the input Gram matrix */

typedef enum { ORK_LIN_F32 = 0, ORK_LIN_PACKED = 1 } ork_lin_path;

/* Histogram of |x| for calibrating static ranges: bin 0 holds |x| <
 * 2^ORK_ASTATS_EMIN (zeros included), the last bin |x| >= 2^ORK_ASTATS_EMAX,
 * and in between ORK_ASTATS_SUB bins per octave, bin edges 2^e * (1 + s/SUB)
 * (the float's exponent and top mantissa bits: ork_act_stats_bin). Each bin
 * keeps its count and the sums of |x| and x^2 (double), so the error of a
 * clipped range is exact for bins above it. Non-finite values are not
 * counted. */
#define ORK_ASTATS_SUB 64
#define ORK_ASTATS_EMIN (-20)
#define ORK_ASTATS_EMAX 20
#define ORK_ASTATS_BINS (2 + (ORK_ASTATS_EMAX - ORK_ASTATS_EMIN) * ORK_ASTATS_SUB)

typedef struct ork_act_stats {
    size_t skip_rows;          /* set by the caller: the first skip_rows rows of each call count in ch_absmax only */
    uint64_t rows;             /* rows counted */
    uint64_t n_clipped;        /* values quantized with act.clip (static linears) and |x| > act.clip */
    float absmax;              /* max |x| */
    float *ch_absmax;          /* (K): max |x| per input channel, every row (caller-owned, zeroed) */
    uint64_t count[ORK_ASTATS_BINS];
    double sum[ORK_ASTATS_BINS], sum2[ORK_ASTATS_BINS];
} ork_act_stats;

/* The histogram bin of |v| (v finite) and the lower edge of a bin (bin 0: 0). */
int ork_act_stats_bin(float v);
double ork_act_stats_edge(int bin);

/* Add the rows of x (M x K, row-major) to s as a float linear's hook adds its
 * calls' inputs (no clip, no outlier channels): the rows in calls of calls[c]
 * rows each (sum = M), the first s->skip_rows rows of each call counted in
 * ch_absmax only. With divisor (K) non-NULL each value is x[m][k] / divisor[k]
 * (float division) before it is counted; divisor entries must be nonzero.
 * ORK_EINVAL when the calls do not sum to M, ORK_ENOMEM. */
ork_status ork_act_stats_add_rows(ork_act_stats *s, const float *x, size_t M, size_t K, const size_t *calls,
                                  size_t n_calls, const float *divisor, ork_err *err);

/* An external int8 matmul for a packed linear (an NPU backend):
 * acc (M, N) int32 = xq (M rows of K values, row stride ldq >= K) times the
 * linear's int8 weight values; for a grouped linear acc (G, M, N), G =
 * ceil(K / group), block i the sums over group i's inputs (ork_matmul_int_grouped's
 * partials), which the linear scales and adds in group order as the CPU path does. */
typedef ork_status (*ork_int_mm_fn)(void *ctx, const int8_t *xq, size_t M, size_t ldq, int32_t *acc, ork_err *err);

typedef struct ork_linear {
    ork_lin_path path;
    size_t N, K;
    const float *w;        /* ORK_LIN_F32: (N, K) row-major */
    ork_kind kind;         /* ORK_LIN_PACKED: */
    const void *store;
    const float *bscale;
    ork_act_spec act;      /* ORK_LIN_PACKED: the activation spec (actspec.h; ORK_ACT_SPEC_INIT per token) */
    double *x2_sum;        /* optional importance statistics (see above) */
    uint64_t *x2_count;
    ork_int_mm_fn int_mm;  /* optional (ORK_LIN_PACKED): the int8 matmul runs there */
    void *int_mm_ctx;
    const float *bias;     /* optional (N): ork_linear_apply adds it to every output row, on every path */
    ork_act_stats *act_stats; /* optional activation statistics (see above) */
    double *xx_sum;        /* optional input Gram matrix, upper triangle (see above) */
    uint64_t *xx_count;
    size_t group;          /* ORK_LIN_PACKED: 0 per-channel bscale (N); else group-wise bscale (N x G), pack.h */
    const float *boffset;  /* optional (ORK_LIN_PACKED, grouped): the affine groups' offsets (N x G), affine.h */
    float *cap;            /* optional input capture (see above): room for cap_rows rows of K, *cap_used filled */
    size_t cap_rows;
    size_t *cap_used;
} ork_linear;

/* The activation settings of a linear: a packed linear's spec valid for its K
 * (ork_act_spec_check) and its group size compatible with them; a float
 * linear's spec left zero (no clip, prefix, outliers) and no group size.
 * ORK_EINVAL naming the problem. */
ork_status ork_linear_check_act(const ork_linear *l, ork_err *err);

/* row n of the linear's weight as float32 (K values): the F32 row, or the packed row dequantized,
 * out[k] = (float)ork_pack_value(n, k) * bscale[n] (group-wise: the scale of k's group; affine groups:
 * then + the group's offset, affine.h) -- a tied
 * model's embedding lookup from its packed head. n < N. */
void ork_linear_row(const ork_linear *l, size_t n, float *out);

/* y (M, N) float32 = x (M, K) W^T on the linear's path (see above), then
 * y[m][n] += bias[n] when the linear has a bias (after the product, so the
 * product itself is the same with or without one). */
ork_status ork_linear_apply(const ork_linear *l, const float *x, size_t M, float *y, int nthreads, ork_err *err);

/* The int8 matmul of a packed linear: acc (M, N) int32 for int8 activations
 * xq (M rows of K values, stride K), on its external backend when int_mm is
 * set, else the CPU kernels. No importance statistics, no bias. */
ork_status ork_linear_int(const ork_linear *l, const int8_t *xq, size_t M, int32_t *acc, int nthreads, ork_err *err);

#endif
