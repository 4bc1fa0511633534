/* plan.h - planning an int8 x int8 -> int32 (or int4 x int4 -> int16)
 * matmul on the RK3588 NPU: splitting into tasks within the per-task limits,
 * the operand layouts of every task's buffers, and emitting the PC-chained
 * register commands.
 *
 * ---------------------------------------------------------------- problem --
 *   C[m][n] = sum_k A[m][k] * B[n][k]      A (M, K) int8, B (N, K) int8, C int32
 * (B is a weight matrix with one row per output channel, as PackedWeight.)
 * The precision (ork_npu_plan_opts.precision) is int8 unless the caller asks
 * for int4; everything below is the int8 plan, the int4 plan ("int4" at the
 * end) changes the tile rules and the layouts, never the problem: A and B are
 * still int8 arrays (holding codes in [-8, 7]) and C is still int32.
 *
 * ------------------------------------------------------- per-task limits --
 * One task is the 1x1 direct convolution of regcmd.h with H = Mt, W = 1,
 * C = Kt, Nt kernels (the public generator's field widths and test limits;
 * docs/npu.md, "Sources of the facts"):
 *   Mt == 1 or Mt % 4 == 0, Mt <= 2044 (11-bit height);  Kt % 32 == 0,
 *   Kt <= 8192 (RKNN splits K > 8192 the same way);  Nt % 32 == 0,
 *   Nt <= 8192 (13-bit DPU channel field);  Mt * Kt <= 11 CBUF banks of 32 KiB
 *   (one bank is always left for weights);  Kt <= one bank (a kernel's weights).
 * Tile sizes can be lowered (ork_npu_plan_opts) to force chains in tests.
 *
 * ------------------------------------------------------------- splitting --
 *   Kp = round32(K), Np = round32(N); K is split into nk = ceil(Kp / max_k)
 *   near-equal tiles (multiples of 32), N into nn = ceil(Np / max_n) tiles
 *   (multiples of 32). M == 1 is one row; otherwise Mp = round4(M) is split
 *   into nm tiles (multiples of 4) with Mt * Kt_max <= 11 banks.
 *   Task order: m tile (outer), n tile, k tile (inner). Task t writes its
 *   own output block; K tiles of the same (m, n) are summed on the host in
 *   int32 (exact: |C| <= K * 128 * 128 < 2^31 for K <= ORK_NPU_MAX_K).
 *
 * ---------------------------------------------------------------- buffers --
 * Four buffers, every block starting at a multiple of 64 bytes:
 *   input   one block per (m tile, k tile): NC1HWC2 int8, C2 = 16,
 *           blk[(k / 16) * Mp_t + m][k % 16] = A[m0 + m][k0 + k]
 *   weights one block per (n tile, k tile): (Nt/32, Kt/32, 32, 32) int8,
 *           blk[nb][kb][i][j] = B[n0 + nb*32 + i][k0 + kb*32 + j]. With one K
 *           tile the blocks of consecutive n tiles are contiguous and the
 *           whole buffer is exactly the PackedWeight int8 tile store (pack.h).
 *           Weights do not depend on M: upload once, run any M.
 *   output  one block per task: NC1HWC2 int32, C2 = 4,
 *           blk[(n / 4) * Mp_t + m][n % 4] = partial C over the task's K tile
 *   regcmd  108 qwords (864 bytes, 16-aligned) per task: the body of
 *           regcmd.h and a tail that links to the next task (PC_BASE_ADDRESS,
 *           PC_REGISTER_AMOUNTS = ork_npu_pc_amount(104)); the last task ends
 *           the chain. Padding lanes (k >= K, n >= N, m >= M) are zero in the
 *           operands, so they add nothing.
 *
 * ------------------------------------------------------------------ int4 --
 * The NPU's int4 x int4 -> int16 mode (RKNN_INT4_MM_INT4_TO_INT16). Codes in
 * [-8, 7] (orkpy's quantizers emit [-7, 7]; packers refuse anything else).
 * Integer contract: K is split into tiles of at most ORK_NPU_INT4_MAX_KT = 480
 * codes (a multiple of 32): |a * b| <= 64, so 480 * 64 = 30720 <= 32767 and
 * no partial sum of a task leaves int16, for any codes and in any summation
 * order; each task writes its K tile's int16 block and the host sums the
 * blocks in int32 (exact: K * 64 < 2^31). Kt % 32 == 0, Nt % 64 == 0 (Np =
 * round64(N)), Nt <= 8192. CBUF capacity is counted in bytes: an int4 code is
 * half a byte, so Mt * Kt / 2 <= 11 banks (twice the rows of int8 at the
 * same Kt). Layouts (RKNN's native int4 layouts, rknn_matmul_api.h; two
 * codes per byte, the even k in the low nibble: docs/npu.md, unverified):
 *   input   blk[((k / 32) * Mp_t + m) * 16 + (k % 32) / 2], (K/32, M, 32) nibbles
 *   weights blk[(((n / 64) * (Kt / 32) + k / 32) * 64 + n % 64) * 16 + (k % 32) / 2],
 *           (N/64, K/32, 64, 32) nibbles
 *   output  blk[((n / 8) * Mp_t + m) * 8 + n % 8] int16, (N/8, M, 8)
 */
#ifndef ORK_NPU_PLAN_H
#define ORK_NPU_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../quant.h"
#include "../status.h"

#define ORK_NPU_MAX_M 2044u
#define ORK_NPU_MAX_KT 8192u
#define ORK_NPU_MAX_NT 8192u
#define ORK_NPU_MAX_K 131071u /* host int32 sum of K tiles stays exact */
#define ORK_NPU_MAX_N (1u << 24)
#define ORK_NPU_MAX_TOTAL_M (1u << 20)
#define ORK_NPU_FEATURE_BYTES (11u * 32768u)
#define ORK_NPU_ALIGN 64u

#define ORK_NPU_INT4_MAX_KT 480u /* 480 * 8 * 8 = 30720 <= 32767: no int16 partial can overflow */

typedef enum { ORK_NPU_PREC_INT8 = 0, ORK_NPU_PREC_INT4 = 1 } ork_npu_precision;

typedef struct ork_npu_plan_opts {
    uint32_t max_m, max_k, max_n; /* 0 = the hardware limit; else lower caps (rounded to 4 / 32, int4 N: 64) */
    ork_npu_precision precision;  /* 0 = int8 x int8 -> int32; ORK_NPU_PREC_INT4: int4 x int4 -> int16 tiles */
    uint32_t group;               /* 0: K tiles of near-equal size, summed into one int32 (M, N) output. g > 0 (a
                                     multiple of 32, at most the K tile cap): group-wise partial sums (pack.h
                                     "Group-wise scales"): K tiles exactly [i g, (i + 1) g) (the last shorter), and
                                     the output (G, M, N) int32, G = ceil(K / g), block i the group's own sum */
} ork_npu_plan_opts;

typedef struct ork_npu_task_desc {
    uint32_t m0, Mt, Mp; /* rows [m0, m0 + Mt) of A, Mp >= Mt rows in the task (1 or % 4) */
    uint32_t k0, Kt;     /* K slice [k0, k0 + Kt), Kt % 32 == 0 (may cover padding) */
    uint32_t n0, Nt;     /* N slice, Nt % 32 == 0 (int4: % 64) */
    uint32_t mi, ki, ni; /* tile indices */
    uint64_t in_off, w_off, out_off, cmd_off; /* byte offsets in the four buffers */
} ork_npu_task_desc;

typedef struct ork_npu_plan {
    ork_npu_precision prec;
    uint32_t bits, out_esz; /* bits per operand code (8, 4), bytes per output element (4, 2) */
    uint32_t M, K, N, Kp, Np;
    uint32_t nm, nk, nn, n_tasks;
    uint32_t group; /* opts->group: 0, or the group size (nk groups, one K tile each, outputs kept apart) */
    uint64_t in_bytes, w_bytes, out_bytes, cmd_bytes;
    uint64_t macs; /* sum over tasks of Mp * Kt * Nt (what the NPU computes) */
    ork_npu_task_desc *tasks; /* n_tasks entries, owned */
} ork_npu_plan;

ork_status ork_npu_plan_make(uint32_t M, uint32_t K, uint32_t N, const ork_npu_plan_opts *opts, ork_npu_plan *p,
                             ork_err *err);
void ork_npu_plan_free(ork_npu_plan *p);

/* The chained command buffer (cmd_bytes / 8 qwords) for the given 32-bit NPU
 * addresses of the four buffers; every address must be 64-byte aligned and
 * every buffer must fit below 4 GiB. */
ork_status ork_npu_plan_emit(const ork_npu_plan *p, uint32_t cmd_addr, uint32_t in_addr, uint32_t w_addr,
                             uint32_t out_addr, uint64_t *cmds, ork_err *err);

/* ------------------------------------------------------------- chains --- */
/* A chained job: n matmuls with no data dependency between them (a layer's
 * q / k / v, which read the same input; gate / up; any run the caller names),
 * each planned as above, their regions laid out one after another in ONE
 * command, input and output buffer (every region 64-byte aligned; weights
 * stay in their own buffers). The last task of matmul i links through its
 * PC tail to the first task of matmul i + 1, so the whole sequence is one
 * submit of n_tasks tasks; only the last task of the last matmul ends the
 * chain. Matmul i's operands use the plan's layouts at in_at[i] / out_at[i],
 * its commands start at cmd_at[i]. Planned once, the chain is emitted again
 * only when a buffer address changes. */
typedef struct ork_npu_chain {
    uint32_t n, n_tasks;
    ork_npu_plan *plans;               /* n plans, owned */
    uint64_t *in_at, *out_at, *cmd_at; /* n region offsets each (one allocation, owned by in_at) */
    uint64_t in_bytes, out_bytes, cmd_bytes;
} ork_npu_chain;

/* M[i] x K[i] x N[i] with tile caps opts[i] (opts NULL: hardware limits). */
ork_status ork_npu_chain_make(uint32_t n, const uint32_t *M, const uint32_t *K, const uint32_t *N,
                              const ork_npu_plan_opts *opts, ork_npu_chain *c, ork_err *err);
void ork_npu_chain_free(ork_npu_chain *c);
/* The NPU address of task t (0-based over the whole chain) for commands at cmd_addr. */
uint32_t ork_npu_chain_task_addr(const ork_npu_chain *c, uint32_t cmd_addr, uint32_t t);
/* The chained command buffer (cmd_bytes / 8 qwords; gaps between regions are
 * zero) for the shared buffers at cmd_addr / in_addr / out_addr and matmul i's
 * weights at w_addr[i]. */
ork_status ork_npu_chain_emit(const ork_npu_chain *c, uint32_t cmd_addr, uint32_t in_addr, const uint32_t *w_addr,
                              uint32_t out_addr, uint64_t *cmds, ork_err *err);

/* ------------------------------------------------------------ layouts --- */
/* Every layout follows the plan's precision; an int4 packer refuses a code
 * outside [-8, 7] (ORK_EINVAL naming it) and an int4 plan refuses a packed
 * store (int4 weights come from int8 codes). */
/* A (M, K) int8 with row stride lda -> the input buffer (in_bytes). */
ork_status ork_npu_pack_input(const ork_npu_plan *p, const int8_t *A, size_t lda, uint8_t *buf, ork_err *err);
/* B (N, K) int8 with row stride ldb -> the weight buffer (w_bytes). */
ork_status ork_npu_pack_weights(const ork_npu_plan *p, const int8_t *B, size_t ldb, uint8_t *buf, ork_err *err);
/* A PackedWeight tile store of kind (N, K) (pack.h) -> the weight buffer; a
 * 4-bit store is inflated through lut (the int8 values the CPU kernels use). */
ork_status ork_npu_pack_weights_store(const ork_npu_plan *p, ork_kind kind, const void *store, const int8_t lut[16],
                                      uint8_t *buf, ork_err *err);
/* The output buffer -> C (M, N) int32 row-major (K tiles summed in int32;
 * int4 plans: the int16 blocks widened); a grouped plan: C (nk, M, N), each K
 * tile's block (one group's partial sums) apart. */
ork_status ork_npu_unpack_output(const ork_npu_plan *p, const uint8_t *buf, int32_t *C, ork_err *err);
/* Inverse layouts, for round-trip tests and debugging. */
ork_status ork_npu_unpack_input(const ork_npu_plan *p, const uint8_t *buf, int8_t *A, ork_err *err);
ork_status ork_npu_unpack_weights(const ork_npu_plan *p, const uint8_t *buf, int8_t *B, ork_err *err);

#endif
