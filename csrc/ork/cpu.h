/* cpu.h - CPU feature detection and kernel selection.
 *
 * This is the ONE place in the core that reads the environment and holds
 * process-wide state: the selected instruction set. Selection happens on
 * first use: the best ISA the CPU supports, unless ORKPY_FORCE_SCALAR is set
 * to a non-empty value other than "0", which forces the scalar _ref kernels.
 * ork_cpu_set_isa() changes it explicitly (tests, benchmarks).
 */
#ifndef ORK_CPU_H
#define ORK_CPU_H

#include "attn.h"
#include "gemm_f32.h"
#include "pack.h"
#include "quant.h"
#include "status.h"

typedef enum ork_isa { ORK_ISA_SCALAR = 0, ORK_ISA_AVX2 = 1, ORK_ISA_NEON = 2, ORK_ISA_COUNT } ork_isa;

/* feature bits of this CPU */
#define ORK_CPU_AVX2 (1u << 0)
#define ORK_CPU_FMA (1u << 1)
#define ORK_CPU_NEON (1u << 2)
#define ORK_CPU_DOTPROD (1u << 3)
#define ORK_CPU_AVX512VNNI (1u << 4) /* avx512vl + avx512vnni, with the OS saving their state */
#define ORK_CPU_AVX512 (1u << 5)     /* avx512f + vl + bw + dq, with the OS saving their state */
#define ORK_CPU_F16C (1u << 6)       /* the half <-> float conversions (CPUID.1:ECX bit 29), with AVX2 */

unsigned ork_cpu_features(void);
const char *ork_isa_name(ork_isa isa);
/* 1 if this build has the ISA's kernels and this CPU can run them */
int ork_isa_available(ork_isa isa);
/* the ISA in use (selects on first call) */
ork_isa ork_cpu_isa(void);
/* 1 if ORKPY_FORCE_SCALAR was set when selection happened */
int ork_cpu_forced_scalar(void);
/* select by name ("scalar", "avx2", "neon", "auto"); ORK_EUNAVAIL if not available */
ork_status ork_cpu_set_isa(const char *name, ork_err *err);

/* quant kernels of an ISA; for avx2, the table with the AVX-512 error kernels when the CPU has
 * avx512f/vl/bw/dq (ORKPY_NO_AVX512=1 keeps the plain AVX2 one) */
const ork_quant_kernels *ork_quant_kernels_for(ork_isa isa);
const ork_quant_kernels *ork_quant_kernels_active(void);

/* matmul kernels of an ISA; for neon, the sdot table when the CPU has dotprod; for avx2, the
 * VNNI table when it has avx512vl + avx512vnni (ORKPY_NO_VNNI=1 keeps the plain AVX2 one) */
const ork_matmul_kernels *ork_matmul_kernels_for(ork_isa isa);
const ork_matmul_kernels *ork_matmul_kernels_active(void);

/* float32 GEMM kernels of an ISA (gemm_f32.h) */
const ork_gemm_f32_kernels *ork_gemm_f32_kernels_for(ork_isa isa);
const ork_gemm_f32_kernels *ork_gemm_f32_kernels_active(void);

/* attention loops of an ISA (attn.h) */
const ork_attn_kernels *ork_attn_kernels_for(ork_isa isa);
const ork_attn_kernels *ork_attn_kernels_active(void);

#endif
