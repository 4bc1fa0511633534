/* gptq.h - GPTQ rounding (Frantar et al., 2022): the columns of a float32 weight
 * W (N, K) rounded one at a time onto a kind's grid, each column's error moved
 * onto the columns not yet rounded through the inverse of the linear's input
 * Gram matrix H = sum x x^T (K, K, float64), so that the error of the layer's
 * output x W^T shrinks rather than the weights'. The output is exactly
 * ork_quantize's layout (codes, scales): it packs and saves like any tensor.
 *
 * ---------------------------------------------------------------- contract --
 * 1. H: finite (else ORK_ENONFINITE naming (i, j), the first in row-major
 *    order), diagonal >= 0 (else ORK_EINVAL naming [k]). Dead columns
 *    (H[k,k] == 0: inputs that never fired) get H[k,k] = 1; then
 *    H[k,k] += damp * mean(diag H) (the mean of the dead-fixed diagonal,
 *    summed in increasing k, double). Not positive definite -> ORK_EINVAL.
 * 2. U: the upper Cholesky factor of inv(H) (inv(H) = U^T U, U[k,k] > 0), in
 *    double, without LAPACK: with P the reversal permutation, P H P = L L^T
 *    (lower Cholesky, right-looking: A[i][j] -= L[i][p] L[j][p] for p
 *    ascending, one rounding per multiply and per subtraction), then X = L^-1
 *    by forward substitution (x[i] = (e[i] - sum_p L[i][p] x[p]) / L[i][i],
 *    the sum accumulated in p ascending) and U = P X P. Blocking (64 x 64
 *    panels) and threads only change the memory order: each element sees the
 *    same operations in the same order, so U is bit-identical for any thread
 *    count. About 2/3 K^3 flops.
 * 3. Scales: one per row (group 0 or >= K) or per group of `group` columns,
 *    exactly those ork_quant_segment_scale gives for the segment (float16
 *    when grouped, as ork_quantize stores them), with the importance
 *    imatrix[k] = float32(H[k,k] / rows) for the 4-bit kinds, int6 and int5
 *    (the raw diagonal; none when rows == 0 or every value is 0; int8 never
 *    uses one: absmax). Static
 *    groups (and per-row scales): chosen from W before any update. Dynamic
 *    groups: each group's scale chosen when the loop reaches its first
 *    column, from float32() of that group's columns as the error feedback
 *    has left them (every earlier column's error applied).
 * 4. Rows are independent given U; each row's state is double w[k]
 *    (= W[n][k] at start). For k = 0 .. K-1 with the column's group scale s:
 *      int8 / int6 / int5: q = clamp(round_half_away(float32(w[k]) * inv), +-qmax)
 *             (quant.h's rounding, inv the segment's float32 inverse; qmax 127 / 31 / 15),
 *             value q * s;
 *      4-bit: code = the nearest level of w[k] * (1 / (double)s) among the
 *             kind's LUT levels (a tie goes to the upper level; s == 0: the
 *             zero code), value lut[code] * s;
 *      e = (w[k] - value) / U[k][k] (0 for a dead column), and
 *      w[j] -= e * U[k][j] for every j > k (one product, one subtraction).
 *      affine groups (p->offsets, affine.h): the group's (s, o) by ork_quant_segment_affine on the
 *             same float32 values (and importance) a symmetric scale would see; the code
 *             ork_affine_code(float32(w[k]), inv, o), value q * s + o (double).
 *    Lazy block updates (`block` columns: eager inside a block, the block's
 *    errors pushed onto the later columns when it ends, or before a dynamic
 *    group's scale is chosen) apply the same subtractions in the same order,
 *    so the result never depends on `block` or on the thread count: blocks
 *    of 16 rows run in parallel (ork_parallel_for).
 *
 * Double precision throughout; the multiply-accumulates (the factorization's
 * and the lazy updates': nearly all the flops) run on the ISA's kernel of
 * gptq_kernels.h (scalar _ref, AVX2, NEON), which computes each element as the
 * _ref does, never fusing a multiply and an add (-ffp-contract=off), so every
 * ISA and build gives the same bits. Memory: two K x K
 * double matrices (the factor, then U's panels packed for the lazy updates;
 * and U) + per work item 16 rows of K doubles.
 *
 * Precision. ORK_GPTQ_F64 is the above. ORK_GPTQ_F32 is the same steps with every
 * double of steps 2 and 4 a float: A = float32(P H' P) (H' damped in double as in step 1,
 * then rounded once), the factor, the inverse and U in float (sqrtf), each row's state
 * float w[k] = W[n][k], the 4-bit code from y = w[k] * (1.0f / s) against the float
 * thresholds, value lev[code] * s or q * s in float, e and the updates in float; the
 * float kernels of gptq_kernels.h (column octets), again never fused, so this too is
 * bit-identical on every ISA, block and thread count. The Gram matrix stays double (it
 * is a long sum); the importance and the scales are the same in both precisions.
 * Memory: two K x K float matrices (A then U's panels; U).
 *
 * ork_gptq_consume: the same result, bit for bit, with the caller's H as workspace
 * (destroyed: its contents on return are unspecified, also on an error after the
 * checks): float64 uses it as the first of its two matrices, float32 as U (K x K floats
 * fit in K x K doubles): one K x K matrix less, for a Gram matrix that has no later
 * reader (a 6144-wide one is 302 MB).
 * Never aborts: ORK_ENOMEM when an allocation fails, ORK_EINVAL /
 * ORK_ENONFINITE naming the bad argument.
 */
#ifndef ORK_GPTQ_H
#define ORK_GPTQ_H

#include <stddef.h>

#include "quant.h"
#include "status.h"

/* the arithmetic of steps 2 and 4 (the contract's "Precision") */
typedef enum ork_gptq_prec {
    ORK_GPTQ_F64 = 0, /* double throughout (the default of a zeroed params struct) */
    ORK_GPTQ_F32 = 1  /* float: half the memory and about twice the speed */
} ork_gptq_prec;

typedef struct ork_gptq_params {
    ork_kind kind;     /* any kind: int8, int6, int5 or a 4-bit kind */
    double damp;       /* finite, >= 0: share of mean(diag H) added to the diagonal */
    size_t block;      /* >= 1: columns per lazy update (memory order only) */
    size_t rows;       /* input rows H was summed over: the importance diag(H) / rows (not int8); 0 = none */
    size_t group;      /* 0 (one scale per row) or a multiple of 32 (ork_group_check); >= K: per row */
    int static_groups; /* group scales chosen up front from W */
    int nthreads;      /* <= 0: all cores; results never depend on it */
    ork_gptq_prec precision; /* ORK_GPTQ_F64 (0) or ORK_GPTQ_F32 */
    float *offsets;    /* non-NULL: affine groups (affine.h; w4a4 / w4a8, 0 < group < K), the N x G float16
                          offsets written here; NULL: symmetric scales */
} ork_gptq_params;

/* codes: N * ork_quant_row_bytes(kind, K) bytes; scales: N * ork_group_count(K, group')
 * floats (group' = 0 when group >= K): ork_quantize's layout. gram: K x K, row-major. */
ork_status ork_gptq(const float *w, size_t N, size_t K, const double *gram, const ork_gptq_params *p, void *codes,
                    float *scales, ork_err *err);

/* ork_gptq with `gram` as its workspace (see the contract's last paragraph): not const, destroyed. */
ork_status ork_gptq_consume(const float *w, size_t N, size_t K, double *gram, const ork_gptq_params *p, void *codes,
                            float *scales, ork_err *err);

/* Step 2 alone: u (K x K doubles) = the upper Cholesky factor of inv(h), h used as given
 * (no damping, no dead columns; symmetric, only its upper triangle is read); u's strict
 * lower triangle is set to 0. ORK_EINVAL when h is not positive definite. */
ork_status ork_gptq_factor(const double *h, size_t K, int nthreads, double *u, ork_err *err);

#endif /* ORK_GPTQ_H */
