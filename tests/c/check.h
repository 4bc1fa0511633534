/* check.h - the tiny assertion harness of the C tests: CHECK counts passes
 * and prints failures; main() prints "N passed, N failed" (read by pytest). */
#ifndef ORK_TEST_CHECK_H
#define ORK_TEST_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* xorshift64: the C tests' reproducible random stream (each test keeps its own state) */
static inline uint32_t check_rnd(uint64_t *st) {
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return (uint32_t)(*st >> 20);
}

/* floats over `binades` binades, both signs, an exact zero one time in `zero_every`:
 * products whose fused / unfused / reordered sums differ */
static inline float check_rnd_f(uint64_t *st, uint32_t zero_every, int binades) {
    uint32_t r = check_rnd(st);
    if (r % zero_every == 0) return 0.0f;
    float v = (float)(r % 100003) / 100003.0f + 0.01f;
    v = ldexpf(v, (int)(r % (uint32_t)binades) - binades / 2);
    return (r & 1) ? -v : v;
}

static int n_pass, n_fail;
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) n_pass++;                                                                \
        else {                                                                             \
            n_fail++;                                                                      \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                    \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

#endif
