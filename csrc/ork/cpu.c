#include "cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

static const char *const isa_names[ORK_ISA_COUNT] = {"scalar", "avx2", "neon"};

/* the features, read once (CPUID traps to the hypervisor on a VM, and every int8 matmul and
 * quantize call asks through its kernel table's choice): ORK_CPU_READ marks the cached value */
#define ORK_CPU_READ (1u << 31)
static atomic_uint g_features = 0;

static unsigned read_features(void) {
    unsigned f = 0;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) f |= ORK_CPU_AVX2;
    if (__builtin_cpu_supports("fma")) f |= ORK_CPU_FMA;
    /* libgcc sets the avx512 bits only when the OS enables their register state (xgetbv) */
    if (__builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) f |= ORK_CPU_AVX512VNNI;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq"))
        f |= ORK_CPU_AVX512;
    { /* by CPUID: not every compiler's __builtin_cpu_supports knows "f16c" (clang 14 does not) */
        unsigned a, b, c, d;
        if ((f & ORK_CPU_AVX2) && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29))) f |= ORK_CPU_F16C;
    }
#endif
#if defined(__aarch64__)
    f |= ORK_CPU_NEON; /* Advanced SIMD is mandatory on AArch64 */
#if defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) f |= ORK_CPU_DOTPROD;
#endif
#endif
    return f;
}

unsigned ork_cpu_features(void) {
    unsigned f = atomic_load(&g_features);
    if (!(f & ORK_CPU_READ)) {
        f = read_features() | ORK_CPU_READ;
        atomic_store(&g_features, f); /* racing first callers store the same value */
    }
    return f & ~ORK_CPU_READ;
}

const char *ork_isa_name(ork_isa isa) {
    return ((int)isa >= 0 && isa < ORK_ISA_COUNT) ? isa_names[isa] : "?";
}

const ork_quant_kernels *ork_quant_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_quant_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: {
        const char *no = getenv("ORKPY_NO_AVX512");
        return ((ork_cpu_features() & ORK_CPU_AVX512) && !(no && *no && strcmp(no, "0") != 0))
                   ? &ork_quant_kernels_avx512
                   : &ork_quant_kernels_avx2;
    }
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return &ork_quant_kernels_neon;
#endif
    default: return NULL;
    }
}

int ork_isa_available(ork_isa isa) {
    if (!ork_quant_kernels_for(isa)) return 0;
    unsigned f = ork_cpu_features();
    switch (isa) {
    case ORK_ISA_SCALAR: return 1;
    case ORK_ISA_AVX2: return (f & ORK_CPU_AVX2) && (f & ORK_CPU_FMA);
    case ORK_ISA_NEON: return (f & ORK_CPU_NEON) != 0;
    default: return 0;
    }
}

static atomic_int g_isa = -1; /* -1: not selected yet */
static atomic_int g_forced = 0;

static ork_isa best_isa(void) {
    if (ork_isa_available(ORK_ISA_AVX2)) return ORK_ISA_AVX2;
    if (ork_isa_available(ORK_ISA_NEON)) return ORK_ISA_NEON;
    return ORK_ISA_SCALAR;
}

ork_isa ork_cpu_isa(void) {
    int v = atomic_load(&g_isa);
    if (v >= 0) return (ork_isa)v;
    const char *env = getenv("ORKPY_FORCE_SCALAR");
    int forced = env && env[0] && strcmp(env, "0") != 0;
    ork_isa isa = forced ? ORK_ISA_SCALAR : best_isa();
    int expected = -1;
    if (atomic_compare_exchange_strong(&g_isa, &expected, (int)isa)) atomic_store(&g_forced, forced);
    return (ork_isa)atomic_load(&g_isa);
}

int ork_cpu_forced_scalar(void) {
    (void)ork_cpu_isa();
    return atomic_load(&g_forced);
}

ork_status ork_cpu_set_isa(const char *name, ork_err *err) {
    if (!name) return ork_err_set(err, ORK_EINVAL, "ISA name is NULL");
    if (strcmp(name, "auto") == 0) {
        atomic_store(&g_isa, (int)best_isa());
        atomic_store(&g_forced, 0);
        return ORK_OK;
    }
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        if (strcmp(name, isa_names[i]) == 0) {
            if (!ork_isa_available((ork_isa)i))
                return ork_err_set(err, ORK_EUNAVAIL,
                                   "ISA '%s' is not available on this CPU/build", name);
            atomic_store(&g_isa, i);
            return ORK_OK;
        }
    }
    return ork_err_set(err, ORK_EINVAL, "unknown ISA '%s' (expected scalar, avx2, neon or auto)",
                       name);
}

const ork_quant_kernels *ork_quant_kernels_active(void) {
    return ork_quant_kernels_for(ork_cpu_isa());
}

const ork_matmul_kernels *ork_matmul_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_matmul_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: {
        const char *no = getenv("ORKPY_NO_VNNI");
        return ((ork_cpu_features() & ORK_CPU_AVX512VNNI) && !(no && *no && strcmp(no, "0") != 0))
                   ? &ork_matmul_kernels_avx2vnni
                   : &ork_matmul_kernels_avx2;
    }
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON:
        return (ork_cpu_features() & ORK_CPU_DOTPROD) ? &ork_matmul_kernels_neondot : &ork_matmul_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_matmul_kernels *ork_matmul_kernels_active(void) {
    return ork_matmul_kernels_for(ork_cpu_isa());
}

const ork_gemm_f32_kernels *ork_gemm_f32_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_gemm_f32_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: {
        const char *no = getenv("ORKPY_NO_AVX512");
        return ((ork_cpu_features() & ORK_CPU_AVX512) && !(no && *no && strcmp(no, "0") != 0))
                   ? &ork_gemm_f32_kernels_avx512
                   : &ork_gemm_f32_kernels_avx2;
    }
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return &ork_gemm_f32_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_gemm_f32_kernels *ork_gemm_f32_kernels_active(void) {
    return ork_gemm_f32_kernels_for(ork_cpu_isa());
}

const ork_attn_kernels *ork_attn_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_attn_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return &ork_attn_kernels_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return &ork_attn_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_attn_kernels *ork_attn_kernels_active(void) {
    return ork_attn_kernels_for(ork_cpu_isa());
}
