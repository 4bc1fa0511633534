/* matmul_ref.c - scalar reference matmul kernels (the oracle). Integer
 * arithmetic only: every variant must give the same int32 accumulators. */
#include "pack.h"

static void inflate_strip_ref(const uint8_t *nib, size_t KB, const int8_t lut[16], int8_t *strip) {
    for (size_t r = 0; r < KB * 32; r++)
        for (size_t j = 0; j < 16; j++) {
            uint8_t b = nib[r * 16 + j];
            strip[r * 32 + 2 * j] = lut[b & 15];
            strip[r * 32 + 2 * j + 1] = lut[b >> 4];
        }
}

static void gemm_strip_i8_ref(const int8_t *strip, size_t KB, const int8_t *x, size_t ldx, size_t M,
                              int32_t *acc) {
    for (size_t m = 0; m < M; m++)
        for (size_t i = 0; i < 32; i++) {
            int32_t s = 0;
            for (size_t kb = 0; kb < KB; kb++) {
                const int8_t *w = strip + (kb * 32 + i) * 32;
                const int8_t *xr = x + m * ldx + kb * 32;
                for (size_t j = 0; j < 32; j++) s += (int32_t)xr[j] * (int32_t)w[j];
            }
            acc[m * 32 + i] = s;
        }
}

static void gemv_strip_i4_ref(const uint8_t *nib, size_t KB, const int8_t lut[16], const int8_t *x,
                              int32_t *acc) {
    for (size_t i = 0; i < 32; i++) {
        int32_t s = 0;
        for (size_t kb = 0; kb < KB; kb++) {
            const uint8_t *w = nib + (kb * 32 + i) * 16;
            const int8_t *xr = x + kb * 32;
            for (size_t j = 0; j < 16; j++) {
                s += (int32_t)xr[2 * j] * lut[w[j] & 15];
                s += (int32_t)xr[2 * j + 1] * lut[w[j] >> 4];
            }
        }
        acc[i] = s;
    }
}

static void acc_group_ref(const int32_t *acc, size_t M, const float *ascale, const float s[32], int first, float *y) {
    for (size_t m = 0; m < M; m++)
        for (size_t i = 0; i < 32; i++) {
            float t = ork_dequant_acc(acc[m * 32 + i], ascale[m], s[i]);
            y[m * 32 + i] = first ? t : y[m * 32 + i] + t;
        }
}

const ork_matmul_kernels ork_matmul_kernels_ref = {"scalar", inflate_strip_ref, gemm_strip_i8_ref,
                                                   gemv_strip_i4_ref, acc_group_ref};

/* The matmul family's table choice: the ISA's table; under AVX2 the VNNI one where the CPU has
 * avx512vl + avx512vnni and ORKPY_NO_VNNI is not set (ork_cpu_use_vnni); under NEON the sdot one
 * where the CPU has the dot-product extension. */
const ork_matmul_kernels *ork_matmul_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_matmul_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return ork_cpu_use_vnni() ? &ork_matmul_kernels_avx2vnni : &ork_matmul_kernels_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON:
        return (ork_cpu_features() & ORK_CPU_DOTPROD) ? &ork_matmul_kernels_neondot : &ork_matmul_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_matmul_kernels *ork_matmul_kernels_active(void) { return ork_matmul_kernels_for(ork_cpu_isa()); }
