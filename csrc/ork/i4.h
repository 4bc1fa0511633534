/* i4.h - the integer contract of the RK3588 NPU's int4 x int4 -> int16 matmul
 * mode (docs/w4a4.md, "Integer contract"), as a kernel family: a scalar _ref
 * oracle and AVX2 / NEON kernels bit-exact to it, picked at run time.
 *
 * ------------------------------------------------------------- codes ----
 * A code is an int4 two's-complement value in [-8, 7]. The kernels take the
 * whole range (-8 included: the hardware does). orkpy's weight quantizers make
 * symmetric codes in [-7, 7]; its searched 4-bit activations use [-8, 7], the
 * extra code on the side of the row's largest |x| through the sign of the
 * row's step (actspec.h "search"). Zero is exact either way and there is no
 * zero point (a zero point would add a row-sum correction term to every
 * output, and the int16 NPU path has no cheap place for it).
 *
 * ----------------------------------------------------------- storage ----
 * The bytes the NPU reads, 4 bits per code: a matrix of R rows and K columns
 * is R rows of Kp = round_up(K, 32) codes, Kp / 2 bytes per row, row after
 * row; code 2j of a row in the LOW nibble of byte j, code 2j+1 in the HIGH
 * nibble. Padding codes (k >= K) are 0. Both operands (activations a, M rows;
 * weights w, N rows) use this layout. ork_i4_pack writes it, ork_i4_unpack
 * reads it back.
 *
 * ----------------------------------------------------------- product ----
 *   acc[m][n] = sum_k a[m][k] * w[n][k]          (int32, row-major M x N)
 * computed as the NPU does: k runs over all Kp stored codes (the padding is
 * 0, so this is the sum over k < K), split into chunks of at most
 * ORK_I4_KCHUNK = 480 consecutive k, chunk c = [c*480, min(Kp, (c+1)*480));
 * each chunk's sum is accumulated in int16, the chunk sums are added in
 * int32 in chunk order:
 *   part[c][m][n] = (int16) sum_{k in chunk c} a[m][k] * w[n][k]
 *   acc[m][n]     = part[0][m][n] + part[1][m][n] + ...        (int32)
 * No int16 partial can overflow, for ANY codes: |a * w| <= 8 * 8 = 64, so
 * |partial| <= 480 * 64 = 30720 < 32767 at every step of a chunk's sum (511
 * would be the largest safe chunk, 511 * 64 = 32704; 480 is the largest
 * multiple of 32 under it). Hence every partial is the exact integer, and
 * acc equals the exact integer dot product -- for this split and for every
 * split of k into chunks of at most 511 (tests/test_i4_contract.py checks
 * this over random splits, and that a chunk of 512 all -8 x -8 products does
 * overflow). |acc| <= Kp * 64 < 2^31 for K <= ORK_I4_MAX_K.
 *
 * The _ref kernels do the int16 chunk sums literally. The SIMD kernels may
 * compute the exact integer by any exact method (AVX2: w + 8 as the unsigned
 * operand of maddubs against signed a, minus 8 * sum(a); NEON: widening
 * int8 multiplies into int16, pairwise-added into int32), so they are
 * bit-identical to the _ref for every M, N, K. The driver splits N over the
 * pool in blocks of 32 weight rows; an output depends only on its own rows,
 * never on the thread count.
 */
#ifndef ORK_I4_H
#define ORK_I4_H

#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "status.h"

#define ORK_I4_KCHUNK ((size_t)480)          /* k per int16 partial sum (the NPU's) */
#define ORK_I4_MAX_K ((size_t)1 << 24)       /* |acc| <= 2^24 * 64 = 2^30 */

/* Kp = round_up(K, 32): the codes of a stored row */
static inline size_t ork_i4_kpad(size_t K) { return (K + 31) & ~(size_t)31; }
/* bytes of a stored row: Kp / 2 */
static inline size_t ork_i4_row_bytes(size_t K) { return ork_i4_kpad(K) / 2; }
/* chunks of the product: ceil(Kp / ORK_I4_KCHUNK) */
static inline size_t ork_i4_chunks(size_t K) { return (ork_i4_kpad(K) + ORK_I4_KCHUNK - 1) / ORK_I4_KCHUNK; }

/* code k of a stored row, in [-8, 7] */
static inline int ork_i4_code(const uint8_t *row, size_t k) {
    const unsigned b = row[k >> 1];
    const unsigned v = (k & 1) ? (b >> 4) : (b & 15u);
    return (int)(v ^ 8u) - 8;
}

/* codes (rows x K, row stride ld >= K, int8 values in [-8, 7]) -> out (rows x Kp/2 bytes, the
 * storage above). ORK_EINVAL naming [row, col] and the value of the first code outside [-8, 7]
 * (out is then partly written). */
ork_status ork_i4_pack(const int8_t *codes, size_t rows, size_t K, size_t ld, uint8_t *out, ork_err *err);
/* The inverse: packed (rows x Kp/2 bytes) -> codes (rows x K, row stride ld >= K). ORK_EINVAL
 * naming [row, col] of the first padding code that is not 0. */
ork_status ork_i4_unpack(const uint8_t *packed, size_t rows, size_t K, size_t ld, int8_t *codes, ork_err *err);

/* ------------------------------------------------------- per-ISA kernels */
typedef struct ork_i4_kernels {
    const char *isa;
    /* acc[m * ldc + n] = the product above of stored rows a[m] and w[n], m < M, n < N; rows of
     * Kp / 2 bytes (Kp a multiple of 32, <= ORK_I4_MAX_K). Exact for any codes. Allocates nothing. */
    void (*mm)(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t Kp, int32_t *acc, size_t ldc);
} ork_i4_kernels;

extern const ork_i4_kernels ork_i4_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const ork_i4_kernels ork_i4_kernels_avx2;
#endif
#if defined(__aarch64__)
extern const ork_i4_kernels ork_i4_kernels_neon;
#endif
/* the int4 table of an ISA (i4_ref.c picks it); NULL when the build has none */
const ork_i4_kernels *ork_i4_kernels_for(ork_isa isa);
const ork_i4_kernels *ork_i4_kernels_active(void); /* of ork_cpu_isa() */

/* ------------------------------------------------------------ drivers */
/* the shape check of the drivers: M, N, K >= 1, K <= ORK_I4_MAX_K, pointers not NULL */
ork_status ork_i4_check(const void *a, size_t M, const void *w, size_t N, size_t K, const void *out, ork_err *err);

/* acc (M x N int32) = the product of stored a (M rows) and w (N rows) of K codes, on the
 * active table, N split over up to nthreads threads (<= 0: all cores). */
ork_status ork_mm_i4(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t K, int32_t *acc, int nthreads,
                     ork_err *err);
/* The same on a given table (tests, benchmarks). */
ork_status ork_mm_i4_with(const ork_i4_kernels *kern, const uint8_t *a, size_t M, const uint8_t *w, size_t N,
                          size_t K, int32_t *acc, int nthreads, ork_err *err);
/* The _ref family's partials: part (ork_i4_chunks(K) x M x N int16), part[c][m][n] the int16 sum
 * of chunk c (what the NPU's int16 output holds for a job of that chunk); scalar, one thread. */
ork_status ork_mm_i4_partials(const uint8_t *a, size_t M, const uint8_t *w, size_t N, size_t K, int16_t *part,
                              ork_err *err);

#endif
