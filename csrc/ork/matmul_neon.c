/* matmul_neon.c - aarch64 NEON int8 matmul kernels without the dot-product
 * extension: vqtbl1q_s8 inflate, vmull_s8 + vpadalq_s16 accumulation (exact:
 * each int16 product is at most 16129). The sdot variant lives in
 * matmul_neondot.c; matmul_ref.c picks it when the CPU has dotprod. */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "pack.h"
#include "matmul_neon_common.h"

static inline int32x4_t dot32_neon(int32x4_t acc, int8x16_t x0, int8x16_t x1, int8x16_t w0, int8x16_t w1) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(x0), vget_low_s8(w0)));
    acc = vpadalq_s16(acc, vmull_high_s8(x0, w0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(x1), vget_low_s8(w1)));
    acc = vpadalq_s16(acc, vmull_high_s8(x1, w1));
    return acc;
}

ORK_NEON_MATMUL_KERNELS(neon, dot32_neon)

const ork_matmul_kernels ork_matmul_kernels_neon = {"neon", inflate_strip_neon, gemm_strip_i8_neon,
                                                    gemv_strip_i4_neon, ork_neon_acc_group};
#endif

typedef int ork_matmul_neon_tu_nonempty;
