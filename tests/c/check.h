/* check.h - the tiny assertion harness of the C tests: CHECK counts passes
 * and prints failures; main() prints "N passed, N failed" (read by pytest). */
#ifndef ORK_TEST_CHECK_H
#define ORK_TEST_CHECK_H

#include <stdio.h>

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
