/* regcmd.h - RK3588 NPU register command streams: the 64-bit encoding, a
 * decoder for listings, and the register body of one int8 (or fp16, or
 * int4 x int4 -> int16) matmul task, which the planner (plan.h) chains, the
 * emulator (emu.h) executes and the backends (backend.h) submit.
 *
 * Encoding (RK3588 TRM part 1, "RKNN_pc_register_amounts"; the same in every
 * public implementation; docs/npu.md, "Sources of the facts"):
 *   qword = (u64)target << 48 | (u64)value32 << 16 | reg16
 *   targets: PC 0x0101, CNA 0x0201, CORE 0x0801, DPU 0x1001, DPU_RDMA 0x2001,
 *            PPU 0x4001, PPU_RDMA 0x8001; 0x0041 marker before op-enable 0x0081.
 * A single task is the 104-qword body below + the 4-qword tail
 *   0, (PC 0x0014 = 0), 0x0041..., (0x0081 0x0008 = enable 0xd).
 * Register values of the matmul body (a 1x1 direct convolution with feature
 * cube H = M, W = 1, C = K and N kernels) follow the public generator's
 * register programming (docs/npu.md) and are checked qword for qword against
 * captured streams (tests/test_npu_regcmd.py).
 */
#ifndef ORK_NPU_REGCMD_H
#define ORK_NPU_REGCMD_H

#include <stddef.h>
#include <stdint.h>

#include "../status.h"

#define ORK_NPU_PC 0x0101u
#define ORK_NPU_CNA 0x0201u
#define ORK_NPU_CORE 0x0801u
#define ORK_NPU_DPU 0x1001u
#define ORK_NPU_DPU_RDMA 0x2001u
#define ORK_NPU_MARK 0x0041u
#define ORK_NPU_OPEN 0x0081u

#define ORK_NPU_TASK_BODY 104
#define ORK_NPU_TASK_QWORDS 108

static inline uint64_t ork_npu_qword(uint32_t target, uint32_t reg, uint32_t value) {
    return ((uint64_t)(target & 0xffffu) << 48) | ((uint64_t)value << 16) | (uint64_t)(reg & 0xffffu);
}
static inline uint32_t ork_npu_target(uint64_t q) { return (uint32_t)(q >> 48); }
static inline uint32_t ork_npu_value(uint64_t q) { return (uint32_t)(q >> 16); }
static inline uint32_t ork_npu_reg(uint64_t q) { return (uint32_t)(q & 0xffffu); }

typedef enum { ORK_NPU_INT8_INT32 = 0, ORK_NPU_FP16_FP32 = 1, ORK_NPU_INT4_INT16 = 2 } ork_npu_dtype;

/* ------------------------------------------------ int4 x int4 -> int16 --- */
/* The register values of the int4 task that no public source gives, kept in
 * this ONE place (the value: regcmd.c). Public: the mode exists
 * (RKNN_INT4_MM_INT4_TO_INT16 in rknn_matmul_api.h), its native layouts
 * (A (K/32, M, 32), B (N/64, K/32, 64, 32), C (N/8, M, 8) int16) and the
 * field positions (Mesa registers.xml); the int8 (0), fp16 (2), int32 (4) and
 * fp32 (5) precision codes (the public generator, vendor captures). Not
 * public: every value below. Each is listed in docs/npu.md ("int4 register
 * values") as unverified and is the first thing tests/board/run_board.py
 * checks on a board (its int4 step) before the int4 path is trusted. */
typedef struct ork_npu_int4_regs {
    uint32_t in_prec;        /* CNA_CONV_CON1.IN_PRECISION, DPU_DATA_FORMAT.IN_PRECISION: int4 */
    uint32_t proc_prec;      /* CNA_CONV_CON1 / CORE_MISC_CFG / DPU_DATA_FORMAT .PROC_PRECISION: int4 */
    uint32_t out_prec;       /* DPU_DATA_FORMAT.OUT_PRECISION: int16 */
    uint32_t size_e;         /* DPU_BS_OW_CFG.SIZE_E_0/1/2 for an int16 output */
    uint32_t surf_mul;       /* DPU_SURFACE_ADD = (M * surf_mul) << 4 for an int16 output */
    uint32_t codes_per_entry; /* CNA_CBUF_CON1.DATA_ENTRIES = ceil(K / codes_per_entry) */
} ork_npu_int4_regs;
extern const ork_npu_int4_regs ork_npu_int4;

/* One row of that table for docs and the board script: register, field,
 * value (a code) or formula (value < 0), and what it rests on ("unverified:
 * ..." or "public: ..."). */
typedef struct ork_npu_reg_fact {
    const char *reg, *field;
    int64_t value;
    const char *formula, *basis;
} ork_npu_reg_fact;
/* the rows (static storage), *n set to their count */
const ork_npu_reg_fact *ork_npu_int4_facts(size_t *n);

typedef struct ork_npu_matmul {
    ork_npu_dtype dtype;
    uint32_t M, K, N;
    uint32_t in_addr, w_addr, out_addr; /* 32-bit NPU (IOMMU) addresses */
} ork_npu_matmul_desc;

/* The 108 qwords of one stand-alone matmul task (body + single-task tail).
 * Checks the per-task limits this slice supports: M == 1 or M % 4 == 0,
 * K % 32 == 0, N % 16 == 0 (int8: N % 32 == 0, int4: N % 64 == 0), K, N <=
 * 8192, the feature data within 11 CBUF banks and one kernel's weights within
 * one bank (bytes: an int4 code is half a byte). The int4 task writes the
 * same registers as the int8 one; its values differ in the precision fields,
 * the byte sizes, CBUF_CON1 and the int16 output fields (ork_npu_int4). */
ork_status ork_npu_matmul_task(const ork_npu_matmul_desc *d, uint64_t out[ORK_NPU_TASK_QWORDS], ork_err *err);

/* PC_REGISTER_AMOUNTS / PC_DATA_AMOUNT for a task of `body` qwords: the PC
 * fetches (amount + 1) * 2 qwords = the body + the 4-qword tail (rounded up
 * to an even count). The vendor driver computes the first task's value as
 * (regcfg_amount + 4 + 1) / 2 - 1 (rknpu_job.c, scale 2 on RK3588); a
 * captured RKNN chain shows the same value in the tails (108 -> 55;
 * docs/npu.md, "Sources of the facts"). Mesa's rocket driver writes a different value
 * (ALIGN((count - 4) / 2, 2)); which one the PC honours under rocket is an
 * open question only a board can answer. */
static inline uint32_t ork_npu_pc_amount(uint32_t body) { return (body + 4u + 1u) / 2u - 1u; }

/* Rewrite the 4-qword tail at out[0..3]: the last task of a chain (next_body
 * == 0: PC_REGISTER_AMOUNTS = 0) or a link to the next task's commands at
 * next_addr (16-byte aligned) with next_body body qwords. */
ork_status ork_npu_task_tail(uint64_t out[4], uint32_t next_addr, uint32_t next_body, ork_err *err);

/* Block name of a target ("CNA", ...) or NULL; register name or NULL. */
const char *ork_npu_target_name(uint32_t target);
const char *ork_npu_reg_name(uint32_t target, uint32_t reg);

#endif
