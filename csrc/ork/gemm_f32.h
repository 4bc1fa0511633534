/* gemm_f32.h - the float32 GEMM of the F32 linear path (linear.h):
 * y (M, N) = x (M, K) W^T, W float32 (N, K) row-major.
 *
 * Contract (every ISA, every blocking, every thread count):
 *     c_0 = +0.0f,  c_{k+1} = fmaf(x[m][k], W[n][k], c_k) for k = 0 .. K-1,  y[m][n] = c_K
 * one fused multiply-add per term (one rounding), terms in increasing k. Each
 * output is one chain of its own, so a kernel may block M, N and K freely
 * (a K block stores c_k in y and reloads it: float storage is exact) and
 * vectorize across outputs at any width: results are bit-identical on the
 * scalar _ref (fmaf), AVX2 (_mm256_fmadd_ps) and NEON (vfmaq_f32) kernels.
 * On a CPU without a hardware FMA the _ref's fmaf is a (slow, exact)
 * software routine.
 */
#ifndef ORK_GEMM_F32_H
#define ORK_GEMM_F32_H

#include <stddef.h>

#include "cpu.h"

/* floats of scratch a cols call may use (64 KB; give it 64-byte aligned) */
#define ORK_GEMM_F32_SCRATCH 16384

typedef struct ork_gemm_f32_kernels {
    const char *isa;
    /* y[m*ldy + n] for m < M, n0 <= n < n1, by the contract above; x rows
     * have stride ldx >= K, W rows stride ldw >= K; other outputs untouched.
     * scratch: ORK_GEMM_F32_SCRATCH floats of the caller's (packed weights); unused, and may be
     * NULL, when M = 1 (the weight rows are read in place). */
    void (*cols)(const float *x, size_t ldx, size_t M, size_t K, const float *w, size_t ldw, size_t n0, size_t n1,
                 float *y, size_t ldy, float *scratch);
} ork_gemm_f32_kernels;

extern const ork_gemm_f32_kernels ork_gemm_f32_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const ork_gemm_f32_kernels ork_gemm_f32_kernels_avx2;
extern const ork_gemm_f32_kernels ork_gemm_f32_kernels_avx512; /* AVX-512F/VL/BW/DQ CPUs only (picked below) */
#endif
#if defined(__aarch64__)
extern const ork_gemm_f32_kernels ork_gemm_f32_kernels_neon;
#endif
/* the float32 GEMM of an ISA (gemm_f32_ref.c picks it): for avx2, the AVX-512 one where
 * ork_cpu_use_avx512(); NULL when the build has none */
const ork_gemm_f32_kernels *ork_gemm_f32_kernels_for(ork_isa isa);
const ork_gemm_f32_kernels *ork_gemm_f32_kernels_active(void); /* of ork_cpu_isa() */

#endif
