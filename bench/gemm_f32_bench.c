/* gemm_f32_bench.c - GFLOP/s of the F32 linear (ork_linear_apply, linear.h) at
 * given shapes, and the machine's FMA peak measured in the same run (a loop of
 * independent register FMA chains, AVX2 on x86-64, NEON on aarch64). Built
 * with the core by bench/gemm_f32.py (tests/cbuild.py); not part of orkpy.
 *
 *     gemm_f32_bench ISA THREADS M N K [N K ...]
 * prints "isa <kernels>", "peak <GFLOP/s>" (best of 5), then one line per shape (best of a few
 * runs): "gemm M N K <GFLOP/s> <ms> <GFLOP per CPU-second>" (the last: per second of the
 * process's CPU time, all threads summed, so time sliced away to other processes is not counted). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../csrc/ork/cpu.h"
#include "../csrc/ork/linear.h"
#include "../csrc/ork/pool.h"

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
static double cpu_now(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

#define PEAK_ITERS 10000000u
#if defined(__x86_64__)
#include <immintrin.h>
#define F(c) c = _mm256_fmadd_ps(c, a, b)
__attribute__((target("avx2,fma"))) static float peak_chains(void) {
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 c0 = _mm256_set1_ps(0), c1 = _mm256_set1_ps(1), c2 = _mm256_set1_ps(2), c3 = _mm256_set1_ps(3);
    __m256 c4 = _mm256_set1_ps(4), c5 = _mm256_set1_ps(5), c6 = _mm256_set1_ps(6), c7 = _mm256_set1_ps(7);
    __m256 c8 = _mm256_set1_ps(8), c9 = _mm256_set1_ps(9), c10 = _mm256_set1_ps(10), c11 = _mm256_set1_ps(11);
    for (unsigned it = 0; it < PEAK_ITERS; it++) {
        F(c0); F(c1); F(c2); F(c3); F(c4); F(c5); F(c6); F(c7); F(c8); F(c9); F(c10); F(c11);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    return _mm256_cvtss_f32(s);
}
static const double PEAK_FLOP = 12.0 * 8 * 2 * PEAK_ITERS;
#elif defined(__aarch64__)
#include <arm_neon.h>
#define F(c) c = vfmaq_f32(b, c, a)
static float peak_chains(void) {
    float32x4_t a = vdupq_n_f32(0.999999f), b = vdupq_n_f32(1e-7f);
    float32x4_t c0 = vdupq_n_f32(0), c1 = vdupq_n_f32(1), c2 = vdupq_n_f32(2), c3 = vdupq_n_f32(3);
    float32x4_t c4 = vdupq_n_f32(4), c5 = vdupq_n_f32(5), c6 = vdupq_n_f32(6), c7 = vdupq_n_f32(7);
    for (unsigned it = 0; it < PEAK_ITERS; it++) {
        F(c0); F(c1); F(c2); F(c3); F(c4); F(c5); F(c6); F(c7);
    }
    float32x4_t s = vaddq_f32(vaddq_f32(vaddq_f32(c0, c1), vaddq_f32(c2, c3)), vaddq_f32(vaddq_f32(c4, c5), vaddq_f32(c6, c7)));
    return vgetq_lane_f32(s, 0);
}
static const double PEAK_FLOP = 8.0 * 4 * 2 * PEAK_ITERS;
#else
static float peak_chains(void) { return 0; }
static const double PEAK_FLOP = 0;
#endif

static volatile float sink;
static ork_status peak_job(void *ctx, size_t b, size_t e, ork_err *err) {
    (void)ctx; (void)err;
    for (size_t i = b; i < e; i++) sink = peak_chains();
    return ORK_OK;
}

int main(int argc, char **argv) {
    if (argc < 6 || (argc - 4) % 2) {
        fprintf(stderr, "usage: %s ISA THREADS M N K [N K ...]\n", argv[0]);
        return 2;
    }
    ork_err err;
    if (ork_cpu_set_isa(argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    int nt = atoi(argv[2]);
    size_t M = (size_t)atol(argv[3]);
    printf("isa %s\n", ork_gemm_f32_kernels_active()->isa);
    double peak = 0;
    for (int r = 0; r < 5; r++) { /* best of 5: the machine may be shared */
        double t0 = now();
        ork_parallel_for(nt, (size_t)nt, 1, peak_job, NULL, &err);
        double p = PEAK_FLOP * nt / (now() - t0) * 1e-9;
        if (p > peak) peak = p;
    }
    printf("peak %.1f\n", peak);
    for (int a = 4; a + 1 < argc; a += 2) {
        size_t N = (size_t)atol(argv[a]), K = (size_t)atol(argv[a + 1]);
        float *x = malloc(M * K * sizeof(float)), *w = malloc(N * K * sizeof(float)), *y = malloc(M * N * sizeof(float));
        if (!x || !w || !y) return 1;
        for (size_t i = 0; i < M * K; i++) x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < N * K; i++) w[i] = (float)((i * 40503u) % 997) * 1e-3f - 0.5f;
        ork_linear l;
        memset(&l, 0, sizeof l);
        l.path = ORK_LIN_F32;
        l.N = N;
        l.K = K;
        l.w = w;
        double flop = 2.0 * (double)M * (double)N * (double)K, best = 1e30, best_cpu = 1e30;
        int reps = flop > 2e10 ? 3 : flop > 2e9 ? 5 : 10;
        for (int r = 0; r < reps; r++) {
            double s = now(), c = cpu_now();
            if (ork_linear_apply(&l, x, M, y, nt, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            double d = now() - s, dc = cpu_now() - c;
            if (d < best) best = d;
            if (dc < best_cpu) best_cpu = dc;
        }
        printf("gemm %zu %zu %zu %.1f %.2f %.1f\n", M, N, K, flop / best * 1e-9, best * 1e3, flop / best_cpu * 1e-9);
        fflush(stdout);
        free(x); free(w); free(y);
    }
    return 0;
}
