/* ffn_chain.h - an exact CPU model of the RK3588 NPU's fused int8 SwiGLU
 * chain, its ablations, and the statistics of the calibration ("prep") pass.
 *
 * The gate activation is the model's (act.h: SiLU, or GELU-tanh for the
 * Gemma family, GeGLU); "silu" below (and in the mode names
 * exact_silu, fp32_silu_out, the |silu| statistics) stands for that activation,
 * act(z) = ork_act_apply(p->act, z). Everything else is the same for both: the
 * LUT spans [-gmax, gmax] with 1024 nearest entries and its int16 scale is
 * max |act| over the table, so a GELU table stores the same way (GELU's
 * negative lobe is smaller, min -0.170 at z = -0.75, and decays to 0 by
 * z = -4, where SiLU's is -0.278 at z = -1.28 with a slow tail; the one int8
 * output scale, about gmax / 110, gives GELU's lobe 0.17 * 110 / gmax levels).
 *
 * Notation per token t and FFN channel n (D = n_embd, F = n_ff):
 *   hq[t], a[t]   int8 activations of the normed input h and their scale, in the gate
 *                 linear's activation spec (actspec.h, linear.h: per token a = absmax/127 by
 *                 default, per tensor, static act.clip/127, per-token prefix; round half away)
 *   G[t][n]       = hq . Wg[n] (int32, ork_linear_int), g = ork_dequant_acc(G, a[t], bs_g[n])
 *   U[t][n]       = hq . Wu[n] (int32),                 u = ork_dequant_acc(U, a[t], bs_u[n])
 *   (g and u are bit-identical to the float outputs of the per-op path.)
 *
 * LUT SiLU (modes fused, fp32_silu_out, asym_zero_point, per_channel_out):
 *   1024 int16 entries, idx = clamp(round_half_away(g * inv_step) + 512, 0, 1023),
 *   inv_step = 1 / lut_step (float), no interpolation (nearest entry);
 *   lut[i] = round_half_away(silu(x_i) / lut_scale), x_i = (i - 512) * lut_step,
 *   lut_scale = max_i |silu(x_i)| / 32767; silu_lut(g) = (float)lut[idx] * lut_scale.
 *   lut_step comes from the prep pass: gmax / 511, so the table spans the layer's
 *   gate range.
 *
 * fused (what the NPU runs):
 *   sq = clamp(round_half_away(silu_lut(g) / s_scale), -127, 127)     int8, ONE scale per tensor
 *   uq = clamp(round_half_away(u / u_scale), -127, 127)               int8, per tensor
 *   P  = sq * uq                                                       int32 (|P| <= 16129)
 *   pq = clamp(round_half_away((float)P * m), -127, 127), m = (s_scale * u_scale) / p_scale
 *   y  = ork_dequant_acc(pq . Wd[d], p_scale, bs_d[d])                 down projection, int32 acc
 *   NPU fusion: the gate/up matmuls, the per-channel dequantization, the LUT, the
 *   int8 conversions, the multiply and the requantization run on the NPU (CNA/CORE
 *   for the matmuls, DPU for scale/LUT/elementwise); the host quantizes h; the down
 *   projection is a second task. Every rounding above is half away from zero.
 * exact_silu (the sprinkle's exact path, host side): s = silu(g) in fp32,
 *   p = s * u (fp32), down projection with per-token int8 activations (ork_matmul_f32).
 * fp32_silu_out: p = silu_lut(g) * u in fp32, down as exact_silu.
 * exact_lut_input: sq from the exact fp32 silu(g) (no LUT), then as fused.
 * asym_zero_point: sq = clamp(round_half_away(silu_lut(g) / s_scale) + zp, -128, 127),
 *   P = (sq - zp) * uq, then as fused (s_scale = (smax - smin) / 255,
 *   zp = -128 - round_half_away(smin / s_scale)).
 * per_channel_out: s_scale per channel n (host-side), m[n] = (s_scale[n] * u_scale) / p_scale.
 * unfused: g and u rounded to fp16, s = fp16(silu(g)), p = fp16(s * u) (each op
 *   separately, round to nearest even), down as exact_silu.
 * clip_pct=P is fused with s_scale from the P-th percentile of |silu| (prep histogram).
 * split_product: sq, uq and P as fused, but P is never requantized: it is handed to the
 *   down task exactly, as two int8 digit planes
 *     hi = round_half_away(P / 128) in [-126, 126],  lo = P - 128 * hi in [-64, 64]
 *   (P = 128 hi + lo exactly), each multiplied by Wd as an int8 x int8 matmul with int32
 *   accumulators (|Yhi|, |Ylo| <= n_ff * 127 * 126), combined in 64 bits and scaled once:
 *     y = ((float)(128 * (int64)Yhi + Ylo) * (s_scale * u_scale)) * bs_d[d]
 *   No product scale exists (p_scale is not used), so the per-tensor product range that
 *   costs the fused chain most of its loss (measured on Gemma-3-270M: bench/real_quant.py)
 *   is gone. NPU cost: the down task runs on 2 M rows (the hi and lo planes stacked) and
 *   writes two int32 outputs the host (or the DPU) combines: 2x the down task's MACs and
 *   output traffic, nothing more on the gate/up task; in decode (M = 1) the down task is
 *   bound by its weight reads, which do not change.
 */
#ifndef ORK_FFN_CHAIN_H
#define ORK_FFN_CHAIN_H

#include <stddef.h>
#include <stdint.h>

#include "act.h"
#include "linear.h"
#include "status.h"

/* The modes; ork_ffn_mode_names[mode] is the name the binding and the Python
 * layer use (ork_ffn_mode_names[0] is NULL: 0 is no mode). */
typedef enum {
    ORK_FFN_FUSED = 1,
    ORK_FFN_EXACT_SILU = 2,
    ORK_FFN_FP32_SILU_OUT = 3,
    ORK_FFN_EXACT_LUT_INPUT = 4,
    ORK_FFN_ASYM_ZP = 5,
    ORK_FFN_PER_CHANNEL_OUT = 6,
    ORK_FFN_UNFUSED = 7,
    ORK_FFN_SPLIT_PRODUCT = 8,
} ork_ffn_mode;
#define ORK_FFN_MODE_COUNT 9
extern const char *const ork_ffn_mode_names[ORK_FFN_MODE_COUNT];
/* the mode named `name`, or 0 */
ork_ffn_mode ork_ffn_mode_find(const char *name);

#define ORK_FFN_LUT 1024
#define ORK_FFN_HIST 2560 /* |silu| histogram: 64 bins per octave over [2^-20, 2^20) */

typedef struct ork_ffn_params {
    ork_ffn_mode mode;
    ork_act act;              /* the gate activation (0 = SiLU): the model's, set by the binding */
    float lut_step, s_scale, u_scale, p_scale;
    int32_t zp;               /* asym_zero_point */
    const float *s_scale_ch;  /* per_channel_out: n_ff scales */
} ork_ffn_params;

typedef struct ork_ffn_stats {
    ork_act act;              /* the gate activation the statistics are of (0 = SiLU) */
    float gmax, smin, smax, umax, pmax;
    float *s_absmax_ch;       /* n_ff, max |silu(g)| per channel */
    uint64_t hist[ORK_FFN_HIST];
    uint64_t n;               /* values seen */
} ork_ffn_stats;

/* histogram bin of a positive value (0 for values below 2^-20) */
int ork_ffn_hist_bin(float v);
/* lower edge of a bin */
double ork_ffn_hist_edge(int bin);

/* Whether settings can run on these linears: a known mode and activation; gate, up, down
 * packed; lut_step, u_scale, p_scale (and s_scale, or s_scale_ch for
 * per_channel_out) positive and finite; zp in int8 for asym_zero_point; gate and up in
 * the same activation spec (they share hq) and without outlier channels (int8 only).
 * ORK_EINVAL naming the problem. */
ork_status ork_ffn_check(const ork_linear *gate, const ork_linear *up, const ork_linear *down, const ork_ffn_params *p,
                         ork_err *err);

/* The FFN of one layer on its chain: h (T, D) float -> y (T, D) float (not added to x).
 * Checks its arguments with ork_ffn_check. */
ork_status ork_ffn_chain(const ork_linear *gate, const ork_linear *up, const ork_linear *down, const ork_ffn_params *p,
                         const float *h, size_t T, float *y, int nthreads, ork_err *err);

/* The LUT of activation act for a step (1024 int16) and its output scale. */
void ork_ffn_make_lut(float lut_step, ork_act act, int16_t lut[ORK_FFN_LUT], float *lut_scale);

/* Accumulate statistics of the per-op FFN (g, u floats of T x F; activation s->act). */
void ork_ffn_stats_add(ork_ffn_stats *s, const float *g, const float *u, size_t T, size_t F);

#endif
