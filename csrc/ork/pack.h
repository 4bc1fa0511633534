/* pack.h - packed weights in the RK3588 NPU's native int8 weight layout, and
 * the int8 x int8 -> int32 matmul kernels that consume them.
 *
 * ------------------------------------------------------------ layout ----
 * Source of the layout facts: RKNN's documented "native" B layout for RK3588
 * int8 matmul, (N/32, K/32, 32, 32), as reproduced by the public reverse-
 * engineered driver (mtx512/rk3588-npu npu_matmul.c weight_int8) and
 * rknn_matmul_api.h (docs/npu.md, "Sources of the facts").
 *
 *   Kp = ceil(K / 32) * 32,  Np = ceil(N / 32) * 32,  KB = Kp / 32,  NB = Np / 32
 *   int8 store:  int8  tile[NB][KB][32 n][32 k],  tile[nb][kb][i][j] = W[nb*32+i][kb*32+j]
 *   4-bit store: uint8 tile[NB][KB][32 n][16],     the same 32 k of a tile row as
 *                16 bytes, element 2j in the low nibble, 2j+1 in the high nibble,
 *                so inflating a tile row through the kind's int8 LUT yields the
 *                int8 tile row directly.
 *   Padding (k >= K or n >= N) is zero: int8 0, 4-bit the kind's zero_code
 *   (quant.h registry; LUT value 0). bscale has N entries (float32, >= 0, finite).
 *   ork_pack_store_shape gives the store's 4-D shape; every binding and the
 *   Python layer take it from there (orkpy._core.packed_layout).
 *
 * ------------------------------------------------------------ matmul ----
 *   acc[m][n] = sum_k xq[m][k] * Wq[n][k]     (int32, exact)
 * with Wq = lut[code] (4-bit) or the int8 code. The result is the exact
 * integer for any int8 operands, -128 included, on every ISA, blocking and
 * thread count (bit-identical accumulators):
 *   - weights are in [-127, 127] wherever a store enters a long-lived object
 *     (ork_pack, the O4N1 parser, ork_pack_check_store: the PackedWeight
 *     constructor, the forward model), but the SIMD kernels are exact for any
 *     int8 weight, so a store that bypassed those doors (a raw store given to
 *     a driver, a store written to after its check) still gives the exact
 *     answer;
 *   - activations from the quantizer are in [-127, 127]; int8 activations
 *     given to ork_matmul_int that hold -128 run on the scalar _ref kernels
 *     (the one product no SIMD int8 dot product here computes exactly is
 *     -128 * -128: AVX2's maddubs saturates 2 * 16384), and need
 *     K < ORK_PACK_MAX_K so that K * 128 * 128 fits int32.
 * Otherwise |product| <= 128 * 127 and K <= ORK_PACK_MAX_K keep every
 * partial sum inside int32.
 *
 * Float path (PackedWeight.matmul): activations are quantized per row
 * (per_token) or per tensor with the int8 quantizer of quant.h (scale
 * a = absmax/127, round half away from zero), and
 *   y[m][n] = ((float)acc[m][n] * a[m]) * bscale[n]      (float32, no FMA)
 * A zero activation row (absmax < 1e-30) has a = 0 and gives y = 0.
 * Static per-tensor activations (clip > 0, calibrated once): the same
 * quantizer with the fixed range `clip` in place of the absmax, for every
 * row and call: a = clip/127 (float32), q = clamp(round_half_away(x * (127 /
 * clip)), -127, 127) -- values beyond +-clip saturate at +-127 -- so for
 * clip == the tensor's absmax the result is bit-identical to per_tensor.
 * clip must be finite and >= ORK_QUANT_TINY (ork_act_clip_check). Every mode of
 * the activation registry and its quantizer: actspec.h.
 *
 * bscale[n] is finite, >= +0 (not -0) and at most ork_pack_max_scale(K) =
 * FLT_MAX / (127 * 127 * K): the largest |acc| times the scale then fits
 * float32, so y is finite for activations with absmax <= 1 (and scales
 * with absmax: |y| <= 127 * K * absmax(x) * bscale[n]).
 */
#ifndef ORK_PACK_H
#define ORK_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "actspec.h"
#include "quant.h"
#include "status.h"

#define ORK_PACK_TILE 32
#define ORK_PACK_MAX_K ((size_t)131072) /* 131072 * 16129 < 2^31 */
#define ORK_PACK_MAX_N ((size_t)1 << 24)

static inline size_t ork_pack_round32(size_t x) { return (x + 31) & ~(size_t)31; }

/* bytes of the tile store: Np*Kp (int8) or Np*Kp/2 (4-bit) */
size_t ork_pack_store_bytes(ork_kind kind, size_t N, size_t K);
/* its shape: (NB, KB, 32, 32) int8 or (NB, KB, 32, 16) uint8 for 4-bit kinds */
void ork_pack_store_shape(ork_kind kind, size_t N, size_t K, size_t shape[4]);

/* The float scaling of an int32 accumulator, y = ((float)acc * ascale) * bscale:
 * two float32 multiplies in this order, no FMA (-ffp-contract=off). Every
 * float output of an int8 matmul goes through this one function (the CPU
 * drivers here, linear.c's external matmuls, ffn_chain.c), so they stay
 * bit-identical to each other. */
static inline float ork_dequant_acc(int32_t acc, float ascale, float bscale) {
    float t = (float)acc * ascale;
    return t * bscale;
}

/* Pack QuantizedTensor codes (row-major: 4-bit (N, ceil(K/2)) nibbles, int8
 * (N, K)) into the tile store. */
ork_status ork_pack(ork_kind kind, const void *codes, size_t N, size_t K, void *store, ork_err *err);
/* The inverse: tile store -> row-major codes (for tests and round trips). */
ork_status ork_unpack(ork_kind kind, const void *store, size_t N, size_t K, void *codes, ork_err *err);

/* The doors of a store: an int8 store must not hold -128 anywhere (padding
 * included; an int6 / int5 store nothing outside [-qmax, qmax]); ORK_EINVAL
 * naming the weight [n, k] or the padding byte. 4-bit
 * stores are always valid (every nibble is a LUT index). */
ork_status ork_pack_check_store(ork_kind kind, const void *store, size_t N, size_t K, ork_err *err);
/* Padding lanes (n >= N or k >= K, n < Np, k < Kp) hold the zero code: 0 for int8 codes, the kind's zero_code
 * for 4-bit kinds. file = 0: the store in memory (the tile store above); file = 1: the store as an O4N1/O8N1 file
 * holds it (narrow kinds as their b-bit stream, padding u = qmax + 1). Else `code` naming the first other lane
 * [n, k], its code and its position: base + the byte in the store, "offset" in a file (base = the store offset),
 * "store byte" in memory. Reads only the padding lanes. */
ork_status ork_pack_check_padding(ork_kind kind, const void *store, size_t N, size_t K, int file, uint64_t base,
                                  ork_status code, ork_err *err);
/* Narrow file stores (8-bit kinds with store_bits b < 8: int6, int5; docs/o4n1.md).
 * In memory such a weight is the int8 tile store above; a file holds the same n
 * codes (the store in memory order) as a little-endian bit stream: code i is
 * u = code + qmax + 1 (in [1, 2^b - 1]) at bits [b*i, b*i + b), so each run of 8
 * codes is b bytes. ork_pack_file_store_bytes: the store bytes in a file (the
 * tile store's bytes * b / 8; = ork_pack_store_bytes for every other kind).
 * ork_pack_bits: ORK_EINVAL naming a code outside [-qmax, qmax]. ork_unpack_bits
 * (store may be NULL: check only): ORK_EFORMAT naming a code with u = 0. n is a
 * multiple of 8 (every tile store is: 1024 codes per tile). */
size_t ork_pack_file_store_bytes(ork_kind kind, size_t N, size_t K);
ork_status ork_pack_bits(ork_kind kind, const int8_t *store, size_t n, uint8_t *out, ork_err *err);
ork_status ork_unpack_bits(ork_kind kind, const uint8_t *in, size_t n, int8_t *store, ork_err *err);
/* The largest bscale entry for K inputs (see above). */
double ork_pack_max_scale(size_t K);
/* Every bscale[n] finite, not negative (nor -0) and <= ork_pack_max_scale(K);
 * else `code` (ORK_EINVAL for an argument, ORK_EFORMAT for a file) naming n. */
ork_status ork_pack_check_scales(const float *bscale, size_t N, size_t K, ork_status code, ork_err *err);

/* ------------------------------------------------------- per-ISA kernels */
typedef struct ork_matmul_kernels {
    const char *isa;
    /* inflate one 4-bit strip (KB tiles of 32x16 bytes) into int8 (KB x 32 x 32) */
    void (*inflate_strip)(const uint8_t *nib, size_t KB, const int8_t lut[16], int8_t *strip);
    /* acc[m*32 + i] = sum over the strip of x[m][k] * strip[kb][i][k - kb*32];
     * x rows have stride ldx (>= KB*32, zero padded), M rows. Exact for any
     * int8 strip and x in [-127, 127]. */
    void (*gemm_strip_i8)(const int8_t *strip, size_t KB, const int8_t *x, size_t ldx, size_t M,
                          int32_t *acc);
    /* GEMV straight from the 4-bit strip, no intermediate buffer (M = 1);
     * lut entries and x in [-127, 127] */
    void (*gemv_strip_i4)(const uint8_t *nib, size_t KB, const int8_t lut[16], const int8_t *x,
                          int32_t *acc);
    /* one group's term of a grouped output (see "Group-wise scales"):
     * t = ork_dequant_acc(acc[m*32 + i], ascale[m], s[i]);
     * y[m*32 + i] = first ? t : y[m*32 + i] + t, for M rows of 32; float32, no FMA,
     * so every ISA gives the same bits */
    void (*acc_group)(const int32_t *acc, size_t M, const float *ascale, const float s[32], int first, float *y);
} ork_matmul_kernels;

extern const ork_matmul_kernels ork_matmul_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const ork_matmul_kernels ork_matmul_kernels_avx2;
/* the AVX2 table with an AVX-512 VNNI (256-bit) int8 strip GEMM, where the CPU has avx512vl + avx512vnni */
extern const ork_matmul_kernels ork_matmul_kernels_avx2vnni;
#endif
#if defined(__aarch64__)
extern const ork_matmul_kernels ork_matmul_kernels_neon;
extern const ork_matmul_kernels ork_matmul_kernels_neondot;
#endif
/* the matmul table of an ISA (matmul_ref.c picks it): for neon, the sdot table when the CPU has
 * dotprod; for avx2, the VNNI table where ork_cpu_use_vnni(); NULL when the build has none */
const ork_matmul_kernels *ork_matmul_kernels_for(ork_isa isa);
const ork_matmul_kernels *ork_matmul_kernels_active(void); /* of ork_cpu_isa() */

/* ------------------------------------------------------------ drivers */
/* int32 out (M, N) = xq (M, K) int8 times the packed weight. */
ork_status ork_matmul_int(ork_kind kind, const void *store, const int8_t lut[16], size_t N, size_t K,
                          const int8_t *xq, size_t M, int32_t *out, int nthreads, ork_err *err);

/* float32 out (M, N) from float32 x (M, K); per_tensor != 0 uses one activation scale. */
ork_status ork_matmul_f32(ork_kind kind, const void *store, const int8_t lut[16], const float *bscale,
                          size_t N, size_t K, const float *x, size_t M, int per_tensor, float *out,
                          int nthreads, ork_err *err);

/* Quantize activations: xq (M, Kp) int8 zero-padded, ascale (M) (or one value
 * repeated when per_tensor). */
ork_status ork_quantize_activations(const float *x, size_t M, size_t K, size_t ldq, int per_tensor,
                                    int8_t *xq, float *ascale, ork_err *err);

/* every activation mode: ork_quantize_acts (actspec.h) */

/* float32 out (M, N) from activations already quantized: xq (M rows, stride
 * round32(K), zero-padded) with row scales ascale (M):
 * out[m][n] = ork_dequant_acc(acc[m][n], ascale[m], bscale[n]). */
ork_status ork_matmul_q8(ork_kind kind, const void *store, const int8_t lut[16], const float *bscale, size_t N,
                         size_t K, const int8_t *xq, const float *ascale, size_t M, float *out, int nthreads,
                         ork_err *err);

/* ---------------------------------------------------- group-wise scales --
 * A grouped weight (group g > 0, a multiple of 32: quant.h ork_group_check) has
 * the same tile store and G = ceil(K / g) scales per output, bscale[n * G + i]
 * for inputs [i*g, (i+1)*g) (row-major N x G; padding inputs belong to the last
 * group). The integer product is split on group boundaries -- whole 32-wide
 * tiles, so every group's partial sum is an exact int32 on every ISA:
 *   acc_i[m][n] = sum_{k in group i} xq[m][k] * Wq[n][k]
 * and the output adds the groups in order, each scaled like a per-channel
 * output:
 *   y[m][n] = t_0 + t_1 + ... + t_{G-1},  t_i = ork_dequant_acc(acc_i[m][n], ascale[m], bscale[n*G+i])
 * (float32, left to right, no FMA). G == 1 (g >= K) is therefore bit-identical
 * to the per-channel output. The partial sums are what an NPU job split on
 * group boundaries returns (docs/npu.md, "Group-wise scales"). The quantizer makes
 * every group scale a float16 value (quant.h) and version-3 files store them as
 * float16 (o4n1.h), widened exactly to these float32 bscale entries. */

/* float32 out (M, N) like ork_matmul_q8, for group-wise scales (group 0: ork_matmul_q8).
 * act_groups != 0: the activations have a scale per row and group (actspec.h "group", the
 * weight's groups), ascale (G, M) group-major, and t_i takes ascale[i * M + m]; else ascale (M). */
ork_status ork_matmul_q8_grouped(ork_kind kind, const void *store, const int8_t lut[16], const float *bscale,
                                 size_t group, size_t N, size_t K, const int8_t *xq, const float *ascale, int act_groups,
                                 size_t M, float *out, int nthreads, ork_err *err);
/* The per-group int32 partial sums: out (G, M, N), G = ork_group_count(K, group), of
 * int8 activations xq (M, K) (as ork_matmul_int, which is G == 1). */
ork_status ork_matmul_int_grouped(ork_kind kind, const void *store, const int8_t lut[16], size_t group, size_t N,
                                  size_t K, const int8_t *xq, size_t M, int32_t *out, int nthreads, ork_err *err);
/* Every bscale entry of a grouped weight (N x G) checked as ork_pack_check_scales does. */
ork_status ork_pack_check_gscales(const float *bscale, size_t N, size_t G, size_t K, ork_status code, ork_err *err);

/* The int8 value the kernels multiply for weight [n][k] of a store
 * (lut[code] for 4-bit kinds); n < N, k < K. */
int8_t ork_pack_value(ork_kind kind, const void *store, size_t K, size_t n, size_t k);

#endif
