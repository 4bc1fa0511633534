/* hadamard.c - see hadamard.h */
#include "hadamard.h"

#include <stdlib.h>
#include <string.h>

#include "pool.h"

typedef struct {
    double *x;
    size_t p, m;
    const double *hp;
    double scale;
} hadamard_job;

static void butterfly(double *x, size_t m) {
    for (size_t h = 1; h < m; h <<= 1)
        for (size_t i = 0; i < m; i += h << 1)
            for (size_t k = i; k < i + h; k++) {
                const double u = x[k], v = x[k + h];
                x[k] = u + v;
                x[k + h] = u - v;
            }
}

static ork_status hadamard_run(void *ctx, size_t begin, size_t end, ork_err *e) {
    const hadamard_job *j = (const hadamard_job *)ctx;
    const size_t p = j->p, m = j->m, n = p * m;
    double *tmp = NULL;
    if (p > 1 && !(tmp = (double *)malloc(n * sizeof(double))))
        return ork_err_set(e, ORK_ENOMEM, "hadamard: no memory for a row of %zu doubles", n);
    for (size_t r = begin; r < end; r++) {
        double *x = j->x + r * n;
        for (size_t b = 0; b < p; b++) butterfly(x + b * m, m);
        if (p > 1) {
            for (size_t i = 0; i < p; i++) {
                double *out = tmp + i * m;
                const double c0 = j->hp[i];
                for (size_t a = 0; a < m; a++) out[a] = c0 * x[a];
                for (size_t b = 1; b < p; b++) {
                    const double c = j->hp[b * p + i];
                    const double *in = x + b * m;
                    for (size_t a = 0; a < m; a++) out[a] += c * in[a];
                }
            }
            memcpy(x, tmp, n * sizeof(double));
        }
        for (size_t a = 0; a < n; a++) x[a] *= j->scale;
    }
    free(tmp);
    return ORK_OK;
}

ork_status ork_hadamard_rows_f64(double *x, size_t rows, size_t p, size_t m, const double *hp, double scale,
                                 int nthreads, ork_err *err) {
    if (m == 0 || (m & (m - 1)) != 0 || p == 0 || (p > 1 && !hp) || (rows && !x))
        return ork_err_set(err, ORK_EINVAL, "hadamard: bad arguments (p %zu, m %zu: m must be a power of two)", p, m);
    hadamard_job j = {x, p, m, hp, scale};
    size_t grain = (p * m) >= 4096 ? 4 : 64;
    return ork_parallel_for(nthreads, rows, grain, hadamard_run, &j, err);
}
