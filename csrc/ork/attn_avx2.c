/* attn_avx2.c - the AVX2 attention loops (attn.h). scores: four keys at a
 * time, each key's 8 dot8 lanes one ymm accumulator (_mm256_mul_ps then
 * _mm256_add_ps, rounded apart), the four trees reduced together by two
 * hadds and one add, which is exactly ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
 * pv: 64 outputs at a time in 8 ymm accumulators over all keys (the scalar
 * loop reloads and stores o for every key). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "attn.h"

/* lanes [A, B, C, D]: the dot8 tree of each of four 8-lane accumulators */
static inline __m128 tree4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    /* low half: (x0+x1)+(x2+x3) of a, b, c, d; high half: (x4+x5)+(x6+x7) */
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

static void scores_avx2(const float *q, const float *k, size_t ldk, size_t n, size_t hd, float scale, float *s) {
    const size_t h8 = hd & ~(size_t)7;
    size_t u = 0;
    for (; u + 4 <= n; u += 4) {
        const float *k0 = k + u * ldk, *k1 = k0 + ldk, *k2 = k1 + ldk, *k3 = k2 + ldk;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t i = 0; i < h8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(qv, _mm256_loadu_ps(k0 + i)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(qv, _mm256_loadu_ps(k1 + i)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(qv, _mm256_loadu_ps(k2 + i)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(qv, _mm256_loadu_ps(k3 + i)));
        }
        float r[4];
        _mm_storeu_ps(r, tree4(a0, a1, a2, a3));
        for (size_t i = h8; i < hd; i++) {
            r[0] += q[i] * k0[i];
            r[1] += q[i] * k1[i];
            r[2] += q[i] * k2[i];
            r[3] += q[i] * k3[i];
        }
        for (int j = 0; j < 4; j++) s[u + j] = r[j] * scale;
    }
    for (; u < n; u++) {
        const float *k0 = k + u * ldk;
        __m256 a0 = _mm256_setzero_ps();
        for (size_t i = 0; i < h8; i += 8)
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k0 + i)));
        float r[4];
        _mm_storeu_ps(r, tree4(a0, a0, a0, a0));
        for (size_t i = h8; i < hd; i++) r[0] += q[i] * k0[i];
        s[u] = r[0] * scale;
    }
}

static void pv_avx2(const float *p, const float *v, size_t ldv, size_t n, size_t hd, float *o) {
    size_t d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m256 c[8];
        for (int i = 0; i < 8; i++) c[i] = _mm256_setzero_ps();
        for (size_t u = 0; u < n; u++) {
            const __m256 pu = _mm256_set1_ps(p[u]);
            const float *vv = v + u * ldv + d;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) c[i] = _mm256_add_ps(c[i], _mm256_mul_ps(pu, _mm256_loadu_ps(vv + 8 * i)));
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + d + 8 * i, c[i]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 c0 = _mm256_setzero_ps();
        for (size_t u = 0; u < n; u++)
            c0 = _mm256_add_ps(c0, _mm256_mul_ps(_mm256_set1_ps(p[u]), _mm256_loadu_ps(v + u * ldv + d)));
        _mm256_storeu_ps(o + d, c0);
    }
    ork_attn_pv_cols(p, v, ldv, n, d, hd, o);
}

const ork_attn_kernels ork_attn_kernels_avx2 = {"avx2", scores_avx2, pv_avx2};
#else
typedef int ork_attn_avx2_empty; /* ISO C: no empty translation unit */
#endif
