/* matmul_neondot.c - aarch64 NEON int8 matmul kernels with the dot-product
 * extension (sdot). Compiled with -march=armv8.2-a+dotprod (setup.py);
 * selected at run time only when HWCAP reports ASIMDDP. */
#if defined(__aarch64__)
#ifndef __ARM_FEATURE_DOTPROD
#error "matmul_neondot.c must be compiled with -march=armv8.2-a+dotprod"
#endif
#include <arm_neon.h>

#include "pack.h"
#include "matmul_neon_common.h"

static inline int32x4_t dot32_neondot(int32x4_t acc, int8x16_t x0, int8x16_t x1, int8x16_t w0,
                                      int8x16_t w1) {
    return vdotq_s32(vdotq_s32(acc, x0, w0), x1, w1);
}

ORK_NEON_MATMUL_KERNELS(neondot, dot32_neondot)

const ork_matmul_kernels ork_matmul_kernels_neondot = {"neondot", inflate_strip_neondot,
                                                       gemm_strip_i8_neondot, gemv_strip_i4_neondot, ork_neon_acc_group};
#endif

typedef int ork_matmul_neondot_tu_nonempty;
