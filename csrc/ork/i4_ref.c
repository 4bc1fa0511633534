/* i4_ref.c - the scalar oracle of the int4 x int4 -> int16 matmul contract
 * (i4.h): each chunk of at most ORK_I4_KCHUNK k summed in an int16, the
 * chunk sums added in int32 in chunk order, exactly as written there. */
#include "i4.h"

/* the int16 sum of stored rows a and w over k in [k0, k1): every step fits int16 (i4.h) */
static int16_t chunk_sum(const uint8_t *a, const uint8_t *w, size_t k0, size_t k1) {
    int16_t s = 0;
    for (size_t k = k0; k < k1; k++) s = (int16_t)(s + ork_i4_code(a, k) * ork_i4_code(w, k));
    return s;
}

static void mm_ref(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t Kp, int32_t *acc, size_t ldc) {
    const size_t rb = Kp / 2;
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            int32_t s = 0;
            for (size_t k0 = 0; k0 < Kp; k0 += ORK_I4_KCHUNK)
                s += chunk_sum(a + m * rb, w + n * rb, k0, k0 + ORK_I4_KCHUNK < Kp ? k0 + ORK_I4_KCHUNK : Kp);
            acc[m * ldc + n] = s;
        }
}

const ork_i4_kernels ork_i4_kernels_ref = {"scalar", mm_ref};

ork_status ork_mm_i4_partials(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t K, int16_t *part,
                              ork_err *err) {
    ork_status st = ork_i4_check(a, M, w, N, K, part, err);
    if (st) return st;
    const size_t Kp = ork_i4_kpad(K), rb = Kp / 2, C = ork_i4_chunks(K);
    for (size_t c = 0; c < C; c++) {
        const size_t k0 = c * ORK_I4_KCHUNK, k1 = k0 + ORK_I4_KCHUNK < Kp ? k0 + ORK_I4_KCHUNK : Kp;
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++) part[(c * M + m) * N + n] = chunk_sum(a + m * rb, w + n * rb, k0, k1);
    }
    return ORK_OK;
}

/* The int4 family's table choice: the ISA's table. */
const ork_i4_kernels *ork_i4_kernels_for(ork_isa isa) {
    switch (isa) {
    case ORK_ISA_SCALAR: return &ork_i4_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    case ORK_ISA_AVX2: return &ork_i4_kernels_avx2;
#endif
#if defined(__aarch64__)
    case ORK_ISA_NEON: return &ork_i4_kernels_neon;
#endif
    default: return NULL;
    }
}

const ork_i4_kernels *ork_i4_kernels_active(void) { return ork_i4_kernels_for(ork_cpu_isa()); }
