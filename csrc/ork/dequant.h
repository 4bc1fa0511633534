/* dequant.h - ggml block dequantizers to float32.
 *
 * Contract: dst[i] for i < n is the float32 value ggml's dequantize_row_<type>
 * produces (formulas: ggml src/ggml-quants.c, dequantize_row_*);
 * half-precision block scales are converted exactly (IEEE binary16 -> binary32,
 * subnormals, Inf and NaN included); products follow ggml's order of operations.
 * n must be a multiple of the type's block size; src holds n / block_size blocks.
 * Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K, IQ4_NL, IQ4_XS. Other valid ids -> ORK_ENOTIMPL naming the type;
 * invalid ids -> ORK_EINVAL. Never aborts.
 *
 * src is read byte-wise with explicit little-endian loads, so it may be
 * unaligned (e.g. a tensor inside an mmapped GGUF file) and any byte values
 * are accepted (untrusted input cannot make it read outside the n / block_size
 * blocks). src and dst must not overlap. n == 0 is a no-op (pointers may then
 * be NULL). The float results are bit-identical to gguf-py's
 * gguf.quants.dequantize (tests/test_dequant.py), NaN payloads included.
 */
#ifndef ORK_DEQUANT_H
#define ORK_DEQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* 1 if ork_dequant_row implements the type */
int ork_dequant_supported(uint32_t ggml_type);

/* Dequantize n elements of ggml type `ggml_type` from src into dst (scalar
 * reference; the oracle). */
ork_status ork_dequant_row(uint32_t ggml_type, const void *src, size_t n, float *dst, ork_err *err);

/* Threaded helper over a whole tensor of n elements (n multiple of the block
 * size): splits on block boundaries; identical output for any thread count. */
ork_status ork_dequant_tensor(uint32_t ggml_type, const void *src, size_t n, float *dst, int nthreads,
                              ork_err *err);

/* ork_dequant_tensor that also sets *nonfinite to the index of the first NaN / Inf it wrote (n when
 * every value is finite; n too on an error): each chunk's output is scanned while it is in cache, so
 * the check costs a fraction of a separate pass over the tensor. */
ork_status ork_dequant_tensor_checked(uint32_t ggml_type, const void *src, size_t n, float *dst, int nthreads,
                                      size_t *nonfinite, ork_err *err);

/* The index of the first of n values that is NaN or +-Inf, n when all are finite. `kind`:
 * ORK_FINITE_F32 (float32) or ORK_FINITE_F16 (IEEE half); data aligned
 * to its element size. One branch-free pass over the exponent bits (blocks of 1024 values; the
 * exact index is looked up only in a block that holds one): memory speed, no float arithmetic, so
 * signalling NaNs and FP exceptions are irrelevant. The loaders refuse a model tensor that holds
 * one (orkpy.formats.source, docs/security.md). */
enum { ORK_FINITE_F32 = 0, ORK_FINITE_F16 = 1 };
size_t ork_find_nonfinite(const void *data, size_t n, int kind);
/* the same on up to nthreads threads (<= 0: all cores; ork_parallel_for), one chunk of 256K values each */
size_t ork_find_nonfinite_par(const void *data, size_t n, int kind, int nthreads);

/* IEEE half / bfloat16 to float, exact */
float ork_fp16_to_fp32(uint16_t h);
float ork_bf16_to_fp32(uint16_t h);

#endif
