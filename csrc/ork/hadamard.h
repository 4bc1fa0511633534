/* hadamard.h - a Hadamard rotation of float64 rows, in place (the rotated source's weights).
 *
 * Contract: each of `rows` rows x of length n = p * m (m a power of two, p >= 1) becomes
 *   y = scale * x kron(Hp, Hm),   y[i m + a] = scale * sum_j sum_b x[j m + b] Hp[j][i] Hm[b][a],
 * Hm the Sylvester Hadamard matrix of order m (Hm[b][a] = (-1)^popcount(a & b), symmetric), Hp a
 * p x p row-major matrix (any doubles; NULL when p == 1). Row vectors: this is x @ kron(Hp, Hm) of
 * orkpy.runtime.rotate.hadamard, in O(n log2 m + n p) operations per row instead of n^2.
 *
 * Arithmetic, in this order, all in double: each block j of m values by the in-place butterfly
 * (h = 1, 2, ..., m / 2; pairs (u, v) at distance h -> (u + v, u - v)); then, when p > 1, output
 * block i = Hp[0][i] * block 0 + Hp[1][i] * block 1 + ... (j ascending, starting from the first
 * product); then every value times `scale`. Rows are independent and split over threads: the
 * result never depends on the thread count. ork_hadamard_rows_f64 is the one implementation
 * (scalar, which compilers vectorise; the butterfly is memory-bound in a row that fits L1). */
#ifndef ORK_HADAMARD_H
#define ORK_HADAMARD_H

#include <stddef.h>

#include "status.h"

/* ORK_EINVAL when m is not a power of two, p == 0, or p > 1 without hp; ORK_ENOMEM for the
 * per-thread block buffer (p > 1). */
ork_status ork_hadamard_rows_f64(double *x, size_t rows, size_t p, size_t m, const double *hp, double scale,
                                 int nthreads, ork_err *err);

#endif
