/* matmul_neon_common.h - the NEON kernel bodies shared by matmul_neon.c and
 * matmul_neondot.c; only the 32-element dot step (DOT) differs. Private. */
#ifndef ORK_MATMUL_NEON_COMMON_H
#define ORK_MATMUL_NEON_COMMON_H

static inline void ork_neon_inflate32(const uint8_t *p, int8x16_t tbl, int8x16_t *o0, int8x16_t *o1) {
    uint8x16_t b = vld1q_u8(p);
    int8x16_t lo = vqtbl1q_s8(tbl, vandq_u8(b, vdupq_n_u8(15)));
    int8x16_t hi = vqtbl1q_s8(tbl, vshrq_n_u8(b, 4));
    *o0 = vzip1q_s8(lo, hi);
    *o1 = vzip2q_s8(lo, hi);
}

/* one group's term of a grouped output (pack.h acc_group): two float32 multiplies, one add, no FMA */
static inline void ork_neon_acc_group(const int32_t *acc, size_t M, const float *ascale, const float s[32], int first,
                                      float *y) {
    for (size_t m = 0; m < M; m++) {
        float32x4_t a = vdupq_n_f32(ascale[m]);
        for (size_t i = 0; i < 32; i += 4) {
            float32x4_t t = vmulq_f32(vmulq_f32(vcvtq_f32_s32(vld1q_s32(acc + m * 32 + i)), a), vld1q_f32(s + i));
            if (!first) t = vaddq_f32(vld1q_f32(y + m * 32 + i), t);
            vst1q_f32(y + m * 32 + i, t);
        }
    }
}

#define ORK_NEON_MATMUL_KERNELS(SUF, DOT)                                                          \
    static void inflate_strip_##SUF(const uint8_t *nib, size_t KB, const int8_t lut[16],           \
                                    int8_t *strip) {                                               \
        int8x16_t tbl = vld1q_s8(lut);                                                             \
        for (size_t r = 0; r < KB * 32; r++) {                                                     \
            int8x16_t a, b;                                                                        \
            ork_neon_inflate32(nib + r * 16, tbl, &a, &b);                                         \
            vst1q_s8(strip + r * 32, a);                                                           \
            vst1q_s8(strip + r * 32 + 16, b);                                                      \
        }                                                                                          \
    }                                                                                              \
    static void gemm_strip_i8_##SUF(const int8_t *strip, size_t KB, const int8_t *x, size_t ldx,   \
                                    size_t M, int32_t *acc) {                                      \
        /* one sequential pass over the strip per row (as the AVX2 single-row loop) */            \
        for (size_t m = 0; m < M; m++) {                                                           \
            const int8_t *xr = x + m * ldx;                                                        \
            int32x4_t a[32];                                                                       \
            for (int r = 0; r < 32; r++) a[r] = vdupq_n_s32(0);                                    \
            for (size_t kb = 0; kb < KB; kb++) {                                                   \
                int8x16_t x0 = vld1q_s8(xr + kb * 32), x1 = vld1q_s8(xr + kb * 32 + 16);           \
                const int8_t *w = strip + kb * 1024;                                               \
                __builtin_prefetch(w + 2048);                                                      \
                __builtin_prefetch(w + 2048 + 512);                                                \
                for (int r = 0; r < 32; r++)                                                       \
                    a[r] = DOT(a[r], x0, x1, vld1q_s8(w + r * 32), vld1q_s8(w + r * 32 + 16));     \
            }                                                                                      \
            for (int r = 0; r < 32; r++) acc[m * 32 + r] = vaddvq_s32(a[r]);                       \
        }                                                                                          \
    }                                                                                              \
    static void gemv_strip_i4_##SUF(const uint8_t *nib, size_t KB, const int8_t lut[16],           \
                                    const int8_t *x, int32_t *acc) {                               \
        int8x16_t tbl = vld1q_s8(lut);                                                             \
        for (size_t i0 = 0; i0 < 32; i0 += 8) {                                                    \
            int32x4_t a[8];                                                                        \
            for (int r = 0; r < 8; r++) a[r] = vdupq_n_s32(0);                                     \
            for (size_t kb = 0; kb < KB; kb++) {                                                   \
                int8x16_t x0 = vld1q_s8(x + kb * 32), x1 = vld1q_s8(x + kb * 32 + 16);             \
                const uint8_t *w = nib + (kb * 32 + i0) * 16;                                      \
                for (int r = 0; r < 8; r++) {                                                      \
                    int8x16_t w0, w1;                                                              \
                    ork_neon_inflate32(w + r * 16, tbl, &w0, &w1);                                 \
                    a[r] = DOT(a[r], x0, x1, w0, w1);                                              \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < 8; r++) acc[i0 + r] = vaddvq_s32(a[r]);                            \
        }                                                                                          \
    }

#endif
