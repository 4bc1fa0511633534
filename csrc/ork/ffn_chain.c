/* ffn_chain.c - the fused int8 SwiGLU / GeGLU chain and its ablations (ffn_chain.h). */
#include "ffn_chain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pack.h"
#include "quant_scalar.h"

static inline float f16r(float x) { return (float)(_Float16)x; } /* round to fp16 (nearest even) */
static inline float clamp_i8(float v, float lo) { return v > 127.0f ? 127.0f : (v < lo ? lo : v); }

void ork_ffn_make_lut(float lut_step, ork_act act, int16_t lut[ORK_FFN_LUT], float *lut_scale) {
    float mx = 0.0f;
    for (int i = 0; i < ORK_FFN_LUT; i++) {
        float v = fabsf(ork_act_apply(act, (float)(i - 512) * lut_step));
        if (v > mx) mx = v;
    }
    float sc = mx > 0.0f ? mx / 32767.0f : 1.0f;
    for (int i = 0; i < ORK_FFN_LUT; i++)
        lut[i] = (int16_t)ork_round_half_away(ork_act_apply(act, (float)(i - 512) * lut_step) / sc);
    *lut_scale = sc;
}

static inline float act_lut(float g, float inv_step, const int16_t *lut, float lut_scale) {
    float r = ork_round_half_away(g * inv_step) + 512.0f;
    int idx = r < 0.0f ? 0 : (r > 1023.0f ? 1023 : (int)r);
    return (float)lut[idx] * lut_scale;
}

int ork_ffn_hist_bin(float v) {
    if (!(v >= 9.5367431640625e-07f)) return 0; /* 2^-20 */
    int e;
    float m = frexpf(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    int b = (e - 1 + 20) * 64 + (int)((m * 2.0f - 1.0f) * 64.0f);
    return b < 0 ? 0 : (b >= ORK_FFN_HIST ? ORK_FFN_HIST - 1 : b);
}

double ork_ffn_hist_edge(int bin) {
    return ldexp(1.0 + (double)(bin % 64) / 64.0, bin / 64 - 20);
}

void ork_ffn_stats_add(ork_ffn_stats *s, const float *g, const float *u, size_t T, size_t F) {
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < F; n++) {
            float gv = g[t * F + n], uv = u[t * F + n], sv = ork_act_apply(s->act, gv), pv = fabsf(sv * uv);
            if (fabsf(gv) > s->gmax) s->gmax = fabsf(gv);
            if (sv < s->smin) s->smin = sv;
            if (sv > s->smax) s->smax = sv;
            if (fabsf(uv) > s->umax) s->umax = fabsf(uv);
            if (pv > s->pmax) s->pmax = pv;
            if (s->s_absmax_ch && fabsf(sv) > s->s_absmax_ch[n]) s->s_absmax_ch[n] = fabsf(sv);
            s->hist[ork_ffn_hist_bin(fabsf(sv))]++;
            s->n++;
        }
}

const char *const ork_ffn_mode_names[ORK_FFN_MODE_COUNT] = {
    NULL, "fused", "exact_silu", "fp32_silu_out", "exact_lut_input", "asym_zero_point", "per_channel_out", "unfused",
    "split_product"};

ork_ffn_mode ork_ffn_mode_find(const char *name) {
    for (int i = 1; name && i < ORK_FFN_MODE_COUNT; i++)
        if (strcmp(name, ork_ffn_mode_names[i]) == 0) return (ork_ffn_mode)i;
    return (ork_ffn_mode)0;
}

static int pos(float v) { return v > 0.0f && isfinite(v); }

/* the activation modes that take no outlier channels (actspec.h registry), "'a', 'b' or 'c'", into buf */
static const char *modes_without_outliers(char *buf, size_t size) {
    const size_t n = ork_act_mode_count();
    size_t len = 0, last = n;
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!(ork_act_mode_get((int)i)->flags & ORK_ACTF_OUTLIERS)) last = i;
    for (size_t i = 0; i < n && len < size; i++) {
        const ork_act_mode_info *r = ork_act_mode_get((int)i);
        if (r->flags & ORK_ACTF_OUTLIERS) continue;
        int w = snprintf(buf + len, size - len, "%s'%s'", !len ? "" : i == last ? " or " : ", ", r->name);
        len += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

ork_status ork_ffn_check(const ork_linear *lg, const ork_linear *lu, const ork_linear *ld, const ork_ffn_params *p,
                         ork_err *err) {
    ork_status st0;
    if ((int)p->mode < 1 || (int)p->mode >= ORK_FFN_MODE_COUNT)
        return ork_err_set(err, ORK_EINVAL, "unknown FFN chain mode %d", (int)p->mode);
    if ((int)p->act < 0 || (int)p->act >= ORK_ACT_COUNT)
        return ork_err_set(err, ORK_EINVAL, "unknown FFN activation %d", (int)p->act);
    if (lg->path != ORK_LIN_PACKED || lu->path != ORK_LIN_PACKED || ld->path != ORK_LIN_PACKED)
        return ork_err_set(err, ORK_EINVAL, "the fused FFN chain needs packed gate, up and down weights");
    if (lg->act.n_outliers || lu->act.n_outliers) {
        char modes[160];
        return ork_err_set(err, ORK_EINVAL, "the fused FFN chain keeps no outlier channels apart (an int8-only path); "
                           "use act=%s with it", modes_without_outliers(modes, sizeof modes));
    }
    if (lg->act.group || lu->act.group || ld->act.group || lg->group || lu->group || ld->group)
        return ork_err_set(err, ORK_EINVAL, "the fused FFN chain takes per-channel weights with a scale per token "
                           "(no group-wise weight or activation scales)");
    if (lg->act.mode != lu->act.mode || lg->act.bits != lu->act.bits || lg->act.clip != lu->act.clip ||
        lg->act.prefix != lu->act.prefix)
        return ork_err_set(err, ORK_EINVAL, "gate and up share the chain input, so their activation modes must agree");
    if ((st0 = ork_linear_check_act(lg, err))) return st0;
    const int per_ch = p->mode == ORK_FFN_PER_CHANNEL_OUT;
    if (!pos(p->lut_step) || !(pos(p->s_scale) || per_ch) || !pos(p->u_scale) || !pos(p->p_scale))
        return ork_err_set(err, ORK_EINVAL, "FFN chain scales must be positive and finite (run the prep pass first)");
    if (per_ch && !p->s_scale_ch) return ork_err_set(err, ORK_EINVAL, "per_channel_out needs per-channel scales");
    if (p->zp < -128 || p->zp > 127) return ork_err_set(err, ORK_EINVAL, "zero point %d outside int8", (int)p->zp);
    return ORK_OK;
}

ork_status ork_ffn_chain(const ork_linear *lg, const ork_linear *lu, const ork_linear *ld, const ork_ffn_params *p,
                         const float *h, size_t T, float *y, int nthreads, ork_err *err) {
    ork_status st = ork_ffn_check(lg, lu, ld, p, err);
    if (st) return st;
    const size_t D = lg->K, F = lg->N;
    const size_t Dp = ork_pack_round32(D);
    const int split = p->mode == ORK_FFN_SPLIT_PRODUCT;
    int8_t *hq = malloc(T * Dp), *pq = malloc(T * F), *pl = split ? malloc(T * F) : NULL;
    float *a = malloc(T * sizeof(float)), *pf = malloc(T * F * sizeof(float));
    int32_t *G = malloc(T * F * sizeof(int32_t)), *U = malloc(T * F * sizeof(int32_t));
    int32_t *Y = malloc(T * ld->N * sizeof(int32_t)), *Y2 = split ? malloc(T * ld->N * sizeof(int32_t)) : NULL;
    if (!hq || !pq || !a || !pf || !G || !U || !Y || (split && (!pl || !Y2))) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory for the FFN chain (T = %zu)", T);
        goto done;
    }
    /* the chain input is quantized in the gate's activation spec (actspec.h: its mode, range and
     * prefix); gate and up share it, so their specs must agree (ork_ffn_check) */
    if ((st = ork_quantize_acts(h, T, D, Dp, &lg->act, hq, a, err))) goto done;
    /* compact the padded rows for ork_matmul_int (it pads itself) */
    for (size_t t = 1; t < T; t++) memmove(hq + t * D, hq + t * Dp, D);
    if ((st = ork_linear_int(lg, hq, T, G, nthreads, err))) goto done;
    if ((st = ork_linear_int(lu, hq, T, U, nthreads, err))) goto done;
    int16_t lut[ORK_FFN_LUT];
    float lut_scale;
    ork_ffn_make_lut(p->lut_step, p->act, lut, &lut_scale);
    const float inv_step = 1.0f / p->lut_step;
    const ork_act act = p->act;
    const int int_path = p->mode == ORK_FFN_FUSED || p->mode == ORK_FFN_EXACT_LUT_INPUT || p->mode == ORK_FFN_ASYM_ZP ||
                         p->mode == ORK_FFN_PER_CHANNEL_OUT || split;
    const float m = (p->s_scale * p->u_scale) / p->p_scale;
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < F; n++) {
            size_t i = t * F + n;
            float g = ork_dequant_acc(G[i], a[t], lg->bscale[n]);
            float u = ork_dequant_acc(U[i], a[t], lu->bscale[n]);
            switch (p->mode) {
            case ORK_FFN_EXACT_SILU: pf[i] = ork_act_apply(act, g) * u; break;
            case ORK_FFN_FP32_SILU_OUT: pf[i] = act_lut(g, inv_step, lut, lut_scale) * u; break;
            case ORK_FFN_UNFUSED: pf[i] = f16r(f16r(ork_act_apply(act, f16r(g))) * f16r(u)); break;
            default: break;
            }
            if (!int_path) continue;
            float s = (p->mode == ORK_FFN_EXACT_LUT_INPUT) ? ork_act_apply(act, g) : act_lut(g, inv_step, lut, lut_scale);
            float uq = clamp_i8(ork_round_half_away(u / p->u_scale), -127.0f);
            float mm = m;
            int32_t sq;
            if (p->mode == ORK_FFN_ASYM_ZP) {
                float q = ork_round_half_away(s / p->s_scale) + (float)p->zp;
                sq = (int32_t)clamp_i8(q, -128.0f) - p->zp;
            } else if (p->mode == ORK_FFN_PER_CHANNEL_OUT) {
                sq = (int32_t)clamp_i8(ork_round_half_away(s / p->s_scale_ch[n]), -127.0f);
                mm = (p->s_scale_ch[n] * p->u_scale) / p->p_scale;
            } else {
                sq = (int32_t)clamp_i8(ork_round_half_away(s / p->s_scale), -127.0f);
            }
            int32_t P = sq * (int32_t)uq;
            if (split) { /* P = 128 hi + lo exactly: two int8 digit planes */
                const int32_t hi = (int32_t)ork_round_half_away((float)P / 128.0f);
                pq[i] = (int8_t)hi;
                pl[i] = (int8_t)(P - 128 * hi);
                continue;
            }
            pq[i] = (int8_t)clamp_i8(ork_round_half_away((float)P * mm), -127.0f);
        }
    if (int_path) {
        if ((st = ork_linear_int(ld, pq, T, Y, nthreads, err))) goto done;
        if (split) {
            if ((st = ork_linear_int(ld, pl, T, Y2, nthreads, err))) goto done;
            const float su = p->s_scale * p->u_scale;
            for (size_t i = 0; i < T * ld->N; i++)
                y[i] = ((float)(128 * (int64_t)Y[i] + (int64_t)Y2[i]) * su) * ld->bscale[i % ld->N];
            goto done;
        }
        for (size_t t = 0; t < T; t++)
            for (size_t d = 0; d < ld->N; d++) y[t * ld->N + d] = ork_dequant_acc(Y[t * ld->N + d], p->p_scale, ld->bscale[d]);
    } else {
        st = ork_linear_apply(ld, pf, T, y, nthreads, err);
    }
done:
    free(hq); free(pq); free(pl); free(a); free(pf); free(G); free(U); free(Y); free(Y2);
    return st;
}
