/* gemm_f32_ref.c - the scalar float32 GEMM (the oracle of gemm_f32.h): one
 * fmaf chain per output, terms in k order. */
#include <math.h>

#include "gemm_f32.h"

static void cols_ref(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0, size_t n1,
                     float *y, size_t ldy, float *scratch) {
    (void)scratch;
    for (size_t n = n0; n < n1; n++)
        for (size_t m = 0; m < M; m++) {
            const float *xr = x + m * ldx, *wr = w + n * ldw;
            float c = 0.0f;
            for (size_t k = 0; k < K; k++) c = fmaf(xr[k], wr[k], c);
            y[m * ldy + n] = c;
        }
}

const ork_gemm_f32_kernels ork_gemm_f32_kernels_ref = {"scalar", cols_ref};

/* The float32 GEMM's table choice: the ISA's table; under AVX2 the AVX-512 one (8 x 16 zmm tiles, the
 * same results) where the CPU has AVX-512 F/VL/BW/DQ and ORKPY_NO_AVX512 is not set (ork_cpu_use_avx512). */
const ork_gemm_f32_kernels *ork_gemm_f32_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_gemm_f32_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return ork_cpu_use_avx512() ? &ork_gemm_f32_kernels_avx512 : &ork_gemm_f32_kernels_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return &ork_gemm_f32_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_gemm_f32_kernels *ork_gemm_f32_kernels_active(void) { return ork_gemm_f32_kernels_for(ork_cpu_isa()); }
