/* attn_avx2.c - the AVX2 attention value sums (attn.h). Rows go three at a
 * time (then two, then one); for three or two rows, 32 outputs of each row in
 * 4 ymm accumulators share every value load; a single row keeps 64 outputs in
 * 8. One _mm256_fmadd_ps per key and 8 outputs; outputs past the last full
 * vector by the scalar contract. softmax: 8 scores per vector, the exp in the
 * contract's operations lane-wise, the float64 lanes 0-3 and 4-7 in two
 * 4-double accumulators; the scores past the last full vector by the scalar
 * contract (their lanes continue u % 8). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "attn.h"

/* rows g (<= 3) x W vectors of outputs at o, continued over n keys (g, W constants once inlined) */
static inline __attribute__((always_inline)) void pv_tile(const int g, const int W, const float *p, size_t ldp,
                                                           const float *v, size_t ldv, size_t n, float *o,
                                                           size_t ldo) {
    __m256 c[3][8];
    #pragma GCC unroll 16
    for (int r = 0; r < g; r++)
        #pragma GCC unroll 16
        for (int w = 0; w < W; w++) c[r][w] = _mm256_loadu_ps(o + r * ldo + 8 * w);
    for (size_t u = 0; u < n; u++) {
        const float *vv = v + u * ldv;
        __m256 pr[3];
        #pragma GCC unroll 16
        for (int r = 0; r < g; r++) pr[r] = _mm256_broadcast_ss(p + r * ldp + u);
        #pragma GCC unroll 16
        for (int w = 0; w < W; w++) {
            const __m256 x = _mm256_loadu_ps(vv + 8 * w);
            #pragma GCC unroll 16
            for (int r = 0; r < g; r++) c[r][w] = _mm256_fmadd_ps(pr[r], x, c[r][w]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < g; r++)
        #pragma GCC unroll 16
        for (int w = 0; w < W; w++) _mm256_storeu_ps(o + r * ldo + 8 * w, c[r][w]);
}

static void pv_rows(const int g, const float *p, size_t ldp, const float *v, size_t ldv, size_t n, size_t hd,
                    float *o, size_t ldo) {
    size_t d = 0;
    if (g == 1)
        for (; d + 64 <= hd; d += 64) pv_tile(1, 8, p, ldp, v + d, ldv, n, o + d, ldo);
    else if (g == 2)
        for (; d + 32 <= hd; d += 32) pv_tile(2, 4, p, ldp, v + d, ldv, n, o + d, ldo);
    else
        for (; d + 32 <= hd; d += 32) pv_tile(3, 4, p, ldp, v + d, ldv, n, o + d, ldo);
    for (; d + 8 <= hd; d += 8) {
        if (g == 1) pv_tile(1, 1, p, ldp, v + d, ldv, n, o + d, ldo);
        else if (g == 2) pv_tile(2, 1, p, ldp, v + d, ldv, n, o + d, ldo);
        else pv_tile(3, 1, p, ldp, v + d, ldv, n, o + d, ldo);
    }
    ork_attn_pv_cols(p, ldp, (size_t)g, v, ldv, n, d, hd, o, ldo);
}

static void pv_avx2(const float *p, size_t ldp, size_t R, const float *v, size_t ldv, size_t n, size_t hd, float *o,
                    size_t ldo) {
    size_t r = 0;
    for (; r + 3 <= R; r += 3) pv_rows(3, p + r * ldp, ldp, v, ldv, n, hd, o + r * ldo, ldo);
    if (R - r == 2) pv_rows(2, p + r * ldp, ldp, v, ldv, n, hd, o + r * ldo, ldo);
    else if (R - r == 1) pv_rows(1, p + r * ldp, ldp, v, ldv, n, hd, o + r * ldo, ldo);
}

/* ork_attn_expf on 8 lanes: the same operations in the same order */
static inline __m256 expf8(__m256 x) {
    const __m256 xc = _mm256_min_ps(_mm256_set1_ps(ORK_EXP_MAX), x); /* a NaN x stays (min_ps returns x) */
    const __m256 shift = _mm256_set1_ps(ORK_EXP_SHIFT);
    const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(ORK_EXP_LOG2E), shift), n = _mm256_sub_ps(t, shift);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ORK_EXP_LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(ORK_EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(ORK_EXP_P0), r, _mm256_set1_ps(ORK_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ORK_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ORK_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ORK_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ORK_EXP_P5));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i eb = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ORK_EXP_SHIFT_BITS)),
                         _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(y, _mm256_castsi256_ps(eb));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(ORK_EXP_MIN), _CMP_LT_OQ), e);
}

static void softmax_avx2(float *s, size_t n, float scale, float cap) {
    const size_t n8 = n & ~(size_t)7;
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    if (cap > 0.0f) { /* tanhf: the scalar step 1 */
        ork_attn_scale_cap(s, 0, n, scale, cap);
        for (size_t u = 0; u < n8; u += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(s + u), m8);
    } else {
        const __m256 sc = _mm256_set1_ps(scale);
        for (size_t u = 0; u < n8; u += 8) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + u), sc);
            _mm256_storeu_ps(s + u, x);
            m8 = _mm256_max_ps(x, m8); /* x > m ? x : m, lane-wise (a NaN x keeps m) */
        }
        ork_attn_scale_cap(s, n8, n, scale, cap);
    }
    float ml[8], mx = -INFINITY;
    _mm256_storeu_ps(ml, m8);
    for (int l = 0; l < 8; l++)
        if (ml[l] > mx) mx = ml[l];
    for (size_t u = n8; u < n; u++)
        if (s[u] > mx) mx = s[u];
    const __m256 mv = _mm256_set1_ps(mx);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (size_t u = 0; u < n8; u += 8) {
        const __m256 e = expf8(_mm256_sub_ps(_mm256_loadu_ps(s + u), mv));
        _mm256_storeu_ps(s + u, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lane[8];
    _mm256_storeu_pd(lane, lo);
    _mm256_storeu_pd(lane + 4, hi);
    for (size_t u = n8; u < n; u++) {
        s[u] = ork_attn_expf(s[u] - mx);
        lane[u & 7] += s[u];
    }
    const float inv = (float)(1.0 / ork_attn_lane_sum(lane));
    const __m256 iv = _mm256_set1_ps(inv);
    for (size_t u = 0; u < n8; u += 8) _mm256_storeu_ps(s + u, _mm256_mul_ps(_mm256_loadu_ps(s + u), iv));
    for (size_t u = n8; u < n; u++) s[u] *= inv;
}

const ork_attn_kernels ork_attn_kernels_avx2 = {"avx2", pv_avx2, softmax_avx2};
#else
typedef int ork_attn_avx2_empty; /* ISO C: no empty translation unit */
#endif
