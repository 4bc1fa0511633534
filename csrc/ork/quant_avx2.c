/* quant_avx2.c - AVX2 variants of the quant kernels, bit-identical to
 * quant_ref.c (proven by tests/c/test_quant.c and tests/test_quant.py).
 * Compiled with -mavx2 -mfma -ffp-contract=off (setup.py); selected at run
 * time by quant_ref.c (ork_quant_kernels_for) only when the CPU reports AVX2. */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __AVX2__
#error "quant_avx2.c must be compiled with -mavx2"
#endif
#include <immintrin.h>

#include "quant_scalar.h"

static int absmax_avx2(const float *x, size_t n, float *amax) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 fmax = _mm256_set1_ps(3.40282347e+38f);
    __m256 m = _mm256_setzero_ps();
    __m256 bad = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, fmax, _CMP_NLE_UQ)); /* > max or NaN */
        m = _mm256_max_ps(m, a);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float r = 0.0f;
    for (int i = 0; i < 8; i++)
        if (lanes[i] > r) r = lanes[i];
    int isbad = _mm256_movemask_ps(bad) != 0;
    for (; k < n; k++) {
        float a = fabsf(x[k]);
        if (!(a <= 3.40282347e+38f)) isbad = 1;
        if (a > r) r = a;
    }
    *amax = r;
    return isbad;
}

/* 16 int32 lanes (two vectors, in order) -> 16 bytes */
static inline __m128i pack16_u8(__m256i c0, __m256i c1) {
    __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xD8);
    return _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}
static inline __m128i pack16_s8(__m256i c0, __m256i c1) {
    __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xD8);
    return _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}

static inline __m256i nearest4_avx2(__m256 y, const ork_q4_grid *g) {
    __m256i c = _mm256_setzero_si256();
    for (int i = 0; i < g->nlev - 1; i++) {
        __m256 m = _mm256_cmp_ps(y, _mm256_set1_ps(g->thr[i]), _CMP_GT_OQ);
        c = _mm256_sub_epi32(c, _mm256_castps_si256(m));
    }
    return c;
}

static void codes4_rtn_avx2(const float *x, size_t n, float inv, const ork_q4_grid *g,
                            uint8_t *codes) {
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256i c0 = nearest4_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv), g);
        __m256i c1 = nearest4_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv), g);
        _mm_storeu_si128((__m128i *)(codes + k), pack16_u8(c0, c1));
    }
    for (; k < n; k++) codes[k] = (uint8_t)ork_q4_nearest(x[k] * inv, g);
}

static inline __m256 uniform_avx2(uint32_t row_key, uint32_t col) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i c = _mm256_add_epi32(_mm256_set1_epi32((int)col), lane);
    __m256i h = _mm256_add_epi32(_mm256_set1_epi32((int)row_key),
                                 _mm256_mullo_epi32(c, _mm256_set1_epi32((int)0x9e3779b1U)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x7feb352dU));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x846ca68bU));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    __m256 u = _mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8));
    return _mm256_mul_ps(u, _mm256_set1_ps(ORK_SR_UNIT));
}

static inline __m256i sr4_avx2(__m256 y, const ork_q4_grid *g, uint32_t row_key, uint32_t col) {
    const int top = g->nlev - 1;
    __m256 lo = _mm256_set1_ps(g->lev[0]);
    __m256 hi = _mm256_set1_ps(g->lev[1]);
    __m256i idx = _mm256_setzero_si256();
    for (int j = 1; j < g->nlev; j++) {
        __m256 m = _mm256_cmp_ps(y, _mm256_set1_ps(g->lev[j]), _CMP_GE_OQ);
        lo = _mm256_blendv_ps(lo, _mm256_set1_ps(g->lev[j]), m);
        hi = _mm256_blendv_ps(hi, _mm256_set1_ps(g->lev[j < top ? j + 1 : j]), m);
        idx = _mm256_sub_epi32(idx, _mm256_castps_si256(m));
    }
    __m256 p = _mm256_div_ps(_mm256_sub_ps(y, lo), _mm256_sub_ps(hi, lo));
    __m256 up = _mm256_cmp_ps(uniform_avx2(row_key, col), p, _CMP_LT_OQ);
    __m256i attop = _mm256_cmpeq_epi32(idx, _mm256_set1_epi32(top));
    __m256i upi = _mm256_andnot_si256(attop, _mm256_castps_si256(up));
    return _mm256_sub_epi32(idx, upi);
}

static void codes4_sr_avx2(const float *x, size_t n, float inv, const ork_q4_grid *g,
                           uint32_t row_key, uint32_t col0, uint8_t *codes) {
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        uint32_t c = col0 + (uint32_t)k;
        __m256i c0 = sr4_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv), g, row_key, c);
        __m256i c1 = sr4_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv), g, row_key, c + 8);
        _mm_storeu_si128((__m128i *)(codes + k), pack16_u8(c0, c1));
    }
    for (; k < n; k++) codes[k] = (uint8_t)ork_q4_sr(x[k] * inv, g, row_key, col0 + (uint32_t)k);
}

/* acc += im * (x - q)^2 over 8 elements, lanes (k..k+3) then (k+4..k+7) */
static inline __m256d werr_acc8(__m256d acc, __m256 x, __m256 q, const float *im) {
    __m256 d = _mm256_sub_ps(x, q);
    __m256 vim = _mm256_loadu_ps(im);
    __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(d));
    __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1));
    __m256d i0 = _mm256_cvtps_pd(_mm256_castps256_ps128(vim));
    __m256d i1 = _mm256_cvtps_pd(_mm256_extractf128_ps(vim, 1));
    acc = _mm256_add_pd(acc, _mm256_mul_pd(i0, _mm256_mul_pd(d0, d0)));
    acc = _mm256_add_pd(acc, _mm256_mul_pd(i1, _mm256_mul_pd(d1, d1)));
    return acc;
}

static __attribute__((noinline)) double werr4_avx2(const float *x, const float *im, size_t n, float inv, float s,
                         const ork_q4_grid *g) {
    const __m256 vinv = _mm256_set1_ps(inv), vs = _mm256_set1_ps(s);
    __m256d acc = _mm256_setzero_pd();
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 vx = _mm256_loadu_ps(x + k);
        __m256 y = _mm256_mul_ps(vx, vinv);
        __m256 lev = _mm256_set1_ps(g->lev[0]);
        for (int i = 0; i < g->nlev - 1; i++) {
            __m256 m = _mm256_cmp_ps(y, _mm256_set1_ps(g->thr[i]), _CMP_GT_OQ);
            lev = _mm256_blendv_ps(lev, _mm256_set1_ps(g->lev[i + 1]), m);
        }
        acc = werr_acc8(acc, vx, _mm256_mul_ps(lev, vs), im + k);
    }
    double a[4];
    _mm256_storeu_pd(a, acc);
    ork_werr4_range(a, x, im, k, n, inv, s, g);
    return ork_lanes_sum(a);
}

static inline __m256 round_half_away_avx2(__m256 y) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(y, t);
    t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one));
    t = _mm256_sub_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one));
    return t;
}
static inline __m256 clamp_avx2(__m256 v, float lim) {
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-lim)), _mm256_set1_ps(lim));
}

static void codes8_rtn_avx2(const float *x, size_t n, float inv, float lim, int8_t *codes) {
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256 q0 = clamp_avx2(round_half_away_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv)), lim);
        __m256 q1 = clamp_avx2(round_half_away_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv)), lim);
        _mm_storeu_si128((__m128i *)(codes + k),
                         pack16_s8(_mm256_cvttps_epi32(q0), _mm256_cvttps_epi32(q1)));
    }
    for (; k < n; k++) codes[k] = (int8_t)ork_clamp_lim(ork_round_half_away(x[k] * inv), lim);
}

static inline __m256 sr8_avx2(__m256 y, float lim, uint32_t row_key, uint32_t col) {
    y = clamp_avx2(y, lim);
    __m256 lo = _mm256_round_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m256 p = _mm256_sub_ps(y, lo);
    __m256 up = _mm256_cmp_ps(uniform_avx2(row_key, col), p, _CMP_LT_OQ);
    return _mm256_add_ps(lo, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
}

static void codes8_sr_avx2(const float *x, size_t n, float inv, float lim, uint32_t row_key, uint32_t col0,
                           int8_t *codes) {
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        uint32_t c = col0 + (uint32_t)k;
        __m256 q0 = sr8_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv), lim, row_key, c);
        __m256 q1 = sr8_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv), lim, row_key, c + 8);
        _mm_storeu_si128((__m128i *)(codes + k),
                         pack16_s8(_mm256_cvttps_epi32(q0), _mm256_cvttps_epi32(q1)));
    }
    for (; k < n; k++) codes[k] = (int8_t)ork_q8_sr(x[k] * inv, lim, row_key, col0 + (uint32_t)k);
}

static __attribute__((noinline)) double werr8_avx2(const float *x, const float *im, size_t n, float inv, float s, float lim) {
    const __m256 vinv = _mm256_set1_ps(inv), vs = _mm256_set1_ps(s);
    __m256d acc = _mm256_setzero_pd();
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 vx = _mm256_loadu_ps(x + k);
        __m256 q = clamp_avx2(round_half_away_avx2(_mm256_mul_ps(vx, vinv)), lim);
        acc = werr_acc8(acc, vx, _mm256_mul_ps(q, vs), im + k);
    }
    double a[4];
    _mm256_storeu_pd(a, acc);
    ork_werr8_range(a, x, im, k, n, inv, s, lim);
    return ork_lanes_sum(a);
}

/* ---- batch forms of the error kernels (quant.h werr4n / werr8n) on AVX2: one candidate at a time.
 * Interleaving four candidates per pass measured slower here (nf4 1.10 s vs 0.49 s, int8 0.31 s vs
 * 0.24 s for a 6144 x 2048 clip search, 1 thread): the 15 thresholds, 16 levels and four
 * candidates' state do not fit in 16 ymm registers. */
static void werr4n_avx2(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                        const ork_q4_grid *g, double *err) {
    for (int c = 0; c < nc; c++) err[c] = werr4_avx2(x, im, n, inv[c], s[c], g);
}

static void werr8n_avx2(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                        float lim, double *err) {
    for (int c = 0; c < nc; c++) err[c] = werr8_avx2(x, im, n, inv[c], s[c], lim);
}

/* ---- AVX-512 (F/VL/BW/DQ) batch error kernels and 4-bit codes, 16 elements per step; chosen at run
 * time (quant_ref.c) ----
 * werr4n and codes4_rtn find each nearest level through the grid's 32-cell lookup (quant.h ork_q4_grid: two
 * 32-entry permutes and two compares instead of 15 compares and blends); the sums keep the 4-lane
 * order of the _ref: lanes (k..k+3), (k+4..k+7), (k+8..k+11), (k+12..k+15) in turn. */
#define ORK_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq")))

static ORK_AVX512 inline __m256d werr_acc16_512(__m256d acc, __m512 x, __m512 q, __m512d i0, __m512d i1) {
    __m512 d = _mm512_sub_ps(x, q);
    __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(d));
    __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d), 1)));
    __m512d e0 = _mm512_mul_pd(i0, _mm512_mul_pd(d0, d0));
    __m512d e1 = _mm512_mul_pd(i1, _mm512_mul_pd(d1, d1));
    acc = _mm256_add_pd(acc, _mm512_castpd512_pd256(e0));
    acc = _mm256_add_pd(acc, _mm512_extractf64x4_pd(e0, 1));
    acc = _mm256_add_pd(acc, _mm512_castpd512_pd256(e1));
    return _mm256_add_pd(acc, _mm512_extractf64x4_pd(e1, 1));
}

/* the candidates' broadcast inverse scales and scales (a short batch repeats its last) and zero sums */
static ORK_AVX512 inline void batch_init512(const float *inv, const float *s, int nc, __m512 *vinv, __m512 *vs,
                                            __m256d *acc) {
    for (int c = 0; c < ORK_WERR_BATCH; c++) {
        const int cc = c < nc ? c : nc - 1;
        vinv[c] = _mm512_set1_ps(inv[cc]);
        vs[c] = _mm512_set1_ps(s[cc]);
        acc[c] = _mm256_setzero_pd();
    }
}

/* importance k .. k+15 as doubles: i0 = k .. k+7, i1 = k+8 .. k+15 */
static ORK_AVX512 inline void load_im16(const float *im, __m512d *i0, __m512d *i1) {
    const __m512 vim = _mm512_loadu_ps(im);
    *i0 = _mm512_cvtps_pd(_mm512_castps512_ps256(vim));
    *i1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(vim), 1)));
}

/* The grid's 32-cell lookup in registers (quant.h ork_q4_grid) and the nearest level's code of 16 y */
typedef struct {
    __m512i bA, bB;
    __m512 t1A, t1B, t2A, t2B;
} cells512;

static ORK_AVX512 inline cells512 cells512_load(const ork_q4_grid *g) {
    cells512 t;
    t.bA = _mm512_loadu_si512(g->cell_base);
    t.bB = _mm512_loadu_si512(g->cell_base + 16);
    t.t1A = _mm512_loadu_ps(g->cell_t1);
    t.t1B = _mm512_loadu_ps(g->cell_t1 + 16);
    t.t2A = _mm512_loadu_ps(g->cell_t2);
    t.t2B = _mm512_loadu_ps(g->cell_t2 + 16);
    return t;
}

/* #{i : y > thr[i]} for y clamped to [-128, 128] (the count is the same as for y itself) */
static ORK_AVX512 inline __m512i cells512_code(const cells512 *t, __m512 y) {
    const __m512 lo = _mm512_set1_ps(-128.0f), eighth = _mm512_set1_ps(0.125f);
    __m512i cell = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(_mm512_sub_ps(y, lo), eighth)),
                                    _mm512_set1_epi32(31));
    __m512i code = _mm512_permutex2var_epi32(t->bA, cell, t->bB);
    __mmask16 m1 = _mm512_cmp_ps_mask(y, _mm512_permutex2var_ps(t->t1A, cell, t->t1B), _CMP_GT_OQ);
    __mmask16 m2 = _mm512_cmp_ps_mask(y, _mm512_permutex2var_ps(t->t2A, cell, t->t2B), _CMP_GT_OQ);
    const __m512i one = _mm512_set1_epi32(1);
    code = _mm512_mask_add_epi32(code, m1, code, one);
    return _mm512_mask_add_epi32(code, m2, code, one);
}

static ORK_AVX512 void werr4n_avx512(const float *x, const float *im, size_t n, const float *inv, const float *s,
                                     int nc, const ork_q4_grid *g, double *err) {
    if (!g->cells) {
        werr4n_avx2(x, im, n, inv, s, nc, g, err);
        return;
    }
    const cells512 cl = cells512_load(g);
    const __m512 lev16 = _mm512_loadu_ps(g->lev);
    const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(128.0f);
    __m512 vinv[ORK_WERR_BATCH], vs[ORK_WERR_BATCH];
    __m256d acc[ORK_WERR_BATCH];
    batch_init512(inv, s, nc, vinv, vs, acc);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 vx = _mm512_loadu_ps(x + k);
        __m512d i0, i1;
        load_im16(im + k, &i0, &i1);
        for (int c = 0; c < ORK_WERR_BATCH; c++) {
            __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(vx, vinv[c]), lo), hi);
            __m512 q = _mm512_mul_ps(_mm512_permutexvar_ps(cells512_code(&cl, y), lev16), vs[c]);
            acc[c] = werr_acc16_512(acc[c], vx, q, i0, i1);
        }
    }
    for (int c = 0; c < nc; c++) {
        double a[4];
        _mm256_storeu_pd(a, acc[c]);
        ork_werr4_range(a, x, im, k, n, inv[c], s[c], g);
        err[c] = ork_lanes_sum(a);
    }
}

/* codes4_rtn through the grid's cell lookup (the count of thresholds below y, as werr4n_avx512 finds it) */
static ORK_AVX512 void codes4_rtn_avx512(const float *x, size_t n, float inv, const ork_q4_grid *g, uint8_t *codes) {
    if (!g->cells) {
        codes4_rtn_avx2(x, n, inv, g, codes);
        return;
    }
    const cells512 cl = cells512_load(g);
    const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(128.0f);
    const __m512 vinv = _mm512_set1_ps(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv), lo), hi);
        _mm_storeu_si128((__m128i *)(codes + k), _mm512_cvtepi32_epi8(cells512_code(&cl, y)));
    }
    for (; k < n; k++) codes[k] = (uint8_t)ork_q4_nearest(x[k] * inv, g);
}

static ORK_AVX512 void werr8n_avx512(const float *x, const float *im, size_t n, const float *inv, const float *s,
                                     int nc, float lim, double *err) {
    const __m512 half = _mm512_set1_ps(0.5f), nhalf = _mm512_set1_ps(-0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 vlim = _mm512_set1_ps(lim), nlim = _mm512_set1_ps(-lim);
    __m512 vinv[ORK_WERR_BATCH], vs[ORK_WERR_BATCH];
    __m256d acc[ORK_WERR_BATCH];
    batch_init512(inv, s, nc, vinv, vs, acc);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 vx = _mm512_loadu_ps(x + k);
        __m512d i0, i1;
        load_im16(im + k, &i0, &i1);
        for (int c = 0; c < ORK_WERR_BATCH; c++) {
            __m512 y = _mm512_mul_ps(vx, vinv[c]);
            __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m512 f = _mm512_sub_ps(y, t); /* exact */
            t = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(f, half, _CMP_GE_OQ), t, one);
            t = _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(f, nhalf, _CMP_LE_OQ), t, one);
            __m512 q = _mm512_mul_ps(_mm512_min_ps(_mm512_max_ps(t, nlim), vlim), vs[c]);
            acc[c] = werr_acc16_512(acc[c], vx, q, i0, i1);
        }
    }
    for (int c = 0; c < nc; c++) {
        double a[4];
        _mm256_storeu_pd(a, acc[c]);
        ork_werr8_range(a, x, im, k, n, inv[c], s[c], lim);
        err[c] = ork_lanes_sum(a);
    }
}

/* screen_bins (quant.h), eight values per vector: the same double operations (no fused
 * multiply-add), truncation toward zero, then the integer clamps */
static ORK_AVX512 void screen_bins_avx512(const float *x, size_t n, double ra, double h, int32_t B, int32_t *bi) {
    const __m512d vra = _mm512_set1_pd(ra), one = _mm512_set1_pd(1.0), vh = _mm512_set1_pd(h);
    const __m256i hi = _mm256_set1_epi32(B - 1), lo = _mm256_setzero_si256();
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m512d v = _mm512_mul_pd(_mm512_add_pd(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + k)), vra), one), vh);
        const __m256i b = _mm256_max_epi32(_mm256_min_epi32(_mm512_cvttpd_epi32(v), hi), lo);
        _mm256_storeu_si256((__m256i *)(bi + k), b);
    }
    ork_screen_bins_range(x, k, n, ra, h, B, bi);
}

static inline void store8_scaled(float *out, __m128i b8, __m256 vs) {
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8)), vs));
}

static void dequant4_avx2(const uint8_t *packed, size_t n, const int8_t lut[16], float s,
                          float *out) {
    const __m128i tbl = _mm_loadu_si128((const __m128i *)lut);
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    const __m256 vs = _mm256_set1_ps(s);
    size_t k = 0;
    for (; k + 32 <= n; k += 32) {
        __m128i b = _mm_loadu_si128((const __m128i *)(packed + (k >> 1)));
        __m128i vlo = _mm_shuffle_epi8(tbl, _mm_and_si128(b, lo4));
        __m128i vhi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), lo4));
        __m128i e0 = _mm_unpacklo_epi8(vlo, vhi); /* elements k .. k+15 */
        __m128i e1 = _mm_unpackhi_epi8(vlo, vhi); /* elements k+16 .. k+31 */
        store8_scaled(out + k, e0, vs);
        store8_scaled(out + k + 8, _mm_srli_si128(e0, 8), vs);
        store8_scaled(out + k + 16, e1, vs);
        store8_scaled(out + k + 24, _mm_srli_si128(e1, 8), vs);
    }
    ork_dequant4_range(packed, k, n, lut, s, out);
}

static void dequant8_avx2(const int8_t *codes, size_t n, float s, float *out) {
    const __m256 vs = _mm256_set1_ps(s);
    size_t k = 0;
    for (; k + 8 <= n; k += 8) store8_scaled(out + k, _mm_loadl_epi64((const __m128i *)(codes + k)), vs);
    for (; k < n; k++) out[k] = (float)codes[k] * s;
}

const ork_quant_kernels ork_quant_kernels_avx2 = {
    "avx2",          absmax_avx2,    codes4_rtn_avx2, codes4_sr_avx2, werr4_avx2,
    codes8_rtn_avx2, codes8_sr_avx2, werr8_avx2,      werr4n_avx2,    werr8n_avx2,
    dequant4_avx2,   dequant8_avx2,  ork_screen_est_pairs, ork_screen_bins_c,
};

/* screen_est: the two-lane C form here too. An eight-lane AVX-512 form (the prefix pairs gathered per
 * lane) measured slower on this machine's AMD EPYC (4.6 -> 5.0-6.1 ns per value of the NF4 search). */
const ork_quant_kernels ork_quant_kernels_avx512 = {
    "avx512",        absmax_avx2,    codes4_rtn_avx512, codes4_sr_avx2, werr4_avx2,
    codes8_rtn_avx2, codes8_sr_avx2, werr8_avx2,      werr4n_avx512,  werr8n_avx512,
    dequant4_avx2,   dequant8_avx2,  ork_screen_est_pairs, screen_bins_avx512,
};
#endif

/* keeps the translation unit non-empty on other architectures */
typedef int ork_quant_avx2_tu_nonempty;
