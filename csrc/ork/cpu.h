/* cpu.h - CPU feature detection and the instruction-set override.
 *
 * This is the ONE place in the core that reads the environment and holds
 * process-wide state: the selected instruction set. Selection happens on
 * first use: the best ISA the CPU supports, unless ORKPY_FORCE_SCALAR is set
 * to a non-empty value other than "0", which forces the scalar _ref kernels.
 * ork_cpu_set_isa() changes it explicitly (tests, benchmarks).
 *
 * cpu.c knows no kernel family: each family picks its own table from
 * ork_cpu_isa() and the feature answers below (ork_quant_kernels_for in
 * quant_ref.c, ork_matmul_kernels_for in matmul_ref.c, ork_gemm_f32_kernels_for
 * in gemm_f32_ref.c, ork_attn_kernels_for in attn_ref.c, ork_i4_kernels_for in i4_ref.c).
 */
#ifndef ORK_CPU_H
#define ORK_CPU_H

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
/* 1 if this build has the ISA's kernels (scalar always; avx2 on x86, neon on aarch64) and this CPU can run them */
int ork_isa_available(ork_isa isa);
/* the ISA in use (selects on first call) */
ork_isa ork_cpu_isa(void);
/* 1 if ORKPY_FORCE_SCALAR was set when selection happened */
int ork_cpu_forced_scalar(void);
/* select by name ("scalar", "avx2", "neon", "auto"); ORK_EUNAVAIL if not available */
ork_status ork_cpu_set_isa(const char *name, ork_err *err);

/* The overrides of the AVX2 ISA's optional tables, read on every call:
 * ork_cpu_use_avx512: the CPU has AVX-512 F/VL/BW/DQ and ORKPY_NO_AVX512 is not set (to a non-empty value
 * other than "0"); the quantizer's error kernels and the float32 GEMM take their AVX-512 tables.
 * ork_cpu_use_vnni: the CPU has avx512vl + avx512vnni and ORKPY_NO_VNNI is not set; the int8 / 4-bit
 * matmul takes its VNNI table. */
int ork_cpu_use_avx512(void);
int ork_cpu_use_vnni(void);

#endif
