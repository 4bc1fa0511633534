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

/* whether this build compiled the ISA's kernels (every family has a table for exactly these) */
static int isa_built(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return 1;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return 1;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return 1;
#endif
    default: return 0;
    }
}

/* an override variable is set: a non-empty value other than "0" */
static int env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

int ork_cpu_use_avx512(void) { return (ork_cpu_features() & ORK_CPU_AVX512) && !env_set("ORKPY_NO_AVX512"); }

int ork_cpu_use_vnni(void) { return (ork_cpu_features() & ORK_CPU_AVX512VNNI) && !env_set("ORKPY_NO_VNNI"); }

int ork_isa_available(ork_isa isa) {
    if (!isa_built(isa)) return 0;
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
    int forced = env_set("ORKPY_FORCE_SCALAR");
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
