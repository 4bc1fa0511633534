/* affine.h - affine int4 groups: a float16 scale and a float16 offset per group of a weight of
 * the NPU's uniform int4 kinds (w4a4, w4a8), so a group's 15 levels span its own [min, max]
 * instead of a range symmetric about zero (docs/w4a4.md "Affine groups").
 *
 * ---------------------------------------------------------------- contract --
 * Weights. Only the kinds whose codes the NPU's int4 mode multiplies (an 8-bit kind with
 * qmax 7: w4a4, w4a8) and only group-wise (0 < group < K, a multiple of 32: quant.h
 * ork_group_check). Row n, group i (columns [i*g, min(K, (i+1)*g))) has a scale s = scales[n*G+i]
 * >= 0 and an offset o = offsets[n*G+i], both float16 values; codes c in [-8, 7], all 16 of the
 * int4 mode's codes (quant.h ork_kind_qmin: the kinds store -8, the symmetric quantizers never use it);
 *     value = c * s + o           (float32: the product rounded, then the sum; no FMA).
 *
 * The search (ork_quant_segment_affine; one scalar code for every ISA, so every build gives
 * the same bytes). For the segment's values x (float32, finite) with lo = min x, hi = max x,
 * and an importance im[k] (the imatrix entries of its columns, or 1 without one), each clip
 * ratio r_t = 1 - t / 40 (t = 0 .. ORK_AFFINE_GRID_N - 1, float32) gives a candidate
 *     a = lo * r, b = hi * r                       (float32)
 *     s = f16((b - a) / 15), o = f16(a + 8 * s)    (float32, then the nearest float16, ties even:
 *                                                   code -8 at a, code 7 at b)
 *     inv = s > 0 ? 1 / s : 0                      (float32)
 *     c[k] = clamp(round_half_away((x[k] - o) * inv), -8, 7)   (float32: the difference, the product)
 *     E = sum_k im[k] * d[k]^2, d[k] = (c[k] * s + o) - x[k]   (d in float32 as the value above,
 *                                                              its square and product in double,
 *                                                              summed in k order in double)
 * and the first candidate with the smallest E is kept. A candidate whose (b - a) / 14 or
 * (a + b) / 2 overflows float16 (|v| >= 65520) is an error naming the row and group (no float16
 * reaches it; the symmetric kinds' rule, quant.h). A constant segment gets s = 0, o = f16(x).
 * Measured (SmolLM2-135M rotated, GPTQ, group 32, float activations, mean KL on wikitext): symmetric
 * [-7, 7] 0.215, affine [-7, 7] 0.170, affine [-8, 7] 0.145 (docs/results/w4a4.md).
 *
 * The product (pack.h matmul with offsets; linear.h). With int8 activation codes xq (M, Kp) and
 * their scales a (per row, or per row and group: actspec.h "group"), the symmetric product of
 * pack.h "Group-wise scales" y[m][n] gets, after it, the offsets' term
 *     S_i[m] = sum_{k in group i} xq[m][k]        (int32, exact; padding columns hold 0)
 *     u_i[m] = a_i[m] * (float)S_i[m]             (float32)
 *     y[m][n] = y[m][n] + (t_0 + t_1 + ... + t_{G-1}),  t_i = u_i[m] * o[n*G+i]
 * (float32, the t_i added left to right from t_0, then added to y once; no FMA), so every ISA and
 * thread count gives the same bits. On the NPU the codes are multiplied as for symmetric weights
 * (the int4 mode knows nothing of the offsets); S_i is a sum the host forms from the activation
 * codes it already holds, one add per activation.
 *
 * Never aborts: ORK_EINVAL / ORK_ENONFINITE naming the argument, ORK_ENOMEM.
 */
#ifndef ORK_AFFINE_H
#define ORK_AFFINE_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

#define ORK_AFFINE_GRID_N 20 /* clip ratios 1, 0.975, ..., 0.525 */
#define ORK_AFFINE_QMAX 7    /* codes in [-8, 7]: the int4 mode's */
#define ORK_AFFINE_QMIN (-8)

/* ORK_EINVAL unless `kind` takes affine groups (an 8-bit kind with qmax 7) and 0 < group < K. */
ork_status ork_affine_check(ork_kind kind, size_t K, size_t group, ork_err *err);

/* One segment's (scale, inverse, offset) by the search above: x the n values at columns
 * [col0, col0 + n) of row `row` (for messages), im their importance or NULL. */
ork_status ork_quant_segment_affine(const float *x, const float *im, size_t n, size_t row, size_t col0, size_t group,
                                    float *scale, float *inv, float *offset, ork_err *err);

/* The code of x for a segment's (inv, offset): clamp(round_half_away((x - o) * inv), -8, 7). */
float ork_affine_code(float x, float inv, float offset);

/* Round-to-nearest affine quantization of float32 w (N, K): int8 codes (N, K), scales and
 * offsets (N, G) each, p->kind / imatrix / group / nthreads as in ork_quantize (p->sr must be 0;
 * the clip grid is the search's own). ORK_ENONFINITE naming [row, col] for a non-finite weight. */
ork_status ork_quantize_affine(const float *w, size_t N, size_t K, const ork_quant_params *p, int8_t *codes,
                               float *scales, float *offsets, ork_err *err);

/* Every offset finite and a float16 value (float16-bounded); else `code` naming [n, i]. */
ork_status ork_affine_check_offsets(const float *offsets, size_t N, size_t G, ork_status code, ork_err *err);

/* y (M, N) += the offsets' term above: xq (M rows, stride ldq >= K, zero-padded to whole groups),
 * ascale (G, M) group-major when act_groups, else (M). */
ork_status ork_matmul_add_offsets(const float *offsets, size_t group, size_t N, size_t K, const int8_t *xq, size_t ldq,
                                  const float *ascale, int act_groups, size_t M, float *y, int nthreads, ork_err *err);

#endif /* ORK_AFFINE_H */
